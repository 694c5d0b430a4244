"""Crash safety: workers SIGKILLed every second, and every connection dropped mid-run.

1,000 jobs (quick: 200) of ``bench.chaos``, which sleeps 20-50 ms and then inserts a row
into ``bench_execution`` (its side effect). Four ``runworker --concurrency 2`` processes
run them, with a 2 s lease, maintenance every 0.2 s and a 0.05 s backoff base so that
recovery is quick. Every second one worker that is up (registered) is killed with SIGKILL
and a new one started in its place, until every job is done (bounded). The second run
does the same and, once half the jobs are done, terminates every client connection to
the benchmark database (pg_terminate_backend): workers, listeners and handlers alike.

    python scripts/with_db.py -- python -m bench.chaos [--quick]
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import query, reset_tables, table
from bench.harness import registered_pids, start_worker, stop_workers, wait_for

#: Worker settings of both runs: recovery in seconds rather than the defaults' minute.
CHAOS_SETTINGS = {"LEASE_SECONDS": 2, "MAINTENANCE_SECONDS": 0.2, "BACKOFF_BASE": 0.05}
WORKERS = 4
KILL_EVERY = 1.0  # seconds
POLL = 0.05  # seconds between two looks at the database while killing and replacing
STOP = 15.0  # bound on the workers left at the end finishing their jobs in hand


def one_run(jobs: int, drop_connections: bool, log_dir: Path, bound: float) -> dict[str, Any]:
    import pgqueue

    reset_tables()
    query(
        "CREATE TABLE IF NOT EXISTS bench_execution "
        "(job_id bigint NOT NULL, attempt int NOT NULL, at timestamptz NOT NULL)"
    )
    query("TRUNCATE bench_execution")
    rng = random.Random(5)
    workers = [
        start_worker(["--concurrency", "2"], log_dir, **CHAOS_SETTINGS) for _ in range(WORKERS)
    ]
    kills: list[dict[str, Any]] = []
    dropped: dict[str, Any] | None = None
    try:
        wait_for(lambda: len(registered_pids()) >= WORKERS, 60, f"{WORKERS} workers to start")
        pgqueue.enqueue_many(
            "bench.chaos", [{"ms": rng.randint(20, 50)} for _ in range(jobs)], tenant="chaos"
        )
        started = time.monotonic()
        next_kill = started + KILL_EVERY
        while True:
            done = query("SELECT count(*) FROM pgqueue_job WHERE status = 'done'")[0][0]
            if done >= jobs:
                break
            now = time.monotonic()
            if now - started > bound:
                break  # reported below as jobs not done
            if drop_connections and dropped is None and done >= jobs // 2:
                (at,) = query("SELECT clock_timestamp()")[0]
                rows = query(
                    "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend'"
                )
                dropped = {
                    "at_s": round(now - started, 2),
                    "at": at,
                    "done": done,
                    "backends": sum(1 for _, ok in rows if ok),
                }
            if now >= next_kill:
                next_kill = max(next_kill + KILL_EVERY, now + KILL_EVERY / 2)
                up = registered_pids()
                victims = [w for w in workers if w.alive() and w.pid in up]
                if victims:
                    victim = rng.choice(victims)
                    in_hand = query(
                        "SELECT count(*) FROM pgqueue_job j JOIN pgqueue_worker w "
                        "ON j.lease_owner = w.id WHERE j.status = 'running' AND w.pid = %s",
                        [victim.pid],
                    )[0][0]
                    victim.kill()
                    kills.append({"at_s": round(now - started, 2), "jobs_in_hand": in_hand})
                    workers.remove(victim)
                    workers.append(start_worker(["--concurrency", "2"], log_dir, **CHAOS_SETTINGS))
            time.sleep(POLL)
        elapsed = time.monotonic() - started
    except TimeoutError as exc:
        raise RuntimeError(f"{exc}\nlog of a worker:\n{workers[0].log_tail()}") from exc
    finally:
        stop_workers(workers, STOP)
    if dropped is not None:
        # How long until the workers, reconnected, recorded a job again.
        (gap,) = query(
            "SELECT extract(epoch FROM min(finished_at) - %s) FROM pgqueue_job "
            "WHERE finished_at > %s",
            [dropped["at"], dropped["at"]],
        )[0]
        dropped["first_done_after_ms"] = round(float(gap) * 1000, 1) if gap is not None else None
        dropped["at"] = dropped["at"].isoformat()
    return {**measure(jobs), "seconds": round(elapsed, 1), "kills": kills, "dropped": dropped}


def measure(jobs: int) -> dict[str, Any]:
    """What happened to every job, from the jobs table and the executions the task wrote."""
    by_status = dict(query("SELECT status, count(*) FROM pgqueue_job GROUP BY status"))
    (row,) = query(
        """
        WITH ex AS (SELECT job_id, count(*) AS n FROM bench_execution GROUP BY job_id)
        SELECT count(*) FILTER (WHERE j.status = 'done'),
               count(*) FILTER (WHERE ex.n > 1),
               coalesce(max(ex.n), 0),
               count(*) FILTER (WHERE j.attempts > 1),
               count(*) FILTER (WHERE j.status = 'done' AND NOT EXISTS (
                   SELECT 1 FROM bench_execution b
                    WHERE b.job_id = j.id AND b.attempt = j.attempts)),
               extract(epoch FROM max(j.finished_at) - min(j.created_at))
          FROM pgqueue_job j LEFT JOIN ex ON ex.job_id = j.id
        """
    )
    done, more_than_once, max_runs, rerun, unbacked, seconds = row
    outcomes = dict(query("SELECT outcome, count(*) FROM pgqueue_job_attempt GROUP BY outcome"))
    return {
        "jobs": jobs,
        "done": done,
        "lost": jobs - done,
        "by_status": by_status,
        "ran_more_than_once": more_than_once,
        "most_executions_of_a_job": max_runs,
        "executions": query("SELECT count(*) FROM bench_execution")[0][0],
        "rerun_attempts_gt_1": rerun,
        "done_without_execution_of_its_attempt": unbacked,
        "attempt_outcomes": outcomes,
        "drain_seconds": round(float(seconds or 0), 2),
    }


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    jobs = 200 if quick else 1000
    bound = 60.0 if quick else 120.0
    with tempfile.TemporaryDirectory(prefix="pgqueue-chaos-") as tmp:
        runs = {
            "kills": one_run(jobs, False, Path(tmp), bound),
            "kills_and_dropped_connections": one_run(jobs, True, Path(tmp), bound),
        }
    rows = []
    for label, r in (
        ("SIGKILL every 1 s", runs["kills"]),
        ("... + connections dropped", runs["kills_and_dropped_connections"]),
    ):
        rows.append(
            [
                label,
                len(r["kills"]),
                sum(k["jobs_in_hand"] for k in r["kills"]),
                f"{r['done']:,}/{r['jobs']:,}",
                r["lost"],
                r["rerun_attempts_gt_1"],
                r["ran_more_than_once"],
                r["attempt_outcomes"].get("failed", 0),
                f"{r['drain_seconds']:.1f} s",
            ]
        )
    report = table(
        [
            "run",
            "kills",
            "jobs in hand at kills",
            "done",
            "lost",
            "re-run",
            "ran > once",
            "failed attempts",
            "drain",
        ],
        rows,
    )
    d = runs["kills_and_dropped_connections"]["dropped"]
    if d:
        report += (
            f"\nconnections dropped at {d['at_s']:.1f} s ({d['done']:,} jobs done): "
            f"{d['backends']} backends terminated; the first job recorded done after "
            f"that, {d['first_done_after_ms']} ms later"
        )
    unbacked = sum(r["done_without_execution_of_its_attempt"] for r in runs.values())
    report += (
        "\nre-run: jobs with more than one attempt; ran > once: jobs with more than one row "
        "in bench_execution (the side effect happened twice: the worker died between the "
        f"handler's commit and its own). Done jobs without an execution of the attempt "
        f"recorded as done: {unbacked}."
    )
    method = (
        f"{jobs:,} jobs that sleep 20-50 ms and then insert a row into bench_execution; "
        f"{WORKERS} `runworker --concurrency 2` processes (lease 2 s, maintenance every "
        "0.2 s, backoff base 0.05 s); every second one worker that is up is SIGKILLed and "
        "replaced, until every job is done (bounded). The second run also has every "
        "connection dropped once half the jobs are done: pg_terminate_backend of every "
        "client backend of the benchmark database but the benchmark's own (workers' loops, "
        "listeners, handlers). That stands in for a PostgreSQL restart: DATABASE_URL's "
        "server cannot be restarted from here (it is shared, not the benchmark's own); a "
        "restart would add the server's crash recovery, which is PostgreSQL's, to the same "
        "dropped connections. Lost = jobs not done when the run ends."
    )
    return {"title": "Crash safety", "method": method, "report": report, "figures": runs}


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
