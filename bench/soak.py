"""Soak: a steady 1,000 jobs/s for 10 minutes with a 60 s retention; the tables must plateau.

Two parts, one report:

1. Prune throughput (the storage-layout question). 100,000 done jobs with one attempt each
   are written straight into the tables, finished an hour ago and folded; then they are
   pruned by JOB_PRUNE_FINISHED in batches of PRUNE_BATCH_SIZE (1,000), each batch its own
   transaction, as maintenance does. Reported: jobs/s (with their attempts) and each
   batch's time. Meanwhile a probe claims a job of its own queue every 20 ms
   (enqueue, then time JOB_CLAIM and its commit on its own connection); its p99 while
   pruning is compared with the same probe for the same time before the prune. Then 50
   maintenance passes with pruning off are timed (the advisory-locked transaction).
2. The soak. One `runworker --processes 3 --concurrency 6` with
   RETENTION {"done": 60, "cancelled": 60, "dead": 60} (through PGQUEUE_RETENTION), an
   enqueuer adding RATE/10 no-op jobs every 100 ms (enqueue_many, paced on a fixed clock),
   and the same probe. Every SAMPLE seconds: pg_total_relation_size and row counts of
   pgqueue_job and pgqueue_job_attempt. Plateau: the largest value over the last third of
   the run is at most 1.25x the largest over the middle third, for the finished jobs and
   attempt rows (what retention bounds), the attempt table's size, and both tables' size
   (which also holds the backlog, if the worker falls behind RATE). Claim p99: the
   probe in the first RETENTION seconds (nothing is old enough to prune) against the
   probe once pruning runs every pass. Lost jobs: after the run, every attempt is folded;
   every enqueued job (the soak's and the probe's) must be counted done in
   pgqueue_task_stat (a job is counted once, by its one successful attempt, whether its
   row is still there or pruned) and no job may be left in another status. A server
   running with autovacuum off gets a stand-in: at each sample, a table past the trigger
   its reloptions set (the formula autovacuum uses) is VACUUMed by the soak.

--quick: 10,000 jobs for part 1, and 30 s at 200 jobs/s with a 5 s retention.

    python scripts/with_db.py -- python -m bench.soak [--quick]
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import (
    fold_everything,
    ms,
    percentile,
    query,
    reset_tables,
    scalar,
    standalone,
    table,
)
from bench.harness import running_worker

PROBE_EVERY = 0.02  # seconds between two probe claims
DRAIN = 300  # bound, in seconds, on running the backlog left at the end
PROCESSES, CONCURRENCY = 3, 6  # the soak's runworker


class Probe(threading.Thread):
    """Enqueue one job in queue "probe" and time its claim (statement + commit), in a loop."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []  # (monotonic time, claim seconds)
        self.enqueued = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        import psycopg

        from pgqueue import store

        try:
            with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
                cur = conn.cursor()
                while not self.stop.is_set():
                    store.enqueue(
                        cur,
                        task="bench.noop",
                        tenant="probe",
                        queue="probe",
                        priority=0,
                        max_attempts=1,
                        payloads_json="[null]",
                        count=1,
                    )
                    self.enqueued += 1
                    t0 = time.perf_counter()
                    jobs = store.claim(cur, worker="probe", queues=["probe"], limit=1)
                    elapsed = time.perf_counter() - t0
                    self.samples.append((time.monotonic(), elapsed))
                    store.complete_many(
                        cur, worker="probe", results=[(j.id, j.attempt, None) for j in jobs]
                    )
                    self.stop.wait(PROBE_EVERY)
        except BaseException as exc:  # reported by the caller
            self.error = exc

    def p99(self, start: float, end: float) -> float:
        return percentile([s for t, s in self.samples if start <= t < end], 99)

    def count(self, start: float, end: float) -> int:
        return sum(1 for t, _ in self.samples if start <= t < end)

    def finish(self) -> None:
        self.stop.set()
        self.join(30)
        if self.error is not None:
            raise self.error


class Enqueuer(threading.Thread):
    """``rate`` no-op jobs per second, a tenth of them every 100 ms on a fixed schedule."""

    def __init__(self, rate: int) -> None:
        super().__init__(daemon=True)
        self.rate = rate
        self.enqueued = 0
        self.behind = 0.0  # the most the schedule slipped, in seconds
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connections

        import pgqueue

        per_tick = max(1, self.rate // 10)
        tenants = [f"tenant{i}" for i in range(4)]
        try:
            start = time.monotonic()
            tick = 0
            while not self.stop.is_set():
                ids = pgqueue.enqueue_many(
                    "bench.noop", [None] * per_tick, tenant=tenants[tick % len(tenants)]
                )
                self.enqueued += len(ids)
                tick += 1
                delay = start + tick * 0.1 - time.monotonic()
                self.behind = max(self.behind, -delay)
                if delay > 0:
                    self.stop.wait(delay)
        except BaseException as exc:  # reported by the caller
            self.error = exc
        finally:
            connections.close_all()

    def finish(self) -> None:
        self.stop.set()
        self.join(30)
        if self.error is not None:
            raise self.error


def _fill_finished(n: int) -> None:
    """``n`` done jobs with one attempt each, finished an hour ago, already folded."""
    query(
        """
        WITH jobs AS (
            INSERT INTO pgqueue_job (queue, tenant, task, payload, status, priority, vtime,
                                     attempts, max_attempts, run_at, created_at, started_at,
                                     finished_at)
            SELECT 'default', 'tenant' || (g %% 4), 'bench.noop', 'null', 'done', 0, g,
                   1, 5, now() - interval '1 hour', now() - interval '1 hour',
                   now() - interval '1 hour', now() - interval '1 hour' + g * interval '1 ms'
              FROM generate_series(1, %s) g
            RETURNING id, started_at, finished_at
        )
        INSERT INTO pgqueue_job_attempt (job_id, attempt, worker, started_at, finished_at,
                                         outcome)
        SELECT id, 1, 'bench', started_at, finished_at, 'done' FROM jobs
        """,
        [n],
    )
    query(
        "INSERT INTO pgqueue_stat_mark (id, last_attempt_id) "
        "SELECT 1, max(id) FROM pgqueue_job_attempt "
        "ON CONFLICT (id) DO UPDATE SET last_attempt_id = EXCLUDED.last_attempt_id"
    )
    query("VACUUM ANALYZE pgqueue_job")
    query("VACUUM ANALYZE pgqueue_job_attempt")


def prune_throughput(quick: bool) -> dict[str, Any]:
    import psycopg

    from pgqueue import prune_store
    from pgqueue.conf import pgqueue_settings

    n = 10_000 if quick else 100_000
    reset_tables()
    _fill_finished(n)
    limit = int(pgqueue_settings.PRUNE_BATCH_SIZE)
    probe = Probe()
    probe.start()
    time.sleep(5 if quick else 10)  # the probe's baseline, with nothing else running
    idle_start, prune_start = probe.samples[0][0], time.monotonic()
    batches: list[float] = []
    jobs = attempts = 0
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        while True:
            t0 = time.perf_counter()
            with conn.transaction(), conn.cursor() as cur:
                got = prune_store.prune_finished(cur, status="done", keep_seconds=60, limit=limit)
            batches.append(time.perf_counter() - t0)
            jobs, attempts = jobs + got.jobs, attempts + got.attempts
            if got.jobs < limit:
                break
    prune_end = time.monotonic()
    probe.finish()
    passes = _maintenance_passes()
    seconds = prune_end - prune_start
    return {
        "jobs": jobs,
        "attempts": attempts,
        "seconds": seconds,
        "jobs_per_s": jobs / seconds,
        "batch_p50_s": percentile(batches, 50),
        "batch_p99_s": percentile(batches, 99),
        "batch_max_s": max(batches),
        "claim_p99_idle_s": probe.p99(idle_start, prune_start),
        "claim_p99_pruning_s": probe.p99(prune_start, prune_end),
        "claims_pruning": probe.count(prune_start, prune_end),
        "maintenance_pass_p50_s": percentile(passes, 50),
        "maintenance_pass_p99_s": percentile(passes, 99),
    }


def _maintenance_passes(n: int = 50) -> list[float]:
    """Seconds of maintenance's advisory-locked transaction with pruning turned off, for
    comparison with one prune batch: what pruning inside it would add."""
    import psycopg
    from django.test import override_settings

    from pgqueue.worker.maintenance import run_maintenance

    off = {"RETENTION": dict.fromkeys(("done", "cancelled", "dead"))}
    times = []
    with (
        override_settings(PGQUEUE=off),
        psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn,
    ):
        for _ in range(n):
            t0 = time.perf_counter()
            run_maintenance(conn)
            times.append(time.perf_counter() - t0)
    return times


def _sample(t0: float) -> dict[str, Any]:
    row = query(
        "SELECT pg_total_relation_size('pgqueue_job'),"
        " pg_total_relation_size('pgqueue_job_attempt'),"
        " (SELECT count(*) FROM pgqueue_job), (SELECT count(*) FROM pgqueue_job_attempt),"
        " (SELECT count(*) FROM pgqueue_job WHERE status IN ('queued', 'running'))"
    )[0]
    return {
        "t": time.monotonic() - t0,
        "job_bytes": row[0],
        "attempt_bytes": row[1],
        "job_rows": row[2],
        "attempt_rows": row[3],
        "backlog": row[4],
    }


#: When the server runs with autovacuum off (as a shared test server may), what its launcher
#: would do: VACUUM a table whose dead rows, or rows inserted since its last vacuum, pass
#: the trigger its own reloptions (migration 0005) set. Same formula as autovacuum's.
STAND_IN = """
SELECT c.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
 WHERE c.relname IN ('pgqueue_job', 'pgqueue_job_attempt')
   AND (s.n_dead_tup > current_setting('autovacuum_vacuum_threshold')::float8
            + COALESCE((SELECT split_part(o, '=', 2)::float8 FROM unnest(c.reloptions) o
                         WHERE o LIKE 'autovacuum_vacuum_scale_factor=%%'),
                       current_setting('autovacuum_vacuum_scale_factor')::float8)
              * GREATEST(c.reltuples, 0)
     OR s.n_ins_since_vacuum > current_setting('autovacuum_vacuum_insert_threshold')::float8
            + COALESCE((SELECT split_part(o, '=', 2)::float8 FROM unnest(c.reloptions) o
                         WHERE o LIKE 'autovacuum_vacuum_insert_scale_factor=%%'),
                       current_setting('autovacuum_vacuum_insert_scale_factor')::float8)
              * GREATEST(c.reltuples, 0))
"""


def _stand_in_for_autovacuum(vacuums: list[tuple[str, float]]) -> None:
    for (name,) in query(STAND_IN):
        t0 = time.perf_counter()
        query(f"VACUUM {name}")
        vacuums.append((name, time.perf_counter() - t0))


def soak(quick: bool) -> dict[str, Any]:

    rate, duration, retention, every = (200, 30, 5, 2) if quick else (1000, 600, 60, 10)
    reset_tables()
    settings = {"RETENTION": json.dumps(dict.fromkeys(("done", "cancelled", "dead"), retention))}
    samples: list[dict[str, Any]] = []
    autovacuum = scalar("SHOW autovacuum") == "on"
    vacuums: list[tuple[str, float]] = []
    with running_worker(CONCURRENCY, processes=PROCESSES, **settings):
        probe, enqueuer = Probe(), Enqueuer(rate)
        t0 = time.monotonic()
        probe.start()
        enqueuer.start()
        while time.monotonic() - t0 < duration:
            samples.append(_sample(t0))
            if len(samples) % (60 // every) == 1:  # progress, once a minute
                print(f"   {json.dumps(samples[-1])}", flush=True)
            if not autovacuum:
                _stand_in_for_autovacuum(vacuums)
            time.sleep(max(0.0, every * len(samples) - (time.monotonic() - t0)))
        enqueuer.finish()
        probe.finish()
        end = time.monotonic()
        samples.append(_sample(t0))
        # A machine too busy to run RATE jobs/s leaves a backlog: it is run before counting.
        drain_deadline = time.monotonic() + DRAIN
        while scalar("SELECT count(*) FROM pgqueue_job WHERE status IN ('queued', 'running')"):
            if time.monotonic() > drain_deadline:
                break  # reported as left unfinished: figures of a slow run still count
            if not autovacuum:
                _stand_in_for_autovacuum(vacuums)
            time.sleep(1)
        drained = time.monotonic()
    from django.db import connection

    with connection.cursor() as cur:
        fold_everything(cur)
    enqueued = enqueuer.enqueued + probe.enqueued
    done = scalar("SELECT COALESCE(sum(count), 0) FROM pgqueue_task_stat WHERE outcome = 'done'")
    not_done = scalar("SELECT count(*) FROM pgqueue_job WHERE status <> 'done'")
    unfinished = scalar(
        "SELECT count(*) FROM pgqueue_job WHERE status IN ('scheduled', 'queued', 'running')"
    )
    rows_left = scalar("SELECT count(*) FROM pgqueue_job")
    # Pruning starts once the first jobs are RETENTION seconds old (and folded: a pass or two).
    first_prune = t0 + retention + 2
    third = duration / 3

    def growth(value: Any) -> float:
        values = [(s["t"], value(s)) for s in samples]
        middle = max(v for t, v in values if third <= t < 2 * third)
        return max(v for t, v in values if t >= 2 * third) / middle

    return {
        "rate": rate,
        "duration_s": duration,
        "retention_s": retention,
        "samples": samples,
        "enqueued": enqueued,
        "enqueuer_max_behind_s": enqueuer.behind,
        "backlog_at_end": samples[-1]["backlog"],
        "drain_s": drained - end,
        "worker_jobs_per_s": (enqueuer.enqueued - unfinished) / (drained - t0),
        "done_counted": int(done),
        "not_done_left": not_done,
        "pruned": enqueued - rows_left,
        "unfinished_left": unfinished,
        # Neither counted done nor still waiting to run: gone without having run, or run
        # and its attempt missed by the metrics fold (then pruned): the same figure.
        "lost": enqueued - int(done) - unfinished,
        "missed": enqueued - int(done) - unfinished,
        "plateau_ratio": growth(lambda s: s["job_bytes"] + s["attempt_bytes"]),
        # What retention bounds: finished jobs (the rows less the backlog) and the history.
        "plateau_ratio_rows": growth(lambda s: s["job_rows"] - s["backlog"] + s["attempt_rows"]),
        "plateau_ratio_attempt_bytes": growth(lambda s: s["attempt_bytes"]),
        "claim_p99_before_pruning_s": probe.p99(t0, t0 + retention),
        "claim_p99_pruning_s": probe.p99(first_prune, end),
        "claims_before": probe.count(t0, t0 + retention),
        "claims_pruning": probe.count(first_prune, end),
        "autovacuum": autovacuum,
        "stand_in_vacuums": vacuums,
    }


def _chart(samples: list[dict[str, Any]], retention: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s["t"] / 60 for s in samples]
    fig, (size_ax, rows_ax) = plt.subplots(2, 1, figsize=(8, 6), dpi=120, sharex=True)
    for key, label, colour in (
        ("job", "pgqueue_job", "tab:blue"),
        ("attempt", "pgqueue_job_attempt", "tab:orange"),
    ):
        size_ax.plot(minutes, [s[f"{key}_bytes"] / 2**20 for s in samples], label=label, c=colour)
        rows_ax.plot(minutes, [s[f"{key}_rows"] for s in samples], label=label, c=colour)
    rows_ax.plot(
        minutes, [s["backlog"] for s in samples], label="of which queued or running", c="grey"
    )
    size_ax.set_ylabel("total relation size (MiB)")
    rows_ax.set_ylabel("rows")
    rows_ax.set_xlabel("minutes")
    size_ax.set_title(f"Soak: table sizes with a {retention} s retention")
    for ax in (size_ax, rows_ax):
        ax.axvline(retention / 60, c="grey", ls=":", lw=1)
        ax.set_ylim(bottom=0)
        ax.legend(loc="lower right")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    part1 = prune_throughput(quick)
    print(f"   prune: {json.dumps(part1)}", flush=True)
    part2 = soak(quick)
    out_dir.mkdir(exist_ok=True)
    chart = out_dir / ("soak-quick.png" if quick else "soak.png")
    _chart(part2["samples"], part2["retention_s"], chart)
    minute = 5 if quick else 60

    def verdict(ratio: float) -> str:
        return "plateau" if ratio <= 1.25 else "GROWING"

    # Space freed by a prune is reused once autovacuum has passed (autovacuum_naptime is
    # 1 minute by default): a 30 s run shows the rows plateau, not yet the size.
    size_note = " (too short for autovacuum to have run)" if quick and part2["autovacuum"] else ""
    rows = [
        [
            f"{s['t'] / 60:.1f}",
            f"{s['job_bytes'] / 2**20:.1f}",
            f"{s['job_rows']:,}",
            f"{s['attempt_bytes'] / 2**20:.1f}",
            f"{s['attempt_rows']:,}",
            f"{s['backlog']:,}",
        ]
        for i, s in enumerate(part2["samples"])
        if round(s["t"]) % minute < 1 or i == len(part2["samples"]) - 1
    ]
    report = (
        f"Prune throughput: {part1['jobs']:,} done jobs and {part1['attempts']:,} attempts "
        f"in {part1['seconds']:.2f} s = {part1['jobs_per_s']:,.0f} jobs/s; a batch of "
        f"1,000: p50 {ms(part1['batch_p50_s'])}, p99 {ms(part1['batch_p99_s'])}, max "
        f"{ms(part1['batch_max_s'])}. Probe claim p99: idle {ms(part1['claim_p99_idle_s'])}, "
        f"while pruning {ms(part1['claim_p99_pruning_s'])} "
        f"({part1['claims_pruning']} claims). A maintenance pass without pruning (its "
        f"advisory-locked transaction): p50 {ms(part1['maintenance_pass_p50_s'])}, p99 "
        f"{ms(part1['maintenance_pass_p99_s'])}.\n\n"
        f"Soak: {part2['rate']:,} jobs/s for {part2['duration_s']} s, retention "
        f"{part2['retention_s']} s (enqueuer at most {part2['enqueuer_max_behind_s']:.2f} s "
        f"behind its schedule); backlog at the end {part2['backlog_at_end']:,}, run in "
        f"{part2['drain_s']:.0f} s more (the worker's rate over the whole run: "
        f"{part2['worker_jobs_per_s']:,.0f} jobs/s)\n"
        + table(["minute", "job MiB", "job rows", "attempt MiB", "attempt rows", "backlog"], rows)
        + "\nplateau (largest over the last third / over the middle third): finished jobs "
        f"+ attempt rows {part2['plateau_ratio_rows']:.2f} "
        f"({verdict(part2['plateau_ratio_rows'])}), attempt table size "
        f"{part2['plateau_ratio_attempt_bytes']:.2f} "
        f"({verdict(part2['plateau_ratio_attempt_bytes'])}), both tables' size (with the "
        f"backlog) {part2['plateau_ratio']:.2f} ({verdict(part2['plateau_ratio'])})"
        f"{size_note}"
        f"\nprobe claim p99: before pruning {ms(part2['claim_p99_before_pruning_s'])} "
        f"({part2['claims_before']} claims), while pruning "
        f"{ms(part2['claim_p99_pruning_s'])} ({part2['claims_pruning']} claims), ratio "
        f"{part2['claim_p99_pruning_s'] / part2['claim_p99_before_pruning_s']:.2f}"
        + (
            ""
            if part2["autovacuum"]
            else f"\nautovacuum is off on this server: the soak stood in for it, "
            f"{len(part2['stand_in_vacuums'])} VACUUMs (p50 "
            f"{ms(percentile([v for _, v in part2['stand_in_vacuums']], 50))}, max "
            f"{ms(max([v for _, v in part2['stand_in_vacuums']], default=float('nan')))})"
        )
        + f"\njobs: {part2['enqueued']:,} enqueued, {part2['done_counted']:,} counted done, "
        f"{part2['pruned']:,} pruned, {part2['unfinished_left']:,} not run yet "
        f"(the drain's {DRAIN} s bound), "
        f"{part2['not_done_left'] - part2['unfinished_left']} dead or cancelled, "
        f"lost {part2['lost']} (missed by the metrics fold: {part2['missed']})"
    )
    return {
        "title": "Soak with retention",
        "method": __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0],
        "report": report,
        "figures": {"prune": part1, "soak": part2},
        "charts": [str(chart)],
    }


if __name__ == "__main__":
    standalone(run, __doc__)
