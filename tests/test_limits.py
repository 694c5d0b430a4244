"""Caps, rate limits and pause, in the claim statement itself (in-process claims).

The worker tests (tests/test_limits_workers.py) show the same with real workers and races.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection

import pgqueue
from pgqueue import claim_store, limits, store
from pgqueue.limit_models import Limit
from pgqueue.limit_reads import waiting_for
from pgqueue.models import Job
from pgqueue.worker.maintenance import recount_limits
from tests.conftest import claim, complete, fail, job, record_start, run_threads, timeline

pytestmark = pytest.mark.django_db


def enqueue(n: int, tenant: str, queue: str = "default") -> list[int]:
    return pgqueue.enqueue_many(
        "test.noop", [{"i": i} for i in range(n)], tenant=tenant, queue=queue
    )


def running_counter(queue: str = "", tenant: str = "") -> int:
    return Limit.objects.get(queue=queue, tenant=tenant).running


def test_a_tenant_cap_holds_its_jobs_back_in_order_and_frees_a_slot_per_exit():
    limits.set_tenant_limits("capped", max_running=2)
    ids = enqueue(5, "capped")
    other = enqueue(3, "free")
    first = claim(limit=10)
    taken = [j.id for j in first if j.tenant == "capped"]
    assert taken == ids[:2]  # the cap, in its order
    assert {j.id for j in first if j.tenant == "free"} == set(other)
    assert running_counter(tenant="capped") == 2
    assert claim(limit=10) == []  # at the cap: nothing more
    capped = [j for j in first if j.tenant == "capped"]
    assert complete("w1", capped[0])
    assert [j.id for j in claim(limit=10)] == [ids[2]]  # the next of the tenant
    assert fail("w1", capped[1], permanent=True) == "dead"
    assert [j.id for j in claim(limit=10)] == [ids[3]]
    assert running_counter(tenant="capped") == 2


def test_a_queue_tenant_limit_narrows_the_tenants_and_a_queue_cap_covers_every_tenant():
    limits.set_tenant_limits("t", max_running=3)
    limits.set_tenant_limits("t", queue="q", max_running=1)
    enqueue(3, "t", "q")
    enqueue(3, "t", "default")
    assert len(claim(limit=10, queues=("q",))) == 1
    assert len(claim(limit=10, queues=("default", "q"))) == 2  # 3 for the tenant in all
    limits.set_queue_limits("shared", max_running=2)
    enqueue(2, "a", "shared")
    enqueue(2, "b", "shared")
    assert len(claim(limit=10, queues=("shared",))) == 2
    assert claim(limit=10, queues=("shared",)) == []
    assert running_counter(queue="shared") == 2


def test_jobs_queued_before_the_limit_are_gated_and_removing_it_ungates_them():
    ids = enqueue(4, "late")
    limits.set_tenant_limits("late", max_running=1)
    assert Job.objects.filter(id__in=ids, gated=True).count() == 4
    assert [j.id for j in claim(limit=10)] == ids[:1]
    limits.set_tenant_limits("late", max_running=None)
    assert Job.objects.filter(id__in=ids, status="queued", gated=True).count() == 0
    assert [j.id for j in claim(limit=10)] == ids[1:]


def test_a_stale_ungated_job_met_by_the_claim_is_counted_in_its_limits():
    """A job left in the claim index after its tenant was limited (an enqueue whose
    transaction was open as the limit was set) is counted in the tenant's rows like a gated
    one: the cap holds, and the next starts once a slot is free."""
    ids = enqueue(3, "stale")
    limits.set_tenant_limits("stale", max_running=1)
    Job.objects.filter(id__in=ids).update(gated=False)  # as if queued in a race with the limit
    got = claim(limit=10)
    assert [j.id for j in got] == ids[:1] and got[0].limit_ids
    assert claim(limit=10) == []
    assert complete("w1", got[0])
    assert [j.id for j in claim(limit=10)] == ids[1:2]


def test_lowering_a_cap_below_running_starts_nothing_until_below():
    limits.set_tenant_limits("t", max_running=3)
    enqueue(6, "t")
    held = claim(limit=10)
    assert len(held) == 3
    limits.set_tenant_limits("t", max_running=1)
    assert claim(limit=10) == []
    complete("w1", held[0])
    assert claim(limit=10) == []  # 2 running, cap 1
    complete("w1", held[1])
    complete("w1", held[2])
    assert len(claim(limit=10)) == 1


def test_pause_and_resume_a_queue_and_a_tenant():
    limits.pause_queue("default")
    enqueue(2, "a")
    assert claim(limit=10) == []
    assert waiting_for(Job.objects.filter(tenant_id="a").first())["waiting_for"] == "paused"
    limits.resume_queue("default")
    assert len(claim(limit=10)) == 2
    limits.pause_tenant("b")
    enqueue(2, "b")
    enqueue(1, "c")
    assert [j.tenant for j in claim(limit=10)] == ["c"]
    limits.resume_tenant("b")
    assert [j.tenant for j in claim(limit=10)] == ["b", "b"]


def test_a_rate_limit_spends_tokens_and_refills_them_with_time():
    at = timeline()
    limits.set_tenant_limits("r", rate_limit="20/s")  # burst 2
    enqueue(10, "r")
    assert len(claim(limit=10, now=at(0))) == 2  # the burst
    assert claim(limit=10, now=at(0.01)) == []
    assert len(claim(limit=10, now=at(0.06))) == 1  # 0.05 s refills one token
    with connection.cursor() as cur:
        wait = store_next_token(cur, at(0.06))
    assert 0 < wait <= 0.05
    assert len(claim(limit=10, now=at(10))) == 2  # never more than the burst


def store_next_token(cur, now: dt.datetime, queues: tuple[str, ...] = ("default",)) -> float:
    from pgqueue import limits_store

    return limits_store.next_token_in(cur, list(queues), now=now)


def next_token(now: dt.datetime, queues: tuple[str, ...] = ("default",)) -> float | None:
    with connection.cursor() as cur:
        return store_next_token(cur, now, queues)


def test_the_next_token_wakes_a_worker_only_for_work_a_rate_limit_holds_back():
    """A short claim asks when the next token comes, and sleeps no longer. A rate limit
    with nothing behind it must not answer: with its bucket full it answered 0, and an
    idle worker claimed again every millisecond for as long as that tenant sent nothing
    (about 1,000 claims a second). Nor may a scope held by a cap, a pause or a token it
    already has answer 0."""
    at = timeline()
    limits.set_tenant_limits("r", rate_limit="20/s")  # burst 2, a token every 0.05 s
    limits.set_queue_limits("other", rate_limit="10/s")
    assert next_token(at(0)) is None  # nothing queued: full bucket, nobody to wake
    enqueue(4, "r")
    assert len(claim(limit=10, now=at(0))) == 2  # the burst
    assert next_token(at(0.01)) == pytest.approx(0.04)  # the next token, exactly
    assert len(claim(limit=10, now=at(0.05))) == 1
    # A token in the bucket already (the claim lost a race, or it refilled since): look
    # again in one token's time, never at once.
    assert next_token(at(0.2)) == pytest.approx(0.05)
    assert next_token(at(0.2), ("q",)) is None  # none of r's jobs is queued there
    assert len(claim(limit=10, now=at(0.2))) == 1
    assert next_token(at(0.21)) is None  # r has nothing queued any more: no wake
    # Held by a cap of the tenant's, or a pause: a token would start nothing.
    enqueue(2, "r")
    limits.set_tenant_limits("r", max_running=4)
    assert next_token(at(0.3)) is None
    limits.set_tenant_limits("r", max_running=None)
    limits.set_tenant_limits("r", queue="default", rate_limit="1/s")
    assert next_token(at(0.3)) == pytest.approx(0.05)  # the narrower row's bucket is full
    limits.pause_tenant("r")
    assert next_token(at(0.3)) is None
    limits.resume_tenant("r")
    # A queue's own rate limit holds back every job of its queue.
    assert next_token(at(0.3), ("other",)) is None  # nothing queued there
    enqueue(2, "a", "other")
    assert len(claim(limit=10, queues=("other",), now=at(0.3))) == 1  # burst 1
    assert next_token(at(0.35), ("other",)) == pytest.approx(0.05)


def test_a_crashed_workers_slots_come_back_with_its_leases():
    """Both ways out of a lost lease give the slot back: a job whose start was recorded
    (an attempt spent, scheduled) and one that never started (given back queued, gated
    again behind its tenant's cap, the attempt not counted)."""
    at = timeline()
    limits.set_tenant_limits("t", max_running=1)
    enqueue(2, "t")
    (held,) = claim(limit=10, lease_seconds=5, now=at(0))
    assert claim(limit=10, now=at(1)) == []
    assert record_start("w1", held, now=at(1), lease_seconds=4)
    with connection.cursor() as cur:
        assert store.reap_expired(cur, now=at(10)) == {held.id: "scheduled"}
    assert running_counter(tenant="t") == 0
    (unstarted,) = claim(limit=10, lease_seconds=5, now=at(10))
    assert claim(limit=10, now=at(11)) == []
    with connection.cursor() as cur:
        assert store.reap_expired(cur, now=at(20)) == {unstarted.id: "queued"}
    assert running_counter(tenant="t") == 0
    given_back = job(unstarted.id)
    assert (given_back.status, given_back.gated, given_back.attempts) == ("queued", True, 0)
    (again,) = claim(limit=10, now=at(20))
    assert (again.id, again.attempt) == (unstarted.id, 1)


def test_release_and_give_back_free_their_slots():
    limits.set_tenant_limits("t", max_running=1)
    enqueue(2, "t")
    (held,) = claim(limit=10)
    with connection.cursor() as cur:
        store.release_many(cur, worker="w1", held=[(held.id, held.attempt)])
    assert running_counter(tenant="t") == 0
    assert job(held.id).gated
    (again,) = claim(limit=10)
    assert again.id == held.id
    with connection.cursor() as cur:
        store.give_back_many(cur, worker="w1", held=[(again.id, again.attempt)], delay=60)
    assert running_counter(tenant="t") == 0


def test_the_recount_repairs_a_counter_that_drifted():
    limits.set_tenant_limits("t", max_running=2)
    enqueue(3, "t")
    assert len(claim(limit=10)) == 2
    Limit.objects.filter(tenant="t").update(running=7)  # as if an exit had been lost
    with connection.cursor() as cur:
        fixed = recount_limits(cur, force=True)
    assert [(was, now) for _, was, now in fixed] == [(7, 2)]
    assert running_counter(tenant="t") == 2


def test_waiting_for_says_why_a_job_waits():
    limits.set_tenant_limits("t", max_running=1)
    ids = enqueue(3, "t")
    claim(limit=10)
    assert waiting_for(job(ids[1])) == {"waiting_for": "tenant_cap", "position": None}
    assert waiting_for(job(ids[0])) == {"waiting_for": None, "position": None}
    free = enqueue(3, "u")
    assert waiting_for(job(free[2])) == {"waiting_for": "turn", "position": "2"}
    late = pgqueue.enqueue("test.noop", {}, tenant="u", delay=60).job
    assert waiting_for(job(late.id))["waiting_for"] == "run_at"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_running", 0),
        ("max_running", "abc"),
        ("max_running", True),
        ("max_running", 10**9),
        ("rate_limit", "10/x"),
        ("rate_limit", "abc"),
        ("rate_limit", "0/s"),
        ("rate_limit", "99999999/s"),
        ("rate_limit", 5),
    ],
)
def test_bad_limits_are_refused_naming_the_field(field, value):
    with pytest.raises(pgqueue.InvalidJob) as info:
        limits.set_tenant_limits("t", **{field: value})
    assert info.value.field == field


JOB_CLAIM = claim_store.STATEMENTS["JOB_CLAIM"]
#: JOB_CLAIM with the limit rows' lock taken out: each claim checks the cap against its own
#: snapshot of the counter.
JOB_CLAIM_NO_LIMIT_LOCK = JOB_CLAIM.replace(
    "ORDER BY l.id FOR UPDATE OF l SKIP LOCKED", "ORDER BY l.id"
)


def race_claims(statement: str, rounds: int = 20, threads: int = 8) -> int:
    """``threads`` claimers, started together, each claim up to 3 jobs of a tenant capped at
    3 (tenant-wide) and hold them, half of them in one queue and half in another, so that
    they meet no job lock of one another's; returns the most of its jobs running after any
    round."""
    limits.set_tenant_limits("capped", max_running=3)
    worst = 0
    for _ in range(rounds):
        for queue in ("q0", "q1"):
            enqueue(threads * 3, "capped", queue)

        def one(i: int) -> int:
            params = {
                "queues": [f"q{i % 2}"],
                "limit": 3,
                "worker": f"w{i}",
                "lease": 30.0,
                "now": None,
            }
            with connection.cursor() as cur:
                cur.execute(statement, params)
                return sum(1 for row in cur.fetchall() if row[0] is not None)

        run_threads(threads, one)
        worst = max(worst, Job.objects.filter(tenant_id="capped", status="running").count())
        Job.objects.filter(tenant_id="capped").delete()
        Limit.objects.filter(tenant="capped").update(running=0)
    return worst


@pytest.mark.django_db(transaction=True)
def test_racing_claims_never_start_more_than_the_cap():
    """Protection: the claim locks the limit row (``locked``: FOR UPDATE SKIP LOCKED),
    which re-reads its newest ``running`` before checking the cap. Without that lock (the
    variant below) each claimer trusts its own snapshot and together they start more than
    the cap: claimers of one queue also meet each other's job locks, those of two do not."""
    assert JOB_CLAIM_NO_LIMIT_LOCK != JOB_CLAIM
    assert race_claims(JOB_CLAIM) == 3
    assert race_claims(JOB_CLAIM_NO_LIMIT_LOCK) > 3


def test_a_tenant_arriving_behind_a_capped_backlog_shares_the_slots_with_it():
    """A capped tenant's backlog is gated, outside the claim index. A tenant arriving when
    nothing else is queued starts at the gated jobs' head, not after all of them: with a
    cap that leaves the capped tenant every slot, the two still alternate. (Starting after
    the backlog, the newcomer ran only once the capped tenant's 40 jobs had all run.)"""
    limits.set_tenant_limits("capped", max_running=100)
    enqueue(40, "capped")
    enqueue(10, "late")
    first = [j.tenant for j in claim(limit=10)]
    assert first.count("late") >= 4 and first.count("capped") >= 4  # one starts a job ahead
