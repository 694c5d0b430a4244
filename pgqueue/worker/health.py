"""Health files: each worker process says, in a small file of its own, that its loop turns.

``manage.py pgqueue healthcheck`` (``pgqueue.cli.health``) reads them for an orchestrator's
liveness and readiness probes. A file rather than the database, because liveness must hold
while the database is away: a worker waiting for it to come back is doing what it should,
and restarting it would only lose the outcomes it keeps to record once it can. A file
rather than a port, because only the machine the worker runs on needs to read it.

The loop's own thread marks its turns (``HealthFile.turn``), never a timer thread: a timer
would tick on while the loop is stuck, and a stuck loop is what the probe is for. It is
called once per turn of the loop (a claim, an idle wait ending, a heartbeat, a connection
attempt) and writes at most once a second (``WRITE_EVERY``): a new file, renamed over the
previous one, so that a reader sees one whole version or the other, never half of one.

A file (JSON) holds:

- ``pid`` and ``start``: the process, and when it started in clock ticks since boot (read
  from /proc on Linux; None elsewhere). Together they say whether the process that wrote
  the file still runs: a pid alone may have been reused by another process since.
- ``role``: ``"worker"`` (a ``WorkerLoop``) or ``"supervisor"`` (the parent of
  ``runworker --processes``, whose ``children`` are listed); ``worker``: the worker id.
- ``host``, ``started`` (wall clock, ISO 8601), ``state``: ``starting`` (not connected
  yet), ``running``, ``reconnecting`` (the database went away) or ``stopping``.
- ``loop_at`` and ``db_at``: the last turn of the loop and the last round trip to the
  database that succeeded (a heartbeat round, or a connection made), in ``time.monotonic()``
  seconds. That clock (CLOCK_MONOTONIC on Linux) is the machine's, the same in every
  process, and does not jump when the wall clock is set, so ages computed by the reader
  are true ones. ``written``: the wall clock of the write, for people.
- ``lease_seconds``: the lease the worker claims with, which readiness measures the last
  heartbeat against.

The file is removed when the process ends cleanly; one left by a process that was killed is
stale, recognised by its pid and start, and removed by the next reader or writer.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import os
import socket
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from ..conf import pgqueue_settings
from ..queries import load
from .connection import connect_params

logger = logging.getLogger("pgqueue.worker")

DATABASE_PING = load("health.sql")["DATABASE_PING"]


def health_dir() -> Path:
    """``PGQUEUE["HEALTH_DIR"]``, or ``pgqueue-health`` in the system's temporary directory."""
    configured = pgqueue_settings.HEALTH_DIR
    if configured is None:
        return Path(tempfile.gettempdir()) / "pgqueue-health"
    return Path(configured)


# -- which process wrote a file ------------------------------------------------------------

_PROC = Path("/proc")


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start in clock ticks since boot) of ``pid`` from /proc, or None if it is gone.

    The command name in parentheses may hold spaces and parentheses: the fields are read
    after the last ``)``.
    """
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    try:
        return fields[0], int(fields[19])  # fields 3 (state) and 22 (starttime) of proc(5)
    except (IndexError, ValueError):
        return None


def process_start(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (Linux); None where /proc has no such
    field, or the process is gone."""
    stat = _proc_stat(pid)
    return None if stat is None else stat[1]


def process_alive(pid: int, start: int | None) -> bool:
    """The process that wrote a file with this ``pid`` and ``start`` still runs.

    With /proc: ``pid`` exists, is not a zombie (a child of a supervisor that has not
    reaped it yet) and started when the file says, so a pid the system has given to
    another process since (the healthcheck's own, say) does not count. Elsewhere only the
    pid's existence is known.
    """
    if pid <= 0:
        return False
    if _PROC.joinpath("self", "stat").exists():
        stat = _proc_stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            return False
        return start is None or stat[1] == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


# -- the writer: one per process's loop -----------------------------------------------------


class HealthFile:
    """The health file of one loop (a worker's, or a supervisor's), written by that loop's
    own thread. Nothing here raises: a file that cannot be written is logged once (until
    a write succeeds again) and the worker goes on; the probe then reports it missing."""

    #: Seconds between two writes, at least: a busy loop turns thousands of times a second.
    WRITE_EVERY = 1.0

    def __init__(
        self,
        role: str,
        *,
        worker: str | None = None,
        lease_seconds: float | None = None,
        directory: Path | None = None,
    ) -> None:
        self.role = role
        self.worker = worker
        self.lease_seconds = lease_seconds
        self.directory = directory  # None: health_dir(), read when opened
        self.path: Path | None = None  # set while open
        self.state = "starting"
        self.loop_at = 0.0
        self.db_at: float | None = None
        self.children: list[int] = []
        self._written = -math.inf
        self._fields: dict[str, Any] = {}
        self._failing = False

    def open(self) -> None:
        """Write the first version (state ``starting``), after removing the stale files
        of this host in the directory (a persistent directory would gather them)."""
        directory = self.directory or health_dir()
        pid = os.getpid()
        self._fields = {
            "pid": pid,
            "start": process_start(pid),
            "role": self.role,
            "worker": self.worker,
            "host": socket.gethostname(),
            "started": _now_iso(),
            "lease_seconds": self.lease_seconds,
        }
        self.path = directory / f"{self.role}-{pid}-{os.urandom(4).hex()}.json"
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._failed(exc)
        live_and_stale(directory, self._fields["host"])  # removes the stale ones
        self.loop_at = time.monotonic()
        self._write()

    def turn(self) -> None:
        """The loop turned: called on the loop's thread, every turn; cheap between writes."""
        if self.path is None:
            return
        now = time.monotonic()
        self.loop_at = now
        if now - self._written >= self.WRITE_EVERY:
            self._write()

    def database_ok(self) -> None:
        """A round trip to the database succeeded: written with the next turn."""
        self.db_at = time.monotonic()

    def set_state(self, state: str) -> None:
        """A new state, written at once (states change rarely)."""
        if state == self.state:
            return
        self.state = state
        if self.path is not None:
            self.loop_at = time.monotonic()
            self._write()

    def set_children(self, pids: Iterable[int]) -> None:
        self.children = sorted(pids)
        if self.path is not None:
            self._write()

    def close(self) -> None:
        """Remove the file: the process is ending cleanly, so it no longer counts."""
        if self.path is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            self._failed(exc)
        self.path = None

    def _write(self) -> None:
        assert self.path is not None
        self._written = time.monotonic()
        document = {
            **self._fields,
            "state": self.state,
            "loop_at": self.loop_at,
            "db_at": self.db_at,
            "children": self.children,
            "written": _now_iso(),
        }
        try:
            try:
                self._replace(json.dumps(document))
            except FileNotFoundError:  # the directory was removed (a cleaner of /tmp): again
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._replace(json.dumps(document))
        except OSError as exc:
            self._failed(exc)
            return
        if self._failing:
            self._failing = False
            logger.info("event=health_file_written path=%s", self.path)

    def _replace(self, text: str) -> None:
        assert self.path is not None
        # mkstemp: a new file of a random name, never one someone else linked in its place.
        fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as out:
                os.fchmod(out.fileno(), 0o644)  # readable by a probe running as another user
                out.write(text)
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _failed(self, exc: OSError) -> None:
        if not self._failing:
            self._failing = True
            logger.warning(
                "event=health_file_error path=%s error=%r action=carry_on", self.path, str(exc)
            )


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")


# -- the reader ----------------------------------------------------------------------------


@dataclass(frozen=True)
class HealthRecord:
    """One health file as read."""

    path: Path
    pid: int
    start: int | None
    role: str
    worker: str | None
    host: str
    started: str
    state: str
    loop_at: float
    db_at: float | None
    lease_seconds: float | None
    children: tuple[int, ...]

    @classmethod
    def parse(cls, path: Path, document: Any) -> HealthRecord:
        """Raises ValueError (or TypeError/KeyError) on a document not of this format."""
        db_at = document["db_at"]
        lease = document.get("lease_seconds")
        return cls(
            path=path,
            pid=int(document["pid"]),
            start=None if document.get("start") is None else int(document["start"]),
            role=str(document["role"]),
            worker=document.get("worker"),
            host=str(document["host"]),
            started=str(document["started"]),
            state=str(document["state"]),
            loop_at=float(document["loop_at"]),
            db_at=None if db_at is None else float(db_at),
            lease_seconds=None if lease is None else float(lease),
            children=tuple(int(c) for c in document.get("children") or ()),
        )

    def alive(self) -> bool:
        return process_alive(self.pid, self.start)


def read_records(directory: Path) -> list[HealthRecord]:
    """The health files of ``directory`` that parse, by path; a file that does not (not
    one of ours, or gone between the listing and the read) is left out."""
    records = []
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return []
    for path in paths:
        try:
            records.append(HealthRecord.parse(path, json.loads(path.read_text())))
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return records


def live_and_stale(directory: Path, host: str) -> tuple[list[HealthRecord], list[HealthRecord]]:
    """The files of ``host`` whose process runs, and those whose process is gone (killed
    before it could remove its file), which are removed. Files of other hosts (a shared
    directory) are in neither: whether their process runs cannot be known here."""
    live, stale = [], []
    for record in read_records(directory):
        if record.host != host:
            continue
        if record.alive():
            live.append(record)
        else:
            with contextlib.suppress(OSError):  # another user's file in a shared directory
                record.path.unlink(missing_ok=True)
            stale.append(record)
    return live, stale


# -- the loop's connection ------------------------------------------------------------------


def silent_server_bound(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with TCP timeouts that make a server gone silent a connection error
    within a third of ``HEALTH_STALL_SECONDS``.

    A server that vanishes without closing the connection (its host down, a network
    partition, a failover that moves its address) leaves a statement waiting for an answer
    until the kernel gives up: two hours and more with the system's defaults. The loop
    would wait that long and stop turning, and the healthcheck would have every worker
    restarted during a database outage, which liveness must never do. Keepalive probes
    (libpq's ``keepalives_*``) and ``tcp_user_timeout`` end that wait in a connection
    error instead; the loop then reconnects, turning as it waits. The default stall of 60 s
    gives 10 s idle, then 3 probes 3 s apart, and 20 s for data sent and not acknowledged.
    A server that answers slowly is not affected: its kernel answers the probes.
    A project's own values (DATABASES ``OPTIONS``) win; a Unix socket ignores them.
    """
    budget = float(pgqueue_settings.HEALTH_STALL_SECONDS) / 3
    bounded = dict(params)
    bounded.setdefault("keepalives", 1)
    bounded.setdefault("keepalives_idle", max(1, round(budget / 2)))
    bounded.setdefault("keepalives_interval", max(1, round(budget / 6)))
    bounded.setdefault("keepalives_count", 3)
    if psycopg.pq.version() >= 120000:  # libpq 12 added tcp_user_timeout
        bounded.setdefault("tcp_user_timeout", max(1000, int(budget * 1000)))
    return bounded


# -- the database half of readiness ---------------------------------------------------------


def ping(alias: str | None, connect_timeout: int) -> str | None:
    """None when a new connection to the queue's database (made as a worker's is, from
    DATABASES) opens within ``connect_timeout`` seconds and answers DATABASE_PING; else
    why not, in one line."""
    params = connect_params(alias, application_name="pgqueue healthcheck")
    params["connect_timeout"] = max(2, int(connect_timeout))  # libpq's least is 2
    try:
        with psycopg.connect(**params, autocommit=True) as conn:
            conn.execute(DATABASE_PING)
    except psycopg.Error as exc:
        return " ".join(str(exc).split()) or type(exc).__name__
    return None
