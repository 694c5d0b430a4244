"""`make demo` as a new user meets it: the printed commands work exactly as printed.

scripts/demo.py (what `make demo` runs) is started against the test database on a free
port; the curl commands it prints are run in a shell, word for word; then Ctrl-C (SIGINT)
must stop the API and the worker cleanly. The README's five-minute tour must be the same
commands, so the README cannot drift from what works.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
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
