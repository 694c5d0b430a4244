"""Weights: three tenants with weights 1, 2 and 3 and equal backlogs share one worker.

Each tenant enqueues the same number of no-op jobs (3,000; quick: 300) after its weight
is set; then one `manage.py runworker --concurrency 4` runs them all. While every tenant
still has work, fair queuing should give them 1/6, 2/6 and 3/6 of the worker: the share
of each in the first 60% of the jobs, in the order they were started (started_at, then
the claim's own order within one claim), is compared with that target.

    python scripts/with_db.py -- python -m bench.weights [--quick]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common import query, reset_tables, scalar, table
from bench.harness import running_worker, wait_for

WEIGHTS = {"w1": 1, "w2": 2, "w3": 3}
CONCURRENCY = 4
FIRST = 0.6  # the share of the run looked at: the heaviest tenant runs out at 2/3
TOLERANCE = 0.05  # absolute


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    import pgqueue
    from pgqueue import services

    per_tenant = 300 if quick else 3_000
    total = per_tenant * len(WEIGHTS)
    reset_tables()
    for tenant, weight in WEIGHTS.items():
        services.set_tenant_weight(tenant, weight)
    for tenant in WEIGHTS:
        pgqueue.enqueue_many("bench.noop", [None] * per_tenant, tenant=tenant)
    with running_worker(CONCURRENCY):
        wait_for(
            lambda: (
                not scalar(
                    "SELECT EXISTS (SELECT 1 FROM pgqueue_job"
                    " WHERE status IN ('queued', 'running'))"
                )
            ),
            60 + total / 100,
            "every job to run",
            poll=0.1,
        )
    done = scalar("SELECT count(*) FROM pgqueue_job WHERE status = 'done'")
    if done != total:
        raise RuntimeError(f"only {done} of {total} jobs done")
    first = int(total * FIRST)
    counts = dict(
        query(
            "SELECT tenant, count(*) FROM (SELECT tenant FROM pgqueue_job"
            " ORDER BY started_at, vtime, id LIMIT %s) f GROUP BY tenant",
            [first],
        )
    )
    # When each tenant's last job started, in seconds after the first start.
    ran_out = dict(
        query(
            "SELECT tenant, extract(epoch FROM max(started_at) - (SELECT min(started_at)"
            " FROM pgqueue_job))::float8 FROM pgqueue_job GROUP BY tenant"
        )
    )
    seconds = scalar(
        "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM pgqueue_job"
    )
    weight_sum = sum(WEIGHTS.values())
    shares, lines, worst = {}, [], 0.0
    for tenant, weight in WEIGHTS.items():
        share = counts.get(tenant, 0) / first
        target = weight / weight_sum
        worst = max(worst, abs(share - target))
        shares[tenant] = {
            "weight": weight,
            "jobs_in_first": counts.get(tenant, 0),
            "share": share,
            "target": target,
            "last_start_s": ran_out.get(tenant),
        }
        lines.append(
            [
                tenant,
                weight,
                counts.get(tenant, 0),
                f"{share:.1%}",
                f"{target:.1%}",
                f"{share - target:+.1%}",
                f"{ran_out.get(tenant, float('nan')):.2f} s",
            ]
        )
    ok = worst <= TOLERANCE
    report = table(
        [
            "tenant",
            "weight",
            f"jobs in first {first:,}",
            "share",
            "target",
            "off by",
            "its last job started",
        ],
        lines,
    )
    report += (
        f"\ntarget: every share within {TOLERANCE:.0%} absolute of weight/6: "
        f"{'met' if ok else 'NOT met'} (worst {worst:.2%}); "
        f"{total:,} jobs in {seconds:.1f} s"
    )
    return {
        "title": "Weights 1:2:3",
        "method": (
            f"Tenants w1, w2, w3 get weights 1, 2, 3, then {per_tenant:,} no-op jobs each; one "
            f"runworker process (--concurrency {CONCURRENCY}) runs them all. Share = the "
            f"tenant's part of the first {FIRST:.0%} of jobs in start order (started_at, then "
            f"claim order), while all three still have work."
        ),
        "report": report,
        "figures": {
            "per_tenant": per_tenant,
            "first": first,
            "tenants": shares,
            "worst_abs_error": worst,
            "seconds": seconds,
            "target_met": ok,
        },
    }


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
