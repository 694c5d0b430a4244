"""Verified results: CPU-bound jobs whose every result is recomputed and compared.

600 jobs (quick: 90), a third each of is_prime (n random in 10^6..10^12), collatz (n
random in 1..10^7) and sha256_chain (a random seed, 1,000..5,000 rounds), the demo
project's tasks. One worker, `runworker --processes 2 --concurrency 2`, is started and
up before the jobs are enqueued (in one transaction, one enqueue_many per task, one
tenant per task). When all are finished, the benchmark recomputes every result with the
pure functions of demo_project/tasks.py and compares it with the stored one; primality is
also checked with a deterministic Miller-Rabin test, an algorithm the task does not use.

    python scripts/with_db.py -- python -m bench.verified [--quick]
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import percentile, query, reset_tables, table
from bench.harness import registered_pids, start_worker, stop_workers, wait_for

TASKS = ("is_prime", "collatz", "sha256_chain")


def payloads(task: str, count: int, rng: random.Random) -> list[dict[str, Any]]:
    if task == "is_prime":
        return [{"n": rng.randint(10**6, 10**12)} for _ in range(count)]
    if task == "collatz":
        return [{"n": rng.randint(1, 10**7)} for _ in range(count)]
    return [
        {"seed": f"{rng.getrandbits(64):016x}", "rounds": rng.randint(1000, 5000)}
        for _ in range(count)
    ]


def expected(task: str, payload: dict[str, Any]) -> Any:
    from demo_project.tasks import collatz_value, is_prime_value, sha256_chain_value

    if task == "is_prime":
        return is_prime_value(payload["n"])
    if task == "collatz":
        return collatz_value(payload["n"])
    return sha256_chain_value(payload["seed"], payload["rounds"])


def miller_rabin(n: int) -> bool:
    """Deterministic for n < 3.3 * 10^24 with these bases."""
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    for p in bases:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = pow(x, 2, n)
            if x == n - 1:
                break
        else:
            return False
    return True


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    from django.db import transaction

    import pgqueue

    per_task = 30 if quick else 200
    total = per_task * len(TASKS)
    reset_tables()
    rng = random.Random(6)
    with tempfile.TemporaryDirectory(prefix="pgqueue-verified-") as tmp:
        worker = start_worker(["--processes", "2", "--concurrency", "2"], Path(tmp))
        try:
            wait_for(lambda: len(registered_pids()) >= 2, 60, "2 worker processes to start")
            with transaction.atomic():
                for task in TASKS:
                    pgqueue.enqueue_many(task, payloads(task, per_task, rng), tenant=task)
            wait_for(
                lambda: (
                    query("SELECT count(*) FROM pgqueue_job WHERE status IN ('done', 'dead')")[0][0]
                    >= total
                ),
                120 if quick else 300,
                f"{total} jobs to finish",
            )
        except TimeoutError as exc:
            raise RuntimeError(f"{exc}\nworker log:\n{worker.log_tail()}") from exc
        finally:
            stop_workers([worker], 15.0)

    rows = query(
        "SELECT task, payload::text, status, result::text, "
        "extract(epoch FROM finished_at - created_at), extract(epoch FROM finished_at), "
        "extract(epoch FROM created_at) FROM pgqueue_job"
    )
    t0 = time.perf_counter()
    per: dict[str, dict[str, Any]] = {t: {"correct": 0, "incorrect": 0, "lat": []} for t in TASKS}
    primes = mr_disagree = 0
    for task, payload_text, status, result_text, latency, _, _ in rows:
        payload = json.loads(payload_text)
        result = json.loads(result_text) if result_text is not None else None
        ok = status == "done" and result == expected(task, payload)
        if task == "is_prime" and result is not None:
            primes += bool(result.get("is_prime"))
            mr_disagree += result.get("is_prime") != miller_rabin(payload["n"])
            ok = ok and result.get("is_prime") == miller_rabin(payload["n"])
        per[task]["correct" if ok else "incorrect"] += 1
        if latency is not None:
            per[task]["lat"].append(float(latency) * 1000)
    recompute_s = time.perf_counter() - t0
    first_created = min(float(r[6]) for r in rows)
    last_finished = max(float(r[5]) for r in rows if r[5] is not None)
    throughput = total / (last_finished - first_created)

    figures: dict[str, Any] = {
        "jobs": total,
        "throughput_jobs_per_s": round(throughput, 1),
        "seconds_first_created_to_last_finished": round(last_finished - first_created, 2),
        "primes_among_is_prime": primes,
        "miller_rabin_disagreements": mr_disagree,
        "recompute_seconds": round(recompute_s, 2),
        "tasks": {},
    }
    table_rows = []
    everything: list[float] = []
    for task in [*TASKS, "all"]:
        if task == "all":
            lat = everything
            correct = sum(per[t]["correct"] for t in TASKS)
            incorrect = sum(per[t]["incorrect"] for t in TASKS)
        else:
            lat = per[task]["lat"]
            everything.extend(lat)
            correct, incorrect = per[task]["correct"], per[task]["incorrect"]
        stats = {q: percentile(lat, q) for q in (50, 95, 99)}
        figures["tasks"][task] = {
            "correct": correct,
            "incorrect": incorrect,
            "latency_ms": {**{f"p{q}": round(v, 1) for q, v in stats.items()}, "max": max(lat)},
        }
        table_rows.append(
            [
                task,
                f"{correct}/{correct + incorrect}",
                incorrect,
                f"{stats[50]:.0f}",
                f"{stats[95]:.0f}",
                f"{stats[99]:.0f}",
                f"{max(lat):.0f}",
            ]
        )
    report = table(
        ["task", "correct", "incorrect", "p50 ms", "p95 ms", "p99 ms", "max ms"], table_rows
    )
    report += (
        f"\nthroughput: {throughput:,.0f} jobs/s ({total} jobs in "
        f"{last_finished - first_created:.2f} s, first created to last finished); "
        f"{primes} of the is_prime inputs were prime, Miller-Rabin disagreed on "
        f"{mr_disagree}; recomputing every result here took {recompute_s:.2f} s."
    )
    method = (
        f"{total} jobs, {per_task} each of is_prime (n in 10^6..10^12), collatz (n in "
        "1..10^7) and sha256_chain (1,000..5,000 rounds), random inputs, enqueued in one "
        "transaction (one enqueue_many and one tenant per task) to a worker already up: "
        "`runworker --processes 2 --concurrency 2`. Every stored result is recomputed in the "
        "benchmark process with demo_project.tasks' pure functions and compared (and "
        "primality checked again with Miller-Rabin). Latency = finished_at - created_at, "
        "database clock; throughput = jobs / (last finished - first created)."
    )
    return {"title": "Verified results", "method": method, "report": report, "figures": figures}


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
