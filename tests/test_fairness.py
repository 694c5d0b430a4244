"""The fair scheduling policy, scenario by scenario, each one checked against FIFO too.

Every property has a scenario (builds the queue, claims, and returns the claim order) and
a check (asserts the property on that order). The fair test runs the scenario under the
default ordering and the check passes; its ``_fifo`` twin runs the same scenario with the
``fifo`` fixture and shows the check fails. Without that twin a check could pass for the
wrong reason (say, because the scenario happens to enqueue in a fair order already).

Under FIFO a job's vtime is its transaction's timestamp. A test here is one transaction,
so all vtimes are equal and the claim order is plain arrival (id) order: exactly the
order a FIFO queue would produce for these arrivals.

Claims are one job at a time (``limit=1``), so the order is the scheduler's order and not
an artefact of batching.
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest
from django.db import connection

import pgqueue
from pgqueue import services, store
from tests.conftest import claim, complete, drain, later

TASK = "test.noop"


# -- helpers ------------------------------------------------------------------------------


def enqueue_n(tenant: str, n: int, **options) -> list[int]:
    """Enqueue ``n`` jobs of ``tenant`` in one call; returns their ids in enqueue order."""
    return pgqueue.enqueue_many(TASK, list(range(n)), tenant=tenant, **options)


def take(n: int, queues: tuple[str, ...] = ("default",)) -> list[store.ClaimedJob]:
    """Claim and complete up to ``n`` jobs one at a time, returning them in claim order."""
    taken: list[store.ClaimedJob] = []
    for _ in range(n):
        jobs = claim("w1", limit=1, queues=queues)
        if not jobs:
            break
        assert complete("w1", jobs[0])
        taken.extend(jobs)
    return taken


def names(order: list[store.ClaimedJob]) -> list[str]:
    return [j.tenant for j in order]


def positions(order: list[store.ClaimedJob], tenant: str) -> list[int]:
    """0-based claim positions of ``tenant``'s jobs."""
    return [i for i, j in enumerate(order) if j.tenant == tenant]


def share_of_prefixes(
    order: list[store.ClaimedJob], tenant: str, share: float, k: int, step: int
) -> None:
    """In the first m claims, for m = step, 2*step, ..., k, ``tenant`` has share*m of them ±1."""
    assert len(order) >= k, f"only {len(order)} claims, expected at least {k}"
    for m in range(step, k + 1, step):
        got = names(order[:m]).count(tenant)
        assert abs(got - share * m) <= 1, (
            f"{tenant} got {got} of the first {m} claims, expected {share * m:g} ± 1: "
            f"{Counter(names(order[:m]))}"
        )


# -- checks -------------------------------------------------------------------------------


def check_interleaves(order: list[store.ClaimedJob], late: str, n: int) -> None:
    """``late``'s ``n`` jobs run one-for-one with the backlog that was queued before them.

    One-for-one means: never two of them in a row (they did not jump the line), and all of
    them within the first 2n + 1 claims (they did not wait behind the backlog). 2n + 1
    rather than 2n because a tenant arriving at a level starts at its head, i.e. right
    behind the job at the front, which therefore still runs first.
    """
    seen = positions(order, late)
    assert len(seen) == n, f"{late} ran {len(seen)} jobs, expected {n}"
    assert seen[-1] <= 2 * n, (
        f"{late}'s jobs ran at claims {seen}: they waited behind the backlog "
        f"instead of interleaving with it"
    )
    assert all(b - a >= 2 for a, b in pairwise(seen)), (
        f"{late}'s jobs ran back to back at claims {seen}: they jumped the line"
    )


# -- 1. a late tenant interleaves with a flood ----------------------------------------------

FLOOD = 1000
SMALL = 10


def late_tenant_scenario() -> list[store.ClaimedJob]:
    """``big`` enqueues 1,000 jobs in one call, then ``small`` enqueues 10; drain all."""
    assert len(enqueue_n("big", FLOOD)) == FLOOD
    for i in range(SMALL):  # separate calls, as a real late tenant would make them
        pgqueue.enqueue(TASK, i, tenant="small")
    order = drain(batch=1)
    assert len(order) == FLOOD + SMALL
    return order


def test_late_tenant_interleaves_with_flood(db):
    """A tenant arriving after a 1,000-job flood runs one-for-one with it.

    ``small`` starts at the level's head instead of behind ``big``'s 1,000 jobs, so its 10
    jobs all run within the first 21 claims, alternating with ``big``'s. Fails under FIFO
    (the ``fifo`` fixture): arrival order puts ``small``'s jobs at claims 1,001-1,010.
    """
    check_interleaves(late_tenant_scenario(), "small", SMALL)


def test_late_tenant_waits_behind_flood_under_fifo(db, fifo):
    """Under FIFO the late tenant waits for the whole flood: the fairness check fails."""
    order = late_tenant_scenario()
    assert positions(order, "small") == list(range(FLOOD, FLOOD + SMALL))
    with pytest.raises(AssertionError, match="waited behind the backlog"):
        check_interleaves(order, "small", SMALL)


# -- 2. three tenants take strict turns -----------------------------------------------------

TURN_TENANTS = ("A", "B", "C")
TURN_JOBS = 30


def turns_scenario() -> list[store.ClaimedJob]:
    """A, B and C each enqueue 30 jobs up front, in that order; drain all."""
    for tenant in TURN_TENANTS:
        enqueue_n(tenant, TURN_JOBS)
    return drain(batch=1)


def check_strict_turns(order: list[store.ClaimedJob], tenants: tuple[str, ...], n: int) -> None:
    """The tenants take strict turns: every 3 consecutive claims hold each tenant once.

    Each tenant ran all of its ``n`` jobs. The windows slide over the claims while every
    tenant still has jobs queued, apart from the very first claim: B and C arrived when
    A's first job was at the head, so they start right behind it and A runs one job
    ahead (A, then A B C, A B C, ..., then the tail B C). Sliding windows make the check
    order-sensitive: A B C A C B would fail it.
    """
    got = names(order)
    assert Counter(got) == dict.fromkeys(tenants, n), Counter(got)
    k = len(tenants)
    steady = got[1 : 1 + k * (n - 1)]
    for i in range(len(steady) - k + 1):
        window = steady[i : i + k]
        assert sorted(window) == sorted(tenants), (
            f"claims {i + 2}-{i + k + 1} are {window}: the tenants are not taking turns "
            f"(order starts {''.join(got[:12])})"
        )


def test_three_tenants_take_strict_turns(db):
    """Three tenants with equal backlogs are served in strict rotation, A B C A B C ...

    Each enqueue starts at the level's head and steps the tenant's clock by 1 per job, so
    A's (k+1)-th job and B's and C's k-th jobs share a vtime and run together (ties go by
    id). Fails under FIFO (the ``fifo`` fixture): arrival order serves all of A, then all
    of B, then all of C.
    """
    check_strict_turns(turns_scenario(), TURN_TENANTS, TURN_JOBS)


def test_three_tenants_run_one_after_another_under_fifo(db, fifo):
    """Under FIFO each tenant's whole backlog runs before the next: no turns."""
    order = turns_scenario()
    assert "".join(names(order)) == "A" * TURN_JOBS + "B" * TURN_JOBS + "C" * TURN_JOBS
    with pytest.raises(AssertionError, match="not taking turns"):
        check_strict_turns(order, TURN_TENANTS, TURN_JOBS)


# -- 3. weights divide the work ---------------------------------------------------------------

WEIGHTED_JOBS = 200
WEIGHTED_WINDOW = 80


def weights_scenario() -> list[store.ClaimedJob]:
    """``heavy`` (weight 3) and ``light`` (weight 1) each enqueue 200 jobs; claim 80."""
    services.set_tenant_weight("heavy", 3)
    services.set_tenant_weight("light", 1)
    enqueue_n("heavy", WEIGHTED_JOBS)
    enqueue_n("light", WEIGHTED_JOBS)
    return take(WEIGHTED_WINDOW)


def check_three_to_one(order: list[store.ClaimedJob]) -> None:
    """In the first 4, 8, ..., 80 claims heavy has 3/4 of them (±1) and light the rest."""
    share_of_prefixes(order, "heavy", 3 / 4, WEIGHTED_WINDOW, 4)
    share_of_prefixes(order, "light", 1 / 4, WEIGHTED_WINDOW, 4)


def test_weights_divide_work_three_to_one(db):
    """A tenant with weight 3 gets three jobs for every one of a weight-1 tenant.

    Its clock advances by 1/3 per job, a third as fast, so with equal backlogs every
    prefix of the claim order (4, 8, ... 80 claims) is split 3:1 to within one job.
    Fails under FIFO (the ``fifo`` fixture): weights play no part in arrival order, and
    the first 80 claims all go to ``heavy``, which enqueued first.
    """
    check_three_to_one(weights_scenario())


def test_weights_are_ignored_under_fifo(db, fifo):
    """Under FIFO the first 80 claims all go to the tenant that enqueued first."""
    order = weights_scenario()
    assert set(names(order)) == {"heavy"}
    with pytest.raises(AssertionError, match="expected"):
        check_three_to_one(order)


# -- 4. an idle tenant banks no credit -----------------------------------------------------

BURST = 20


def idle_tenant_scenario() -> list[store.ClaimedJob]:
    """C runs 3 jobs early, then is idle while A and B run 60; then C enqueues a burst.

    Returns the next 3 * BURST claims after C's burst.
    """
    enqueue_n("C", 3)
    assert names(drain(batch=1)) == ["C"] * 3  # C's clock stays at a low vtime
    enqueue_n("A", 100)
    enqueue_n("B", 100)
    assert "C" not in names(take(60))
    enqueue_n("C", BURST)
    return take(3 * BURST)


def check_no_banked_credit(order: list[store.ClaimedJob], idle: str, m: int) -> None:
    """The returning tenant gets its fair third of the next 3m claims, never two in a row."""
    assert len(order) == 3 * m
    seen = positions(order, idle)
    assert abs(len(seen) - m) <= 1, (
        f"{idle} got {len(seen)} of the next {3 * m} claims, expected its fair share "
        f"{m} ± 1: {''.join(names(order))}"
    )
    assert all(b - a >= 2 for a, b in pairwise(seen)), (
        f"{idle} ran back to back at claims {seen}: it spent credit banked while idle"
    )


def test_idle_tenant_banks_no_credit(db):
    """A tenant that was idle while others ran does not come back with a run of claims.

    C's clock stayed at 3 while A and B advanced the level's head past 30. Its burst
    starts at max(clock, head) = the head, so it gets a third of the next claims, one at
    a time, instead of its 20 jobs first (which is what charging from its stale clock
    would do). Fails under FIFO (the ``fifo`` fixture) the other way round: the burst
    arrived last, so C gets none of the next 60 claims while A's and B's backlogs drain.
    """
    check_no_banked_credit(idle_tenant_scenario(), "C", BURST)


def test_idle_tenant_waits_for_everyone_under_fifo(db, fifo):
    """Under FIFO the returning tenant gets nothing until A's and B's backlogs are gone."""
    order = idle_tenant_scenario()
    assert "C" not in names(order)
    with pytest.raises(AssertionError, match="fair share"):
        check_no_banked_credit(order, "C", BURST)


# -- 5. a tenant's new jobs never overtake its own backlog -------------------------------


def own_order_scenario() -> tuple[list[store.ClaimedJob], list[int], list[int]]:
    """A enqueues in four calls, interleaved with B's and C's enqueues and some claims.

    A's weight also changes half way, which changes how fast its clock runs. Returns the
    full claim order, A's ids in enqueue order and the ids of A's first batch.
    """
    a_first = enqueue_n("A", 10)
    a_ids = list(a_first)
    enqueue_n("B", 12)
    order = take(4)
    for i in range(3):
        a_ids.append(pgqueue.enqueue(TASK, i, tenant="A").job.id)
    enqueue_n("C", 6)
    order += take(5)
    services.set_tenant_weight("A", 2)
    a_ids += enqueue_n("A", 5)
    order += take(3)
    a_ids += enqueue_n("A", 4)
    order += drain(batch=1)
    assert len(order) == 10 + 12 + 3 + 6 + 5 + 4
    return order, a_ids, a_first


def check_own_order(order: list[store.ClaimedJob], a_ids: list[int]) -> None:
    """A's jobs are claimed exactly in the order A enqueued them."""
    claimed = [j.id for j in order if j.tenant == "A"]
    assert claimed == a_ids, f"A's jobs ran as {claimed}, enqueued as {a_ids}"


def check_b_interleaves(order: list[store.ClaimedJob], a_first: list[int]) -> None:
    """B, which arrived after A's first batch, starts before that batch is done."""
    first_b = positions(order, "B")[0]
    last_of_batch = max(i for i, j in enumerate(order) if j.id in set(a_first))
    assert first_b < last_of_batch, (
        f"B's first job ran at claim {first_b}, after all of A's first batch "
        f"(done at claim {last_of_batch}): B waited behind A's backlog"
    )


def check_own_order_and_fairness(
    order: list[store.ClaimedJob], a_ids: list[int], a_first: list[int]
) -> None:
    check_own_order(order, a_ids)
    check_b_interleaves(order, a_first)


def test_new_jobs_never_overtake_own_backlog(db):
    """A tenant's jobs run in enqueue order, while other tenants still interleave with them.

    A's clock only grows and each of its enqueues starts at max(clock, head) >= every
    vtime A already has queued, so a later call's jobs sort after the earlier ones even
    when A's weight changes between calls. Keeping a tenant's order is trivial for FIFO,
    so the check is combined with fairness: B, enqueued after A's first batch of 10,
    starts before that batch is finished. Fails under FIFO (the ``fifo`` fixture): A's
    order is kept but B waits until A's whole first batch has run.
    """
    check_own_order_and_fairness(*own_order_scenario())


def test_own_order_kept_but_unfair_under_fifo(db, fifo):
    """Under FIFO A's order is kept (arrival order) but B waits behind A's first batch."""
    order, a_ids, a_first = own_order_scenario()
    check_own_order(order, a_ids)
    with pytest.raises(AssertionError, match="waited behind"):
        check_own_order_and_fairness(order, a_ids, a_first)


# -- 6. priority before fairness -----------------------------------------------------------

PRIORITY_FLOOD = 200
URGENT = 5


def priority_scenario() -> list[store.ClaimedJob]:
    """``big`` floods priority 0, ``small`` 10 at 0, then ``big`` 5 at priority 5."""
    enqueue_n("big", PRIORITY_FLOOD, priority=0)
    enqueue_n("small", SMALL, priority=0)
    enqueue_n("big", URGENT, priority=5)
    order = drain(batch=1)
    assert len(order) == PRIORITY_FLOOD + SMALL + URGENT
    return order


def check_priority_then_fair(order: list[store.ClaimedJob]) -> None:
    """Every priority-5 job runs before any priority-0 job; within priority 0, fairly."""
    priorities = [j.priority for j in order]
    assert priorities == sorted(priorities, reverse=True), (
        f"a lower priority ran before a higher one: {priorities[:20]}"
    )
    assert [j.tenant for j in order[:URGENT]] == ["big"] * URGENT
    check_interleaves([j for j in order if j.priority == 0], "small", SMALL)


def test_priority_orders_before_fairness(db):
    """Priority is strict; fairness only orders jobs of equal priority.

    ``big`` has already flooded priority 0 and ``small`` has used nothing, yet ``big``'s
    priority-5 jobs run before all of ``small``'s priority-0 ones: each priority level has
    its own clocks, and the claim orders by priority first. Within priority 0 ``small``
    still interleaves with the flood. Fails under FIFO (the ``fifo`` fixture) on the
    second part only: priority still comes first, but ``small`` waits behind the flood.
    """
    check_priority_then_fair(priority_scenario())


def test_priority_kept_but_unfair_under_fifo(db, fifo):
    """Under FIFO priorities are still strict, but the late tenant waits for the flood."""
    order = priority_scenario()
    assert [j.priority for j in order[:URGENT]] == [5] * URGENT
    with pytest.raises(AssertionError, match="waited behind the backlog"):
        check_priority_then_fair(order)


# -- 7. fairness is per queue --------------------------------------------------------------

QUEUE_FLOOD = 500


def per_queue_scenario() -> list[store.ClaimedJob]:
    """``big`` floods queue "a"; ``other`` enqueues 30 jobs in queue "b", then ``big`` 10.

    Drains queue "b" only and returns its claim order.
    """
    enqueue_n("big", QUEUE_FLOOD, queue="a")
    enqueue_n("other", 3 * SMALL, queue="b")
    enqueue_n("big", SMALL, queue="b")
    order = drain(queues=("b",), batch=1)
    assert {j.queue for j in order} == {"b"}
    assert len(order) == 4 * SMALL
    return order


def test_flood_in_one_queue_does_not_affect_another(db):
    """A tenant's flood in queue "a" does not push back its jobs in queue "b".

    Clocks are per (queue, priority): ``big``'s clock in "a" is at 500, but in "b" it
    starts at b's head, so its 10 jobs interleave with the 30 ``other`` queued there
    first. (With one clock per tenant they would all run after ``other``'s.) Fails under
    FIFO (the ``fifo`` fixture): in "b" all of ``other``'s jobs run before any of
    ``big``'s.
    """
    check_interleaves(per_queue_scenario(), "big", SMALL)


def test_queue_b_is_arrival_order_under_fifo(db, fifo):
    """Under FIFO queue "b" serves all of ``other``'s jobs, then all of ``big``'s."""
    order = per_queue_scenario()
    assert names(order) == ["other"] * 3 * SMALL + ["big"] * SMALL
    with pytest.raises(AssertionError, match="waited behind the backlog"):
        check_interleaves(order, "big", SMALL)


def queue_weight_scenario() -> tuple[list[store.ClaimedJob], list[store.ClaimedJob]]:
    """``heavy`` has weight 3 in queue "a" only; both tenants have backlogs in "a" and "b".

    Returns the first 40 claims of queue "a" and the first 20 of queue "b".
    """
    services.set_tenant_weight("heavy", 3, queue="a")
    for queue in ("a", "b"):
        enqueue_n("heavy", 100, queue=queue)
        enqueue_n("light", 100, queue=queue)
    return take(40, queues=("a",)), take(20, queues=("b",))


def check_queue_weight(in_a: list[store.ClaimedJob], in_b: list[store.ClaimedJob]) -> None:
    """3:1 in queue "a" where the override applies, 1:1 in queue "b" where it does not."""
    assert {j.queue for j in in_a} == {"a"} and {j.queue for j in in_b} == {"b"}
    share_of_prefixes(in_a, "heavy", 3 / 4, 40, 4)
    share_of_prefixes(in_b, "heavy", 1 / 2, 20, 2)


def test_queue_weight_override_applies_in_its_queue_only(db):
    """``set_tenant_weight(t, 3, queue="a")`` gives t three shares in "a" and one elsewhere.

    In "a" the override makes ``heavy``'s clock advance a third as fast (3:1 in every
    prefix of 4, 8, ... 40 claims); in "b" it has the default weight 1 (1:1, alternating).
    Fails under FIFO (the ``fifo`` fixture): weights are ignored and ``heavy``, which
    enqueued first, takes every one of the first claims in both queues.
    """
    check_queue_weight(*queue_weight_scenario())


def test_queue_weight_is_ignored_under_fifo(db, fifo):
    """Under FIFO ``heavy`` takes all the first claims of both queues."""
    in_a, in_b = queue_weight_scenario()
    assert set(names(in_a)) == set(names(in_b)) == {"heavy"}
    with pytest.raises(AssertionError, match="expected"):
        check_queue_weight(in_a, in_b)


# -- 8. a promoted job gets a fresh fair vtime ---------------------------------------------

DELAYED = 5


def promoted_scenario() -> list[store.ClaimedJob]:
    """``big`` floods 300 jobs; ``late`` schedules 5 for an hour later; 100 claims run.

    Then the scheduled jobs are promoted (as maintenance would an hour later) and the rest
    is drained; returns the claims after the promotion.
    """
    enqueue_n("big", 300)
    scheduled = enqueue_n("late", DELAYED, delay=3600)
    assert set(names(take(100))) == {"big"}
    with connection.cursor() as cur:
        assert sorted(store.promote_due(cur, now=later(3600))) == scheduled
    order = drain(batch=1)
    assert len(order) == 200 + DELAYED
    return order


def test_promoted_job_gets_a_fresh_fair_vtime(db):
    """A job promoted from scheduled interleaves with the backlog it finds.

    ``late``'s clock row was created at 0 when it scheduled its jobs; by promotion time
    the level's head is past 100. Promotion charges from max(clock, head), so its 5 jobs
    alternate with ``big``'s from the head on: neither all first (jumping the line with
    a stale vtime) nor after the 200 ``big`` jobs still queued. Fails under FIFO (the
    ``fifo`` fixture): the promoted jobs go behind everything already queued.
    """
    check_interleaves(promoted_scenario(), "late", DELAYED)


def test_promoted_job_waits_behind_flood_under_fifo(db, fifo):
    """Under FIFO the promoted jobs run only after the rest of the flood."""
    order = promoted_scenario()
    assert positions(order, "late") == list(range(200, 200 + DELAYED))
    with pytest.raises(AssertionError, match="waited behind the backlog"):
        check_interleaves(order, "late", DELAYED)
