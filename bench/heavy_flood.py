"""Heavy flood: one tenant's long jobs hold every worker; what ordering can and cannot do.

One tenant enqueues 400 jobs of 500 ms at once (quick: 80 of 200 ms); while its backlog
lasts, five small tenants submit one 5 ms job every 100 ms between them (bench/
noisy_neighbour.py's submitter). One `manage.py runworker --concurrency 8`. Four variants:
FIFO; fair by jobs (the default); fair by worker time (FAIRNESS="time", both tasks' run
times known from a warm-up); fair with the flood tenant capped at 6 running jobs (through
``set_flood_cap``; skipped in a build without concurrency caps). Wait = started_at -
created_at of each small job (to its handler's start); drain = the flood's last finish - its
enqueue.

    python scripts/with_db.py -- python -m bench.heavy_flood [--quick]
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from typing import Any

from bench.common import fold_everything, ms, query, reset_tables, table
from bench.harness import running_worker, wait_for
from bench.noisy_neighbour import CONCURRENCY, PROCESSES, figures, flood_and_drain

FLOOD_TASK = "bench.sleep_ms"
CAP = 6
VARIANTS = ("fifo", "jobs", "time", "capped")
TITLES = {
    "fifo": "FIFO",
    "jobs": "fair (jobs)",
    "time": "fair (time)",
    "capped": f"fair, flood capped at {CAP}",
}


def set_flood_cap(tenant: str, max_running: int) -> bool:
    """Cap ``tenant``'s running jobs through ``pgqueue.limits.set_tenant_limits`` when this
    build has concurrency caps; False (the variant is skipped) when it has none."""
    try:
        limits = importlib.import_module("pgqueue.limits")
    except ImportError:
        return False
    setter = getattr(limits, "set_tenant_limits", None)
    if setter is None:
        return False
    setter(tenant, max_running=max_running)
    return True


def _settings(variant: str) -> dict[str, str]:
    """The PGQUEUE settings of a variant, for the worker and the enqueuers alike."""
    return {"fifo": {"ORDERING": "fifo"}, "time": {"FAIRNESS": "time"}}.get(variant, {})


def warm_up(flood_ms: int) -> None:
    """Run a few jobs of both tasks and fold their run times, so that FAIRNESS="time" charges
    known means (as on a queue that has run them before); then forget the jobs, keeping the
    task totals. Done in every variant, so that they differ only in their settings."""
    from django.db import connection

    import pgqueue

    pgqueue.enqueue_many(FLOOD_TASK, [{"ms": flood_ms}] * CONCURRENCY, tenant="warm")
    pgqueue.enqueue_many("bench.sleep5ms", [None] * 20, tenant="warm")
    wait_for(
        lambda: not query("SELECT 1 FROM pgqueue_job WHERE status <> 'done' LIMIT 1"),
        60,
        "the warm-up jobs",
    )
    with connection.cursor() as cur:
        fold_everything(cur)
        # Not RESTART IDENTITY: the fold's mark counts attempt ids.
        cur.execute("TRUNCATE pgqueue_job, pgqueue_job_attempt, pgqueue_fair_clock CASCADE")


def one_run(variant: str, big: int, flood_ms: int) -> dict[str, Any]:
    from django.conf import settings
    from django.test import override_settings

    reset_tables()
    extra = _settings(variant)
    enqueuers = (
        override_settings(PGQUEUE={**(settings.PGQUEUE or {}), **extra})
        if extra
        else contextlib.nullcontext()
    )
    # The cap is kept on the tenant, which the warm-up's truncation leaves alone.
    if variant == "capped" and not set_flood_cap("big", CAP):
        return {"skipped": "no caps in this build"}
    with enqueuers, running_worker(CONCURRENCY, PROCESSES, **extra):
        warm_up(flood_ms)
        flood_and_drain(big, FLOOD_TASK, {"ms": flood_ms})
    return figures(variant, big)


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    big, flood_ms = (80, 200) if quick else (400, 500)
    results: dict[str, dict[str, Any]] = {}
    for variant in VARIANTS:
        results[variant] = r = one_run(variant, big, flood_ms)
        if "skipped" in r:
            print(f"   {TITLES[variant]}: skipped ({r['skipped']})", flush=True)
            continue
        print(
            f"   {TITLES[variant]}: {r['small_jobs']} small jobs, p50 "
            f"{ms(r['small_wait_p50_s'])}, p95 {ms(r['small_wait_p95_s'])}, "
            f"flood drained in {r['big_drain_s']:.1f} s",
            flush=True,
        )
    rows = []
    for variant in VARIANTS:
        r = results[variant]
        if "skipped" in r:
            rows.append([TITLES[variant], "skipped", "", "", "", ""])
            continue
        rows.append(
            [
                TITLES[variant],
                r["small_jobs"],
                ms(r["small_wait_p50_s"]),
                ms(r["small_wait_p95_s"]),
                ms(r["small_wait_max_s"]),
                f"{r['big_drain_s']:.1f} s",
            ]
        )
    report = table(["variant", "small jobs", "small p50", "p95", "max", "flood drain"], rows)
    targets: dict[str, Any] = {}
    capped, uncapped = results["capped"], results["jobs"]
    if "skipped" in capped:
        report += "\ntargets (capped variant): not measured, no caps in this build"
    else:
        bound = uncapped["big_drain_s"] * CONCURRENCY / CAP * 1.1
        targets = {
            "capped_p95_under_50ms": capped["small_wait_p95_s"] < 0.050,
            "capped_drain_within_8_6_plus_10pct": capped["big_drain_s"] <= bound,
        }
        p95_ok, drain_ok = targets.values()
        report += (
            f"\ntarget: capped small p95 under 50 ms: {'met' if p95_ok else 'NOT met'} "
            f"({ms(capped['small_wait_p95_s'])}); capped drain at most 8/6 of uncapped + 10% "
            f"({bound:.1f} s): {'met' if drain_ok else 'NOT met'} ({capped['big_drain_s']:.1f} s)"
        )
    report += (
        "\nOrdering alone (jobs or time) cannot bound the wait here: with every slot running"
        " a flood job, a small job waits for one to finish whatever its place in line."
    )
    for r in results.values():
        r.pop("small_series", None)
    return {
        "title": "Heavy flood: long jobs in every slot",
        "method": (
            f"One tenant enqueues {big:,} jobs of {flood_ms} ms at once; while its backlog "
            f"lasts, five small tenants submit one 5 ms job every 100 ms between them. One "
            f"runworker process with {CONCURRENCY} threads. Variants: FIFO, fair by jobs, "
            f'fair by worker time (FAIRNESS="time"), fair with the flood capped at {CAP} '
            f"running jobs. Each variant first runs {CONCURRENCY} flood jobs and 20 small "
            f'ones and folds their run times (the estimates FAIRNESS="time" charges). '
            f"Wait = started_at - created_at of each small job (to the handler's start)."
        ),
        "report": report,
        "figures": {**results, "targets_met": targets, "flood_ms": flood_ms},
    }


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
