"""Wake-up latency of an idle worker: LISTEN/NOTIFY vs polling every second.

One `manage.py runworker --concurrency 1`, registered and listening (its listener
connection seen idle after LISTEN in pg_stat_activity) and warmed up by one job, sits idle;
then 60 no-op jobs (quick: 15) are enqueued one at a time, 0.2 to 1.2 s apart (uniform,
seeded: both runs see the same gaps). A job's latency is started_at - created_at of its
row, in PostgreSQL's clock: from the enqueue to the handler's start (before 2026-12-04
started_at was the claim's, which came a claim's commit earlier). With LISTEN/NOTIFY the
worker's fallback poll is 30 s, so only the notification can wake it in time; for polling,
the worker listens on a channel nothing notifies ("nowhere") and polls every 1 s. The
report also gives the part of the latency spent in the enqueue call itself (created_at to
the call returning, committed), which no wake-up mechanism can save.

    python scripts/with_db.py -- python -m bench.latency [--quick]
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from bench.common import ms, percentile, query, reset_tables, scalar, table
from bench.harness import running_worker, wait_for

SEED = 20261201
CONCURRENCY = 1
MODES = {
    # mode: the worker's PGQUEUE_* settings (the bench process notifies on the default channel)
    "LISTEN/NOTIFY": {"POLL_SECONDS": 30},
    "polling every 1 s": {"POLL_SECONDS": 1, "NOTIFY_CHANNEL": "nowhere"},
}
TARGET_P50 = 0.003


def one_mode(jobs: int, settings: dict[str, Any]) -> tuple[list[float], list[float]]:
    """Each job's latency (started_at - created_at), and the part of it spent in the
    enqueue itself (created_at to the enqueue call returning, committed: the system clock
    read by this process, which is PostgreSQL's clock too as the server is on this host)."""
    import pgqueue

    def done(job_id: int) -> bool:
        return scalar("SELECT status = 'done' FROM pgqueue_job WHERE id = %s", [job_id])

    reset_tables()
    gaps = random.Random(SEED)
    with running_worker(CONCURRENCY, **settings):
        warm_up = pgqueue.enqueue("bench.noop", tenant="latency").job.id
        wait_for(lambda: done(warm_up), 10, "the warm-up job")
        returned = {}
        for _ in range(jobs):
            time.sleep(gaps.uniform(0.2, 1.2))  # pacing the arrivals, not synchronisation
            last = pgqueue.enqueue("bench.noop", tenant="latency").job.id
            returned[last] = time.time()
        wait_for(lambda: done(last), 10, "the last job")
    found = query(
        "SELECT id, extract(epoch FROM started_at - created_at)::float8,"
        " extract(epoch FROM created_at)::float8 FROM pgqueue_job"
        " WHERE id <> %s AND status = 'done' ORDER BY id",
        [warm_up],
    )
    if len(found) != jobs:
        raise RuntimeError(f"only {len(found)} of {jobs} jobs done")
    return [w for _, w, _ in found], [returned[i] - created for i, _, created in found]


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    jobs = 15 if quick else 60
    results = {}
    for mode, settings in MODES.items():
        waits, enqueue = one_mode(jobs, settings)
        results[mode] = {
            "p50_s": percentile(waits, 50),
            "p95_s": percentile(waits, 95),
            "max_s": max(waits),
            "enqueue_p50_s": percentile(enqueue, 50),
            "waits_s": [round(w, 6) for w in waits],
            "enqueue_s": [round(e, 6) for e in enqueue],
        }
        print(f"   {mode}: p50 {ms(results[mode]['p50_s'])}", flush=True)
    report = table(
        ["wake-up", "jobs", "p50", "p95", "max", "of which enqueue, p50"],
        [
            [mode, jobs, ms(r["p50_s"]), ms(r["p95_s"]), ms(r["max_s"]), ms(r["enqueue_p50_s"])]
            for mode, r in results.items()
        ],
    )
    listen_p50 = results["LISTEN/NOTIFY"]["p50_s"]
    ok = listen_p50 <= TARGET_P50
    report += (
        f"\ntarget: LISTEN/NOTIFY p50 at or under {TARGET_P50 * 1000:.0f} ms: "
        f"{'met' if ok else 'NOT met'} ({ms(listen_p50)})"
    )
    return {
        "title": "Wake-up latency: LISTEN/NOTIFY vs polling",
        "method": (
            f"One idle runworker process (--concurrency {CONCURRENCY}), listening and warmed up "
            f"by one job; {jobs} no-op jobs enqueued 0.2-1.2 s apart (seeded). Latency = "
            f"started_at - created_at: to the handler's start (PostgreSQL's clock). "
            f"LISTEN/NOTIFY: fallback poll 30 s. "
            f"Polling: the worker listens on a channel nobody notifies and polls every 1 s. "
            f"'of which enqueue': created_at to the enqueue call returning, committed (the "
            f"host's clock, the server being on this host): the part no wake-up can save."
        ),
        "report": report,
        "figures": {**results, "jobs": jobs, "seed": SEED, "target_met": ok},
    }


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
