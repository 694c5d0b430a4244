"""Noisy neighbour: what one tenant's flood does to everyone else's wait, fair vs FIFO.

One tenant enqueues 10,000 jobs at once (quick: 1,000); while its backlog lasts, five small
tenants submit one job every 100 ms between them, round-robin, from a thread of this
process. One `manage.py runworker --concurrency 8` (one process, 8 handler threads) runs
jobs of 5 ms each. The same scenario runs with fair ordering and with FIFO ordering (the
enqueuers under override_settings(PGQUEUE={"ORDERING": "fifo"}), the worker with
PGQUEUE_ORDERING=fifo). A small job's wait is started_at - created_at of its row: from its
enqueue to its handler's start, both in PostgreSQL's clock.

    python scripts/with_db.py -- python -m bench.noisy_neighbour [--quick]
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import ms, percentile, query, reset_tables, scalar, table
from bench.harness import running_worker, wait_for

SMALL_TENANTS = 5
SMALL_PERIOD = 0.1  # one small job every 100 ms, all small tenants together
CONCURRENCY = 8
PROCESSES = 1


def flood_and_drain(big: int, task: str = "bench.sleep5ms", payload: Any = None) -> None:
    """The scenario with its workers up: the big tenant's flood of ``big`` jobs of ``task``
    (5 ms each by default) at once, the small tenants submitting (``submit_small``) until
    the flood has drained, then every small job done. Shared by this module, bench/hosts.py
    (the workers split over hosts) and bench/heavy_flood.py (long flood jobs)."""
    import pgqueue

    pgqueue.enqueue_many(task, [payload] * big, tenant="big")
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

    reset_tables()
    enqueuers = (
        override_settings(PGQUEUE={**(settings.PGQUEUE or {}), "ORDERING": "fifo"})
        if ordering == "fifo"
        else contextlib.nullcontext()
    )
    with enqueuers, running_worker(CONCURRENCY, PROCESSES, ORDERING=ordering):
        flood_and_drain(big)
    return figures(ordering, big)


def figures(variant: str, big: int) -> dict[str, Any]:
    """The big tenant's drain and the small tenants' waits of the run just made."""
    (t0, drain, big_done) = query(
        "SELECT min(created_at), extract(epoch FROM max(finished_at) - min(created_at)),"
        " count(*) FILTER (WHERE status = 'done') FROM pgqueue_job WHERE tenant = 'big'"
    )[0]
    small = query(
        "SELECT extract(epoch FROM created_at - %s)::float8,"
        " extract(epoch FROM started_at - created_at)::float8"
        " FROM pgqueue_job WHERE tenant <> 'big' ORDER BY created_at, id",
        [t0],
    )
    if big_done != big:
        raise RuntimeError(f"{variant}: only {big_done} of {big} big jobs done")
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
            f"(--concurrency {CONCURRENCY}). Wait = started_at - created_at (to the handler's "
            "start) of each small "
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
