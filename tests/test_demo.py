"""`make demo` as a new user meets it: the printed commands work exactly as printed.

scripts/demo.py (what `make demo` runs) is started against the test database on a free
port; the curl commands it prints are run in a shell, word for word; then Ctrl-C (SIGINT)
must stop the API and the worker cleanly. The README's five-minute tour must be the same
commands, so the README cannot drift from what works.

The API listens on 127.0.0.1 only (the demo prints its admin password), and on a second run
over the embedded PostgreSQL the commands it prints for a new key work as printed, from
another terminal that knows nothing of the demo's database.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workers import database_url

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _printed_commands(output: str) -> list[str]:
    """The shell commands after "Try:", continuation lines joined."""
    block = output.split("Try:\n", 1)[1].split("\n\n", 1)[0]
    lines = [line.removeprefix("  ") for line in block.splitlines()]
    return re.sub(r"\\\n\s*", "", "\n".join(lines)).splitlines()


def _readme_commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    tour = readme.split("## A five-minute tour", 1)[1]
    block = tour.split("```sh\n", 1)[1].split("```", 1)[0]
    return re.sub(r"\\\n\s*", "", block).splitlines()


def _wait_for_output(path: Path, marker: str, proc: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace")
        if marker in text:
            return text
        if proc.poll() is not None:
            pytest.fail(f"the demo exited with {proc.returncode}:\n{text[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"no {marker!r} after {timeout} s:\n{path.read_text(errors='replace')[-3000:]}")


def _shell(script: str) -> str:
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout


def _outward_address() -> str | None:
    """This machine's address on its network (not loopback), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: picks the route, sends nothing
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def _refused(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=2).close()
    except OSError:
        return True
    return False


@pytest.mark.slow
@pytest.mark.django_db(transaction=True, reset_sequences=True)
def test_demo_commands_work_as_printed(tmp_path: Path) -> None:
    port = _free_port()
    log = tmp_path / "demo.log"
    env = dict(os.environ, DATABASE_URL=database_url(), PYTHONUNBUFFERED="1")
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "scripts/demo.py",
                "--port",
                str(port),
                "--processes",
                "1",
                "--concurrency",
                "2",
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        output = _wait_for_output(log, "Ctrl-C stops", proc, timeout=90)
        # The admin password is on the screen: the API is this machine's only.
        assert f"Listening at: http://127.0.0.1:{port} " in output
        outward = _outward_address()
        if outward is not None:
            assert _refused(outward, port), f"the demo answers on {outward}:{port}"
        commands = _printed_commands(output)
        export, post, get, metrics = commands
        assert export.startswith("export KEY=pgq_")
        assert "admin / " in output  # the admin password, printed once

        created = json.loads(_shell(f"{export}\n{post}"))
        assert (created["id"], created["task"], created["tenant"]) == (1, "word_count", "acme")
        deadline = time.monotonic() + 30
        while True:
            job = json.loads(_shell(f"{export}\n{get}"))
            if job["status"] == "done" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert job["status"] == "done" and job["result"] == {"words": 3}
        assert [h["outcome"] for h in job["history"]] == ["done"]
        exposition = _shell(f"{export}\n{metrics}")
        assert 'pgqueue_jobs{queue="default",status="done"} 1.0' in exposition

        # Four clients that connect and send half a request (slow, or gone) hold no one
        # up: the demo's gunicorn runs threads (demo_project/gunicorn.conf.py). With its
        # two sync workers, two such sockets stalled every other request for 30 s.
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        try:
            for sock in idle[:2]:  # half a request; the others send nothing at all
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: demo\r\n")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as page:
                assert page.status == 200
        finally:
            for sock in idle:
                sock.close()

        # The README's tour is these same commands, on the default port.
        readme = _readme_commands()
        assert readme[0].startswith("export KEY=")
        assert readme[1:] == [c.replace(f":{port}/", ":8000/") for c in (post, get, metrics)]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # what Ctrl-C does
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "stopped." in text and "event=worker_stopped" in text


def test_the_demos_help_says_where_the_api_listens_and_how_to_open_it() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/demo.py", "--help"],
        cwd=REPO, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    text = " ".join(done.stdout.split())
    assert "--host HOST" in text and "DEMO_HOST" in text
    assert "127.0.0.1: this machine only" in text and "0.0.0.0 opens it" in text


@contextlib.contextmanager
def _demo(log: Path, env: dict[str, str], *args: str) -> Iterator[tuple[str, int]]:
    """Run scripts/demo.py until its banner; yields (its output so far, its port). Ctrl-C
    (SIGINT) at the end, and it must stop cleanly."""
    port = _free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "scripts/demo.py", "--port", str(port), "--processes", "1",
             "--concurrency", "1", *args],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        yield _wait_for_output(log, "Ctrl-C stops", proc, timeout=120), port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    assert code == 0 and "stopped." in log.read_text(), log.read_text()[-3000:]


def _stop_left_postgres(data: Path) -> None:
    """If a failed run left the embedded PostgreSQL of ``data`` running, stop it (its
    postmaster's pid is the first line of postmaster.pid)."""
    pid_file = data / "postmaster.pid"
    if pid_file.exists():
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)  # a fast shutdown


@pytest.mark.slow
def test_a_second_run_on_the_embedded_database_prints_a_key_command_that_works(
    tmp_path: Path,
) -> None:
    """The first run creates the admin user and a key; the second says how to make another
    key: run in a new shell (no DATABASE_URL, no DJANGO_SETTINGS_MODULE), the printed
    command reaches the embedded PostgreSQL (a socket in its data directory) and the key
    it prints is accepted by the demo's API. The hint said `python manage.py
    pgqueue_apikey create`, which looked for PostgreSQL on port 5432."""
    data = tmp_path / "pgdata"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE") and not k.startswith("PGQUEUE_")
    }
    env["PYTHONUNBUFFERED"] = "1"
    try:
        with _demo(tmp_path / "first.log", env, "--data", str(data)) as (first, _port):
            assert "admin / " in first and "export KEY=pgq_" in first
            assert "apikey create" not in first  # the key is on the screen
        with _demo(tmp_path / "second.log", env, "--data", str(data)) as (second, port):
            assert "admin / " not in second and "export KEY=pgq_" not in second
            (hint,) = [line.strip() for line in second.splitlines() if "apikey create" in line]
            assert "DATABASE_URL=" in hint and str(data) in hint
            assert shlex.split(hint)[-4:] == ["pgqueue", "apikey", "create", "--all-tenants"]
            fresh = {k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}
            done = subprocess.run(
                ["bash", "-c", hint], cwd=tmp_path, env=fresh, capture_output=True, text=True,
                timeout=60,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            key = done.stdout.strip().splitlines()[-1]
            assert key.startswith("pgq_")
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/stats", headers={"Authorization": f"Bearer {key}"}
            )
            with urllib.request.urlopen(request, timeout=10) as page:
                assert page.status == 200
    finally:
        _stop_left_postgres(data)
