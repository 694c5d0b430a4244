"""The look-ahead (``PGQUEUE["PREFETCH"]``, ``runworker --prefetch``), with real workers.

A worker holds up to ``concurrency + prefetch`` jobs: those beyond its busy threads wait
unstarted in the process, leased like the running ones. It claims ahead only what its
threads start in about ``PREFETCH_SECONDS``, counting no thread on a job that has run
``PREFETCH_HOLD_SECONDS`` or longer, and gives back every job still waiting after
``PREFETCH_HOLD_SECONDS``. A job's ``started_at`` and ``finished_at`` are when its handler
began and ended; ``claimed_at`` is the claim's; its timeout counts from its start.

These tests hold the one thread of a worker with a ``test.block`` job and look at what the
worker holds meanwhile, what becomes of it, and what the job rows say afterwards.
"""

from __future__ import annotations

import itertools
import signal
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

import pgqueue
from pgqueue import checks
from pgqueue.conf import DEFAULTS
from pgqueue.models import Job, JobAttempt
from pgqueue.worker.lookahead import LookAhead
from tests.workers import STARTUP, StartWorker, history, wait_for

FAST = {"LEASE_SECONDS": 3, "HEARTBEAT_SECONDS": 0.5, "POLL_SECONDS": 0.2}
#: FAST, and jobs claimed ahead kept for as long as a test needs to look at them.
HOLD_LONG = {**FAST, "PREFETCH_HOLD_SECONDS": 60}


def held(worker_id: str) -> list[Job]:
    return list(Job.objects.filter(status="running", lease_owner=worker_id).order_by("id"))


def block_one(tmp_path: Path, tenant: str = "acme") -> tuple[int, Path, Path]:
    """Enqueue a job that runs until its release file exists; returns its id and files."""
    release, started = tmp_path / "release", tmp_path / "started"
    job, _ = pgqueue.enqueue(
        "test.block", {"release": str(release), "started": str(started)}, tenant=tenant
    )
    return job.id, release, Path(f"{started}.1")


def held_for(job_id: int) -> float:
    """Seconds since the job was claimed, by the database's clock."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT extract(epoch FROM now() - claimed_at) FROM pgqueue_job WHERE id = %s", [job_id]
        )
        return float(cur.fetchone()[0])


def renewed(worker_id: str, jobs: list[Job], times: int = 1) -> None:
    """Wait until the worker's heartbeat has renewed the leases of ``jobs`` ``times`` times
    (HEARTBEAT_SECONDS apart): how a test lets time pass without sleeping."""
    for _ in range(times):
        lease = {j.id: j.lease_expires_at for j in jobs}
        wait_for(
            lambda lease=lease: all(
                j.lease_expires_at > lease[j.id]
                for j in Job.objects.filter(id__in=lease, lease_owner=worker_id)
            ),
            STARTUP,
            "a heartbeat to pass",
        )


@pytest.mark.django_db(transaction=True)
def test_prefetched_jobs_are_leased_heartbeated_and_given_back_on_sigterm(
    workers: StartWorker, tmp_path: Path
) -> None:
    """With one thread busy, the worker holds a job ahead; SIGTERM gives it back.

    The held job is the worker's in the database (running, its lease, no start) and its
    lease is renewed by the heartbeat while it waits, as the running job's is. On SIGTERM
    it is queued again at once with the attempt not counted (no attempt row); the job in
    hand finishes and is recorded; nothing is lost. Fails if the release of
    claimed-but-unstarted jobs does not reach the jobs waiting in the executor's queue
    (they would run before the worker exits) or if the heartbeat skipped them (their
    leases would expire and maintenance would reap them as failed attempts).
    """
    blocker, release, started = block_one(tmp_path)
    ahead = pgqueue.enqueue_many("test.noop", [{}] * 5, tenant="acme")
    worker = workers("--concurrency", "1", "--prefetch", "3", settings=HOLD_LONG)
    worker_id = worker.registered()
    wait_for(lambda: started.exists(), STARTUP, "the blocking job to start")
    # Nothing has finished yet: one job ahead for the one thread.
    wait_for(lambda: len(held(worker_id)) == 2, STARTUP, "the worker to hold 1 + 1 jobs")
    jobs = held(worker_id)
    assert jobs[0].id == blocker
    prefetched = jobs[1]
    assert prefetched.id == ahead[0]
    assert prefetched.claimed_at is not None and prefetched.started_at is None
    assert Job.objects.filter(status="queued").count() == 4

    renewed(worker_id, jobs)
    assert len(held(worker_id)) == 2  # past several heartbeats, none expired or reaped
    assert Job.objects.get(pk=prefetched.id).started_at is None  # waiting: not started

    worker.send(signal.SIGTERM)
    wait_for(
        lambda: Job.objects.filter(pk=prefetched.id, status="queued").exists(),
        STARTUP,
        "the prefetched job to be given back",
    )
    release.touch()
    assert worker.wait_exit(STARTUP) == 0
    job = Job.objects.get(pk=prefetched.id)
    assert (job.status, job.attempts, job.lease_owner, job.claimed_at, job.started_at) == (
        "queued",
        0,
        None,
        None,
        None,
    )
    assert history(job.id) == []
    assert Job.objects.get(pk=blocker).status == "done"
    assert history(blocker) == [(1, "done", worker_id)]
    assert Job.objects.filter(status="queued").count() == 5  # all of the 5: none lost


@pytest.mark.django_db(transaction=True)
def test_prefetch_zero_claims_only_for_idle_threads(workers: StartWorker, tmp_path: Path) -> None:
    """``--prefetch 0``: a worker with its one thread busy holds that one job only."""
    blocker, release, started = block_one(tmp_path)
    pgqueue.enqueue_many("test.noop", [{}] * 3, tenant="acme")
    worker = workers("--concurrency", "1", "--prefetch", "0", settings=HOLD_LONG)
    worker_id = worker.registered()
    wait_for(lambda: started.exists(), STARTUP, "the blocking job to start")
    # Several polls and heartbeats go by: none of them claims while the thread is busy.
    renewed(worker_id, held(worker_id))
    assert [j.id for j in held(worker_id)] == [blocker]
    release.touch()
    wait_for(
        lambda: Job.objects.filter(status="done").count() == 4, STARTUP, "every job to be done"
    )
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(STARTUP) == 0


@pytest.mark.django_db(transaction=True)
def test_async_jobs_claimed_ahead_wait_for_a_slot(workers: StartWorker) -> None:
    """Async handlers share the slots with the look-ahead too: never more than
    ``concurrency`` of them run at once, however many the worker holds."""
    ids = pgqueue.enqueue_many(
        "test.async_sleep", [{"seconds": 0.3, "n": n} for n in range(4)], tenant="acme"
    )
    worker = workers("--concurrency", "1", "--prefetch", "3", settings=HOLD_LONG)
    worker.registered()
    wait_for(
        lambda: Job.objects.filter(id__in=ids, status="done").count() == 4,
        STARTUP,
        "every job to be done",
    )
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(STARTUP) == 0
    runs = sorted(
        (r["began"], r["ended"])
        for r in Job.objects.filter(id__in=ids).values_list("result", flat=True)
    )
    for (_, ended), (began, _) in itertools.pairwise(runs):
        assert began >= ended, f"two async jobs ran at once with one slot: {runs}"


def test_lookahead_is_bounded_by_the_time_its_jobs_take() -> None:
    """One job per thread that may be free soon until a job has finished; then as many
    jobs as those threads start in ``PREFETCH_SECONDS`` at the mean run time, at most the
    cap, and none when not one would start that soon; no thread, none; 0 stays 0."""
    horizon = DEFAULTS["PREFETCH_SECONDS"]
    ahead = LookAhead(32, horizon=horizon)
    assert ahead.size(8) == 8  # nothing known yet: one per thread
    assert ahead.size(0) == 0  # every thread on a long job
    ahead.observe([])
    assert ahead.size(8) == 8
    ahead.observe([horizon / 1000] * 50)  # no-op jobs: the cap
    assert ahead.size(8) == 32
    for _ in range(400):  # jobs of 0.3 horizons: 8 threads start 26 of them in one
        ahead.observe([0.3 * horizon])
    assert ahead.size(8) == 26
    assert ahead.size(4) == 13  # half the threads on long jobs: half as many
    for _ in range(400):  # long jobs: none ahead, not one of seconds
        ahead.observe([100 * horizon])
    assert ahead.size(8) == 0
    off = LookAhead(0, horizon=horizon)
    off.observe([horizon / 1000] * 50)
    assert off.size(8) == 0
    wide = LookAhead(32, horizon=10 * horizon)
    wide.observe([10 * horizon] * 400)  # each thread starts one job in the horizon
    assert wide.size(8) == 8


@pytest.mark.parametrize(
    "name, value",
    [
        ("PREFETCH_SECONDS", -0.001),
        ("PREFETCH_SECONDS", "0.005"),
        ("PREFETCH_SECONDS", None),
        ("PREFETCH_HOLD_SECONDS", 0),
        ("PREFETCH_HOLD_SECONDS", "0.05"),
        ("PREFETCH_HOLD_SECONDS", None),
    ],
)
def test_prefetch_times_must_be_numbers_in_range(name: str, value: object) -> None:
    with override_settings(PGQUEUE={name: value}):
        errors = checks.check_settings()
    assert [e.id for e in errors] == ["pgqueue.E003"]
    assert name in errors[0].msg


# -- nothing waits in a busy worker: the hold bound and long jobs ------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_job_held_behind_a_long_job_is_given_back_and_run_by_an_idle_worker(
    workers: StartWorker, tmp_path: Path
) -> None:
    """A short job of another tenant, claimed ahead by a worker whose one thread then
    runs a long job, is done within seconds by a second, idle worker, while the long job
    still runs; its attempt is not counted twice and its times are its own.

    Protection: the worker gives back the jobs it holds unstarted once they have waited
    PREFETCH_HOLD_SECONDS (JOB_RELEASE_MANY: queued again at their place, the attempt not
    counted, the queue's workers woken). Without it the short job waits in the first
    worker until the long job ends (here: never, before the test gives up).
    """
    blocker, release, started = block_one(tmp_path, tenant="big")
    short, _ = pgqueue.enqueue("test.noop", {}, tenant="small")
    first = workers("--concurrency", "1", settings=FAST, name="busy")
    first_id = first.registered()
    wait_for(lambda: started.exists(), STARTUP, "the long job to start")
    idle = workers("--concurrency", "1", settings=FAST, name="idle")
    idle_id = idle.registered()
    wait_for(
        lambda: Job.objects.filter(pk=short.id, status="done").exists(),
        10,
        "the short job to be done by the idle worker",
    )
    assert Job.objects.get(pk=blocker).status == "running"  # the long job still runs
    row = Job.objects.get(pk=short.id)
    assert row.attempts == 1
    assert history(short.id) == [(1, "done", idle_id)]
    assert row.claimed_at <= row.started_at <= row.finished_at
    given_back = [line for line in first.log().splitlines() if "event=released_unstarted" in line]
    assert given_back and "reason=not_started_within_hold" in given_back[0], first.log()
    release.touch()
    wait_for(lambda: Job.objects.get(pk=blocker).status == "done", STARTUP, "the long job")
    assert history(blocker) == [(1, "done", first_id)]
    for w in (first, idle):
        w.send(signal.SIGTERM)
        assert w.wait_exit(STARTUP) == 0


@pytest.mark.django_db(transaction=True)
def test_a_worker_on_long_jobs_claims_nothing_ahead(workers: StartWorker, tmp_path: Path) -> None:
    """A worker whose only thread has run a job longer than PREFETCH_HOLD_SECONDS claims
    nothing more, however many jobs are queued and however often it wakes.

    Protection: the look-ahead counts only threads not on a long job
    (WorkerLoop._soon_threads). Without it the worker, which has seen no job finish,
    claims one job ahead for its busy thread (and all of --prefetch on an older rule)."""
    blocker, release, started = block_one(tmp_path)
    worker = workers("--concurrency", "1", settings=FAST)
    worker_id = worker.registered()
    wait_for(lambda: started.exists(), STARTUP, "the long job to start")
    wait_for(
        lambda: Job.objects.filter(pk=blocker, started_at__isnull=False).exists(),
        STARTUP,
        "the long job's start to be written",
    )
    queued = pgqueue.enqueue_many("test.noop", [{}] * 3, tenant="other")  # wakes it
    renewed(worker_id, held(worker_id), times=2)
    assert [j.id for j in held(worker_id)] == [blocker]
    assert Job.objects.filter(id__in=queued, status="queued").count() == 3
    release.touch()
    wait_for(
        lambda: Job.objects.filter(status="done").count() == 4, STARTUP, "every job to be done"
    )
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(STARTUP) == 0


# -- times that mean what they say --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_held_job_cannot_time_out_and_its_times_are_its_own(
    workers: StartWorker, tmp_path: Path
) -> None:
    """A job with a 0.5 s timeout and one attempt, held unstarted behind a long job for
    over a second, runs when the thread is free and ends done at attempt 1. Its
    started_at is after the long job ended, its claimed_at before, and its attempt's run
    time is its handler's, not the wait.

    Protection: the deadline counts from the handler's start (JobContext.mark_started),
    and the start is the thread's, carried with the outcome. Without it the job ends dead
    "timed out after 0.5 s" without having run, and its started_at is its claim."""
    blocker, release, started = block_one(tmp_path, tenant="big")
    short, _ = pgqueue.enqueue("test.noop", {}, tenant="small", timeout=0.5, max_attempts=1)
    worker = workers("--concurrency", "1", settings=HOLD_LONG)
    worker_id = worker.registered()
    wait_for(lambda: started.exists(), STARTUP, "the long job to start")
    wait_for(lambda: len(held(worker_id)) == 2, STARTUP, "the short job to be held ahead")
    wait_for(lambda: held_for(short.id) >= 1.5, STARTUP, "three timeouts' worth of waiting")
    assert Job.objects.get(pk=short.id).status == "running"  # held, not failed
    release.touch()
    wait_for(
        lambda: Job.objects.filter(pk=short.id, status="done").exists(), STARTUP, "the short job"
    )
    row, long_row = Job.objects.get(pk=short.id), Job.objects.get(pk=blocker)
    assert (row.status, row.attempts, row.last_error) == ("done", 1, None)
    assert history(short.id) == [(1, "done", worker_id)]
    assert row.claimed_at < long_row.finished_at <= row.started_at <= row.finished_at
    (attempt,) = JobAttempt.objects.filter(job_id=short.id)
    assert (attempt.claimed_at, attempt.started_at, attempt.finished_at) == (
        row.claimed_at,
        row.started_at,
        row.finished_at,
    )
    waited = (row.started_at - row.claimed_at).total_seconds()
    ran = (row.finished_at - row.started_at).total_seconds()
    assert waited >= 1.0 > ran
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(STARTUP) == 0


@pytest.mark.django_db(transaction=True)
def test_a_one_thread_drain_reads_back_in_run_order(workers: StartWorker) -> None:
    """Three tenants' jobs, each tenant's enqueued as one block, drained by one thread:
    ordered by started_at they are in fair order (vtime, then id: the tenants interleave),
    every start is distinct, and each job starts after the one before it finished.

    Protection: started_at and finished_at are the handler's, taken by the thread and
    carried with the outcome. Without it a claimed batch shares one started_at (the
    claim's) and one finished_at (the recording's), so the run order cannot be read back.
    """
    for tenant in "abc":
        pgqueue.enqueue_many("test.noop", [{}] * 20, tenant=tenant)
    worker = workers("--burst", "--concurrency", "1")
    assert worker.wait_exit(STARTUP) == 0
    rows = list(
        Job.objects.order_by("started_at").values("id", "tenant", "started_at", "finished_at")
    )
    assert len(rows) == 60
    assert len({r["started_at"] for r in rows}) == 60
    fair = list(Job.objects.order_by("vtime", "id").values_list("id", flat=True))
    assert [r["id"] for r in rows] == fair
    tenants = "".join(r["tenant"] for r in rows)
    assert tenants == "aa" + "bca" * 18 + "bcbc", tenants  # b and c arrived at a's second
    for before, after in itertools.pairwise(rows):
        assert before["started_at"] <= before["finished_at"] <= after["started_at"]


@pytest.mark.django_db(transaction=True)
def test_a_running_job_shows_its_start_before_it_ends(workers: StartWorker, tmp_path: Path) -> None:
    """A job that runs for more than a second has its started_at written while it runs
    (a heartbeat round), after its claim; the completion keeps that start."""
    blocker, release, started = block_one(tmp_path)
    worker = workers("--concurrency", "1", settings={"LEASE_SECONDS": 30})
    worker.registered()
    wait_for(lambda: started.exists(), STARTUP, "the job to start")
    row = wait_for(
        lambda: Job.objects.filter(pk=blocker, started_at__isnull=False).first(),
        10,
        "the running job's start to be written",
    )
    assert row.status == "running" and row.claimed_at <= row.started_at
    release.touch()
    wait_for(lambda: Job.objects.get(pk=blocker).status == "done", STARTUP, "the job to end")
    done = Job.objects.get(pk=blocker)
    assert abs((done.started_at - row.started_at).total_seconds()) < 0.02
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(STARTUP) == 0


def test_a_start_nobody_will_write_does_not_keep_the_loop_busy() -> None:
    """A job whose attempt the worker already ended (timed out, cancelled: settled) or
    lost, whose handler still runs, asks for no heartbeat round to write its start:
    those rounds skip it, so asking would turn the loop into a busy loop of rounds."""
    from pgqueue.worker.context import JobContext
    from pgqueue.worker.runtime import WorkerLoop

    loop = WorkerLoop(concurrency=1)
    ctx = JobContext(
        id=1,
        task="test.noop",
        payload={},
        tenant="acme",
        queue="default",
        priority=0,
        attempt=1,
        max_attempts=1,
        worker_id=loop.id,
        heartbeat=lambda timeout: None,
    )
    ctx.mark_started()
    loop.in_flight[ctx.id] = ctx
    assert loop._start_to_write() == ctx.began + loop.START_WRITE_SECONDS
    ctx.settled = True
    assert loop._start_to_write() == float("inf")
    ctx.settled = False
    ctx.mark_lost()
    assert loop._start_to_write() == float("inf")
