"""Concurrency keys and sequences (pgqueue/queries/keys.sql, KEY_SETTLE): at most N jobs of
one key hold a slot at once; N = 1 runs a key's jobs one at a time in enqueue order."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.test import override_settings

import pgqueue
from pgqueue import claim_store, key_store, limits, services, store
from pgqueue.exceptions import InvalidJob
from pgqueue.key_models import ConcurrencyKey
from pgqueue.limit_reads import waiting_for
from pgqueue.models import Job
from pgqueue.worker.connection import connect, connect_params
from pgqueue.worker.maintenance import run_maintenance
from tests.conftest import later
from tests.workers import wait_for, waiting_on_a_lock

pytestmark = pytest.mark.django_db


def enqueue(n: int, key: str | None, cap: int = 1, **options: Any) -> list[int]:
    return pgqueue.enqueue_many(
        "test.noop",
        [{"i": i} for i in range(n)],
        concurrency_key=key,
        key_max_running=cap,
        **options,
    )


def settle(ids: list[int] = (), admit: int = 100) -> int:  # type: ignore[assignment]
    with transaction.atomic(), connection.cursor() as cur:
        return key_store.settle(cur, list(ids), admit=admit)


def claim(limit: int = 10) -> list[store.ClaimedJob]:
    with connection.cursor() as cur:
        return store.claim(cur, worker="w", queues=["default"], limit=limit)


def finish(jobs: list[store.ClaimedJob]) -> None:
    """Record successes and settle their keys in one transaction, as the recorder does."""
    with transaction.atomic(), connection.cursor() as cur:
        store.complete_many(cur, worker="w", results=[(j.id, j.attempt, None) for j in jobs])
        key_store.settle(cur, [j.id for j in jobs])


def states(ids: list[int]) -> list[tuple[str, str, bool | None]]:
    rows = {j.id: j for j in Job.objects.filter(id__in=ids)}
    return [(rows[i].status, rows[i].key_state, rows[i].gated) for i in ids]


def held(key: str) -> int:
    row = ConcurrencyKey.objects.filter(key=key).first()
    return row.running if row else 0


def test_a_keyed_job_waits_out_of_both_claim_indexes_until_admitted():
    (job,) = enqueue(1, "user:1")
    assert states([job]) == [("queued", "new", None)]
    assert claim() == []  # not admitted yet: the claim does not see it
    assert settle() == 1
    assert states([job]) == [("queued", "held", False)]
    assert held("user:1") == 1
    (got,) = claim()
    assert (got.id, got.concurrency_key) == (job, "user:1")


def test_a_sequence_runs_its_jobs_one_at_a_time_in_enqueue_order():
    ids = enqueue(4, "user:1")
    other = enqueue(2, "user:2")
    settle()
    assert states(ids)[0][1] == "held" and {s[1] for s in states(ids)[1:]} == {"waiting"}
    order = []
    while jobs := claim():
        assert len([j for j in jobs if j.concurrency_key == "user:1"]) <= 1
        order += [j.id for j in jobs if j.concurrency_key == "user:1"]
        finish(jobs)
    assert order == ids
    assert states(other) == [("done", "", False)] * 2
    assert not ConcurrencyKey.objects.exists()  # no row once no slot is held


def test_a_cap_of_three_admits_three_and_hands_each_freed_slot_on():
    ids = enqueue(7, "tenant-export", cap=3)
    settle()
    first = claim()
    assert [j.id for j in first] == ids[:3]
    assert held("tenant-export") == 3
    finish(first[:1])  # one slot comes back and passes to the oldest waiting job
    assert [j.id for j in claim()] == [ids[3]]
    assert held("tenant-export") == 3


@pytest.mark.django_db(transaction=True)
def test_a_turn_hands_the_slot_on_and_claims_the_next_job_of_the_sequence_at_once():
    a, b = enqueue(2, "seq")
    settle()
    (job,) = claim()
    params = connect_params("default")
    with connect(params, autocommit=True) as db:
        done = claim_store.turn(
            db,
            worker="w",
            queues=["default"],
            limit=5,
            successes=[claim_store.Success(job.id, job.attempt, None)],
            settle=True,
        )
    assert done.recorded == {a}
    assert [j.id for j in done.jobs] == [b]


def test_a_retry_holds_its_sequence_and_a_dead_job_gives_it_back():
    a, b = enqueue(2, "seq", max_attempts=2)
    settle()
    (job,) = claim()
    with transaction.atomic(), connection.cursor() as cur:
        failure = store.Failure(job.id, job.attempt, "boom")
        assert store.fail_many(cur, worker="w", failures=[failure]) == {a: "scheduled"}
        key_store.settle(cur, [a])
    assert states([a, b]) == [("scheduled", "held", False), ("queued", "waiting", None)]
    with connection.cursor() as cur:
        store.promote_due(cur, now=later(3600))
    (again,) = claim()
    assert again.id == a  # the retry runs before the next job of its key
    with transaction.atomic(), connection.cursor() as cur:
        failure = store.Failure(again.id, again.attempt, "boom again")
        assert store.fail_many(cur, worker="w", failures=[failure]) == {a: "dead"}
        key_store.settle(cur, [a])
    assert states([a, b]) == [("dead", "", False), ("queued", "held", False)]


@override_settings(PGQUEUE={"DEAD_JOB_HOLDS_KEY": True})
def test_with_dead_job_holds_key_a_dead_job_stops_its_sequence_until_retried():
    a, b = enqueue(2, "seq", max_attempts=1)
    settle()
    (job,) = claim()
    with transaction.atomic(), connection.cursor() as cur:
        store.fail_many(cur, worker="w", failures=[store.Failure(job.id, job.attempt, "x")])
        key_store.settle(cur, [a])
    assert states([a, b]) == [("dead", "held", False), ("queued", "waiting", None)]
    assert claim() == []
    services.retry(a)  # runs again in the slot it kept
    (again,) = claim()
    assert again.id == a
    finish([again])
    assert [j.id for j in claim()] == [b]


def test_cancelling_the_holder_hands_the_slot_on_and_cancelling_a_waiting_job_does_not():
    a, b, c = enqueue(3, "seq")
    settle()
    services.cancel(b)  # waiting: nothing to give back
    assert states([a, b]) == [("queued", "held", False), ("cancelled", "waiting", None)]
    assert held("seq") == 1
    services.cancel(a)  # admitted, not yet claimed: its slot goes to c
    assert states([a, c]) == [("cancelled", "", False), ("queued", "held", False)]
    assert [j.id for j in claim()] == [c]


def test_a_retried_job_that_gave_its_slot_back_is_admitted_again():
    (a,) = enqueue(1, "seq")
    services.cancel(a)
    services.retry(a)
    assert states([a]) == [("queued", "new", None)]
    settle()
    assert [j.id for j in claim()] == [a]


def test_a_scheduled_keyed_job_is_admitted_after_its_promotion():
    (a,) = enqueue(1, "seq", delay=60)
    with connection.cursor() as cur:
        store.promote_due(cur, now=later(120))
    assert states([a]) == [("queued", "new", None)]
    settle()
    assert [j.id for j in claim()] == [a]


def test_an_admitted_job_of_a_capped_tenant_is_gated_and_counted_by_the_claim():
    limits.set_tenant_limits("t", max_running=1)
    a, b = pgqueue.enqueue_many(
        "test.noop", [{}, {}], tenant="t", concurrency_key=lambda p: f"k{id(p)}"
    )
    settle()
    assert states([a, b]) == [("queued", "held", True)] * 2  # both keys admit, the cap gates
    assert len(claim()) == 1


def test_jobs_without_a_key_are_untouched():
    ids = enqueue(2, None)
    assert states(ids) == [("queued", "", False)] * 2
    assert settle() == 0
    assert len(claim()) == 2


def test_a_task_gives_each_job_its_key_from_the_payload():
    from tests.taskapp.tasks import per_user

    ids = per_user.enqueue_many([{"user": 1}, {"user": 2}, {"user": 1}])
    rows = {j.id: j for j in Job.objects.filter(id__in=ids)}
    assert [rows[i].concurrency_key for i in ids] == ["user:1", "user:2", "user:1"]
    assert {rows[i].key_max_running for i in ids} == {1}


@pytest.mark.parametrize(
    "options, field",
    [
        ({"concurrency_key": "x" * 129}, "concurrency_key"),
        ({"concurrency_key": ""}, "concurrency_key"),
        ({"concurrency_key": 42}, "concurrency_key"),
        ({"concurrency_key": "k", "key_max_running": 0}, "key_max_running"),
        ({"concurrency_key": "k", "key_max_running": 10_001}, "key_max_running"),
        ({"concurrency_key": lambda p: "x" * 200}, "concurrency_key"),
    ],
)
def test_a_bad_key_or_cap_is_refused_with_its_field(options, field):
    with pytest.raises(InvalidJob) as raised:
        pgqueue.enqueue("test.noop", {}, **options)
    assert raised.value.field == field
    assert not Job.objects.exists()


def test_waiting_for_says_key_cap():
    a, b = enqueue(2, "seq")
    assert waiting_for(Job.objects.get(id=b))["waiting_for"] == "key_cap"
    settle()
    assert waiting_for(Job.objects.get(id=b))["waiting_for"] == "key_cap"
    assert waiting_for(Job.objects.get(id=a))["waiting_for"] == "turn"


@pytest.mark.django_db(transaction=True)
def test_maintenance_admits_keyed_jobs_no_worker_was_told_of():
    """The net under a missed wake-up: each maintenance pass examines new keyed jobs."""
    (a,) = enqueue(1, "seq")
    with psycopg.connect(**connect_params("default"), autocommit=True) as db:
        assert run_maintenance(db).ran
    assert states([a]) == [("queued", "held", False)]


@pytest.mark.django_db(transaction=True)
def test_two_admissions_of_one_key_fill_its_free_slots_once():
    """Protection: KEY_SETTLE reads a key's row under its lock (``held``: FOR UPDATE SKIP
    LOCKED). One admission holds the row, uncommitted, having filled the key's two free
    slots; a second, on another connection, with other new jobs of the key, must not fill
    them again: it passes the locked row over and admits nothing. With the locking clause
    removed it read ``running`` as of its snapshot and admitted two more (5 held, cap 3)."""
    enqueue(1, "k", cap=3)
    settle()  # one slot held: two free
    enqueue(4, "k", cap=3)
    params = connect_params("default")
    with connect(params, autocommit=False) as a, connect(params, autocommit=False) as b:
        with a.cursor() as cur:
            assert key_store.settle(cur, admit=2) == 2
        outcome: dict[str, Any] = {}

        def second() -> None:
            with b.cursor() as cur:
                outcome["examined"] = key_store.settle(cur, admit=2)
            b.commit()

        thread = threading.Thread(target=second)
        thread.start()
        # With the lock it never waits; without, it waits for a's row to write its count.
        wait_for(
            lambda: not thread.is_alive() or waiting_on_a_lock(b.info.backend_pid),
            30,
            "the second admission to end or wait",
        )
        a.commit()
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert outcome["examined"] == 2
    assert Job.objects.filter(concurrency_key="k", key_state="held").count() == 3
    assert held("k") == 3
    assert Job.objects.filter(concurrency_key="k", key_state="new").count() == 2


# -- over HTTP ------------------------------------------------------------------------------


def test_post_jobs_takes_a_key_and_get_jobs_id_says_it_waits_for_it():
    from tests.api_fixtures import client, new_key

    api = client(new_key())
    first = api.post(
        "/jobs",
        {"task": "test.noop", "concurrency_key": "user:7", "key_max_running": 1},
        format="json",
    )
    assert first.status_code == 201, first.content
    body = first.json()
    assert (body["concurrency_key"], body["key_max_running"]) == ("user:7", 1)
    second = api.post("/jobs", {"task": "test.noop", "concurrency_key": "user:7"}, format="json")
    settle()
    detail = api.get(f"/jobs/{second.json()['id']}").json()
    assert detail["waiting_for"] == "key_cap"
    assert api.get(f"/jobs/{body['id']}").json()["waiting_for"] == "turn"


def test_post_jobs_batch_takes_one_key_for_all_or_one_per_payload():
    from tests.api_fixtures import client, new_key

    api = client(new_key())
    one = api.post(
        "/jobs/batch",
        {"task": "test.noop", "payloads": [{}, {}], "concurrency_key": "k", "key_max_running": 2},
        format="json",
    )
    assert one.status_code == 201, one.content
    rows = Job.objects.filter(id__in=one.json()["ids"])
    assert {(j.concurrency_key, j.key_max_running) for j in rows} == {("k", 2)}
    each = api.post(
        "/jobs/batch",
        {"task": "test.noop", "payloads": [{}, {}, {}], "concurrency_keys": ["a", None, "b"]},
        format="json",
    )
    assert each.status_code == 201, each.content
    ids = each.json()["ids"]
    keys = dict(Job.objects.filter(id__in=ids).values_list("id", "concurrency_key"))
    assert [keys[i] for i in ids] == ["a", None, "b"]


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/jobs", {"concurrency_key": "x" * 129}, "concurrency_key"),
        ("/jobs", {"concurrency_key": 7}, "concurrency_key"),
        ("/jobs", {"concurrency_key": "k", "key_max_running": 0}, "key_max_running"),
        ("/jobs", {"concurrency_key": "k", "key_max_running": "2"}, "key_max_running"),
        ("/jobs/batch", {"payloads": [{}], "concurrency_keys": ["a", "b"]}, "concurrency_keys"),
        ("/jobs/batch", {"payloads": [{}], "concurrency_keys": [7]}, "concurrency_key"),
        (
            "/jobs/batch",
            {"payloads": [{}], "concurrency_key": "a", "concurrency_keys": ["a"]},
            "concurrency_keys",
        ),
    ],
)
def test_a_bad_key_over_http_is_a_400_naming_its_field(path, body, field):
    from tests.api_fixtures import assert_error, client, new_key

    response = client(new_key()).post(path, {"task": "test.noop", **body}, format="json")
    assert_error(response, 400, field=field)
    assert not Job.objects.exists()


def test_metrics_count_keys_slots_and_waiting_jobs_without_a_label_per_key():
    from prometheus_client.parser import text_string_to_metric_families

    from pgqueue.metrics import render

    enqueue(3, "a", cap=2)
    enqueue(1, "b")
    settle()
    enqueue(1, "c")  # new: not examined yet
    body, _ = render()
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    values = {
        name: [(s.labels, s.value) for s in families[name].samples]
        for name in ("pgqueue_keys_held", "pgqueue_key_slots_held", "pgqueue_jobs_waiting_for_key")
    }
    assert values == {
        "pgqueue_keys_held": [({}, 2)],
        "pgqueue_key_slots_held": [({}, 3)],
        "pgqueue_jobs_waiting_for_key": [({}, 2)],
    }
    # The jobs waiting for a key are queued jobs, in every count of them.
    from pgqueue import reads

    assert reads.job_counts()["default"]["queued"] == 5
    assert set(reads.oldest_runnable()) == {"default"}
    assert reads.top_backlogs(5)[0][1:] == (5, 0, 5)
