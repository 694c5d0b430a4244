#!/usr/bin/env python
"""Noisy neighbour: what one tenant's flood does to everyone else's wait, fair vs FIFO.

One tenant enqueues 10,000 jobs at once (quick: 1,000); while its backlog lasts, five small
tenants submit one job every 100 ms between them, round-robin, from a thread of this
process. One `manage.py runworker --concurrency 8` (one process, 8 handler threads) runs
jobs of 5 ms each. The same scenario runs with fair ordering and with FIFO ordering (the
enqueuers under override_settings(PGQUEUE={"ORDERING": "fifo"}), the worker with
PGQUEUE_ORDERING=fifo). A small job's wait is started_at - created_at of its row, both
PostgreSQL's clock.

This module also holds the worker plumbing the other benchmarks share (running_worker,
wait_for).

    python scripts/with_db.py -- python bench/noisy_neighbour.py [--quick]
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, percentile, reset_tables, table, worker_env

T = TypeVar("T")

POLL = 0.05  # seconds between two looks at the database while waiting
STARTUP = 30.0  # bound on a worker process starting, registering and listening
STOP = 30.0  # bound on a worker finishing its jobs in hand after SIGTERM

SMALL_TENANTS = 5
SMALL_PERIOD = 0.1  # one small job every 100 ms, all small tenants together
CONCURRENCY = 8
PROCESSES = 1


# -- shared plumbing ------------------------------------------------------------------------


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


def scalar(query: str, params: Any = None) -> Any:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchone()[0]


def rows(query: str, params: Any = None) -> list[tuple]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall()


def listeners() -> int:
    """pgqueue listener connections of this database sitting idle after their LISTEN."""
    return scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name LIKE 'pgqueue listener %%' AND state = 'idle'"
        " AND query LIKE 'LISTEN %%'"
    )


def stop_process(proc: subprocess.Popen, timeout: float = STOP) -> None:
    """SIGTERM (the worker finishes its jobs in hand), wait; SIGKILL its group on timeout."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: it and its children
            proc.wait()


@contextlib.contextmanager
def running_worker(
    concurrency: int, processes: int = 1, *extra: str, **pgqueue: Any
) -> Iterator[subprocess.Popen]:
    """``manage.py runworker`` as a subprocess, with ``PGQUEUE_<KEY>=value`` for each of
    ``pgqueue``; yields once each of its processes is registered and listening, and always
    stops it on the way out."""
    cmd = [sys.executable, str(ROOT / "manage.py"), "runworker", "-v", "0"]
    cmd += ["--concurrency", str(concurrency), *extra]
    if processes > 1:
        cmd += ["--processes", str(processes)]
    before = listeners()
    proc = subprocess.Popen(cmd, env=worker_env(**pgqueue), cwd=ROOT, start_new_session=True)
    try:
        # The listener connects after the worker registered itself: listening means ready.
        wait_for(
            lambda: proc.poll() is not None or listeners() >= before + processes,
            STARTUP,
            "the worker to register and LISTEN",
        )
        if proc.poll() is not None:
            raise RuntimeError(f"runworker exited with status {proc.returncode} at start-up")
        yield proc
    finally:
        stop_process(proc)


def ms(seconds: float) -> str:
    """A duration for a report: milliseconds below 1 s, seconds above."""
    if seconds != seconds:  # NaN
        return "n/a"
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


# -- the scenario ---------------------------------------------------------------------------


def submit_small(stop: threading.Event, errors: list[BaseException]) -> None:
    """One job every SMALL_PERIOD, tenants small0..small4 in turn, until ``stop``."""
    from django.db import connection

    import pgqueue

    try:
        started = time.monotonic()
        k = 0
        while not stop.is_set():
            pgqueue.enqueue("bench.sleep5ms", tenant=f"small{k % SMALL_TENANTS}")
            k += 1
            stop.wait(max(0.0, started + k * SMALL_PERIOD - time.monotonic()))
    except BaseException as exc:  # re-raised by the main thread
        errors.append(exc)
    finally:
        connection.close()


def one_run(ordering: str, big: int) -> dict[str, Any]:
    from django.conf import settings
    from django.test import override_settings

    import pgqueue

    reset_tables()
    enqueuers = (
        override_settings(PGQUEUE={**(settings.PGQUEUE or {}), "ORDERING": "fifo"})
        if ordering == "fifo"
        else contextlib.nullcontext()
    )
    with enqueuers, running_worker(CONCURRENCY, PROCESSES, ORDERING=ordering):
        pgqueue.enqueue_many("bench.sleep5ms", [None] * big, tenant="big")
        stop, errors = threading.Event(), []
        submitter = threading.Thread(target=submit_small, args=(stop, errors), daemon=True)
        submitter.start()
        try:
            wait_for(
                lambda: (
                    not scalar(
                        "SELECT EXISTS (SELECT 1 FROM pgqueue_job WHERE tenant = 'big'"
                        " AND status IN ('queued', 'running'))"
                    )
                ),
                60 + big / 50,
                "the big backlog to drain",
                poll=0.1,
            )
        finally:
            stop.set()
            submitter.join()
        if errors:
            raise errors[0]
        wait_for(
            lambda: not scalar("SELECT EXISTS (SELECT 1 FROM pgqueue_job WHERE status <> 'done')"),
            30,
            "the small tenants' last jobs",
        )
    (t0, drain, big_done) = rows(
        "SELECT min(created_at), extract(epoch FROM max(finished_at) - min(created_at)),"
        " count(*) FILTER (WHERE status = 'done') FROM pgqueue_job WHERE tenant = 'big'"
    )[0]
    small = rows(
        "SELECT extract(epoch FROM created_at - %s)::float8,"
        " extract(epoch FROM started_at - created_at)::float8"
        " FROM pgqueue_job WHERE tenant <> 'big' ORDER BY created_at, id",
        [t0],
    )
    if big_done != big:
        raise RuntimeError(f"{ordering}: only {big_done} of {big} big jobs done")
    waits = [w for _, w in small]
    return {
        "big_jobs": big,
        "big_drain_s": float(drain),
        "big_jobs_per_s": big / float(drain),
        "small_jobs": len(small),
        "small_wait_p50_s": percentile(waits, 50),
        "small_wait_p95_s": percentile(waits, 95),
        "small_wait_max_s": max(waits) if waits else float("nan"),
        "small_series": [[round(at, 4), round(w, 5)] for at, w in small],
    }


def chart(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for ordering, colour in (("fifo", "tab:red"), ("fair", "tab:blue")):
        series = results[ordering]["small_series"]
        ax.plot(
            [at for at, _ in series],
            [w * 1000 for _, w in series],
            marker="o",
            markersize=3,
            linewidth=1,
            color=colour,
            label=f"{ordering} (p50 {ms(results[ordering]['small_wait_p50_s'])})",
        )
    ax.axhline(50, color="grey", linestyle="--", linewidth=1, label="50 ms")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the big tenant enqueued its backlog")
    ax.set_ylabel("small tenant's wait, enqueue → start (ms)")
    big = results["fair"]["big_jobs"]
    ax.set_title(
        f"Small tenants' wait behind a {big:,}-job flood, {CONCURRENCY} threads, 5 ms jobs"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    big = 1_000 if quick else 10_000
    results = {}
    for ordering in ("fair", "fifo"):
        results[ordering] = one_run(ordering, big)
        r = results[ordering]
        print(
            f"   {ordering}: {r['small_jobs']} small jobs, p50 {ms(r['small_wait_p50_s'])}, "
            f"big drained in {r['big_drain_s']:.1f} s",
            flush=True,
        )
    fair, fifo = results["fair"], results["fifo"]
    ratio = fifo["small_wait_p50_s"] / fair["small_wait_p50_s"]
    report = table(
        ["ordering", "small jobs", "small p50", "p95", "max", "big drain", "big jobs/s"],
        [
            [
                name,
                r["small_jobs"],
                ms(r["small_wait_p50_s"]),
                ms(r["small_wait_p95_s"]),
                ms(r["small_wait_max_s"]),
                f"{r['big_drain_s']:.1f} s",
                f"{r['big_jobs_per_s']:,.0f}",
            ]
            for name, r in (("FIFO", fifo), ("fair", fair))
        ],
    )
    fair_ok = fair["small_wait_p95_s"] < 0.050
    fifo_ok = fifo["small_wait_p50_s"] >= 1.0
    report += (
        f"\nFIFO p50 / fair p50 = {ratio:,.0f}x"
        f"\ntarget: fair p95 under 50 ms: {'met' if fair_ok else 'NOT met'} "
        f"({ms(fair['small_wait_p95_s'])}); FIFO p50 in seconds: "
        f"{'met' if fifo_ok else 'NOT met'} ({ms(fifo['small_wait_p50_s'])})"
    )
    if quick:
        report += "\n(quick: a 1,000-job flood drains in about a second, so FIFO's wait is short)"
    path = out_dir / ("noisy_neighbour-quick.png" if quick else "noisy_neighbour.png")
    chart(results, path)
    return {
        "title": "Noisy neighbour: fair vs FIFO",
        "method": (
            f"One tenant enqueues {big:,} jobs of 5 ms at once; while its backlog lasts, five "
            f"small tenants submit one job every 100 ms between them (round-robin, from a "
            f"thread of the bench process). One runworker process with {CONCURRENCY} threads "
            f"(--concurrency {CONCURRENCY}). Wait = started_at - created_at of each small "
            f"job (PostgreSQL's clock); big drain = its last finish - its enqueue. One run "
            f"per ordering, fair then FIFO, in the same invocation."
        ),
        "report": report,
        "figures": {
            **results,
            "fifo_over_fair_p50": ratio,
            "worker": f"{PROCESSES} process x {CONCURRENCY} threads",
            "targets_met": {"fair_p95_under_50ms": fair_ok, "fifo_p50_in_seconds": fifo_ok},
        },
        "charts": [str(path)],
    }


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
