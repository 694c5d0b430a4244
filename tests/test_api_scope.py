"""A key reaches only what it was given: the tasks the project opened to the API
(``PGQUEUE["API_TASKS"]``), and the tasks, queues and priorities of its own scope.

Each refusal is a 403 naming the field at fault, and writes nothing.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.test import override_settings

import pgqueue
from pgqueue import backends, keys
from pgqueue.models import ApiKey, Job
from tests.api_fixtures import assert_error, client, new_key

pytestmark = pytest.mark.django_db

assert backends.RUNNER  # the django.tasks family is registered, as under TASKS
DJANGO_TASK = "django.tasks:tests.taskapp.django_tasks.noop"


def scoped(tenant: str | None = "acme", **scope: Any) -> str:
    return keys.create_api_key(tenant=tenant, **scope)[1]


def refused(response: Any, field: str, jobs: int = 0) -> None:
    """A 403 naming ``field``, and still ``jobs`` jobs in all."""
    data = assert_error(response, 403, code="forbidden", field=None)
    assert field in data.get("fields", {}), data
    assert Job.objects.count() == jobs


class TestApiTasks:
    @pytest.mark.parametrize("task", [DJANGO_TASK, "django.tasks", "django.tasks:os.system"])
    def test_the_django_tasks_family_is_not_enqueueable_by_default(self, task):
        for key in (new_key("acme"), new_key()):
            response = client(key).post("/jobs", {"task": task, "payload": {}}, format="json")
            refused(response, "task")
            batch = client(key).post("/jobs/batch", {"task": task, "payloads": [{}]}, "json")
            refused(batch, "task")

    def test_registered_tasks_stay_enqueueable_by_default(self):
        response = client(new_key("acme")).post("/jobs", {"task": "test.noop"}, format="json")
        assert response.status_code == 201, response.content

    @override_settings(PGQUEUE={"API_TASKS": ["test.echo"]})
    def test_a_list_restricts_what_the_api_may_enqueue(self):
        api = client(new_key())
        refused(api.post("/jobs", {"task": "test.noop"}, format="json"), "task")
        assert api.post("/jobs", {"task": "test.echo"}, format="json").status_code == 201

    @override_settings(PGQUEUE={"API_TASKS": ["test.*"]})
    def test_a_wildcard_never_opens_the_django_tasks_family(self):
        api = client(new_key())
        assert api.post("/jobs", {"task": "test.noop"}, format="json").status_code == 201
        refused(api.post("/jobs", {"task": DJANGO_TASK}, format="json"), "task", jobs=1)

    @override_settings(PGQUEUE={"API_TASKS": [DJANGO_TASK]})
    def test_a_django_task_listed_by_name_is_enqueueable(self):
        response = client(new_key()).post("/jobs", {"task": DJANGO_TASK}, format="json")
        assert response.status_code == 201, response.content

    @pytest.mark.parametrize("value", ["test.noop", [1], ["bad name!"], ["*", 3], {"test.noop": 1}])
    def test_the_check_refuses_a_bad_api_tasks(self, value):
        with override_settings(PGQUEUE={"API_TASKS": value}):
            ids = [m.id for m in checks.run_checks() if m.id.startswith("pgqueue.")]
        assert any(i.startswith("pgqueue.E") for i in ids), ids

    @pytest.mark.parametrize("value", [None, [], ["*"], ["test.*", DJANGO_TASK]])
    def test_the_check_accepts_a_good_api_tasks(self, value):
        with override_settings(PGQUEUE={"API_TASKS": value}):
            assert not [m for m in checks.run_checks() if m.id.startswith("pgqueue.E")]


class TestKeyScope:
    def test_a_task_scope(self):
        api = client(scoped(tasks=["test.echo"]))
        refused(api.post("/jobs", {"task": "test.noop"}, format="json"), "task")
        refused(api.post("/jobs/batch", {"task": "test.noop", "payloads": [{}]}, "json"), "task")
        assert api.post("/jobs", {"task": "test.echo"}, format="json").status_code == 201

    def test_a_queue_scope_covers_the_default_queue_too(self):
        api = client(scoped(queues=["q1"]))
        refused(api.post("/jobs", {"task": "test.noop"}, format="json"), "queue")
        refused(api.post("/jobs", {"task": "test.noop", "queue": "q2"}, format="json"), "queue")
        refused(
            api.post("/jobs/batch", {"task": "test.noop", "queue": "q2", "payloads": [{}]}, "json"),
            "queue",
        )
        ok = api.post("/jobs", {"task": "test.noop", "queue": "q1"}, format="json")
        assert ok.status_code == 201, ok.content

    def test_a_queue_scope_hides_other_queues_jobs(self):
        admin = client(new_key())
        other = admin.post("/jobs", {"task": "test.noop", "tenant": "acme"}, "json").json()
        mine = admin.post(
            "/jobs", {"task": "test.noop", "tenant": "acme", "queue": "q1"}, "json"
        ).json()
        api = client(scoped(queues=["q1"]))
        assert api.get(f"/jobs/{mine['id']}").status_code == 200
        assert_error(api.get(f"/jobs/{other['id']}"), 404)
        assert_error(api.delete(f"/jobs/{other['id']}"), 404)
        assert_error(api.post(f"/jobs/{other['id']}/retry"), 404)
        assert [j["id"] for j in api.get("/jobs").json()["results"]] == [mine["id"]]

    @pytest.mark.parametrize(
        "scope, job",
        [
            ({"tasks": ["test.noop"]}, {"task": "test.echo"}),
            ({"max_priority": 0}, {"task": "test.noop", "priority": 5}),
        ],
    )
    def test_a_keys_task_and_priority_scope_bound_every_per_job_endpoint(self, scope, job):
        """A key reaches, job by job, only what it could have enqueued: a job of another
        task, or above its priority, is a 404 to read, cancel and retry (dead here: retry
        would run it again). Protection: ``Scope.sees`` checks the task and the priority
        as enqueue does; without it a key that may not enqueue test.echo could retry a
        dead test.echo job of its tenant and run it again."""
        admin = client(new_key())
        other = admin.post("/jobs", {**job, "tenant": "acme"}, "json").json()
        Job.objects.filter(pk=other["id"]).update(status="dead")
        api = client(scoped(**scope))
        for response in (
            api.get(f"/jobs/{other['id']}"),
            api.post(f"/jobs/{other['id']}/retry"),
            api.delete(f"/jobs/{other['id']}"),
        ):
            assert_error(response, 404)
        assert Job.objects.get(pk=other["id"]).status == "dead"

    @override_settings(PGQUEUE={"API_TASKS": ["test.noop", "test.e*"]})
    def test_a_keys_list_holds_only_the_jobs_it_could_read_one_by_one(self):
        """GET /jobs of a key lists what ``Scope.sees`` lets it read (payloads included):
        not the jobs of another task, above its priority, or (a tenant key) of a task
        API_TASKS does not open. Protection: the list's filters in JobsView.get; without
        them a key scoped to test.noop listed its tenant's test.echo jobs and payloads."""
        noop, _ = pgqueue.enqueue("test.noop", {}, tenant="acme")
        echo, _ = pgqueue.enqueue("test.echo", {"secret": 1}, tenant="acme")
        pgqueue.enqueue("test.noop", {}, tenant="acme", priority=5)
        pgqueue.enqueue("test.log", {"word": "w"}, tenant="acme")  # not opened to the API

        def listed(key: str) -> set[int]:
            return {j["id"] for j in client(key).get("/jobs").json()["results"]}

        assert listed(scoped(tasks=["test.noop"])) == {noop.id}
        assert listed(new_key("acme")) == {noop.id, echo.id}  # TENANT_MAX_PRIORITY 0
        assert len(listed(new_key())) == 4  # an operator's key lists every job

    @override_settings(PGQUEUE={"API_TASKS": ["test.noop"]})
    def test_api_tasks_bound_a_tenant_keys_per_job_endpoints(self):
        """A tenant key cannot reach a job of a task the API may not enqueue, even of its
        own tenant (an operator enqueued it from Python); an all-tenants key may read it
        but not retry it, since a retry runs it again."""
        job, _ = pgqueue.enqueue("test.echo", {}, tenant="acme")
        Job.objects.filter(pk=job.id).update(status="dead")
        tenant_key = client(new_key("acme"))
        assert_error(tenant_key.get(f"/jobs/{job.id}"), 404)
        assert_error(tenant_key.post(f"/jobs/{job.id}/retry"), 404)
        operator = client(new_key())
        assert operator.get(f"/jobs/{job.id}").status_code == 200
        refused(operator.post(f"/jobs/{job.id}/retry"), "task", jobs=1)
        assert Job.objects.get(pk=job.id).status == "dead"

    def test_an_idempotency_key_does_not_reach_past_the_scope(self):
        """A queue-scoped key posting an idempotency key its tenant used for a job in
        another queue gets a 409 naming the field and nothing of that job. Protection:
        the enqueue checks ``Scope.sees`` on the job it got back; without it the key
        read that job, payload included."""
        admin = client(new_key())
        secret = {"task": "test.echo", "tenant": "acme", "queue": "q2", "payload": {"s": 1}}
        first = admin.post("/jobs", {**secret, "idempotency_key": "k1"}, "json")
        assert first.status_code == 201
        api = client(scoped(queues=["q1"]))
        body = {"task": "test.echo", "queue": "q1", "idempotency_key": "k1"}
        response = api.post("/jobs", body, format="json")
        data = assert_error(response, 409, code="conflict", field=None)
        assert "idempotency_key" in data["fields"]
        assert b'"s"' not in response.content
        assert Job.objects.count() == 1

    def test_a_batch_with_one_job_out_of_scope_writes_none(self):
        api = client(scoped(max_priority=5))
        body = {"task": "test.noop", "priority": 6, "payloads": [{}, {}, {}]}
        refused(api.post("/jobs/batch", body, format="json"), "priority")


class TestPriority:
    def test_a_tenant_key_gets_tenant_max_priority(self):
        api = client(new_key("acme"))
        refused(api.post("/jobs", {"task": "test.noop", "priority": 100}, "json"), "priority")
        refused(api.post("/jobs", {"task": "test.noop", "priority": 1}, "json"), "priority")
        refused(
            api.post("/jobs/batch", {"task": "test.noop", "priority": 1, "payloads": [{}]}, "json"),
            "priority",
        )
        assert api.post("/jobs", {"task": "test.noop", "priority": 0}, "json").status_code == 201
        assert api.post("/jobs", {"task": "test.noop", "priority": -5}, "json").status_code == 201

    @override_settings(PGQUEUE={"TENANT_MAX_PRIORITY": 20})
    def test_the_tenant_ceiling_is_a_setting(self):
        api = client(new_key("acme"))
        assert api.post("/jobs", {"task": "test.noop", "priority": 20}, "json").status_code == 201
        refused_before = Job.objects.count()
        response = api.post("/jobs", {"task": "test.noop", "priority": 21}, "json")
        assert_error(response, 403)
        assert Job.objects.count() == refused_before

    def test_a_keys_max_priority(self):
        for tenant in ("acme", None):
            api = client(scoped(tenant, max_priority=10))
            ok = api.post("/jobs", {"task": "test.noop", "priority": 10}, "json")
            assert ok.status_code == 201, ok.content
            Job.objects.all().delete()
            refused(api.post("/jobs", {"task": "test.noop", "priority": 11}, "json"), "priority")

    def test_an_all_tenants_key_keeps_the_full_range(self):
        api = client(new_key())
        assert api.post("/jobs", {"task": "test.noop", "priority": 100}, "json").status_code == 201


class TestKeyCreation:
    def test_the_command_sets_the_scope(self):
        out = io.StringIO()
        call_command(
            "pgqueue",
            "apikey",
            "create",
            "--tenant",
            "acme",
            "--tasks",
            "test.noop,test.echo",
            "--queues",
            "q1,q2",
            "--max-priority",
            "7",
            stdout=out,
        )
        row = ApiKey.objects.get()
        assert (row.tasks, row.queues, row.max_priority) == (
            ["test.noop", "test.echo"],
            ["q1", "q2"],
            7,
        )
        key = out.getvalue().strip().splitlines()[-1]
        refused(client(key).post("/jobs", {"task": "test.limited", "queue": "q1"}, "json"), "task")

    def test_create_api_key_validates_the_scope(self):
        from pgqueue.exceptions import InvalidJob

        for scope in ({"tasks": ["bad name!"]}, {"queues": [""]}, {"max_priority": 101}):
            with pytest.raises(InvalidJob):
                keys.create_api_key(tenant="acme", **scope)


class TestAdmin:
    KEYS = "/admin/pgqueue/apikey/"

    def test_adding_a_key_sets_its_scope(self, admin_client):
        response = admin_client.post(
            f"{self.KEYS}add/",
            {
                "tenant": "",
                "name": "ci",
                "tasks": "test.noop, test.echo",
                "queues": "q1",
                "max_priority": "5",
                "_save": "Save",
            },
        )
        assert response.status_code == 200
        assert response.templates[0].name == "admin/pgqueue/apikey/created.html"
        row = ApiKey.objects.get()
        assert (row.tasks, row.queues, row.max_priority) == (["test.noop", "test.echo"], ["q1"], 5)

    def test_changing_a_key_sets_its_scope_only(self, admin_client):
        row, key = keys.create_api_key(tenant="acme", name="one")
        response = admin_client.post(
            f"{self.KEYS}{row.pk}/change/",
            {
                "tenant": "",
                "name": "renamed",
                "tasks": "test.echo",
                "queues": "",
                "max_priority": "-1",
                "_save": "Save",
            },
        )
        assert response.status_code == 302, response.content[:2000]
        row.refresh_from_db()
        assert (row.tenant_id, row.name) == ("acme", "one")
        assert (row.tasks, row.queues, row.max_priority) == (["test.echo"], [], -1)
        assert keys.authenticate_api_key(key).pk == row.pk
        refused(client(key).post("/jobs", {"task": "test.noop"}, "json"), "task")

    def test_a_bad_scope_is_a_form_error(self, admin_client):
        response = admin_client.post(
            f"{self.KEYS}add/", {"name": "x", "tasks": "bad name!", "_save": "Save"}
        )
        assert response.status_code == 200 and response.context["adminform"].form.errors
        assert ApiKey.objects.count() == 0
