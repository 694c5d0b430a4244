"""``manage.py runworker``: run pgqueue jobs."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import OperationalError, connections

from pgqueue import stdio
from pgqueue.conf import pgqueue_settings, queue_db
from pgqueue.log import LOG_FORMATS, JobContextFilter, formatter
from pgqueue.schedules import sync_schedules
from pgqueue.worker import DatabaseUnreachable, WorkerLoop
from pgqueue.worker.supervisor import Supervisor, child_command


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


def _non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = (
        "Run pgqueue jobs: claim runnable jobs for idle executor threads, run their handlers, "
        "record outcomes in batches. SIGTERM/SIGINT finishes the jobs in hand and exits 0; "
        "a second signal exits at once with status 1 (leases recover the rest)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--queues",
            default=None,
            help="comma-separated queues to take jobs from (default: PGQUEUE DEFAULT_QUEUE)",
        )
        parser.add_argument(
            "--concurrency", type=_positive, default=4, help="handler threads per process"
        )
        parser.add_argument(
            "--processes",
            type=_positive,
            default=1,
            help="worker processes under this one (for CPU-bound tasks); each has "
            "--concurrency threads",
        )
        parser.add_argument(
            "--batch-size",
            type=_positive,
            default=None,
            help="most jobs one claim takes (default: PGQUEUE BATCH_SIZE)",
        )
        parser.add_argument(
            "--prefetch",
            type=_non_negative,
            default=None,
            help="most jobs claimed beyond the idle threads, waiting unstarted for one: "
            "what the threads start in PGQUEUE PREFETCH_SECONDS, and given back after "
            "PREFETCH_HOLD_SECONDS (default: PGQUEUE PREFETCH; 0: claim only for idle "
            "threads)",
        )
        parser.add_argument("--burst", action="store_true", help="exit when no job is runnable")
        parser.add_argument(
            "--max-jobs", type=_positive, default=None, help="exit after this many jobs"
        )
        parser.add_argument(
            "--database", default=None, help='database alias (default: PGQUEUE["DATABASE"])'
        )
        parser.add_argument(
            "--log-format",
            choices=LOG_FORMATS,
            default=None,
            help="the log lines' format when the project configured no logging handler: "
            "key=value pairs, or one JSON object a line with the job's fields and the trace "
            'and span ids (default: PGQUEUE["LOG_FORMAT"])',
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from pgqueue.checks import require_postgresql

        options["database"] = queue_db(options["database"])
        require_postgresql(options["database"])  # one line, exit 1, on another database
        queues = [
            q.strip()
            for q in (options["queues"] or pgqueue_settings.DEFAULT_QUEUE).split(",")
            if q.strip()
        ]
        if not queues:
            raise CommandError("--queues names no queue")
        _configure_logging(
            options["verbosity"], options["log_format"] or pgqueue_settings.LOG_FORMAT
        )
        stdio.install()  # after logging: its handlers keep the unwrapped streams
        try:
            sync_schedules(using=options["database"])  # the periodic schedules of this code
        except OperationalError as exc:
            # Unreachable now: the loop's own connection retries (and gives up in one line);
            # the schedules already in the table keep firing, new ones wait for a restart.
            logging.getLogger("pgqueue.worker").warning(
                "event=periodic_sync_skipped reason=%s", " ".join(str(exc).split())[:200]
            )
        connections[options["database"]].close()  # the loop keeps connections of its own

        if options["processes"] > 1:
            supervisor = Supervisor(
                child_command(sys.argv),
                options["processes"],
                restart=not (options["burst"] or options["max_jobs"]),
            )
            sys.exit(supervisor.run())

        worker = WorkerLoop(
            queues=queues,
            concurrency=options["concurrency"],
            batch_size=options["batch_size"],
            prefetch=options["prefetch"],
            burst=options["burst"],
            max_jobs=options["max_jobs"],
            alias=options["database"],
        )
        signals = 0

        def on_signal(signum: int, _frame: object) -> None:
            nonlocal signals
            signals += 1
            if signals > 1:
                os._exit(1)  # the second signal: now, without cleanup
            worker.request_stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        # The --processes parent's request to stop (pgqueue.worker.supervisor): like a first
        # SIGTERM, but never a second one, since the signal that made the parent ask may
        # have reached this process as well. SIGUSR1 stays the project's (faulthandler, say).
        signal.signal(signal.SIGUSR2, lambda _signum, _frame: worker.request_stop())
        try:
            status = worker.run()
        except DatabaseUnreachable as exc:
            raise CommandError(f"pgqueue worker: {exc}") from None  # one line on stderr, 1
        leave(status)


def leave(status: int) -> None:
    """Exit with ``status`` once the worker has stopped (every job in hand recorded): end
    the processes its handlers started and left running (SIGTERM, then SIGKILL after a
    second), and do not wait for threads they left behind. Python waits for every
    non-daemon thread before a process exits, so one a handler started and never ended
    would keep a stopped worker alive for ever; and a process a handler forked would
    outlive it, an orphan no one stops."""
    log = logging.getLogger("pgqueue.worker")
    ended = end_children()
    if ended:
        log.warning("event=processes_left_behind pids=%s action=ended", ",".join(map(str, ended)))
    leftover = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if not leftover:
        sys.exit(status)
    log.warning(
        "event=threads_left_behind count=%d names=%s action=exit_without_them",
        len(leftover),
        ",".join(leftover[:20]),
    )
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def end_children(grace: float = 1.0) -> list[int]:
    """SIGTERM this process's child processes still running (read from /proc: on other
    systems, none is found), SIGKILL those still there after ``grace`` seconds; returns
    their pids. A grandchild a handler detached (a double fork) is out of reach."""
    me = os.getpid()
    children = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = entry.read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1] == str(me) and fields[0] != "Z":
            children.append(int(entry.parent.name))
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    alive = list(children)
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if not _reaped(pid)]
        if alive:
            time.sleep(0.02)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _reaped(pid)
    return children


def _reaped(pid: int) -> bool:
    """Reap ``pid`` if it has exited; True once it is gone."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # not ours to wait for (or already reaped)
    return done == pid


def _configure_logging(verbosity: int, log_format: str = "logfmt") -> None:
    """Log to stderr unless the project configured a logging handler of its own.

    Then the root logger gets one handler, with ``JobContextFilter``: the worker's lines
    and every record a handler logs (at INFO and above by default), the latter prefixed
    with the job's id, task, tenant and attempt, or, with ``log_format`` "json", each as
    one JSON object with those fields and the current span's ids (``JsonFormatter``). A
    project with a LOGGING of its own keeps it, and adds the filter (or the formatter)
    where it wants the fields.

    Django's records (``django.tasks`` logs a line as each task starts and ends) come
    through the same handler, once each: Django's default logging sets the "django"
    logger to INFO, which the root's level does not override, so the handler itself drops
    what the verbosity does not show; and Django's development console handler (DEBUG=True
    only) is taken off, as it would print each of them a second time.
    """
    root = logging.getLogger()
    if logging.getLogger("pgqueue").handlers or root.handlers:
        return
    # -v 0: warnings only (failures); -v 1 (default): a line per recorded batch; -v 2: debug
    # (a line per job).
    # Other libraries stay at INFO with -v 2, so that only pgqueue's debug lines are added.
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    handler = logging.StreamHandler()
    handler.setLevel(level)
    handler.addFilter(JobContextFilter())
    handler.setFormatter(formatter(log_format))
    root.addHandler(handler)
    root.setLevel(max(level, logging.INFO) if verbosity else logging.WARNING)
    logging.getLogger("pgqueue").setLevel(level)
    django_logger = logging.getLogger("django")
    for other in list(django_logger.handlers):
        if _is_djangos_debug_console(other):
            django_logger.removeHandler(other)


def _is_djangos_debug_console(handler: logging.Handler) -> bool:
    """Django's DEFAULT_LOGGING "console": a stream handler that prints only with DEBUG."""
    from django.utils.log import RequireDebugTrue

    return type(handler) is logging.StreamHandler and any(
        isinstance(f, RequireDebugTrue) for f in handler.filters
    )
