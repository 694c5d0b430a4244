"""Hostile callers of the HTTP API: staff sessions held to Django's model permissions, the
throttle on failed authentication, errors that stay JSON and leak nothing, /health's answer.

This module doubles as a URLconf (``urlpatterns`` below) that mounts pgqueue under a prefix
in a project with no error handlers of its own, so the tests see what pgqueue itself answers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.http import HttpResponse
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import include, path
from rest_framework.test import APIClient

from pgqueue import reads
from pgqueue.api import errors
from pgqueue.models import Job, Tenant
from tests.api_fixtures import assert_error, client, job_rows, make_job, new_key, status_of

pytestmark = pytest.mark.django_db


def _project_page(request: Any) -> HttpResponse:
    return HttpResponse("<html>the project's own page</html>")


urlpatterns = [
    path("q/", include("pgqueue.urls")),
    path("jobsite/", _project_page),
]
PREFIXED = override_settings(ROOT_URLCONF=__name__)


def session(*perms: str, superuser: bool = False, is_staff: bool = True) -> APIClient:
    """A logged-in session of a user holding exactly ``perms`` (codenames of pgqueue)."""
    model = get_user_model()
    name = f"user{model.objects.count()}"
    if superuser:
        user = model.objects.create_superuser(name, password="pw")
    else:
        user = model.objects.create_user(name, password="pw", is_staff=is_staff)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="pgqueue", codename__in=perms)
    )
    api = APIClient()
    api.force_login(user)
    return api


def call(api: APIClient, method: str, url: str, body: Any = None, **extra: Any) -> Any:
    if body is None:
        return getattr(api, method)(url, **extra)
    return getattr(api, method)(url, body, format="json", **extra)


# -- staff sessions follow Django's model permissions -------------------------------------

# (method, path, body, the permission it needs)
OPERATIONS = [
    ("get", "/jobs", None, "pgqueue.view_job"),
    ("get", "/jobs/{id}", None, "pgqueue.view_job"),
    ("post", "/jobs", {"task": "test.noop", "tenant": "acme"}, "pgqueue.add_job"),
    ("post", "/jobs/batch", {"task": "test.noop", "payloads": [{}]}, "pgqueue.add_job"),
    ("delete", "/jobs/{id}", None, "pgqueue.change_job"),
    ("post", "/jobs/{id}/retry", None, "pgqueue.change_job"),
    ("get", "/tenants", None, "pgqueue.view_tenant"),
    ("get", "/tenants/acme", None, "pgqueue.view_tenant"),
    ("put", "/tenants/acme", {"weight": 9}, "pgqueue.change_tenant"),
    ("get", "/stats", None, "pgqueue.view_job"),
    ("get", "/metrics", None, "pgqueue.view_job"),
]


class TestStaffSessions:
    @pytest.mark.parametrize(("method", "url", "body", "perm"), OPERATIONS)
    def test_staff_without_permissions_get_a_403_naming_the_permission(
        self, method, url, body, perm
    ):
        job_id = make_job("dead", tenant="acme")
        before = job_rows()
        response = call(session(), method, url.format(id=job_id), body)
        data = assert_error(response, 403, code="forbidden")
        assert perm in data["detail"], data
        assert job_rows() == before
        assert status_of(job_id) == "dead"
        assert Tenant.objects.get(name="acme").weight == 1.0

    @pytest.mark.parametrize(("method", "url", "body", "perm"), OPERATIONS)
    def test_the_permission_opens_the_operation(self, method, url, body, perm):
        job_id = make_job("dead" if "retry" in url else "queued", tenant="acme")
        response = call(session(perm.split(".")[1]), method, url.format(id=job_id), body)
        assert response.status_code in (200, 201), (response.status_code, response.content)

    def test_view_job_reads_but_cannot_cancel_or_set_weights(self):
        job_id = make_job("queued", tenant="acme")
        viewer = session("view_job")
        assert viewer.get(f"/jobs/{job_id}").status_code == 200
        refused = assert_error(viewer.delete(f"/jobs/{job_id}"), 403)
        assert "pgqueue.change_job" in refused["detail"]
        refused = assert_error(viewer.put("/tenants/acme", {"weight": 5}, format="json"), 403)
        assert "pgqueue.change_tenant" in refused["detail"]
        assert status_of(job_id) == "queued"
        assert Tenant.objects.get(name="acme").weight == 1.0

    def test_superusers_keep_everything(self):
        api = session(superuser=True)
        for method, url, body, _ in OPERATIONS:
            job_id = make_job("dead" if "retry" in url else "queued", tenant="acme")
            response = call(api, method, url.format(id=job_id), body)
            assert response.status_code in (200, 201), (url, response.content)

    def test_permissions_without_staff_status_open_nothing(self):
        api = session("view_job", "add_job", "change_job", "change_tenant", is_staff=False)
        for method, url, body, _ in OPERATIONS:
            response = call(api, method, url.format(id=1), body)
            assert_error(response, 403)
        assert job_rows() == 0


# -- failed authentication is throttled per client address --------------------------------


def bearer(key: str, addr: str = "203.0.113.7") -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}", "REMOTE_ADDR": addr}


def key_lookups(queries: CaptureQueriesContext) -> int:
    return sum("pgqueue_api_key" in q["sql"] for q in queries.captured_queries)


class TestAuthFailureThrottle:
    def test_the_default_budget_is_20_a_minute(self):
        for _ in range(20):
            assert_error(APIClient().get("/jobs", **bearer("pgq_nope_nope")), 401)
        refused = APIClient().get("/jobs", **bearer("pgq_nope_nope"))
        assert_error(refused, 429, code="rate_limited")
        assert 0 < int(refused["Retry-After"]) <= 60

    @override_settings(PGQUEUE={"AUTH_FAILURE_RATE": "3/min"})
    def test_over_budget_is_429_with_retry_after_and_no_key_lookup(self):
        good = new_key()
        for _ in range(3):
            assert_error(APIClient().get("/jobs", **bearer("pgq_deadbeef_guess")), 401)
        with CaptureQueriesContext(connection) as queries:
            refused = APIClient().post(
                "/jobs", {"task": "test.noop"}, format="json", **bearer("pgq_deadbeef_guess")
            )
        assert_error(refused, 429, code="rate_limited")
        assert 0 < int(refused["Retry-After"]) <= 60
        assert key_lookups(queries) == 0
        # Even a good key from that address waits: it cannot be told from a guess unlooked.
        assert_error(APIClient().get("/jobs", **bearer(good)), 429)
        # A good key from another address still works.
        assert APIClient().get("/jobs", **bearer(good, addr="198.51.100.9")).status_code == 200
        assert job_rows() == 0

    @override_settings(PGQUEUE={"AUTH_FAILURE_RATE": "2/min"})
    def test_successes_do_not_count(self):
        good = new_key()
        for _ in range(5):
            assert APIClient().get("/jobs", **bearer(good)).status_code == 200
        assert_error(APIClient().get("/jobs", **bearer("pgq_a_b")), 401)
        assert APIClient().get("/jobs", **bearer(good)).status_code == 200

    @override_settings(PGQUEUE={"AUTH_FAILURE_RATE": None})
    def test_none_turns_it_off(self):
        for _ in range(30):
            assert_error(APIClient().get("/jobs", **bearer("pgq_a_b")), 401)

    @override_settings(PGQUEUE={"AUTH_FAILURE_RATE": "5/min"})
    def test_x_forwarded_for_cannot_lock_out_a_victim_nor_evade_the_budget(self):
        """With no trusted proxy (the default), the address is the connection's, whatever
        X-Forwarded-For says: an attacker who names the victim's address spends its own
        budget, not the victim's, and one who names a new address each time is still
        throttled.

        Protection: ``client_address`` ignores X-Forwarded-For unless
        PGQUEUE["API_TRUSTED_PROXIES"] is set. Without it (DRF's ``get_ident`` with
        NUM_PROXIES unset, which trusts the header) the victim's good key is refused
        with a 429 and the rotating attacker never is."""
        victim, attacker = "198.51.100.20", "203.0.113.66"
        good = new_key()
        for _ in range(5):
            response = APIClient().get(
                "/jobs", HTTP_X_FORWARDED_FOR=victim, **bearer("pgq_x_guess", attacker)
            )
            assert_error(response, 401)
        assert APIClient().get("/jobs", **bearer(good, victim)).status_code == 200
        for n in range(5):  # a new forged address each time: the same connection, refused
            response = APIClient().get(
                "/jobs", HTTP_X_FORWARDED_FOR=f"10.9.8.{n}", **bearer("pgq_x_guess", attacker)
            )
            assert_error(response, 429, code="rate_limited")

    @override_settings(PGQUEUE={"AUTH_FAILURE_RATE": "3/min", "API_TRUSTED_PROXIES": 1})
    def test_behind_a_trusted_proxy_the_address_is_the_one_it_saw(self):
        """With one trusted proxy, the client is the last X-Forwarded-For entry (what the
        proxy appended): entries a client put before it are not believed."""
        proxy, client_a, client_b = "10.0.0.1", "198.51.100.1", "198.51.100.2"
        good = new_key()
        for n in range(3):
            forwarded = f"192.0.2.{n}, {client_a}"  # a forged first entry, then the proxy's
            response = APIClient().get(
                "/jobs", HTTP_X_FORWARDED_FOR=forwarded, **bearer("pgq_x_guess", proxy)
            )
            assert_error(response, 401)
        refused = APIClient().get("/jobs", HTTP_X_FORWARDED_FOR=client_a, **bearer(good, proxy))
        assert_error(refused, 429, code="rate_limited")
        other = APIClient().get("/jobs", HTTP_X_FORWARDED_FOR=client_b, **bearer(good, proxy))
        assert other.status_code == 200


# -- every error is JSON and echoes nothing it cannot encode ------------------------------


def assert_encodable(response: Any) -> dict[str, Any]:
    response.content.decode("utf-8")  # strict: no lone surrogates reached the wire
    return json.loads(response.content)


class TestErrorsAreJson:
    def test_a_lone_surrogate_field_name_is_a_400_with_the_name_escaped(self):
        body = '{"\\ud800": [1], "task": "test.noop"}'
        response = client(new_key()).generic("POST", "/jobs", body, "application/json")
        data = assert_error(response, 400, code="invalid")
        assert_encodable(response)
        assert "\\ud800" in data["fields"], data
        assert job_rows() == 0

    def test_an_echoed_name_is_bounded(self):
        name = "x" * 100_000
        response = client(new_key()).post("/jobs", {name: 1, "task": "t"}, format="json")
        data = assert_error(response, 400, code="invalid")
        assert all(len(k) <= errors.ECHO_MAX_CHARS for k in data["fields"]), data
        assert len(data["detail"]) <= errors.DETAIL_MAX_CHARS
        assert len(response.content) < 2 * errors.DETAIL_MAX_CHARS + 2 * errors.ECHO_MAX_CHARS

    def test_long_text_echoed_by_any_error_is_bounded(self):
        tenant = "t" * 100_000
        api = client(new_key("acme"))
        response = api.post("/jobs", {"task": "test.noop", "tenant": tenant}, format="json")
        data = assert_error(response, 403)
        assert len(data["detail"]) <= errors.DETAIL_MAX_CHARS

    @PREFIXED
    def test_an_unexpected_error_is_logged_with_its_traceback_and_a_bare_json_500(
        self, monkeypatch, caplog
    ):
        def broken() -> Any:
            raise RuntimeError("secret: host=db.internal port=5432")

        monkeypatch.setattr(reads, "stats", broken)
        api = client(new_key())
        api.raise_request_exception = False
        with caplog.at_level(logging.ERROR, logger="pgqueue.api"):
            response = api.get("/q/stats")
        data = assert_error(response, 500, code="server_error")
        assert b"secret" not in response.content
        assert "RuntimeError" not in data["detail"]
        (record,) = [r for r in caplog.records if r.name == "pgqueue.api"]
        assert record.exc_info is not None and record.exc_info[0] is RuntimeError
        assert "/q/stats" in record.getMessage()

    @override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=2_000)
    def test_a_body_over_data_upload_max_memory_size_is_the_json_413_of_a_big_payload(self):
        api = client(new_key())
        too_big = api.post("/jobs", {"task": "test.noop", "payload": "a" * 5_000}, "json")
        data = assert_error(too_big, 413, code="payload_too_large", field="payload")
        with override_settings(PGQUEUE={"MAX_PAYLOAD_BYTES": 100}):
            payload = api.post("/jobs", {"task": "test.noop", "payload": "a" * 500}, "json")
        same = assert_error(payload, 413, code="payload_too_large", field="payload")
        assert set(data) == set(same)
        batch = api.post("/jobs/batch", {"task": "test.noop", "payloads": ["a" * 5_000]}, "json")
        assert_error(batch, 413, code="payload_too_large")
        assert job_rows() == 0

    def test_an_offset_postgresql_refuses_is_read_in_utc_not_a_500(self):
        api = client(new_key())
        moment = "2061-05-15T15:44:40-22:56"  # PostgreSQL takes offsets up to 15:59
        assert api.get("/jobs", {"created_after": moment}).status_code == 200
        created = api.post("/jobs", {"task": "test.noop", "run_at": moment}, format="json")
        assert created.status_code == 201, created.content
        assert created.json()["run_at"].startswith("2061-05-16T14:40:40")

    def test_a_moment_out_of_range_in_utc_is_a_400_not_a_500(self):
        api = client(new_key())
        moment = "0001-01-01T00:00:00+05:00"  # before year 1 in UTC
        listed = api.get("/jobs", {"created_after": moment})
        assert_error(listed, 400, code="invalid", field="created_after")
        run_at = {"task": "test.noop", "run_at": moment}
        assert_error(api.post("/jobs", run_at, format="json"), 400, field="run_at")
        assert job_rows() == 0

    @PREFIXED
    @pytest.mark.parametrize(
        "url",
        [
            "/q/jobs/abc",
            "/q/jobs/1/nothing",
            "/q/tenants/no%20such/x",
            "/q/stats/x",
            "/q/docs/assets/no-such.js",
        ],
    )
    def test_an_unknown_url_under_pgqueues_resources_is_a_json_404(self, url):
        assert_error(client(new_key()).get(url), 404, code="not_found")

    @PREFIXED
    def test_the_rest_of_the_site_keeps_its_own_pages(self):
        assert APIClient().get("/jobsite/").content == b"<html>the project's own page</html>"
        outside = APIClient().get("/elsewhere")
        assert outside.status_code == 404
        assert not outside["Content-Type"].startswith("application/json")

    @PREFIXED
    @pytest.mark.parametrize("url", ["/q/docs", "/q/docs/assets/swagger-ui.css"])
    def test_a_post_to_the_docs_is_a_json_405_not_a_csrf_page(self, url):
        api = APIClient(enforce_csrf_checks=True)
        assert_error(api.post(url, {}, format="json"), 405, code="method_not_allowed")

    @PREFIXED
    def test_a_session_post_without_csrf_token_is_a_json_403(self):
        api = session("add_job")
        api.handler.enforce_csrf_checks = True
        response = api.post("/q/jobs", {"task": "test.noop"}, format="json")
        data = assert_error(response, 403)
        assert "CSRF" in data["detail"]
        assert job_rows() == 0

    @PREFIXED
    def test_a_wrong_method_is_a_json_405(self):
        assert_error(client(new_key()).patch("/q/jobs", {}, format="json"), 405)


# -- /health says nothing about the database's whereabouts --------------------------------


@pytest.fixture
def unreachable_database(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A real connection to a port nobody listens on, in place of the default one."""
    from django.db.backends.postgresql.base import DatabaseWrapper

    from pgqueue.api import meta_views

    settings_dict = {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": "9"}
    dead = DatabaseWrapper(settings_dict, alias="unreachable")
    monkeypatch.setattr(meta_views, "connections", {"default": dead})
    yield
    dead.close()


def test_health_says_unavailable_and_logs_the_detail(unreachable_database, caplog):
    with caplog.at_level(logging.WARNING, logger="pgqueue.api"):
        response = APIClient().get("/health")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "database": "unavailable"}
    assert b"127.0.0.1" not in response.content and b"9" not in response.content
    (record,) = [r for r in caplog.records if r.name == "pgqueue.api"]
    assert "127.0.0.1" in record.getMessage() or record.exc_info is not None


def test_health_is_ok_with_a_database():
    assert APIClient().get("/health").json() == {"status": "ok", "database": "ok"}
    assert Job.objects.count() == 0
