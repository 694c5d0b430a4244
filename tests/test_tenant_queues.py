"""A tenant's queues are bounded (PGQUEUE["MAX_QUEUES_PER_TENANT"]), and maintenance prunes
the fair clocks that no future vtime depends on, so a queue stops counting once its jobs
are done.

A tenant's footprint in scheduling is its fair clocks: one row of pgqueue_fair_clock per
(queue, priority) it has enqueued at. Without a bound and a prune, a tenant naming a queue
per request grew /metrics, the dashboard and that table without end. The prune must not
change any vtime assigned afterwards: the scenarios below run twice, with and without a
prune in the middle, and must claim in the same order.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.core import checks
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

import pgqueue
from pgqueue import fair_store, limits, sql, store
from pgqueue.models import FairClock, Job
from pgqueue.worker import maintenance
from pgqueue.worker.maintenance import run_maintenance
from tests.api_fixtures import assert_error, client, new_key
from tests.conftest import claim, complete, drain, fail, run_threads
from tests.taskapp import django_tasks as t

TASK = "test.noop"


@pytest.fixture
def bound_of_three() -> Iterator[None]:
    with override_settings(PGQUEUE={"MAX_QUEUES_PER_TENANT": 3}):
        yield


def queues_of(tenant: str) -> set[str]:
    return set(FairClock.objects.filter(tenant_id=tenant).values_list("queue", flat=True))


def clocks(queue: str) -> dict[str, float]:
    """The clocks of ``queue`` at priority 0, by tenant."""
    rows = FairClock.objects.filter(queue=queue, priority=0).values_list("tenant_id", "vtime")
    return dict(rows)


def prune() -> list[tuple[str, str, int, float]]:
    """One prune of idle clocks over every level, in a transaction of its own (as
    maintenance runs it): the clocks deleted."""
    deleted: list[tuple[str, str, int, float]] = []
    after = None
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '10s'")  # a prune that waited would fail
        while True:
            pruned = fair_store.prune_fair_clocks(cursor, after=after)
            deleted += pruned.deleted
            after = pruned.after
            if after is None:
                return deleted


def lock_idle(cursor: Any) -> list[int]:
    """FAIR_CLOCK_LOCK_IDLE from the first level on, in the caller's transaction: the ids of
    the clocks it chose and locked."""
    cursor.execute(
        sql.FAIR_CLOCK_LOCK_IDLE,
        {"after_queue": "", "after_priority": -1000, "levels": 10, "limit": 10, "by_vtime": True},
    )
    return cursor.fetchone()[0]


def names(order: list[store.ClaimedJob]) -> list[str]:
    return [j.tenant for j in order]


# -- the bound ------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("bound_of_three")
def test_a_fourth_queue_is_refused_and_nothing_is_written() -> None:
    """At MAX_QUEUES_PER_TENANT = 3, a tenant with jobs in three queues is refused a fourth
    (a TooManyQueues naming ``queue``), whichever way it enqueues, with nothing written;
    its three queues still take jobs, and another tenant is not affected."""
    for queue in ("q1", "q2", "q3"):
        pgqueue.enqueue(TASK, {}, tenant="acme", queue=queue)
    jobs_before = Job.objects.count()

    with pytest.raises(pgqueue.TooManyQueues) as refused:
        pgqueue.enqueue(TASK, {}, tenant="acme", queue="q4")
    assert isinstance(refused.value, pgqueue.InvalidJob)
    assert refused.value.field == "queue"
    assert "MAX_QUEUES_PER_TENANT" in refused.value.reason
    assert refused.value.code == "too_many_queues"
    with pytest.raises(pgqueue.TooManyQueues):
        pgqueue.enqueue_many(TASK, [{"n": n} for n in range(2_500)], tenant="acme", queue="q4")
    with pytest.raises(pgqueue.TooManyQueues):
        pgqueue.enqueue(TASK, {}, tenant="acme", queue="q4", delay=3600)
    with pytest.raises(pgqueue.TooManyQueues):
        pgqueue.enqueue(TASK, {}, tenant="acme", queue="q4", idempotency_key="k")
    assert Job.objects.count() == jobs_before
    assert queues_of("acme") == {"q1", "q2", "q3"}

    # At the bound, its own queues take more jobs (at another priority too, a new level
    # of a queue it has), scheduled ones included.
    pgqueue.enqueue(TASK, {}, tenant="acme", queue="q2")
    pgqueue.enqueue(TASK, {}, tenant="acme", queue="q3", priority=-5)
    pgqueue.enqueue_many(TASK, [1, 2], tenant="acme", queue="q1", delay=60)
    assert Job.objects.count() == jobs_before + 4
    # Another tenant has its own three.
    pgqueue.enqueue(TASK, {}, tenant="other", queue="q4")
    assert queues_of("other") == {"q4"}


@pytest.mark.django_db
def test_no_bound_with_none() -> None:
    with override_settings(PGQUEUE={"MAX_QUEUES_PER_TENANT": None}):
        for n in range(120):  # more than the default bound, 100
            pgqueue.enqueue(TASK, {}, tenant="acme", queue=f"q{n}")
    assert len(queues_of("acme")) == 120


@pytest.mark.django_db
def test_the_default_bound_is_a_hundred() -> None:
    for n in range(100):
        pgqueue.enqueue(TASK, {}, tenant="acme", queue=f"q{n}")
    with pytest.raises(pgqueue.TooManyQueues, match="100 queues"):
        pgqueue.enqueue(TASK, {}, tenant="acme", queue="q100")


@pytest.mark.django_db
@pytest.mark.usefixtures("bound_of_three")
def test_a_taken_idempotency_key_returns_its_job_rather_than_refuse() -> None:
    """An enqueue repeated with its key (a client's retry) is answered with the job it
    made, even if it names a queue over the bound: nothing would be written anyway."""
    first, created = pgqueue.enqueue(TASK, {}, tenant="acme", queue="q1", idempotency_key="k")
    for queue in ("q2", "q3"):
        pgqueue.enqueue(TASK, {}, tenant="acme", queue=queue)
    again, created = pgqueue.enqueue(TASK, {}, tenant="acme", queue="q4", idempotency_key="k")
    assert (again.id, created) == (first.id, False)


@pytest.mark.django_db
@pytest.mark.parametrize("delay", [None, 60], ids=["runnable", "scheduled"])
def test_a_taken_key_costs_no_second_statement(delay: Any, django_assert_num_queries) -> None:
    """A tenant's first job at a level takes a second statement (JOB_ENQUEUE_FIRST or
    JOB_ENQUEUE_SCHEDULED_FIRST); a key already taken in a queue of the tenant's does not
    (SAVEPOINT, the enqueue, RELEASE, the read of the job)."""
    first, _ = pgqueue.enqueue(TASK, {}, tenant="acme", idempotency_key="k", delay=delay)
    with django_assert_num_queries(4):
        again, created = pgqueue.enqueue(TASK, {}, tenant="acme", idempotency_key="k", delay=delay)
    assert (again.id, created) == (first.id, False)


@pytest.mark.django_db
@pytest.mark.usefixtures("bound_of_three")
def test_over_http_a_fourth_queue_is_a_400_naming_queue() -> None:
    api = client(new_key(tenant="acme"))
    for queue in ("q1", "q2", "q3"):
        assert api.post("/jobs", {"task": TASK, "queue": queue}, "json").status_code == 201
    jobs_before = Job.objects.count()

    response = api.post("/jobs", {"task": TASK, "queue": "q4"}, "json")
    body = assert_error(response, 400, "too_many_queues", "queue")
    assert "MAX_QUEUES_PER_TENANT" in body["fields"]["queue"]
    response = api.post("/jobs/batch", {"task": TASK, "queue": "q4", "payloads": [{}] * 50}, "json")
    assert_error(response, 400, "too_many_queues", "queue")
    assert Job.objects.count() == jobs_before
    assert queues_of("acme") == {"q1", "q2", "q3"}

    assert api.post("/jobs", {"task": TASK, "queue": "q3"}, "json").status_code == 201
    response = api.post("/jobs/batch", {"task": TASK, "queue": "q1", "payloads": [{}] * 5}, "json")
    assert response.status_code == 201, response.content


@pytest.mark.django_db
def test_the_tasks_backend_is_bounded_too() -> None:
    """Django's Tasks framework enqueues through the same services: a Task into a queue new
    to a tenant at its bound is refused with TooManyQueues, and nothing is written."""
    tasks = {
        "default": {
            "BACKEND": "pgqueue.backends.PgQueueBackend",
            "QUEUES": [],
            "OPTIONS": {"TENANT": "acme"},
        }
    }
    with override_settings(TASKS=tasks, PGQUEUE={"MAX_QUEUES_PER_TENANT": 1}):
        t.noop.enqueue()
        with pytest.raises(pgqueue.TooManyQueues):
            t.noop.using(queue_name="other").enqueue()
        t.noop.enqueue()
    assert list(Job.objects.values_list("queue", flat=True)) == ["default", "default"]


@pytest.mark.parametrize("value", [0, -1, 2.5, "10", True])
def test_the_setting_is_checked(value: Any) -> None:
    with override_settings(PGQUEUE={"MAX_QUEUES_PER_TENANT": value}):
        errors = [e for e in checks.run_checks() if e.id == "pgqueue.E003"]
    assert any("MAX_QUEUES_PER_TENANT" in e.msg and "None or" in e.msg for e in errors), errors


@pytest.mark.parametrize("value", [None, 1, 5000])
def test_the_setting_takes_none_or_a_positive_integer(value: Any) -> None:
    with override_settings(PGQUEUE={"MAX_QUEUES_PER_TENANT": value}):
        errors = [e for e in checks.run_checks() if e.id == "pgqueue.E003"]
    assert errors == []


@pytest.mark.django_db
@pytest.mark.usefixtures("bound_of_three")
def test_over_http_a_retry_into_a_queue_over_the_bound_is_refused_too() -> None:
    """A retry runs a job again, so over HTTP it is refused where the enqueue would be:
    otherwise a tenant could cancel its jobs of three queues, let them be pruned, use
    three more, and so on, and then retry them all, live in any number of queues."""
    api = client(new_key(tenant="acme"))
    old = api.post("/jobs", {"task": TASK, "queue": "old"}, "json").json()["id"]
    assert api.delete(f"/jobs/{old}").status_code == 200
    assert [t for q, t, _, _ in prune() if q == "old"] == ["acme"]
    ids = [api.post("/jobs", {"task": TASK, "queue": q}, "json").json()["id"] for q in "xyz"]
    assert api.delete(f"/jobs/{ids[0]}").status_code == 200

    response = api.post(f"/jobs/{old}/retry")
    assert_error(response, 400, "too_many_queues", "queue")
    assert Job.objects.get(pk=old).status == "cancelled"
    assert queues_of("acme") == {"x", "y", "z"}
    response = api.post(f"/jobs/{ids[0]}/retry")  # a queue of its three: as an enqueue
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "queued"


@pytest.mark.django_db(transaction=True)
def test_concurrent_enqueues_into_new_queues_overshoot_by_at_most_their_number() -> None:
    """Eight enqueues racing into eight new queues of a tenant one queue short of its bound
    each count the others' uncommitted clocks as absent: as the statement says, the bound
    is passed by at most the number of such enqueues running at once (here it may reach
    2 + 8), and a later one, which sees them, is refused."""
    with override_settings(PGQUEUE={"MAX_QUEUES_PER_TENANT": 3}):
        for queue in ("a", "b"):
            pgqueue.enqueue(TASK, {}, tenant="acme", queue=queue)

        def enqueuer(i: int) -> bool:
            try:
                pgqueue.enqueue(TASK, {}, tenant="acme", queue=f"new{i}")
            except pgqueue.TooManyQueues:
                return False
            return True

        admitted = run_threads(8, enqueuer)
        assert 1 <= sum(admitted) <= 8
        assert len(queues_of("acme")) == 2 + sum(admitted)
        with pytest.raises(pgqueue.TooManyQueues):
            pgqueue.enqueue(TASK, {}, tenant="acme", queue="late")


# -- the prune ------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("bound_of_three")
def test_a_queue_whose_jobs_are_done_stops_counting_once_pruned() -> None:
    """A level with nothing live loses every clock; the tenant's finished queues then no
    longer count against its bound. Before the prune, they still do."""
    for queue in ("q1", "q2", "q3"):
        pgqueue.enqueue(TASK, {}, tenant="acme", queue=queue)
    drain(queues=("q1", "q2"))
    with pytest.raises(pgqueue.TooManyQueues):
        pgqueue.enqueue(TASK, {}, tenant="acme", queue="q4")

    deleted = prune()

    assert sorted((q, t) for q, t, _, _ in deleted) == [("q1", "acme"), ("q2", "acme")]
    assert queues_of("acme") == {"q3"}  # its job there is still queued
    pgqueue.enqueue(TASK, {}, tenant="acme", queue="q4")
    pgqueue.enqueue(TASK, {}, tenant="acme", queue="q5")
    assert queues_of("acme") == {"q3", "q4", "q5"}
    # Its finished jobs stay (retention removes them), in their queues.
    assert Job.objects.filter(tenant_id="acme", queue__in=["q1", "q2"], status="done").count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_maintenance_pass_prunes_idle_clocks(monkeypatch) -> None:
    """Each maintenance pass runs the prune, after the pass's own transaction."""
    monkeypatch.setattr(maintenance, "_clocks_after", None)  # this process's walk: from the first
    pgqueue.enqueue(TASK, {}, tenant="acme", queue="done")
    pgqueue.enqueue(TASK, {}, tenant="acme", queue="busy")
    drain(queues=("done",))
    with connect(autocommit=True) as conn:
        assert run_maintenance(conn).ran
    assert queues_of("acme") == {"busy"}


@pytest.mark.django_db
def test_a_prune_is_bounded_and_goes_on_where_it_stopped() -> None:
    """One prune walks at most ``levels`` levels and locks at most ``limit`` rows; the next
    goes on after the last level it walked, or from the level its row limit cut short,
    and after the last level starts again from the first."""
    for queue in ("a", "b", "c"):
        for tenant in ("t1", "t2", "t3", "t4", "t5"):
            pgqueue.enqueue(TASK, {}, tenant=tenant, queue=queue)
            drain(queues=(queue,))
    assert clocks("c") == {"t1": 1.0, "t2": 2.0, "t3": 3.0, "t4": 4.0, "t5": 5.0}
    with connection.cursor() as cursor:
        pruned = fair_store.prune_fair_clocks(cursor, levels=2, limit=100)
        assert {q for q, _, _, _ in pruned.deleted} == {"a", "b"}  # rule (a), whole
        assert pruned.after == ("b", 0)
        pruned = fair_store.prune_fair_clocks(cursor, after=pruned.after, levels=2, limit=3)
        assert [(q, v) for q, _, _, v in pruned.deleted] == [("c", 1.0), ("c", 2.0), ("c", 3.0)]
        assert pruned.after == ("b", 0)  # c was cut short: go on from it
        pruned = fair_store.prune_fair_clocks(cursor, after=pruned.after, levels=2, limit=3)
        assert sorted(v for _, _, _, v in pruned.deleted) == [4.0, 5.0]  # the rest, whole
        assert pruned.after is None  # fewer than 2 levels left: from the first next time
    assert not FairClock.objects.exists()


@pytest.mark.django_db
def test_clocks_tied_with_the_largest_go_but_one_until_the_level_goes_whole() -> None:
    """Tenants that arrived behind one head job share a vtime, the level's largest clock.
    With a row limit smaller than the level, a prune cannot take the level whole (rule a),
    but takes the clocks tied with the largest one by one (rule b), keeping one of them,
    the head of a level with nothing queued, until the level is small enough."""
    pgqueue.enqueue(TASK, {}, tenant="t0", queue="tie")  # vtime 1, the head
    for tenant in ("t1", "t2", "t3", "t4", "t5"):
        pgqueue.enqueue(TASK, {}, tenant=tenant, queue="tie")  # 2 each: the head + 1
    drain(queues=("tie",))
    assert sorted(clocks("tie").values()) == [1.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    passes = 0
    with connection.cursor() as cursor:
        while clocks("tie"):
            fair_store.prune_fair_clocks(cursor, limit=2)
            left = clocks("tie")
            assert not left or max(left.values()) == 2.0
            passes += 1
            assert passes <= 6, left


@pytest.mark.django_db
def test_a_live_tenants_clock_is_kept_and_an_idle_one_below_the_floor_goes() -> None:
    """In a level that still has live jobs, only the clock of a tenant with none there, and
    below every vtime the level still holds, is deleted. Kept: a tenant with a job queued,
    one with a job running, one with a scheduled job and one with a gated job (paused),
    whatever their clocks."""
    q = "live"
    pgqueue.enqueue(TASK, {}, tenant="idle", queue=q)
    pgqueue.enqueue(TASK, {}, tenant="runner", queue=q)
    [first] = claim("w1", queues=(q,))
    assert first.tenant == "idle" and complete("w1", first)
    [running] = claim("w1", queues=(q,))
    assert running.tenant == "runner"  # stays running
    pgqueue.enqueue(TASK, {}, tenant="later", queue=q, delay=3600)
    limits.pause_tenant("held")
    pgqueue.enqueue(TASK, {}, tenant="held", queue=q)
    pgqueue.enqueue_many(TASK, [1, 2, 3], tenant="busy", queue=q)
    assert Job.objects.get(tenant_id="held").gated
    before = clocks(q)
    assert before["idle"] < before["runner"]  # the floor is the running job's vtime
    assert before["later"] == 0.0  # a scheduled job's clock waits at 0 for its promotion

    deleted = prune()

    assert [(t, v) for _, t, _, v in deleted] == [("idle", before["idle"])]
    assert set(clocks(q)) == {"runner", "later", "held", "busy"}


@pytest.mark.django_db
def test_an_idle_clock_not_below_the_floor_is_kept() -> None:
    """An idle tenant's clock at or above the lowest vtime the level can still see is
    kept: a running job given back is queued again with its vtime and becomes the head,
    and the tenant must then start from its clock, not from that head."""
    q = "floor"
    pgqueue.enqueue_many(TASK, [1] * 5, tenant="early", queue=q)
    drain(queues=(q,))  # early's clock: 5
    pgqueue.enqueue(TASK, {}, tenant="holder", queue=q)  # vtime 6
    [held] = claim("w1", queues=(q,))
    pgqueue.enqueue_many(TASK, [1, 2], tenant="ahead", queue=q)  # 7, 8: the head was 6
    for _ in range(2):
        [job] = claim("w2", queues=(q,))
        assert job.tenant == "ahead" and complete("w2", job)
    assert clocks(q) == {"early": 5.0, "holder": 6.0, "ahead": 8.0}

    deleted = prune()

    assert [(t, v) for _, t, _, v in deleted] == [("early", 5.0)]
    assert clocks(q) == {"holder": 6.0, "ahead": 8.0}
    # The holder gives its job back (a stopping worker): queued again at 6, the head.
    with connection.cursor() as cursor:
        assert store.release_many(cursor, worker="w1", held=[(held.id, held.attempt)])
    # ahead starts from its own clock, 8, not from the head: had its clock gone, 7.
    job, _ = pgqueue.enqueue(TASK, {}, tenant="ahead", queue=q)
    assert job.vtime == 9.0
    # early's clock was below every vtime the level can see: it starts at the head either way.
    job, _ = pgqueue.enqueue(TASK, {}, tenant="early", queue=q)
    assert job.vtime == 7.0


# -- the prune changes no order -------------------------------------------------------------


def idle_level_scenario(q: str, *, pruned: bool) -> list[str]:
    """``a`` ran 5 jobs at level ``q``, which then has nothing live; then ``c`` floods 6
    jobs, ``a`` and ``b`` enqueue 2 each, one by one. Rule (a) deletes every clock of the
    level in between when ``pruned``."""
    pgqueue.enqueue_many(TASK, [1] * 5, tenant="a", queue=q)
    drain(queues=(q,))
    if pruned:
        assert {(qq, t) for qq, t, _, _ in prune()} >= {(q, "a")}
        assert clocks(q) == {}
    pgqueue.enqueue_many(TASK, list(range(6)), tenant="c", queue=q)
    for tenant in ("a", "a", "b", "b"):
        pgqueue.enqueue(TASK, {}, tenant=tenant, queue=q)
    return names(drain(queues=(q,)))


@pytest.mark.django_db
def test_a_level_pruned_whole_claims_in_the_same_order() -> None:
    """Every clock of a level with nothing live goes (rule a): the tenants then start at
    0 instead of at the old largest clock, 5, and the claims come in the same order."""
    kept = idle_level_scenario("kept", pruned=False)
    assert kept == idle_level_scenario("pruned", pruned=True)
    assert kept == ["c", "c", "a", "b", "c", "a", "b", "c", "c", "c"]


def busy_level_scenario(q: str, *, pruned: bool) -> list[str]:
    """``a`` ran 2 jobs at level ``q``; ``c`` floods 10 and 4 of them run, so the head
    passes ``a``'s clock; then ``a`` and ``b`` enqueue 2 each and ``c`` 1 more. Rule (b)
    deletes ``a``'s clock in between when ``pruned`` (and only it: ``c`` is live)."""
    pgqueue.enqueue_many(TASK, [1, 2], tenant="a", queue=q)
    order = drain(queues=(q,))
    pgqueue.enqueue_many(TASK, list(range(10)), tenant="c", queue=q)
    for _ in range(4):
        [job] = claim("w1", queues=(q,))
        assert complete("w1", job)
        order.append(job)
    if pruned:
        assert [(qq, t) for qq, t, _, _ in prune() if qq == q] == [(q, "a")]
        assert set(clocks(q)) == {"c"}
    for tenant in ("a", "a", "b", "b", "c"):
        pgqueue.enqueue(TASK, {}, tenant=tenant, queue=q)
    return names(order + drain(queues=(q,)))


@pytest.mark.django_db
def test_an_idle_clock_pruned_below_the_floor_claims_in_the_same_order() -> None:
    """A tenant's clock below every vtime of a busy level goes (rule b): its next jobs
    start at the head either way, so the claims come in the same order."""
    kept = busy_level_scenario("kept", pruned=False)
    assert kept == busy_level_scenario("pruned", pruned=True)
    assert kept[6:11] == ["c", "c", "a", "b", "c"]  # a and b interleave with the flood


@pytest.mark.django_db
def test_by_time_a_clock_a_correction_will_still_move_is_kept() -> None:
    """With FAIRNESS = "time", maintenance later moves a tenant's clock by its attempts'
    errors (FAIR_CLOCK_CORRECT): a clock with such an attempt pending is kept, and goes
    once the correction has passed it."""
    with override_settings(PGQUEUE={"FAIRNESS": "time"}):
        pgqueue.enqueue(TASK, {}, tenant="a", queue="timed")
        drain(queues=("timed",))
        assert prune() == []
        with connection.cursor() as cursor:
            fair_store.correct_fair_clocks(cursor, settle=0)
        assert [(q, t) for q, t, _, _ in prune()] == [("timed", "a")]


# -- the prune under concurrency ------------------------------------------------------------


def connect(**kwargs: Any) -> psycopg.Connection:
    """A connection of its own to the test database (not autocommit unless asked)."""
    params = connection.settings_dict
    return psycopg.connect(
        dbname=params["NAME"],
        user=params["USER"] or None,
        password=params["PASSWORD"] or None,
        host=params["HOST"] or None,
        port=params["PORT"] or None,
        **kwargs,
    )


def enqueue_on(conn: psycopg.Connection, tenant: str, queue: str, n: int = 1, **options) -> list:
    """store.enqueue of ``n`` jobs on ``conn``, in its open transaction."""
    with conn.cursor() as cursor:
        jobs, _ = store.enqueue(
            cursor,
            task=TASK,
            tenant=tenant,
            queue=queue,
            priority=0,
            max_attempts=5,
            payloads_json="[" + ",".join(["{}"] * n) + "]",
            count=n,
            **options,
        )
    return jobs


def wait_until_blocked(pid: int, timeout: float = 30.0) -> None:
    """Poll until the backend ``pid`` waits for a lock (a statement blocked on a row)."""
    deadline = time.monotonic() + timeout
    with connect(autocommit=True) as watcher:
        while True:
            row = watcher.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
            ).fetchone()
            if row is not None and row[0] == "Lock":
                return
            if time.monotonic() > deadline:
                pytest.fail(f"backend {pid} did not block on a lock in {timeout}s", pytrace=False)
            time.sleep(0.005)


def in_thread(target: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``target()`` on a thread; its result or error lands in the dict returned."""
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["result"] = target()
        except BaseException as exc:  # re-raised by the test
            out["error"] = exc

    thread = threading.Thread(target=body)
    thread.start()
    return thread, out


def joined(thread: threading.Thread, out: dict[str, Any]) -> Any:
    thread.join(60)
    assert not thread.is_alive(), "the thread did not finish"
    if "error" in out:
        raise out["error"]
    return out.get("result")


@pytest.mark.django_db(transaction=True)
def test_a_prune_never_takes_the_clock_of_an_uncommitted_enqueue() -> None:
    """Proves the lock-then-decide protection: an enqueue holds its tenant's clock (its
    UPDATE) until it commits, so FAIR_CLOCK_LOCK_IDLE, which locks FOR UPDATE SKIP LOCKED
    before FAIR_CLOCK_DELETE_IDLE decides, leaves that clock alone although the job is not
    visible yet. The control runs the decision without the lock first: it waits for the
    enqueue's lock, which it took on a snapshot without the job, and then deletes the clock
    of a job that is committed."""
    pgqueue.enqueue(TASK, {}, tenant="a", queue="open")
    drain(queues=("open",))  # the level has nothing live: a's clock is prunable
    with connect() as other:
        enqueue_on(other, "a", "open")  # holds a's clock, uncommitted
        assert prune() == []
        other.commit()
    assert clocks("open") == {"a": 2.0}
    assert Job.objects.filter(queue="open", status="queued").count() == 1

    # The control: the same decision, not preceded by the lock, on a second idle level.
    pgqueue.enqueue(TASK, {}, tenant="a", queue="open2")
    drain(queues=("open2",))
    clock_id = FairClock.objects.get(queue="open2").id
    with connect() as other:
        enqueue_on(other, "a", "open2")

        def unprotected() -> list:
            with connect(autocommit=True) as pruner:
                return pruner.execute(
                    sql.FAIR_CLOCK_DELETE_IDLE, {"ids": [clock_id], "by_vtime": True}
                ).fetchall()

        thread, out = in_thread(unprotected)
        wait_until_blocked_on_clock(clock_id)
        other.commit()
        deleted = joined(thread, out)
    assert [t for _, t, _, _ in deleted] == ["a"]
    assert Job.objects.filter(queue="open2", status="queued").count() == 1
    assert clocks("open2") == {}  # a queued job whose clock is gone: what the lock prevents


def wait_until_blocked_on_clock(clock_id: int, timeout: float = 30.0) -> None:
    """Poll until some backend waits for a lock held on the clock row ``clock_id``."""
    deadline = time.monotonic() + timeout
    with connect(autocommit=True) as watcher:
        while True:
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND query LIKE %s",
                ["%WITH mine AS%"],
            ).fetchone()
            if row[0]:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"nothing blocked on clock {clock_id} in {timeout}s", pytrace=False)
            time.sleep(0.005)


@pytest.mark.django_db(transaction=True)
def test_a_prune_decides_on_a_snapshot_taken_after_its_locks() -> None:
    """Proves the second snapshot: a job committed after FAIR_CLOCK_LOCK_IDLE chose and
    locked a clock (a scheduled enqueue takes no lock on an existing clock) is seen by
    FAIR_CLOCK_DELETE_IDLE, which then keeps the clock. The first statement's choice, had
    it been trusted, would have deleted it."""
    pgqueue.enqueue(TASK, {}, tenant="a", queue="late")
    drain(queues=("late",))
    clock_id = FairClock.objects.get(queue="late").id
    with transaction.atomic(), connection.cursor() as cursor:
        ids = lock_idle(cursor)
        assert ids == [clock_id]  # chosen and locked: the level had nothing live
        with connect(autocommit=True) as other:
            other.execute("SET lock_timeout = '5s'")
            enqueue_on(other, "a", "late", run_at=timezone.now() + dt.timedelta(hours=1))
        cursor.execute(sql.FAIR_CLOCK_DELETE_IDLE, {"ids": ids, "by_vtime": True})
        assert cursor.fetchall() == []
    assert clocks("late") == {"a": 1.0}


def first_enqueue_race(q: str) -> list[str]:
    """``a`` ran 5 jobs at level ``q``, which has nothing live. ``n`` enqueues its first 3
    jobs there (vtimes 6..8, from the largest clock, ``a``'s) and has not committed when a
    prune runs; ``b`` then enqueues 3 and commits; then ``n`` commits. The claim order."""
    pgqueue.enqueue_many(TASK, [1] * 5, tenant="a", queue=q)
    drain(queues=(q,))
    with connect() as other:
        enqueue_on(other, "n", q, 3)
        prune()
        pgqueue.enqueue_many(TASK, [1, 2, 3], tenant="b", queue=q)
        other.commit()
    return names(drain(queues=(q,)))


@pytest.mark.django_db(transaction=True)
def test_a_first_enqueue_at_a_level_keeps_it_from_starting_over(monkeypatch) -> None:
    """Proves the KEY SHARE lock of a first enqueue at a level: it holds the level's largest
    clock, which FAIR_CLOCK_LOCK_IDLE then cannot lock, so the level (whose only job is
    not committed yet) is not pruned whole; ``b``, who enqueues meanwhile, starts where
    ``n`` started and they interleave. The control takes the lock out of JOB_ENQUEUE: the
    level starts again from 0 under ``n``'s uncommitted jobs, and ``b``'s later jobs all
    run before them."""
    assert first_enqueue_race("held") == ["n", "b"] * 3
    assert set(clocks("held")) == {"a", "n", "b"}

    monkeypatch.setattr(
        sql, "JOB_ENQUEUE_FIRST", sql.JOB_ENQUEUE_FIRST.replace("FOR KEY SHARE", "")
    )
    assert first_enqueue_race("unheld") == ["b"] * 3 + ["n"] * 3


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_that_waited_for_a_pruned_clock_runs_again() -> None:
    """An enqueue that reaches its tenant's clock while a prune holds it waits, finds it
    deleted and runs its statement again with a new snapshot ('raced'): its jobs take the
    head of the level as it is after the prune (here started over: 1, 2, 3), not the head
    its first snapshot showed (6, 7, 8, beside clocks deleted since), so ``b``, enqueueing
    after the prune, interleaves with them."""
    q = "raced"
    pgqueue.enqueue_many(TASK, [1] * 5, tenant="a", queue=q)
    drain(queues=(q,))
    with connect() as other:
        with transaction.atomic(), connection.cursor() as cursor:
            ids = lock_idle(cursor)
            assert len(ids) == 1
            thread, out = in_thread(lambda: enqueue_on(other, "a", q, 3))
            wait_until_blocked(other.info.backend_pid)
            cursor.execute(sql.FAIR_CLOCK_DELETE_IDLE, {"ids": ids, "by_vtime": True})
            assert [t for _, t, _, _ in cursor.fetchall()] == ["a"]
        jobs = joined(thread, out)
        vtimes = other.execute(
            "SELECT vtime FROM pgqueue_job WHERE id = ANY(%s) ORDER BY id", [[j.id for j in jobs]]
        ).fetchall()
        assert [v for (v,) in vtimes] == [1.0, 2.0, 3.0]
        pgqueue.enqueue_many(TASK, [1, 2, 3], tenant="b", queue=q)
        other.commit()
    assert names(drain(queues=(q,))) == ["a", "b"] * 3


def retry_race(q: str) -> list[str]:
    """``s``'s job at level ``q`` is dead and ``s`` has no clock there (pruned); ``a`` ran 5
    jobs there since. An operator retries ``s``'s job (promoted at once: its first clock at
    the level, vtime 6 from ``a``'s clock) and has not committed when a prune runs; ``b``
    then enqueues 3 and commits; then the operator commits. The claim order."""
    pgqueue.enqueue(TASK, {}, tenant="s", queue=q)
    [job] = claim("w1", queues=(q,))
    assert fail("w1", job, permanent=True) == "dead"
    prune()
    assert clocks(q) == {}
    pgqueue.enqueue_many(TASK, [1] * 5, tenant="a", queue=q)
    drain(queues=(q,))
    with connect() as operator:
        with operator.cursor() as cursor:
            assert [i for i, due in store.retry_many(cursor, [job.id]) if due] == [job.id]
            assert store.promote_ids(cursor, [job.id]) == [job.id]
        prune()
        pgqueue.enqueue_many(TASK, [1, 2, 3], tenant="b", queue=q)
        operator.commit()
    return names(drain(queues=(q,)))


@pytest.mark.django_db(transaction=True)
def test_a_promotion_that_creates_a_clock_keeps_its_level_from_starting_over(
    monkeypatch,
) -> None:
    """Proves FAIR_CLOCK_ENSURE_*'s KEY SHARE lock, as the test above JOB_ENQUEUE's: a
    retried job promoted with a clock created for it holds the level's largest clock, so
    the level is not pruned whole under it and ``b``, enqueueing meanwhile, comes after
    it. The control takes the lock out: ``b``'s jobs run first."""
    assert retry_race("retried") == ["s", "b", "b", "b"]

    for name in ("FAIR_CLOCK_ENSURE_MANY", "FAIR_CLOCK_ENSURE_DUE"):
        monkeypatch.setattr(sql, name, getattr(sql, name).replace("FOR KEY SHARE OF k", ""))
    assert retry_race("unheld") == ["b", "b", "b", "s"]
