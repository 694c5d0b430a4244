"""Look-ahead (PGQUEUE["PREFETCH"]): what claiming ahead buys in throughput, costs in fairness.

For each look-ahead K in 0, 2, 4, 8, 16, 32 (quick: 0, 8 and 32):

- throughput: pre-enqueued no-op jobs (4 tenants, fair ordering), one `manage.py runworker
  --burst` with PGQUEUE_PREFETCH=K at concurrency 8 and at concurrency 1; jobs/s = jobs /
  (last finish - first start) from the rows, the median of the runs (interleaved: every K
  once, then again), and its ratio to pgbench's commit ceiling at as many clients,
  measured in the same run;
- fairness: the noisy-neighbour scenario (bench/noisy_neighbour.py, fair ordering, 8
  threads, 5 ms jobs) with PGQUEUE_PREFETCH=K: the small tenants' wait. The claim stamps
  ``started_at``, so started_at - created_at is the wait for a claim; a prefetched job
  then waits locally for a slot as well, which finished_at - created_at (less the job's
  5 ms) includes. Both are given.

    python scripts/with_db.py -- python -m bench.prefetch [--quick]
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import noisy_neighbour
from bench.common import commit_ceiling, median, ms, percentile, query, reset_tables, table
from bench.harness import start_worker, stop_workers

LEVELS = [0, 2, 4, 8, 16, 32]
QUICK_LEVELS = [0, 8, 32]


def _fill(jobs: int) -> None:
    from django.db import connection

    import pgqueue

    reset_tables()
    for t in range(4):
        pgqueue.enqueue_many("bench.noop", [None] * (jobs // 4), tenant=f"tenant{t}")
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE pgqueue_job")


def _burst(concurrency: int, prefetch: int, jobs: int, *extra: str) -> float:
    """jobs/s of one ``runworker --burst`` over ``jobs`` pre-enqueued no-op jobs."""
    _fill(jobs)
    worker = start_worker(["--burst", "--concurrency", str(concurrency), *extra], PREFETCH=prefetch)
    try:
        code = worker.proc.wait()
    finally:
        stop_workers([worker])
    if code != 0:
        raise subprocess.CalledProcessError(code, worker.proc.args)
    ((done, seconds),) = query(
        "SELECT count(*) FILTER (WHERE status = 'done'), "
        "extract(epoch FROM max(finished_at) - min(started_at)) FROM pgqueue_job"
    )
    if done != jobs:
        raise SystemExit(f"only {done} of {jobs} jobs done")
    return done / float(seconds)


@contextlib.contextmanager
def _prefetch_env(prefetch: int) -> Iterator[None]:
    """Workers started by bench.noisy_neighbour inherit PGQUEUE_PREFETCH from here."""
    before = os.environ.get("PGQUEUE_PREFETCH")
    os.environ["PGQUEUE_PREFETCH"] = str(prefetch)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PGQUEUE_PREFETCH", None)
        else:
            os.environ["PGQUEUE_PREFETCH"] = before


def _fairness(prefetch: int, big: int) -> dict[str, Any]:
    with _prefetch_env(prefetch):
        r = noisy_neighbour.one_run("fair", big)
    done = [
        float(w)
        for (w,) in query(
            "SELECT extract(epoch FROM finished_at - created_at)::float8 - 0.005"
            " FROM pgqueue_job WHERE tenant <> 'big'"
        )
    ]
    return {
        "claim_wait_p50_s": r["small_wait_p50_s"],
        "claim_wait_p95_s": r["small_wait_p95_s"],
        "start_wait_p95_s": percentile(done, 95),
        "big_jobs_per_s": r["big_jobs_per_s"],
        "small_jobs": r["small_jobs"],
    }


def chart(levels: list[int], figures: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for c, colour in ((8, "tab:blue"), (1, "tab:green")):
        ax.plot(
            levels,
            [figures["throughput"][c][k]["ratio"] for k in levels],
            marker="o",
            color=colour,
            label=f"jobs/s ÷ commit ceiling, concurrency {c}",
        )
    ax.axhline(0.4, color="grey", linestyle=":", linewidth=1, label="target 0.4 at c=8")
    ax.set_xlabel("look-ahead K (PGQUEUE PREFETCH): jobs claimed beyond the free slots")
    ax.set_ylabel("throughput ÷ pgbench commit ceiling (log)")
    ax.set_yscale("log")  # c=1 passes its 1-client ceiling many times over
    ax.set_xticks(levels)
    ax.grid(True, alpha=0.3)
    right = ax.twinx()
    right.plot(
        levels,
        [figures["fairness"][k]["claim_wait_p95_s"] * 1000 for k in levels],
        marker="s",
        color="tab:red",
        label="small tenant p95 wait, enqueue → claim (ms)",
    )
    right.plot(
        levels,
        [figures["fairness"][k]["start_wait_p95_s"] * 1000 for k in levels],
        marker="^",
        linestyle="--",
        color="tab:orange",
        label="small tenant p95, enqueue → finish - 5 ms (ms)",
    )
    right.axhline(50, color="tab:red", linestyle=":", linewidth=1)
    right.set_ylabel("small tenant p95 (ms)")
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    ax.set_title("Look-ahead: throughput against small-tenant wait (noisy neighbour, fair)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    levels = QUICK_LEVELS if quick else LEVELS
    runs = 1 if quick else 3
    jobs = {8: 4_000 if quick else 12_000, 1: 1_000 if quick else 3_000}
    big = 1_000 if quick else 10_000
    ceilings = {c: commit_ceiling(c, seconds=2 if quick else 5) for c in (1, 8)}
    rates: dict[int, dict[int, list[float]]] = {c: {k: [] for k in levels} for c in jobs}
    for _ in range(runs):
        for k in levels:
            for c in (8, 1):
                rates[c][k].append(_burst(c, k, jobs[c]))
                print(
                    f"   prefetch {k:2}, concurrency {c}: {rates[c][k][-1]:8,.0f} jobs/s",
                    flush=True,
                )
    throughput = {
        c: {
            k: {
                "jobs_per_s": median(rates[c][k]),
                "ratio": median(rates[c][k]) / ceilings[c] if ceilings[c] else float("nan"),
                "runs": rates[c][k],
            }
            for k in levels
        }
        for c in jobs
    }
    fairness = {}
    for k in levels:
        fairness[k] = _fairness(k, big)
        print(
            f"   prefetch {k:2}, noisy neighbour: small p95 "
            f"{ms(fairness[k]['claim_wait_p95_s'])} (to claim), "
            f"{ms(fairness[k]['start_wait_p95_s'])} (to finish - 5 ms)",
            flush=True,
        )
    figures = {
        "levels": levels,
        "ceiling_tps": ceilings,
        "throughput": throughput,
        "fairness": fairness,
    }
    rows = [
        [
            k,
            throughput[8][k]["jobs_per_s"],
            f"{throughput[8][k]['ratio']:.3f}",
            throughput[1][k]["jobs_per_s"],
            f"{throughput[1][k]['ratio']:.3f}",
            ms(fairness[k]["claim_wait_p95_s"]),
            ms(fairness[k]["start_wait_p95_s"]),
            f"{fairness[k]['big_jobs_per_s']:,.0f}",
        ]
        for k in levels
    ]
    report = table(
        [
            "look-ahead",
            "c=8 jobs/s",
            "÷ ceiling",
            "c=1 jobs/s",
            "÷ ceiling",
            "small p95 to claim",
            "to finish-5ms",
            "big jobs/s",
        ],
        rows,
    ) + (
        f"\npgbench commit ceiling: {ceilings[8] or float('nan'):,.0f} tps at 8 clients, "
        f"{ceilings[1] or float('nan'):,.0f} at 1 (same run); targets: c=8 ÷ ceiling ≥ 0.4, "
        "small p95 < 50 ms"
    )
    path = out_dir / ("prefetch-quick.png" if quick else "prefetch.png")
    chart(levels, figures, path)
    method = (
        f"No-op jobs pre-enqueued ({jobs[8]:,} at concurrency 8, {jobs[1]:,} at 1; 4 tenants, "
        f"fair), one runworker --burst per run with PGQUEUE_PREFETCH=K, median of {runs} "
        "interleaved runs; jobs/s from the rows' timestamps, divided by pgbench's ceiling "
        f"at as many clients in the same run. Fairness: noisy neighbour ({big:,}-job flood, "
        "5 ms jobs, 8 threads, fair) per K."
    )
    return {
        "title": "Look-ahead",
        "method": method,
        "report": report,
        "figures": figures,
        "charts": [str(path)],
    }


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
