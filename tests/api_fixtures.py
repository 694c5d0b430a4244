"""Helpers shared by the HTTP API tests (tests/test_api*.py).

Plain functions rather than fixtures, so that each test module declares the few fixtures
it needs in a line or two (importing fixtures would shadow names, which linters refuse).
"""

from __future__ import annotations

import itertools
from typing import Any

from django.db import connection
from rest_framework.test import APIClient

from pgqueue import keys, services, store
from pgqueue.models import Job
from tests.conftest import claim, complete, fail

#: The fields every job's JSON has (the contract).
JOB_FIELDS = {
    "id",
    "task",
    "tenant",
    "queue",
    "status",
    "priority",
    "payload",
    "attempts",
    "max_attempts",
    "lost_claims",
    "run_at",
    "created_at",
    "claimed_at",
    "started_at",
    "finished_at",
    "last_error",
    "result",
    "progress",
    "output",
    "idempotency_key",
    "timeout_seconds",
    "cancel_requested_at",
    "concurrency_key",
    "key_max_running",
    "workflow",
    "step",
    "traceparent",
}

#: The fields every entry of a job's history has.
HISTORY_FIELDS = {
    "attempt",
    "worker",
    "claimed_at",
    "started_at",
    "finished_at",
    "outcome",
    "error",
}

#: The keys of GET /stats.
STATS_FIELDS = {
    "queues",
    "throughput_per_s_60s",
    "error_rate_60s",
    "mean_run_seconds_60s",
    "workers_alive",
    "dead",
    "capped",
    "count_cap",
    "dead_capped",
}

_queues = itertools.count(1)


def new_key(tenant: str | None = None) -> str:
    """A fresh API key: bound to ``tenant``, or to all tenants when None."""
    return keys.create_api_key(tenant=tenant)[1]


def client(key: str | None = None) -> APIClient:
    """An APIClient that sends ``Authorization: Bearer <key>`` on every request."""
    api = APIClient()
    if key is not None:
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return api


def assert_error(
    response: Any, status: int, code: str | None = None, field: str | None = None
) -> dict[str, Any]:
    """The response is a JSON error of the contract's shape, with this status."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert isinstance(body, dict), body
    assert set(body) <= {"error", "detail", "fields"}, body
    assert isinstance(body.get("error"), str) and body["error"], body
    assert isinstance(body.get("detail"), str) and body["detail"], body
    if "fields" in body:
        assert isinstance(body["fields"], dict), body
    if code is not None:
        assert body["error"] == code, body
    if field is not None:
        assert field in body.get("fields", {}), body
    return body


def assert_job_json(data: dict[str, Any]) -> None:
    missing = JOB_FIELDS - set(data)
    assert not missing, f"job JSON lacks {sorted(missing)}: {data}"


def job_rows() -> int:
    return Job.objects.count()


def fresh_queue() -> str:
    """A queue of its own, so a test claims exactly the job it means to."""
    return f"solo-{next(_queues)}"


def make_job(state: str, tenant: str = "default", **options: Any) -> int:
    """A job of ``tenant`` brought into ``state`` through the service layer and the
    worker statements; returns its id. Running/done/dead jobs get a queue of their own
    and one attempt in their history (by worker "w1")."""
    if state == "scheduled":
        options.setdefault("delay", 3600)
    if state in {"running", "done", "dead"}:
        options.setdefault("queue", fresh_queue())
    job, _ = services.enqueue("test.echo", {"state": state}, tenant=tenant, **options)
    if state in {"queued", "scheduled"}:
        return job.pk
    if state == "cancelled":
        services.cancel(job.pk)
        return job.pk
    (claimed,) = claim("w1", queues=(job.queue,))
    assert claimed.id == job.pk
    if state == "done":
        assert complete("w1", claimed, '{"ok": true}')
    elif state == "dead":
        assert fail("w1", claimed, permanent=True) == "dead"
    else:
        assert state == "running", state
    return job.pk


def fail_once_then_complete(job_id: int, result: str = '{"ok": true}') -> None:
    """Give a queued job two attempts: the first fails (retryable), the second succeeds."""
    queue = Job.objects.get(pk=job_id).queue
    (first,) = claim("w1", queues=(queue,))
    assert first.id == job_id
    assert fail("w1", first) == "scheduled"
    services.run_jobs_now([job_id])
    (second,) = claim("w2", queues=(queue,))
    assert (second.id, second.attempt) == (job_id, 2)
    assert complete("w2", second, result)


def status_of(job_id: int) -> str:
    with connection.cursor() as cur:
        return store.statuses(cur, [job_id])[job_id]
