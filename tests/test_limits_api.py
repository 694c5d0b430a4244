"""The HTTP side of limits: PUT /tenants/<name> with max_running and rate_limit, the
queues endpoints, pause / resume, and waiting_for in GET /jobs/<id>."""

from __future__ import annotations

import pytest

import pgqueue
from tests.api_fixtures import assert_error, client, new_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return client(new_key())


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_running": 0}, "max_running"),
        ({"max_running": "abc"}, "max_running"),
        ({"max_running": 2.5}, "max_running"),
        ({"max_running": 10**9}, "max_running"),
        ({"rate_limit": "10/x"}, "rate_limit"),
        ({"rate_limit": "abc"}, "rate_limit"),
        ({"rate_limit": "0/s"}, "rate_limit"),
        ({"rate_limit": 50}, "rate_limit"),
        ({"max_running": 1, "bogus": 1}, "bogus"),
    ],
)
def test_bad_limits_are_a_400_naming_the_field(api, body, field):
    assert_error(api.put("/tenants/acme", body, format="json"), 400, field=field)
    assert_error(api.put("/queues/emails", body, format="json"), 400, field=field)


def test_tenant_limits_over_http_are_shown_in_its_json(api):
    data = api.put("/tenants/acme", {"max_running": 3, "rate_limit": "50/s"}, format="json").json()
    assert (data["max_running"], data["rate_limit"], data["paused"]) == (3, "50/s", False)
    data = api.put("/tenants/acme", {"max_running": 1, "queue": "q"}, format="json").json()
    assert data["queue_limits"]["q"]["max_running"] == 1
    assert data["max_running"] == 3  # the tenant's own is kept
    data = api.put("/tenants/acme", {"max_running": None}, format="json").json()
    assert data["max_running"] is None and data["rate_limit"] == "50/s"


def test_queue_limits_pause_and_resume_over_http(api):
    data = api.put("/queues/emails", {"max_running": 20}, format="json").json()
    assert data == {
        "name": "emails",
        "max_running": 20,
        "rate_limit": None,
        "paused": False,
        "running": 0,
    }
    assert api.post("/queues/emails/pause").json()["paused"] is True
    assert api.get("/queues/emails").json()["paused"] is True
    assert "emails" in [q["name"] for q in api.get("/queues").json()["results"]]
    job = pgqueue.enqueue("test.noop", {}, queue="emails").job
    assert api.get(f"/jobs/{job.id}").json()["waiting_for"] == "paused"
    assert api.post("/queues/emails/resume").json()["paused"] is False
    assert api.get(f"/jobs/{job.id}").json()["waiting_for"] == "turn"
    assert api.post("/tenants/acme/pause").json()["paused"] is True
    assert api.post("/tenants/acme/resume", {"queue": "q"}, format="json").status_code == 200


def test_a_tenant_key_reads_no_queue_and_no_position():
    """Queues are every tenant's: their names and running jobs, and a job's position
    among every tenant's jobs, are an operator's read. Protection: ``_queue_visible``
    refuses tenant keys, JobView drops the position; without them a tenant key listed
    other tenants' queues and load, and counted the tenants ahead of it."""
    operator = client(new_key())
    pgqueue.enqueue("test.noop", {}, tenant="globex", queue="globex-only")  # ahead of acme's
    mine, _ = pgqueue.enqueue("test.noop", {}, tenant="acme", queue="globex-only")
    assert operator.get(f"/jobs/{mine.id}").json()["position"] == "1"
    tenant_api = client(new_key("acme"))
    assert_error(tenant_api.get("/queues"), 403, code="forbidden")
    assert_error(tenant_api.get("/queues/globex-only"), 403, code="forbidden")
    data = tenant_api.get(f"/jobs/{mine.id}").json()
    assert (data["waiting_for"], data["position"]) == ("turn", None)


def test_a_tenant_key_cannot_set_limits_or_pause():
    tenant_api = client(new_key("acme"))
    assert_error(tenant_api.put("/tenants/acme", {"max_running": 1}, format="json"), 403)
    assert_error(tenant_api.put("/queues/q", {"max_running": 1}, format="json"), 403)
    assert_error(tenant_api.post("/queues/q/pause"), 403)
    assert_error(tenant_api.post("/tenants/acme/pause"), 403)
