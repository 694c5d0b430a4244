"""Workflows: what waiting for other jobs costs, measured on real workers.

Every figure comes from the rows (PostgreSQL's clock), run by `manage.py runworker
--processes 2 --concurrency 4` (total concurrency 8, as bench/throughput.py's 2-process
line), no-op jobs (bench.noop). A settled job's run_at is the settling transaction's now()
(JOB_SETTLE_WAITING sets it to GREATEST(run_at, now())): the moment its wait ended.

- Fan-in: a workflow of a root, N parallel steps after it and a callback after all N
  (N = 1,000, the default MAX_DEPENDENCIES; and 10,000, with MAX_DEPENDENCIES and
  MAX_WORKFLOW_JOBS raised in the enqueuing process; quick: 1,000 only), enqueued into a
  running worker, several repetitions each, medians and max. The callback's latency: from
  its last dependency's finished_at (the handler's end) to its run_at (settled and
  promoted), claimed_at and started_at. The fan-out: from the root's finished_at to the N
  steps' run_at (one settle) and to the first of them claimed.
- Chain: 1,000 steps (quick: 100), each waiting for the one before. Per-step hand-off gap
  = a step's started_at - its predecessor's finished_at (median, p95), split at run_at and
  claimed_at; chain wall time / steps. Against, on the same workers, 1,000 independent
  jobs enqueued at once (wall time / jobs), and the same jobs on one thread (runworker
  --concurrency 1): a chain is sequential by nature, so the fair comparison is the
  hand-off gap against a job's time in a sequential worker.
- Workflows against plain jobs: 1,000 workflows of 10 jobs (quick: 100), each a root, 8
  parallel steps and a callback after them (16 edges), against 10,000 plain jobs (quick:
  1,000) enqueued in calls of 10 (enqueue_many), both of 4 tenants in turn. Each enqueued
  before the workers start; jobs/s = jobs / (last finish - first start); enqueue jobs/s
  timed in this process (the workflow's includes the settle of its root after the
  commit). Alternated (plain, workflows), 4 pairs (quick: 2), medians; with 2 processes
  x 4 threads, then 1 process x 8 threads (one process: no two settles at once).
  "Stalled with work": the time within the drain, in stretches of over 100 ms, when no
  job was in any worker's hands (claimed, not finished) while a job whose wait was over
  (run_at past) was unclaimed. "Left unpromoted": jobs seen 'scheduled' by a look every
  50 ms during the drain; a settle promotes what it makes runnable in its own
  transaction, so these are jobs whose promotion it skipped, left to maintenance's
  promotion pass (MAINTENANCE_SECONDS, MAINTENANCE_BATCH_SIZE a pass).
- Cost on plain jobs (with BENCH_BEFORE=<git ref>, e.g. the commit before workflows):
  20,000 plain no-op jobs (quick: 4,000) of 4 tenants drained by `runworker --burst` of
  that commit (a `git archive` of it, in a temporary folder) and of this checkout, on the
  same database, alternated 5 times (quick: 2), medians: what JOB_COMPLETE_MANY's probe of
  pgqueue_job_dependency (one per completed job) and the worker's settle call cost on
  jobs that are in no workflow. And JOB_COMPLETE_MANY alone, that commit's and this
  checkout's: 40 running jobs recorded done in a transaction rolled back, the two
  interleaved, 1,000 runs each (quick: 200), medians; with pgqueue_job_dependency empty,
  then holding 20,000 edges between other jobs.

    BENCH_DB=pgq_wfbench python scripts/with_db.py -- python -m bench.workflows [--quick]
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import ROOT, median, ms, percentile, query, reset_tables, scalar, table
from bench.harness import running_worker, start_worker, stop_workers, wait_for

PROCESSES, CONCURRENCY = 2, 4
TENANTS = 4
WAIT = 300.0  # bound on any drain, seconds
POLL = 0.2  # seconds between two counts of the jobs left while draining
STALL = 0.1  # a stretch with nothing in hand longer than this is a stall (_stalled)
UNPROMOTED_EVERY = 0.05  # seconds between two looks for settled, unpromoted jobs
#: The report's account of how each figure is measured: the docstring's list.
METHOD = (__doc__ or "").split("\n\n")[1].strip() + "\n" + (__doc__ or "").split("\n\n")[2].strip()
RATIO_TARGET = 0.7  # workflow jobs/s over plain jobs/s


def _done(condition: str, params: Any = None) -> bool:
    return bool(
        scalar(f"SELECT bool_and(status = 'done') FROM pgqueue_job WHERE {condition}", params)
    )


def _wait_all_done(what: str) -> None:
    """Until no job of the table is left unfinished; an error naming the statuses if a job
    ends other than done."""

    def finished() -> bool:
        rows = dict(query("SELECT status, count(*) FROM pgqueue_job GROUP BY status"))
        if set(rows) - {"done", "waiting", "scheduled", "queued", "running"}:
            raise RuntimeError(f"{what}: jobs ended otherwise than done: {rows}")
        return set(rows) <= {"done"}

    wait_for(finished, WAIT, what, poll=POLL)


# -- fan-in -------------------------------------------------------------------------------


def _fan(width: int) -> int:
    """Enqueue root -> ``width`` steps -> callback; returns the workflow's id."""
    from django.conf import settings
    from django.test import override_settings

    import pgqueue

    wf = pgqueue.Workflow("fan", tenant="fan")
    root = wf.add("bench.noop", name="root")
    steps = [wf.add("bench.noop", depends_on=[root]) for _ in range(width)]
    wf.add("bench.noop", depends_on=steps, name="callback")
    bounds = {"MAX_DEPENDENCIES": max(width, 1_000), "MAX_WORKFLOW_JOBS": max(width + 2, 10_000)}
    with override_settings(PGQUEUE={**settings.PGQUEUE, **bounds}):
        return wf.enqueue().id


FAN_TIMES = """
WITH r AS (SELECT * FROM pgqueue_job WHERE workflow_id = %(wf)s AND step = 'root'),
     c AS (SELECT * FROM pgqueue_job WHERE workflow_id = %(wf)s AND step = 'callback'),
     s AS (SELECT max(finished_at) AS last_end, min(run_at) AS settled_min,
                  max(run_at) AS settled_max, min(claimed_at) AS first_claim
             FROM pgqueue_job WHERE workflow_id = %(wf)s AND step NOT IN ('root', 'callback'))
SELECT extract(epoch FROM c.run_at - s.last_end)::float8,
       extract(epoch FROM c.claimed_at - s.last_end)::float8,
       extract(epoch FROM c.started_at - s.last_end)::float8,
       extract(epoch FROM s.settled_min - r.finished_at)::float8,
       extract(epoch FROM s.settled_max - r.finished_at)::float8,
       extract(epoch FROM s.first_claim - r.finished_at)::float8,
       extract(epoch FROM s.last_end - r.finished_at)::float8
  FROM r, c, s
"""
FAN_KEYS = [
    "to_settled",
    "to_claimed",
    "to_started",
    "fanout_settled_first",
    "fanout_settled_last",
    "fanout_first_claimed",
    "fanout_last_end",
]


def fan_in(widths: list[int], reps: int) -> dict[int, dict[str, Any]]:
    """Each width's repetitions on one running worker: ``{width: {key: [seconds]}}``."""
    reset_tables()
    out: dict[int, dict[str, Any]] = {}
    with running_worker(CONCURRENCY, PROCESSES):
        for width in widths:
            runs: dict[str, list[float]] = {k: [] for k in FAN_KEYS}
            enqueue: list[float] = []
            for _ in range(reps):
                t0 = time.perf_counter()
                wf = _fan(width)
                enqueue.append(time.perf_counter() - t0)
                wait_for(
                    lambda wf=wf: _done("workflow_id = %s", [wf]),
                    WAIT,
                    f"the fan-in of {width}",
                    poll=POLL,
                )
                for key, value in zip(FAN_KEYS, query(FAN_TIMES, {"wf": wf})[0], strict=True):
                    runs[key].append(value)
                print(
                    f"   fan-in {width:,}: callback started {ms(runs['to_started'][-1])} after "
                    f"the last dependency's end (settled {ms(runs['to_settled'][-1])})",
                    flush=True,
                )
            out[width] = {**runs, "enqueue_s": enqueue}
    return out


# -- chain --------------------------------------------------------------------------------

CHAIN_GAPS = """
SELECT extract(epoch FROM j.run_at - p.finished_at)::float8,
       extract(epoch FROM j.claimed_at - p.finished_at)::float8,
       extract(epoch FROM j.started_at - p.finished_at)::float8
  FROM pgqueue_job j
  JOIN pgqueue_job_dependency d ON d.job_id = j.id
  JOIN pgqueue_job p ON p.id = d.upstream_id
 WHERE j.workflow_id = %(wf)s
"""
WALL = (
    "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))::float8"
    " FROM pgqueue_job WHERE {}"
)


def chain(length: int) -> dict[str, Any]:
    """The chain, then as many independent jobs on the same workers, then the same
    independent jobs on one thread."""
    import pgqueue

    reset_tables()
    with running_worker(CONCURRENCY, PROCESSES):
        t0 = time.perf_counter()
        wf = pgqueue.chain(*(pgqueue.step("bench.noop") for _ in range(length)), tenant="chain")
        wf_id = wf.enqueue().id
        enqueue = time.perf_counter() - t0
        wait_for(lambda: _done("workflow_id = %s", [wf_id]), WAIT, "the chain", poll=POLL)
        ids = pgqueue.enqueue_many("bench.noop", [None] * length, tenant="plain")
        wait_for(lambda: _done("id = ANY(%s)", [ids]), WAIT, "the independent jobs", poll=POLL)
    gaps = query(CHAIN_GAPS, {"wf": wf_id})
    ((_, chain_wall),) = query(WALL.format("workflow_id = %s"), [wf_id])
    ((_, parallel_wall),) = query(WALL.format("id = ANY(%s)"), [ids])
    reset_tables()
    ids = pgqueue.enqueue_many("bench.noop", [None] * length, tenant="plain")
    with running_worker(1):
        wait_for(lambda: _done("id = ANY(%s)", [ids]), WAIT, "the jobs on one thread", poll=POLL)
    ((_, serial_wall),) = query(WALL.format("id = ANY(%s)"), [ids])
    columns = list(zip(*gaps, strict=True))
    return {
        "length": length,
        "enqueue_s": enqueue,
        "wall_s": chain_wall,
        "per_step_s": chain_wall / length,
        "gap_to_settled_s": list(columns[0]),
        "gap_to_claimed_s": list(columns[1]),
        "gap_to_started_s": list(columns[2]),
        "independent_wall_s": parallel_wall,
        "independent_per_job_s": parallel_wall / length,
        "one_thread_wall_s": serial_wall,
        "one_thread_per_job_s": serial_wall / length,
    }


# -- workflows against plain jobs ---------------------------------------------------------


def _enqueue_workflows(count: int) -> float:
    """``count`` workflows of 10 jobs (root, 8 parallel, callback), tenants in turn; jobs/s."""
    import pgqueue

    t0 = time.perf_counter()
    for i in range(count):
        wf = pgqueue.Workflow("ten", tenant=f"tenant{i % TENANTS}")
        root = wf.add("bench.noop", name="root")
        middle = [wf.add("bench.noop", depends_on=[root]) for _ in range(8)]
        wf.add("bench.noop", depends_on=middle, name="callback")
        wf.enqueue()
    return count * 10 / (time.perf_counter() - t0)


def _enqueue_plain(count: int) -> float:
    """``count`` calls of enqueue_many of 10 no-op jobs, tenants in turn; jobs/s."""
    import pgqueue

    t0 = time.perf_counter()
    for i in range(count):
        pgqueue.enqueue_many("bench.noop", [None] * 10, tenant=f"tenant{i % TENANTS}")
    return count * 10 / (time.perf_counter() - t0)


IN_HAND = (
    "SELECT extract(epoch FROM run_at)::float8, extract(epoch FROM claimed_at)::float8,"
    " extract(epoch FROM started_at)::float8, extract(epoch FROM finished_at)::float8"
    " FROM pgqueue_job"
)


def _stalled() -> float:
    """Seconds of the drain (first start to last finish) in stretches of over STALL during
    which no job was in any worker's hands (claimed, not finished) while a job whose wait
    was over (run_at past: enqueued, or settled) was unclaimed: the workers idle with work
    to do. A turn's own length (no-op jobs all end before the turn that claims the next)
    is far shorter, and is not counted."""
    rows = query(IN_HAND)
    first = min(r[2] for r in rows)
    last = max(r[3] for r in rows)
    events = []
    for run_at, claimed, _, finished in rows:
        events += [(run_at, 1, 0), (claimed, -1, 0), (claimed, 0, 1), (finished, 0, -1)]
    events.sort()
    ready = held = 0
    stalled, since = 0.0, None
    for at, d_ready, d_held in events:
        if since is not None:
            length = min(at, last) - max(since, first)
            stalled += length if length > STALL else 0.0
            since = None
        ready += d_ready
        held += d_held
        if ready > 0 and held == 0:
            since = at
    return stalled


@contextlib.contextmanager
def _unpromoted() -> Iterator[set[int]]:
    """The ids of jobs seen 'scheduled' by a look every UNPROMOTED_EVERY seconds while the
    block runs. A settle promotes the jobs it makes runnable in its own transaction, so a
    committed 'scheduled' job (none of these jobs has a delay) is one whose promotion was
    skipped (JOB_PROMOTE_MANY passes over a fair clock another transaction holds): it
    waits for maintenance's promotion pass. The look reads the partial index of scheduled
    jobs only."""
    import psycopg

    seen: set[int] = set()
    stop = threading.Event()

    def look() -> None:
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            while not stop.wait(UNPROMOTED_EVERY):
                rows = conn.execute("SELECT id FROM pgqueue_job WHERE status = 'scheduled'")
                seen.update(row[0] for row in rows)

    thread = threading.Thread(target=look, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


def _drain(kind: str, count: int, processes: int, concurrency: int) -> dict[str, float]:
    """``count`` workflows' or calls' worth of jobs: enqueue jobs/s, run jobs/s, the
    seconds the workers stalled with work to do (``_stalled``), and how many jobs were
    seen settled but not promoted (``_unpromoted``)."""
    reset_tables()
    enqueue = (_enqueue_workflows if kind == "workflows" else _enqueue_plain)(count)
    query("VACUUM ANALYZE pgqueue_job")
    query("VACUUM ANALYZE pgqueue_job_dependency")
    with running_worker(concurrency, processes), _unpromoted() as unpromoted:
        _wait_all_done(f"the {kind}")
    ((done, seconds),) = query(WALL.format("true"))
    if done != count * 10:
        raise RuntimeError(f"{kind}: {done} jobs of {count * 10}")
    return {
        "enqueue": enqueue,
        "run": done / seconds,
        "wall_s": seconds,
        "stalled_s": _stalled(),
        "unpromoted": len(unpromoted),
    }


#: Worker shapes of the comparison, total concurrency 8: (label, processes, threads each).
SHAPES = [("2 processes x 4 threads", 2, 4), ("1 process x 8 threads", 1, 8)]


def versus_plain(count: int, pairs: int) -> dict[str, Any]:
    """Alternated drains of plain jobs and workflows, ``pairs`` of each per worker shape."""
    out: dict[str, Any] = {"workflow_count": count, "jobs": count * 10, "pairs": pairs}
    for label, processes, threads in SHAPES:
        runs: dict[str, list[dict[str, float]]] = {"plain": [], "workflows": []}
        for _ in range(pairs):
            for kind in ("plain", "workflows"):
                runs[kind].append(_drain(kind, count, processes, threads))
            print(
                f"   {label}: {count:,} workflows of 10: {runs['workflows'][-1]['run']:,.0f} "
                f"jobs/s, {count * 10:,} plain jobs: {runs['plain'][-1]['run']:,.0f} jobs/s",
                flush=True,
            )
        out[label] = {
            kind: {key: [r[key] for r in runs[kind]] for key in runs[kind][0]} for kind in runs
        }
        out[label]["ratios"] = [
            w["run"] / p["run"] for w, p in zip(runs["workflows"], runs["plain"], strict=True)
        ]
    return out


# -- the cost on plain jobs: this checkout against an older commit ------------------------


@contextlib.contextmanager
def _archive(ref: str) -> Iterator[Path]:
    """The tree of commit ``ref`` in a temporary folder (git archive: no git state changes)."""
    with tempfile.TemporaryDirectory(prefix="pgqueue-before-") as folder:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        yield Path(folder)


def _burst(jobs: int, root: Path) -> float:
    """jobs/s of ``runworker --burst`` of the checkout ``root`` over plain no-op jobs."""
    import pgqueue

    reset_tables()
    for t in range(TENANTS):
        pgqueue.enqueue_many("bench.noop", [None] * (jobs // TENANTS), tenant=f"tenant{t}")
    query("VACUUM ANALYZE pgqueue_job")
    args = ["--burst", "--concurrency", str(CONCURRENCY), "--processes", str(PROCESSES)]
    worker = start_worker(args, root=root)
    try:
        code = worker.proc.wait()
    finally:
        stop_workers([worker])
    if code != 0:
        raise subprocess.CalledProcessError(code, worker.proc.args)
    ((done, seconds),) = query(WALL.format("status = 'done'"))
    if done != jobs:
        raise RuntimeError(f"only {done} of {jobs} jobs done")
    return done / seconds


def _statement_at(ref: str, filename: str, name: str) -> str:
    """Statement ``name`` of pgqueue/queries/``filename`` as commit ``ref`` has it."""
    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{ref}:pgqueue/queries/{filename}"],
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    block = text.split(f"-- name: {name}\n", 1)[1].split("\n-- name: ", 1)[0]
    return "\n".join(line for line in block.splitlines() if not line.startswith("--")).strip()


def completion_cost(ref: str, batch: int, runs: int) -> dict[str, Any]:
    """JOB_COMPLETE_MANY alone, as ``ref`` has it and as this checkout has it: ``batch``
    running jobs recorded done, each run in a transaction rolled back (the same state every
    time), the two interleaved, ``runs`` each; with pgqueue_job_dependency empty, then
    holding 20,000 edges between other jobs. Medians, in microseconds."""
    from django.db import connection

    import pgqueue
    from pgqueue import sql
    from pgqueue.claim_store import complete_params

    statements = {"before": _statement_at(ref, "jobs.sql", "JOB_COMPLETE_MANY")}
    statements["after"] = sql.JOB_COMPLETE_MANY
    reset_tables()
    ids = pgqueue.enqueue_many("bench.noop", [None] * batch, tenant="bench")
    query(
        "UPDATE pgqueue_job SET status = 'running', attempts = 1, lease_owner = 'bench',"
        " claimed_at = now(), lease_expires_at = now() + interval '1 hour'"
        " WHERE id = ANY(%s)",
        [ids],
    )
    params = {"worker": "bench", "now": None, **complete_params([(i, 1, None) for i in ids])}
    out: dict[str, Any] = {"batch": batch, "runs": runs}
    for edges in (0, 20_000):
        if edges:
            others = pgqueue.enqueue_many("bench.noop", [None] * (edges + 1), tenant="other")
            query(
                "INSERT INTO pgqueue_job_dependency (job_id, upstream_id)"
                " SELECT j, j - 1 FROM unnest(%s::bigint[]) AS j",
                [others[1:]],
            )
        query("VACUUM ANALYZE pgqueue_job")
        query("VACUUM ANALYZE pgqueue_job_dependency")
        times: dict[str, list[float]] = {"before": [], "after": []}
        with connection.cursor() as cur:
            for _ in range(runs):
                for when, statement in statements.items():
                    cur.execute("BEGIN")
                    t0 = time.perf_counter()
                    cur.execute(statement, params)
                    recorded = len(cur.fetchall())
                    times[when].append(time.perf_counter() - t0)
                    cur.execute("ROLLBACK")
                    if recorded != batch:
                        raise RuntimeError(f"{when}: {recorded} of {batch} recorded")
        out[str(edges)] = {when: median(t) * 1e6 for when, t in times.items()}
    return out


def plain_cost(ref: str, jobs: int, rounds: int) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"before": [], "after": []}
    with _archive(ref) as old:
        for _ in range(rounds):
            rates["before"].append(_burst(jobs, old))
            rates["after"].append(_burst(jobs, ROOT))
            print(
                f"   plain no-op, {ref}: {rates['before'][-1]:,.0f} jobs/s, "
                f"this checkout: {rates['after'][-1]:,.0f} jobs/s",
                flush=True,
            )
    return {
        "ref": ref,
        "jobs": jobs,
        "rounds": rounds,
        **rates,
        "ratios": [a / b for a, b in zip(rates["after"], rates["before"], strict=True)],
        "statement": completion_cost(ref, 40, 1_000 if rounds > 2 else 200),
    }


# -- the report ---------------------------------------------------------------------------


def _fan_report(fan: dict[int, dict[str, Any]]) -> str:
    rows = []
    for width, r in fan.items():
        rows.append(
            [
                f"{width:,}",
                len(r["to_started"]),
                *(
                    f"{ms(median(r[k]))} / {ms(max(r[k]))}"
                    for k in ("to_settled", "to_claimed", "to_started")
                ),
                f"{ms(median(r['fanout_settled_last']))} / {ms(median(r['fanout_first_claimed']))}",
                ms(median(r["enqueue_s"])),
            ]
        )
    return table(
        [
            "fan-in of",
            "runs",
            "-> settled (med / max)",
            "-> claimed (med / max)",
            "-> started (med / max)",
            "fan-out: settled / 1st claimed (med)",
            "enqueue (med)",
        ],
        rows,
    )


def _fine(seconds: float) -> str:
    """A per-job time, which can be a small fraction of a millisecond."""
    return f"{seconds * 1000:.2f} ms"


def _chain_report(c: dict[str, Any]) -> str:
    def pair(values: list[float]) -> str:
        return f"{ms(percentile(values, 50))} / {ms(percentile(values, 95))}"

    n = c["length"]
    hand_off = percentile(c["gap_to_started_s"], 50)
    lines = [
        table(
            ["chain of " + f"{n:,}", "per step", "hand-off p50 / p95"],
            [
                ["predecessor's end -> settled (run_at)", "", pair(c["gap_to_settled_s"])],
                ["predecessor's end -> claimed", "", pair(c["gap_to_claimed_s"])],
                ["predecessor's end -> started", "", pair(c["gap_to_started_s"])],
                ["chain wall time / steps", ms(c["per_step_s"]), ""],
                [f"{n:,} independent jobs, same workers", _fine(c["independent_per_job_s"]), ""],
                [f"{n:,} independent jobs, 1 thread", _fine(c["one_thread_per_job_s"]), ""],
            ],
        ),
        f"hand-off p50 / a job on one thread: {hand_off / c['one_thread_per_job_s']:.1f}x; "
        f"chain per step / independent per job (same workers): "
        f"{c['per_step_s'] / c['independent_per_job_s']:.0f}x; "
        f"enqueue of the chain {ms(c['enqueue_s'])}",
    ]
    return "\n".join(lines)


def _versus_report(v: dict[str, Any]) -> str:
    rows, notes = [], []
    for label, _, _ in SHAPES:
        r = v[label]
        for kind, what in (
            ("workflows", f"{v['workflow_count']:,} workflows of 10 (16 edges each)"),
            ("plain", f"{v['jobs']:,} plain jobs"),
        ):
            rows.append(
                [
                    label,
                    what,
                    f"{median(r[kind]['run']):,.0f}",
                    " ".join(f"{x:,.0f}" for x in r[kind]["run"]),
                    f"{median(r[kind]['stalled_s']):.2f} s of {median(r[kind]['wall_s']):.2f} s",
                    f"{median(r[kind]['unpromoted']):,.0f}",
                ]
            )
        ratio = median(r["workflows"]["run"]) / median(r["plain"]["run"])
        notes.append(
            f"{label}: workflows / plain {ratio:.2f}, the pairs' median "
            f"{median(r['ratios']):.2f} (target {RATIO_TARGET}: "
            + ("met" if min(ratio, median(r["ratios"])) >= RATIO_TARGET else "NOT met")
            + "); each pair: "
            + " ".join(f"{x:.2f}" for x in r["ratios"])
        )
    enqueue = {
        kind: median([x for label, _, _ in SHAPES for x in v[label][kind]["enqueue"]])
        for kind in ("workflows", "plain")
    }
    return (
        table(
            [
                "workers",
                "jobs",
                "jobs/s (median)",
                "runs",
                "stalled with work, > 100 ms (median)",
                "left unpromoted (median)",
            ],
            rows,
        )
        + "\n"
        + "\n".join(notes)
        + f"\nenqueue, one call per 10 jobs: workflows {enqueue['workflows']:,.0f} jobs/s "
        f"(Workflow.enqueue: its row, 3 levels of jobs, 16 edges, the root's settle), plain "
        f"{enqueue['plain']:,.0f} jobs/s (enqueue_many): "
        f"{enqueue['workflows'] / enqueue['plain']:.2f}"
    )


def _cost_report(c: dict[str, Any] | None) -> str:
    if c is None:
        return (
            "Cost on plain jobs against an older commit: not measured "
            "(set BENCH_BEFORE=<git ref> to run it)."
        )
    b, a = median(c["before"]), median(c["after"])
    st = c["statement"]
    return (
        f"Plain no-op jobs, {c['jobs']:,}, runworker --burst --processes {PROCESSES} "
        f"--concurrency {CONCURRENCY}, {c['rounds']} alternated rounds:\n"
        + table(
            ["worker", "jobs/s (median)", "runs"],
            [
                [f"{c['ref']}", f"{b:,.0f}", " ".join(f"{r:,.0f}" for r in c["before"])],
                ["this checkout", f"{a:,.0f}", " ".join(f"{r:,.0f}" for r in c["after"])],
            ],
        )
        + f"\nthis checkout / {c['ref']}: {a / b:.2f}; each round: "
        + " ".join(f"{r:.2f}" for r in c["ratios"])
        + f" (median {median(c['ratios']):.2f})"
        + f"\nJOB_COMPLETE_MANY alone, {st['batch']} jobs, {st['runs']:,} interleaved runs each"
        " (rolled back), medians: "
        + "; ".join(
            f"{edges} edges in pgqueue_job_dependency: {c['ref']} {st[edges]['before']:,.0f} us,"
            f" this checkout {st[edges]['after']:,.0f} us"
            f" ({st[edges]['after'] / st[edges]['before'] - 1:+.0%})"
            for edges in ("0", "20000")
        )
    )


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    widths = [1_000] if quick else [1_000, 10_000]
    reps = 3 if quick else 5
    length = 100 if quick else 1_000
    count = 100 if quick else 1_000
    pairs = 2 if quick else 4
    fan = fan_in(widths, reps)
    sequence = chain(length)
    print(
        f"   chain of {length:,}: hand-off p50 {ms(percentile(sequence['gap_to_started_s'], 50))}",
        flush=True,
    )
    versus = versus_plain(count, pairs)
    ref = os.environ.get("BENCH_BEFORE")
    cost = plain_cost(ref, 4_000 if quick else 20_000, 2 if quick else 5) if ref else None
    report = "\n\n".join(
        [
            "Fan-in: the callback after its last dependency's end; the fan-out after the root's"
            " end (seconds from finished_at, PostgreSQL's clock):\n" + _fan_report(fan),
            _chain_report(sequence),
            _versus_report(versus),
            _cost_report(cost),
        ]
    )
    return {
        "title": "Workflows",
        "method": METHOD,
        "report": report,
        "figures": {
            "fan_in": {str(w): r for w, r in fan.items()},
            "chain": sequence,
            "versus_plain": versus,
            "plain_cost": cost,
        },
    }


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
