"""Worker processes of the benchmarks: start ``manage.py runworker``, wait, stop.

Every benchmark that needs a worker goes through here, so that all of them measure the
same thing: the real worker as an operator starts it, in a process of its own (its own
session, so that a kill takes any children it forked too), configured only through
``PGQUEUE_<NAME>`` variables as demo_project reads them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.common import ROOT, query, scalar

T = TypeVar("T")

POLL = 0.05  # seconds between two looks at the database while waiting
STARTUP = 30.0  # bound on a worker process starting, registering and listening
STOP = 30.0  # bound on a worker finishing its jobs in hand after SIGTERM


def worker_env(**pgqueue: Any) -> dict[str, str]:
    """This process's environment on the bench settings, plus ``PGQUEUE_<KEY>=value``."""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="bench.settings")
    for key, value in pgqueue.items():
        env[f"PGQUEUE_{key}"] = str(value)
    return env


def wait_for(predicate: Callable[[], T], timeout: float, what: str, poll: float = POLL) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; raise
    TimeoutError naming ``what`` once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def listeners() -> int:
    """pgqueue listener connections of this database sitting idle after their LISTEN."""
    return scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name LIKE 'pgqueue listener %%' AND state = 'idle'"
        " AND query LIKE 'LISTEN %%'"
    )


def registered_pids() -> set[int]:
    """Pids of workers that are up: registered in pgqueue_worker and not stopped."""
    return {pid for (pid,) in query("SELECT pid FROM pgqueue_worker WHERE stopped_at IS NULL")}


@dataclass
class WorkerProcess:
    """One ``manage.py runworker`` subprocess, the leader of its own process group."""

    proc: subprocess.Popen[bytes]
    log_path: Path | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the process and any children it started, and reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait()

    def log_tail(self, chars: int = 2000) -> str:
        if self.log_path is None:
            return "(output not captured: it went to the terminal)"
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def start_worker(
    args: list[str],
    log_dir: Path | None = None,
    wrap: Sequence[str] = (),
    root: Path = ROOT,
    **settings: Any,
) -> WorkerProcess:
    """Start ``manage.py runworker -v 0 *args`` with PGQUEUE_<NAME> settings.

    Its output goes to a new log file in ``log_dir``, or to this process's own output
    when ``log_dir`` is None. ``wrap`` is a command prefix that must end by exec-ing the
    command it is given (``ip netns exec NAME``, say), so that the pid is still the worker's.
    ``root`` is the checkout whose worker runs (another release's, to compare with).
    """
    env = worker_env(**settings)
    cmd = [*wrap, sys.executable, str(root / "manage.py"), "runworker", "-v", "0", *args]
    log_path = None
    with contextlib.ExitStack() as stack:
        out: Any = None
        if log_dir is not None:
            log_path = Path(tempfile.mkstemp(prefix="worker-", suffix=".log", dir=log_dir)[1])
            out = stack.enter_context(log_path.open("wb"))
            env["PYTHONUNBUFFERED"] = "1"
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            start_new_session=True,  # its own process group: a kill takes its children too
        )
    return WorkerProcess(proc, log_path)


def stop_workers(workers: list[WorkerProcess], timeout: float = STOP) -> None:
    """SIGTERM every worker (they finish the jobs in hand), wait up to ``timeout`` for
    them all, then SIGKILL whatever is left of each process group."""
    for w in workers:
        if w.alive():
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for w in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.proc.wait(max(0.1, deadline - time.monotonic()))
        w.kill()


def worker_args(concurrency: int, processes: int = 1) -> list[str]:
    args = ["--concurrency", str(concurrency)]
    if processes > 1:
        args += ["--processes", str(processes)]
    return args


@contextlib.contextmanager
def running_worker(
    concurrency: int, processes: int = 1, **settings: Any
) -> Iterator[WorkerProcess]:
    """A runworker with ``PGQUEUE_<KEY>=value`` for each of ``settings``; yields once each
    of its processes is registered and listening, and always stops it on the way out."""
    before = listeners()
    worker = start_worker(worker_args(concurrency, processes), **settings)
    try:
        # The listener connects after the worker registered itself: listening means ready.
        wait_for(
            lambda: not worker.alive() or listeners() >= before + processes,
            STARTUP,
            "the worker to register and LISTEN",
        )
        if not worker.alive():
            raise RuntimeError(f"runworker exited with status {worker.proc.returncode} at start-up")
        yield worker
    finally:
        stop_workers([worker])


def run_burst(concurrency: int, processes: int = 1) -> None:
    """``runworker --burst``: run until no job is left, then exit; an error if it fails."""
    worker = start_worker(["--burst", *worker_args(concurrency, processes)])
    try:
        code = worker.proc.wait()
    finally:
        stop_workers([worker])  # only does anything if this process was interrupted
    if code != 0:
        raise subprocess.CalledProcessError(code, worker.proc.args)
