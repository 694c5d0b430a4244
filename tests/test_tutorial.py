"""docs/tutorial.md as a new user follows it: every command and every file, in order.

The page's blocks follow three conventions, which this test relies on and enforces (the
page states them to its reader):

- A ```sh block holds shell commands, one per line (no prompts). All the blocks run, in
  order, in ONE bash session (``set -eo pipefail``), as in the reader's terminal: ``cd``,
  ``source .venv/bin/activate``, variables (``KEY=$(...)``) and background jobs (``&``,
  then ``kill %1``) carry from one block to the next. A command that fails fails the test.
  After a block that starts something in the background (a line ending in ``&``: the
  development server), the test waits until the server accepts connections, as the reader
  gives it a second.
- A ```python block is a file, named by its first line, relative to the shell's current
  directory: ``# reports/tasks.py`` writes the whole file (the block as shown, that comment
  included); ``# append to mysite/settings.py`` appends the block to the file.
- A ```text block is what the reader should see; it is not run.

Any other block fails the test: every block is either run, written or declared as output.

What must differ on a test machine is substituted in one place, ``substitutions()``, and
nothing else: the repository is not cloned from GitHub but copied from this checkout (the
files a clone has: tracked, or new and not ignored), so the wheel the page's own commands
build and install is this checkout's; the PostgreSQL variables name the test server and a
database created for this test (dropped afterwards); the development server gets a free
port. Then the test checks real outcomes: the small tenant's two jobs are done after the
worker's first ten jobs, weight 3 runs about three jobs for one, every job is done, the task
wrote one row per job, and the API key acts only as its tenant.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.workers import clone_files, scratch_database

REPO = Path(__file__).resolve().parent.parent
TUTORIAL = REPO / "docs" / "tutorial.md"

# The lines of the page that a test machine must run differently (see substitutions()).
CLONE = "git clone https://github.com/pgqueue/pgqueue.git pgqueue-src"
DATABASE_LINE = "export PGHOST=localhost PGPORT=5432 PGUSER=postgres PGDATABASE=mysite"
SERVER = "127.0.0.1:8000"

BLOCK_TIMEOUT = 120  # seconds for one block (the install block downloads packages)
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
FILE_LINE = re.compile(r"# (append to )?([\w./-]+\.py)")


def substitutions(*, source: Path, server: dict[str, str], port: int) -> dict[str, str]:
    """What the page says -> what the test runs instead. The only changes made to the page."""
    variables = " ".join(f"{name}={shlex.quote(value)}" for name, value in server.items())
    return {
        # The checkout as a clone of it would be, not GitHub's copy.
        CLONE: f"cp -R {shlex.quote(str(source))} pgqueue-src",
        # The test server, and the database this test created on it.
        DATABASE_LINE: f"export {variables}",
        # A free port: 8000 may be taken on a test machine.
        SERVER: f"127.0.0.1:{port}",
    }


@dataclass(frozen=True)
class Block:
    kind: str  # "sh", "python" or "text"
    text: str


def page_blocks() -> list[Block]:
    return [Block(kind.strip(), text) for kind, text in FENCE.findall(TUTORIAL.read_text())]


def file_target(block: Block) -> tuple[str, bool]:
    """(path, append) from a Python block's first line."""
    match = FILE_LINE.fullmatch(block.text.splitlines()[0])
    assert match, f"a python block must start with '# <file>' or '# append to <file>':\n{block}"
    return match[2], bool(match[1])


def test_the_tutorial_follows_its_conventions():
    """Fast: what the slow test below relies on."""
    blocks = page_blocks()
    assert {b.kind for b in blocks} == {"sh", "python", "text"}, {b.kind for b in blocks}
    targets = [file_target(b) for b in blocks if b.kind == "python"]
    assert ("reports/tasks.py", False) in targets
    assert ("mysite/settings.py", True) in targets
    commands = "\n".join(b.text for b in blocks if b.kind == "sh")
    for line in (CLONE, DATABASE_LINE):
        assert line in commands.splitlines(), line
    assert SERVER in commands
    assert not re.search(r"^\s*\$ ", commands, re.MULTILINE), "no prompts in sh blocks"
    # The wheel the page installs is the one pyproject.toml names.
    name = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]
    assert f"{name.replace('-', '_')}-*.whl" in commands
    # The HTTP API's packages come with the wheel's `api` extra, from the wheel's folder.
    assert f"--find-links ../pgqueue-src/dist '{name}[api]'" in commands
    assert "not on PyPI" in TUTORIAL.read_text()


# -- the slow test's machinery ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Shell:
    """One bash session, like the reader's terminal: each block is sourced in it in turn."""

    def __init__(self, cwd: Path, env: dict[str, str], scratch: Path) -> None:
        self.cwd = cwd
        self.scratch = scratch
        self.log_path = scratch / "terminal.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the cleanup's target
        )
        self.blocks = 0
        self._send("set -eo pipefail")

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n".encode())
        self.proc.stdin.flush()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def run(self, script: str) -> str:
        """Run one block; returns what it printed (stdout and stderr)."""
        self.blocks += 1
        path = self.scratch / f"block-{self.blocks}.sh"
        path.write_text(script)
        start = len(self.log())
        marker = f"@@ block {self.blocks} done in "
        # From a file, stdin from /dev/null: a command that reads stdin cannot eat the
        # commands that follow it.
        self._send(f"source {shlex.quote(str(path))} </dev/null")
        self._send(f"printf '\\n{marker}%s\\n' \"$PWD\"")
        deadline = time.monotonic() + BLOCK_TIMEOUT
        while True:
            text = self.log()[start:]
            if marker in text:
                output, rest = text.split(marker, 1)
                self.cwd = Path(rest.split("\n", 1)[0])
                return output
            if self.proc.poll() is not None:
                pytest.fail(
                    f"this block failed (exit {self.proc.returncode}):\n{script}\n"
                    f"-- output --\n{text[-5000:]}",
                    pytrace=False,
                )
            if time.monotonic() > deadline:
                pytest.fail(f"this block took over {BLOCK_TIMEOUT}s:\n{script}\n{text[-5000:]}")
            time.sleep(0.05)

    def close(self) -> None:
        """End the session and whatever it left running (its whole process group)."""
        # Even when bash is gone, something it started in the background may not be.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self._log.close()


def table(output: str, header_start: str) -> list[dict[str, str]]:
    """The last table in ``output`` whose header starts with ``header_start``: one dict per
    row. Cells are separated by two spaces or more; an empty cell is printed as '-'."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(header_start)]
    assert starts, f"no table with {header_start!r} in:\n{output[-3000:]}"
    header = re.split(r"\s{2,}", lines[starts[-1]].strip())
    rows = []
    for line in lines[starts[-1] + 1 :]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != len(header):
            break
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def tenants(output: str) -> dict[str, dict[str, str]]:
    """``manage.py pgqueue tenants``' last table in ``output``, by tenant."""
    return {row["NAME"]: row for row in table(output, "NAME ")}


def reader_environment(tmp_path: Path) -> dict[str, str]:
    """A fresh user's environment: nothing of this checkout's venv, settings or database.

    ``python3`` is the (base) interpreter running these tests: the page asks for 3.11+."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(Path(sys.executable).resolve())
    leaks = ("PYTHONPATH", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE", "DATABASE_URL")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in leaks and not k.startswith(("PGQUEUE_", "PG"))
    }
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and REPO.as_posix() not in p]
    env["PATH"] = os.pathsep.join([str(bin_dir), *path])
    return env


@pytest.fixture
def tutorial_database() -> Iterator[dict[str, str]]:
    """The PG* variables for a database of this test's own on the test server."""
    name = f"pgqueue_tutorial_{os.getpid()}"
    with scratch_database(name) as s:
        variables = {
            "PGHOST": str(s["HOST"] or ""),
            "PGPORT": str(s["PORT"] or ""),
            "PGUSER": str(s["USER"] or ""),
            "PGPASSWORD": str(s["PASSWORD"] or ""),
            "PGDATABASE": name,
        }
        yield {k: v for k, v in variables.items() if v}


@pytest.mark.slow
def test_the_tutorial_runs_as_written(tmp_path: Path, tutorial_database: dict[str, str]):
    source = tmp_path / "checkout"
    clone_files(source)
    port = free_port()
    changes = substitutions(source=source, server=tutorial_database, port=port)
    home = tmp_path / "home"
    home.mkdir()
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    outputs: list[tuple[str, str]] = []  # (block as the page has it, what it printed)
    shell = Shell(home, reader_environment(tmp_path), scratch)
    try:
        for block in page_blocks():
            if block.kind == "sh":
                script = block.text
                for said, done in changes.items():
                    script = script.replace(said, done)
                outputs.append((block.text, shell.run(script)))
                if any(line.rstrip().endswith("&") for line in block.text.splitlines()):
                    deadline = time.monotonic() + 30
                    while not listening(port):
                        assert time.monotonic() < deadline, (script, shell.log()[-3000:])
                        time.sleep(0.1)
            elif block.kind == "python":
                name, append = file_target(block)
                target = shell.cwd / name
                assert target.parent.is_dir(), f"{target}: no such directory"
                with target.open("a" if append else "w") as f:
                    f.write(("\n" if append else "") + block.text)
        # `kill %1` stopped the server, the reloader's child included.
        deadline = time.monotonic() + 10
        while listening(port):
            assert time.monotonic() < deadline, "the development server still runs"
            time.sleep(0.1)
    finally:
        shell.close()

    def output_of(command: str) -> str:
        found = [out for text, out in outputs if command in text]
        assert len(found) == 1, f"{len(found)} blocks run {command!r}"
        return found[0]

    # The wheel the page built went into the page's virtual environment.
    tutorial = home / "pgqueue-tutorial"
    assert list(tutorial.glob(".venv/lib/python3*/site-packages/pgqueue/__init__.py"))
    assert list(tutorial.glob("pgqueue-src/dist/django_pgqueue_fair-*.whl"))

    # Before any worker: the flood and the trickle are waiting.
    before = tenants(output_of("{'customer': 'bob'}"))
    assert (before["acme"]["BACKLOG"], before["globex"]["BACKLOG"]) == ("200", "2"), before

    # The worker's first ten jobs include both of globex's, queued after acme's 200.
    first = tenants(output_of("--max-jobs 10"))
    assert first["globex"]["DONE"] == "2" and first["globex"]["BACKLOG"] == "0", first
    assert int(first["acme"]["DONE"]) + 2 == 10, first

    stats = {row["QUEUE"]: row for row in table(output_of("pgqueue stats"), "QUEUE ")}
    assert (stats["default"]["DONE"], stats["default"]["QUEUED"]) == ("202", "0"), stats
    assert 'result:          {"report":' in output_of("pgqueue show 201")
    assert "{'acme': 200, 'globex': 2}" in output_of("from reports.models import Report")

    # Weight 3 against 1 (and a cap of 2 on acme): about three of globex's jobs for one.
    weighted = tenants(output_of("--max-jobs 40"))
    assert weighted["globex"]["WEIGHT"] == "3" and weighted["acme"]["MAX RUNNING"] == "2"
    ran = {name: 60 - int(row["BACKLOG"]) for name, row in weighted.items()}
    assert ran["acme"] + ran["globex"] == 40, weighted
    assert ran["globex"] >= 2 * ran["acme"], weighted

    # The API: the key's tenant by default, and no other.
    posted = output_of("-X POST")
    assert '"tenant":"globex"' in posted and '"status":"queued"' in posted, posted
    assert '"error":"forbidden"' in posted, posted
    listed = output_of("queue/jobs?limit=1")
    assert '"tenant":"globex"' in listed and '"status":"done"' in listed, listed

    # In the database: every job done, one report per job.
    names = {"PGHOST": "host", "PGPORT": "port", "PGUSER": "user", "PGPASSWORD": "password",
             "PGDATABASE": "dbname"}  # fmt: skip
    with psycopg.connect(**{names[k]: v for k, v in tutorial_database.items()}) as conn:
        statuses = dict(conn.execute("SELECT status, count(*) FROM pgqueue_job GROUP BY 1"))
        reports = dict(conn.execute("SELECT tenant, count(*) FROM reports_report GROUP BY 1"))
    assert statuses == {"done": 323}, statuses
    assert reports == {"acme": 260, "globex": 63}, reports
