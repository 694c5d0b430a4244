"""Workflows in /metrics, /stats and the dashboard: waiting jobs in the job counts by queue
and status, and ``pgqueue_workflows_live``; and that neither these nor the workflow pages
of the admin read the finished history (EXPLAIN ANALYZE on many finished workflows).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

import pgqueue
from pgqueue import reads
from pgqueue.dashboard import dashboard_data
from pgqueue.metrics import render
from pgqueue.models import Job
from pgqueue.reads import live_workflows
from pgqueue.testing import run_jobs
from tests.api_fixtures import client, new_key
from tests.test_bounded_reads import explain, large_reads

pytestmark = pytest.mark.django_db

STEP = "test.wf_step"


def series(name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one family of this process's /metrics, by their sorted labels."""
    body, _ = render()
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == name
    }


def chain_of(n: int, *, queue: str, tenant: str = "acme", name: str = "chain") -> Any:
    """``n`` steps one after the other in ``queue``: the first settles to queued when
    ``run_jobs`` looks, the others wait."""
    return pgqueue.chain(
        *[pgqueue.step(STEP, name=f"s{i}", queue=queue) for i in range(n)],
        name=name,
        tenant=tenant,
    ).enqueue()


def test_waiting_jobs_are_counted_by_queue_in_pgqueue_jobs_stats_and_the_dashboard():
    chain_of(4, queue="wf-q")
    run_jobs(queue="wf-none")  # runs nothing; settles the first step: queued
    assert reads.job_counts()["wf-q"] == {"queued": 1, "waiting": 3}
    jobs = series("pgqueue_jobs")
    assert jobs[(("queue", "wf-q"), ("status", "waiting"))] == 3
    assert jobs[(("queue", "wf-q"), ("status", "queued"))] == 1
    stats = client(new_key()).get("/stats").json()
    assert stats["queues"]["wf-q"] == {"queued": 1, "waiting": 3}
    data = dashboard_data()
    assert data["statuses"]["waiting"] == 3
    (row,) = [q for q in data["queues"] if q["queue"] == "wf-q"]
    assert row["labels"]["waiting"] == "3"


def test_waiting_jobs_leave_the_count_as_they_settle():
    run = chain_of(2, queue="wf-q")
    run_jobs(queue="wf-q")
    assert set(Job.objects.filter(id__in=run.jobs.values()).values_list("status", flat=True)) == {
        "done"
    }
    assert "waiting" not in reads.job_counts()["wf-q"]
    assert (("queue", "wf-q"), ("status", "waiting")) not in series("pgqueue_jobs")


def test_live_workflows_count_those_with_an_unfinished_job():
    assert series("pgqueue_workflows_live") == {(): 0}
    chain_of(3, queue="wf-q", name="waits")  # every job waiting: live
    finished = chain_of(2, queue="wf-done", name="ends")
    run_jobs(queue="wf-done")
    assert set(
        Job.objects.filter(id__in=finished.jobs.values()).values_list("status", flat=True)
    ) == {"done"}
    cancelled = chain_of(2, queue="wf-q", name="cancelled")
    pgqueue.services.cancel_workflow(cancelled.id)
    one_left = chain_of(2, queue="wf-later", name="one-left")
    run_jobs(queue="wf-none")  # settles its first step: queued, the second waits
    pgqueue.services.cancel_jobs([one_left.jobs["s1"]])  # one unfinished job still
    pgqueue.enqueue(STEP, tenant="acme")  # a job outside any workflow: not counted
    assert live_workflows() == 2
    assert series("pgqueue_workflows_live") == {(): 2}


# -- bounded on a long history -------------------------------------------------------------

#: Finished workflows of a few jobs each, with their rows: what a year of them leaves.
FILL_WORKFLOWS = """
INSERT INTO pgqueue_workflow (id, tenant, name, created_at)
SELECT g, CASE WHEN g %% 2 = 0 THEN 'tenant-big' ELSE 'tenant-' || (g %% 40) END,
       'nightly-' || g, now() - interval '3 days'
  FROM generate_series(1, %(n)s) g
"""
FILL_JOBS = """
INSERT INTO pgqueue_job (queue, tenant, task, payload, status, priority, attempts,
                         max_attempts, run_at, created_at, started_at, finished_at,
                         workflow_id, step)
SELECT 'bulk', w.tenant, 'test.wf_step', '{}'::jsonb,
       CASE WHEN s = 3 AND w.id % 50 = 0 THEN 'dead' WHEN s = 4 AND w.id % 50 = 0
            THEN 'cancelled' ELSE 'done' END,
       0, 1, 5, w.created_at, w.created_at, w.created_at, w.created_at, w.id, 's' || s
  FROM pgqueue_workflow w, generate_series(0, 4) s
"""
SCANNED = {"pgqueue_job", "pgqueue_job_attempt", "pgqueue_workflow", "pgqueue_job_dependency"}


def scans_of(plan: dict[str, Any]) -> list[str]:
    """Sequential scans of the job and workflow tables in ``plan``."""
    found = []
    if plan.get("Node Type") == "Seq Scan" and plan.get("Relation Name") in SCANNED:
        found.append(plan["Relation Name"])
    for child in plan.get("Plans", []):
        found += scans_of(child)
    return found


@pytest.mark.slow
def test_no_workflow_read_grows_with_the_finished_history(admin_client):
    """/metrics (pgqueue_jobs with its waiting arm, pgqueue_workflows_live), /stats, the
    dashboard, the admin's workflow list (filtered, searched by name and by id), a
    workflow's page, a job's page and ``live_workflows``, EXPLAINed on 40,000 finished
    workflows of 200,000 jobs and a few live ones: none reads a job or workflow table
    sequentially, nor more than MAX_ROWS_READ rows of one through an index.

    Without the partial indexes' predicates in these reads (``status = 'waiting'`` for the
    waiting count; ``workflow_id IS NOT NULL AND status IN (live)`` for the live
    workflows; EXISTS per row of a page for the list's live flag), each would read every
    finished workflow job."""
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cur.execute(FILL_WORKFLOWS, {"n": 40_000})
        cur.execute("SELECT setval(pg_get_serial_sequence('pgqueue_workflow', 'id'), 40000)")
        cur.execute(FILL_JOBS)
    live = chain_of(3, queue="bulk", tenant="tenant-big", name="nightly-live")
    run_jobs(queue="wf-none")  # its first step queued, the others waiting
    with connection.cursor() as cur:
        for table in ("pgqueue_job", "pgqueue_workflow", "pgqueue_job_dependency"):
            cur.execute(f"ANALYZE {table}")
    try:
        api = client(new_key())
        requests = [
            (api, "/metrics"),
            (api, "/stats"),
            (admin_client, "/admin/pgqueue/dashboard/"),
            (admin_client, "/admin/pgqueue/workflow/"),
            (admin_client, "/admin/pgqueue/workflow/?tenant=tenant-big"),
            (admin_client, "/admin/pgqueue/workflow/?q=nightly-live"),
            (admin_client, "/admin/pgqueue/workflow/?q=nightly-7"),
            (admin_client, "/admin/pgqueue/workflow/?q=17"),
            (admin_client, "/admin/pgqueue/workflow/?p=40"),
            (admin_client, f"/admin/pgqueue/workflow/{live.id}/change/"),
            (admin_client, "/admin/pgqueue/workflow/17/change/"),
            (admin_client, f"/admin/pgqueue/job/{live.jobs['s1']}/change/"),
        ]
        found: dict[str, list[str]] = {}
        for who, url in requests:
            with CaptureQueriesContext(connection) as ctx:
                response = who.get(url)
            assert response.status_code == 200, (url, response.content[:300])
            settings = ""
            for q in ctx.captured_queries:
                text = q["sql"].lstrip()
                if text.upper().startswith("SET LOCAL"):
                    settings = text
                elif text.upper().startswith(("COMMIT", "ROLLBACK")):
                    settings = ""
                elif text.upper().startswith(("SELECT", "WITH", "(")):
                    bad = scans_of(explain(text, settings=settings)) + large_reads(
                        explain(text, analyze=True, settings=settings)
                    )
                    if bad:
                        found[f"{url}: {text[:160]}"] = bad
        assert not found, found
        assert live_workflows() == 1
        assert series("pgqueue_workflows_live") == {(): 1}
    finally:
        with connection.cursor() as cur:  # ANALYZE's figures outlive the test's rollback
            cur.execute(
                "TRUNCATE pgqueue_job_attempt, pgqueue_job_dependency, pgqueue_job, "
                "pgqueue_workflow"
            )
            for table in ("pgqueue_job", "pgqueue_workflow", "pgqueue_job_dependency"):
                cur.execute(f"ANALYZE {table}")
