"""Workflows: jobs that wait for other jobs (pgqueue.workflows), with real workers.

The step task is tests/taskapp/tasks.py's test.wf_step: it returns a value and the values
its dependencies returned (job.upstream_results), fails for good when asked, or sleeps.
"""

from __future__ import annotations

import pytest
from django.db import transaction

import pgqueue
from pgqueue import services, workflow_store
from pgqueue.models import Job, JobDependency
from pgqueue.models import Workflow as WorkflowRow
from tests.workers import STARTUP, StartWorker, wait_for

#: Quick maintenance (its sweep settles what a crash left) and short backoffs.
FAST = {"MAINTENANCE_SECONDS": 0.1, "BACKOFF_BASE": 0.01, "BACKOFF_CAP": 0.01}
STEP = "test.wf_step"


def statuses(ids) -> dict[int, str]:
    return dict(Job.objects.filter(id__in=list(ids)).values_list("id", "status"))


def all_ended(ids, timeout: float = STARTUP + 30) -> dict[int, str]:
    ids = list(ids)

    def ended() -> dict[int, str] | None:
        now = statuses(ids)
        return now if all(v in {"done", "dead", "cancelled"} for v in now.values()) else None

    return wait_for(ended, timeout, f"jobs {ids[:5]}... to end")


# -- building and refusing, without a worker ----------------------------------------------


@pytest.mark.django_db
def test_a_workflow_is_enqueued_waiting_with_its_edges_in_dependency_order():
    wf = pgqueue.Workflow("etl", tenant="acme")
    report = wf.add(STEP, name="report", depends_on=["b", "a"])  # added first, runs last
    wf.add(STEP, {"value": 1}, name="a")
    wf.add(STEP, {"value": 2}, name="b", depends_on=["a"])
    run = wf.enqueue()
    assert report.name == "report"
    ids = run.jobs
    assert ids["a"] < ids["b"] < ids["report"]  # inserted dependencies first
    jobs = {j.step: j for j in Job.objects.filter(workflow_id=run.id)}
    assert {j.status for j in jobs.values()} == {"waiting"}  # not committed: not settled
    assert {j.tenant_id for j in jobs.values()} == {"acme"}
    edges = set(JobDependency.objects.values_list("job_id", "upstream_id"))
    assert edges == {
        (ids["b"], ids["a"]),
        (ids["report"], ids["a"]),
        (ids["report"], ids["b"]),
    }
    assert WorkflowRow.objects.get(id=run.id).name == "etl"


@pytest.mark.django_db
def test_a_cycle_is_refused_naming_its_steps_and_nothing_is_written():
    wf = pgqueue.Workflow(tenant="acme")
    wf.add(STEP, name="a", depends_on=["c"])
    wf.add(STEP, name="b", depends_on=["a"])
    wf.add(STEP, name="c", depends_on=["b"])
    with pytest.raises(pgqueue.InvalidJob) as refused:
        wf.enqueue()
    assert refused.value.field == "depends_on"
    assert "a cycle: " in refused.value.reason
    assert {"a", "b", "c"} <= set(refused.value.reason.replace(" -> ", " ").split()[2:])
    assert not Job.objects.exists() and not WorkflowRow.objects.exists()


@pytest.mark.django_db
def test_the_bounds_are_settings_and_name_their_field(settings):
    settings.PGQUEUE = {"MAX_WORKFLOW_JOBS": 3, "MAX_DEPENDENCIES": 2}
    wf = pgqueue.Workflow(tenant="acme")
    for i in range(4):
        wf.add(STEP, name=f"s{i}")
    with pytest.raises(pgqueue.InvalidJob) as refused:
        wf.enqueue()
    assert refused.value.field == "jobs" and "MAX_WORKFLOW_JOBS" in refused.value.reason
    wf = pgqueue.Workflow(tenant="acme")
    parts = [wf.add(STEP) for _ in range(2)]
    wf.add(STEP, depends_on=[*parts, 1])
    with pytest.raises(pgqueue.InvalidJob) as refused:
        wf.enqueue()
    assert refused.value.field == "jobs[2].depends_on"
    assert "MAX_DEPENDENCIES" in refused.value.reason
    with pytest.raises(pgqueue.InvalidJob) as refused:
        pgqueue.enqueue(STEP, tenant="acme", depends_on=[1, 2, 3])
    assert refused.value.field == "depends_on"
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_dependency_must_be_a_job_of_the_tenant():
    theirs, _ = pgqueue.enqueue(STEP, tenant="other")
    for bad in ([theirs.id], [theirs.id + 1000], ["1"], "12", [True]):
        with pytest.raises(pgqueue.InvalidJob) as refused:
            pgqueue.enqueue(STEP, tenant="acme", depends_on=bad)
        assert refused.value.field == "depends_on"
    # Another tenant's job is refused in the words of a missing one.
    with pytest.raises(pgqueue.InvalidJob, match=f"no job {theirs.id} of tenant 'acme'"):
        pgqueue.enqueue(STEP, tenant="acme", depends_on=[theirs])
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_chain_group_and_chord_build_the_graphs_they_name():
    a, b, c = (pgqueue.step(STEP, {"value": i}, name=n) for i, n in enumerate("abc"))
    run = pgqueue.chain(a, [b, c], pgqueue.step(STEP, name="end"), tenant="t").enqueue()
    edges = set(JobDependency.objects.values_list("job_id", "upstream_id"))
    j = run.jobs
    assert edges == {(j["b"], j["a"]), (j["c"], j["a"]), (j["end"], j["b"]), (j["end"], j["c"])}
    run = pgqueue.group(pgqueue.step(STEP), pgqueue.step(STEP), tenant="t").enqueue()
    assert not JobDependency.objects.filter(job_id__in=run.jobs.values()).exists()
    header = [pgqueue.step(STEP, {"value": i}) for i in range(3)]
    run = pgqueue.chord(header, pgqueue.step(STEP, name="sum"), tenant="t").enqueue()
    assert JobDependency.objects.filter(job_id=run.jobs["sum"]).count() == 3


# -- settling, with the statement and without a worker ------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_waiting_job_runs_once_every_dependency_is_done_and_not_before():
    up1, _ = pgqueue.enqueue(STEP, tenant="acme")
    up2, _ = pgqueue.enqueue(STEP, tenant="acme")
    down, _ = pgqueue.enqueue(STEP, tenant="acme", depends_on=[up1, up2.id])
    assert statuses([down.id]) == {down.id: "waiting"}
    Job.objects.filter(id=up1.id).update(status="done")
    settled = workflows_settle(upstreams=[up1.id])
    assert settled == {} and statuses([down.id])[down.id] == "waiting"
    Job.objects.filter(id=up2.id).update(status="done")
    assert workflows_settle(upstreams=[up2.id]) == {down.id: "scheduled"}
    assert statuses([down.id])[down.id] == "queued"  # promoted at once, a fresh vtime
    assert Job.objects.get(id=down.id).vtime is not None
    assert workflows_settle(ids=[down.id]) == {}  # settled once: it no longer waits


def workflows_settle(**kwargs):
    from django.db import DEFAULT_DB_ALIAS

    return workflow_store.settle_rounds(workflow_store.django_atomic(DEFAULT_DB_ALIAS), **kwargs)


@pytest.mark.django_db(transaction=True)
def test_a_failed_dependency_cancels_its_dependents_down_the_graph_unless_they_run_anyway():
    wf = pgqueue.Workflow(tenant="acme")
    wf.add(STEP, name="a")
    wf.add(STEP, name="b", depends_on=["a"])
    wf.add(STEP, name="c", depends_on=["b"])
    wf.add(STEP, name="cleanup", depends_on=["a"], on_upstream_failure="run")
    run = wf.enqueue()
    j = run.jobs
    assert statuses([j["a"]])[j["a"]] == "queued"  # settled on commit
    Job.objects.filter(id=j["a"]).update(status="dead")
    workflows_settle(upstreams=[j["a"]])
    got = statuses(j.values())
    assert got[j["b"]] == got[j["c"]] == "cancelled"
    assert got[j["cleanup"]] == "queued"
    b = Job.objects.get(id=j["b"])
    assert b.failed_upstream_id == j["a"]
    assert b.last_error == f"job {j['a']}, a dependency, ended dead"
    assert Job.objects.get(id=j["c"]).failed_upstream_id == j["b"]
    # Retrying the dead job resumes what its end cancelled.
    Job.objects.filter(id=j["a"]).update(status="dead", finished_at="2026-01-01T00:00Z")
    services.retry_jobs([j["a"]])
    got = statuses(j.values())
    assert got[j["a"]] == "queued" and got[j["b"]] == got[j["c"]] == "waiting"


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_workflow_cancels_its_unfinished_jobs():
    wf = pgqueue.Workflow(tenant="acme")
    wf.add(STEP, name="a")
    wf.add(STEP, name="b", depends_on=["a"])
    run = wf.enqueue()
    result = services.cancel_workflow(run.id)
    assert sorted(result.changed) == sorted(run.jobs.values())
    assert set(statuses(run.jobs.values()).values()) == {"cancelled"}
    with pytest.raises(pgqueue.JobNotFound):
        services.cancel_workflow(run.id, tenant="someone-else")


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_workflow_leaves_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        pgqueue.chain(pgqueue.step(STEP), pgqueue.step(STEP), tenant="t").enqueue()
        raise RuntimeError
    assert not Job.objects.exists() and not WorkflowRow.objects.exists()
    assert not JobDependency.objects.exists()


# -- with real workers --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_diamond_runs_in_order_and_passes_results(workers: StartWorker):
    wf = pgqueue.Workflow("diamond", tenant="acme")
    wf.add(STEP, {"value": 1}, name="top")
    wf.add(STEP, {"value": 2}, name="left", depends_on=["top"])
    wf.add(STEP, {"value": 3}, name="right", depends_on=["top"])
    wf.add(STEP, {"value": 4}, name="bottom", depends_on=["left", "right"])
    run = wf.enqueue()
    workers("--concurrency", "4", settings=FAST)
    assert set(all_ended(run.jobs.values()).values()) == {"done"}
    jobs = {j.step: j for j in Job.objects.filter(workflow_id=run.id)}
    assert jobs["bottom"].result == {"value": 4, "upstream": {"left": 2, "right": 3}}
    assert jobs["left"].result["upstream"] == {"top": 1}
    for step, deps in {"left": ["top"], "right": ["top"], "bottom": ["left", "right"]}.items():
        for dep in deps:  # a dependent's handler began after its dependencies' ended
            assert jobs[step].started_at >= jobs[dep].finished_at
    assert all(j.attempts == 1 for j in jobs.values())


@pytest.mark.django_db(transaction=True)
def test_a_dead_dependency_cancels_the_rest_and_the_cleanup_runs(workers: StartWorker):
    wf = pgqueue.Workflow(tenant="acme")
    wf.add(STEP, {"fail": True}, name="a")
    wf.add(STEP, name="b", depends_on=["a"])
    wf.add(STEP, name="cleanup", depends_on=["a"], on_upstream_failure="run")
    run = wf.enqueue()
    workers(settings=FAST)
    j = run.jobs
    got = all_ended(j.values())
    assert got == {j["a"]: "dead", j["b"]: "cancelled", j["cleanup"]: "done"}
    assert Job.objects.get(id=j["cleanup"]).result["upstream"] == {"a": None}


@pytest.mark.django_db
def test_run_jobs_runs_a_workflow_inside_the_tests_transaction():
    from pgqueue.testing import run_jobs

    header = [pgqueue.step(STEP, {"value": i}, name=f"p{i}") for i in range(3)]
    run = pgqueue.chord(header, pgqueue.step(STEP, name="sum"), tenant="t").enqueue()
    report = run_jobs()
    assert sorted(report.outcomes.values()) == ["done"] * 4
    assert report.ids[-1] == run.jobs["sum"]  # the callback after its header
    assert Job.objects.get(id=run.jobs["sum"]).result["upstream"] == {"p0": 0, "p1": 1, "p2": 2}


@pytest.mark.django_db
def test_run_jobs_cancels_down_the_graph_after_a_failure():
    from pgqueue.testing import run_jobs

    wf = pgqueue.Workflow(tenant="t")
    wf.add(STEP, {"fail": True}, name="a")
    wf.add(STEP, name="b", depends_on=["a"])
    wf.add(STEP, name="c", depends_on=["b"])
    run = wf.enqueue()
    run_jobs()
    assert statuses(run.jobs.values()) == {
        run.jobs["a"]: "dead",
        run.jobs["b"]: "cancelled",
        run.jobs["c"]: "cancelled",
    }


@pytest.mark.django_db
def test_upstream_results_are_bounded_in_bytes(settings):
    """A fan-in whose results together pass MAX_UPSTREAM_RESULT_BYTES is refused before
    they are read into the worker: UpstreamTooLarge, a PermanentError (the job goes dead)."""
    from pgqueue.testing import run_jobs

    settings.PGQUEUE = {"MAX_UPSTREAM_RESULT_BYTES": 100}
    header = [pgqueue.step(STEP, {"value": "x" * 40}, name=f"p{i}") for i in range(3)]
    run = pgqueue.chord(header, pgqueue.step(STEP, name="sum"), tenant="t").enqueue()
    report = run_jobs()
    assert report.outcome(run.jobs["sum"]) == "dead"
    callback = Job.objects.get(id=run.jobs["sum"])
    assert "MAX_UPSTREAM_RESULT_BYTES" in callback.last_error
    assert isinstance(pgqueue.UpstreamTooLarge(1, 2, 3, 4), pgqueue.PermanentError)


@pytest.mark.django_db(transaction=True)
def test_a_retried_dependent_waits_for_its_dependencies_again():
    """Retrying a job with dependencies never runs it before them: it waits again, and is
    settled on commit (cancelled again while its dependency is still dead)."""
    wf = pgqueue.Workflow(tenant="acme")
    wf.add(STEP, name="a")
    wf.add(STEP, name="b", depends_on=["a"])
    j = wf.enqueue().jobs
    Job.objects.filter(id=j["a"]).update(status="dead")
    workflows_settle(upstreams=[j["a"]])
    assert statuses([j["b"]])[j["b"]] == "cancelled"
    services.retry_jobs([j["b"]])  # its dependency is still dead: cancelled again
    assert statuses([j["b"]])[j["b"]] == "cancelled"
    Job.objects.filter(id=j["a"]).update(status="queued", vtime=1.0)
    services.retry_jobs([j["b"]])  # its dependency is live again: b waits for it
    assert statuses([j["b"]])[j["b"]] == "waiting"
    assert Job.objects.get(id=j["b"]).failed_upstream_id is None


@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_runs_a_whole_workflow_before_it_exits(workers: StartWorker):
    """``runworker --burst`` exits once nothing is runnable; a step its own settle made
    runnable counts as runnable (without that, it exits after the first level)."""
    run = pgqueue.chain(*(pgqueue.step(STEP, name=f"s{i}") for i in range(4)), tenant="b").enqueue()
    w = workers("--burst", "--concurrency", "2", settings=FAST)
    assert w.wait_exit(STARTUP + 30) == 0
    assert set(statuses(run.jobs.values()).values()) == {"done"}


@pytest.mark.django_db(transaction=True)
def test_a_step_whose_tenant_clock_is_held_waits_scheduled_for_the_next_promotion():
    """The settle's promotion passes over a tenant's fair clock another transaction holds
    (SKIP LOCKED, as every promotion: a worker never waits on an enqueue). The step is
    left scheduled and due, not lost: the next promotion makes it runnable."""
    import psycopg

    from pgqueue import store
    from tests.workers import database_url

    up, _ = pgqueue.enqueue(STEP, tenant="held")
    down, _ = pgqueue.enqueue(STEP, tenant="held", depends_on=[up])
    Job.objects.filter(id=up.id).update(status="done")
    with psycopg.connect(database_url()) as other:  # an open enqueue holding the clock
        other.execute("SELECT 1 FROM pgqueue_fair_clock WHERE tenant = 'held' FOR UPDATE")
        assert workflows_settle(upstreams=[up.id]) == {down.id: "scheduled"}
        assert statuses([down.id])[down.id] == "scheduled"
        other.rollback()
    from django.db import connection

    with connection.cursor() as cur:
        assert down.id in store.promote_due(cur)
    assert statuses([down.id])[down.id] == "queued"
