"""Python and HTTP follow one rule where both take the same input.

``pgqueue.enqueue`` / ``enqueue_many`` and ``POST /jobs`` / ``POST /jobs/batch`` call the
same service functions; these are the cases where the HTTP layer used to decide on its own.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from rest_framework.test import APIClient

import pgqueue
from pgqueue import services
from pgqueue.models import Job
from tests.api_fixtures import assert_error, client, new_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(db: Any) -> APIClient:
    return client(new_key())


class TestNaiveRunAt:
    """A run_at without a UTC offset is refused everywhere, naming ``run_at``. Before, HTTP
    took it as UTC while Python refused it, so the same moment meant two things."""

    NAIVE = dt.datetime(2099, 1, 1, 9, 0)

    def test_python_enqueue_refuses_it(self):
        with pytest.raises(pgqueue.InvalidJob) as exc:
            pgqueue.enqueue("test.noop", {}, run_at=self.NAIVE)
        assert exc.value.field == "run_at" and "timezone-aware" in exc.value.reason
        assert "UTC offset" in exc.value.reason

    def test_python_enqueue_many_refuses_it(self):
        with pytest.raises(pgqueue.InvalidJob) as exc:
            pgqueue.enqueue_many("test.noop", [{}], run_at=self.NAIVE)
        assert exc.value.field == "run_at"
        assert not Job.objects.exists()

    @pytest.mark.parametrize(
        ("path", "body"),
        [
            ("/jobs", {"task": "test.noop"}),
            ("/jobs/batch", {"task": "test.noop", "payloads": [{}]}),
        ],
    )
    def test_http_refuses_it_with_the_same_reason(self, api, path, body):
        with pytest.raises(pgqueue.InvalidJob) as python:
            pgqueue.enqueue("test.noop", {}, run_at=self.NAIVE)
        response = api.post(path, {**body, "run_at": self.NAIVE.isoformat()}, format="json")
        error = assert_error(response, 400, field="run_at")
        assert error["fields"]["run_at"] == python.value.reason
        assert not Job.objects.exists()

    def test_an_offset_in_either_form_is_the_same_moment(self, api):
        moment = dt.datetime(2099, 1, 1, 9, 0, tzinfo=dt.UTC)
        job, _ = pgqueue.enqueue("test.noop", {}, run_at=moment)
        response = api.post(
            "/jobs", {"task": "test.noop", "run_at": "2099-01-01T10:00:00+01:00"}, format="json"
        )
        assert response.status_code == 201, response.content
        assert Job.objects.get(pk=response.json()["id"]).run_at == job.run_at == moment


class TestEmptyBatch:
    """An empty list enqueues nothing and is not an error, in Python as over HTTP. Before,
    ``enqueue_many(task, [])`` returned [] while ``POST /jobs/batch`` answered 400."""

    def test_python_returns_no_ids(self):
        assert pgqueue.enqueue_many("test.noop", []) == []

    def test_http_answers_201_with_no_ids(self, api):
        response = api.post("/jobs/batch", {"task": "test.noop", "payloads": []}, format="json")
        assert response.status_code == 201, response.content
        assert response.json() == {"ids": [], "count": 0}
        assert not Job.objects.exists()

    def test_the_options_are_still_checked_in_both(self, api):
        with pytest.raises(pgqueue.UnknownTask):
            pgqueue.enqueue_many("no.such.task", [])
        response = api.post("/jobs/batch", {"task": "no.such.task", "payloads": []}, "json")
        assert_error(response, 400, field="task")
        response = api.post(
            "/jobs/batch", {"task": "test.noop", "payloads": [], "priority": 101}, "json"
        )
        assert_error(response, 400, field="priority")


class TestLargeBatch:
    """One HTTP request is one statement, so it holds at most ``MAX_BATCH`` payloads; the
    Python call runs one statement per ``MAX_BATCH`` payloads in the caller's transaction,
    and takes any number (documented in the README)."""

    def test_http_refuses_one_over_the_bound_and_names_it(self, api):
        payloads = [{}] * (services.MAX_BATCH + 1)
        response = api.post("/jobs/batch", {"task": "test.noop", "payloads": payloads}, "json")
        error = assert_error(response, 400, field="payloads")
        assert f"at most {services.MAX_BATCH:,}" in error["detail"]
        assert not Job.objects.exists()

    def test_python_chunks_past_the_bound(self):
        ids = pgqueue.enqueue_many("test.noop", [{}] * (services.MAX_BATCH + 1))
        assert len(ids) == services.MAX_BATCH + 1 == Job.objects.count()
