"""Retention and workflows (JOB_PRUNE_FINISHED): a job another one may still need is kept.

A workflow's jobs stay, however old, while any job of the workflow is unfinished (its
handler may read their results, an operator may retry one of them), and go together
once all have ended, with their dependency rows and, with the last of them, the
workflow's row. A finished job that a waiting job depends on (``depends_on``, no
workflow) stays while that job waits: its result is the dependent's to read.

Time is moved by writing finished_at into the past, never by sleeping (as in
tests/test_retention.py). Jobs run here, in this process (pgqueue.testing.run_jobs); a
step of the queue "later" is left for the test to run, or to hold, when it chooses.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

import pgqueue
from pgqueue import prune_store, services
from pgqueue.models import Job, JobDependency
from pgqueue.models import Workflow as WorkflowRow
from pgqueue.testing import run_jobs
from tests.conftest import claim, complete
from tests.test_retention import fold, left, out, prune

STEP = "test.wf_step"

pytestmark = pytest.mark.django_db(transaction=True)


def age(ids: list[int], days: float) -> None:
    """Move the finish of the jobs ``ids`` (and of their attempts) ``days`` into the past."""
    back = dt.timedelta(days=days)
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE pgqueue_job SET finished_at = finished_at - %s WHERE id = ANY(%s)",
            [back, ids],
        )
        cur.execute(
            "UPDATE pgqueue_job_attempt SET finished_at = finished_at - %s,"
            " started_at = started_at - %s WHERE job_id = ANY(%s)",
            [back, back, ids],
        )


def edges(ids: list[int]) -> set[tuple[int, int]]:
    """The dependency rows that touch any of ``ids``, as (job, upstream)."""
    rows = JobDependency.objects.filter(job_id__in=ids) | JobDependency.objects.filter(
        upstream_id__in=ids
    )
    return set(rows.values_list("job_id", "upstream_id"))


def statuses(ids: list[int]) -> dict[int, str]:
    return dict(Job.objects.filter(id__in=ids).values_list("id", "status"))


def unfinished_step(wf: pgqueue.Workflow, how: str) -> dict[str, Any]:
    """Add the step "late", left unfinished in the status ``how``; returns what
    ``finish_late`` needs."""
    if how == "scheduled":
        wf.add(STEP, name="late", queue="later", delay=3600)
    elif how == "waiting":  # for a job outside the workflow, not run yet
        blocker, _ = pgqueue.enqueue(STEP, tenant="acme", queue="later")
        wf.add(STEP, name="late", queue="later", depends_on=[blocker.id])
        return {"blocker": blocker.id}
    else:  # queued, or claimed to be running (below)
        wf.add(STEP, name="late", queue="later")
    return {}


@pytest.mark.parametrize("how", ["waiting", "scheduled", "queued", "running"])
def test_a_workflows_jobs_are_kept_while_one_is_unfinished_and_go_once_all_ended(how):
    wf = pgqueue.Workflow("report", tenant="acme")
    wf.add(STEP, {"value": 1}, name="a")
    wf.add(STEP, name="b", depends_on=["a"])
    extra = unfinished_step(wf, how)
    run = wf.enqueue()
    a, b, late = run.jobs["a"], run.jobs["b"], run.jobs["late"]
    assert run_jobs(queue="default").outcomes == {a: "done", b: "done"}
    if how == "running":
        [held] = claim("w1", queues=("later",))
        assert held.id == late
    assert statuses([late]) == {late: how}
    age([a, b], days=8)  # past the 7 days of done
    fold()

    prune()
    assert left([a, b, late]) == {a, b, late}  # "late" may still read them
    waits = {(late, extra["blocker"])} if extra else set()
    assert edges([a, b, late]) == {(b, a)} | waits
    assert WorkflowRow.objects.filter(id=run.id).exists()

    if how == "running":
        assert complete("w1", held)
    else:
        run_jobs(queue="later", include_scheduled=True)
    assert statuses([late]) == {late: "done"}
    fold()
    prune()  # all ended: a and b are old enough, late is not
    assert left([a, b, late]) == {late}
    assert edges([a, b]) == set()
    assert WorkflowRow.objects.filter(id=run.id).exists()  # it still has a job

    age([late, *extra.values()], days=8)
    fold()
    prune()
    assert left([late, *extra.values()]) == set()
    assert not WorkflowRow.objects.filter(id=run.id).exists()


def test_a_workflow_goes_with_its_last_job_whatever_each_ended_as():
    """Dead, cancelled and done jobs of one workflow go under their own statuses'
    retention; the workflow's row goes with the last of them (by the command here)."""
    wf = pgqueue.Workflow(tenant="acme")
    wf.add(STEP, {"fail": True}, name="broken")
    wf.add(STEP, name="after", depends_on=["broken"])
    wf.add(STEP, name="fine")
    run = wf.enqueue()
    j = run.jobs
    run_jobs()
    assert statuses(list(j.values())) == {
        j["broken"]: "dead",
        j["after"]: "cancelled",
        j["fine"]: "done",
    }
    age(list(j.values()), days=8)  # past done's and cancelled's 7 days, not dead's 30
    fold()

    assert out().splitlines()[:3] == [
        "removed 1 done jobs, 1 attempts",
        "removed 1 cancelled jobs, 0 attempts",
        "removed 0 dead jobs, 0 attempts",
    ]
    assert left(list(j.values())) == {j["broken"]}
    assert edges(list(j.values())) == set()  # "after" went, and its edge with it
    assert WorkflowRow.objects.filter(id=run.id).exists()

    age([j["broken"]], days=30)
    fold()
    out()
    assert left(list(j.values())) == set()
    assert not WorkflowRow.objects.filter(id=run.id).exists()


def test_a_finished_job_is_kept_while_a_job_waits_for_it():
    """``depends_on`` without a workflow: the dependency, done long ago, stays while its
    dependent waits (for another dependency here), even with no retention at all; once
    the dependent has run (with its result) it goes, with its edge."""
    done, _ = pgqueue.enqueue(STEP, {"value": "old"}, tenant="acme")
    assert run_jobs().outcomes == {done.id: "done"}
    other, _ = pgqueue.enqueue(STEP, {"value": "new"}, tenant="acme", queue="later")
    dependent, _ = pgqueue.enqueue(STEP, tenant="acme", queue="last", depends_on=[done, other])
    assert statuses([dependent.id]) == {dependent.id: "waiting"}
    age([done.id], days=8)
    fold()

    with override_settings(PGQUEUE={"RETENTION": {"done": 0}}):
        assert prune()["done"] == prune_store.Pruned(0, 0)
    assert left([done.id]) == {done.id}
    assert edges([dependent.id]) == {(dependent.id, done.id), (dependent.id, other.id)}

    run_jobs(queue="later")  # the other dependency ends: the dependent runs next
    assert run_jobs(queue="last").outcomes == {dependent.id: "done"}
    upstream = Job.objects.get(id=dependent.id).result["upstream"]
    assert upstream == {str(done.id): "old", str(other.id): "new"}
    fold()
    assert prune()["done"] == prune_store.Pruned(1, 1)  # the others ended just now
    assert left([done.id, other.id, dependent.id]) == {other.id, dependent.id}
    assert edges([dependent.id]) == {(dependent.id, other.id)}


def test_cancelling_the_waiting_dependent_lets_its_dependency_go():
    done, _ = pgqueue.enqueue(STEP, tenant="acme")
    run_jobs()
    other, _ = pgqueue.enqueue(STEP, tenant="acme", queue="later")
    dependent, _ = pgqueue.enqueue(STEP, tenant="acme", depends_on=[done, other])
    age([done.id], days=8)
    fold()
    prune()
    assert left([done.id]) == {done.id}
    assert services.cancel_jobs([dependent.id]).changed == [dependent.id]
    prune()
    assert left([done.id, dependent.id]) == {dependent.id}  # cancelled now: not old yet


def test_a_finished_job_is_kept_while_its_dependent_is_queued_not_run_yet():
    """A dependent already settled (queued) but not run yet still needs its dependency's
    result: the prune keeps the dependency while the dependent is unfinished, not only
    while it waits. Without that rule its handler reads an empty job.upstream."""
    done, _ = pgqueue.enqueue(STEP, {"value": "old"}, tenant="acme")
    run_jobs()
    dependent, _ = pgqueue.enqueue(STEP, tenant="acme", queue="last", depends_on=[done])
    assert statuses([dependent.id]) == {dependent.id: "queued"}  # settled on commit
    age([done.id], days=8)
    fold()
    with override_settings(PGQUEUE={"RETENTION": {"done": 0}}):
        prune()
    assert left([done.id]) == {done.id}
    assert run_jobs(queue="last").outcomes == {dependent.id: "done"}
    assert Job.objects.get(id=dependent.id).result["upstream"] == {str(done.id): "old"}
