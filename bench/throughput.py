"""Throughput by claim strategy, next to the server's commit ceiling; enqueue throughput.

Claim strategies, each at 1, 2, 4 and 8 workers, median of 3 runs over pre-enqueued no-op
jobs (20,000 for runworker, 10,000 for the hand-written loops; 4 tenants, fair ordering
on); jobs/s = jobs / (last finish - first start), from the jobs' own database timestamps:

- FOR UPDATE (blocking), one job per claim: N threads, each claim and each completion its
  own transaction — every worker goes for the same next row and waits behind its holder.
- FOR UPDATE SKIP LOCKED, one job per claim, and with batches of 10: the same loop.
- runworker: the real worker (`manage.py runworker --burst`), as N threads in one process
  and as 2 processes sharing them.

In the same run pgbench measures the commit ceiling at the same client counts (one tiny
UPDATE per transaction), and the report gives jobs/s divided by it. Enqueue throughput:
single POST /jobs over HTTP (gunicorn, keep-alive, one client), enqueue_many of 1,000, and
POST /jobs/batch of 1,000.

    python scripts/with_db.py -- python -m bench.throughput [--quick]
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, commit_ceiling, median, reset_tables, table
from bench.harness import run_burst, worker_env

# The three hand-written claim loops; the bench's own SQL, not pgqueue's hot path.
CLAIM = """
WITH picked AS MATERIALIZED (
    SELECT id FROM pgqueue_job WHERE queue = 'default' AND status = 'queued'
     ORDER BY priority DESC, vtime, id LIMIT %(n)s FOR UPDATE{skip}
)
UPDATE pgqueue_job j SET status = 'running', attempts = j.attempts + 1,
       lease_owner = %(worker)s, lease_expires_at = now() + interval '30 seconds',
       started_at = now()
  FROM picked WHERE j.id = picked.id
RETURNING j.id, j.attempts
"""
COMPLETE = """
UPDATE pgqueue_job SET status = 'done', finished_at = now(), lease_expires_at = NULL
 WHERE id = ANY(%(ids)s) AND status = 'running' AND lease_owner = %(worker)s
"""
TWO = "runworker, 2 processes"
STRATEGIES = [
    ("FOR UPDATE, 1 per claim", "", 1),
    ("SKIP LOCKED, 1 per claim", " SKIP LOCKED", 1),
    ("SKIP LOCKED, 10 per claim", " SKIP LOCKED", 10),
]


def _fill(jobs: int) -> None:
    from django.db import connection

    import pgqueue

    reset_tables()
    for t in range(4):
        pgqueue.enqueue_many("bench.noop", [None] * (jobs // 4), tenant=f"tenant{t}")
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE pgqueue_job")


def _rate(expected: int) -> float:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE status = 'done'), "
            "extract(epoch FROM max(finished_at) - min(started_at)) FROM pgqueue_job"
        )
        done, seconds = cur.fetchone()
    if done != expected:
        raise SystemExit(f"only {done} of {expected} jobs done")
    return done / float(seconds)


def _claim_loop(skip: str, batch: int, threads: int) -> None:
    """N threads, each with its own connection: claim (commit), then complete (commit)."""
    import psycopg

    url = os.environ["DATABASE_URL"]
    claim = CLAIM.format(skip=skip)

    def loop(i: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            worker = f"bench-{i}"
            while True:
                rows = conn.execute(claim, {"n": batch, "worker": worker}).fetchall()
                if not rows:
                    return
                conn.execute(COMPLETE, {"ids": [r[0] for r in rows], "worker": worker})

    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _enqueue_rates(quick: bool) -> dict[str, float]:
    """jobs/s of single POSTs, enqueue_many(1,000) and POST /jobs/batch(1,000)."""
    import pgqueue
    from pgqueue import keys

    reset_tables()
    rounds = 5 if quick else 20
    t0 = time.perf_counter()
    for _ in range(rounds):
        pgqueue.enqueue_many("bench.noop", [None] * 1000, tenant="acme")
    many = rounds * 1000 / (time.perf_counter() - t0)

    _, key = keys.create_api_key(name="bench")
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "demo_project.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=worker_env(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("GET", "/health")
                if conn.getresponse().read() and True:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

        def post(path: str, body: dict[str, Any]) -> None:
            conn.request("POST", path, json.dumps(body).encode(), headers)
            response = conn.getresponse()
            response.read()
            if response.status != 201:
                raise SystemExit(f"POST {path}: {response.status}")

        singles = 100 if quick else 1000
        t0 = time.perf_counter()
        for i in range(singles):
            post("/jobs", {"task": "bench.noop", "tenant": "acme", "payload": {"i": i}})
        single = singles / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(rounds):
            post("/jobs/batch", {"task": "bench.noop", "tenant": "acme", "payloads": [None] * 1000})
        batch = rounds * 1000 / (time.perf_counter() - t0)
        conn.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    return {"post_single": single, "enqueue_many_1000": many, "post_batch_1000": batch}


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    jobs = 4_000 if quick else 20_000
    runs = 1 if quick else 3
    levels = [1, 8] if quick else [1, 2, 4, 8]
    ceilings = {n: commit_ceiling(n, seconds=2 if quick else 5) for n in levels}
    rows, figures = [], {"jobs": jobs, "runs": runs, "ceiling_tps": ceilings, "claims": {}}
    shapes: list[tuple[str, Any]] = [
        (label, lambda n, skip=skip, batch=batch: _claim_loop(skip, batch, n))
        for label, skip, batch in STRATEGIES
    ]
    shapes.append(("runworker, N threads", lambda n: run_burst(n, 1)))
    shapes.append((TWO, lambda n: run_burst(max(n // 2, 1), 2)))
    for label, start in shapes:
        per_level = {}
        # The hand-written loops are slow by design (a commit per claim and per job): half
        # the jobs keep the whole report within its time budget.
        count = jobs if label.startswith("runworker") else jobs // 2
        for n in levels:
            if label.startswith("runworker, 2") and n < 2:
                continue
            rates = []
            for _ in range(runs):
                _fill(count)
                start(n)
                rates.append(_rate(count))
            per_level[n] = median(rates)
            print(f"   {label:26} {n} workers: {per_level[n]:8,.0f} jobs/s", flush=True)
        figures["claims"][label] = per_level
        rows.append([label, *(per_level.get(n, float("nan")) for n in levels)])
    rows.append(["pgbench commit ceiling (tps)", *(ceilings[n] or float("nan") for n in levels)])
    # Total concurrency 8 either way: 1 process x 8 threads, or 2 processes x 4 (two loops
    # and two GILs on two cores). Both ratios are reported; neither hides the other.
    ratios = {
        label: (figures["claims"][label].get(8) or 0.0) / ceilings[8] if ceilings.get(8) else None
        for label in ("runworker, N threads", TWO)
    }
    figures["ratio_runworker_1x8_to_ceiling"] = ratios["runworker, N threads"]
    figures["ratio_runworker_2x4_to_ceiling"] = ratios[TWO]
    figures["ratio_runworker_8_to_ceiling"] = ratios[TWO]  # the key's meaning as before
    enqueue = _enqueue_rates(quick)
    figures["enqueue"] = enqueue
    report = (
        table(["claim strategy (jobs/s)", *(str(n) for n in levels)], rows)
        + "\n\nrunworker at total concurrency 8 ÷ commit ceiling at 8 clients (target 0.4):"
        + "".join(
            f"\n  {shape}: " + (f"{ratios[label]:.2f}" if ratios[label] is not None else "n/a")
            for shape, label in (
                ("1 process x 8 threads (--concurrency 8)", "runworker, N threads"),
                ("2 processes x 4 threads (--processes 2 --concurrency 4)", TWO),
            )
        )
        + "\n\n"
        + table(
            ["enqueue path", "jobs/s"],
            [
                ["POST /jobs, one job per request", enqueue["post_single"]],
                ["enqueue_many, 1,000 per call", enqueue["enqueue_many_1000"]],
                ["POST /jobs/batch, 1,000 per request", enqueue["post_batch_1000"]],
            ],
        )
        + "\n(target for enqueue_many: 60,000 jobs/s with fair vtimes)"
    )
    method = (
        f"{jobs:,} no-op jobs pre-enqueued for runworker, {jobs // 2:,} for the hand-written "
        "loops (4 tenants, fair); jobs/s = jobs / (last finish - "
        f"first start) from the jobs' timestamps; median of {runs}. Hand-written claim loops: "
        "N threads, one connection each, claim then complete, each its own commit. pgbench: "
        "one tiny UPDATE per transaction, same client counts, in the same run. Enqueue: one "
        "client, gunicorn with 2 workers, keep-alive."
    )
    return {"title": "throughput", "method": method, "report": report, "figures": figures}


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
