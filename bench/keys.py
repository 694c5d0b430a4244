"""Concurrency keys and sequences: order, and what keys cost.

- Sequences: 1,000 keys x 20 jobs (quick: 200 x 10), each key a sequence (cap 1),
  enqueued round by round (every key's first job, then every key's second, ...: the keys
  interleave as users' requests would), 1 ms jobs (bench.sleep_ms), drained by one
  `runworker --burst --concurrency 8`. Per key, from the attempt history: the jobs'
  starts in id order (strict order) and no two of its attempts overlapping
  ([started_at, finished_at], a finish at the instant of a start not counted). Jobs/s =
  jobs / (last finish - first start), against the same jobs without keys, alternated
  (keys, none), medians.
- Many keys: 100,000 no-op jobs (quick: 10,000), each with a key of its own (cap 1),
  against the same jobs without a key, alternated (none, keys), medians, one
  `runworker --burst --concurrency 8` each. Every keyed job is admitted (KEY_SETTLE) before
  it can be claimed, and gives its slot back when done: that is the cost measured.

    BENCH_DB=pgq_keysbench python scripts/with_db.py -- python -m bench.keys [--quick]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common import median, query, reset_tables, scalar, table
from bench.harness import run_burst

BATCH = 1_000
#: The report's account of how each figure is measured: the docstring's list.
METHOD = (__doc__ or "").split("\n\n")[1].strip()


def _enqueue(jobs: list[tuple[str | None, Any]], task: str) -> None:
    """``jobs``: (concurrency key or None, payload), enqueued in this order."""
    import pgqueue

    for start in range(0, len(jobs), BATCH):
        chunk = jobs[start : start + BATCH]
        keys = [k for k, _ in chunk]
        pgqueue.enqueue_many(
            task,
            [p for _, p in chunk],
            tenant="t",
            concurrency_key=keys if any(k is not None for k in keys) else None,
            key_max_running=1,
        )


def _drain(jobs: list[tuple[str | None, Any]], task: str) -> float:
    reset_tables()
    _enqueue(jobs, task)
    query("VACUUM ANALYZE pgqueue_job")
    run_burst(8)
    left = scalar("SELECT count(*) FROM pgqueue_job WHERE status <> 'done'")
    if left:
        raise SystemExit(f"{left} jobs not done after the burst")
    ((done, seconds),) = query(
        "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) "
        "FROM pgqueue_job WHERE status = 'done'"
    )
    return done / float(seconds)


def _order() -> tuple[int, int, int]:
    """(keys whose starts were not in id order, keys with overlapping attempts, attempts)."""
    rows = query(
        "SELECT j.concurrency_key, j.id, extract(epoch FROM a.started_at), "
        "extract(epoch FROM a.finished_at) FROM pgqueue_job_attempt a "
        "JOIN pgqueue_job j ON j.id = a.job_id ORDER BY j.concurrency_key, a.started_at, a.id"
    )
    by_key: dict[str, list[tuple[int, float, float]]] = {}
    for key, job_id, start, end in rows:
        by_key.setdefault(key, []).append((job_id, float(start), float(end)))
    unordered = overlapping = 0
    for spans in by_key.values():
        ids = [job_id for job_id, _, _ in spans]
        unordered += ids != sorted(ids)
        overlapping += any(spans[i + 1][1] < spans[i][2] for i in range(len(spans) - 1))
    return unordered, overlapping, len(rows)


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    keys, per_key = (200, 10) if quick else (1_000, 20)
    many = 10_000 if quick else 100_000
    pairs = 2 if quick else 3

    sequenced = [(f"user:{k}", {"ms": 1}) for _ in range(per_key) for k in range(keys)]
    plain = [(None, p) for _, p in sequenced]
    seq_rates: dict[str, list[float]] = {"keys": [], "none": []}
    checks = []
    for _ in range(pairs):
        seq_rates["keys"].append(_drain(sequenced, "bench.sleep_ms"))
        checks.append(_order())
        seq_rates["none"].append(_drain(plain, "bench.sleep_ms"))
        print(
            f"   sequences: {seq_rates['keys'][-1]:,.0f} jobs/s with keys, "
            f"{seq_rates['none'][-1]:,.0f} without; out of order {checks[-1][0]}, "
            f"overlapping {checks[-1][1]} of {keys} keys",
            flush=True,
        )
    own = [(f"k{i}", None) for i in range(many)]
    bare = [(None, None) for _ in range(many)]
    many_rates: dict[str, list[float]] = {"none": [], "keys": []}
    for _ in range(pairs):
        many_rates["none"].append(_drain(bare, "bench.noop"))
        many_rates["keys"].append(_drain(own, "bench.noop"))
        print(
            f"   {many:,} keys: {many_rates['keys'][-1]:,.0f} jobs/s with keys, "
            f"{many_rates['none'][-1]:,.0f} without",
            flush=True,
        )
    seq_ratio = median(seq_rates["keys"]) / median(seq_rates["none"])
    many_ratio = median(many_rates["keys"]) / median(many_rates["none"])
    strict = all(c[0] == 0 and c[1] == 0 for c in checks)
    rows = [
        [
            f"{keys:,} keys x {per_key} jobs (cap 1), 1 ms jobs",
            f"{median(seq_rates['keys']):,.0f}",
            f"{median(seq_rates['none']):,.0f}",
            f"{seq_ratio:.2f}",
        ],
        [
            f"{many:,} keys x 1 job (cap 1), no-op jobs",
            f"{median(many_rates['keys']):,.0f}",
            f"{median(many_rates['none']):,.0f}",
            f"{many_ratio:.2f}",
        ],
    ]
    report = table(["workload", "jobs/s with keys", "without keys", "ratio"], rows)
    report += (
        f"\nper-key order strict in every sequence run (starts in id order, no overlap): "
        f"{'yes' if strict else 'NO'} ({', '.join(f'{c[2]:,} attempts' for c in checks)})"
        f"\n{pairs} alternated pairs per line, medians; one runworker --burst --concurrency 8."
    )
    return {
        "title": "Concurrency keys and sequences",
        "method": METHOD,
        "report": report,
        "figures": {
            "sequence_jobs_per_s": seq_rates,
            "sequence_ratio": round(seq_ratio, 3),
            "sequence_strict": strict,
            "many_keys_jobs_per_s": many_rates,
            "many_keys_ratio": round(many_ratio, 3),
        },
    }


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
