"""``manage.py pgqueue workflows list|show|cancel``, and what ``show`` and ``cancel`` of a
job say of workflows.

Through ``call_command`` (stdout, stderr, exit code), each ``--json`` compared with what the
HTTP API shows of the same workflow, and a real ``manage.py`` process for the usage errors'
exit code. The workflows are run with ``pgqueue.testing.run_jobs`` (the worker's claim and
recorder, in the test's transaction).
"""

from __future__ import annotations

import re

import pytest

import pgqueue
from pgqueue import cli
from pgqueue.cli import base
from pgqueue.management.commands import pgqueue as pgqueue_command
from pgqueue.models import Job
from pgqueue.testing import run_jobs
from tests.api_fixtures import make_job, status_of
from tests.conftest import claim
from tests.test_checks import manage
from tests.test_cli import UNREACHABLE, api, pgq, pgq_json
from tests.test_layers import pgqueue_imports

pytestmark = pytest.mark.django_db

STEP = "test.wf_step"


def columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def diamond(name: str = "etl", tenant: str = "acme") -> pgqueue.workflows.Enqueued:
    """extract -> clean, enrich (fails for good) -> merge (cancelled by enrich's end); fetch
    (queue wf-later, not served: stays queued) and clean -> report (waiting for fetch)."""
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


def by_step(run: pgqueue.workflows.Enqueued) -> dict[str, str]:
    return {step: status_of(job_id) for step, job_id in run.jobs.items()}


# -- the registry and the help -------------------------------------------------------------


def test_workflows_is_a_subcommand_of_pgqueue():
    assert cli.SUBCOMMANDS["workflows"] is pgqueue_command.SUBCOMMANDS["workflows"]


@pytest.mark.parametrize("action", [None, "list", "show", "cancel"])
def test_the_help_offers_json_and_states_the_exit_codes(action):
    parser = cli.SUBCOMMANDS["workflows"]().create_parser("manage.py pgqueue", "workflows")
    if action is not None:
        parser = parser._subparsers._group_actions[0].choices[action]
    text = " ".join(parser.format_help().split())
    assert "--json" in text
    assert base.EXIT_CODES_HELP in text


def test_it_reads_through_the_read_side_and_writes_through_the_services():
    imported = pgqueue_imports("pgqueue.cli.workflows")
    assert not imported & {"pgqueue.sql", "pgqueue.store", "pgqueue.read_sql"}
    assert {"pgqueue.workflow_reads", "pgqueue.services"} <= imported


# -- list ----------------------------------------------------------------------------------


def test_list_shows_newest_first_and_whether_each_is_live():
    finished = pgqueue.chain(pgqueue.step(STEP), name="tidy", tenant="beta").enqueue()
    run_jobs(tenant="beta")
    live = diamond()
    code, out, err = pgq("workflows", "list")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert columns(lines[0]) == ["ID", "NAME", "TENANT", "CREATED (UTC)", "STATE"]
    rows = [columns(line) for line in lines[1:]]
    assert [(r[0], r[1], r[2], r[4]) for r in rows] == [
        (str(live.id), "etl", "acme", "live"),
        (str(finished.id), "tidy", "beta", "finished"),
    ]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", rows[0][3])


def test_list_json_is_get_workflows():
    pgqueue.chain(pgqueue.step(STEP), name="tidy", tenant="beta").enqueue()
    diamond()
    doc = pgq_json("workflows", "list")
    assert doc["results"] == api("/workflows")["results"]
    assert (doc["limit"], doc["more"], doc["next_before"]) == (50, False, None)
    assert pgq_json("workflows", "--json", "list") == doc  # --json before the action too


def test_list_filters_by_tenant_and_pages_with_limit_and_before():
    ids = [
        pgqueue.chain(pgqueue.step(STEP), name=f"w{i}", tenant="acme").enqueue().id
        for i in range(3)
    ]
    other = pgqueue.chain(pgqueue.step(STEP), name="x", tenant="beta").enqueue().id
    doc = pgq_json("workflows", "list", "--tenant", "acme", "--limit", "2")
    assert [w["id"] for w in doc["results"]] == [ids[2], ids[1]]
    assert (doc["more"], doc["next_before"]) == (True, ids[1])
    rest = pgq_json("workflows", "list", "--tenant", "acme", "--before", str(ids[1]))
    assert [w["id"] for w in rest["results"]] == [ids[0]] and rest["more"] is False
    code, out, _ = pgq("workflows", "list", "--limit", "1")
    assert code == 0
    assert [columns(line)[0] for line in out.splitlines()[1:-1]] == [str(other)]
    assert out.splitlines()[-1] == f"(more: --before {other} shows the next page)"


def test_list_of_no_workflows():
    assert pgq("workflows", "list") == (0, "no workflows\n", "")
    assert pgq_json("workflows", "list")["results"] == []


# -- show ----------------------------------------------------------------------------------


def test_show_lists_each_job_with_its_step_status_and_dependencies():
    run = diamond()
    code, out, err = pgq("workflows", "show", str(run.id))
    assert (code, err) == (0, "")
    assert f"id:      {run.id}" in out
    assert "status:  running" in out
    assert "jobs:    6 (1 waiting, 1 queued, 2 done, 1 dead, 1 cancelled)" in out
    lines = out.splitlines()
    header = lines.index("jobs (dependencies first; times in UTC):") + 1
    assert columns(lines[header]) == [
        "ID", "STEP", "TASK", "STATUS", "DEPENDS ON", "FINISHED", "LAST ERROR",
    ]  # fmt: skip
    rows = {columns(line)[1]: columns(line) for line in lines[header + 1 :]}
    j = run.jobs

    def after(*steps: str) -> str:  # dependencies by step name, in id order
        return ",".join(sorted(steps, key=j.__getitem__))

    assert {step: (r[0], r[3], r[4]) for step, r in rows.items()} == {
        "extract": (str(j["extract"]), "done", "-"),
        "clean": (str(j["clean"]), "done", "extract"),
        "enrich": (str(j["enrich"]), "dead", "extract"),
        "merge": (str(j["merge"]), "cancelled", after("clean", "enrich")),
        "fetch": (str(j["fetch"]), "queued", "-"),
        "report": (str(j["report"]), "waiting", after("clean", "fetch")),
    }
    # Dependencies first: in id order, each job after those it depends on.
    assert [int(columns(line)[0]) for line in lines[header + 1 :]] == sorted(j.values())
    assert "asked to fail" in rows["enrich"][-1]


def test_show_json_is_get_workflow():
    run = diamond()
    doc = pgq_json("workflows", "show", str(run.id))
    assert doc == api(f"/workflows/{run.id}")
    jobs = {j["step"]: j for j in doc["jobs"]}
    assert jobs["report"]["depends_on"] == sorted([run.jobs["clean"], run.jobs["fetch"]])
    assert jobs["report"]["status"] == "waiting" and doc["status"] == "running"


def test_show_of_a_missing_workflow_exits_1():
    assert pgq("workflows", "show", "999999999") == (
        1,
        "",
        "pgqueue workflows: workflow 999999999 does not exist\n",
    )


# -- cancel --------------------------------------------------------------------------------


def test_cancel_cancels_the_unfinished_jobs_through_the_service():
    run = diamond()
    code, out, err = pgq("workflows", "cancel", str(run.id))
    assert (code, err) == (0, "")
    fetch, report = sorted([run.jobs["fetch"], run.jobs["report"]])
    assert out == f"cancelled 2 jobs of workflow {run.id}: {fetch}, {report}\n"
    assert by_step(run) == {
        "extract": "done",
        "clean": "done",
        "enrich": "dead",
        "merge": "cancelled",
        "fetch": "cancelled",
        "report": "cancelled",
    }
    again = pgq("workflows", "cancel", str(run.id))
    assert again == (
        0,
        f"cancelled 0 jobs of workflow {run.id}: -\n"
        "(nothing was left to cancel: every job of it had ended)\n",
        "",
    )


def test_cancel_json_and_a_running_job_asked_to_stop():
    wf = pgqueue.Workflow("slow", tenant="acme")
    wf.add(STEP, name="first", queue="wf-slow")
    wf.add(STEP, name="then", depends_on=["first"], queue="wf-slow")
    run = wf.enqueue()
    run_jobs(queue="wf-none")  # runs nothing; settles "first": queued
    (claimed,) = claim("w1", queues=("wf-slow",))
    assert claimed.id == run.jobs["first"]
    doc = pgq_json("workflows", "cancel", str(run.id))
    assert doc == {
        "id": run.id,
        "cancelled": [run.jobs["then"]],
        "cancelling": [run.jobs["first"]],
        "skipped": [],
    }
    assert Job.objects.get(pk=claimed.id).cancel_requested_at is not None


def test_cancel_of_a_missing_workflow_exits_1_and_changes_nothing():
    job_id = make_job("queued")
    assert pgq("workflows", "cancel", "999999999") == (
        1,
        "",
        "pgqueue workflows: workflow 999999999 does not exist\n",
    )
    assert status_of(job_id) == "queued"


# -- jobs: show and cancel -------------------------------------------------------------------


def test_show_of_a_job_names_its_workflow_step_and_neighbours():
    run = diamond()
    clean = run.jobs["clean"]
    code, out, _ = pgq("show", str(clean))
    assert code == 0
    assert f"workflow:        {run.id}\n" in out
    assert "step:            clean\n" in out
    assert f"depends on:      {run.jobs['extract']}\n" in out
    dependents = sorted([run.jobs["merge"], run.jobs["report"]])
    assert f"dependents:      {dependents[0]}, {dependents[1]}\n" in out
    doc = pgq_json("show", str(clean))
    assert (doc["workflow"], doc["step"]) == (run.id, "clean")
    assert doc["depends_on"] == [run.jobs["extract"]]
    assert doc["dependents"] == sorted([run.jobs["merge"], run.jobs["report"]])
    assert doc == {**api(f"/jobs/{clean}"), "history_total": 1}


def test_cancel_of_a_waiting_job():
    run = diamond()
    report = run.jobs["report"]
    assert pgq("cancel", str(report)) == (0, f"cancelled 1 job: {report}\n", "")
    assert status_of(report) == "cancelled"


# -- a process -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["workflows"], "the following arguments are required: ACTION"),
        (["workflows", "show"], "the following arguments are required: id"),
        (["workflows", "show", "abc"], "argument id: 'abc' is not an integer"),
        (["workflows", "list", "--limit", "0"], "argument --limit: 0 is not from 1 to 500"),
    ],
)
def test_a_usage_error_exits_2(args, message):
    result = manage("pgqueue", *args, settings_module="tests.settings")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert message in result.stderr


def test_an_unreachable_database_exits_3_in_one_line():
    result = manage(
        "pgqueue", "workflows", "show", "1", "--json",
        settings_module="tests.worker_settings", DATABASE_URL=UNREACHABLE,
    )  # fmt: skip
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("pgqueue workflows: cannot reach the database: ")
