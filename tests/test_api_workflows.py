"""Workflows over HTTP: POST, GET and DELETE /workflows, and depends_on on POST /jobs.

Every refusal is a 400 (or 403 for a key's scope) naming the field by its place in the
body, and writes nothing; a key reaches only its tenant's workflows and jobs, and only
those it could reach job by job. The last test runs a workflow posted over HTTP to its end
with a real worker.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from pgqueue import keys
from pgqueue.models import Job, JobDependency
from pgqueue.models import Workflow as WorkflowRow
from tests.api_fixtures import assert_error, assert_job_json, client, new_key
from tests.conftest import claim
from tests.workers import STARTUP, StartWorker, wait_for

pytestmark = pytest.mark.django_db

STEP = "test.wf_step"
#: Quick maintenance and short backoffs for the worker.
FAST = {"MAINTENANCE_SECONDS": 0.1, "BACKOFF_BASE": 0.01, "BACKOFF_CAP": 0.01}
WORKFLOW_FIELDS = {"id", "tenant", "name", "created_at", "status", "counts", "edges_truncated"}
WORKFLOW_JOB_FIELDS = {
    "id",
    "step",
    "task",
    "status",
    "queue",
    "priority",
    "attempts",
    "max_attempts",
    "created_at",
    "started_at",
    "finished_at",
    "last_error",
    "on_upstream_failure",
    "failed_upstream_id",
    "depends_on",
}


@pytest.fixture
def admin(db: Any) -> APIClient:
    """An all-tenants key."""
    return client(new_key())


@pytest.fixture
def acme(db: Any) -> APIClient:
    """A key bound to tenant "acme"."""
    return client(new_key("acme"))


def post(api: APIClient, body: Any, path: str = "/workflows") -> Any:
    return api.post(path, body, format="json")


def diamond(**extra: Any) -> dict[str, Any]:
    """top, then left and right side by side, then bottom (listed before its dependencies:
    the order of the body is free)."""
    return {
        "name": "diamond",
        "jobs": [
            {
                "name": "bottom",
                "task": STEP,
                "payload": {"value": 4},
                "depends_on": ["left", "right"],
            },
            {"name": "top", "task": STEP, "payload": {"value": 1}},
            {"name": "left", "task": STEP, "payload": {"value": 2}, "depends_on": ["top"]},
            {"name": "right", "task": STEP, "payload": {"value": 3}, "depends_on": ["top"]},
        ],
        **extra,
    }


def rows() -> tuple[int, int, int]:
    """Jobs, workflows and dependencies: what a refused request must not have added to."""
    return Job.objects.count(), WorkflowRow.objects.count(), JobDependency.objects.count()


def by_step(workflow: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {job["step"]: job for job in workflow["jobs"]}


def refused(response: Any, field: str, status: int = 400, code: str | None = None) -> str:
    """A refusal naming ``field``; returns its reason."""
    body = assert_error(response, status, code=code, field=field)
    return body["fields"][field]


def an_acme_job(admin: APIClient, **body: Any) -> int:
    response = admin.post("/jobs", {"task": STEP, "tenant": "acme", **body}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


# -- POST /workflows ----------------------------------------------------------------------


class TestCreate:
    def test_201_with_the_workflow_its_jobs_waiting_then_the_first_queued(
        self, acme, django_capture_on_commit_callbacks
    ):
        with django_capture_on_commit_callbacks(execute=True):
            response = post(acme, diamond())
        assert response.status_code == 201, response.content
        data = response.json()
        assert WORKFLOW_FIELDS | {"jobs"} == set(data)
        assert (data["tenant"], data["name"], data["status"]) == ("acme", "diamond", "running")
        assert data["edges_truncated"] is False
        jobs = by_step(data)
        assert set(jobs) == {"top", "left", "right", "bottom"}
        assert all(set(j) == WORKFLOW_JOB_FIELDS for j in jobs.values())
        ids = {name: j["id"] for name, j in jobs.items()}
        assert ids["top"] < ids["left"] < ids["bottom"]  # dependencies first
        assert sorted(jobs["bottom"]["depends_on"]) == sorted([ids["left"], ids["right"]])
        assert jobs["left"]["depends_on"] == [ids["top"]]
        # Answered inside the request: nothing settled yet (here the test's transaction
        # holds the commit back); the first job is queued once it commits.
        assert {j["status"] for j in jobs.values()} <= {"waiting", "queued"}
        assert sum(data["counts"].values()) == 4

        shown = acme.get(f"/workflows/{data['id']}").json()
        statuses = {name: j["status"] for name, j in by_step(shown).items()}
        assert statuses == {
            "top": "queued",
            "left": "waiting",
            "right": "waiting",
            "bottom": "waiting",
        }
        assert (shown["counts"]["queued"], shown["counts"]["waiting"]) == (1, 3)
        stored = Job.objects.get(pk=ids["bottom"])
        assert (stored.tenant_id, stored.workflow_id, stored.step) == ("acme", data["id"], "bottom")
        assert stored.payload == {"value": 4}

    def test_the_workflows_defaults_each_jobs_options_and_positional_names(self, admin):
        body = {
            "tenant": "acme",
            "queue": "etl",
            "priority": 3,
            "jobs": [
                {"task": STEP},
                {
                    "task": STEP,
                    "depends_on": ["0"],
                    "queue": "other",
                    "priority": -2,
                    "max_attempts": 2,
                    "timeout_seconds": 30,
                    "delay_seconds": 60,
                    "concurrency_key": "k1",
                    "on_upstream_failure": "run",
                },
            ],
        }
        response = post(admin, body)
        assert response.status_code == 201, response.content
        ids = {j["step"]: j["id"] for j in response.json()["jobs"]}
        assert set(ids) == {"0", "1"}  # unnamed steps are named by position
        first, second = Job.objects.get(pk=ids["0"]), Job.objects.get(pk=ids["1"])
        assert (first.queue, first.priority, first.payload) == ("etl", 3, {})
        assert (second.queue, second.priority, second.max_attempts) == ("other", -2, 2)
        assert (second.timeout_seconds, second.concurrency_key) == (30, "k1")
        assert second.run_on_upstream_failure is True
        assert by_step(response.json())["1"]["on_upstream_failure"] == "run"

    def test_a_step_may_wait_for_a_job_enqueued_before(self, admin, acme):
        earlier = an_acme_job(admin)
        body = {"jobs": [{"name": "a", "task": STEP, "depends_on": [earlier]}]}
        response = post(acme, body)
        assert response.status_code == 201, response.content
        (job,) = response.json()["jobs"]
        assert job["depends_on"] == [earlier]
        assert JobDependency.objects.filter(job_id=job["id"], upstream_id=earlier).exists()

    def test_with_and_without_a_trailing_slash(self, acme):
        created = post(acme, diamond(), path="/workflows/")
        assert created.status_code == 201, created.content
        wf = created.json()["id"]
        for path in (f"/workflows/{wf}", f"/workflows/{wf}/"):
            assert acme.get(path).json()["id"] == wf
        assert [w["id"] for w in acme.get("/workflows/").json()["results"]] == [wf]
        assert acme.delete(f"/workflows/{wf}/").status_code == 200


# -- refusals -----------------------------------------------------------------------------

NESTED: Any = {"deep": None}
for _ in range(20):
    NESTED = {"deep": NESTED}

#: (body, the field named). Each is a 400 and writes nothing.
MALFORMED = [
    ({}, "jobs"),
    ({"jobs": {"a": {"task": STEP}}}, "jobs"),
    ({"jobs": []}, "jobs"),
    ({"jobs": "a,b"}, "jobs"),
    ({"jobs": [STEP]}, "jobs[0]"),
    ({"jobs": [{"task": STEP}, None]}, "jobs[1]"),
    ({"jobs": [{"payload": {}}]}, "jobs[0].task"),
    ({"jobs": [{"task": 7}]}, "jobs[0].task"),
    ({"jobs": [{"task": STEP, "retries": 3}]}, "jobs[0].retries"),
    ({"jobs": [{"task": STEP}], "steps": []}, "steps"),
    ({"jobs": [{"task": STEP}], "name": 5}, "name"),
    ({"jobs": [{"task": STEP}], "name": "x" * 201}, "name"),
    ({"jobs": [{"task": STEP}], "tenant": ["acme"]}, "tenant"),
    ({"jobs": [{"task": STEP}], "tenant": "no spaces"}, "tenant"),
    ({"jobs": [{"task": STEP}], "queue": "bad queue"}, "queue"),
    ({"jobs": [{"task": STEP}], "priority": 101}, "priority"),
    ({"jobs": [{"task": STEP}], "priority": "1"}, "priority"),
    (
        {"jobs": [{"task": STEP, "name": "a"}, {"task": STEP, "depends_on": "a"}]},
        "jobs[1].depends_on",
    ),
    ({"jobs": [{"task": STEP, "depends_on": ""}]}, "jobs[0].depends_on"),
    ({"jobs": [{"task": STEP, "depends_on": {}}]}, "jobs[0].depends_on"),
    ({"jobs": [{"task": STEP, "depends_on": [1.5]}]}, "jobs[0].depends_on"),
    ({"jobs": [{"task": STEP, "depends_on": [True]}]}, "jobs[0].depends_on"),
    ({"jobs": [{"task": STEP, "depends_on": [None]}]}, "jobs[0].depends_on"),
    ({"jobs": [{"task": STEP, "depends_on": [{"name": "a"}]}]}, "jobs[0].depends_on"),
    ({"jobs": [{"task": STEP, "depends_on": [0]}]}, "jobs[0].depends_on"),
    ({"jobs": [{"task": STEP, "depends_on": [2**63]}]}, "jobs[0].depends_on"),
    ({"jobs": [{"task": STEP, "depends_on": [2**63 - 1]}]}, "jobs[0].depends_on"),
    (
        {"jobs": [{"task": STEP, "name": "a"}, {"task": STEP, "depends_on": ["b"]}]},
        "jobs[1].depends_on",
    ),
    ({"jobs": [{"task": STEP, "name": "a", "depends_on": ["a"]}]}, "jobs[0].depends_on"),
    ({"jobs": [{"task": STEP, "name": "a"}, {"task": STEP, "name": "a"}]}, "jobs[1].name"),
    ({"jobs": [{"task": STEP, "name": "a b"}]}, "jobs[0].name"),
    ({"jobs": [{"task": STEP, "name": 3}]}, "jobs[0].name"),
    ({"jobs": [{"task": STEP, "on_upstream_failure": "maybe"}]}, "jobs[0].on_upstream_failure"),
    ({"jobs": [{"task": STEP, "payload": NESTED}]}, "jobs[0].payload"),
    ({"jobs": [{"task": STEP, "payload": "\u0000"}]}, "jobs[0].payload"),
    ({"jobs": [{"task": STEP}, {"task": STEP, "priority": 101}]}, "jobs[1].priority"),
    ({"jobs": [{"task": STEP, "queue": "bad queue"}]}, "jobs[0].queue"),
    ({"jobs": [{"task": STEP, "max_attempts": "3"}]}, "jobs[0].max_attempts"),
    ({"jobs": [{"task": STEP, "max_attempts": 0}]}, "jobs[0].max_attempts"),
    ({"jobs": [{"task": STEP, "delay_seconds": -1}]}, "jobs[0].delay_seconds"),
    ({"jobs": [{"task": STEP, "timeout_seconds": 0}]}, "jobs[0].timeout_seconds"),
    ({"jobs": [{"task": STEP, "run_at": "2030-01-01T09:00:00"}]}, "jobs[0].run_at"),
    ({"jobs": [{"task": STEP, "run_at": "soon"}]}, "jobs[0].run_at"),
    (
        {"jobs": [{"task": STEP, "run_at": "2030-01-01T09:00Z", "delay_seconds": 1}]},
        "jobs[0].run_at",
    ),
    ({"jobs": [{"task": STEP, "concurrency_key": 5}]}, "jobs[0].concurrency_key"),
    ({"jobs": [{"task": STEP, "key_max_running": 0}]}, "jobs[0].key_max_running"),
]


class TestRefused:
    @override_settings(PGQUEUE={"MAX_JSON_DEPTH": 10})
    @pytest.mark.parametrize(("body", "field"), MALFORMED)
    def test_a_malformed_body_is_a_400_naming_the_field_and_writes_nothing(
        self, admin, body, field
    ):
        refused(post(admin, body), field)
        assert rows() == (0, 0, 0)

    @pytest.mark.parametrize("body", [[], "jobs", 7, None])
    def test_a_body_that_is_no_object_is_a_400(self, admin, body):
        assert_error(post(admin, body), 400)
        assert rows() == (0, 0, 0)

    def test_an_unknown_task_is_named_by_its_place(self, admin):
        body = {"jobs": [{"task": STEP}, {"task": "test.nothing_of_that_name"}]}
        refused(post(admin, body), "jobs[1].task", code="unknown_task")
        assert rows() == (0, 0, 0)

    def test_a_cycle_is_a_400_naming_depends_on_and_the_cycle(self, admin):
        body = {
            "jobs": [
                {"name": "a", "task": STEP, "depends_on": ["c"]},
                {"name": "b", "task": STEP, "depends_on": ["a"]},
                {"name": "c", "task": STEP, "depends_on": ["b"]},
                {"name": "free", "task": STEP},
            ]
        }
        reason = refused(post(admin, body), "depends_on")
        assert reason.startswith("a cycle: "), reason
        assert set(reason.removeprefix("a cycle: ").split(" -> ")) == {"a", "b", "c"}
        assert rows() == (0, 0, 0)

    @override_settings(PGQUEUE={"MAX_WORKFLOW_JOBS": 3})
    def test_more_jobs_than_max_workflow_jobs(self, admin):
        response = post(admin, {"jobs": [{"task": STEP}] * 4})
        assert "MAX_WORKFLOW_JOBS" in refused(response, "jobs")
        assert post(admin, {"jobs": [{"task": STEP}] * 3}).status_code == 201

    @override_settings(PGQUEUE={"MAX_DEPENDENCIES": 2})
    def test_more_dependencies_than_max_dependencies(self, admin):
        earlier = an_acme_job(admin)
        jobs = [{"name": n, "task": STEP} for n in "abc"]
        body = {"tenant": "acme", "jobs": [*jobs, {"task": STEP, "depends_on": ["a", "b", "c"]}]}
        assert "MAX_DEPENDENCIES" in refused(post(admin, body), "jobs[3].depends_on")
        mixed = {"tenant": "acme", "jobs": [*jobs, {"task": STEP, "depends_on": ["a", earlier, 7]}]}
        assert "MAX_DEPENDENCIES" in refused(post(admin, mixed), "jobs[3].depends_on")
        many = {"task": STEP, "tenant": "acme", "depends_on": [earlier, earlier + 1, earlier + 2]}
        assert "MAX_DEPENDENCIES" in refused(admin.post("/jobs", many, format="json"), "depends_on")
        batch = {**many, "payloads": [{}]}
        assert "MAX_DEPENDENCIES" in refused(
            admin.post("/jobs/batch", batch, format="json"), "depends_on"
        )
        assert rows() == (1, 0, 0)

    def test_a_query_parameter_on_a_post_or_delete_is_a_400(self, admin):
        response = admin.post("/workflows?dry_run=1", diamond(), format="json")
        refused(response, "dry_run")
        wf = post(admin, diamond()).json()["id"]
        refused(admin.delete(f"/workflows/{wf}?dry_run=1"), "dry_run")
        assert set(Job.objects.values_list("status", flat=True)) == {"waiting"}


# -- tenants and scopes -------------------------------------------------------------------


class TestTenants:
    def test_a_tenant_key_writes_its_own_tenants_and_cannot_name_another(self, acme):
        response = post(acme, diamond())
        assert response.json()["tenant"] == "acme"
        assert post(acme, diamond(tenant="acme")).status_code == 201
        assert_error(post(acme, diamond(tenant="globex")), 403, code="forbidden")
        assert rows()[1] == 2

    def test_another_tenants_workflow_is_a_404_in_the_words_of_a_missing_one(self, admin, acme):
        theirs = post(admin, diamond(tenant="globex")).json()["id"]
        missing = theirs + 1000
        for wf in (theirs, missing):
            for response in (acme.get(f"/workflows/{wf}"), acme.delete(f"/workflows/{wf}")):
                body = assert_error(response, 404, code="not_found")
                assert body["detail"] == f"workflow {wf} does not exist"
        assert set(Job.objects.values_list("status", flat=True)) == {"waiting"}
        assert admin.get(f"/workflows/{theirs}").status_code == 200

    def test_a_dependency_on_another_tenants_job_is_a_400_as_for_a_missing_one(self, admin, acme):
        theirs = admin.post("/jobs", {"task": STEP, "tenant": "globex"}, format="json").json()
        missing = theirs["id"] + 1000
        before = rows()
        for job_id in (theirs["id"], missing):
            reason = f"no job {job_id} of tenant 'acme'"
            body = {"jobs": [{"task": STEP, "depends_on": [job_id]}]}
            assert refused(post(acme, body), "jobs[0].depends_on") == reason
            one = {"task": STEP, "depends_on": [job_id]}
            assert refused(acme.post("/jobs", one, format="json"), "depends_on") == reason
            batch = {**one, "payloads": [{}, {}]}
            assert refused(acme.post("/jobs/batch", batch, format="json"), "depends_on") == reason
            # An all-tenants key acting as acme is held to acme's jobs too.
            body = {"tenant": "acme", "jobs": [{"task": STEP, "depends_on": [job_id]}]}
            assert refused(post(admin, body), "jobs[0].depends_on") == reason
        assert rows() == before

    def test_the_list_shows_a_tenant_key_its_tenants_only(self, admin, acme):
        mine = post(acme, diamond()).json()["id"]
        theirs = post(admin, diamond(tenant="globex")).json()["id"]
        assert [w["id"] for w in acme.get("/workflows").json()["results"]] == [mine]
        assert acme.get("/workflows", {"tenant": "globex"}).json()["results"] == []
        assert [w["id"] for w in acme.get("/workflows", {"tenant": "acme"}).json()["results"]] == [
            mine
        ]
        listed = admin.get("/workflows").json()["results"]
        assert [w["id"] for w in listed] == [theirs, mine]
        only = admin.get("/workflows", {"tenant": "globex"}).json()["results"]
        assert [(w["id"], w["tenant"]) for w in only] == [(theirs, "globex")]


def scoped(**scope: Any) -> APIClient:
    return client(keys.create_api_key(tenant="acme", **scope)[1])


class TestKeyScope:
    def test_a_task_scope_refuses_a_workflow_with_another_task(self):
        api = scoped(tasks=[STEP])
        body = {"jobs": [{"task": STEP}, {"task": "test.noop"}]}
        refused(post(api, body), "jobs[1].task", status=403, code="forbidden")
        assert rows() == (0, 0, 0)
        assert post(api, {"jobs": [{"task": STEP}]}).status_code == 201

    def test_a_queue_scope_bounds_each_jobs_effective_queue(self):
        api = scoped(queues=["q1"])
        refused(post(api, {"jobs": [{"task": STEP}]}), "jobs[0].queue", status=403)
        body = {"queue": "q1", "jobs": [{"task": STEP}, {"task": STEP, "queue": "q2"}]}
        refused(post(api, body), "jobs[1].queue", status=403)
        body = {"queue": "q2", "jobs": [{"task": STEP, "queue": "q1"}, {"task": STEP}]}
        refused(post(api, body), "jobs[1].queue", status=403)
        assert rows() == (0, 0, 0)
        assert post(api, {"queue": "q1", "jobs": [{"task": STEP}]}).status_code == 201

    def test_a_tenant_key_gets_tenant_max_priority_on_every_job(self, acme):
        refused(post(acme, {"priority": 1, "jobs": [{"task": STEP}]}), "jobs[0].priority", 403)
        body = {"jobs": [{"task": STEP}, {"task": STEP, "priority": 5}]}
        refused(post(acme, body), "jobs[1].priority", 403)
        assert rows() == (0, 0, 0)

    @override_settings(PGQUEUE={"API_TASKS": [STEP]})
    def test_api_tasks_bound_every_job(self, admin):
        body = {"jobs": [{"task": STEP}, {"task": "test.noop"}]}
        refused(post(admin, body), "jobs[1].task", 403)
        assert rows() == (0, 0, 0)

    def test_a_narrowed_key_reaches_no_workflow_or_job_outside_its_scope(self, admin):
        """A key narrowed to queue q1 cannot read or cancel, through their workflow, jobs
        of another queue, nor wait for one (a dependent would tell it how it ended).
        Protection: ``_visible_workflow`` and ``_check_dependencies`` apply
        ``Scope.sees``; without them the key read the q2 job's task and status."""
        body = {
            "tenant": "acme",
            "jobs": [{"task": STEP, "queue": "q1"}, {"task": STEP, "queue": "q2"}],
        }
        created = post(admin, body).json()
        other_queue = by_step(created)["1"]["id"]
        api = scoped(queues=["q1"])
        assert_error(api.get(f"/workflows/{created['id']}"), 404)
        assert_error(api.delete(f"/workflows/{created['id']}"), 404)
        reason = f"no job {other_queue} of tenant 'acme'"
        wait = {"queue": "q1", "jobs": [{"task": STEP, "depends_on": [other_queue]}]}
        assert refused(post(api, wait), "jobs[0].depends_on") == reason
        one = {"task": STEP, "queue": "q1", "depends_on": [other_queue]}
        assert refused(api.post("/jobs", one, format="json"), "depends_on") == reason
        assert set(Job.objects.values_list("status", flat=True)) == {"waiting"}
        assert rows()[1] == 1


# -- GET /workflows -----------------------------------------------------------------------


class TestList:
    def test_pages_newest_first_by_cursor(self, acme):
        ids = [
            post(acme, {"name": f"w{i}", "jobs": [{"task": STEP}]}).json()["id"] for i in range(5)
        ]
        page = acme.get("/workflows", {"limit": 2}).json()
        assert set(page) == {"next", "results"}
        assert [w["id"] for w in page["results"]] == ids[:-3:-1]
        first = page["results"][0]
        assert set(first) == {"id", "tenant", "name", "created_at", "live"}
        assert (first["name"], first["tenant"], first["live"]) == ("w4", "acme", True)
        seen = [w["id"] for w in page["results"]]
        while page["next"]:
            page = acme.get(page["next"]).json()
            seen += [w["id"] for w in page["results"]]
        assert seen == ids[::-1]

    def test_live_turns_false_once_every_job_has_ended(self, admin, acme):
        wf = post(acme, {"jobs": [{"task": STEP}]}).json()["id"]
        assert admin.delete(f"/workflows/{wf}").status_code == 200
        (listed,) = acme.get("/workflows").json()["results"]
        assert listed["live"] is False

    @pytest.mark.parametrize(
        ("query", "field"),
        [
            ({"limit": 0}, "limit"),
            ({"limit": 501}, "limit"),
            ({"limit": "x"}, "limit"),
            ({"cursor": "not-a-cursor"}, "cursor"),
            ({"tenant": "no spaces"}, "tenant"),
            ({"status": "done"}, "status"),
        ],
    )
    def test_bad_query_parameters_are_400s(self, acme, query, field):
        refused(acme.get("/workflows", query), field)


# -- GET /workflows/<id> and DELETE -------------------------------------------------------


class TestCancel:
    def test_delete_cancels_the_unfinished_jobs_and_asks_running_ones_to_stop(
        self, acme, django_capture_on_commit_callbacks
    ):
        with django_capture_on_commit_callbacks(execute=True):
            created = post(acme, diamond(queue="wf-cancel")).json()
        ids = {name: j["id"] for name, j in by_step(created).items()}
        (running,) = claim("w1", queues=("wf-cancel",))
        assert running.id == ids["top"]
        with django_capture_on_commit_callbacks(execute=True):
            response = acme.delete(f"/workflows/{created['id']}")
        assert response.status_code == 202, response.content
        body = response.json()
        assert body == {
            "id": created["id"],
            "cancelled": sorted([ids["left"], ids["right"], ids["bottom"]]),
            "cancelling": [ids["top"]],
        }
        shown = acme.get(f"/workflows/{created['id']}").json()
        assert {j["step"]: j["status"] for j in shown["jobs"]} == {
            "top": "running",
            "left": "cancelled",
            "right": "cancelled",
            "bottom": "cancelled",
        }
        assert Job.objects.get(pk=ids["top"]).cancel_requested_at is not None
        job = acme.get(f"/jobs/{ids['top']}").json()
        assert job["status"] == "cancelling"

    def test_delete_of_a_finished_workflow_cancels_nothing(self, acme):
        wf = post(acme, diamond()).json()["id"]
        first = acme.delete(f"/workflows/{wf}")
        assert first.status_code == 200 and len(first.json()["cancelled"]) == 4
        again = acme.delete(f"/workflows/{wf}")
        assert again.status_code == 200
        assert again.json() == {"id": wf, "cancelled": [], "cancelling": []}
        assert acme.get(f"/workflows/{wf}").json()["status"] == "cancelled"


# -- depends_on on POST /jobs, and the job's new fields ----------------------------------


class TestJobs:
    def test_a_job_waits_for_the_jobs_it_names_and_shows_them(self, acme):
        up = acme.post("/jobs", {"task": STEP}, format="json").json()
        assert (up["workflow"], up["step"]) == (None, None)
        body = {"task": STEP, "depends_on": [up["id"]], "on_upstream_failure": "run"}
        response = acme.post("/jobs", body, format="json")
        assert response.status_code == 201, response.content
        down = response.json()
        assert_job_json(down)
        assert down["status"] == "waiting"
        assert Job.objects.get(pk=down["id"]).run_on_upstream_failure is True
        detail = acme.get(f"/jobs/{down['id']}").json()
        assert (detail["depends_on"], detail["dependents"]) == ([up["id"]], [])
        assert acme.get(f"/jobs/{up['id']}").json()["dependents"] == [down["id"]]

    def test_a_batch_waits_too(self, acme):
        up = acme.post("/jobs", {"task": STEP}, format="json").json()["id"]
        body = {"task": STEP, "payloads": [{}, {}], "depends_on": [up]}
        response = acme.post("/jobs/batch", body, format="json")
        assert response.status_code == 201, response.content
        ids = response.json()["ids"]
        assert set(Job.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"waiting"}
        assert acme.get(f"/jobs/{up}").json()["dependents"] == ids

    @pytest.mark.parametrize(
        "value",
        ["1", 1, {"id": 1}, [True], ["1"], [1.0], [0], [-3], [None], [2**63], [2**70]],
    )
    @pytest.mark.parametrize("path", ["/jobs", "/jobs/batch"])
    def test_a_malformed_depends_on_is_a_400(self, acme, path, value):
        body = {"task": STEP, "depends_on": value, "payloads": [{}]}
        if path == "/jobs":
            del body["payloads"]
        refused(acme.post(path, body, format="json"), "depends_on")
        assert rows() == (0, 0, 0)

    def test_an_invalid_tenant_is_named_before_its_dependencies(self, admin):
        body = {"task": STEP, "tenant": "no spaces", "depends_on": [1]}
        refused(admin.post("/jobs", body, format="json"), "tenant")
        assert rows() == (0, 0, 0)

    @pytest.mark.parametrize("value", ["never", 1, ["run"], ""])
    def test_a_bad_on_upstream_failure_is_a_400(self, acme, value):
        body = {"task": STEP, "on_upstream_failure": value}
        refused(acme.post("/jobs", body, format="json"), "on_upstream_failure")
        assert rows() == (0, 0, 0)

    def test_a_workflows_job_shows_its_workflow_step_and_neighbours(self, acme):
        created = post(acme, diamond()).json()
        ids = {name: j["id"] for name, j in by_step(created).items()}
        top = acme.get(f"/jobs/{ids['top']}").json()
        assert (top["workflow"], top["step"]) == (created["id"], "top")
        assert top["depends_on"] == [] and sorted(top["dependents"]) == sorted(
            [ids["left"], ids["right"]]
        )
        bottom = acme.get(f"/jobs/{ids['bottom']}").json()
        assert sorted(bottom["depends_on"]) == sorted([ids["left"], ids["right"]])
        listed = acme.get("/jobs").json()["results"]
        assert {(j["id"], j["workflow"], j["step"]) for j in listed} == {
            (i, created["id"], name) for name, i in ids.items()
        }
        assert all("depends_on" not in j for j in listed)  # the detail's, not the list's

    def test_the_list_costs_the_same_queries_with_workflows(self, admin, acme):
        """GET /jobs reads a job's workflow and step from its own row: no query per job."""
        for _ in range(4):
            acme.post("/jobs", {"task": STEP}, format="json")

        def queries() -> int:
            with CaptureQueriesContext(connection) as captured:
                assert acme.get("/jobs").status_code == 200
            return len(captured)

        plain = queries()
        post(acme, diamond())
        post(acme, diamond())
        assert queries() == plain


# -- credentials --------------------------------------------------------------------------

#: Every workflow operation: (method, path, body).
OPERATIONS = [
    ("post", "/workflows", diamond(tenant="acme")),
    ("get", "/workflows", None),
    ("get", "/workflows/{id}", None),
    ("delete", "/workflows/{id}", None),
]


def call(api: APIClient, method: str, path: str, body: Any) -> Any:
    if body is None:
        return getattr(api, method)(path)
    return getattr(api, method)(path, body, format="json")


class TestCredentials:
    @pytest.mark.parametrize(("method", "path", "body"), OPERATIONS)
    def test_no_credentials_is_a_401_and_changes_nothing(self, admin, method, path, body):
        wf = post(admin, diamond(tenant="acme")).json()["id"]
        before = rows()
        response = call(APIClient(), method, path.format(id=wf), body)
        assert_error(response, 401)
        assert "Bearer" in response["WWW-Authenticate"]
        assert_error(call(client("pgq_0_not-a-key"), method, path.format(id=wf), body), 401)
        assert rows() == before
        assert set(Job.objects.values_list("status", flat=True)) == {"waiting"}

    @pytest.mark.parametrize(("method", "path", "body"), OPERATIONS)
    def test_a_staff_session_needs_the_permission(self, admin, method, path, body):
        wf = post(admin, diamond(tenant="acme")).json()["id"]
        before = rows()
        user = get_user_model().objects.create_user("staff", password="pw", is_staff=True)
        api = APIClient()
        api.force_login(user)
        assert_error(call(api, method, path.format(id=wf), body), 403)
        assert rows() == before
        boss = get_user_model().objects.create_superuser("boss", password="pw")
        api.force_login(boss)
        response = call(api, method, path.format(id=wf), body)
        assert response.status_code in (200, 201), response.content


# -- with a real worker -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_workflow_posted_over_http_runs_to_done(workers: StartWorker):
    api = client(new_key("acme"))
    response = post(api, diamond())
    assert response.status_code == 201, response.content
    wf = response.json()["id"]
    workers("--concurrency", "4", settings=FAST)

    def finished() -> dict[str, Any] | None:
        shown = api.get(f"/workflows/{wf}").json()
        return shown if shown["status"] != "running" else None

    shown = wait_for(finished, STARTUP + 30, f"workflow {wf} to end")
    assert shown["status"] == "done", shown
    assert shown["counts"]["done"] == 4
    bottom = by_step(shown)["bottom"]
    result = api.get(f"/jobs/{bottom['id']}").json()["result"]
    assert result == {"value": 4, "upstream": {"left": 2, "right": 3}}
    (listed,) = api.get("/workflows").json()["results"]
    assert (listed["id"], listed["live"]) == (wf, False)
