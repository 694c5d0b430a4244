"""Scale of the table: the hot path and the reads beside 0 to 10,000,000 old jobs.

For each size (0, 1,000,000 and 10,000,000 finished jobs, the largest set by
TABLE_SCALE_ROWS; quick: 0 and 100,000) the tables
are emptied and filled with that many 'done' jobs (and their attempt rows) by one
INSERT ... SELECT generate_series each, then VACUUM ANALYZE. Then, from this process:
500 single enqueues (pgqueue.enqueue, each its own transaction), and 500 claims of one
job each, every one followed by its completion (pgqueue.store.claim and complete_many on
a psycopg connection made as the worker makes its own), each call timed on its own. The
claim index is partial (status = 'queued'), so finished jobs are not in it: the hot path
should not notice them. Then the reads an operator or a scraper makes, each timed
through Django's test client with an all-tenants API key (whole requests, middleware
included): GET /stats, GET /metrics, GET /jobs (the first page of 50) and the 1,000th page
of 50 by cursor. Each is printed as a ratio of its p50 to the empty table's, beside its
target: claim and enqueue at most 1.2x, the reads at most 2x.

    BENCH_DB=pgq_reads_bench python scripts/with_db.py -- python -m bench.table_scale [--quick]
"""

from __future__ import annotations

import base64
import contextlib
import os
import time
from pathlib import Path
from typing import Any

from bench.common import percentile, reset_tables, table

OPS = 500
READS = 30  # timed requests of each read
#: The largest table of the full run (TABLE_SCALE_ROWS, e.g. 2000000 where loading ten
#: million rows takes too long).
MAX_ROWS = int(os.environ.get("TABLE_SCALE_ROWS", "10000000"))
#: p50 at the largest size over p50 on the empty table, at most.
TARGETS = {
    "enqueue": 1.2,
    "claim": 1.2,
    "stats": 2.0,
    "metrics": 2.0,
    "jobs_first": 2.0,
    "jobs_page_1000": 2.0,
}
WARMUP = 20  # operations of each kind before the timed ones (connections, plan caches)
WORKER = "bench-table-scale"


def fill(rows: int) -> float:
    """``rows`` finished jobs, 100 tenants, with one 'done' attempt row each; seconds taken."""
    from django.db import DatabaseError, connection

    started = time.monotonic()
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO pgqueue_tenant (name, weight) "
            "SELECT 'old' || g, 1.0 FROM generate_series(0, 99) g"
        )
        if rows:
            # Finished over the last rows * 10 ms, oldest first, as if run one by one.
            cur.execute(
                """
                INSERT INTO pgqueue_job (queue, tenant, task, payload, status, priority, vtime,
                                         attempts, max_attempts, run_at, result, created_at,
                                         started_at, finished_at)
                SELECT 'default', 'old' || (g %% 100), 'bench.noop', '{}'::jsonb, 'done', 0,
                       g::float8, 1, 5, t, NULL, t, t, t + interval '5 ms'
                  FROM generate_series(1, %(rows)s) g,
                       LATERAL (SELECT now() - (%(rows)s - g) * interval '10 ms' AS t) x
                """,
                {"rows": rows},
            )
            cur.execute(
                "INSERT INTO pgqueue_job_attempt "
                "(job_id, attempt, worker, started_at, finished_at, outcome) "
                "SELECT id, 1, 'old-worker', started_at, finished_at, 'done' FROM pgqueue_job"
            )
        cur.execute("VACUUM ANALYZE pgqueue_job")
        cur.execute("VACUUM ANALYZE pgqueue_job_attempt")
        cur.execute("VACUUM ANALYZE pgqueue_tenant")
    with contextlib.suppress(DatabaseError), connection.cursor() as cur:
        # Write the fill's pages out now, not in a checkpoint during the measurement
        # (needs superuser or pg_checkpoint; skipped without).
        cur.execute("CHECKPOINT")
    return time.monotonic() - started


def sizes() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_total_relation_size('pgqueue_job'), "
            "pg_relation_size('pgqueue_job_claim'), pg_relation_size('pgqueue_job_lease')"
        )
        total, claim, lease = cur.fetchone()
    return {"job_table_total_bytes": total, "claim_index_bytes": claim, "lease_index_bytes": lease}


def measure() -> tuple[dict[str, list[float]], str]:
    """Milliseconds of each timed enqueue, claim and complete; the claim's plan."""
    import pgqueue
    from pgqueue import store
    from pgqueue.worker.connection import connect, connect_params

    enqueue_ms: list[float] = []
    for i in range(WARMUP + OPS):
        t0 = time.perf_counter()
        pgqueue.enqueue("bench.noop", {"i": i}, tenant=f"new{i % 4}")
        if i >= WARMUP:
            enqueue_ms.append((time.perf_counter() - t0) * 1000)

    plan = claim_plan()
    claim_ms: list[float] = []
    complete_ms: list[float] = []
    with connect(connect_params(application_name=WORKER)) as conn, conn.cursor() as cur:
        for i in range(WARMUP + OPS):
            t0 = time.perf_counter()
            (job,) = store.claim(cur, worker=WORKER, queues=["default"], limit=1)
            t1 = time.perf_counter()
            recorded = store.complete_many(
                cur, worker=WORKER, results=[(job.id, job.attempt, None)]
            )
            t2 = time.perf_counter()
            if recorded != {job.id}:
                raise RuntimeError(f"job {job.id} was claimed but its completion not recorded")
            if i >= WARMUP:
                claim_ms.append((t1 - t0) * 1000)
                complete_ms.append((t2 - t1) * 1000)
    return {"enqueue": enqueue_ms, "claim": claim_ms, "complete": complete_ms}, plan


def measure_reads() -> dict[str, list[float]]:
    """Milliseconds of each timed request of the reads (see the module's docstring)."""
    from django.db import connection
    from django.test import Client

    from pgqueue import keys

    key = keys.create_api_key(tenant=None)[1]
    client = Client(HTTP_HOST="localhost", HTTP_AUTHORIZATION=f"Bearer {key}")
    with connection.cursor() as cur:
        cur.execute("SELECT max(id) FROM pgqueue_job")
        (top,) = cur.fetchone()
    # Where the 1,000th page of 50 starts, newest first (ids are dense in the fill).
    deep = base64.urlsafe_b64encode(f"n:{max(1, (top or 0) - 999 * 50 + 1)}".encode()).decode()
    urls = {
        "stats": "/stats",
        "metrics": "/metrics",
        "jobs_first": "/jobs",
        "jobs_page_1000": f"/jobs?cursor={deep.rstrip('=')}",
    }
    timings: dict[str, list[float]] = {}
    for name, url in urls.items():
        timings[name] = []
        for i in range(WARMUP // 4 + READS):
            t0 = time.perf_counter()
            response = client.get(url)
            elapsed = (time.perf_counter() - t0) * 1000
            if response.status_code != 200:
                raise RuntimeError(f"GET {url}: {response.status_code} {response.content[:200]!r}")
            if i >= WARMUP // 4:
                timings[name].append(elapsed)
    return timings


def claim_plan() -> str:
    """The scan EXPLAIN shows for the claim's locking SELECT, as the claims will find it."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "EXPLAIN SELECT id FROM pgqueue_job WHERE queue = 'default' AND status = 'queued' "
            "AND NOT gated "
            "ORDER BY priority DESC, vtime, id LIMIT 1 FOR UPDATE SKIP LOCKED"
        )
        plan = [r[0] for r in cur.fetchall()]
    scans = [line.strip().lstrip("-> ").split("  (")[0] for line in plan if "Scan" in line]
    return scans[0] if scans else plan[0]


def size_text(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 1024:,.0f} KiB"


def chart(results: dict[int, dict[str, Any]], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    sizes_ = sorted(results)
    labels = [f"{s:,}" for s in sizes_]
    fig, ax = plt.subplots(figsize=(7, 4))
    for op, colour in (("enqueue", "tab:blue"), ("claim", "tab:orange"), ("complete", "tab:green")):
        ax.plot(
            labels, [results[s][op]["p50"] for s in sizes_], "o-", color=colour, label=f"{op} p50"
        )
        ax.plot(
            labels,
            [results[s][op]["p95"] for s in sizes_],
            "o--",
            color=colour,
            alpha=0.6,
            label=f"{op} p95",
        )
    ax.set_xlabel("finished jobs already in the table")
    ax.set_ylabel("ms per call (solid p50, dashed p95)")
    ax.set_ylim(bottom=0)
    ax.set_title("pgqueue: hot-path latency vs table size")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    counts = [0, 100_000] if quick else sorted({0, min(1_000_000, MAX_ROWS), MAX_ROWS})
    results: dict[int, dict[str, Any]] = {}
    for rows in counts:
        reset_tables()
        fill_s = fill(rows)
        timings, plan = measure()
        timings.update(measure_reads())
        results[rows] = {
            "fill_seconds": round(fill_s, 1),
            "claim_plan": plan,
            **sizes(),
            **{
                op: {
                    "p50": round(percentile(ms, 50), 3),
                    "p95": round(percentile(ms, 95), 3),
                    "max": round(max(ms), 3),
                }
                for op, ms in timings.items()
            },
        }
    reset_tables()
    rows_out = []
    for rows, r in results.items():
        rows_out.append(
            [
                f"{rows:,}",
                *(
                    f"{r[op][q]:.2f}"
                    for op in ("enqueue", "claim", "complete")
                    for q in ("p50", "p95")
                ),
                size_text(r["claim_index_bytes"]),
                size_text(r["job_table_total_bytes"]),
            ]
        )
    report = table(
        [
            "finished jobs",
            "enqueue p50",
            "p95",
            "claim p50",
            "p95",
            "complete p50",
            "p95",
            "claim index",
            "job table",
        ],
        rows_out,
    )
    report += "\nms per call, client side, each its own transaction (one commit)."
    reads_rows = [
        [f"{rows:,}", *(f"{r[op]['p50']:.2f}" for op in TARGETS if op not in ("enqueue", "claim"))]
        for rows, r in results.items()
    ]
    report += "\n\nReads, p50 ms per request (test client, middleware included):\n"
    report += table(["finished jobs", "/stats", "/metrics", "/jobs", "/jobs page 1000"], reads_rows)
    largest, empty = results[max(results)], results[0]
    # The empty table has no 1,000th page: the deep page is set against its first page,
    # the same fifty rows of work.
    base = {**{op: op for op in TARGETS}, "jobs_page_1000": "jobs_first"}
    ratios = {op: largest[op]["p50"] / empty[base[op]]["p50"] for op in TARGETS}
    report += f"\n\np50 at {max(results):,} finished jobs over the empty table's (page 1000: "
    report += "over the empty table's first page):"
    for op, target in TARGETS.items():
        verdict = "ok" if ratios[op] <= target else "OVER"
        report += f"\n  {op:<15} {ratios[op]:5.2f}x  (target <= {target}x)  {verdict}"
    report += "\n\nThe claim's scan:"
    for rows, r in results.items():
        report += f"\n  {rows:>9,} finished jobs: {r['claim_plan']}"
    charts = []
    png = chart(results, out_dir / ("table_scale-quick.png" if quick else "table_scale.png"))
    if png:
        charts.append(str(png))
    method = (
        f"For each size the job table is emptied and filled with that many 'done' jobs "
        "(and an attempt row each) by INSERT ... SELECT generate_series, then VACUUM "
        f"ANALYZE. Then {OPS} single pgqueue.enqueue calls, and {OPS} claims of one job each "
        "(pgqueue.store.claim), each followed by its completion (store.complete_many), on a "
        f"psycopg connection made as the worker's; after {WARMUP} untimed calls of each. "
        "Latency is per call, measured in this process, one commit each. Then "
        f"{READS} requests each of GET /stats, /metrics, /jobs and its 1,000th page by "
        "cursor, through Django's test client with an API key, after a few untimed ones."
    )
    return {
        "title": "Scale of the table",
        "method": method,
        "report": report,
        "figures": {
            **{str(k): v for k, v in results.items()},
            "ratios": {op: round(r, 3) for op, r in ratios.items()},
        },
        "charts": charts,
    }


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
