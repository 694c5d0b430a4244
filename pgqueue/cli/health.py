"""``healthcheck``: liveness and readiness probes for the worker processes of this host.

An orchestrator runs it in the worker's container or on the worker's machine (a
Kubernetes exec probe, a Docker HEALTHCHECK, a monitoring agent). It reads the health
files the worker processes write (``pgqueue.worker.health``) in ``PGQUEUE["HEALTH_DIR"]``,
keeps those of this host whose process still runs (removing the others: stale, left by a
process that was killed), and judges each process:

- ``--liveness`` (the default): its loop turned within ``HEALTH_STALL_SECONDS``. It fails
  when no process has a file, or one's loop is stuck. It never connects to the database:
  a worker waiting for the database to come back is alive, and restarting it would only
  lose the outcomes it keeps to record.
- ``--readiness``: alive as above, each worker's last successful database round trip is
  within its lease, and this command can connect to the database itself now.

A supervisor (``runworker --processes``) writes a file too: its watch loop is judged like
a worker's loop, and it keeps the host alive while it restarts children that died.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from django.core.management.base import CommandParser

from ..conf import pgqueue_settings, queue_db
from ..worker.health import HealthRecord, health_dir, live_and_stale, ping
from . import output
from .base import EXIT_OK, OperatorCommand, bounded_int

EXIT_UNHEALTHY = 1

HEALTH_EXIT_CODES_HELP = (
    "exit codes: 0 healthy; 1 unhealthy, with the reason on stderr (readiness: also when "
    "the database cannot be reached); 2 usage error. Liveness never connects to the "
    "database."
)

#: Bounds of ``--connect-timeout``, in seconds (libpq takes 2 at least).
CONNECT_TIMEOUT = (2, 60)
DEFAULT_CONNECT_TIMEOUT = 5


class HealthcheckCommand(OperatorCommand):
    name = "healthcheck"
    help = (
        "A probe for an orchestrator: --liveness (the default) checks that the worker "
        "processes of this host run and that their loops turned within "
        'PGQUEUE["HEALTH_STALL_SECONDS"], without the database; --readiness also that each '
        "worker reached the database within its lease and that this command can. Prints a "
        "line per process and, when unhealthy, why."
    )

    def add_options(self, parser: CommandParser) -> None:
        parser.epilog = HEALTH_EXIT_CODES_HELP
        check = parser.add_mutually_exclusive_group()
        check.add_argument(
            "--liveness",
            dest="check",
            action="store_const",
            const="liveness",
            help="the worker processes of this host run and their loops turn (the default; no "
            "database connection)",
        )
        check.add_argument(
            "--readiness",
            dest="check",
            action="store_const",
            const="readiness",
            help="live, each worker's last database heartbeat is within its lease, and the "
            "database answers this command",
        )
        parser.set_defaults(check="liveness")
        parser.add_argument(
            "--pid",
            type=bounded_int(1, 2**31 - 1),
            default=None,
            help="check only the process with this pid (a worker, or a --processes parent)",
        )
        parser.add_argument(
            "--worker",
            default=None,
            metavar="ID",
            help="check only the worker with this id (as `manage.py pgqueue workers` lists it)",
        )
        parser.add_argument(
            "--connect-timeout",
            type=bounded_int(*CONNECT_TIMEOUT),
            default=DEFAULT_CONNECT_TIMEOUT,
            metavar="SECONDS",
            help="readiness: how long to wait for a database connection: "
            f"{CONNECT_TIMEOUT[0]} to {CONNECT_TIMEOUT[1]}, default {DEFAULT_CONNECT_TIMEOUT}",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # Not OperatorCommand.handle: liveness must answer while the database is away, and
        # readiness reports an unreachable database as a failure (1) of its own.
        self.using = queue_db(options["database"])
        code = self.run(options)
        if code != EXIT_OK:
            raise SystemExit(code)

    def run(self, options: dict[str, Any]) -> int:
        check: str = options["check"]
        directory = health_dir()
        host = socket.gethostname()
        stall = float(pgqueue_settings.HEALTH_STALL_SECONDS)
        live, stale = live_and_stale(directory, host)
        if options["pid"] is not None:
            live = [r for r in live if r.pid == options["pid"]]
        if options["worker"] is not None:
            live = [r for r in live if r.worker == options["worker"]]
        now = time.monotonic()
        rows = [_judge(r, check, now, stall) for r in live]

        database = None
        if check == "readiness":
            error = ping(self.using, options["connect_timeout"])
            database = {"reachable": error is None, "error": error}
        reason = _verdict(check, rows, database, _scope(options, directory))

        document = {
            "check": check,
            "healthy": reason is None,
            "reason": reason,
            "host": host,
            "directory": str(directory),
            "stall_seconds": stall,
            "database": database,
            "processes": rows,
            "stale": [{"pid": r.pid, "role": r.role, "worker": r.worker} for r in stale],
        }

        def human() -> str:
            lines = []
            if rows:
                lines.append(
                    output.table(
                        ["", "ROLE", "PID", "WORKER", "STATE", "LOOP", "DATABASE", "PROBLEM"],
                        [
                            ["FAIL" if r["problem"] else "ok", r["role"], r["pid"],
                             r["worker"] or output.NONE, r["state"],
                             _ago(r["loop_age_seconds"]), _ago(r["db_age_seconds"]),
                             r["problem"] or ""]
                            for r in rows
                        ],
                        right=(2,),
                    )
                )  # fmt: skip
            if database is not None:
                lines.append(
                    "database: reachable"
                    if database["reachable"]
                    else f"database: cannot be reached: {database['error']}"
                )
            if reason is None:
                lines.append(f"{check}: ok ({_count(rows)} on {host})")
            return "\n".join(lines)

        text = human()
        if options["json"] or text:
            self.emit(options, document, lambda: text)
        if reason is None:
            return EXIT_OK
        self.warn(f"{check} failed: {reason}")
        return EXIT_UNHEALTHY


def _judge(record: HealthRecord, check: str, now: float, stall: float) -> dict[str, Any]:
    """One process's line: its ages and, when it fails ``check``, why."""
    loop_age = max(0.0, now - record.loop_at)
    db_age = None if record.db_at is None else max(0.0, now - record.db_at)
    lease = record.lease_seconds or float(pgqueue_settings.LEASE_SECONDS)
    problem = None
    if loop_age > stall:
        problem = (
            f"its loop has not turned for {loop_age:.1f}s "
            f"(HEALTH_STALL_SECONDS: {stall:g}; state {record.state})"
        )
    elif check == "readiness" and record.role == "worker":
        if db_age is None:
            problem = f"no database round trip has succeeded yet (state {record.state})"
        elif db_age > lease:
            problem = (
                f"its last database heartbeat was {db_age:.1f}s ago, longer than its lease "
                f"({lease:g}s; state {record.state})"
            )
    return {
        "pid": record.pid,
        "role": record.role,
        "worker": record.worker,
        "state": record.state,
        "started": record.started,
        "children": list(record.children),
        "loop_age_seconds": round(loop_age, 3),
        "db_age_seconds": None if db_age is None else round(db_age, 3),
        "lease_seconds": lease if record.role == "worker" else None,
        "healthy": problem is None,
        "problem": problem,
    }


def _verdict(
    check: str, rows: list[dict[str, Any]], database: dict[str, Any] | None, scope: str
) -> str | None:
    """Why the host fails ``check`` (None: it passes)."""
    if database is not None and not database["reachable"]:
        return f"cannot reach the database: {database['error']}"
    judged = [r for r in rows if check == "liveness" or r["role"] == "worker"]
    if not judged:
        return f"no live worker process {scope}"
    failing = [r for r in rows if r["problem"]]
    if not failing:
        return None
    first = failing[0]
    more = f" (and {len(failing) - 1} more)" if len(failing) > 1 else ""
    return f"{first['role']} pid {first['pid']}: {first['problem']}{more}"


def _scope(options: dict[str, Any], directory: Any) -> str:
    """Which processes were looked for, in words, for "no live worker process ..."."""
    which = []
    if options["pid"] is not None:
        which.append(f"with pid {options['pid']}")
    if options["worker"] is not None:
        which.append(f"with worker id {options['worker']}")
    return " ".join([*which, f"has a health file in {directory} on this host"])


def _ago(seconds: float | None) -> str:
    return output.NONE if seconds is None else f"{seconds:.1f}s ago"


def _count(rows: list[dict[str, Any]]) -> str:
    return f"{len(rows)} process" + ("es" * (len(rows) != 1))


COMMANDS = [HealthcheckCommand]
