"""The read side of workflows: what GET /workflows, the admin and the CLI show. Each read
is bounded by the workflow's own size (at most MAX_WORKFLOW_JOBS jobs) or by a page; the
statements are in ``pgqueue.read_sql``."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from . import read_sql
from .conf import pgqueue_settings, queue_db
from .models import FINISHED_STATUSES, LIVE_STATUSES
from .models import Workflow as WorkflowRow

#: Most dependencies (edges) one read of a workflow returns; a larger graph is shown
#: without the rest (``edges_truncated``).
MAX_EDGES_SHOWN = 50_000
#: Most dependencies and dependents a job's page lists of each.
MAX_NEIGHBOURS_SHOWN = 100


@dataclass
class WorkflowJob:
    id: int
    step: str | None
    task: str
    status: str
    queue: str
    priority: int
    attempts: int
    max_attempts: int
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    last_error: str | None
    run_on_upstream_failure: bool
    failed_upstream_id: int | None
    depends_on: list[int] = field(default_factory=list)


@dataclass
class WorkflowView:
    """A workflow as read: its row, its jobs (dependencies first) with their edges, the
    count of jobs by status, and its status."""

    id: int
    tenant: str
    name: str
    created_at: dt.datetime
    jobs: list[WorkflowJob]
    counts: dict[str, int]
    status: str
    edges_truncated: bool = False


def status_of(counts: dict[str, int]) -> str:
    """'running' while any job is unfinished; then 'done' when all are done, 'failed'
    when any ended dead, else 'cancelled'."""
    if any(counts.get(s, 0) for s in LIVE_STATUSES):
        return "running"
    if counts.get("dead", 0):
        return "failed"
    if counts.get("cancelled", 0):
        return "cancelled"
    return "done"


def describe(
    workflow_id: int, *, tenant: str | None = None, using: str | None = None
) -> WorkflowView | None:
    """The workflow ``workflow_id`` (of ``tenant``, when given), or None."""
    db = queue_db(using)
    rows = WorkflowRow.objects.using(db).filter(pk=workflow_id)
    if tenant is not None:
        rows = rows.filter(tenant_id=tenant)
    row = rows.first()
    if row is None:
        return None
    limit = int(pgqueue_settings.MAX_WORKFLOW_JOBS)
    with connections[db].cursor() as cursor:
        cursor.execute(read_sql.WORKFLOW_JOBS, {"id": row.id, "limit": limit})
        jobs = [WorkflowJob(*r) for r in cursor.fetchall()]
        cursor.execute(read_sql.WORKFLOW_EDGES, {"id": row.id, "limit": MAX_EDGES_SHOWN + 1})
        edges = cursor.fetchall()
    by_id = {j.id: j for j in jobs}
    for job_id, upstream_id in edges[:MAX_EDGES_SHOWN]:
        if job_id in by_id:
            by_id[job_id].depends_on.append(upstream_id)
    counts = {s: 0 for s in (*LIVE_STATUSES, *FINISHED_STATUSES)}
    for j in jobs:
        counts[j.status] = counts.get(j.status, 0) + 1
    return WorkflowView(
        id=row.id,
        tenant=row.tenant_id,
        name=row.name,
        created_at=row.created_at,
        jobs=jobs,
        counts=counts,
        status=status_of(counts),
        edges_truncated=len(edges) > MAX_EDGES_SHOWN,
    )


@dataclass
class WorkflowSummary:
    id: int
    tenant: str
    name: str
    created_at: dt.datetime
    live: bool


def page(
    *,
    tenant: str | None = None,
    before: int | None = None,
    limit: int = 50,
    using: str | None = None,
) -> list[WorkflowSummary]:
    """Up to ``limit`` workflows below the id ``before``, newest first (of ``tenant``)."""
    with connections[queue_db(using)].cursor() as cursor:
        cursor.execute(read_sql.WORKFLOW_PAGE, {"tenant": tenant, "before": before, "limit": limit})
        return [WorkflowSummary(*r) for r in cursor.fetchall()]


def neighbours(job_id: int, *, using: str | None = None) -> dict[str, list[int]]:
    """``{"depends_on": [...], "dependents": [...]}`` of one job, at most
    MAX_NEIGHBOURS_SHOWN of each."""
    out: dict[str, list[int]] = {"depends_on": [], "dependents": []}
    with connections[queue_db(using)].cursor() as cursor:
        cursor.execute(read_sql.JOB_DEPENDENCY_IDS, {"id": job_id, "limit": MAX_NEIGHBOURS_SHOWN})
        for side, other in cursor.fetchall():
            out["depends_on" if side == "upstream" else "dependents"].append(other)
    return out


def as_dict(view: WorkflowView) -> dict[str, Any]:
    """A workflow as JSON-ready data (the HTTP API's and the CLI's --json)."""
    return {
        "id": view.id,
        "tenant": view.tenant,
        "name": view.name,
        "created_at": view.created_at,
        "status": view.status,
        "counts": view.counts,
        "edges_truncated": view.edges_truncated,
        "jobs": [
            {
                "id": j.id,
                "step": j.step,
                "task": j.task,
                "status": j.status,
                "queue": j.queue,
                "priority": j.priority,
                "attempts": j.attempts,
                "max_attempts": j.max_attempts,
                "created_at": j.created_at,
                "started_at": j.started_at,
                "finished_at": j.finished_at,
                "last_error": j.last_error,
                "on_upstream_failure": "run" if j.run_on_upstream_failure else "cancel",
                "failed_upstream_id": j.failed_upstream_id,
                "depends_on": j.depends_on,
            }
            for j in view.jobs
        ],
    }
