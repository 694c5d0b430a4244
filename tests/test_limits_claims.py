"""The two claims: the plain one while no limit row applies to the queues (the fast path),
the limited one while one does, and the switch between them (claim_store, worker/claiming)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from django.db import OperationalError, connection, transaction

import pgqueue
from pgqueue import claim_store, limits, sql
from pgqueue.limit_models import Limit
from pgqueue.models import Job
from pgqueue.worker.claiming import Claims
from pgqueue.worker.connection import connect_params
from pgqueue.worker.maintenance import recount_limits
from tests.workers import wait_for, waiting_on_a_lock

pytestmark = pytest.mark.django_db


def enqueue(n: int, tenant: str, queue: str = "default") -> list[int]:
    return pgqueue.enqueue_many("test.noop", [{}] * n, tenant=tenant, queue=queue)


def once(limited: bool, queues: tuple[str, ...] = ("default",), limit: int = 10, done=()):
    """One claim statement of worker "w", recording ``done`` (claimed jobs) as successes."""
    results = [(j.id, j.attempt, None) for j in done]
    with connection.cursor() as cur:
        return claim_store.claim_once(
            cur, worker="w", queues=queues, limit=limit, limited=limited, results=results
        )


@pytest.mark.parametrize("queues", [("default",), ("default", "other")])
def test_with_no_limit_row_the_plain_claim_claims_and_stays_plain(queues):
    ids = enqueue(3, "a")
    got = once(False, queues)
    assert (sorted(j.id for j in got.jobs), got.switch) == (sorted(ids), False)
    assert all(j.limit_ids is None for j in got.jobs)


@pytest.mark.parametrize("queues", [("default",), ("default", "other")])
def test_a_limit_row_makes_the_plain_claim_claim_nothing_and_switch(queues):
    """Any tenant-wide row applies to every queue: even a tenant with no job here sends
    the claim to the limited statement, which then counts what it starts."""
    enqueue(3, "a")
    limits.set_tenant_limits("b", max_running=1)
    got = once(False, queues)
    assert (got.jobs, got.switch) == ([], True)
    assert Job.objects.filter(status="running").count() == 0
    limited = once(True, queues)
    assert (len(limited.jobs), limited.switch) == (3, False)


def test_a_queue_limit_elsewhere_keeps_this_queues_claims_plain():
    enqueue(2, "a")
    limits.set_queue_limits("elsewhere", max_running=1)
    got = once(False)
    assert (len(got.jobs), got.switch) == (2, False)


def test_the_limited_claim_says_when_no_limit_row_applies_any_more():
    enqueue(2, "a")
    got = once(True)
    assert (len(got.jobs), got.switch) == (2, True)


def test_the_fused_plain_claim_records_the_successes_even_when_it_switches():
    done, queued = enqueue(1, "a"), enqueue(1, "a")
    (held,) = once(False, limit=1).jobs
    limits.set_tenant_limits("b", max_running=1)
    got = once(False, limit=5, done=[held])
    assert (got.recorded, got.jobs, got.switch) == ({held.id}, [], True)
    assert Job.objects.get(id=held.id).status == "done"
    assert Job.objects.get(id=queued[0]).status == "queued"
    assert held.id == done[0]


def test_the_worker_claims_switch_to_limited_in_the_same_turn_and_back():
    enqueue(2, "capped")
    enqueue(2, "free")
    limits.set_tenant_limits("capped", max_running=1)
    claims = Claims("w", ["default"], 30.0)
    with connection.cursor() as cur:
        _, jobs = claims.claim(cur, 10)
    assert claims.limited  # the plain claim switched, and the limited one claimed
    assert sorted(j.tenant for j in jobs) == ["capped", "free", "free"]
    Job.objects.all().delete()
    Limit.objects.all().delete()
    enqueue(1, "free")
    with connection.cursor() as cur:
        _, jobs = claims.claim(cur, 10)
    assert len(jobs) == 1 and not claims.limited  # the next turn is plain again


def test_maintenance_deletes_the_rows_left_with_nothing_to_do():
    """A row that limits nothing goes once it counts no running job and holds back no
    gated job; then the plain claim is used again."""
    limits.set_tenant_limits("a", max_running=1)
    gated = enqueue(2, "a")
    limits.set_tenant_limits("b", max_running=1)
    (started,) = once(True).jobs  # a's first job, counted in a's row
    limits.set_tenant_limits("a", max_running=None)  # ungates a's other job
    limits.set_tenant_limits("b", max_running=None)
    with connection.cursor() as cur:
        recount_limits(cur, force=True)
    assert list(Limit.objects.values_list("tenant", flat=True)) == ["a"]  # counts a job
    once(True, limit=1, done=[started])
    # The fused limited statement gives back the slot of the job it records as done ...
    assert Limit.objects.get(tenant="a").running == 0
    with connection.cursor() as cur:
        recount_limits(cur, force=True)
    # ... so the row counts nothing, limits nothing and holds back no job: it goes.
    assert not Limit.objects.exists()
    assert not Job.objects.filter(id__in=gated, status="queued", gated=True).exists()
    got = once(False)
    assert not got.switch


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
    assert len(once(True, limit=100).jobs) == 40
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
    limits.set_tenant_limits("a", max_running=1)
    ids = enqueue(2, "a")
    Limit.objects.filter(tenant="a").update(max_running=None)  # as if the ungating had stopped
    with connection.cursor() as cur:
        recount_limits(cur, force=True)
    assert Limit.objects.filter(tenant="a").exists()
    assert sorted(j.id for j in once(True).jobs) == sorted(ids)
    with connection.cursor() as cur:
        recount_limits(cur, force=True)  # the jobs run, counted in the row: it stays
    assert Limit.objects.get(tenant="a").running == 2


@pytest.mark.parametrize("queues", [("default",), ("default", "other")])
def test_the_fused_limited_statement_reuses_at_once_the_slot_it_gives_back(queues):
    """One statement records a capped tenant's job as done and starts its next one in the
    slot that frees: the counter moves by the net change (0 here), never above the cap."""
    limits.set_tenant_limits("a", max_running=1)
    first, second, third = enqueue(3, "a")
    (started,) = once(True, queues).jobs
    assert (started.id, Limit.objects.get(tenant="a").running) == (first, 1)
    got = once(True, queues, limit=10, done=[started])
    assert got.recorded == {first}
    assert [j.id for j in got.jobs] == [second]
    assert got.jobs[0].limit_ids == [Limit.objects.get(tenant="a").id]
    assert Limit.objects.get(tenant="a").running == 1
    assert Job.objects.get(id=third).status == "queued"


@pytest.mark.parametrize("queues", [("default",), ("other", "default")])
@pytest.mark.parametrize("idle", [0, 20])
def test_a_job_queued_before_its_tenant_was_limited_is_gated_by_the_claim_then_run_within_the_cap(
    queues, idle
):
    """A limit row that appears without the jobs of its scope being gated (a race with an
    enqueue): the limited claim meets the stale jobs in the claim index, gates them instead
    of running them (in the same statement as the claim), and claims them within the cap
    from then on. With several queues the stale jobs are told by their queue's groups.
    With 20 more capped tenants that have nothing queued (past sql.SKIP_SCAN_ABOVE) the
    claim reads the limit rows of the tenants it scanned, not of every limited tenant: the
    stale jobs' tenant is among them."""
    for n in range(idle):
        limits.set_tenant_limits(f"idle{n:02}", max_running=1)
    ids = enqueue(3, "a")
    other = enqueue(1, "b")
    Limit.objects.create(tenant="a", queue="", max_running=1)  # no regate: as if raced
    got = once(True, queues)
    assert [j.id for j in got.jobs] == other
    assert set(Job.objects.filter(id__in=ids).values_list("status", "gated")) == {("queued", True)}
    again = once(True, queues)
    assert [j.id for j in again.jobs] == ids[:1]
    assert Limit.objects.get(tenant="a").running == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("queues", [("default",), ("default", "other")])
def test_a_limit_row_held_elsewhere_is_passed_over_this_once_not_waited_for(queues):
    """Protection: the limited claim locks limit rows SKIP LOCKED (``row_lock``) and starts a
    gated job only once every row it counts in is locked by it, with room. While another
    transaction holds tenant a's row, a claim under a lock_timeout returns b's job and none
    of a's, and a's counter is untouched; once the row is free, a's jobs are next. The same
    claim with SKIP LOCKED taken out waits and times out: the setup really blocks."""
    limits.set_tenant_limits("a", max_running=2)
    capped = enqueue(2, "a")
    free = enqueue(1, "b")
    row = Limit.objects.get(tenant="a").id
    statement = claim_store._statement(False, True, len(queues) > 1, 10)
    waiting = statement.replace("FOR UPDATE OF l SKIP LOCKED", "FOR UPDATE OF l")
    assert waiting != statement
    params = {"queues": list(queues), "limit": 10, "worker": "w", "lease": 30.0, "now": None}
    with psycopg.connect(**connect_params("default")) as holder:
        holder.execute("SELECT 1 FROM pgqueue_limit WHERE id = %s FOR UPDATE", [row])
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SET LOCAL lock_timeout = '2s'")
            got = claim_store.claim_once(cur, worker="w", queues=queues, limit=10, limited=True)
        assert [j.id for j in got.jobs] == free
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
    assert [j.id for j in once(True, queues).jobs] == capped
    assert Limit.objects.get(tenant="a").running == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("queues", [("default",), ("default", "other")])
def test_the_limited_claim_costs_nothing_for_limited_tenants_with_nothing_queued(queues):
    """Protection: the limited claim finds the tenants with gated jobs by a skip scan of
    pgqueue_job_gated (``gated_tenants``) and reads, locks and probes the limit rows of
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
            got = claim_store.claim_once(cur, worker="w", queues=queues, limit=10, limited=True)
            cur.execute(probes)
            (after,) = cur.fetchone()
            unlocked = other.execute(
                "SELECT tenant FROM pgqueue_limit ORDER BY id FOR UPDATE SKIP LOCKED"
            ).fetchall()
            other.rollback()
        assert sorted(j.id for j in got.jobs) == sorted(capped[:2] + free)
        assert after - before < 10
        assert [t for (t,) in unlocked] == [f"idle{n:02}" for n in range(40)]
    assert Limit.objects.get(tenant="a").running == 2


def test_a_tenant_wide_cap_is_shared_by_the_queues_of_one_limited_claim():
    """A worker of two queues claims a tenant capped at 3 across both: the claim interleaves
    the queues rank by rank and starts 3 of the tenant's jobs in all, the best of each queue
    first, beside every job of an uncapped tenant."""
    limits.set_tenant_limits("a", max_running=3)
    first = enqueue(3, "a", "q0")
    second = enqueue(3, "a", "q1")
    free = enqueue(2, "b", "q1")
    got = once(True, ("q0", "q1"), limit=10)
    capped = {j.id for j in got.jobs if j.tenant == "a"}
    assert len(capped) == 3 and {first[0], second[0]} <= capped
    assert {j.id for j in got.jobs if j.tenant == "b"} == set(free)
    assert Limit.objects.get(tenant="a").running == 3
    assert all(j.limit_ids for j in got.jobs if j.tenant == "a")


def test_positional_form_numbers_each_parameter_once_in_order_of_first_use():
    text, names = claim_store._positional("SELECT %(b)s, %(a)s, %(b)s, 10 %% 3")
    assert (text, names) == ("SELECT $1, $2, $1, 10 % 3", ("b", "a"))


def test_a_raw_cursor_runs_the_claims_in_their_positional_form():
    """The worker's loop claims through a psycopg RawCursor (no placeholder parsing per
    turn): the same statements, the same outcome as through Django's cursor."""
    import psycopg

    limits.set_tenant_limits("a", max_running=1)
    capped = enqueue(2, "a")
    free = enqueue(1, "b")
    connection.ensure_connection()
    with psycopg.RawCursor(connection.connection) as raw:
        got = claim_store.claim_once(raw, worker="w", queues=["default"], limit=10, limited=True)
        assert sorted(j.id for j in got.jobs) == sorted([capped[0], *free])
        results = [(j.id, j.attempt, None) for j in got.jobs]
        again = claim_store.claim_once(
            raw, worker="w", queues=["default"], limit=10, limited=True, results=results
        )
    assert again.recorded == {capped[0], *free}
    assert [j.id for j in again.jobs] == [capped[1]]
    assert Limit.objects.get(tenant="a").running == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("queues", [("default",), ("default", "other")])
def test_the_fused_limited_claim_locks_the_jobs_it_scans_before_it_records_any(queues):
    """Protection: the fused limited claim runs its ungated scan before its completions
    (_OPEN_FIRST), as the plain claim does. A claim's scan locks, at its newest version, a
    job another worker claimed and committed after the scan's snapshot was taken, and then
    passes it over; that worker's next statement, recording the job, waits for the claim
    to commit. The later the scan runs in its statement, the more such jobs it meets: with
    two worker processes this was most of their waits. Here the recording part is held up
    on purpose (another transaction holds the job it records): by then the jobs the claim
    will take are already locked by it. With the completions first, they are not yet, and
    another transaction can lock them."""
    limits.set_tenant_limits("a", max_running=2)  # a limit row: the claims are limited
    enqueue(1, "b")
    (held,) = once(True, queues, limit=1).jobs
    queued = enqueue(3, "b")
    results = [(held.id, held.attempt, None)]
    outcome: dict[str, Any] = {}
    connected = threading.Event()

    def claim() -> None:
        with psycopg.connect(**connect_params("default")) as conn, conn.cursor() as cur:
            outcome["pid"] = conn.info.backend_pid
            connected.set()
            outcome["claim"] = claim_store.claim_once(
                cur, worker="w", queues=queues, limit=10, limited=True, results=results
            )

    with psycopg.connect(**connect_params("default")) as holder:
        holder.execute("SELECT 1 FROM pgqueue_job WHERE id = %s FOR UPDATE", [held.id])
        worker = threading.Thread(target=claim)
        worker.start()
        assert connected.wait(10)
        wait_for(lambda: waiting_on_a_lock(outcome["pid"]), 10, "the claim to wait for the job")
        with (
            psycopg.connect(**connect_params("default"), autocommit=True) as probe,
            probe.transaction(),
        ):
            free = probe.execute(
                "SELECT id FROM pgqueue_job WHERE id = ANY(%s) FOR UPDATE SKIP LOCKED",
                [queued],
            ).fetchall()
        assert free == []  # every job the claim will take was locked before it waited
        holder.rollback()
        worker.join(10)
    assert not worker.is_alive()
    got = outcome["claim"]
    assert got.recorded == {held.id}
    assert sorted(j.id for j in got.jobs) == sorted(queued)


@pytest.mark.parametrize("idle_rows", [0, sql.OPEN_HASH_ROWS], ids=["hashed", "probed"])
@pytest.mark.parametrize("queues", [("default",), ("default", "x")])
def test_the_open_claim_starts_only_jobs_of_tenants_without_a_limit_row(queues, idle_rows):
    """The open claim (JOB_CLAIM_OPEN) runs between limited claims at the plain claim's
    cost: it may start only jobs that count in no row. A capped tenant's gated jobs are
    outside its index; its stale ungated job, and the jobs of a tenant whose row is for
    that queue (even one that limits nothing), must be passed over, unlocked; a tenant
    limited only in another queue is free here. A queue's own row counts every job of
    its queue: then the open claim claims nothing and says so. The same with few rows
    (read once into a hash) and with more (a probe per job; sql._no_tenant_row)."""
    Limit.objects.bulk_create(
        Limit(queue="", tenant=f"idle{n}", max_running=1) for n in range(idle_rows)
    )
    limits.set_tenant_limits("capped", max_running=2)
    limits.set_tenant_limits("narrow", queue="default", rate_limit="100/s")
    limits.set_tenant_limits("elsewhere", queue="x", max_running=1)
    Limit.objects.create(queue="default", tenant="norow")  # limits nothing, still a row
    gated = enqueue(2, "capped")
    stale = enqueue(1, "capped")
    Job.objects.filter(id__in=stale).update(gated=False)  # queued in a race with the limit
    held_back = enqueue(1, "narrow") + enqueue(1, "norow")
    Job.objects.filter(id__in=held_back).update(gated=False)
    free = enqueue(2, "free") + enqueue(1, "elsewhere")
    x_jobs = enqueue(1, "elsewhere", "x") + enqueue(1, "free", "x")
    counters = dict(Limit.objects.values_list("id", "running"))
    got = claim_store.claim_once(
        connection.cursor(), worker="w", queues=queues, limit=10, limited=False, open_=True
    )
    expected = free + (x_jobs[1:] if len(queues) > 1 else [])
    assert sorted(j.id for j in got.jobs) == sorted(expected)
    assert not got.switch and all(j.limit_ids is None for j in got.jobs)
    assert Job.objects.filter(id__in=gated + stale + held_back, status="queued").count() == 5
    assert dict(Limit.objects.values_list("id", "running")) == counters
    limits.set_queue_limits("default", max_running=10)
    enqueue(1, "free")
    again = claim_store.claim_once(
        connection.cursor(), worker="w", queues=queues, limit=10, limited=False, open_=True
    )
    assert again.switch and again.jobs == []


@pytest.mark.parametrize("queues", [("default",), ("default", "other")])
@pytest.mark.parametrize("fused", [False, True])
def test_the_limited_claim_says_when_a_tenant_took_all_its_room(queues, fused):
    """The room-bound marker (sql._room_bound): the limited claim says so when a tenant
    offered as many jobs as its room allowed and all of them started, its jobs waiting on
    its room rather than on their turn; not when it has no room, when the claim's order
    left one of its jobs out, nor when it had fewer jobs queued than room. The worker
    claims limited again on the next turn only after such a claim (worker/claiming.py),
    so that open turns never bound a capped tenant's starts to a cap per period."""
    done = []
    if fused:  # a success recorded in the same statement as the claim
        enqueue(1, "first")
        done = once(True, queues, limit=1).jobs
    limits.set_tenant_limits("capped", max_running=2)
    capped = enqueue(3, "capped")
    enqueue(6, "free")
    got = once(True, queues, limit=4, done=done)
    assert [j.id for j in got.jobs if j.tenant == "capped"] == capped[:2]
    assert got.room_bound and not got.switch
    full = once(True, queues, limit=1)  # its room is full: none of its jobs offered
    assert [j.tenant for j in full.jobs] == ["free"] and not full.room_bound
    ahead = pgqueue.enqueue_many("test.noop", [{}] * 4, tenant="urgent", priority=5)
    first_done = [j for j in got.jobs if j.id == capped[0]]
    cut = once(True, queues, limit=4, done=first_done)  # a slot back, its job not in the best 4
    assert sorted(j.id for j in cut.jobs) == sorted(ahead) and not cut.room_bound
    second_done = [j for j in got.jobs if j.id == capped[1]]
    short = once(True, queues, limit=4, done=second_done)  # room for two, one job left
    assert capped[2] in [j.id for j in short.jobs] and not short.room_bound
    assert running_counter("capped") == 1


def test_after_a_room_bound_claim_or_a_long_counted_job_the_next_turn_is_limited():
    """Open turns run only while no tenant waits on its room alone and no counted job
    that ran a period or longer is holding its slot (Claims.open_turn's ``held``)."""
    clock = [0.0]
    claims = Claims("w", ["default"], 60.0, limited_every=1.0, clock=lambda: clock[0])
    claims.limited, claims._limited_at = True, 0.0
    clock[0] = 0.5
    assert claims.open_turn() and claims.open_turn(held=0.9)
    assert not claims.open_turn(held=1.0)
    claims.room_bound = True
    assert not claims.open_turn()


def test_open_turns_run_between_limited_claims_and_keep_counted_successes_for_them():
    """While limited claims run less than ``limited_every`` apart, the turns between them
    claim open: uncapped jobs only, and a capped job's success is kept back, its slot
    still counted. Not after a limited claim that filled a tenant's room (room-bound):
    the next turn claims limited again. An open claim that comes up short is followed by
    the limited claim in the same turn, which records what was kept, frees its slot and
    fills it, and open turns pause. The counter is exact at every step."""
    clock = [0.0]
    claims = Claims("w", ["default"], 60.0, limited_every=1.0, clock=lambda: clock[0])
    limits.set_tenant_limits("capped", max_running=1)
    capped = enqueue(3, "capped")
    enqueue(5, "free")
    assert not claims.open_turn()
    with connection.cursor() as cur:
        _, first = claims.claim(cur, 4)  # plain, which switches to limited at once
    assert claims.limited and [j.id for j in first if j.tenant == "capped"] == capped[:1]
    assert claims.room_bound and not claims.open_turn()  # its room filled: limited again
    done = {j.tenant: (j.id, j.attempt, None) for j in first}
    frees = [(j.id, j.attempt, None) for j in first if j.tenant == "free"]
    with connection.cursor() as cur:
        _, second = claims.claim(cur, 1)  # no room left: the next turns may claim open
    assert [j.tenant for j in second] == ["free"] and not claims.room_bound
    clock[0] = 0.5
    assert claims.open_turn()
    with connection.cursor() as cur:
        recorded, got, counted_too = claims.claim_open(cur, 1, frees, [done["capped"]])
    assert not counted_too and recorded == {f[0] for f in frees}
    assert [j.tenant for j in got] == ["free"]
    assert Job.objects.get(id=capped[0]).status == "running"  # kept back, still counted
    assert running_counter("capped") == 1
    clock[0] = 0.6
    with connection.cursor() as cur:
        recorded, got, counted_too = claims.claim_open(cur, 3, [], [done["capped"]])
    assert counted_too and recorded == {capped[0]}
    assert [j.id for j in got if j.tenant == "capped"] == capped[1:2]  # the slot, refilled
    assert running_counter("capped") == 1
    assert not claims.open_turn()  # paused after a short open claim
    clock[0] = 1.7
    assert not claims.open_turn()  # and the limited claim is due again anyway


def running_counter(tenant: str) -> int:
    return Limit.objects.get(queue="", tenant=tenant).running


def test_the_open_claim_reads_the_claim_index_in_order_past_many_limit_rows():
    """Protection: the open claim's check that a job's tenant has no limit row is a scalar
    subquery, run per job scanned (sql._no_tenant_row). Written as NOT EXISTS, PostgreSQL
    turned it into an anti-join, and with a thousand tenant rows the generic plan the
    worker keeps (a prepared statement, after five runs) scanned and sorted every queued
    job on each claim. Counted in the rows pgqueue_job hands out for the claim's seventh
    run: a few dozen, not the whole queue."""
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
    text, order = claim_store._positional(claim_store._statement(False, False, False, 10, True))
    params = {"queues": ["default"], "limit": 10, "worker": "w", "lease": 60.0, "now": None}
    read = (
        "SELECT pg_stat_get_xact_tuples_returned('pgqueue_job'::regclass)"
        " + pg_stat_get_xact_tuples_fetched('pgqueue_job'::regclass)"
    )
    connection.ensure_connection()
    with psycopg.RawCursor(connection.connection) as raw:
        for _ in range(7):
            raw.execute(read)
            (before,) = raw.fetchone()
            raw.execute(text, [params[name] for name in order], prepare=True)
            assert len(raw.fetchall()) == 10
            raw.execute(read)
            (after,) = raw.fetchone()
    assert after - before < 200
