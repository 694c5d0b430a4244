"""The endpoints of queues and of limits: GET /queues, GET|PUT /queues/<name> (a queue's
cap and rate limit), and pause / resume of queues and tenants. Writes need an all-tenants
key or a staff session (``AllTenants``); they go through ``pgqueue.limits``."""

from __future__ import annotations

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from .. import limits, reads
from .auth import AllTenants, scope_of
from .errors import ApiError, bad_field
from .params import _body, _typed, limit_fields
from .schema import extend_schema
from .serializers import QueueLimitsRequest, QueueSerializer, TenantSerializer
from .views import ERRORS, PgQueueView

QueueList = inline_serializer(
    "QueueList", {"count": serializers.IntegerField(), "results": QueueSerializer(many=True)}
)


def _queue_visible(request: Request, name: str | None = None) -> None:
    """Queues are shared by every tenant: their names and running jobs are an operator's
    read (a session, an all-tenants key), not a tenant key's, which would learn other
    tenants' queues and load. A key's queue scope still hides the queues outside it."""
    scope = scope_of(request)
    if not scope.all_tenants:
        raise ApiError(
            403,
            "forbidden",
            "queues are shared by every tenant: an all-tenants API key or a staff session "
            "may read them",
        )
    if name is not None and scope.queues and name not in scope.queues:
        raise ApiError(404, "not_found", f"queue {name!r} does not exist")


class QueuesView(PgQueueView):
    @extend_schema(
        summary="Queues (with jobs or limits) with their limits and running jobs",
        operation_id="queues_list",
        responses={200: QueueList, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        _queue_visible(request)
        rows = limits_summaries(request)
        return Response({"count": len(rows), "results": QueueSerializer(rows, many=True).data})


def limits_summaries(request: Request) -> list[dict]:
    scope = scope_of(request)
    rows = reads_queues()
    return [r for r in rows if not scope.queues or r["name"] in scope.queues]


def reads_queues(names: list[str] | None = None) -> list[dict]:
    from ..limit_reads import queue_summaries

    return queue_summaries(names)


class QueueView(PgQueueView):
    @extend_schema(
        summary="One queue's limits and running jobs",
        operation_id="queues_retrieve",
        responses={200: QueueSerializer, **ERRORS},
    )
    def get(self, request: Request, name: str) -> Response:
        _queue_visible(request, name)
        return Response(QueueSerializer(reads_queues([name])[0]).data)

    @extend_schema(
        summary="Set a queue's global cap (max_running) and rate limit; null removes one",
        operation_id="queues_update",
        request=QueueLimitsRequest,
        responses={200: QueueSerializer, **ERRORS},
    )
    def put(self, request: Request, name: str) -> Response:
        _operator(request, self)
        data = _body(request, {"max_running", "rate_limit"})
        if not data:
            raise bad_field("max_running", "give max_running, rate_limit or both")
        limits.set_queue_limits(name, **limit_fields(data))
        return Response(QueueSerializer(reads_queues([name])[0]).data)


def _operator(request: Request, view: PgQueueView) -> None:
    if not AllTenants().has_permission(request, view):
        raise ApiError(403, "forbidden", "only an all-tenants API key or staff can set limits")


class _Switch(PgQueueView):
    """POST pause / resume: no body but an optional ``queue`` (tenants only)."""

    pause = True

    def post(self, request: Request, name: str) -> Response:
        _operator(request, self)
        if self.kind == "queue":
            if request.data:
                _body(request, set())  # no body fields: a 400 naming any given
            (limits.pause_queue if self.pause else limits.resume_queue)(name)
            return Response(QueueSerializer(reads_queues([name])[0]).data)
        data = _body(request, {"queue"}) if request.data else {}
        queue = _typed(data, "queue", str, "a string")
        (limits.pause_tenant if self.pause else limits.resume_tenant)(name, queue=queue)
        return Response(TenantSerializer(reads.tenant_summaries([name])[0]).data)


def _switch(kind: str, pause: bool) -> type[_Switch]:
    verb = "pause" if pause else "resume"
    doc = f"{verb.capitalize()} a {kind}: " + (
        "workers stop starting its jobs at their next claim" if pause else "its jobs start again"
    )
    serializer = QueueSerializer if kind == "queue" else TenantSerializer

    def post(self: _Switch, request: Request, name: str) -> Response:
        return _Switch.post(self, request, name)

    post = extend_schema(
        summary=doc,
        operation_id=f"{kind}s_{verb}",
        request=None,
        responses={200: serializer, **ERRORS},
    )(post)
    view = type(
        f"{kind.capitalize()}{verb.capitalize()}View",
        (_Switch,),
        {"kind": kind, "pause": pause, "post": post},
    )
    return view


QueuePauseView = _switch("queue", True)
QueueResumeView = _switch("queue", False)
TenantPauseView = _switch("tenant", True)
TenantResumeView = _switch("tenant", False)
