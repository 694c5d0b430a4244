"""The admin of workflows: the list, a workflow's page with its graph, "Cancel workflow",
and what a job's page says of its workflow and dependencies.

Every page is requested through Django's test client against the real PostgreSQL. The
workflows are enqueued with ``pgqueue.Workflow`` and run with ``pgqueue.testing.run_jobs``
(the worker's claim, handler run and outcome recorder, in the test's transaction), so the
statuses on the pages are those a worker leaves.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

import pgqueue
from pgqueue.admin import workflows as admin_workflows
from pgqueue.admin.jobs import STATUS_COLOURS
from pgqueue.models import Job
from pgqueue.models import Workflow as WorkflowRow
from pgqueue.testing import run_jobs
from pgqueue.workflow_reads import WorkflowJob, describe
from tests.api_fixtures import make_job, status_of

pytestmark = pytest.mark.django_db

WORKFLOWS = "/admin/pgqueue/workflow/"
JOBS = "/admin/pgqueue/job/"
STEP = "test.wf_step"


def page_url(workflow_id: int | str) -> str:
    return f"{WORKFLOWS}{workflow_id}/change/"


def cancel_url(workflow_id: int) -> str:
    return f"{WORKFLOWS}{workflow_id}/cancel/"


def job_url(job_id: int) -> str:
    return f"{JOBS}{job_id}/change/"


def messages_of(response: Any) -> list[tuple[str, str]]:
    return [(m.level_tag, str(m)) for m in get_messages(response.wsgi_request)]


def staff_user(username: str, *perms: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def etl(name: str = "nightly-etl", tenant: str = "acme") -> pgqueue.workflows.Enqueued:
    """A diamond with a fan-in, run as far as a worker of queue wf-run takes it:

    extract -> clean, enrich (fails for good) -> merge (cancelled: enrich ended dead);
    fetch (queue wf-later, not served: stays queued) and clean -> report (waiting).
    """
    wf = pgqueue.Workflow(name, tenant=tenant)
    wf.add(STEP, {"value": 1}, name="extract", queue="wf-run")
    wf.add(STEP, name="clean", depends_on=["extract"], queue="wf-run")
    wf.add(STEP, {"fail": True}, name="enrich", depends_on=["extract"], queue="wf-run")
    wf.add(STEP, name="merge", depends_on=["clean", "enrich"], queue="wf-run")
    wf.add(STEP, name="fetch", queue="wf-later")
    wf.add(STEP, name="report", depends_on=["clean", "fetch"], queue="wf-run")
    run = wf.enqueue()
    run_jobs(queue="wf-run")
    return run


#: What ``etl`` leaves, by step.
ETL_STATUSES = {
    "extract": "done",
    "clean": "done",
    "enrich": "dead",
    "merge": "cancelled",
    "fetch": "queued",
    "report": "waiting",
}


def step_statuses(run: Any) -> dict[str, str]:
    by_id = dict(Job.objects.filter(id__in=run.jobs.values()).values_list("id", "status"))
    return {step: by_id[job_id] for step, job_id in run.jobs.items()}


def svg_of(html: str) -> str:
    found = re.search(r'<svg [^>]*id="pgq-workflow-graph".*?</svg>', html, re.S)
    assert found, "no graph on the page"
    return found.group(0)


def nodes(svg: str) -> dict[str, dict[str, str]]:
    """The graph's boxes by step: each one's link, job id and status."""
    found = {}
    for href, job, step, status in re.findall(
        r'<a href="([^"]+)" class="pgq-node" data-job="(\d+)" data-step="([^"]*)" '
        r'data-status="(\w+)">',
        svg,
    ):
        found[step] = {"href": href, "job": job, "status": status}
    return found


def edges(svg: str) -> set[tuple[int, int]]:
    return {
        (int(a), int(b))
        for a, b in re.findall(r'class="pgq-edge" data-from="(\d+)" data-to="(\d+)"', svg)
    }


def counts(html: str) -> dict[str, int]:
    return {s: int(n) for s, n in re.findall(r'<li data-status="(\w+)" data-count="(\d+)"', html)}


def buttons(html: str) -> list[str]:
    return re.findall(r'<form method="post" action="([^"]+)" class="pgq-workflow-action"', html)


# -- the list ----------------------------------------------------------------------------


class TestList:
    def test_lists_newest_first_with_tenant_name_and_whether_live(self, admin_client):
        finished = pgqueue.chain(pgqueue.step(STEP), name="done-one", tenant="beta").enqueue()
        run_jobs()
        live = etl()
        html = admin_client.get(WORKFLOWS).content.decode()
        rows = re.findall(r"<tr>.*?</tr>", html.split('id="result_list"', 1)[1], re.S)
        shown = [
            (
                int(re.search(r'field-id[^>]*><a href="[^"]*">(\d+)</a>', row).group(1)),
                re.search(r'data-live="(\w+)"', row).group(1),
            )
            for row in rows
            if "field-id" in row
        ]
        assert shown == [(live.id, "true"), (finished.id, "false")]
        assert "nightly-etl" in html and "done-one" in html
        assert f'href="{page_url(live.id)}"' in html
        assert re.search(r'class="field-tenant_name">acme<', html)

    def test_the_tenant_filter_and_the_search_by_id_or_name(self, admin_client):
        a = etl("alpha", tenant="acme")
        b = pgqueue.chain(pgqueue.step(STEP), name="beta-flow", tenant="beta").enqueue()

        def listed(query: str) -> set[int]:
            response = admin_client.get(WORKFLOWS + query)
            assert response.status_code == 200
            return {w.pk for w in response.context["cl"].result_list}

        assert listed("") == {a.id, b.id}
        assert listed("?tenant=beta") == {b.id}
        assert listed(f"?q={a.id}") == {a.id}
        assert listed("?q=beta-fl") == {b.id}
        assert listed("?q=nothing-like-it") == set()
        filters = admin_client.get(WORKFLOWS).content.decode()
        assert "?tenant=acme" in filters and "?tenant=beta" in filters
        assert "_facets" not in filters  # counts by tenant would count every workflow kept

    def test_the_page_costs_the_same_queries_for_small_and_large_workflows(self, admin_client):
        """The live flag is one read for the page (an EXISTS per row), not a count of each
        workflow's jobs: a workflow of 300 finished jobs costs what one of 1 does."""
        pgqueue.chain(pgqueue.step(STEP), name="small", tenant="acme").enqueue()
        run_jobs()
        admin_client.get(WORKFLOWS)  # the session, the content types: cached after one
        with CaptureQueriesContext(connection) as small:
            assert admin_client.get(WORKFLOWS).status_code == 200
        steps = [pgqueue.step(STEP) for _ in range(300)]
        pgqueue.group(*steps, name="large", tenant="acme").enqueue()
        run_jobs()
        with CaptureQueriesContext(connection) as large:
            assert admin_client.get(WORKFLOWS).status_code == 200
        assert len(large) == len(small)
        job_reads = [q["sql"] for q in large if "pgqueue_job" in q["sql"]]
        assert len(job_reads) == 1 and "EXISTS" in job_reads[0]

    def test_no_add_no_delete_no_edit(self, admin_client):
        run = etl()
        assert admin_client.get(f"{WORKFLOWS}add/").status_code == 403
        assert admin_client.get(f"{WORKFLOWS}{run.id}/delete/").status_code == 403
        html = admin_client.get(WORKFLOWS).content.decode()
        assert "delete_selected" not in html and f'href="{WORKFLOWS}add/"' not in html
        assert admin_client.post(page_url(run.id), {"name": "renamed"}).status_code == 405
        assert WorkflowRow.objects.get(pk=run.id).name == "nightly-etl"


# -- a workflow's page -------------------------------------------------------------------


class TestPage:
    def test_draws_every_job_linked_to_its_page_and_every_dependency(self, admin_client):
        run = etl()
        assert step_statuses(run) == ETL_STATUSES
        html = admin_client.get(page_url(run.id)).content.decode()
        svg = svg_of(html)
        drawn = nodes(svg)
        assert set(drawn) == set(run.jobs)
        for step, job_id in run.jobs.items():
            assert drawn[step]["href"] == job_url(job_id)
            assert drawn[step]["job"] == str(job_id)
            assert drawn[step]["status"] == ETL_STATUSES[step]
        j = run.jobs
        assert edges(svg) == {
            (j["extract"], j["clean"]),
            (j["extract"], j["enrich"]),
            (j["clean"], j["merge"]),
            (j["enrich"], j["merge"]),
            (j["clean"], j["report"]),
            (j["fetch"], j["report"]),
        }
        # Each box in its status's colour, with its step, task and status written in it.
        for step, status in ETL_STATUSES.items():
            box = re.search(rf'data-step="{step}".*?</a>', svg, re.S).group(0)
            assert f'fill="{STATUS_COLOURS[status]}"' in box
            assert f">{step}</text>" in box and f">{STEP}</text>" in box
            assert f">{status} · job {j[step]}</text>" in box
        assert "<script" not in html.split('id="content-main"', 1)[1]

    def test_the_workflow_status_and_the_counts_by_status_come_first(self, admin_client):
        run = etl()
        html = admin_client.get(page_url(run.id)).content.decode()
        assert re.search(r'id="pgq-workflow-status" data-status="running"', html)
        assert counts(html) == {
            "waiting": 1,
            "scheduled": 0,
            "queued": 1,
            "running": 0,
            "done": 2,
            "dead": 1,
            "cancelled": 1,
        }
        assert html.index('id="pgq-workflow-counts"') < html.index('id="pgq-workflow-graph"')
        assert "<td>acme</td>" in html and "<td>nightly-etl</td>" in html

    def test_layers_put_each_job_one_column_past_its_deepest_dependency(self):
        run = etl()
        view = describe(run.id)
        depth = admin_workflows.layers(view.jobs)
        j = run.jobs
        assert {step: depth[j[step]] for step in j} == {
            "extract": 0,
            "fetch": 0,
            "clean": 1,
            "enrich": 1,
            "merge": 2,
            "report": 2,
        }
        layout = admin_workflows.place(view.jobs)
        x = {node.job.step: node.x for node in layout.boxes.values()}
        assert x["extract"] == x["fetch"] < x["clean"] == x["enrich"] < x["merge"] == x["report"]

    def test_an_edge_that_skips_a_column_runs_between_its_boxes(self):
        """fetch (column 0) -> report (column 2) passes column 1 through a waypoint of its
        own, clear of the boxes there, instead of a straight line under them."""
        run = etl()
        layout = admin_workflows.place(describe(run.id).jobs)
        j = run.jobs
        (route,) = [r for a, b, r in layout.edges if (a, b) == (j["fetch"], j["report"])]
        assert [p.job.step if p.job else None for p in route] == ["fetch", None, "report"]
        waypoint = route[1]
        assert waypoint.layer == 1 and waypoint in layout.columns[1]
        for box in (layout.boxes[j["clean"]], layout.boxes[j["enrich"]]):
            assert box.x == waypoint.x
            top, bottom = box.y, box.y + admin_workflows.NODE_HEIGHT
            assert not top <= waypoint.y + waypoint.height / 2 <= bottom
        direct = [r for a, b, r in layout.edges if (a, b) == (j["clean"], j["report"])]
        assert [len(r) for r in direct] == [2]

    def test_a_chain_deeper_than_its_ids_say_is_laid_out_by_dependencies(self):
        """A layer is 1 + the deepest dependency's, not the position in the list: a job that
        depends on the first and the fourth job goes after the fourth."""

        def job(i: int, deps: list[int]) -> WorkflowJob:
            return WorkflowJob(i, f"s{i}", STEP, "waiting", "q", 0, 0, 1, None, None, None,
                               None, False, None, deps)  # fmt: skip

        jobs = [job(1, []), job(2, [1]), job(3, [2]), job(4, [1, 3]), job(5, []), job(6, [99])]
        assert admin_workflows.layers(jobs) == {1: 0, 2: 1, 3: 2, 4: 3, 5: 0, 6: 0}

    def test_a_workflow_past_the_drawing_bound_is_a_table_and_says_so(self, admin_client):
        size = admin_workflows.MAX_DRAWN + 1
        header = [pgqueue.step(STEP, name=f"part-{i}") for i in range(size - 1)]
        run = pgqueue.chord(header, pgqueue.step(STEP, name="sum"), tenant="acme").enqueue()
        html = admin_client.get(page_url(run.id)).content.decode()
        assert 'id="pgq-workflow-graph"' not in html
        assert f"This workflow has {size} jobs, more than the {admin_workflows.MAX_DRAWN}" in html
        assert counts(html)["waiting"] == size
        table = html.split('id="pgq-workflow-jobs"', 1)[1].split("</table>", 1)[0]
        rows = re.findall(r'<tr data-job="(\d+)">', table)
        assert [int(i) for i in rows] == sorted(run.jobs.values())
        sum_row = table.split(f'<tr data-job="{run.jobs["sum"]}">', 1)[1].split("</tr>", 1)[0]
        assert f"and {size - 1 - admin_workflows.MAX_DEPENDENCIES_LISTED} more" in sum_row
        assert f'<a href="{job_url(run.jobs["sum"])}">' in table

    def test_a_small_workflow_has_its_table_folded_under_the_graph(self, admin_client):
        run = etl()
        html = admin_client.get(page_url(run.id)).content.decode()
        folded = html.split('<details id="pgq-workflow-table">', 1)[1].split("</details>", 1)[0]
        for job_id in run.jobs.values():
            assert f'<tr data-job="{job_id}">' in folded

    def test_text_on_the_page_is_escaped(self, admin_client):
        wf = pgqueue.Workflow('<script>alert("x")</script>', tenant="acme")
        wf.add(STEP, name="only")
        run = wf.enqueue()
        html = admin_client.get(page_url(run.id)).content.decode()
        assert "<script>alert" not in html
        assert "<td>&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;</td>" in html
        assert nodes(svg_of(html))["only"]["job"] == str(run.jobs["only"])

    def test_an_unknown_workflow_goes_back_to_the_list_with_a_message(self, admin_client):
        for missing in ("999999999", "abc", "9" * 30):
            response = admin_client.get(page_url(missing), follow=True)
            assert response.redirect_chain[-1][0].endswith("/admin/")
            assert any("exist. Perhaps it was deleted?" in m for _, m in messages_of(response))


# -- "Cancel workflow" -------------------------------------------------------------------


class TestCancel:
    def test_the_button_cancels_through_the_service_and_says_so(self, admin_client):
        run = etl()
        html = admin_client.get(page_url(run.id)).content.decode()
        assert buttons(html) == [cancel_url(run.id)]
        response = admin_client.post(cancel_url(run.id))
        assert response.status_code == 302 and response["Location"] == page_url(run.id)
        page = admin_client.get(response["Location"])
        assert ("success", "Cancelled 2 job(s).") in messages_of(page)
        after = step_statuses(run)
        assert after["fetch"] == after["report"] == "cancelled"
        assert {s: after[s] for s in ("extract", "clean", "enrich", "merge")} == {
            "extract": "done",
            "clean": "done",
            "enrich": "dead",
            "merge": "cancelled",
        }
        html = page.content.decode()
        assert re.search(r'id="pgq-workflow-status" data-status="failed"', html)
        assert buttons(html) == []  # nothing left to cancel

    def test_a_running_job_is_asked_to_stop(self, admin_client):
        wf = pgqueue.Workflow("one", tenant="acme")
        wf.add(STEP, name="only", queue="wf-slow")
        run = wf.enqueue()
        run_jobs(queue="wf-none")  # runs nothing; settles the workflow's first job: queued
        from tests.conftest import claim

        (claimed,) = claim("w1", queues=("wf-slow",))
        assert claimed.id == run.jobs["only"]
        response = admin_client.post(cancel_url(run.id), follow=True)
        assert any(m.startswith("Asked 1 running job(s) to stop") for _, m in messages_of(response))
        assert Job.objects.get(pk=claimed.id).cancel_requested_at is not None

    def test_get_is_refused_and_changes_nothing(self, admin_client):
        run = etl()
        assert admin_client.get(cancel_url(run.id)).status_code == 405
        assert step_statuses(run) == ETL_STATUSES

    def test_a_post_without_the_csrf_token_is_refused(self, admin_user):
        client = Client(enforce_csrf_checks=True)
        client.force_login(admin_user)
        run = etl()
        assert client.post(cancel_url(run.id)).status_code == 403
        assert step_statuses(run) == ETL_STATUSES
        page = client.get(page_url(run.id)).content.decode()
        token = re.search(
            r'data-action="cancel">\s*<input type="hidden" name="csrfmiddlewaretoken" '
            r'value="([^"]+)"',
            page,
        ).group(1)
        assert client.post(cancel_url(run.id), {"csrfmiddlewaretoken": token}).status_code == 302
        assert step_statuses(run)["report"] == "cancelled"

    def test_it_needs_the_permission_the_job_lists_cancel_needs(self, db):
        run = etl()
        viewer = staff_user("viewer", "view_job")
        client = logged_in(viewer)
        response = client.get(page_url(run.id))
        assert response.status_code == 200  # who may view jobs may view their workflows
        assert buttons(response.content.decode()) == []
        assert client.get(WORKFLOWS).status_code == 200
        assert client.post(cancel_url(run.id)).status_code == 403
        assert step_statuses(run) == ETL_STATUSES
        viewer.user_permissions.add(Permission.objects.get(codename="change_job"))
        client = logged_in(User.objects.get(pk=viewer.pk))
        assert buttons(client.get(page_url(run.id)).content.decode()) == [cancel_url(run.id)]
        assert client.post(cancel_url(run.id)).status_code == 302
        assert step_statuses(run)["fetch"] == "cancelled"

    def test_staff_without_permissions_and_anonymous_users_get_nothing(self, db, client):
        run = etl()
        nobody = logged_in(staff_user("nobody"))
        assert nobody.get(WORKFLOWS).status_code == 403
        assert nobody.get(page_url(run.id)).status_code == 403
        assert nobody.post(cancel_url(run.id)).status_code == 403
        response = client.post(cancel_url(run.id))
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
        assert step_statuses(run) == ETL_STATUSES

    def test_an_unknown_workflow_is_reported_missing(self, admin_client):
        response = admin_client.post(cancel_url(999_999_999), follow=True)
        assert ("error", "workflow 999999999 does not exist") in messages_of(response)


# -- a job's page ------------------------------------------------------------------------


class TestJobPage:
    def test_shows_its_workflow_step_dependencies_and_dependents_as_links(self, admin_client):
        run = etl()
        j = run.jobs
        html = admin_client.get(job_url(j["clean"])).content.decode()
        assert f'<a href="{page_url(run.id)}">workflow {run.id}</a> (nightly-etl)' in html
        assert re.search(r'field-step">.*?<div class="readonly">clean</div>', html, re.S)
        deps = html.split('field-depends_on_links">', 1)[1].split("</ul>", 1)[0]
        assert re.findall(r'<a href="([^"]+)">job (\d+)</a> \((\w+)\)', deps) == [
            (job_url(j["extract"]), str(j["extract"]), "extract")
        ]
        dependents = html.split('field-dependents_links">', 1)[1].split("</ul>", 1)[0]
        assert re.findall(r'<a href="[^"]+">job (\d+)</a> \((\w+)\)', dependents) == [
            (str(j["merge"]), "merge"),
            (str(j["report"]), "report"),
        ]

    def test_a_waiting_job_says_what_it_waits_for_and_can_be_cancelled(self, admin_client):
        run = etl()
        report = run.jobs["report"]
        html = admin_client.get(job_url(report)).content.decode()
        assert "dependencies: 1 of 2 listed below not ended yet" in html
        assert f'action="{JOBS}{report}/cancel/"' in html
        response = admin_client.post(f"{JOBS}{report}/cancel/", follow=True)
        assert ("success", "Cancelled 1 job(s).") in messages_of(response)
        assert status_of(report) == "cancelled"

    def test_a_job_cancelled_by_a_failed_dependency_names_it(self, admin_client):
        run = etl()
        html = admin_client.get(job_url(run.jobs["merge"])).content.decode()
        enrich = run.jobs["enrich"]
        assert f'Cancelled because <a href="{job_url(enrich)}">job {enrich}</a> ended' in html

    def test_a_job_outside_any_workflow_has_no_workflow_section(self, admin_client):
        plain = make_job("queued")
        html = admin_client.get(job_url(plain)).content.decode()
        assert "field-workflow_link" not in html and "field-depends_on_links" not in html

    def test_a_job_enqueued_with_depends_on_shows_its_dependencies(self, admin_client):
        up, _ = pgqueue.enqueue(STEP, tenant="acme")
        down, _ = pgqueue.enqueue(STEP, tenant="acme", depends_on=[up])
        html = admin_client.get(job_url(down.id)).content.decode()
        assert f'<a href="{job_url(up.id)}">job {up.id}</a>' in html
        up_page = admin_client.get(job_url(up.id)).content.decode()
        assert f'<a href="{job_url(down.id)}">job {down.id}</a>' in up_page

    def test_the_list_filters_on_waiting_and_its_cancel_action_takes_waiting_jobs(
        self, admin_client
    ):
        run = etl()
        response = admin_client.get(JOBS + "?status__exact=waiting")
        assert {j.pk for j in response.context["cl"].result_list} == {run.jobs["report"]}
        assert "?status__exact=waiting" in response.content.decode()
        data = {"action": "cancel_jobs", "_selected_action": [str(run.jobs["report"])]}
        response = admin_client.post(JOBS, {**data, "index": "0"}, follow=True)
        assert ("success", "Cancelled 1 job(s).") in messages_of(response)
        assert status_of(run.jobs["report"]) == "cancelled"
