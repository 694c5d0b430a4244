"""The claim within limits (pgqueue/queries/claim.sql): a worker's turn locks what it
changes, records its outcomes and claims, the gated and ungated jobs together, in one
transaction (claim_store)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from django.db import OperationalError, connection, transaction

import pgqueue
from pgqueue import claim_store, limits
from pgqueue.limit_models import Limit
from pgqueue.models import Job
from pgqueue.worker.connection import connect_params
from pgqueue.worker.maintenance import recount_limits

pytestmark = pytest.mark.django_db

JOB_CLAIM = claim_store.STATEMENTS["JOB_CLAIM"]


def enqueue(n: int, tenant: str, queue: str = "default") -> list[int]:
    return pgqueue.enqueue_many("test.noop", [{}] * n, tenant=tenant, queue=queue)


def once(queues: tuple[str, ...] = ("default",), limit: int = 10, done=()) -> Any:
    """One turn of worker "w" on Django's connection, recording ``done`` (claimed jobs) as
    successes: (ids recorded, jobs claimed)."""
    results = [(j.id, j.attempt, None) for j in done]
    with transaction.atomic(), connection.cursor() as cur:
        return claim_store.complete_and_claim(
            cur, worker="w", queues=queues, limit=limit, results=results
        )


def claimed(queues: tuple[str, ...] = ("default",), limit: int = 10) -> list:
    return once(queues, limit)[1]


@pytest.mark.parametrize("queues", [("default",), ("default", "other")])
def test_without_limits_the_claim_counts_nothing(queues):
    ids = enqueue(3, "a")
    got = claimed(queues)
    assert sorted(j.id for j in got) == sorted(ids)
    assert all(j.limit_ids is None for j in got)


def test_a_queue_limit_elsewhere_does_not_count_this_queues_jobs():
    enqueue(2, "a")
    limits.set_queue_limits("other", max_running=1)
    got = claimed()
    assert len(got) == 2 and all(j.limit_ids is None for j in got)


def test_a_turn_records_a_success_and_claims_in_one_transaction():
    first, second = enqueue(2, "a")
    (job,) = claimed(limit=1)
    recorded, got = once(limit=1, done=[job])
    assert recorded == {first} and [j.id for j in got] == [second]
    assert Job.objects.get(id=first).status == "done"


def test_maintenance_deletes_the_rows_left_with_nothing_to_do():
    """A row that limits nothing goes once it counts no running job and holds back no
    gated job."""
    limits.set_tenant_limits("a", max_running=1)
    gated = enqueue(2, "a")
    limits.set_tenant_limits("b", max_running=1)
    (started,) = claimed()  # a's first job, counted in a's row
    limits.set_tenant_limits("a", max_running=None)  # ungates a's other job
    limits.set_tenant_limits("b", max_running=None)
    with connection.cursor() as cur:
        recount_limits(cur, force=True)
    assert list(Limit.objects.values_list("tenant", flat=True)) == ["a"]  # counts a job
    once(limit=1, done=[started])
    # The turn gives back the slot of the job it records as done ...
    assert Limit.objects.get(tenant="a").running == 0
    with connection.cursor() as cur:
        recount_limits(cur, force=True)
    # ... so the row counts nothing, limits nothing and holds back no job: it goes.
    assert not Limit.objects.exists()
    assert not Job.objects.filter(id__in=gated, status="queued", gated=True).exists()


@pytest.mark.django_db(transaction=True)
def test_the_recount_locks_and_writes_only_the_rows_that_drifted():
    """Protection: the recount finds drifted counters in one snapshot without a lock
    (LIMIT_DRIFTED) and locks and recounts only those. Locking every row first, as it once
    did, held each capped tenant's row for the pass (a claim skips a locked row: none of
    that tenant's jobs start meanwhile) and wrote a lock on every row of a service that
    caps each of its tenants, every pass. Here, while the recount's transaction is still
    open, another session can lock every row but the drifted one, and only that one has a
    new row version."""
    for n in range(20):
        limits.set_tenant_limits(f"t{n:02}", max_running=2)
        enqueue(3, f"t{n:02}")
    assert len(claimed(limit=100)) == 40
    Limit.objects.filter(tenant="t07").update(running=5)  # as if an exit had been lost
    versions = "SELECT tenant, xmin::text FROM pgqueue_limit ORDER BY tenant"
    with connection.cursor() as cur:
        cur.execute(versions)
        before = dict(cur.fetchall())
    with psycopg.connect(**connect_params("default")) as other:
        with transaction.atomic(), connection.cursor() as cur:
            fixed = recount_limits(cur, force=True)
            unlocked = other.execute(
                "SELECT tenant FROM pgqueue_limit ORDER BY tenant FOR UPDATE SKIP LOCKED"
            ).fetchall()
            other.rollback()
        assert [(was, now) for _, was, now in fixed] == [(5, 2)]
        assert [t for (t,) in unlocked] == [f"t{n:02}" for n in range(20) if n != 7]
    with connection.cursor() as cur:
        cur.execute(versions)
        after = dict(cur.fetchall())
    assert [t for t in after if after[t] != before[t]] == ["t07"]
    assert set(Limit.objects.values_list("running", flat=True)) == {2}


def test_maintenance_keeps_an_unlimited_row_whose_scope_still_has_gated_jobs():
    """A row that limits nothing stays while gated jobs of its scope are queued; the claim
    takes them (counted in no row: nothing limits them) and then the row goes."""
    limits.set_tenant_limits("a", max_running=1)
    ids = enqueue(2, "a")
    Limit.objects.filter(tenant="a").update(max_running=None)  # as if the ungating had stopped
    with connection.cursor() as cur:
        recount_limits(cur, force=True)
    assert Limit.objects.filter(tenant="a").exists()
    got = claimed()
    assert sorted(j.id for j in got) == sorted(ids) and all(j.limit_ids is None for j in got)
    with connection.cursor() as cur:
        recount_limits(cur, force=True)
    assert not Limit.objects.filter(tenant="a").exists()


@pytest.mark.parametrize("queues", [("default",), ("default", "other")])
def test_a_turn_reuses_at_once_the_slot_it_gives_back(queues):
    """One turn records a capped tenant's job as done and starts its next one in the slot
    that frees (the claim sees the turn's own decrement), never above the cap."""
    limits.set_tenant_limits("a", max_running=1)
    first, second, third = enqueue(3, "a")
    (started,) = claimed(queues)
    assert (started.id, Limit.objects.get(tenant="a").running) == (first, 1)
    recorded, got = once(queues, limit=10, done=[started])
    assert recorded == {first}
    assert [j.id for j in got] == [second]
    assert got[0].limit_ids == [Limit.objects.get(tenant="a").id]
    assert Limit.objects.get(tenant="a").running == 1
    assert Job.objects.get(id=third).status == "queued"


@pytest.mark.parametrize("queues", [("default",), ("other", "default")])
@pytest.mark.parametrize("idle", [0, 20])
def test_a_job_queued_before_its_tenant_was_limited_is_run_within_the_cap(queues, idle):
    """Protection: the claim counts an ungated job in the limit rows of its tenant (``rows``
    of its open jobs), not only the gated ones. A limit row that appears without the jobs
    of its scope being gated (a race with an enqueue whose transaction was open): the
    claim meets the stale jobs in the claim index and starts them within the cap. With 20
    more capped tenants that have nothing queued, the same."""
    for n in range(idle):
        limits.set_tenant_limits(f"idle{n:02}", max_running=1)
    ids = enqueue(3, "a")
    other = enqueue(1, "b")
    Limit.objects.create(tenant="a", queue="", max_running=1)  # no regate: as if raced
    got = claimed(queues)
    assert sorted(j.id for j in got) == sorted(ids[:1] + other)
    assert Limit.objects.get(tenant="a").running == 1
    assert claimed(queues) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("queues", [("default",), ("default", "other")])
def test_a_limit_row_held_elsewhere_is_passed_over_this_once_not_waited_for(queues):
    """Protection: the claim locks limit rows SKIP LOCKED (``locked``) and starts a gated
    job only once every row it counts in is locked by it, with room. While another
    transaction holds tenant a's row, a claim under a lock_timeout returns b's job and none
    of a's, and a's counter is untouched; once the row is free, a's jobs are next. The same
    claim with SKIP LOCKED taken out waits and times out: the setup really blocks."""
    limits.set_tenant_limits("a", max_running=2)
    capped = enqueue(2, "a")
    free = enqueue(1, "b")
    row = Limit.objects.get(tenant="a").id
    waiting = JOB_CLAIM.replace("FOR UPDATE OF l SKIP LOCKED", "FOR UPDATE OF l")
    assert waiting != JOB_CLAIM
    params = {"queues": list(queues), "limit": 10, "worker": "w", "lease": 30.0, "now": None}
    with psycopg.connect(**connect_params("default")) as holder:
        holder.execute("SELECT 1 FROM pgqueue_limit WHERE id = %s FOR UPDATE", [row])
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SET LOCAL lock_timeout = '2s'")
            got = claim_store.claim(cur, worker="w", queues=queues, limit=10)
        assert [j.id for j in got] == free
        assert Limit.objects.get(tenant="a").running == 0
        assert set(Job.objects.filter(id__in=capped).values_list("status", flat=True)) == {"queued"}
        with (
            pytest.raises(OperationalError) as waited,
            transaction.atomic(),
            connection.cursor() as cur,
        ):
            cur.execute("SET LOCAL lock_timeout = '100ms'")
            cur.execute(waiting, params)
        assert isinstance(waited.value.__cause__, psycopg.errors.LockNotAvailable)
        holder.rollback()
    assert [j.id for j in claimed(queues)] == capped
    assert Limit.objects.get(tenant="a").running == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("queues", [("default",), ("default", "other")])
def test_the_claim_costs_nothing_for_limited_tenants_with_nothing_queued(queues):
    """Protection: the claim finds the tenants with gated jobs by a skip scan of
    pgqueue_job_gated (``w``) and reads, locks and probes the limit rows of
    those only, not of every limited tenant with room. With 40 capped tenants that have no
    job at all, a claim starts a capped tenant's jobs within its cap and an uncapped one's,
    probes pgqueue_job_gated a handful of times (counted by pg_stat_get_xact_numscans;
    probing every tenant with room makes 41 or more), and leaves the 40 idle rows unlocked
    (another session locks them all, SKIP LOCKED) while it holds the capped tenant's."""
    for n in range(40):
        limits.set_tenant_limits(f"idle{n:02}", max_running=2)
    limits.set_tenant_limits("a", max_running=2)
    capped = enqueue(3, "a")
    free = enqueue(1, "b")
    with psycopg.connect(**connect_params("default")) as other:
        probes = "SELECT pg_stat_get_xact_numscans('pgqueue_job_gated'::regclass)"
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(probes)  # counts pending since the last flush: take the difference
            (before,) = cur.fetchone()
            got = claim_store.claim(cur, worker="w", queues=queues, limit=10)
            cur.execute(probes)
            (after,) = cur.fetchone()
            unlocked = other.execute(
                "SELECT tenant FROM pgqueue_limit ORDER BY id FOR UPDATE SKIP LOCKED"
            ).fetchall()
            other.rollback()
        assert sorted(j.id for j in got) == sorted(capped[:2] + free)
        assert after - before < 10
        assert [t for (t,) in unlocked] == [f"idle{n:02}" for n in range(40)]
    assert Limit.objects.get(tenant="a").running == 2


def test_a_tenant_wide_cap_is_shared_by_the_queues_of_one_claim():
    """A worker of two queues claims a tenant capped at 3 across both: the claim interleaves
    the queues rank by rank and starts 3 of the tenant's jobs in all, the best of each queue
    first, beside every job of an uncapped tenant."""
    limits.set_tenant_limits("a", max_running=3)
    first = enqueue(3, "a", "q0")
    second = enqueue(3, "a", "q1")
    free = enqueue(2, "b", "q1")
    got = claimed(("q0", "q1"), limit=10)
    capped = {j.id for j in got if j.tenant == "a"}
    assert len(capped) == 3 and {first[0], second[0]} <= capped
    assert {j.id for j in got if j.tenant == "b"} == set(free)
    assert Limit.objects.get(tenant="a").running == 3
    assert all(j.limit_ids for j in got if j.tenant == "a")


def test_the_claim_reads_the_claim_index_in_order_past_many_limit_rows():
    """The claim reads each queue's best jobs from the claim index, in order, even in the
    generic plan the worker keeps (a prepared statement, after five runs) with a thousand
    tenant rows: counted in the rows pgqueue_job hands out for the claim's seventh run, a
    few dozen, not the whole queue."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO pgqueue_limit (queue, tenant, max_running, running, paused, tokens)"
            " SELECT '', 'idle' || g, 2, 0, FALSE, 0 FROM generate_series(1, 1000) g"
        )
    for n in range(4):
        pgqueue.enqueue_many("test.noop", [{}] * 500, tenant=f"free{n}")
    with connection.cursor() as cur:
        cur.execute("ANALYZE pgqueue_job")
        cur.execute("ANALYZE pgqueue_limit")
    params = {"queues": ["default"], "limit": 10, "worker": "w", "lease": 60.0, "now": None}
    read = (
        "SELECT pg_stat_get_xact_tuples_returned('pgqueue_job'::regclass)"
        " + pg_stat_get_xact_tuples_fetched('pgqueue_job'::regclass)"
    )
    connection.ensure_connection()
    with connection.connection.cursor() as raw:
        for _ in range(7):
            raw.execute(read)
            (before,) = raw.fetchone()
            raw.execute(JOB_CLAIM, params, prepare=True)
            assert len(raw.fetchall()) == 10
            raw.execute(read)
            (after,) = raw.fetchone()
    assert after - before < 200


def test_the_claim_statements_are_whole_short_and_parsed_once():
    """The shape the claim path keeps: claim.sql holds named statements only, none over 80
    lines, each short enough that psycopg parses its placeholders once per process (its
    cache takes queries of up to MAX_CACHED_STATEMENT_LENGTH characters; a longer one is
    parsed on every execute, about 0.2 ms a turn here)."""
    from psycopg import _queries

    statements = claim_store.STATEMENTS
    assert set(statements) == {"TURN_PLAN", "LIMIT_LOCK_TURN", "JOB_CLAIM"}
    for name, text in statements.items():
        assert "-- name:" not in text, name
        assert len(text.splitlines()) <= 80, name
        assert len(text) <= _queries.MAX_CACHED_STATEMENT_LENGTH, name


@pytest.mark.django_db(transaction=True)
def test_a_claim_made_after_waiting_for_a_limit_row_is_dated_after_the_wait():
    """A turn that waited for its queue's limit row claims at the moment it claims: the
    job's claimed_at (and the lease that starts with it) is after the holder let the row
    go, not when the turn's transaction began.

    Protection: JOB_CLAIM's ``at`` is clock_timestamp(). With now(), the transaction's
    start, a slot taken after the wait was dated before it, so an attempt seemed to
    overlap the one whose slot it took (and a token bucket's refill was dated back)."""
    limits.set_queue_limits("q", max_running=5)
    (job_id,) = enqueue(1, "a", queue="q")
    row = Limit.objects.get(queue="q", tenant="").id
    result: dict[str, Any] = {}

    def run_turn(db: psycopg.Connection) -> None:
        result["turn"] = claim_store.turn(db, worker="w", queues=["q"], limit=1)

    with (
        psycopg.connect(**connect_params("default")) as holder,
        psycopg.connect(**connect_params("default"), autocommit=True) as worker_db,
    ):
        holder.execute("SELECT 1 FROM pgqueue_limit WHERE id = %s FOR UPDATE", [row])
        (pid,) = worker_db.execute("SELECT pg_backend_pid()").fetchone()
        thread = threading.Thread(target=run_turn, args=(worker_db,))
        thread.start()
        for _ in range(200):  # bounded: until the turn waits for the row, at most ~10 s
            waiting = holder.execute(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid]
            ).fetchone()
            if waiting and waiting[0]:
                break
            threading.Event().wait(0.05)
        else:
            pytest.fail("the turn never waited for the limit row")
        (released,) = holder.execute("SELECT clock_timestamp()").fetchone()
        holder.commit()
        thread.join(10)
    assert [j.id for j in result["turn"].jobs] == [job_id]
    assert Job.objects.get(pk=job_id).claimed_at >= released
