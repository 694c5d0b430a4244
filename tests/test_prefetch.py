"""The look-ahead (``PGQUEUE["PREFETCH"]``, ``runworker --prefetch``), with real workers.

A worker holds up to ``concurrency + prefetch`` jobs: those beyond its busy threads wait
unstarted in the process, leased like the running ones; once jobs have finished, it claims
ahead only what its threads run in about ``PGQUEUE["PREFETCH_SECONDS"]``. These tests hold
the one thread of a worker with a ``test.block`` job and look at what the worker holds
meanwhile: how many, whether their leases are renewed, and what becomes of them on SIGTERM.
"""

from __future__ import annotations

import itertools
import signal
from pathlib import Path

import pytest
from django.test import override_settings

import pgqueue
from pgqueue import checks
from pgqueue.conf import DEFAULTS
from pgqueue.models import Job
from pgqueue.worker.lookahead import LookAhead
from tests.workers import STARTUP, StartWorker, history, wait_for

FAST = {"LEASE_SECONDS": 3, "HEARTBEAT_SECONDS": 0.5, "POLL_SECONDS": 0.2}


def held(worker_id: str) -> list[Job]:
    return list(Job.objects.filter(status="running", lease_owner=worker_id).order_by("id"))


def block_one(tmp_path: Path) -> tuple[int, Path, Path]:
    """Enqueue a job that runs until its release file exists; returns its id and files."""
    release, started = tmp_path / "release", tmp_path / "started"
    job, _ = pgqueue.enqueue(
        "test.block", {"release": str(release), "started": str(started)}, tenant="acme"
    )
    return job.id, release, Path(f"{started}.1")


@pytest.mark.django_db(transaction=True)
def test_prefetched_jobs_are_leased_heartbeated_and_given_back_on_sigterm(
    workers: StartWorker, tmp_path: Path
) -> None:
    """With one thread busy, the worker holds 3 more jobs; SIGTERM gives those back.

    The prefetched jobs are the worker's in the database (running, its lease) and their
    leases are renewed by the heartbeat while they wait, as the running job's is. On
    SIGTERM they are queued again at once with the attempt not counted (no attempt row);
    the job in hand finishes and is recorded; nothing is lost. Fails if the release of
    claimed-but-unstarted jobs does not reach the jobs waiting in the executor's queue
    (they would run before the worker exits) or if the heartbeat skipped them (their
    leases would expire and maintenance would reap them as failed attempts).
    """
    blocker, release, started = block_one(tmp_path)
    ahead = pgqueue.enqueue_many("test.noop", [{}] * 5, tenant="acme")
    worker = workers("--concurrency", "1", "--prefetch", "3", settings=FAST)
    worker_id = worker.registered()
    wait_for(lambda: started.exists(), STARTUP, "the blocking job to start")
    wait_for(lambda: len(held(worker_id)) == 4, STARTUP, "the worker to hold 1 + 3 jobs")
    jobs = held(worker_id)
    assert jobs[0].id == blocker
    prefetched = [j.id for j in jobs[1:]]
    assert set(prefetched) <= set(ahead)
    assert Job.objects.filter(status="queued").count() == 2  # 5 - 3: held back, not claimed

    first = {j.id: j.lease_expires_at for j in jobs}
    wait_for(
        lambda: all(j.lease_expires_at > first[j.id] for j in held(worker_id)),
        STARTUP,
        "every held lease to be renewed",
    )
    assert len(held(worker_id)) == 4  # past several heartbeats, none expired or reaped

    worker.send(signal.SIGTERM)
    wait_for(
        lambda: Job.objects.filter(id__in=prefetched, status="queued").count() == 3,
        STARTUP,
        "the prefetched jobs to be given back",
    )
    release.touch()
    assert worker.wait_exit(STARTUP) == 0
    for job in Job.objects.filter(id__in=prefetched):
        assert (job.status, job.attempts, job.lease_owner, job.started_at) == (
            "queued",
            0,
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
    worker = workers("--concurrency", "1", "--prefetch", "0", settings=FAST)
    worker_id = worker.registered()
    wait_for(lambda: started.exists(), STARTUP, "the blocking job to start")
    # Several polls and heartbeats go by: none of them claims while the thread is busy.
    jobs = held(worker_id)
    first = jobs[0].lease_expires_at
    wait_for(lambda: held(worker_id)[0].lease_expires_at > first, STARTUP, "a heartbeat to pass")
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
    worker = workers("--concurrency", "1", "--prefetch", "3", settings=FAST)
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
    """The whole cap until a job has finished; then as many jobs as the threads run in
    ``PREFETCH_SECONDS`` at the mean run time, at least one and at most the cap; 0 stays 0."""
    horizon = DEFAULTS["PREFETCH_SECONDS"]
    ahead = LookAhead(32, threads=8, horizon=horizon)
    assert ahead.size == 32  # nothing known yet
    ahead.observe([])
    assert ahead.size == 32
    ahead.observe([horizon / 1000] * 50)  # no-op jobs: the cap
    assert ahead.size == 32
    for _ in range(400):  # jobs of 0.3 horizons: 8 threads run 26 of them in one
        ahead.observe([0.3 * horizon])
    assert ahead.size == 26
    for _ in range(400):  # long jobs: one ahead, not 32 jobs of seconds each
        ahead.observe([100 * horizon])
    assert ahead.size == 1
    off = LookAhead(0, threads=8, horizon=horizon)
    off.observe([horizon / 1000] * 50)
    assert off.size == 0
    wide = LookAhead(32, threads=8, horizon=10 * horizon)
    wide.observe([10 * horizon] * 400)  # each thread runs one job in the horizon
    assert wide.size == 8


@pytest.mark.parametrize("value", [-0.001, "0.005", None])
def test_prefetch_seconds_must_be_a_number_of_at_least_zero(value: object) -> None:
    with override_settings(PGQUEUE={"PREFETCH_SECONDS": value}):
        errors = checks.check_settings()
    assert [e.id for e in errors] == ["pgqueue.E003"]
    assert "PREFETCH_SECONDS" in errors[0].msg


@pytest.mark.django_db(transaction=True)
def test_after_long_jobs_the_worker_claims_one_ahead(workers: StartWorker, tmp_path: Path) -> None:
    """Once the worker has run a job far longer than the look-ahead's horizon, it claims
    one job ahead of its busy thread, not all of ``--prefetch``: a job of another tenant
    never waits behind several long jobs claimed ahead. Fails if the look-ahead ignores the
    jobs' run times (the worker would hold 1 + 3)."""
    first = pgqueue.enqueue("test.sleep", {"seconds": 0.2}, tenant="acme")[0].id
    worker = workers("--concurrency", "1", "--prefetch", "3", settings=FAST)
    worker_id = worker.registered()
    wait_for(lambda: Job.objects.filter(pk=first, status="done").exists(), STARTUP, "the first job")
    blocker, release, started = block_one(tmp_path)
    ahead = pgqueue.enqueue_many("test.noop", [{}] * 5, tenant="acme")
    wait_for(lambda: started.exists(), STARTUP, "the blocking job to start")
    wait_for(lambda: len(held(worker_id)) == 2, STARTUP, "the worker to hold 1 + 1 jobs")
    lease = {j.id: j.lease_expires_at for j in held(worker_id)}
    wait_for(
        lambda: all(j.lease_expires_at > lease[j.id] for j in held(worker_id)),
        STARTUP,
        "a heartbeat to pass",
    )
    jobs = held(worker_id)  # several polls later: still one ahead
    assert [j.id for j in jobs] == [blocker, ahead[0]]
    assert Job.objects.filter(status="queued").count() == 4
    release.touch()
    wait_for(
        lambda: Job.objects.filter(status="done").count() == 7, STARTUP, "every job to be done"
    )
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(STARTUP) == 0
