"""Failure handling: retries, backoff, dead jobs, lease expiry, fencing and rollbacks.

Time is injected, never slept. The lease tests run on a ``timeline()``: each claim,
heartbeat, completion, reap and promotion is given its moment (``now=at(N)``), so a lease
runs out exactly when the test says, however long the test takes. Elsewhere
``promote_due`` takes ``now=later(N)``: inside a test transaction PostgreSQL's ``now()``
is the transaction's start, so ``later(N)`` is always at least ``N`` seconds past it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.test import override_settings

import pgqueue
from pgqueue import services, store
from pgqueue.conf import pgqueue_settings
from pgqueue.models import FairClock, Job, JobAttempt, Tenant
from tests.conftest import claim, complete, fail, job, later, record_start, timeline

#: Far enough ahead that any backoff (at most BACKOFF_CAP = 300 s by default) is due.
BIG = 3600


def attempts_of(job_id: int) -> list[tuple[int, str, str]]:
    """The job's attempt history as ``(attempt, outcome, worker)``, oldest first."""
    return [
        (a.attempt, a.outcome, a.worker)
        for a in JobAttempt.objects.filter(job_id=job_id).order_by("id")
    ]


def reap(now: dt.datetime) -> dict[int, str]:
    with connection.cursor() as cur:
        return store.reap_expired(cur, now=now)


def promote(now: dt.datetime | None) -> list[int]:
    with connection.cursor() as cur:
        return store.promote_due(cur, now=now)


def heartbeat(
    worker: str,
    held: list[tuple[int, int]],
    lease_seconds: float,
    now: dt.datetime | None = None,
) -> set[int]:
    with connection.cursor() as cur:
        return store.heartbeat_many(
            cur, worker=worker, held=held, lease_seconds=lease_seconds, now=now
        )


def enqueue_one(**options: Any) -> int:
    created, _ = pgqueue.enqueue("test.noop", {"n": 1}, tenant="acme", **options)
    return created.id


# -- retries and dead ---------------------------------------------------------------------


def test_retries_until_dead_keeping_every_attempt(db: Any) -> None:
    """A job that fails on every attempt is retried until max_attempts, then dead.

    Proves the retry loop terminates (dead, not scheduled again, after exactly
    max_attempts), that the final failure is recorded on the job (finished_at,
    last_error) and that every attempt's error and traceback survive in the history.
    """
    job_id = enqueue_one(max_attempts=3)
    statuses = []
    for n in (1, 2, 3):
        (held,) = claim("w1", lease_seconds=30)
        assert (held.id, held.attempt) == (job_id, n)
        with connection.cursor() as cur:
            result = store.fail_many(
                cur,
                worker="w1",
                failures=[store.Failure(held.id, held.attempt, f"ValueError: {n}", f"tb {n}")],
            )
        statuses.append(result[job_id])
        if n < 3:
            assert job(job_id).finished_at is None
            assert promote(later(BIG)) == [job_id]

    assert statuses == ["scheduled", "scheduled", "dead"]
    dead = job(job_id)
    assert dead.status == "dead"
    assert dead.attempts == 3
    assert dead.finished_at is not None
    assert dead.last_error == "ValueError: 3"
    assert dead.lease_expires_at is None
    history = list(JobAttempt.objects.filter(job_id=job_id).order_by("attempt"))
    assert [(a.attempt, a.outcome, a.worker) for a in history] == [
        (1, "failed", "w1"),
        (2, "failed", "w1"),
        (3, "failed", "w1"),
    ]
    assert [(a.error, a.traceback) for a in history] == [
        ("ValueError: 1", "tb 1"),
        ("ValueError: 2", "tb 2"),
        ("ValueError: 3", "tb 3"),
    ]
    # Dead is final: nothing is due and nothing can be claimed.
    assert promote(later(BIG)) == []
    assert claim("w1") == []


def _delays(ids: list[int], attempt: int) -> list[float]:
    """Seconds from each failure to the retry's run_at.

    The attempt row's finished_at and the job's run_at are both set from ``now()`` by the
    same JOB_FAIL_MANY statement, so the difference is exactly the backoff drawn.
    """
    finished = dict(
        JobAttempt.objects.filter(job_id__in=ids, attempt=attempt).values_list(
            "job_id", "finished_at"
        )
    )
    run_at = dict(Job.objects.filter(id__in=ids).values_list("id", "run_at"))
    assert len(finished) == len(ids)
    return [(run_at[i] - finished[i]).total_seconds() for i in ids]


@override_settings(PGQUEUE={"BACKOFF_BASE": 2, "BACKOFF_CAP": 10})
def test_backoff_is_full_jitter_within_the_capped_window(db: Any) -> None:
    """Each retry waits random(0, min(cap, base * 2^(attempt-1))) seconds.

    200 jobs fail together in one fail_many per round, over five attempts (windows 2, 4,
    8, then 16 and 32 capped to 10). Every delay must lie in its window; the delays must
    differ (jitter exists) and spread over the whole window, from near 0 to near the top
    (full jitter, not a fixed or "equal jitter" delay). Once capped, delays exceed the
    previous window (the window did grow) but never the cap. Finally a job on attempt 99
    of 100, whose uncapped window would be 2^99 s, still waits at most the cap.
    """
    base, cap, tolerance = 2.0, 10.0, 0.001
    ids = pgqueue.enqueue_many("test.noop", list(range(200)), tenant="acme", max_attempts=6)
    for attempt in range(1, 6):
        held = claim("w1", limit=200, lease_seconds=30)
        assert sorted(h.id for h in held) == sorted(ids)
        assert {h.attempt for h in held} == {attempt}
        with connection.cursor() as cur:
            result = store.fail_many(
                cur,
                worker="w1",
                failures=[store.Failure(h.id, h.attempt, "RuntimeError: boom") for h in held],
            )
        assert set(result.values()) == {"scheduled"}
        window = min(cap, base * 2 ** (attempt - 1))
        delays = _delays(ids, attempt)
        assert min(delays) >= -tolerance, (attempt, min(delays))
        assert max(delays) <= window + tolerance, (attempt, max(delays), window)
        assert len({round(d, 6) for d in delays}) > 100, "delays are not jittered"
        assert min(delays) < window / 4, (attempt, min(delays))
        assert max(delays) > window * 3 / 4, (attempt, max(delays))
        if attempt >= 4:  # capped: 16 and 32 become 10, still beyond attempt 3's 8
            assert max(delays) > 8
        assert sorted(promote(later(BIG))) == sorted(ids)

    high = enqueue_one(max_attempts=100, queue="high")
    Job.objects.filter(id=high).update(attempts=98)
    (held,) = claim("w1", queues=("high",), lease_seconds=30)
    assert (held.id, held.attempt) == (high, 99)
    assert fail("w1", held) == "scheduled"
    (delay,) = _delays([high], 99)
    assert -tolerance <= delay <= cap + tolerance


def test_permanent_failure_is_dead_at_once(db: Any) -> None:
    """A permanent error (e.g. PermanentError raised by a handler) skips the retries.

    Attempt 1 of 5 failing permanently goes straight to dead with its error recorded; the
    remaining four attempts are not used and nothing is scheduled to run again.
    """
    job_id = enqueue_one(max_attempts=5)
    (held,) = claim("w1", lease_seconds=30)
    assert fail("w1", held, permanent=True) == "dead"
    dead = job(job_id)
    assert (dead.status, dead.attempts, dead.max_attempts) == ("dead", 1, 5)
    assert dead.finished_at is not None
    assert dead.last_error == "RuntimeError: boom"
    assert attempts_of(job_id) == [(1, "failed", "w1")]
    assert promote(later(BIG)) == []
    assert claim("w2") == []


# -- leases -------------------------------------------------------------------------------


def test_expired_lease_is_recovered_and_counted(db: Any) -> None:
    """A job whose worker vanished after its start was recorded is recovered once its
    lease runs out, not before, and the lost run counts as an attempt.

    Before expiry the reaper leaves it alone. After expiry the job goes back to
    scheduled with a backoff (not straight to queued), the lost run counts as attempt 1
    with a lease_expired row naming the worker and the run's start, and another worker
    then runs it as attempt 2 to completion.
    """
    at = timeline()
    job_id = enqueue_one(max_attempts=5)
    (held,) = claim("w1", lease_seconds=30, now=at(0))
    assert held.attempt == 1
    assert held.lease_expires_at == at(30)
    assert record_start("w1", held, now=at(1), lease_seconds=29)  # the lease still ends at 30

    assert reap(at(10)) == {}
    assert reap(at(30)) == {}  # expired means strictly past the lease's end
    assert job(job_id).status == "running"

    failure_time = at(60)
    assert reap(failure_time) == {job_id: "scheduled"}
    recovered = job(job_id)
    assert recovered.status == "scheduled"
    assert recovered.attempts == 1
    assert recovered.lease_expires_at is None
    assert recovered.run_at >= failure_time  # backoff counts from the injected now
    assert "lease expired" in recovered.last_error and "w1" in recovered.last_error
    assert attempts_of(job_id) == [(1, "lease_expired", "w1")]
    assert JobAttempt.objects.get(job_id=job_id).started_at == at(1)

    # Not due yet at the real now: the backoff is respected.
    assert promote(None) == []
    assert promote(at(BIG)) == [job_id]
    assert job(job_id).status == "queued"

    (again,) = claim("w2", lease_seconds=30, now=at(BIG))
    assert (again.id, again.attempt) == (job_id, 2)
    assert complete("w2", again, '{"ok": true}', now=at(BIG + 1))
    done = job(job_id)
    assert (done.status, done.attempts, done.result) == ("done", 2, {"ok": True})
    assert attempts_of(job_id) == [(1, "lease_expired", "w1"), (2, "done", "w2")]


def _expire_and_requeue(
    worker: str, held: store.ClaimedJob, at: Callable[[float], dt.datetime]
) -> None:
    """Record the start of the job ``worker`` claimed at ``at(0)``, reap its lease (an
    attempt spent) and make it runnable again by ``at(2 * BIG)``."""
    assert record_start(worker, held, now=at(1))
    assert reap(at(BIG)) == {held.id: "scheduled"}
    assert promote(at(2 * BIG)) == [held.id]


def test_stale_worker_is_fenced_out(db: Any) -> None:
    """A worker whose lease was lost cannot write to the job any more.

    Worker A stalls past its lease; the job is reaped and worker B claims attempt 2.
    A's late complete, fail and heartbeat all match nothing and change nothing (no status
    change, no attempt row, B's lease untouched), while B's completion is recorded.
    """
    at = timeline()
    job_id = enqueue_one(max_attempts=5)
    (stale,) = claim("A", lease_seconds=30, now=at(0))
    _expire_and_requeue("A", stale, at)
    (current,) = claim("B", lease_seconds=30, now=at(2 * BIG))
    assert (current.id, current.attempt) == (job_id, 2)
    before = job(job_id)

    late = at(2 * BIG + 10)  # within B's lease
    assert complete("A", stale, '"late"', now=late) is False
    assert fail("A", stale, now=late) is None
    assert fail("A", stale, permanent=True, now=late) is None
    assert heartbeat("A", [(stale.id, stale.attempt)], lease_seconds=300, now=late) == set()
    # Even naming B's attempt number does not help A: the lease owner is checked too.
    assert heartbeat("A", [(current.id, current.attempt)], lease_seconds=300, now=late) == set()

    after = job(job_id)
    assert (after.status, after.attempts, after.lease_owner) == ("running", 2, "B")
    assert after.lease_expires_at == before.lease_expires_at
    assert after.result is None and after.last_error == before.last_error
    assert attempts_of(job_id) == [(1, "lease_expired", "A")]

    assert complete("B", current, '"fresh"', now=late)
    done = job(job_id)
    assert (done.status, done.result) == ("done", "fresh")
    assert attempts_of(job_id) == [(1, "lease_expired", "A"), (2, "done", "B")]


def test_same_worker_on_a_later_attempt_is_fenced_by_attempt_number(db: Any) -> None:
    """The fence includes the attempt, not only the worker id.

    Worker A loses attempt 1 and later claims the same job again as attempt 2. A write
    for attempt 1 (a leftover from the first run) is rejected even though A is the lease
    owner; writes for attempt 2 are accepted.
    """
    at = timeline()
    job_id = enqueue_one(max_attempts=5)
    (first,) = claim("A", lease_seconds=30, now=at(0))
    _expire_and_requeue("A", first, at)
    (second,) = claim("A", lease_seconds=30, now=at(2 * BIG))
    assert (second.id, second.attempt, first.attempt) == (job_id, 2, 1)

    late = at(2 * BIG + 10)  # within the second lease
    assert heartbeat("A", [(job_id, 1)], lease_seconds=300, now=late) == set()
    assert complete("A", first, '"from attempt 1"', now=late) is False
    assert fail("A", first, now=late) is None
    assert job(job_id).status == "running"

    assert heartbeat("A", [(job_id, 2)], lease_seconds=300, now=late) == {job_id}
    assert complete("A", second, '"from attempt 2"', now=late)
    done = job(job_id)
    assert (done.status, done.attempts, done.result) == ("done", 2, "from attempt 2")
    assert attempts_of(job_id) == [(1, "lease_expired", "A"), (2, "done", "A")]


def test_job_that_crashes_every_worker_ends_dead(db: Any) -> None:
    """A poison job that kills its worker every time does not loop forever.

    Each lease expiry of a run whose start was recorded counts as an attempt, so after
    max_attempts=3 expiries the reaper marks it dead (with three lease_expired rows) and
    it is never claimed again.
    """
    at = timeline()
    job_id = enqueue_one(max_attempts=3)
    for n in (1, 2, 3):
        start = 3 * BIG * (n - 1)  # each run starts after the previous one was promoted
        (held,) = claim(f"w{n}", lease_seconds=30, now=at(start))
        assert (held.id, held.attempt) == (job_id, n)
        assert record_start(f"w{n}", held, now=at(start + 1))
        reaped = reap(at(start + BIG))
        assert reaped == {job_id: "scheduled" if n < 3 else "dead"}
        promote(at(start + 2 * BIG))

    dead = job(job_id)
    assert (dead.status, dead.attempts) == ("dead", 3)
    assert dead.finished_at is not None
    assert "lease expired" in dead.last_error
    assert attempts_of(job_id) == [
        (1, "lease_expired", "w1"),
        (2, "lease_expired", "w2"),
        (3, "lease_expired", "w3"),
    ]
    assert claim("w4", now=at(9 * BIG)) == []
    assert reap(at(10 * BIG)) == {}


def test_heartbeat_keeps_a_long_job_leased(db: Any) -> None:
    """Heartbeats extend a lease, so a slow but alive job is not taken away.

    Two jobs are claimed with a 30 s lease; only the first is heartbeated, 20 s later
    (to 300 s from then). 120 s after the claim the reaper recovers the silent one and
    leaves the heartbeated one running, and its worker can still complete it.
    """
    at = timeline()
    long_id = enqueue_one(max_attempts=5)
    silent_id = enqueue_one(max_attempts=5)
    held = {h.id: h for h in claim("w1", limit=2, lease_seconds=30, now=at(0))}
    assert set(held) == {long_id, silent_id}
    lease_before = job(long_id).lease_expires_at
    assert lease_before == at(30)

    beat = heartbeat("w1", [(long_id, held[long_id].attempt)], lease_seconds=300, now=at(20))
    assert beat == {long_id}
    assert job(long_id).lease_expires_at > lease_before
    assert job(long_id).lease_expires_at == at(320)

    # The silent one never started: given back, queued again without spending an attempt.
    assert reap(at(120)) == {silent_id: "queued"}
    assert job(long_id).status == "running"
    assert (job(silent_id).status, job(silent_id).attempts) == ("queued", 0)

    assert complete("w1", held[long_id], now=at(121))
    assert complete("w1", held[silent_id], now=at(121)) is False
    assert job(long_id).status == "done"
    assert attempts_of(long_id) == [(1, "done", "w1")]
    assert attempts_of(silent_id) == [(1, "lease_expired", "w1")]


# -- leases lost before a start was recorded ------------------------------------------------


def test_a_crashed_workers_unstarted_jobs_are_given_back_without_an_attempt(db: Any) -> None:
    """A worker that dies takes with it the jobs it claimed ahead: those never started.

    One claim leases a job of tenant "evil", whose handler starts (its start recorded, as
    the heartbeat writes it) and then ends the process, and a job of tenant "acme" that
    waited, unstarted, for a thread. Once the lease has run out, the reaper charges evil's
    job an attempt (scheduled, with backoff), but gives acme's back as a stopping worker
    would: queued at once, attempts back to 0, its vtime and both tenants' fair clocks as
    they were, so it runs before acme's job enqueued after it. Its lost lease is in the
    history (started_at NULL, the error says no attempt was spent) and in lost_claims; the
    run that follows is attempt 1 again. On the code before this, acme's job was charged
    the attempt and waited out a backoff as evil's did.
    """
    at = timeline()
    evil_id = pgqueue.enqueue("test.noop", {}, tenant="evil")[0].id
    victim_id = pgqueue.enqueue("test.noop", {"n": 1}, tenant="acme")[0].id
    later_id = pgqueue.enqueue("test.noop", {"n": 2}, tenant="acme")[0].id
    held = {h.id: h for h in claim("w1", limit=2, lease_seconds=30, now=at(0))}
    assert set(held) == {evil_id, victim_id}
    assert record_start("w1", held[evil_id], now=at(1), lease_seconds=29)
    before = job(victim_id)
    clocks = sorted(FairClock.objects.values_list("tenant_id", "queue", "priority", "vtime"))

    assert reap(at(BIG)) == {evil_id: "scheduled", victim_id: "queued"}

    charged = job(evil_id)
    assert (charged.status, charged.attempts, charged.lost_claims) == ("scheduled", 1, 0)
    victim = job(victim_id)
    assert (victim.status, victim.attempts, victim.lost_claims) == ("queued", 0, 1)
    assert (victim.vtime, victim.run_at) == (before.vtime, before.run_at)
    assert (victim.lease_owner, victim.lease_expires_at) == (None, None)
    assert (victim.claimed_at, victim.started_at, victim.finished_at) == (None, None, None)
    assert victim.last_error == (
        "lease expired: worker w1 stopped renewing it before its start was recorded; given"
        " back without spending an attempt (lost claim 1 of MAX_LOST_CLAIMS = 10)"
    )
    assert sorted(FairClock.objects.values_list("tenant_id", "queue", "priority", "vtime")) == (
        clocks
    )
    lost = JobAttempt.objects.get(job_id=victim_id)
    assert (lost.attempt, lost.outcome, lost.worker) == (1, "lease_expired", "w1")
    assert (lost.claimed_at, lost.started_at, lost.error) == (at(0), None, victim.last_error)
    assert JobAttempt.objects.get(job_id=evil_id).started_at == at(1)

    # Runnable at once, at its place: before acme's later job.
    (again,) = claim("w2", limit=1, lease_seconds=30, now=at(BIG))
    assert (again.id, again.attempt) == (victim_id, 1)
    assert complete("w2", again, '"ok"', now=at(BIG + 1))
    assert (job(victim_id).status, job(victim_id).attempts) == ("done", 1)
    assert attempts_of(victim_id) == [(1, "lease_expired", "w1"), (1, "done", "w2")]
    assert job(later_id).status == "queued"


@override_settings(PGQUEUE={"MAX_LOST_CLAIMS": 3})
def test_a_job_whose_worker_is_lost_before_its_start_every_time_ends_dead(db: Any) -> None:
    """Giving back unstarted jobs for free must not let a poison job loop for ever.

    A handler that ends its process before its start is written (within about a second)
    is never seen to start. Each loss is given back without an attempt but counted in
    lost_claims; the MAX_LOST_CLAIMS-th makes the job dead, with the reason, and it is
    never claimed again. An operator's retry starts both counts again.
    """
    at = timeline()
    job_id = enqueue_one(max_attempts=5)
    statuses = []
    for n in (1, 2, 3):
        start = 2 * BIG * (n - 1)
        (held,) = claim(f"w{n}", lease_seconds=30, now=at(start))
        assert (held.id, held.attempt) == (job_id, 1)
        statuses.append(reap(at(start + BIG))[job_id])
    assert statuses == ["queued", "queued", "dead"]

    dead = job(job_id)
    assert (dead.status, dead.attempts, dead.lost_claims) == ("dead", 0, 3)
    assert dead.finished_at == at(4 * BIG + BIG)
    assert dead.last_error == (
        "lease expired: its worker was lost 3 times before its start was recorded"
        " (MAX_LOST_CLAIMS = 3); the last, w3, stopped renewing it"
    )
    assert attempts_of(job_id) == [
        (1, "lease_expired", "w1"),
        (1, "lease_expired", "w2"),
        (1, "lease_expired", "w3"),
    ]
    assert claim("w4", now=at(9 * BIG)) == []
    assert reap(at(10 * BIG)) == {}

    assert services.retry_jobs([job_id]).changed == [job_id]
    retried = job(job_id)
    assert (retried.status, retried.attempts, retried.lost_claims) == ("queued", 0, 0)


def test_a_job_counts_its_lost_claims_and_its_attempts_apart(db: Any) -> None:
    """Lost claims and attempts are two counts: a job given back once and then failing
    after its start was recorded has spent one attempt and lost one claim, and its next
    lease lost after a recorded start spends the second attempt."""
    at = timeline()
    job_id = enqueue_one(max_attempts=2)
    claim("w1", lease_seconds=30, now=at(0))
    assert reap(at(BIG)) == {job_id: "queued"}
    (second,) = claim("w2", lease_seconds=30, now=at(BIG))
    assert second.attempt == 1
    assert record_start("w2", second, now=at(BIG + 1))
    assert reap(at(2 * BIG)) == {job_id: "scheduled"}
    assert promote(at(4 * BIG)) == [job_id]
    (third,) = claim("w3", lease_seconds=30, now=at(4 * BIG))
    assert third.attempt == 2
    assert record_start("w3", third, now=at(4 * BIG + 1))
    assert reap(at(5 * BIG)) == {job_id: "dead"}
    dead = job(job_id)
    assert (dead.attempts, dead.lost_claims) == (2, 1)
    assert dead.last_error == "lease expired: worker w3 stopped renewing it (attempt 2)"
    assert attempts_of(job_id) == [
        (1, "lease_expired", "w1"),
        (1, "lease_expired", "w2"),
        (2, "lease_expired", "w3"),
    ]
    started = JobAttempt.objects.filter(job_id=job_id).order_by("id")
    assert [a.started_at for a in started] == [None, at(BIG + 1), at(4 * BIG + 1)]


@pytest.mark.django_db(transaction=True)
def test_a_job_given_back_by_the_reaper_wakes_its_queue() -> None:
    """The reaper's give-back notifies the job's queue on commit, as a stopping worker's
    does, so an idle worker takes it at once rather than at its next poll. Read up to a
    sentinel sent after it (notifications arrive in commit order): no fixed wait."""
    channel = pgqueue_settings.NOTIFY_CHANNEL
    at = timeline()
    job_id = pgqueue.enqueue("test.noop", {}, tenant="acme", queue="lost-q")[0].id
    claim("w1", queues=("lost-q",), lease_seconds=30, now=at(0))
    with _listener() as listener:
        listener.execute(f"LISTEN {channel}")
        assert reap(at(BIG)) == {job_id: "queued"}
        with connection.cursor() as cur:
            cur.execute("SELECT pg_notify(%s, 'sentinel')", [channel])
        received = []
        for note in listener.notifies(timeout=10):
            if note.payload == "sentinel":
                break
            received.append((note.channel, note.payload))
    assert received == [(channel, "lost-q")]


# -- rollback -----------------------------------------------------------------------------


class Boom(Exception):
    pass


def _clock(tenant: str, queue: str) -> list[float]:
    return list(
        FairClock.objects.filter(tenant_id=tenant, queue=queue).values_list("vtime", flat=True)
    )


def test_rolled_back_enqueue_charges_no_virtual_time(db: Any) -> None:
    """An enqueue rolled back with its transaction leaves no job and no clock change.

    For an existing tenant the fair clock keeps its value, so the next real enqueue gets
    the vtime right after the last one (no gap the tenant would be penalised for); for a
    brand new tenant and queue there is no tenant row and no clock row at all.
    """
    first = enqueue_one()
    clock_before = _clock("acme", "default")
    assert clock_before == [job(first).vtime]

    with pytest.raises(Boom), transaction.atomic():
        enqueue_one()
        pgqueue.enqueue_many("test.noop", [1, 2, 3], tenant="acme")
        pgqueue.enqueue("test.noop", 1, tenant="ghost", queue="ghost-q")
        pgqueue.enqueue_many("test.noop", [1, 2], tenant="ghost", queue="ghost-q")
        raise Boom

    assert list(Job.objects.values_list("id", flat=True)) == [first]
    assert _clock("acme", "default") == clock_before
    assert not Tenant.objects.filter(name="ghost").exists()
    assert not FairClock.objects.filter(queue="ghost-q").exists()

    second = enqueue_one()
    assert job(second).vtime == job(first).vtime + 1


def _listener() -> psycopg.Connection[Any]:
    s = connection.settings_dict
    params = {
        "dbname": s["NAME"],
        "user": s["USER"] or None,
        "password": s["PASSWORD"] or None,
        "host": s["HOST"] or None,
        "port": s["PORT"] or None,
    }
    return psycopg.connect(autocommit=True, **{k: v for k, v in params.items() if v})


@pytest.mark.django_db(transaction=True)
def test_rolled_back_enqueue_wakes_no_worker() -> None:
    """A rolled-back enqueue sends no NOTIFY, leaves no rows; a committed one notifies.

    A separate connection LISTENs on the channel. The rolled-back enqueue (queue
    "ghost-q") is followed by a committed control enqueue ("control-q") and then a
    sentinel notification. Notifications arrive in commit order, so reading up to the
    sentinel sees everything sent before it without a fixed wait: exactly the control's,
    whose arrival proves the listener works.
    """
    channel = pgqueue_settings.NOTIFY_CHANNEL
    with _listener() as listener:
        listener.execute(f"LISTEN {channel}")

        with pytest.raises(Boom), transaction.atomic():
            pgqueue.enqueue("test.noop", 1, tenant="ghost", queue="ghost-q")
            pgqueue.enqueue_many("test.noop", [1, 2, 3], tenant="ghost", queue="ghost-q")
            raise Boom

        assert not Job.objects.exists()
        assert not Tenant.objects.filter(name="ghost").exists()
        assert not FairClock.objects.exists()

        control, created = pgqueue.enqueue("test.noop", 1, tenant="real", queue="control-q")
        assert created
        with connection.cursor() as cur:
            cur.execute("SELECT pg_notify(%s, 'sentinel')", [channel])

        received = []
        for note in listener.notifies(timeout=10):
            if note.payload == "sentinel":
                break
            received.append((note.channel, note.payload))
        else:
            pytest.fail(f"sentinel not received within the timeout; got {received}")

    assert received == [(channel, "control-q")]
    assert list(Job.objects.values_list("id", flat=True)) == [control.id]
    assert not Tenant.objects.filter(name="ghost").exists()
    assert not FairClock.objects.filter(queue="ghost-q").exists()


# -- operator actions ---------------------------------------------------------------------


def test_cancel_and_retry_services(db: Any) -> None:
    """Operators can cancel waiting jobs and retry dead ones, and nothing else.

    Cancel: a queued job becomes cancelled (and is never claimed); a running job is asked
    to stop (it stays running, its cancel_requested_at set, until its worker ends it).
    Retry: a dead job restarts from attempt 0 with a fresh fair vtime and
    keeps its history; a done job cannot be retried; unknown ids raise JobNotFound.
    run_jobs_now makes a delayed job runnable at once.
    """
    queued = enqueue_one()
    cancelled = services.cancel(queued)
    assert cancelled.status == "cancelled" and cancelled.finished_at is not None

    running = enqueue_one(max_attempts=5)
    (held,) = claim("w1", lease_seconds=30)
    assert held.id == running
    asked = services.cancel(running)
    assert (asked.status, asked.cancel_requested_at is not None) == ("running", True)
    assert job(running).status == "running"
    Job.objects.filter(id=running).update(cancel_requested_at=None)  # the rest: no request

    # Make it dead (permanent failure), then retry it.
    assert fail("w1", held, permanent=True) == "dead"
    old_vtime = job(running).vtime
    retried = services.retry(running)
    assert (retried.status, retried.attempts) == ("queued", 0)
    assert retried.vtime is not None and retried.vtime > old_vtime
    assert retried.finished_at is None and retried.lease_owner is None
    assert attempts_of(running) == [(1, "failed", "w1")]
    (again,) = claim("w2", lease_seconds=30)
    assert (again.id, again.attempt) == (running, 1)
    assert complete("w2", again)
    assert attempts_of(running) == [(1, "failed", "w1"), (1, "done", "w2")]

    with pytest.raises(pgqueue.InvalidTransition) as exc:
        services.retry(running)
    assert exc.value.status == "done"
    with pytest.raises(pgqueue.JobNotFound):
        services.retry(10**12)
    with pytest.raises(pgqueue.JobNotFound):
        services.cancel(10**12)

    delayed = enqueue_one(delay=3600)
    assert job(delayed).status == "scheduled"
    assert claim("w3") == []
    result = services.run_jobs_now([delayed])
    assert result.changed == [delayed] and result.skipped == {}
    now_queued = job(delayed)
    assert now_queued.status == "queued" and now_queued.vtime is not None
    (held,) = claim("w3", lease_seconds=30)
    assert held.id == delayed


def test_the_steady_state_statement_runs_on_the_injected_clock(db: Any) -> None:
    """complete_and_claim records and claims at the ``now`` it is given.

    The finished job's finished_at (and its attempt row's) is that moment (no handler
    times given: the attempt is taken to run from its claim), and the new lease runs from
    it: the reaper leaves the job alone until the lease's end and takes it just after.
    """
    at = timeline()
    first_id, second_id = enqueue_one(), enqueue_one()
    (first,) = claim("w1", lease_seconds=30, now=at(0))
    with connection.cursor() as cur:
        recorded, claimed = store.complete_and_claim(
            cur,
            worker="w1",
            results=[(first.id, first.attempt, None)],
            queues=["default"],
            limit=1,
            lease_seconds=30,
            now=at(5),
        )
    assert recorded == {first_id}
    assert [(c.id, c.lease_expires_at) for c in claimed] == [(second_id, at(35))]
    done = job(first_id)
    assert (done.status, done.started_at, done.finished_at) == ("done", at(0), at(5))
    (attempt,) = JobAttempt.objects.filter(job_id=first_id)
    assert (attempt.started_at, attempt.finished_at) == (at(0), at(5))
    assert (job(second_id).claimed_at, job(second_id).started_at) == (at(5), None)
    assert reap(at(35)) == {}
    assert reap(at(36)) == {second_id: "queued"}  # no start recorded: given back


def test_a_handlers_reported_times_are_kept_within_what_the_database_saw(db: Any) -> None:
    """A worker states its handler's start and end in the database's clock from its own
    estimate of that clock, which can be off by part of a round trip. What is recorded
    stays true: a start no earlier than the claim, an end no later than the statement that
    records it, for a success and for a failure (whose retry waits from that end).

    Protection: the LEAST/GREATEST bounds of JOB_COMPLETE_MANY and JOB_FAIL_MANY. Without
    the end's bound the reported hour ahead is stored, and an attempt seems to run past
    the claim of the job that took its slot."""
    ids = pgqueue.enqueue_many("test.noop", [1, 2], tenant="acme", max_attempts=3)
    done_id, failed_id = ids
    with connection.cursor() as cur:
        held = {j.id: j for j in store.claim(cur, worker="w1", queues=["default"], limit=2)}
        assert set(held) == set(ids)
        cur.execute("SELECT clock_timestamp()")
        (before,) = cur.fetchone()
        early, late = before - dt.timedelta(hours=1), before + dt.timedelta(hours=1)
        done = store.Success(done_id, held[done_id].attempt, None, started=early, finished=late)
        assert store.complete_many(cur, worker="w1", results=[done]) == {done_id}
        failure = store.Failure(
            failed_id, held[failed_id].attempt, "E: x", started=early, finished=late
        )
        assert store.fail_many(cur, worker="w1", failures=[failure]) == {failed_id: "scheduled"}
        cur.execute("SELECT clock_timestamp()")
        (after,) = cur.fetchone()
    for attempt in JobAttempt.objects.filter(job_id__in=ids):
        assert attempt.started_at == attempt.claimed_at, attempt.job_id
        assert before <= attempt.finished_at <= after, attempt.job_id
    job = Job.objects.get(pk=failed_id)
    ended = JobAttempt.objects.get(job_id=failed_id).finished_at
    assert ended <= job.run_at <= ended + dt.timedelta(seconds=1)  # BACKOFF_BASE, attempt 1
