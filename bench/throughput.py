#!/usr/bin/env python
"""Throughput of the real runworker path, next to the server's commit ceiling.

For each total concurrency (1, 2, 4, 8), as threads in one process, as processes of one
thread each, and as 2 processes sharing the threads: 20,000 no-op jobs are enqueued (4
tenants, fair ordering on), then `manage.py runworker --burst` runs until none is left.
jobs/s = jobs / (last finish - first start), from the jobs' own database timestamps, so
process start-up is not counted. Median of 3 runs. In the same run, pgbench measures the
commit ceiling at the same client counts (one tiny UPDATE per transaction), and the report
gives jobs/s divided by that rate.

    python scripts/with_db.py -- python bench/throughput.py [--jobs N] [--runs R]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, commit_ceiling, machine, median, setup_database, worker_env


def one_run(jobs: int, threads: int, processes: int) -> float:
    from django.db import connection

    import pgqueue
    from pgqueue.models import Job

    Job.objects.all().delete()
    per_tenant = jobs // 4
    for t in range(4):
        pgqueue.enqueue_many("bench.noop", [None] * per_tenant, tenant=f"tenant{t}")
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE pgqueue_job")
    cmd = [
        sys.executable,
        str(ROOT / "manage.py"),
        "runworker",
        "--burst",
        "-v",
        "0",
        "--concurrency",
        str(threads),
    ]
    if processes > 1:
        cmd += ["--processes", str(processes)]
    subprocess.run(cmd, env=worker_env(), check=True, cwd=ROOT)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE status = 'done'), "
            "extract(epoch FROM max(finished_at) - min(started_at)) FROM pgqueue_job"
        )
        done, seconds = cur.fetchone()
    if done != per_tenant * 4:
        raise SystemExit(f"only {done} of {per_tenant * 4} jobs done")
    return done / float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", default="1,2,4,8")
    args = parser.parse_args()
    setup_database()
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"machine: {machine()}", flush=True)
    rows = []
    for n in levels:
        ceiling = commit_ceiling(n)
        shapes = [("threads", n, 1)]
        if n > 1:
            shapes.append(("processes", 1, n))
        if n > 2:
            shapes.append(("2 processes", n // 2, 2))
        for label, threads, processes in shapes:
            rates = []
            for _ in range(args.runs):
                started = time.monotonic()
                rates.append(one_run(args.jobs, threads, processes))
                print(
                    f"  {n} as {label:12}: {rates[-1]:8.0f} jobs/s "
                    f"({time.monotonic() - started:.1f} s wall)",
                    flush=True,
                )
            rows.append((label, n, median(rates), ceiling))
    print()
    print(f"Throughput: {args.jobs:,} no-op jobs, runworker --burst, median of {args.runs}")
    print(f"{'concurrency':<26}{'jobs/s':>10}{'pgbench tps':>14}{'ratio':>8}")
    for label, n, rate, ceiling in rows:
        ratio = f"{rate / ceiling:.2f}" if ceiling else "n/a"
        ceiling_text = f"{ceiling:,.0f}" if ceiling else "n/a"
        print(f"{f'{n} as {label}':<26}{rate:>10,.0f}{ceiling_text:>14}{ratio:>8}")


if __name__ == "__main__":
    main()
