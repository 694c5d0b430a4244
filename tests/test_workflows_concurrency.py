"""Workflows under concurrency, with real worker processes (tests/workers.py): a fan-in
whose dependencies end on many processes at once, and workers SIGKILLed in the middle of
hundreds of workflows. Each test names the protections it proves; without them, it fails.

The step tasks are tests/taskapp/tasks.py's test.wf_step (a value, the values of its
dependencies, an optional sleep) and test.wf_leaf (a value, without the database).
"""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

import pgqueue
from pgqueue.models import Job, JobAttempt, JobDependency
from pgqueue.models import Worker as WorkerRow
from tests.workers import FAST_RECOVERY, STARTUP, StartWorker, WorkerProcess, wait_for

STEP = "test.wf_step"
LEAF = "test.wf_leaf"  # no database: 128 threads need no connection each
ENDED = {"done", "dead", "cancelled"}

Writes = dict[int, list[tuple[str, str]]]


def live_workers(exclude_pid: int | None = None) -> int:
    """Registered, not stopped worker rows (a supervisor's children: not the parent)."""
    return WorkerRow.objects.filter(stopped_at__isnull=True).exclude(pid=exclude_pid).count()


# -- what the jobs went through: test-only triggers ---------------------------------------


class StatusLog:
    """Test-only triggers on pgqueue_job, in the test database. One records every
    committed status write of a workflow's job, from any connection (``read``): what each
    job went through, not only where it ended. ``hold`` makes each settle that takes a
    job of a step name out of 'waiting' hold its transaction (and the row) a while before
    it commits, as a loaded server would: a settle that starts meanwhile sees the job
    still waiting, and a worker can be killed in the middle of it."""

    CREATE = [
        "CREATE TABLE test_status_write (id bigserial PRIMARY KEY, job_id bigint,"
        " old_status text, new_status text)",
        "CREATE FUNCTION test_status_write() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN INSERT INTO test_status_write (job_id, old_status, new_status)"
        " VALUES (NEW.id, OLD.status, NEW.status); RETURN NULL; END $$",
        "CREATE TRIGGER test_status_write AFTER UPDATE OF status ON pgqueue_job FOR EACH ROW"
        " WHEN (NEW.workflow_id IS NOT NULL) EXECUTE FUNCTION test_status_write()",
    ]
    DROP = [
        "DROP TRIGGER IF EXISTS test_hold_decision ON pgqueue_job",
        "DROP TRIGGER IF EXISTS test_status_write ON pgqueue_job",
        "DROP FUNCTION IF EXISTS test_hold_decision()",
        "DROP FUNCTION IF EXISTS test_status_write()",
        "DROP TABLE IF EXISTS test_status_write",
    ]

    def create(self) -> None:
        with connection.cursor() as cur:
            for statement in self.CREATE:
                cur.execute(statement)

    def drop(self) -> None:
        with connection.cursor() as cur:
            for statement in self.DROP:
                cur.execute(statement)

    def hold(self, step: str, seconds: float) -> None:
        assert step.isidentifier()  # written into the trigger's condition
        with connection.cursor() as cur:
            cur.execute(
                "CREATE FUNCTION test_hold_decision() RETURNS trigger LANGUAGE plpgsql AS $$"
                f" BEGIN PERFORM pg_sleep({float(seconds)}); RETURN NEW; END $$"
            )
            cur.execute(
                "CREATE TRIGGER test_hold_decision BEFORE UPDATE OF status ON pgqueue_job"
                " FOR EACH ROW WHEN (OLD.status = 'waiting' AND NEW.status <> 'waiting'"
                f" AND NEW.step = '{step}') EXECUTE FUNCTION test_hold_decision()"
            )

    def read(self) -> Writes:
        """``{job id: [(old status, new status), ...]}``, oldest first."""
        writes: Writes = defaultdict(list)
        with connection.cursor() as cur:
            cur.execute("SELECT job_id, old_status, new_status FROM test_status_write ORDER BY id")
            for job_id, old, new in cur.fetchall():
                writes[job_id].append((old, new))
        return writes

    def firsts(self) -> dict[int, tuple[int | None, int | None]]:
        """``{job id: (order of its first write into 'running', of its first into
        'done')}``, in the order the writes were made (the log's own sequence: no clock)."""
        with connection.cursor() as cur:
            cur.execute(
                "SELECT job_id, min(id) FILTER (WHERE new_status = 'running'),"
                " min(id) FILTER (WHERE new_status = 'done') FROM test_status_write"
                " GROUP BY job_id"
            )
            return {row[0]: (row[1], row[2]) for row in cur.fetchall()}


@pytest.fixture
def status_log(transactional_db: None) -> Iterator[StatusLog]:
    """A ``StatusLog``, set up before the workers (request it first), so dropped after
    they are gone."""
    log = StatusLog()
    log.create()
    try:
        yield log
    finally:
        log.drop()


def left_waiting_once(job_id: int, writes: list[tuple[str, str]], rescued: int = 0) -> list[str]:
    """What is wrong with a job's status writes, if anything: it must leave 'waiting'
    once, for 'scheduled', and be 'done' once; it is made 'scheduled' again only by the
    ``rescued`` leases lost while 'running' that spent an attempt (a claim given back
    uncounted goes to 'queued': nothing here)."""
    wrong = []
    if [w for w in writes if w[0] == "waiting"] != [("waiting", "scheduled")]:
        wrong.append(f"job {job_id} left 'waiting' otherwise than once: {writes}")
    again = [w for w in writes[1:] if w[1] == "scheduled"]
    if len(again) != rescued or any(old != "running" for old, _ in again):
        wrong.append(f"job {job_id} made runnable {1 + len(again)} times: {writes}")
    if Counter(new for _, new in writes)["done"] != 1:
        wrong.append(f"job {job_id} not 'done' once: {writes}")
    return wrong


# -- 1. a fan-in settled from many processes at once --------------------------------------

FAN_IN = 1000
LAST_WAVE = 64  # dependencies that end together, last (of 8 x 16 threads)
HOLD = 0.3  # seconds the settle that decides the callback holds its transaction open


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_fan_in_of_1000_ending_on_8_processes_makes_its_callback_runnable_once(
    status_log: StatusLog, workers: StartWorker, tmp_path: Path
) -> None:
    """A callback waiting for 1,000 jobs that end on 8 processes of 16 threads each is
    made runnable once, and runs once, after every one of them.

    Every worker settles the callback after each commit that ended some of its
    dependencies, and maintenance's sweep (every 50 ms here) settles it too. The last
    LAST_WAVE dependencies are held until they all run, on whichever processes took them,
    and then end in the same millisecond: their workers commit and settle together. The
    settle that decides the callback holds its transaction HOLD seconds
    (``StatusLog.hold``), so the settles that start meanwhile see every dependency ended
    and the callback still waiting. The header's jobs race too: the enqueue's settle
    against the sweep.

    The protection is JOB_SETTLE_WAITING's row lock on each job it decides and its
    recheck of status = 'waiting' under that lock (its ``decided`` step): the settles
    serialise there, and all but the first find the job no longer waiting. Without them,
    a second settle writes 'scheduled' over the job the first promoted (queued, running
    or done) and promotes it again: a second write into 'scheduled' (``status_log`` sees
    every one), a second attempt, or an attempt lost. The test fails then.
    """
    parent = workers(
        "--processes",
        "8",
        "--concurrency",
        "16",
        settings={"POLL_SECONDS": 0.2, "MAINTENANCE_SECONDS": 0.05},
    )
    wait_for(lambda: live_workers(parent.pid) >= 8, STARTUP * 2, "8 child workers to register")

    status_log.hold("callback", HOLD)
    rng = random.Random()
    last = set(rng.sample(range(FAN_IN), LAST_WAVE))
    gate, started = tmp_path / "gate", tmp_path / "started"
    started.mkdir()
    held = {"gate": str(gate), "started": str(started)}
    header = [
        pgqueue.step(LEAF, {"value": i, **(held if i in last else {})}, name=f"p{i}")
        for i in range(FAN_IN)
    ]
    run = pgqueue.chord(header, pgqueue.step(STEP, name="callback"), tenant="acme").enqueue()
    callback = run.jobs["callback"]
    first = [run.jobs[f"p{i}"] for i in range(FAN_IN) if i not in last]
    wait_for(
        lambda: (
            Job.objects.filter(id__in=first, status="done").count() == len(first)
            and len(list(started.iterdir())) == LAST_WAVE
        ),
        60,
        f"{len(first)} dependencies to be done and the last {LAST_WAVE} to run",
    )
    (tmp_path / "moment").write_text(repr(time.time() + 0.2))
    (tmp_path / "moment").rename(gate)  # whole, at once
    wait_for(
        lambda: Job.objects.filter(id=callback, status__in=ENDED).exists(),
        30,
        "the callback to end",
    )

    writes = status_log.read()
    assert left_waiting_once(callback, writes.pop(callback)) == []
    # The header's jobs: the enqueue's settle raced the sweep's.
    assert [w for job_id, its in writes.items() for w in left_waiting_once(job_id, its)] == []

    job = Job.objects.get(id=callback)
    assert (job.status, job.attempts) == ("done", 1)
    assert list(JobAttempt.objects.filter(job_id=callback).values_list("outcome", flat=True)) == [
        "done"
    ]
    deps = Job.objects.filter(id__in=[run.jobs[f"p{i}"] for i in range(FAN_IN)])
    assert {d.status for d in deps} == {"done"}
    assert job.started_at >= max(d.finished_at for d in deps)
    assert job.result["upstream"] == {f"p{i}": i for i in range(FAN_IN)}


# -- 2. workers SIGKILLed in the middle of 200 workflows ----------------------------------

WORKFLOWS = 200
WORKERS = 4
KILLS = 8
MID_SETTLE = 3  # of the kills: a worker caught inside a settle of a chain's tail
SETTLE_HOLD = 0.3  # seconds each settle that decides a chain's tail holds its transaction
#: Short leases, quick maintenance and tiny backoffs; starts written within 0.25 s, so
#: that most kills spend an attempt, not only a claim.
CHAOS = {**FAST_RECOVERY, "HEARTBEAT_SECONDS": 0.25, "POLL_SECONDS": 0.2}
SHAPES = {  # step: the steps it depends on
    "chain": {"a": [], "b": ["a"], "tail": ["b"]},
    "diamond": {"top": [], "left": ["top"], "right": ["top"], "bottom": ["left", "right"]},
    "fan_in": {**{f"p{i}": [] for i in range(5)}, "sum": [f"p{i}" for i in range(5)]},
}


def build(shape: str, n: int, rng: random.Random) -> pgqueue.Workflow:
    """Workflow ``n`` of a shape: each step sleeps 50-300 ms (kills find jobs running)
    and returns "<n>.<step>"; attempts to spare for the kills."""
    wf = pgqueue.Workflow(f"{shape}-{n}", tenant=f"t{n % 5}")
    for step, deps in SHAPES[shape].items():
        payload = {"value": f"{n}.{step}", "sleep": round(rng.uniform(0.05, 0.3), 3)}
        wf.add(STEP, payload, name=step, depends_on=deps, max_attempts=50)
    return wf


def worker_in_a_held_settle(pool: dict[str, WorkerProcess]) -> str | None:
    """A worker of ``pool`` whose connection is inside a held settle (in pg_sleep, see
    ``StatusLog.hold``) now, if any."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT application_name FROM pg_stat_activity"
            " WHERE wait_event = 'PgSleep' AND application_name LIKE 'pgqueue worker %%'"
        )
        names = {row[0] for row in cur.fetchall()}
    return next((w for w in pool if f"pgqueue worker {w}"[:63] in names), None)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_200_workflows_complete_in_order_through_workers_sigkilled_mid_run(
    status_log: StatusLog, workers: StartWorker
) -> None:
    """200 workflows (chains, diamonds, fan-ins of 5) run to the end, each step after
    its dependencies and made runnable once, while workers are SIGKILLed one after the
    other (a replacement started each time): some while they run jobs, some in the middle
    of the settle that would make a chain's tail runnable (each such settle is held
    SETTLE_HOLD seconds, ``StatusLog.hold``, so that a kill can land there).

    The protections: a killed worker's jobs come back by their leases (the reaper), and
    its late outcome could not be recorded (completion is fenced by attempt), so a job is
    done once; a job's dependents are settled only after the commit that ended it, so
    none is claimed before its dependencies have finished, and the row lock makes each
    runnable once; and a worker killed between its commit and its settle (here, in the
    middle of it: the settle rolls back) leaves a job waiting that nothing else would
    settle (its one dependency has ended): maintenance's sweep of waiting jobs does. Without
    the sweep, the held tails of the killed workers wait for ever and the test fails.
    """
    rng = random.Random()
    pool: dict[str, WorkerProcess] = {}
    starting = [workers("--concurrency", "4", settings=CHAOS) for _ in range(WORKERS)]
    status_log.hold("tail", SETTLE_HOLD)
    runs = [build(list(SHAPES)[n % 3], n, rng).enqueue() for n in range(WORKFLOWS)]
    ids = [i for run in runs for i in run.jobs.values()]
    for worker in starting:
        pool[worker.registered()] = worker

    def all_ended() -> bool:
        return not Job.objects.filter(id__in=ids).exclude(status__in=ENDED).exists()

    def running_on(worker_id: str) -> bool:
        return Job.objects.filter(lease_owner=worker_id, status="running").exists()

    def victim(in_settle: bool) -> str | None:
        """The next worker to kill: one inside a held settle, or a random one once it runs
        a job; None when every workflow ended first."""
        target = rng.choice(list(pool))

        def pick() -> str | None:
            if in_settle:
                return worker_in_a_held_settle(pool)
            return target if running_on(target) else None

        what = "a worker inside a held settle" if in_settle else f"{target} to run a job"
        found = wait_for(lambda: pick() or (all_ended() and "-"), 30, what)
        return None if found == "-" else found

    kills = mid_settle = 0
    while kills < KILLS:
        in_settle = mid_settle < MID_SETTLE and kills % 2 == 0
        found = victim(in_settle)
        if found is None:
            break
        pool.pop(found).kill_group()
        kills, mid_settle = kills + 1, mid_settle + in_settle
        replacement = workers("--concurrency", "4", settings=CHAOS)
        pool[replacement.registered()] = replacement
    assert mid_settle >= 1, "no worker was killed inside a settle: the run ended first"

    deadline = time.monotonic() + 90
    wait_for(lambda: all_ended() or time.monotonic() > deadline, 100, "every workflow to end")
    unfinished = Job.objects.filter(id__in=ids).exclude(status__in=ENDED)
    left = list(unfinished.values_list("id", "step", "status"))
    assert not left, f"not ended in 90 s: {left}"

    jobs = {j.id: j for j in Job.objects.filter(id__in=ids)}
    assert Counter(j.status for j in jobs.values()) == {"done": len(ids)}
    deps: dict[int, list[int]] = defaultdict(list)
    for job_id, upstream_id in JobDependency.objects.filter(job_id__in=ids).values_list(
        "job_id", "upstream_id"
    ):
        deps[job_id].append(upstream_id)
    attempts: dict[int, list[JobAttempt]] = defaultdict(list)
    for row in JobAttempt.objects.filter(job_id__in=ids).order_by("id"):
        attempts[row.job_id].append(row)
    writes, firsts = status_log.read(), status_log.firsts()

    lost = Counter(a.started_at is not None for rows in attempts.values() for a in rows[:-1])
    print(  # shown with the workers' logs when the test fails
        f"kills={kills} in_settle={mid_settle} attempts_lost={lost[True]}"
        f" claims_lost={lost[False]} jobs={len(ids)}"
    )
    wrong: list[str] = []
    for job_id, job in jobs.items():
        outcomes = [a.outcome for a in attempts[job_id]]
        # Each attempt but the last lost its lease (a killed worker), the last is done.
        if outcomes[-1:] != ["done"] or set(outcomes[:-1]) - {"lease_expired"}:
            wrong.append(f"job {job_id} attempts {outcomes}")
        counted = sum(
            a.outcome == "lease_expired" and a.started_at is not None for a in attempts[job_id]
        )
        wrong += left_waiting_once(job_id, writes[job_id], rescued=counted)
        if deps[job_id]:
            first_claim = min(a.claimed_at for a in attempts[job_id] if a.claimed_at)
            last_end = max(jobs[u].finished_at for u in deps[job_id])
            if first_claim < last_end:
                wrong.append(f"job {job_id} claimed at {first_claim}, a dependency ended after")
            # The same in the order of the writes themselves: first claimed after every
            # dependency's 'done' was written.
            if firsts[job_id][0] < max(firsts[u][1] for u in deps[job_id]):
                wrong.append(f"job {job_id} was running before its dependencies were done")
            expected = {jobs[u].step: jobs[u].result["value"] for u in deps[job_id]}
            if job.result["upstream"] != expected:
                wrong.append(f"job {job_id} read {job.result['upstream']}, not {expected}")
    assert wrong == []
