"""The endpoints. Each one validates, checks the tenant scope and calls the service layer."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction
from django.http import HttpResponse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter
from rest_framework import status
from rest_framework.authentication import SessionAuthentication
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import keys, pages, reads, services, tracing
from ..conf import pgqueue_settings, queue_db
from ..limits import set_tenant_limits
from ..models import Job, Status
from ..registry import TASK_NAME_RE
from .auth import (
    AllTenants,
    ApiKeyAuthentication,
    HasAccess,
    KeyRateThrottle,
    MetricsAccess,
    scope_of,
)
from .errors import ApiError, bad_field, exception_handler
from .params import (
    SafeJSONParser,
    _body,
    _check_dependencies,
    _check_scope,
    _cursor_link,
    _decode_cursor,
    _delay,
    _depends_on,
    _int_param,
    _keys,
    _known_params,
    _moment,
    _on_upstream_failure,
    _options,
    _page,
    _task,
    _tenant_for,
    _typed,
    _visible_job,
    _within_budget,
    limit_fields,
)
from .schema import extend_schema
from .serializers import (
    BatchRequest,
    BatchResponse,
    EnqueueRequest,
    ErrorSerializer,
    JobDetailSerializer,
    JobListSerializer,
    JobSerializer,
    StatsSerializer,
    TenantListSerializer,
    TenantSerializer,
    WeightRequest,
)

ERRORS = {code: ErrorSerializer for code in (400, 401, 403, 404, 409, 413, 415, 429)}
MAX_LIMIT = 500
DEFAULT_LIMIT = 50
MAX_OFFSET = 2**62
#: GET /jobs' largest offset: skipping rows costs reading them, so deeper pages are reached
#: by the cursor of ``next``, which costs the same on the first page and the millionth.
JOBS_MAX_OFFSET = 10_000
#: The pagination parameters of every list endpoint (GET /jobs, GET /tenants).
PAGE_PARAMETERS = [
    OpenApiParameter(
        "limit", int, description=f"1..{MAX_LIMIT}, default {DEFAULT_LIMIT}: the page's size"
    ),
    OpenApiParameter("offset", int, description="0 or more, default 0: the rows to skip"),
]


class KnownQueryParams(APIView):
    """Refuses a query parameter the endpoint does not read, whatever the method.

    A GET (and HEAD) accepts those in ``query_params``; a POST, PUT, PATCH or DELETE reads
    none. Every method accepts DRF's ``format`` (the browsable API's ``?format=json``).
    Any other is a 400 naming it, as an unknown body field is, so a misspelt filter
    (``?stauts=dead``) is not silently an unfiltered list, nor ``DELETE /jobs/7?dry_run=1``
    silently a cancel. OPTIONS is not checked: it describes the endpoint, and a browser's
    preflight carries the query of the request it precedes.
    """

    #: The query parameters this view's GET reads.
    query_params: frozenset[str] = frozenset()

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authenticated and allowed first
        method = request.method.lower()
        # Only where the method is served: a GET of a POST-only path stays a 405.
        if method != "options" and hasattr(self, method):
            reads_query = method in ("get", "head")
            _known_params(request, self.query_params if reads_query else frozenset())


class PgQueueView(KnownQueryParams):
    """JSON in (anything else is 415), an API key or staff session required.

    Everything is set on the view, so the project's REST_FRAMEWORK settings (which may
    suit its own API) do not change pgqueue's behaviour.
    """

    parser_classes = [SafeJSONParser]
    renderer_classes = [JSONRenderer, BrowsableAPIRenderer]
    authentication_classes = [ApiKeyAuthentication, SessionAuthentication]
    permission_classes = [HasAccess]
    throttle_classes = [KeyRateThrottle]
    schema = AutoSchema()

    def get_exception_handler(self) -> Any:
        return exception_handler


class JobsView(PgQueueView):
    query_params = frozenset(
        {
            "status",
            "task",
            "tenant",
            "queue",
            "created_after",
            "created_before",
            "limit",
            "offset",
            "cursor",
        }
    )

    @extend_schema(
        summary="Enqueue a job",
        operation_id="jobs_create",
        request=EnqueueRequest,
        responses={201: JobSerializer, 200: JobSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        data = _body(request, EnqueueRequest.FIELDS)
        scope = scope_of(request)
        key = _typed(data, "idempotency_key", str, "a string")
        _task(data)  # a missing task is a 400 before anything else
        tenant = _tenant_for(request, scope, data.get("tenant"))
        _check_scope(scope, data)
        depends_on = _depends_on(data)
        on_upstream_failure = _on_upstream_failure(data)
        _check_dependencies(scope, tenant, {"depends_on": depends_on or []})
        with _delay(data), tracing.incoming(request.META):
            job, created = services.enqueue(
                _task(data),
                data.get("payload", {}),
                tenant=tenant,
                idempotency_key=key,
                concurrency_key=_keys(data),
                depends_on=depends_on,
                on_upstream_failure=on_upstream_failure,
                **_options(data),
            )
        if not created and not scope.sees(job):
            # The tenant's key names a job this credential may not see (another queue or
            # task): say the key is taken, show nothing of that job.
            raise ApiError(
                409,
                "conflict",
                "idempotency_key: already used by a job this API key may not see",
                {"idempotency_key": "already used by a job this API key may not see"},
            )
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED if created else 200)

    @extend_schema(
        summary="List jobs, newest first",
        operation_id="jobs_list",
        parameters=[
            OpenApiParameter("status", str, enum=Status.values),
            OpenApiParameter("task", str),
            OpenApiParameter("tenant", str),
            OpenApiParameter("queue", str),
            OpenApiParameter("created_after", dt.datetime, description="inclusive"),
            OpenApiParameter("created_before", dt.datetime, description="inclusive"),
            PAGE_PARAMETERS[0],
            OpenApiParameter(
                "cursor",
                str,
                description="where a page starts: copied from the next or previous link, opaque",
            ),
            OpenApiParameter(
                "offset",
                int,
                description=f"0..{JOBS_MAX_OFFSET}, default 0: the rows to skip (not with "
                "cursor; deeper pages are reached by next)",
            ),
        ],
        responses={200: JobListSerializer, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        jobs = Job.objects.using(queue_db()).all()
        scope = scope_of(request)
        # What the key could read job by job, and nothing else: Scope.sees as filters
        # (tests/test_api_scope.py holds the two to the same jobs).
        if scope.tenant is not None:
            jobs = jobs.filter(keys.api_tasks_q(pgqueue_settings.API_TASKS), tenant_id=scope.tenant)
        if scope.queues:
            jobs = jobs.filter(queue__in=scope.queues)
        if scope.tasks:
            jobs = jobs.filter(task__in=scope.tasks)
        if scope.max_priority < 100:
            jobs = jobs.filter(priority__lte=scope.max_priority)
        if "status" in params:
            if params["status"] not in Status.values:
                raise bad_field("status", f"must be one of {', '.join(Status.values)}")
            jobs = jobs.filter(status=params["status"])
        for name, column in (("task", "task"), ("tenant", "tenant_id"), ("queue", "queue")):
            if name in params:
                pattern = TASK_NAME_RE if name == "task" else services.NAME_RE
                if not pattern.match(params[name]):
                    raise bad_field(name, f"is not a valid {name} name")
                jobs = jobs.filter(**{column: params[name]})
        for name, lookup in (("created_after", "gte"), ("created_before", "lte")):
            if name in params:
                jobs = jobs.filter(**{f"created_at__{lookup}": _moment(params[name], name)})
        limit = _int_param(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        offset = _int_param(params, "offset", 0, 0, JOBS_MAX_OFFSET)
        if "cursor" in params and "offset" in params:
            raise bad_field("offset", "cannot be combined with cursor")
        backward, key = _decode_cursor(params["cursor"]) if "cursor" in params else (False, None)
        # The jobs in reach: one tenant's when the key or the query names one (an index of
        # its own), else every job. A page examines a window of them (pages.window_edge).
        in_reach = Job.objects.using(queue_db()).all()
        tenant = scope.tenant if scope.tenant is not None else params.get("tenant")
        if tenant is not None:
            in_reach = in_reach.filter(tenant_id=tenant)
        top = pages.window_edge(in_reach, key=None, backward=False)
        edge = top if key is None else pages.window_edge(in_reach, key=key, backward=backward)
        count, is_estimate = pages.bounded_count(jobs, top)
        rows = pages.job_list_page(
            jobs,
            key=key,
            backward=backward,
            edge=edge,
            offset=offset,
            limit=limit + 1,
            field_bytes=int(pgqueue_settings.API_FIELD_BYTES),
        )
        more = len(rows) > limit  # past the page, in the direction read
        rows = rows[-limit:] if backward else rows[:limit]
        results, cut = _within_budget(request, rows, int(pgqueue_settings.API_PAGE_BYTES))
        # Where the neighbouring pages start. A page that ends at its window's edge without
        # filling up goes on from the edge: the jobs between were examined and matched none.
        older: int | None
        newer: int | None
        if backward:
            assert key is not None
            older = results[-1]["id"] if results else key + 1  # the cursor's own page
            newer = results[0]["id"] if more else edge
        else:
            older = results[-1]["id"] if more or cut else edge
            if results:
                newer = results[0]["id"] if key is not None or offset > 0 else None
            else:
                newer = key - 1 if key is not None else None
        return Response(
            {
                "count": count,
                "count_is_estimate": is_estimate,
                "next": _cursor_link(request, params, "n", older) if older is not None else None,
                "previous": _cursor_link(request, params, "p", newer)
                if newer is not None
                else None,
                "results": results,
            }
        )


class JobBatchView(PgQueueView):
    @extend_schema(
        summary="Enqueue up to 1,000 jobs of one task in one statement (none: an empty list)",
        operation_id="jobs_batch_create",
        request=BatchRequest,
        responses={201: BatchResponse, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        data = _body(request, BatchRequest.FIELDS)
        payloads = data.get("payloads")
        if not isinstance(payloads, list):
            raise bad_field("payloads", "must be a list of payloads")
        if len(payloads) > services.MAX_BATCH:  # one request, one statement
            raise bad_field("payloads", f"must hold at most {services.MAX_BATCH:,} payloads")
        scope = scope_of(request)
        _task(data)  # a missing task is a 400 before anything else
        tenant = _tenant_for(request, scope, data.get("tenant"))
        _check_scope(scope, data)
        depends_on = _depends_on(data)
        on_upstream_failure = _on_upstream_failure(data)
        _check_dependencies(scope, tenant, {"depends_on": depends_on or []})
        with _delay(data), tracing.incoming(request.META):
            ids = services.enqueue_many(
                _task(data),
                payloads,
                tenant=tenant,
                concurrency_key=_keys(data),
                depends_on=depends_on,
                on_upstream_failure=on_upstream_failure,
                **_options(data),
            )
        return Response({"ids": ids, "count": len(ids)}, status=status.HTTP_201_CREATED)


class JobView(PgQueueView):
    @extend_schema(
        summary="A job with its attempt history, its dependencies and its dependents",
        operation_id="jobs_retrieve",
        responses={200: JobDetailSerializer, **ERRORS},
    )
    def get(self, request: Request, job_id: str) -> Response:
        # The jobs ahead are every tenant's: how busy the queue is, and how many tenants
        # are in it, are not a tenant key's to read (nor counted for one).
        context = {"position": scope_of(request).all_tenants}
        job = _visible_job(request, int(job_id))
        return Response(JobDetailSerializer(job, context=context).data)

    @extend_schema(
        summary="Cancel a scheduled or queued job; ask a running one to stop (202, cancelling)",
        operation_id="jobs_cancel",
        responses={200: JobSerializer, 202: JobSerializer, **ERRORS},
    )
    def delete(self, request: Request, job_id: str) -> Response:
        # 202 when the job was running and asked to stop (its worker ends it), even if the
        # worker was quicker than the read of the job that the body shows
        job, asked = services.cancel_or_ask(_visible_job(request, int(job_id)).id)
        return Response(JobSerializer(job).data, status=202 if asked else 200)


class JobRetryView(PgQueueView):
    @extend_schema(
        summary="Retry a dead or cancelled job (409 otherwise)",
        operation_id="jobs_retry",
        request=None,
        responses={200: JobSerializer, **ERRORS},
    )
    def post(self, request: Request, job_id: str) -> Response:
        job = _visible_job(request, int(job_id))
        # A retry runs the job again: it may only be asked for what could be enqueued.
        scope_of(request).check_enqueue(job.task, job.queue, job.priority)
        if job.status in (Status.DEAD, Status.CANCELLED):  # else a 409 below
            services.check_queue_bound(job.tenant_id, job.queue)
        return Response(JobSerializer(services.retry(job.id)).data)


class TenantsView(PgQueueView):
    query_params = frozenset({"limit", "offset"})

    @extend_schema(
        summary="Tenants with their weights and job counts, by name",
        operation_id="tenants_list",
        parameters=PAGE_PARAMETERS,
        responses={200: TenantListSerializer, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        limit = _int_param(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        offset = _int_param(params, "offset", 0, 0, MAX_OFFSET)
        scope = scope_of(request)
        names = None if scope.all_tenants else [scope.tenant]
        count, rows = reads.tenant_page(names, offset=offset, limit=limit)
        return _page(request, params, count, limit, offset, TenantSerializer(rows, many=True).data)


class TenantView(PgQueueView):
    @extend_schema(
        summary="One tenant",
        operation_id="tenants_retrieve",
        responses={200: TenantSerializer, **ERRORS},
    )
    def get(self, request: Request, name: str) -> Response:
        if not scope_of(request).allows(name):
            raise ApiError(404, "not_found", f"tenant {name!r} does not exist")
        found = reads.tenant_summaries([name])
        if not found:
            raise ApiError(404, "not_found", f"tenant {name!r} does not exist")
        return Response(TenantSerializer(found[0]).data)

    @extend_schema(
        summary="Set a tenant's weight, cap or rate limit (in every queue, or in one)",
        operation_id="tenants_update",
        request=WeightRequest,
        responses={200: TenantSerializer, **ERRORS},
    )
    def put(self, request: Request, name: str) -> Response:
        if not AllTenants().has_permission(request, self):
            raise ApiError(403, "forbidden", "only an all-tenants API key or staff can set weights")
        data = _body(request, {"weight", "queue", "max_running", "rate_limit"})
        if not {"weight", "max_running", "rate_limit"} & set(data):
            raise bad_field("weight", "give weight, max_running or rate_limit")
        queue = _typed(data, "queue", str, "a string")
        with transaction.atomic(using=queue_db()):
            if "weight" in data:
                services.set_tenant_weight(name, data["weight"], queue=queue)
            if "max_running" in data or "rate_limit" in data:
                set_tenant_limits(name, queue=queue, **limit_fields(data))
        return Response(TenantSerializer(reads.tenant_summaries([name])[0]).data)


class StatsView(PgQueueView):
    permission_classes = [MetricsAccess]

    @extend_schema(
        summary="Counts by queue and status, last minute's throughput and errors",
        operation_id="stats_retrieve",
        responses={200: StatsSerializer, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        return Response(reads.stats())


class MetricsView(PgQueueView):
    permission_classes = [MetricsAccess]

    @extend_schema(
        summary="Prometheus metrics (text exposition format)",
        operation_id="metrics_retrieve",
        responses={
            (200, "text/plain"): str,
            **{(code, "application/json"): ErrorSerializer for code in (401, 403, 429)},
        },
    )
    def get(self, request: Request) -> HttpResponse:
        from ..metrics import render

        body, content_type = render()
        return HttpResponse(body, content_type=content_type)
