"""The endpoints of workflows: POST and GET /workflows, GET and DELETE /workflows/<id>.

A workflow is enqueued by ``pgqueue.Workflow`` and cancelled by
``services.cancel_workflow``, as from Python; its reads are ``pgqueue.workflow_reads``'.
Each job of a posted workflow passes the checks of POST /jobs (its fields, the key's
tasks, queues and priorities, API_TASKS) before anything is written, its errors named by
their place in the body (``jobs[2].queue``).

A key reaches a workflow of its tenant only if it could reach each of its jobs one by one
(``Scope.sees``): a key narrowed to some tasks or queues cannot read or cancel, through
their workflow, jobs it could not read or cancel alone. Any other workflow is a 404 in
the words of one that does not exist.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

from drf_spectacular.utils import OpenApiParameter
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from .. import services, tracing, workflow_reads
from ..conf import pgqueue_settings
from ..exceptions import InvalidJob, UnknownTask
from ..registry import get_task
from ..workflows import Step, Workflow
from .auth import Scope, scope_of
from .errors import ApiError, bad_field, from_pgqueue
from .params import (
    _body,
    _check_dependencies,
    _check_scope,
    _cursor_link,
    _decode_cursor,
    _dependency_bound,
    _field_prefix,
    _int_param,
    _is_id,
    _on_upstream_failure,
    _options,
    _task,
    _tenant_for,
    _typed,
)
from .schema import extend_schema
from .serializers import (
    WorkflowCancelSerializer,
    WorkflowCreate,
    WorkflowListSerializer,
    WorkflowSerializer,
    WorkflowStepRequest,
    WorkflowSummarySerializer,
)
from .views import DEFAULT_LIMIT, ERRORS, MAX_LIMIT, PgQueueView

CREATE_HELP = (
    "Jobs of one tenant enqueued together, in one transaction, some waiting for others. "
    "Each job has the fields of POST /jobs but tenant (the workflow's) and idempotency_key, "
    'and also a name (unique in the workflow; default its position, "0", "1", ...) and '
    "depends_on: names of the workflow's steps (strings) and ids of jobs of the tenant "
    "enqueued before (integers). A job waits (status waiting) until every job it depends on "
    "has ended, then runs; when one ends dead or cancelled it is cancelled too, unless its "
    "on_upstream_failure is run. The jobs without dependencies are queued once it commits. "
    "A cycle, an unknown step name, another tenant's job id, more jobs than "
    "PGQUEUE['MAX_WORKFLOW_JOBS'] or more dependencies than PGQUEUE['MAX_DEPENDENCIES'] is "
    "a 400 naming the field by its place (jobs[2].depends_on); a job outside the API key's "
    "tasks, queues or priorities a 403; nothing is written. Example: `curl -X POST "
    '$URL/workflows -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" '
    '-d \'{"name": "etl", "jobs": [{"name": "extract", "task": "extract"}, '
    '{"name": "load", "task": "load", "depends_on": ["extract"]}]}\'`'
)
LIST_HELP = (
    "The key's tenant's workflows (an all-tenants key: every tenant's, or ?tenant='s), "
    "newest first, each with whether any of its jobs is unfinished (live). Follow next "
    'until it is null. Example: `curl "$URL/workflows?limit=20" -H "Authorization: '
    'Bearer $KEY"`'
)
RETRIEVE_HELP = (
    "Its status (running, done, failed or cancelled), the count of its jobs by status, and "
    "each job, dependencies first, with the ids it depends on. Another tenant's workflow, "
    "or one with a job the API key could not read, is a 404 as a missing one is. Example: "
    '`curl $URL/workflows/7 -H "Authorization: Bearer $KEY"`'
)
CANCEL_HELP = (
    "Cancels its waiting, scheduled and queued jobs (cancelled) and asks its running ones "
    "to stop (cancelling: their workers end them, and the answer is 202). A finished "
    "workflow answers 200 with nothing cancelled. Example: `curl -X DELETE $URL/workflows/7 "
    '-H "Authorization: Bearer $KEY"`'
)

#: The core's names of a step's options, as the API names them (``jobs[2].delay``).
_API_NAMES = re.compile(r"(jobs\[\d+\])\.(delay|timeout)")


class WorkflowsView(PgQueueView):
    """A workflow is posted whole, so that its graph is checked and enqueued in one
    transaction: no client ever sees half of one, nor a job waiting for one never sent."""

    query_params = frozenset({"tenant", "limit", "cursor"})

    @extend_schema(
        summary="Enqueue a workflow: jobs that wait for others, in one transaction",
        operation_id="workflows_create",
        description=CREATE_HELP,
        request=WorkflowCreate,
        responses={201: WorkflowSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        data = _body(request, WorkflowCreate.FIELDS)
        scope = scope_of(request)
        name = data.get("name")
        if name is not None and not isinstance(name, str):
            raise bad_field("name", "must be a string")
        jobs = data.get("jobs")
        if not isinstance(jobs, list) or not jobs:
            raise bad_field("jobs", "must be a non-empty list of jobs")
        bound = int(pgqueue_settings.MAX_WORKFLOW_JOBS)
        if len(jobs) > bound:
            raise bad_field(
                "jobs", f"has {len(jobs)} jobs, more than {bound} (PGQUEUE['MAX_WORKFLOW_JOBS'])"
            )
        tenant = _tenant_for(request, scope, data.get("tenant"))
        queue = _typed(data, "queue", str, "a string")
        priority = _typed(data, "priority", int, "an integer from -100 to 100")
        # The workflow's own fields are named as such, not as its first job's.
        if tenant is not None:
            services.validate_name(tenant, "tenant")
        if queue is not None:
            services.validate_name(queue, "queue")
        if priority is not None:
            services.validate_priority(priority)
        steps = [_step(scope, i, job, queue, priority) for i, job in enumerate(jobs)]
        _check_dependencies(
            scope,
            tenant,
            {
                f"jobs[{i}].depends_on": [d for d in s.depends_on if isinstance(d, int)]
                for i, s in enumerate(steps)
            },
        )
        try:
            workflow = Workflow(name or "", tenant=tenant, queue=queue, priority=priority)
            for s in steps:
                workflow.add(s)
            with tracing.incoming(request.META):
                run = workflow.enqueue(tenant=tenant)
        except InvalidJob as exc:
            renamed = _API_NAMES.fullmatch(exc.field)
            if renamed:
                raise bad_field(f"{renamed[1]}.{renamed[2]}_seconds", exc.reason) from None
            raise
        view = workflow_reads.describe(run.id)
        assert view is not None  # committed, or in the request's own transaction
        return Response(_workflow_json(view), status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="List workflows, newest first",
        operation_id="workflows_list",
        description=LIST_HELP,
        parameters=[
            OpenApiParameter(
                "tenant", str, description="one tenant's (a tenant key: its own only)"
            ),
            OpenApiParameter(
                "limit",
                int,
                description=f"1..{MAX_LIMIT}, default {DEFAULT_LIMIT}: the page's size",
            ),
            OpenApiParameter(
                "cursor", str, description="where a page starts: copied from the next link, opaque"
            ),
        ],
        responses={200: WorkflowListSerializer, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        limit = _int_param(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        tenant = params.get("tenant")
        if tenant is not None and not services.NAME_RE.match(tenant):
            raise bad_field("tenant", "is not a valid tenant name")
        before = None
        if "cursor" in params:
            backward, before = _decode_cursor(params["cursor"])
            if backward:
                raise bad_field("cursor", "this list only goes on from a next link")
        scope = scope_of(request)
        if scope.tenant is not None:
            if tenant is not None and tenant != scope.tenant:
                return Response({"next": None, "results": []})  # none of its tenant's
            tenant = scope.tenant
        rows = workflow_reads.page(tenant=tenant, before=before, limit=limit + 1)
        older = rows[limit - 1].id if len(rows) > limit else None
        return Response(
            {
                "next": _cursor_link(request, params, "n", older) if older is not None else None,
                "results": WorkflowSummarySerializer(rows[:limit], many=True).data,
            }
        )


class WorkflowView(PgQueueView):
    """One workflow, read and cancelled as a whole: the service layer cancels its jobs in
    one transaction, and their dependents are settled once it commits."""

    @extend_schema(
        summary="A workflow with its jobs and their dependencies",
        operation_id="workflows_retrieve",
        description=RETRIEVE_HELP,
        responses={200: WorkflowSerializer, **ERRORS},
    )
    def get(self, request: Request, workflow_id: str) -> Response:
        return Response(_workflow_json(_visible_workflow(request, int(workflow_id))))

    @extend_schema(
        summary="Cancel a workflow's unfinished jobs; ask its running ones to stop (202)",
        operation_id="workflows_cancel",
        description=CANCEL_HELP,
        responses={200: WorkflowCancelSerializer, 202: WorkflowCancelSerializer, **ERRORS},
    )
    def delete(self, request: Request, workflow_id: str) -> Response:
        view = _visible_workflow(request, int(workflow_id))
        result = services.cancel_workflow(view.id, tenant=scope_of(request).tenant)
        body = {"id": view.id, "cancelled": result.changed, "cancelling": result.requested}
        return Response(
            WorkflowCancelSerializer(body).data, status=202 if result.requested else 200
        )


def _step(scope: Scope, i: int, job: Any, queue: str | None, priority: int | None) -> Step:
    """One job of the body as a step, checked as POST /jobs checks a job (its errors named
    ``jobs[i].<field>``): the graph itself is the core's to check."""
    prefix = f"jobs[{i}]"
    if not isinstance(job, dict):
        raise bad_field(prefix, "must be an object with a task")
    with _field_prefix(prefix):
        unknown = sorted(set(job) - WorkflowStepRequest.FIELDS)
        if unknown:
            accepted = ", ".join(sorted(WorkflowStepRequest.FIELDS))
            raise bad_field(unknown[0], f"unknown field; accepted: {accepted}")
        task = _task(job)
        try:
            get_task(task)
        except UnknownTask as exc:
            raise from_pgqueue(exc) from None
        name = _typed(job, "name", str, "a string")
        depends_on = job.get("depends_on")
        if depends_on is None:
            depends_on = []
        if not isinstance(depends_on, list) or not all(
            isinstance(d, str) or _is_id(d) for d in depends_on
        ):
            raise bad_field(
                "depends_on", "must list names of this workflow's steps and ids of jobs"
            )
        _dependency_bound("depends_on", depends_on)
        on_upstream_failure = _on_upstream_failure(job)
        options = {k: v for k, v in _options(job).items() if v is not None}
        concurrency_key = _typed(job, "concurrency_key", str, "a string")
        if concurrency_key is not None:
            options["concurrency_key"] = concurrency_key
        # The key's scope, on the job's effective queue and priority: its own, else the
        # workflow's, else the task's (as the core fills them in).
        effective = {
            "task": task,
            "queue": options.get("queue", queue),
            "priority": options.get("priority", priority),
        }
        _check_scope(scope, effective)
    return Step(
        task,
        job.get("payload", {}),
        name=name,
        depends_on=list(depends_on),
        on_upstream_failure=on_upstream_failure,
        options=options,
    )


def _visible_workflow(request: Request, workflow_id: int) -> workflow_reads.WorkflowView:
    """The workflow, if it exists, is of the key's tenant and the key could read each of
    its jobs; else 404 in the same words."""
    scope = scope_of(request)
    view = workflow_reads.describe(workflow_id, tenant=scope.tenant)
    if view is None or not all(
        scope.sees(
            SimpleNamespace(tenant_id=view.tenant, task=j.task, queue=j.queue, priority=j.priority)
        )
        for j in view.jobs
    ):
        raise ApiError(404, "not_found", f"workflow {workflow_id} does not exist")
    return view


def _workflow_json(view: workflow_reads.WorkflowView) -> Any:
    return WorkflowSerializer(workflow_reads.as_dict(view)).data
