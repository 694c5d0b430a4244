"""Who may call the HTTP API: API keys, tenant isolation, staff sessions, metrics access,
the pgqueue apikey command and the per-key rate limit."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.cache import cache
from django.core.management import CommandError, call_command
from django.test import override_settings
from rest_framework.test import APIClient

from pgqueue import keys, services
from pgqueue.models import ApiKey, Job, QueueWeight, Tenant
from tests.api_fixtures import (
    assert_error,
    assert_job_json,
    client,
    job_rows,
    make_job,
    new_key,
    status_of,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(db: Any) -> APIClient:
    """An all-tenants key."""
    return client(new_key())


@pytest.fixture
def acme(db: Any) -> APIClient:
    """A key bound to tenant "acme"."""
    return client(new_key("acme"))


#: What an operator's staff account holds to use the whole API (tests/test_api_security.py
#: checks each one separately).
OPERATOR_PERMISSIONS = ["view_job", "add_job", "change_job", "view_tenant", "change_tenant"]


def staff_client(*, is_staff: bool = True) -> APIClient:
    user = get_user_model().objects.create_user(
        f"user-{is_staff}", password="pw", is_staff=is_staff
    )
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="pgqueue", codename__in=OPERATOR_PERMISSIONS
        )
    )
    api = APIClient()
    api.force_login(user)
    return api


# Every endpoint that needs credentials: (method, path, JSON body).
PROTECTED = [
    ("get", "/jobs", None),
    ("post", "/jobs", {"task": "test.noop"}),
    ("post", "/jobs/batch", {"task": "test.noop", "payloads": [{}]}),
    ("get", "/jobs/{id}", None),
    ("delete", "/jobs/{id}", None),
    ("post", "/jobs/{id}/retry", None),
    ("get", "/tenants", None),
    ("get", "/tenants/acme", None),
    ("put", "/tenants/acme", {"weight": 9}),
    ("get", "/stats", None),
    ("get", "/metrics", None),
]


def call(api: APIClient, method: str, path: str, body: Any, **extra: Any) -> Any:
    if body is None:
        return getattr(api, method)(path, **extra)
    return getattr(api, method)(path, body, format="json", **extra)


def assert_401(response: Any) -> None:
    assert_error(response, 401)
    assert "Bearer" in response["WWW-Authenticate"]


# -- authentication -----------------------------------------------------------------------


class TestWithoutValidCredentials:
    @pytest.mark.parametrize(("method", "path", "body"), PROTECTED)
    def test_no_credentials_is_401_with_www_authenticate(self, method, path, body):
        job_id = make_job("dead", tenant="acme")
        before = job_rows()
        assert_401(call(APIClient(), method, path.format(id=job_id), body))
        assert job_rows() == before
        assert status_of(job_id) == "dead"
        assert Tenant.objects.get(name="acme").weight == 1.0

    @pytest.mark.parametrize(
        "header",
        [
            "Bearer pgq_deadbeef_not-a-real-key",
            "Bearer not-even-shaped-like-a-key",
            "Bearer ",
            "Bearer",
            "bearer pgq_0_0",
        ],
    )
    def test_an_invalid_key_is_401(self, header):
        valid = new_key()
        for method, path, body in (("get", "/jobs", None), ("post", "/jobs", {"task": "x"})):
            response = call(APIClient(), method, path, body, HTTP_AUTHORIZATION=header)
            assert_401(response)
        # A real key with its secret part altered is no key.
        assert_401(client(valid[:-4] + "AAAA").get("/jobs"))
        assert job_rows() == 0

    def test_another_scheme_is_no_credentials(self):
        response = APIClient().get("/jobs", HTTP_AUTHORIZATION="Basic dXNlcjpwdw==")
        assert_401(response)

    def test_a_revoked_key_is_401(self):
        row, key = keys.create_api_key(tenant="acme")
        api = client(key)
        assert api.get("/jobs").status_code == 200
        keys.revoke_api_key(row.prefix)
        assert_401(api.get("/jobs"))
        assert_401(api.post("/jobs", {"task": "test.noop"}, format="json"))
        assert job_rows() == 0

    def test_health_is_open(self):
        assert APIClient().get("/health").status_code == 200
        bogus = APIClient().get("/health", HTTP_AUTHORIZATION="Bearer pgq_bad_key")
        assert bogus.status_code == 200


# -- the all-tenants key ------------------------------------------------------------------


class TestAllTenantsKey:
    def test_defaults_to_the_default_tenant_and_may_name_any(self, admin):
        plain = admin.post("/jobs", {"task": "test.noop"}, format="json")
        named = admin.post("/jobs", {"task": "test.noop", "tenant": "acme"}, format="json")
        assert (plain.status_code, named.status_code) == (201, 201)
        assert (plain.json()["tenant"], named.json()["tenant"]) == ("default", "acme")

    @pytest.mark.parametrize(("method", "path", "body"), PROTECTED)
    def test_may_call_everything(self, admin, method, path, body):
        # A dead job can be read and retried; a cancel needs one that is still waiting.
        job_id = make_job("queued" if method == "delete" else "dead", tenant="acme")
        response = call(admin, method, path.format(id=job_id), body)
        assert response.status_code in (200, 201), (response.status_code, response.content)


# -- a tenant-bound key -------------------------------------------------------------------


class TestTenantKey:
    def test_jobs_default_to_its_tenant(self, acme):
        response = acme.post("/jobs", {"task": "test.noop"}, format="json")
        assert response.status_code == 201, response.content
        assert response.json()["tenant"] == "acme"
        batch = acme.post("/jobs/batch", {"task": "test.noop", "payloads": [{}, {}]}, "json")
        assert batch.status_code == 201, batch.content
        assert set(Job.objects.values_list("tenant_id", flat=True)) == {"acme"}

    def test_may_name_its_own_tenant(self, acme):
        response = acme.post("/jobs", {"task": "test.noop", "tenant": "acme"}, format="json")
        assert response.status_code == 201
        batch = acme.post(
            "/jobs/batch", {"task": "test.noop", "payloads": [{}], "tenant": "acme"}, "json"
        )
        assert batch.status_code == 201

    @pytest.mark.parametrize("path", ["/jobs", "/jobs/batch"])
    @pytest.mark.parametrize("tenant", ["globex", "default", "ACME"])
    def test_naming_another_tenant_is_403(self, acme, path, tenant):
        body = {"task": "test.noop", "payload": {}, "payloads": [{}], "tenant": tenant}
        body.pop("payloads" if path == "/jobs" else "payload")
        assert_error(acme.post(path, body, format="json"), 403)
        assert job_rows() == 0
        assert not Tenant.objects.filter(name__in=["globex", "ACME"]).exists()

    def test_its_own_jobs_work_as_usual(self, acme):
        queued, dead = make_job("queued", tenant="acme"), make_job("dead", tenant="acme")
        shown = acme.get(f"/jobs/{queued}")
        assert shown.status_code == 200 and shown.json()["tenant"] == "acme"
        assert acme.delete(f"/jobs/{queued}").json()["status"] == "cancelled"
        assert acme.post(f"/jobs/{dead}/retry").json()["status"] == "queued"

    @pytest.mark.parametrize("state", ["queued", "scheduled", "dead", "cancelled"])
    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("get", "/jobs/{id}"),
            ("get", "/jobs/{id}/"),
            ("delete", "/jobs/{id}"),
            ("delete", "/jobs/{id}/"),
            ("post", "/jobs/{id}/retry"),
            ("post", "/jobs/{id}/retry/"),
        ],
    )
    def test_another_tenants_job_is_404_to_it(self, acme, state, method, path):
        theirs = make_job(state, tenant="globex")
        response = getattr(acme, method)(path.format(id=theirs))
        body = assert_error(response, 404, code="not_found")
        # Indistinguishable from a job that does not exist.
        missing = assert_error(getattr(acme, method)(path.format(id=theirs + 1000)), 404)
        assert set(body) == set(missing)
        assert body["detail"].replace(str(theirs), "N") == missing["detail"].replace(
            str(theirs + 1000), "N"
        )
        assert status_of(theirs) == state
        assert Job.objects.get(pk=theirs).attempts == (1 if state == "dead" else 0)

    def test_the_list_shows_only_its_jobs_whatever_the_filter(self, acme):
        mine = {make_job(s, tenant="acme") for s in ("queued", "dead", "scheduled")}
        for state in ("queued", "dead", "scheduled", "running", "done"):
            make_job(state, tenant="globex")
        services.enqueue_many("test.noop", [{}] * 5, tenant="default")

        def listed(**params: Any) -> tuple[int, set[int], set[str]]:
            response = acme.get("/jobs", params)
            assert response.status_code == 200, response.content
            data = response.json()
            for job in data["results"]:
                assert_job_json(job)
            return (
                data["count"],
                {j["id"] for j in data["results"]},
                {j["tenant"] for j in data["results"]},
            )

        assert listed() == (3, mine, {"acme"})
        assert listed(tenant="globex") == (0, set(), set())
        assert listed(tenant="default") == (0, set(), set())
        assert listed(tenant="acme") == (3, mine, {"acme"})
        for status in ("queued", "dead", "scheduled", "running", "done", "cancelled"):
            count, ids, tenants = listed(status=status)
            assert ids <= mine and tenants <= {"acme"}
        count, ids, tenants = listed(task="test.echo", created_after="2000-01-01T00:00:00Z")
        assert (count, ids, tenants) == (3, mine, {"acme"})
        # Paging through the whole list one job at a time never meets another tenant's.
        seen: set[int] = set()
        url: str | None = "/jobs?limit=1"
        while url:
            page = acme.get(url).json()
            assert page["count"] == 3
            seen |= {j["id"] for j in page["results"]}
            url = page["next"]
        assert seen == mine

    def test_tenants_shows_only_its_own(self, acme):
        make_job("queued", tenant="globex")
        make_job("queued", tenant="acme")
        response = acme.get("/tenants")
        assert response.status_code == 200
        data = response.json()
        assert [t["name"] for t in data["results"]] == ["acme"]
        assert (data["count"], data["next"], data["previous"]) == (1, None, None)
        assert acme.get("/tenants/acme").json()["backlog"] == 1
        assert_error(acme.get("/tenants/globex"), 404)

    @pytest.mark.parametrize("name", ["acme", "globex", "newco"])
    @pytest.mark.parametrize("body", [{"weight": 5}, {"weight": 5, "queue": "emails"}])
    def test_it_cannot_set_weights(self, acme, name, body):
        services.set_tenant_weight("globex", 1)
        assert_error(acme.put(f"/tenants/{name}", body, format="json"), 403)
        assert set(Tenant.objects.values_list("name", "weight")) == {
            ("acme", 1.0),
            ("globex", 1.0),
        }
        assert not QueueWeight.objects.exists()

    @pytest.mark.parametrize("path", ["/stats", "/metrics", "/stats/", "/metrics/"])
    def test_stats_and_metrics_are_403(self, acme, path):
        assert_error(acme.get(path), 403)

    def test_idempotency_keys_do_not_cross_tenants(self, acme):
        globex = client(new_key("globex"))
        theirs = globex.post(
            "/jobs", {"task": "test.echo", "payload": {"secret": 1}, "idempotency_key": "k"}, "json"
        )
        assert theirs.status_code == 201
        mine = acme.post(
            "/jobs", {"task": "test.echo", "payload": {"mine": 1}, "idempotency_key": "k"}, "json"
        )
        assert mine.status_code == 201, mine.content
        assert mine.json()["id"] != theirs.json()["id"]
        assert mine.json()["payload"] == {"mine": 1}
        assert (mine.json()["tenant"], theirs.json()["tenant"]) == ("acme", "globex")


# -- metrics access -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/stats", "/metrics"])
def test_metrics_and_stats_need_an_operator_unless_public(path):
    tenant_key = client(new_key("acme"))
    assert_401(APIClient().get(path))
    assert_error(tenant_key.get(path), 403)
    assert client(new_key()).get(path).status_code == 200
    assert staff_client().get(path).status_code == 200
    with override_settings(PGQUEUE={"METRICS_PUBLIC": True}):
        assert APIClient().get(path).status_code == 200
        assert tenant_key.get(path).status_code == 200
    assert_401(APIClient().get(path))


def test_metrics_public_opens_nothing_else():
    with override_settings(PGQUEUE={"METRICS_PUBLIC": True}):
        for method, path, body in PROTECTED:
            if path not in ("/stats", "/metrics"):
                job_id = make_job("queued", tenant="acme")
                assert_401(call(APIClient(), method, path.format(id=job_id), body))


# -- staff sessions (the browsable API) ---------------------------------------------------


class TestSession:
    def test_staff_can_use_the_api(self):
        staff = staff_client()
        created = staff.post("/jobs", {"task": "test.noop", "tenant": "acme"}, format="json")
        assert created.status_code == 201, created.content
        job_id = created.json()["id"]
        assert staff.get("/jobs").json()["count"] == 1
        assert staff.get(f"/jobs/{job_id}").status_code == 200
        assert staff.delete(f"/jobs/{job_id}").json()["status"] == "cancelled"
        assert staff.post(f"/jobs/{job_id}/retry").json()["status"] == "queued"
        assert staff.put("/tenants/acme", {"weight": 2}, format="json").status_code == 200
        assert staff.get("/tenants/acme").json()["weight"] == 2.0
        assert staff.get("/stats").status_code == 200
        assert staff.get("/metrics").status_code == 200

    @pytest.mark.parametrize("path", ["/jobs", "/jobs/{id}", "/tenants", "/tenants/acme"])
    def test_the_browsable_api_renders_for_staff(self, path):
        job_id = make_job("queued", tenant="acme")
        response = staff_client().get(path.format(id=job_id), HTTP_ACCEPT="text/html")
        assert response.status_code == 200, response.content[:300]
        assert response["Content-Type"].startswith("text/html")
        assert b"<html" in response.content.lower()

    def test_a_session_that_is_not_staff_gets_nothing(self):
        make_job("queued", tenant="acme")
        api = staff_client(is_staff=False)
        for method, path, body in PROTECTED:
            response = call(api, method, path.format(id=1), body)
            assert response.status_code in (401, 403), (path, response.status_code)
            assert_error(response, response.status_code)
        assert job_rows() == 1


# -- manage.py pgqueue apikey -------------------------------------------------------------


def apikey(*args: str) -> str:
    out = io.StringIO()
    call_command("pgqueue", "apikey", *args, stdout=out)
    return out.getvalue()


class TestApiKeyCommand:
    def test_create_for_a_tenant_prints_the_key_last(self):
        output = apikey("create", "--tenant", "acme", "--name", "billing")
        key = output.strip().splitlines()[-1].strip()
        row = ApiKey.objects.get()
        assert (row.tenant_id, row.name) == ("acme", "billing")
        assert key.startswith("pgq_") and row.prefix in key
        assert key not in row.key_hash
        api = client(key)
        response = api.post("/jobs", {"task": "test.noop"}, format="json")
        assert response.status_code == 201
        assert response.json()["tenant"] == "acme"
        assert_error(api.get("/stats"), 403)

    def test_create_for_all_tenants(self):
        key = apikey("create", "--all-tenants").strip().splitlines()[-1].strip()
        assert ApiKey.objects.get().tenant_id is None
        api = client(key)
        assert api.get("/stats").status_code == 200
        assert api.put("/tenants/newco", {"weight": 2}, format="json").status_code == 200

    def test_create_creates_a_new_tenant(self):
        apikey("create", "--tenant", "fresh")
        assert Tenant.objects.get(name="fresh").weight == 1.0

    @pytest.mark.parametrize(
        "args",
        [
            ("create",),
            ("create", "--tenant", "acme", "--all-tenants"),
            ("create", "--tenant", "bad name"),
            ("create", "--tenant", ""),
            ("revoke", "nosuchprefix"),
        ],
    )
    def test_refused(self, args):
        with pytest.raises(CommandError):
            apikey(*args)
        assert not ApiKey.objects.exists()

    def test_list_shows_prefixes_never_keys(self):
        keys = [
            apikey("create", "--tenant", "acme").strip().splitlines()[-1],
            apikey("create", "--all-tenants").strip().splitlines()[-1],
        ]
        listing = apikey("list")
        for key in keys:
            prefix = key.split("_")[1]
            assert prefix in listing
            assert key not in listing
            assert key.split("_", 2)[2] not in listing
        assert "acme" in listing

    def test_list_with_no_keys(self):
        assert apikey("list").strip()

    def test_revoke(self):
        key = apikey("create", "--tenant", "acme").strip().splitlines()[-1]
        other = apikey("create", "--tenant", "acme").strip().splitlines()[-1]
        prefix = ApiKey.objects.get(prefix=key.split("_")[1]).prefix
        assert client(key).get("/jobs").status_code == 200
        assert prefix in apikey("revoke", prefix)
        assert_401(client(key).get("/jobs"))
        assert client(other).get("/jobs").status_code == 200
        assert "revoked" in next(line for line in apikey("list").splitlines() if prefix in line)
        apikey("revoke", prefix)  # revoking twice is harmless
        assert_401(client(key).get("/jobs"))


# -- rate limiting ------------------------------------------------------------------------


@pytest.fixture
def clean_cache():
    cache.clear()
    yield
    cache.clear()


@pytest.mark.usefixtures("clean_cache")
class TestRateLimit:
    def test_off_by_default(self, acme):
        for _ in range(30):
            assert acme.get("/jobs").status_code == 200

    def test_the_limit_is_per_key_with_429_and_retry_after(self, acme):
        other = client(new_key("acme"))
        with override_settings(PGQUEUE={"API_RATE_LIMIT": "3/min"}):
            for i in range(3):
                response = acme.post("/jobs", {"task": "test.noop", "payload": i}, "json")
                assert response.status_code == 201, response.content
            refused = acme.post("/jobs", {"task": "test.noop", "payload": 3}, "json")
            assert_error(refused, 429)
            assert 0 < int(refused["Retry-After"]) <= 60
            assert_error(acme.get("/jobs"), 429)
            assert job_rows() == 3
            # Another key has its own allowance.
            for _ in range(3):
                assert other.get("/jobs").status_code == 200
            assert_error(other.get("/jobs"), 429)
        # Off again once the setting is gone.
        assert acme.get("/jobs").status_code == 200
