"""The HTTP API: every endpoint, its answers and its errors (with an all-tenants key).

Authentication, tenant isolation and rate limits are in test_api_auth.py; the OpenAPI
schema, the docs page and the Prometheus text in test_api_schema.py.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from rest_framework.test import APIClient

from pgqueue import services
from pgqueue.models import Job, JobAttempt, QueueWeight, Status, Tenant, Worker
from tests.api_fixtures import (
    HISTORY_FIELDS,
    STATS_FIELDS,
    assert_error,
    assert_job_json,
    client,
    fail_once_then_complete,
    job_rows,
    make_job,
    new_key,
    status_of,
)
from tests.conftest import run_threads

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(db: Any) -> APIClient:
    """A client with an all-tenants API key."""
    return client(new_key())


def when(value: str) -> dt.datetime:
    parsed = parse_datetime(value)
    assert parsed is not None and parsed.tzinfo is not None, value
    return parsed


def post_job(api: APIClient, **body: Any) -> Any:
    return api.post("/jobs", body, format="json")


# -- POST /jobs ---------------------------------------------------------------------------


class TestEnqueue:
    def test_201_with_the_whole_job_and_the_defaults(self, api):
        before = timezone.now()
        response = post_job(api, task="test.echo", payload={"text": "hi", "n": [1, 2]})
        assert response.status_code == 201, response.content
        data = response.json()
        assert_job_json(data)
        assert data["task"] == "test.echo"
        assert data["payload"] == {"text": "hi", "n": [1, 2]}
        assert (data["tenant"], data["queue"], data["status"]) == ("default", "default", "queued")
        assert (data["priority"], data["attempts"], data["max_attempts"]) == (0, 0, 5)
        assert data["lost_claims"] == 0
        for empty in ("started_at", "finished_at", "last_error", "result", "idempotency_key"):
            assert data[empty] is None, empty
        assert when(data["run_at"]) <= timezone.now()
        assert when(data["created_at"]) <= timezone.now()
        assert when(data["run_at"]) >= before - dt.timedelta(minutes=1)

        stored = Job.objects.get(pk=data["id"])
        assert (stored.task, stored.tenant_id, stored.status) == ("test.echo", "default", "queued")
        assert stored.payload == {"text": "hi", "n": [1, 2]}
        assert Tenant.objects.filter(name="default").exists()

    def test_payload_defaults_to_an_empty_object(self, api):
        response = post_job(api, task="test.noop")
        assert response.status_code == 201, response.content
        assert response.json()["payload"] == {}
        assert Job.objects.get().payload == {}

    @pytest.mark.parametrize("payload", [[1, "two", None], "text", 42, 1.5, True, None])
    def test_any_json_payload(self, api, payload):
        response = post_job(api, task="test.echo", payload=payload)
        assert response.status_code == 201, response.content
        assert response.json()["payload"] == payload
        assert Job.objects.get().payload == payload

    def test_every_option(self, api):
        response = post_job(
            api,
            task="test.echo",
            payload={"a": 1},
            tenant="Acme-1.x_Y",
            queue="emails",
            priority=-100,
            idempotency_key="order-42",
            max_attempts=100,
        )
        assert response.status_code == 201, response.content
        data = response.json()
        assert (data["tenant"], data["queue"], data["priority"]) == ("Acme-1.x_Y", "emails", -100)
        assert (data["max_attempts"], data["idempotency_key"]) == (100, "order-42")
        stored = Job.objects.get(pk=data["id"])
        assert (stored.tenant_id, stored.queue, stored.priority) == ("Acme-1.x_Y", "emails", -100)
        assert (stored.max_attempts, stored.idempotency_key) == (100, "order-42")

    @pytest.mark.parametrize(("field", "value"), [("priority", 100), ("max_attempts", 1)])
    def test_range_bounds_are_accepted(self, api, field, value):
        response = post_job(api, task="test.noop", **{field: value})
        assert response.status_code == 201, response.content
        assert response.json()[field] == value

    def test_a_new_tenant_is_created_with_weight_one(self, api):
        assert post_job(api, task="test.noop", tenant="brand-new").status_code == 201
        assert Tenant.objects.get(name="brand-new").weight == 1.0
        assert api.get("/tenants/brand-new").json()["weight"] == 1.0

    def test_default_max_attempts_comes_from_settings(self, api):
        with override_settings(PGQUEUE={"DEFAULT_MAX_ATTEMPTS": 7}):
            response = post_job(api, task="test.noop")
        assert response.json()["max_attempts"] == 7

    def test_delay_seconds_schedules_the_job(self, api):
        before = timezone.now()
        response = post_job(api, task="test.noop", delay_seconds=60)
        assert response.status_code == 201, response.content
        data = response.json()
        assert data["status"] == "scheduled"
        run_at = when(data["run_at"])
        assert (
            before + dt.timedelta(seconds=59) <= run_at <= timezone.now() + dt.timedelta(seconds=61)
        )
        assert Job.objects.get().status == Status.SCHEDULED

    def test_delay_bounds(self, api):
        zero = post_job(api, task="test.noop", delay_seconds=0)
        assert zero.status_code == 201 and zero.json()["status"] == "queued"
        fractional = post_job(api, task="test.noop", delay_seconds=0.5)
        assert fractional.status_code == 201 and fractional.json()["status"] == "scheduled"
        year = post_job(api, task="test.noop", delay_seconds=31_536_000)
        assert year.status_code == 201 and year.json()["status"] == "scheduled"
        assert when(year.json()["run_at"]) > timezone.now() + dt.timedelta(days=364)

    def test_run_at_in_the_future_schedules_at_that_moment(self, api):
        response = post_job(api, task="test.noop", run_at="2099-01-01T12:00:00+02:00")
        assert response.status_code == 201, response.content
        data = response.json()
        assert data["status"] == "scheduled"
        expected = dt.datetime(2099, 1, 1, 10, 0, tzinfo=dt.UTC)
        assert when(data["run_at"]) == expected
        assert Job.objects.get().run_at == expected

    @pytest.mark.parametrize("run_at", ["2001-01-01T00:00:00Z", "2001-01-01T00:00:00+05:00"])
    def test_run_at_in_the_past_means_now(self, api, run_at):
        response = post_job(api, task="test.noop", run_at=run_at)
        assert response.status_code == 201, response.content
        data = response.json()
        assert data["status"] == "queued"
        assert when(data["run_at"]) > timezone.now() - dt.timedelta(minutes=5)

    def test_repeated_idempotency_key_returns_the_original_job_with_200(self, api):
        first = post_job(api, task="test.echo", payload={"n": 1}, idempotency_key="k1")
        assert first.status_code == 201, first.content
        again = post_job(api, task="test.echo", payload={"n": 2}, idempotency_key="k1")
        assert again.status_code == 200, again.content
        assert again.json() == first.json()
        assert again.json()["id"] == first.json()["id"]
        assert again.json()["payload"] == {"n": 1}
        assert job_rows() == 1

    def test_idempotency_keys_are_per_tenant(self, api):
        a = post_job(api, task="test.noop", tenant="a", idempotency_key="same")
        b = post_job(api, task="test.noop", tenant="b", idempotency_key="same")
        assert (a.status_code, b.status_code) == (201, 201)
        assert a.json()["id"] != b.json()["id"]
        assert job_rows() == 2

    def test_the_original_job_is_returned_whatever_its_state(self, api):
        first = post_job(api, task="test.noop", idempotency_key="k", queue="solo")
        job_id = first.json()["id"]
        assert api.delete(f"/jobs/{job_id}").status_code == 200
        again = post_job(api, task="test.noop", idempotency_key="k")
        assert again.status_code == 200
        assert (again.json()["id"], again.json()["status"]) == (job_id, "cancelled")
        assert job_rows() == 1

    def test_json_with_a_charset_is_json(self, api):
        body = json.dumps({"task": "test.noop"})
        response = api.post("/jobs", body, content_type="application/json; charset=utf-8")
        assert response.status_code == 201, response.content


class TestQueryBudget:
    """What a POST costs, counted and pinned: the key's lookup, then the service layer's
    statements, and no read-back of the job it answers with.

    The first request of a key also records its last use (one UPDATE, at most once a
    minute), so each test warms its key up first.
    """

    @pytest.fixture
    def warm(self, api: APIClient) -> APIClient:
        assert post_job(api, task="test.noop", tenant="acme").status_code == 201
        return api

    @staticmethod
    def _statements(captured: Any) -> list[str]:
        return [q["sql"].split(None, 1)[0].upper() for q in captured.captured_queries]

    def test_post_jobs_is_the_key_lookup_and_the_enqueue(self, warm, django_assert_num_queries):
        with django_assert_num_queries(2) as captured:  # SELECT the key, JOB_ENQUEUE
            response = post_job(warm, task="test.echo", payload={"n": 1}, tenant="acme")
        assert response.status_code == 201, response.content
        assert self._statements(captured) == ["SELECT", "WITH"]
        stored = Job.objects.get(pk=response.json()["id"])
        assert when(response.json()["created_at"]) == stored.created_at
        assert when(response.json()["run_at"]) == stored.run_at
        with django_assert_num_queries(2):  # a queue of acme's: one statement scheduled too
            assert (
                post_job(warm, task="test.noop", tenant="acme", delay_seconds=60).status_code == 201
            )

    def test_post_jobs_with_a_key_and_a_duplicate(self, warm, django_assert_num_queries):
        # SELECT the key, SAVEPOINT, JOB_ENQUEUE, RELEASE SAVEPOINT
        with django_assert_num_queries(4):
            first = post_job(warm, task="test.noop", tenant="acme", idempotency_key="k")
        assert first.status_code == 201, first.content
        # ... and one read of the original job
        with django_assert_num_queries(5) as captured:
            again = post_job(warm, task="test.noop", tenant="acme", idempotency_key="k")
        assert again.status_code == 200, again.content
        assert again.json() == first.json()
        assert self._statements(captured)[-1] == "SELECT"

    def test_post_jobs_batch(self, warm, django_assert_num_queries):
        # SELECT the key, SAVEPOINT, JOB_ENQUEUE, RELEASE SAVEPOINT
        with django_assert_num_queries(4):
            response = warm.post(
                "/jobs/batch",
                {"task": "test.noop", "tenant": "acme", "payloads": [{}] * 1000},
                format="json",
            )
        assert response.status_code == 201, response.content
        assert response.json()["count"] == 1000


# -- refused requests: the right status, a JSON error, no job written ---------------------


BAD_JOBS = [
    # (body, field named in "fields")
    ({}, "task"),
    ({"payload": {}}, "task"),
    ({"task": None}, "task"),
    ({"task": 5}, "task"),
    ({"task": ["test.noop"]}, "task"),
    ({"task": "test.noop", "tenant": 5}, "tenant"),
    ({"task": "test.noop", "tenant": ""}, "tenant"),
    ({"task": "test.noop", "tenant": "bad name"}, "tenant"),
    ({"task": "test.noop", "tenant": "a/b"}, "tenant"),
    ({"task": "test.noop", "tenant": "é"}, "tenant"),
    ({"task": "test.noop", "tenant": "t" * 65}, "tenant"),
    ({"task": "test.noop", "queue": 5}, "queue"),
    ({"task": "test.noop", "queue": ""}, "queue"),
    ({"task": "test.noop", "queue": "q" * 65}, "queue"),
    ({"task": "test.noop", "queue": "a b"}, "queue"),
    ({"task": "test.noop", "priority": "high"}, "priority"),
    ({"task": "test.noop", "priority": "5"}, "priority"),
    ({"task": "test.noop", "priority": 1.5}, "priority"),
    ({"task": "test.noop", "priority": True}, "priority"),
    ({"task": "test.noop", "priority": 101}, "priority"),
    ({"task": "test.noop", "priority": -101}, "priority"),
    ({"task": "test.noop", "priority": 10**30}, "priority"),
    ({"task": "test.noop", "max_attempts": 0}, "max_attempts"),
    ({"task": "test.noop", "max_attempts": 101}, "max_attempts"),
    ({"task": "test.noop", "max_attempts": -1}, "max_attempts"),
    ({"task": "test.noop", "max_attempts": "3"}, "max_attempts"),
    ({"task": "test.noop", "max_attempts": 2.5}, "max_attempts"),
    ({"task": "test.noop", "idempotency_key": 5}, "idempotency_key"),
    ({"task": "test.noop", "idempotency_key": ""}, "idempotency_key"),
    ({"task": "test.noop", "idempotency_key": "k" * 256}, "idempotency_key"),
    ({"task": "test.noop", "delay_seconds": -1}, "delay_seconds"),
    ({"task": "test.noop", "delay_seconds": 31_536_001}, "delay_seconds"),
    ({"task": "test.noop", "delay_seconds": "10"}, "delay_seconds"),
    ({"task": "test.noop", "delay_seconds": True}, "delay_seconds"),
    ({"task": "test.noop", "run_at": "tomorrow"}, "run_at"),
    ({"task": "test.noop", "run_at": 1_700_000_000}, "run_at"),
    # Well-formed ISO-8601 text that names no real moment.
    ({"task": "test.noop", "run_at": "2030-02-30T00:00:00Z"}, "run_at"),
    ({"task": "test.noop", "run_at": "2030-01-01T25:00:00Z"}, "run_at"),
    ({"task": "test.noop", "payload": {"text": "a\u0000b"}}, "payload"),
    ({"task": "test.noop", "colour": "red"}, "colour"),
    ({"task": "test.noop", "payloads": [{}]}, "payloads"),
]


@pytest.mark.parametrize(("body", "field"), BAD_JOBS, ids=[repr(b) for b, _ in BAD_JOBS])
def test_a_missing_mistyped_or_out_of_range_field_is_400_naming_it(api, body, field):
    response = api.post("/jobs", body, format="json")
    error = assert_error(response, 400, field=field)
    assert field in error["detail"]
    assert job_rows() == 0


def test_an_unknown_task_is_400_naming_the_task(api):
    response = post_job(api, task="no.such.task", payload={})
    error = assert_error(response, 400, field="task")
    assert "no.such.task" in error["detail"]
    assert "no.such.task" in error["fields"]["task"]
    assert job_rows() == 0


def test_delay_seconds_and_run_at_together_are_400(api):
    response = post_job(api, task="test.noop", delay_seconds=5, run_at="2099-01-01T00:00:00Z")
    error = assert_error(response, 400)
    assert {"delay_seconds", "run_at"} & set(error.get("fields", {}))
    assert job_rows() == 0


@pytest.mark.parametrize(
    "text",
    [
        '{"task": "test.noop"',
        '{"task": test.noop}',
        "{'task': 'test.noop'}",
        '{"task": "test.noop", "delay_seconds": NaN}',
        '{"task": "test.noop", "priority": Infinity}',
        "\xff\xfe",
    ],
)
def test_malformed_json_is_400(api, text):
    response = api.post("/jobs", text.encode("latin-1"), content_type="application/json")
    assert_error(response, 400)
    assert job_rows() == 0


@pytest.mark.parametrize("text", ["[1, 2]", '"test.noop"', "42", "null"])
def test_a_body_that_is_not_an_object_is_400(api, text):
    assert_error(api.post("/jobs", text, content_type="application/json"), 400)
    assert job_rows() == 0


@pytest.mark.parametrize(
    ("path", "method"),
    [("/jobs", "post"), ("/jobs/batch", "post"), ("/tenants/acme", "put")],
)
@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/xml", "multipart/form-data"],
)
def test_a_body_that_is_not_json_is_415(api, path, method, content_type):
    if content_type == "multipart/form-data":
        response = getattr(api, method)(path, {"task": "test.noop", "weight": "2"})
    else:
        body = '{"task": "test.noop", "payloads": [{}], "weight": 2}'
        response = getattr(api, method)(path, body, content_type=content_type)
    assert_error(response, 415)
    assert job_rows() == 0
    assert not Tenant.objects.filter(name="acme").exists()


class TestPayloadLimit:
    @pytest.fixture(autouse=True)
    def small_limit(self):
        with override_settings(PGQUEUE={"MAX_PAYLOAD_BYTES": 100}):
            yield

    def test_a_payload_at_the_limit_is_accepted(self, api):
        payload = {"x": "a" * 92}  # {"x":"aaa..."} is exactly 100 bytes of JSON
        assert len(json.dumps(payload, separators=(",", ":"))) == 100
        assert post_job(api, task="test.echo", payload=payload).status_code == 201

    def test_a_payload_over_the_limit_is_413(self, api):
        response = post_job(api, task="test.echo", payload={"x": "a" * 200})
        assert_error(response, 413)
        assert job_rows() == 0

    def test_one_payload_over_the_limit_refuses_the_whole_batch(self, api):
        payloads = [{"n": i} for i in range(10)] + [{"x": "a" * 200}]
        response = api.post("/jobs/batch", {"task": "test.echo", "payloads": payloads}, "json")
        assert_error(response, 413)
        assert job_rows() == 0


HOSTILE_BODIES = [
    # Nesting no JSON parser of a reasonable depth accepts: refused, not a crash.
    ('{"task": "test.noop", "payload": ' + "[" * 50_000 + "]" * 50_000 + "}", {400, 413}),
    # Valid JSON text that PostgreSQL cannot store: a lone surrogate, a NUL character.
    ('{"task": "test.noop", "payload": "\\ud800"}', {400}),
    ('{"task": "test.noop", "payload": {"\\udfff": 1}}', {400}),
    ('{"task": "test.noop", "idempotency_key": "a\\u0000b"}', {400}),
    ('{"task": "test.noop", "idempotency_key": "\\ud800"}', {400}),
    ('{"task": "test.noop", "payloads": ["\\ud800"]}', {400}),
]


@pytest.mark.parametrize(
    ("text", "statuses"), HOSTILE_BODIES, ids=[t[:60] for t, _ in HOSTILE_BODIES]
)
def test_hostile_bodies_are_refused_not_a_500(api, text, statuses):
    path = "/jobs/batch" if '"payloads"' in text else "/jobs"
    response = api.post(path, text, content_type="application/json")
    assert response.status_code in statuses, (response.status_code, response.content[:300])
    assert_error(response, response.status_code)
    assert job_rows() == 0


# -- POST /jobs/batch ---------------------------------------------------------------------


class TestBatch:
    def test_201_with_ids_and_count_in_order(self, api):
        payloads = [{"n": i} for i in range(5)]
        body = {
            "task": "test.echo",
            "payloads": payloads,
            "tenant": "acme",
            "queue": "bulk",
            "priority": 3,
        }
        response = api.post("/jobs/batch", body, format="json")
        assert response.status_code == 201, response.content
        data = response.json()
        assert set(data) == {"ids", "count"}
        assert data["count"] == 5 and len(data["ids"]) == 5
        jobs = Job.objects.in_bulk(data["ids"])
        assert [jobs[i].payload for i in data["ids"]] == payloads
        for job in jobs.values():
            assert (job.task, job.tenant_id, job.queue, job.priority) == (
                "test.echo",
                "acme",
                "bulk",
                3,
            )
            assert job.status == Status.QUEUED
        assert job_rows() == 5

    def test_defaults(self, api):
        response = api.post("/jobs/batch", {"task": "test.noop", "payloads": [1, None]}, "json")
        assert response.status_code == 201, response.content
        jobs = list(Job.objects.order_by("id"))
        assert [j.payload for j in jobs] == [1, None]
        assert {(j.tenant_id, j.queue, j.priority) for j in jobs} == {("default", "default", 0)}

    def test_a_thousand_payloads(self, api):
        payloads = [{"n": i} for i in range(1000)]
        response = api.post("/jobs/batch", {"task": "test.noop", "payloads": payloads}, "json")
        assert response.status_code == 201, response.content
        assert response.json()["count"] == 1000 == job_rows()

    @pytest.mark.parametrize(
        ("body", "field"),
        [
            ({"task": "test.noop", "payloads": [{}] * 1001}, "payloads"),
            ({"task": "test.noop"}, "payloads"),
            ({"task": "test.noop", "payloads": {"a": 1}}, "payloads"),
            ({"task": "test.noop", "payloads": "abc"}, "payloads"),
            ({"payloads": [{}]}, "task"),
            ({"task": 7, "payloads": [{}]}, "task"),
            ({"task": "no.such.task", "payloads": [{}, {}]}, "task"),
            ({"task": "test.noop", "payloads": [{}], "priority": 101}, "priority"),
            ({"task": "test.noop", "payloads": [{}], "priority": "1"}, "priority"),
            ({"task": "test.noop", "payloads": [{}], "tenant": "no good"}, "tenant"),
            ({"task": "test.noop", "payloads": [{}], "queue": 3}, "queue"),
            ({"task": "test.noop", "payloads": [{}, {"a": "\u0000"}]}, None),
            ({"task": "test.noop", "payloads": [{}], "payload": {}}, "payload"),
            ({"task": "test.noop", "payloads": [{}], "idempotency_key": "k"}, "idempotency_key"),
        ],
    )
    def test_refused_whole(self, api, body, field):
        response = api.post("/jobs/batch", body, format="json")
        error = assert_error(response, 400, field=field)
        if field is not None:
            assert field in error["detail"]
        if body.get("task") == "no.such.task":
            assert "no.such.task" in error["detail"]
        assert job_rows() == 0

    def test_malformed_json_is_400(self, api):
        response = api.post("/jobs/batch", '{"task": "x", ', content_type="application/json")
        assert_error(response, 400)
        assert job_rows() == 0


# -- GET /jobs ----------------------------------------------------------------------------


class TestList:
    def test_shape_newest_first_and_default_page(self, api):
        ids = services.enqueue_many("test.echo", [{"n": i} for i in range(55)])
        response = api.get("/jobs")
        assert response.status_code == 200
        data = response.json()
        assert set(data) == {"count", "count_is_estimate", "next", "previous", "results"}
        assert data["count"] == 55 and data["count_is_estimate"] is False
        assert data["previous"] is None and data["next"] and "cursor=" in data["next"]
        assert [j["id"] for j in data["results"]] == sorted(ids, reverse=True)[:50]
        for job in data["results"]:
            assert_job_json(job)

        rest = api.get(data["next"])
        assert rest.status_code == 200
        tail = rest.json()
        assert [j["id"] for j in tail["results"]] == sorted(ids, reverse=True)[50:]
        assert tail["next"] is None and tail["previous"]
        back = api.get(tail["previous"]).json()
        assert [j["id"] for j in back["results"]] == [j["id"] for j in data["results"]]

    def test_limit_and_offset(self, api):
        ids = sorted(services.enqueue_many("test.noop", [{}] * 6), reverse=True)
        data = api.get("/jobs", {"limit": 2, "offset": 1}).json()
        assert data["count"] == 6
        assert [j["id"] for j in data["results"]] == ids[1:3]
        assert api.get("/jobs", {"offset": 6}).json()["results"] == []
        assert len(api.get("/jobs", {"limit": 500}).json()["results"]) == 6

    def test_at_most_500_per_page(self, api):
        services.enqueue_many("test.noop", [{}] * 501)
        data = api.get("/jobs", {"limit": 500}).json()
        assert (data["count"], len(data["results"])) == (501, 500)

    @pytest.mark.parametrize(
        ("params", "field"),
        [
            ({"limit": 501}, "limit"),
            ({"limit": 0}, "limit"),
            ({"limit": "ten"}, "limit"),
            ({"offset": -1}, "offset"),
            ({"offset": "x"}, "offset"),
            ({"offset": 10_001}, "offset"),
            ({"offset": 1, "cursor": "bjox"}, "offset"),
            ({"cursor": "not a cursor"}, "cursor"),
            ({"cursor": "eDox"}, "cursor"),  # "x:1"
            ({"status": "finished"}, "status"),
            ({"status": "QUEUED"}, "status"),
            ({"created_after": "yesterday"}, "created_after"),
            ({"created_before": "2024-13-01T00:00:00Z"}, "created_before"),
            # Well-formed text that names no real moment.
            ({"created_after": "2024-02-30T00:00:00Z"}, "created_after"),
            ({"created_before": "2024-01-01T25:00:00"}, "created_before"),
        ],
        ids=lambda value: (
            "&".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else value
        ),
    )
    def test_bad_parameters_are_400_naming_them(self, api, params, field):
        error = assert_error(api.get("/jobs", params), 400, field=field)
        assert field in error["detail"]

    @pytest.mark.parametrize(
        "query", ["task=a%00b", "queue=%00", "tenant=x%00", "offset=100000000000000000000"]
    )
    def test_hostile_parameters_are_not_a_500(self, api, query):
        response = api.get(f"/jobs?{query}")
        assert response.status_code in (200, 400), (response.status_code, response.content)
        if response.status_code == 200:
            assert response.json()["results"] == []
        else:
            assert_error(response, 400)

    def test_filters(self, api):
        a = services.enqueue("test.echo", {}, tenant="a", queue="q1").job.pk
        b = services.enqueue("test.noop", {}, tenant="b", queue="q1").job.pk
        c = services.enqueue("test.noop", {}, tenant="a", queue="q2", delay=60).job.pk
        d = make_job("dead", tenant="b")

        def ids(**params: Any) -> list[int]:
            response = api.get("/jobs", params)
            assert response.status_code == 200, response.content
            data = response.json()
            assert data["count"] == len(data["results"])
            return [j["id"] for j in data["results"]]

        assert ids() == [d, c, b, a]
        assert ids(status="queued") == [b, a]
        assert ids(status="scheduled") == [c]
        assert ids(status="dead") == [d]
        assert ids(status="running") == []
        assert ids(task="test.noop") == [c, b]
        assert ids(tenant="a") == [c, a]
        assert ids(queue="q1") == [b, a]
        assert ids(tenant="a", queue="q1", task="test.echo", status="queued") == [a]
        assert ids(tenant="nobody") == []

    def test_created_after_and_before_are_inclusive(self, api):
        t0 = dt.datetime(2030, 1, 1, 0, 0, 0, tzinfo=dt.UTC)
        ids = []
        for i in range(3):
            job_id = services.enqueue("test.noop").job.pk
            Job.objects.filter(pk=job_id).update(created_at=t0 + dt.timedelta(hours=i))
            ids.append(job_id)
        first, second, third = ids

        def listed(**params: str) -> list[int]:
            response = api.get("/jobs", params)
            assert response.status_code == 200, response.content
            return [j["id"] for j in response.json()["results"]]

        middle = "2030-01-01T01:00:00Z"
        assert listed(created_after=middle) == [third, second]
        assert listed(created_before=middle) == [second, first]
        assert listed(created_after=middle, created_before=middle) == [second]
        assert listed(created_after="2030-01-01T03:00:00+02:00") == [third, second]
        assert listed(created_after="2030-01-01T01:00:00.000001+00:00") == [third]
        # The created_at the API shows filters to the job itself.
        shown = api.get(f"/jobs/{first}").json()["created_at"]
        assert listed(created_after=shown, created_before=shown) == [first]


# -- GET /jobs/<id> -----------------------------------------------------------------------


class TestDetail:
    def test_a_new_job_with_an_empty_history(self, api):
        job_id = services.enqueue("test.echo", {"x": 1}, tenant="acme").job.pk
        response = api.get(f"/jobs/{job_id}")
        assert response.status_code == 200
        data = response.json()
        assert_job_json(data)
        assert (data["id"], data["tenant"], data["status"], data["payload"]) == (
            job_id,
            "acme",
            "queued",
            {"x": 1},
        )
        assert data["history"] == []

    def test_one_history_entry_per_attempt(self, api):
        job_id = services.enqueue("test.echo", {}, queue="hist", max_attempts=3).job.pk
        fail_once_then_complete(job_id, '{"answer": 42}')
        response = api.get(f"/jobs/{job_id}")
        assert response.status_code == 200
        data = response.json()
        assert_job_json(data)
        assert (data["status"], data["attempts"], data["max_attempts"]) == ("done", 2, 3)
        assert data["result"] == {"answer": 42}
        assert data["started_at"] and data["finished_at"]
        history = data["history"]
        assert len(history) == 2
        for entry in history:
            assert HISTORY_FIELDS <= set(entry), entry
            assert entry["started_at"] and entry["finished_at"]
        assert [(h["attempt"], h["worker"], h["outcome"]) for h in history] == [
            (1, "w1", "failed"),
            (2, "w2", "done"),
        ]
        assert "boom" in history[0]["error"]
        assert history[1]["error"] is None

    def test_a_dead_job_shows_its_last_error(self, api):
        job_id = make_job("dead")
        data = api.get(f"/jobs/{job_id}").json()
        assert (data["status"], data["attempts"]) == ("dead", 1)
        assert "boom" in data["last_error"]
        assert [h["outcome"] for h in data["history"]] == ["failed"]

    @pytest.mark.parametrize("path", ["/jobs/999999999", "/jobs/0", "/jobs/999999999999999999"])
    def test_an_unknown_id_is_404(self, api, path):
        assert_error(api.get(path), 404, code="not_found")

    @pytest.mark.parametrize("path", ["/jobs/abc", "/jobs/-1", "/jobs/1.5", "/no-such-thing"])
    def test_an_unknown_path_is_a_json_404(self, api, path):
        assert_error(api.get(path), 404)


# -- DELETE /jobs/<id> --------------------------------------------------------------------


class TestCancel:
    @pytest.mark.parametrize("state", ["queued", "scheduled"])
    def test_a_waiting_job_is_cancelled(self, api, state):
        job_id = make_job(state)
        response = api.delete(f"/jobs/{job_id}")
        assert response.status_code == 200, response.content
        data = response.json()
        assert_job_json(data)
        assert (data["id"], data["status"]) == (job_id, "cancelled")
        assert status_of(job_id) == "cancelled"

    @pytest.mark.parametrize("state", ["done", "dead", "cancelled"])
    def test_a_finished_job_is_409(self, api, state):
        job_id = make_job(state)
        assert_error(api.delete(f"/jobs/{job_id}"), 409)
        assert status_of(job_id) == state

    def test_a_running_job_is_asked_to_stop_202_cancelling(self, api):
        """A running job is not cancelled by the request: it is asked to stop (202), shows
        "cancelling" in GET too, and stays running until its worker ends it."""
        job_id = make_job("running")
        response = api.delete(f"/jobs/{job_id}")
        assert response.status_code == 202, response.content
        data = response.json()
        assert (data["id"], data["status"]) == (job_id, "cancelling")
        assert data["cancel_requested_at"] is not None
        assert status_of(job_id) == "running"
        shown = api.get(f"/jobs/{job_id}").json()
        assert (shown["status"], shown["cancel_requested_at"]) == (
            "cancelling",
            data["cancel_requested_at"],
        )
        again = api.delete(f"/jobs/{job_id}")  # a second request changes nothing
        assert again.status_code == 202
        assert again.json()["cancel_requested_at"] == data["cancel_requested_at"]

    def test_a_running_job_its_worker_ends_before_the_read_is_still_202(self, api, monkeypatch):
        """The worker, told by NOTIFY when the request commits, may end the job cancelled
        before the view reads it back: the answer is still 202 (what the request did), the
        body the job as it is (cancelled)."""
        from django.db import connection

        from pgqueue import services, stop_store

        job_id = make_job("running")
        cancel_jobs = services.cancel_jobs

        def and_the_worker_is_quick(ids, **kwargs):
            result = cancel_jobs(ids, **kwargs)
            job = Job.objects.get(pk=job_id)
            with connection.cursor() as cur:
                held = [(job.id, job.attempts)]
                assert stop_store.confirm_cancel_many(cur, worker=job.lease_owner, held=held)
            return result

        monkeypatch.setattr(services, "cancel_jobs", and_the_worker_is_quick)
        response = api.delete(f"/jobs/{job_id}")
        assert response.status_code == 202, response.content
        assert response.json()["status"] == "cancelled"
        assert status_of(job_id) == "cancelled"

    def test_an_unknown_job_is_404(self, api):
        assert_error(api.delete("/jobs/987654321"), 404, code="not_found")


# -- POST /jobs/<id>/retry ----------------------------------------------------------------


class TestRetry:
    def test_a_dead_job_is_queued_with_attempts_reset_and_history_kept(self, api):
        job_id = make_job("dead")
        response = api.post(f"/jobs/{job_id}/retry")
        assert response.status_code == 200, response.content
        data = response.json()
        assert_job_json(data)
        assert (data["id"], data["status"], data["attempts"]) == (job_id, "queued", 0)
        assert status_of(job_id) == "queued"
        detail = api.get(f"/jobs/{job_id}").json()
        assert detail["attempts"] == 0
        assert [h["outcome"] for h in detail["history"]] == ["failed"]
        assert JobAttempt.objects.filter(job_id=job_id).count() == 1

    def test_a_cancelled_job_is_queued(self, api):
        job_id = make_job("cancelled")
        response = api.post(f"/jobs/{job_id}/retry", format="json")
        assert response.status_code == 200, response.content
        assert response.json()["status"] == "queued"
        assert status_of(job_id) == "queued"

    def test_a_job_whose_run_at_is_ahead_is_scheduled(self, api):
        job_id = make_job("scheduled")
        assert api.delete(f"/jobs/{job_id}").status_code == 200
        response = api.post(f"/jobs/{job_id}/retry")
        assert response.status_code == 200, response.content
        assert response.json()["status"] == "scheduled"
        assert status_of(job_id) == "scheduled"

    @pytest.mark.parametrize("state", ["queued", "scheduled", "running", "done"])
    def test_any_other_state_is_409(self, api, state):
        job_id = make_job(state)
        assert_error(api.post(f"/jobs/{job_id}/retry"), 409)
        assert status_of(job_id) == state

    def test_an_unknown_job_is_404(self, api):
        assert_error(api.post("/jobs/987654321/retry"), 404, code="not_found")


# -- query parameters ---------------------------------------------------------------------


#: Every GET endpoint with the query parameters it reads.
GET_ENDPOINTS = [
    ("/jobs", {"status", "task", "tenant", "queue", "created_after", "created_before"}),
    ("/jobs/{job}", set()),
    ("/tenants", set()),
    ("/tenants/acme", set()),
    ("/stats", set()),
    ("/metrics", set()),
    ("/health", set()),
]

#: Every write, with a body it accepts; none reads a query parameter.
WRITE_ENDPOINTS = [
    ("post", "/jobs", {"task": "test.noop"}),
    ("post", "/jobs/batch", {"task": "test.noop", "payloads": [{}]}),
    ("delete", "/jobs/{job}", None),
    ("post", "/jobs/{job}/retry", None),
    ("put", "/tenants/acme", {"weight": 2}),
]


class TestQueryParameters:
    """One rule, as for body fields: a parameter an endpoint does not read is a 400 naming
    it (a misspelt filter must not return the unfiltered list); ``format`` is DRF's."""

    @pytest.mark.parametrize(("path", "_"), GET_ENDPOINTS)
    @pytest.mark.parametrize("name", ["stauts", "page", "limit_"])
    def test_an_unknown_parameter_is_a_400_naming_it(self, api, path, _, name):
        job = make_job("queued", tenant="acme")
        error = assert_error(api.get(path.format(job=job), {name: "1"}), 400, field=name)
        assert name in error["detail"] and "unknown query parameter" in error["detail"]

    def test_the_accepted_parameters_are_listed_in_the_message(self, api):
        error = assert_error(api.get("/jobs", {"stauts": "dead"}), 400, field="stauts")
        assert (
            "accepted: created_after, created_before, cursor, limit, offset, queue, status"
            in (error["detail"])
        )
        error = assert_error(api.get("/tenants", {"sort": "name"}), 400, field="sort")
        assert error["fields"] == {"sort": "unknown query parameter; accepted: limit, offset"}
        error = assert_error(api.get("/stats", {"x": "1"}), 400, field="x")
        assert error["detail"].endswith("accepted: none")

    @pytest.mark.parametrize(("path", "_"), GET_ENDPOINTS)
    def test_format_still_works(self, api, path, _):
        job = make_job("queued", tenant="acme")
        response = api.get(path.format(job=job), {"format": "json"})
        assert response.status_code == 200, response.content
        assert response["Content-Type"].startswith(("application/json", "text/plain"))

    def test_the_browsable_api_still_renders(self, admin_client):
        services.set_tenant_weight("acme", 1)
        for path in ("/jobs", "/tenants"):
            response = admin_client.get(path, {"format": "api"})
            assert response.status_code == 200
            assert response["Content-Type"].startswith("text/html")
            response = admin_client.get(path, HTTP_ACCEPT="text/html")
            assert response.status_code == 200 and b"<html" in response.content

    @pytest.mark.parametrize(("path", "accepted"), GET_ENDPOINTS[:1])
    def test_every_accepted_parameter_is_accepted(self, api, path, accepted):
        for name in accepted:
            value = {"status": "queued", "created_after": "2000-01-01T00:00:00Z"}.get(
                name, "2000-01-01T00:00:00Z" if name == "created_before" else "acme"
            )
            response = api.get(path, {name: value, "limit": "5", "offset": "0"})
            assert response.status_code == 200, (name, response.content)

    def test_an_unauthenticated_caller_learns_nothing_from_a_parameter(self):
        assert_error(APIClient().get("/jobs", {"stauts": "dead"}), 401)

    @pytest.mark.parametrize(("method", "path", "body"), WRITE_ENDPOINTS)
    def test_a_write_refuses_any_parameter_and_changes_nothing(self, api, method, path, body):
        """Before, ``DELETE /jobs/7?dry_run=1`` cancelled job 7: writes were not checked."""
        services.set_tenant_weight("acme", 1)
        job = make_job("dead", tenant="acme") if "retry" in path else make_job("queued")
        before = list(Job.objects.order_by("id").values_list("id", "status"))
        url = path.format(job=job) + "?dry_run=1"
        error = assert_error(getattr(api, method)(url, body, format="json"), 400, field="dry_run")
        assert error["detail"] == "dry_run: unknown query parameter; accepted: none", error
        assert list(Job.objects.order_by("id").values_list("id", "status")) == before
        assert Tenant.objects.get(name="acme").weight == 1

    @pytest.mark.parametrize(("method", "path", "body"), WRITE_ENDPOINTS)
    def test_a_write_accepts_format(self, api, method, path, body):
        services.set_tenant_weight("acme", 1)
        job = make_job("dead", tenant="acme") if "retry" in path else make_job("queued")
        url = path.format(job=job) + "?format=json"
        response = getattr(api, method)(url, body, format="json")
        assert response.status_code in (200, 201), response.content

    def test_options_is_not_checked(self, api):
        """A browser's preflight carries the query of the GET it precedes."""
        assert api.options("/jobs?stauts=dead").status_code == 200


# -- tenants ------------------------------------------------------------------------------


class TestTenants:
    def test_one_tenant_with_its_counts(self, api):
        for state in ("queued", "queued", "scheduled", "running", "done", "dead", "cancelled"):
            make_job(state, tenant="acme")
        make_job("queued", tenant="other")
        response = api.get("/tenants/acme")
        assert response.status_code == 200, response.content
        data = response.json()
        assert data["name"] == "acme"
        assert data["weight"] == 1.0
        assert (data["backlog"], data["running"], data["done"], data["dead"]) == (3, 1, 1, 1)

    def test_the_list(self, api):
        make_job("queued", tenant="acme")
        services.set_tenant_weight("globex", 2.5)
        response = api.get("/tenants")
        assert response.status_code == 200, response.content
        data = response.json()
        assert set(data) == {"count", "count_is_estimate", "next", "previous", "results"}
        tenants = {t["name"]: t for t in data["results"]}
        assert {"acme", "globex"} <= set(tenants)
        assert data["count"] == len(tenants) == Tenant.objects.count()
        assert tenants["acme"]["backlog"] == 1
        assert tenants["globex"]["weight"] == 2.5
        for tenant in tenants.values():
            assert {"name", "weight", "backlog", "running", "done", "dead"} <= set(tenant)

    def test_the_list_is_paginated_like_jobs_by_name(self, api):
        names = [f"t{i:03d}" for i in range(57)]
        for name in names:
            services.set_tenant_weight(name, 1)
        every = sorted(Tenant.objects.values_list("name", flat=True))
        data = api.get("/tenants").json()
        assert data["count"] == len(every)
        assert [t["name"] for t in data["results"]] == every[:50]
        assert data["previous"] is None and "limit=50" in data["next"]
        tail = api.get(data["next"]).json()
        assert [t["name"] for t in tail["results"]] == every[50:]
        assert tail["next"] is None and tail["previous"]
        back = api.get(tail["previous"]).json()
        assert back["results"] == data["results"]
        page = api.get("/tenants", {"limit": 3, "offset": 2}).json()
        assert [t["name"] for t in page["results"]] == every[2:5]
        assert api.get("/tenants", {"offset": len(every)}).json()["results"] == []
        assert len(api.get("/tenants", {"limit": 500}).json()["results"]) == len(every)

    @pytest.mark.parametrize(
        ("params", "field"),
        [
            ({"limit": 501}, "limit"),
            ({"limit": 0}, "limit"),
            ({"limit": "ten"}, "limit"),
            ({"offset": -1}, "offset"),
            ({"offset": "x"}, "offset"),
        ],
    )
    def test_bad_page_parameters_are_400_naming_them(self, api, params, field):
        error = assert_error(api.get("/tenants", params), 400, field=field)
        assert field in error["detail"]

    def test_an_unknown_tenant_is_404(self, api):
        assert_error(api.get("/tenants/nobody"), 404, code="not_found")

    def test_put_creates_a_new_tenant(self, api):
        response = api.put("/tenants/newco", {"weight": 3}, format="json")
        assert response.status_code == 200, response.content
        assert (response.json()["name"], response.json()["weight"]) == ("newco", 3.0)
        assert Tenant.objects.get(name="newco").weight == 3.0
        assert api.get("/tenants/newco").json()["weight"] == 3.0

    def test_put_changes_the_weight(self, api):
        make_job("queued", tenant="acme")
        response = api.put("/tenants/acme", {"weight": 0.25}, format="json")
        assert response.status_code == 200, response.content
        assert response.json()["weight"] == 0.25
        assert response.json()["backlog"] == 1
        assert Tenant.objects.get(name="acme").weight == 0.25

    def test_put_with_a_queue_overrides_that_queue_only(self, api):
        services.set_tenant_weight("acme", 2)
        response = api.put("/tenants/acme", {"weight": 5, "queue": "emails"}, format="json")
        assert response.status_code == 200, response.content
        data = response.json()
        assert data["weight"] == 2.0
        assert Tenant.objects.get(name="acme").weight == 2.0
        assert list(QueueWeight.objects.values_list("tenant_id", "queue", "weight")) == [
            ("acme", "emails", 5.0)
        ]
        assert api.get("/tenants/acme").json()["weight"] == 2.0

    def test_put_with_a_queue_creates_the_tenant_with_weight_one(self, api):
        response = api.put("/tenants/fresh", {"weight": 4, "queue": "q"}, format="json")
        assert response.status_code == 200, response.content
        assert Tenant.objects.get(name="fresh").weight == 1.0
        assert QueueWeight.objects.get(tenant_id="fresh").weight == 4.0

    @pytest.mark.parametrize(
        ("body", "field"),
        [
            ({}, "weight"),
            ({"weight": 0}, "weight"),
            ({"weight": -1}, "weight"),
            ({"weight": "2"}, "weight"),
            ({"weight": None}, "weight"),
            ({"weight": True}, "weight"),
            ({"weight": 1, "queue": 5}, "queue"),
            ({"weight": 1, "queue": "bad queue"}, "queue"),
            ({"weight": 1, "colour": "red"}, "colour"),
        ],
    )
    def test_put_refuses_bad_input(self, api, body, field):
        services.set_tenant_weight("acme", 2)
        response = api.put("/tenants/acme", body, format="json")
        error = assert_error(response, 400, field=field)
        assert field in error["detail"]
        assert Tenant.objects.get(name="acme").weight == 2.0
        assert not QueueWeight.objects.exists()

    @pytest.mark.parametrize("text", ['{"weight": 1e400}', '{"weight": NaN}', '{"weight": '])
    def test_put_refuses_infinite_or_malformed_weights(self, api, text):
        response = api.put("/tenants/newco", text, content_type="application/json")
        assert_error(response, 400)
        assert not Tenant.objects.filter(name="newco").exists()


# -- stats, metrics, health ---------------------------------------------------------------


class TestStats:
    def test_shape_and_counts(self, api):
        make_job("queued")
        make_job("queued")
        make_job("scheduled")
        make_job("dead", queue="mail")
        job_id = services.enqueue("test.noop", queue="twice").job.pk
        fail_once_then_complete(job_id)
        Worker.objects.create(id="w-alive", host="h", pid=1, concurrency=1)
        response = api.get("/stats")
        assert response.status_code == 200, response.content
        data = response.json()
        assert set(data) == STATS_FIELDS
        assert data["queues"]["default"] == {"queued": 2, "scheduled": 1}
        assert data["queues"]["mail"] == {"dead": 1}
        assert data["queues"]["twice"] == {"done": 1}
        assert data["dead"] == 1
        assert data["workers_alive"] == 1
        # The last minute's attempts: one success, two failures.
        assert data["throughput_per_s_60s"] == pytest.approx(1 / 60, abs=0.001)
        assert data["error_rate_60s"] == pytest.approx(2 / 3, abs=0.001)
        assert data["mean_run_seconds_60s"] is None or data["mean_run_seconds_60s"] >= 0

    def test_an_empty_queue(self, api):
        data = api.get("/stats").json()
        assert data == {
            "queues": {},
            "throughput_per_s_60s": 0.0,
            "error_rate_60s": 0.0,
            "mean_run_seconds_60s": None,
            "workers_alive": 0,
            "dead": 0,
            "capped": {},
            "count_cap": 1000,
            "dead_capped": False,
        }


def test_metrics_answers_prometheus_text(api):
    make_job("queued")
    response = api.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert b'pgqueue_jobs{queue="default",status="queued"} 1.0' in response.content


@pytest.mark.parametrize("path", ["/health", "/health/"])
def test_health_needs_no_credentials(path):
    response = APIClient().get(path)
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok"}


# -- every path with and without a trailing slash; methods --------------------------------


@pytest.mark.parametrize("slash", ["", "/"])
def test_every_path_answers_with_and_without_a_trailing_slash(api, slash):
    queued, dead = make_job("queued", tenant="acme"), make_job("dead")
    for path in (
        "/jobs",
        f"/jobs/{queued}",
        "/tenants",
        "/tenants/acme",
        "/stats",
        "/metrics",
        "/health",
        "/schema",
        "/docs",
    ):
        response = api.get(path + slash)
        assert response.status_code == 200, (path + slash, response.status_code)
    created = api.post("/jobs" + slash, {"task": "test.noop"}, format="json")
    assert created.status_code == 201, created.content
    batch = api.post("/jobs/batch" + slash, {"task": "test.noop", "payloads": [{}]}, "json")
    assert batch.status_code == 201, batch.content
    assert api.delete(f"/jobs/{queued}{slash}").status_code == 200
    assert api.post(f"/jobs/{dead}/retry{slash}").status_code == 200
    assert api.put(f"/tenants/acme{slash}", {"weight": 2}, format="json").status_code == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("patch", "/jobs"),
        ("delete", "/jobs"),
        ("put", "/jobs"),
        ("get", "/jobs/batch"),
        ("delete", "/jobs/batch"),
        ("put", "/jobs/{id}"),
        ("patch", "/jobs/{id}"),
        ("post", "/jobs/{id}"),
        ("get", "/jobs/{id}/retry"),
        ("delete", "/jobs/{id}/retry"),
        ("post", "/tenants"),
        ("delete", "/tenants/acme"),
        ("post", "/tenants/acme"),
        ("patch", "/tenants/acme"),
        ("post", "/stats"),
        ("post", "/metrics"),
        ("post", "/health"),
        ("post", "/schema"),
        ("delete", "/schema"),
        ("post", "/docs"),
        ("delete", "/docs"),
    ],
)
def test_a_wrong_method_is_405(api, method, path):
    job_id = make_job("queued", tenant="acme")
    before = job_rows()
    response = getattr(api, method)(path.format(id=job_id), {"weight": 2}, format="json")
    assert_error(response, 405)
    assert job_rows() == before
    assert status_of(job_id) == "queued"
    assert Tenant.objects.get(name="acme").weight == 1.0


# -- idempotency under concurrency --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_posts_with_one_idempotency_key_create_one_job():
    key = new_key()

    def post(i: int) -> tuple[int, int]:
        response = client(key).post(
            "/jobs",
            {"task": "test.echo", "payload": {"i": i}, "idempotency_key": "once"},
            format="json",
        )
        assert response.status_code in (200, 201), response.content
        return response.status_code, response.json()["id"]

    results = run_threads(10, post)
    assert len({job_id for _, job_id in results}) == 1
    assert sorted(code for code, _ in results) == [200] * 9 + [201]
    assert Job.objects.count() == 1
    assert Job.objects.get().id == results[0][1]
