"""Reading a request: its query parameters, body fields, times, cursors and pages.

The helpers the endpoints of ``pgqueue.api.views`` share, so that each view reads as what it
does: every refusal here is a 400 (or 403 for a scope) naming the field, before anything is
written.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from ..conf import pgqueue_settings, queue_db
from ..exceptions import InvalidJob, UnknownTask
from ..models import Job
from ..registry import get_task
from ..services import validate_name
from ..workflows import ON_UPSTREAM_FAILURE
from .auth import (
    Scope,
    scope_of,
)
from .errors import ApiError, bad_field
from .serializers import (
    JobListItemSerializer,
)


def _known_params(request: Request, accepted: frozenset[str]) -> None:
    """A 400 naming the first query parameter the endpoint does not read."""
    allowed = accepted | {api_settings.URL_FORMAT_OVERRIDE}
    unknown = sorted(set(request.query_params) - allowed)
    if unknown:
        listed = ", ".join(sorted(accepted)) or "none"
        raise bad_field(unknown[0], f"unknown query parameter; accepted: {listed}")


def _page(
    request: Request, params: Any, count: int, limit: int, offset: int, results: Any
) -> Response:
    """The list shape of every paginated endpoint: count, next and previous links (the
    same query with another offset), and the page's results."""

    def link(new_offset: int | None) -> str | None:
        if new_offset is None:
            return None
        query = params.copy()
        query["limit"], query["offset"] = str(limit), str(new_offset)
        return request.build_absolute_uri(f"{request.path}?{query.urlencode()}")

    return Response(
        {
            "count": count,
            "count_is_estimate": False,  # GET /jobs' may be; an offset list counts exactly
            "next": link(offset + limit if offset + limit < count else None),
            "previous": link(max(offset - limit, 0) if offset > 0 else None),
            "results": results,
        }
    )


def _body(request: Request, allowed: set[str]) -> dict[str, Any]:
    data = request.data
    if not isinstance(data, dict):
        raise ApiError(400, "invalid", "the body must be a JSON object")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise bad_field(unknown[0], f"unknown field; accepted: {', '.join(sorted(allowed))}")
    return data


def _tenant_for(request: Request, scope: Scope, given: Any) -> str | None:
    """The tenant a write acts as: a tenant key may only name its own tenant."""
    if given is None:
        return scope.tenant  # None: the default tenant
    if not isinstance(given, str):
        raise bad_field("tenant", "must be a string")
    if not scope.allows(given):
        raise ApiError(403, "forbidden", f"this API key cannot act as tenant {given!r}")
    return given


def _typed(data: dict[str, Any], field: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = data.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise bad_field(field, f"must be {what}")
    return value


def _moment(value: Any, field: str, *, naive_utc: bool = True) -> dt.datetime:
    """An ISO-8601 date and time, or a 400 naming the field.

    A filter's naive bound means UTC; ``naive_utc=False`` leaves it naive, for a value the
    service layer decides about (``run_at``: refused, as in Python).
    """
    try:
        parsed = parse_datetime(value) if isinstance(value, str) else None
    except ValueError:  # well-formed but impossible, e.g. February 30th
        parsed = None
    if parsed is None:
        raise bad_field(field, "must be an ISO-8601 date and time")
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=dt.UTC) if naive_utc else parsed  # services refuse it
    # In UTC, so that no offset reaches PostgreSQL, which refuses those beyond 15:59.
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+05:00 is before year 1 in UTC
        raise bad_field(field, "is out of range") from None


def _schedule(data: dict[str, Any]) -> dict[str, Any]:
    """``delay_seconds`` is passed on as it came: the service layer checks it (``_delay``)."""
    delay = data.get("delay_seconds")
    run_at = data.get("run_at")
    if delay is not None and run_at is not None:
        raise bad_field("run_at", "give delay_seconds or run_at, not both")
    if delay is not None:
        return {"delay": delay}
    if run_at is not None:
        return {"run_at": _moment(run_at, "run_at", naive_utc=False)}
    return {}


@contextmanager
def _delay(data: dict[str, Any]) -> Iterator[None]:
    """The service layer's errors about ``delay`` and ``timeout``, named as the API names
    them (``delay_seconds``, ``timeout_seconds``)."""
    try:
        yield
    except InvalidJob as exc:
        if exc.field in ("delay", "timeout") and f"{exc.field}_seconds" in data:
            raise bad_field(f"{exc.field}_seconds", exc.reason) from None
        raise


def _options(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "queue": _typed(data, "queue", str, "a string"),
        "priority": _typed(data, "priority", int, "an integer from -100 to 100"),
        "max_attempts": _typed(data, "max_attempts", int, "an integer from 1 to 100"),
        "timeout": _typed(data, "timeout_seconds", (int, float), "a number of seconds"),
        "key_max_running": _typed(data, "key_max_running", int, "an integer from 1 to 10000"),
        **_schedule(data),
    }


def _keys(data: dict[str, Any]) -> str | list[str | None] | None:
    """The concurrency key of every job (``concurrency_key``) or of each (a batch's
    ``concurrency_keys``, one per payload, null for none); the service layer checks each."""
    if "concurrency_key" in data and "concurrency_keys" in data:
        raise bad_field("concurrency_keys", "give concurrency_key or concurrency_keys, not both")
    if "concurrency_keys" in data:
        keys = data["concurrency_keys"]
        payloads = data.get("payloads")
        if not isinstance(keys, list) or (
            isinstance(payloads, list) and len(keys) != len(payloads)
        ):
            raise bad_field("concurrency_keys", "must be a list with one key (or null) per payload")
        return keys
    return _typed(data, "concurrency_key", str, "a string")


def _task(data: dict[str, Any]) -> str:
    task = data.get("task")
    if task is None:
        raise bad_field("task", "this field is required")
    if not isinstance(task, str):
        raise bad_field("task", "must be a string")
    return task


def _check_scope(scope: Scope, data: dict[str, Any]) -> None:
    """The key's scope and API_TASKS, checked on the job's effective task, queue and
    priority before the service layer writes anything. An unknown task or an invalid
    option is left to the service layer's 400."""
    task = _task(data)
    try:
        registered = get_task(task)
    except UnknownTask:
        return
    queue = _typed(data, "queue", str, "a string")
    priority = _typed(data, "priority", int, "an integer from -100 to 100")
    if priority is not None and not -100 <= priority <= 100:
        return  # out of range: the service layer's 400
    scope.check_enqueue(
        task,
        queue or registered.queue or pgqueue_settings.DEFAULT_QUEUE,
        priority if priority is not None else (registered.priority or 0),
    )


#: The largest id a job (or workflow) can have: a bigint. A larger number names nothing,
#: and is refused before it reaches PostgreSQL, which would refuse it as out of range.
MAX_ID = 2**63 - 1


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_ID


def _depends_on(data: dict[str, Any], field: str = "depends_on") -> list[int] | None:
    """The job ids a job waits for, checked for shape and number (MAX_DEPENDENCIES) before
    anything is read; whose jobs they are is ``_check_dependencies``'."""
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, list) or not all(_is_id(d) for d in value):
        raise bad_field(field, "must be a list of job ids")
    _dependency_bound(field, value)
    return value


def _dependency_bound(field: str, value: list[Any]) -> None:
    bound = int(pgqueue_settings.MAX_DEPENDENCIES)
    if len(value) > bound:
        raise bad_field(
            field,
            f"has {len(value)} dependencies, more than {bound} (PGQUEUE['MAX_DEPENDENCIES'])",
        )


def _on_upstream_failure(data: dict[str, Any], field: str = "on_upstream_failure") -> str:
    value = data.get(field)
    if value is None:
        return "cancel"
    if value not in ON_UPSTREAM_FAILURE:
        raise bad_field(field, "must be 'cancel' or 'run'")
    return value


def _check_dependencies(scope: Scope, tenant: str | None, named: dict[str, list[int]]) -> None:
    """Refuse (400 naming the field) job ids that name no job of ``tenant`` this key could
    read one by one (``Scope.sees``), in the service layer's words for a missing job, so
    that an id reveals nothing. The service layer checks the tenant again, under lock; this
    also holds a key narrowed to some tasks, queues or priorities to the jobs it may read
    (a dependent would otherwise tell it how they ended)."""
    ids = {i for wanted in named.values() for i in wanted}
    if not ids:
        return
    # An invalid tenant is named as such, not as a dependency it could not own.
    tenant = validate_name(pgqueue_settings.DEFAULT_TENANT if tenant is None else tenant, "tenant")
    found = {
        job.pk: job
        for job in Job.objects.using(queue_db())
        .filter(pk__in=ids)
        .only("id", "tenant", "queue", "task", "priority")
    }
    for field, wanted in named.items():
        unknown = [
            i
            for i in dict.fromkeys(wanted)
            if i not in found or found[i].tenant_id != tenant or not scope.sees(found[i])
        ]
        if unknown:
            shown = ", ".join(map(str, unknown[:10])) + (", ..." if len(unknown) > 10 else "")
            raise bad_field(field, f"no job {shown} of tenant {tenant!r}")


@contextmanager
def _field_prefix(prefix: str) -> Iterator[None]:
    """The 400s and 403s of the helpers above, their fields named inside ``prefix``: a
    workflow's ``jobs[2]`` with ``queue`` at fault is ``jobs[2].queue``."""
    try:
        yield
    except ApiError as exc:
        if not exc.fields:
            raise
        fields = {f"{prefix}.{name}": reason for name, reason in exc.fields.items()}
        first, reason = next(iter(fields.items()))
        raise ApiError(exc.status_code, exc.error_code, f"{first}: {reason}", fields) from None


def _visible_job(request: Request, job_id: int) -> Job:
    """The job, if it exists and the caller's scope may see it; else 404 (never 403, so
    ids reveal nothing about other tenants' jobs)."""
    scope = scope_of(request)
    job = Job.objects.using(queue_db()).filter(pk=job_id).first()
    if job is None or not scope.sees(job):
        raise ApiError(404, "not_found", f"job {job_id} does not exist")
    return job


def _encode_cursor(direction: str, job_id: int) -> str:
    return base64.urlsafe_b64encode(f"{direction}:{job_id}".encode()).decode().rstrip("=")


def _decode_cursor(value: str) -> tuple[bool, int]:
    """(backward, id) of a cursor of ``next`` ("n": older than id) or ``previous`` ("p")."""
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode()
        direction, _, job_id = raw.partition(":")
        if direction in ("n", "p") and job_id.isdigit() and len(job_id) <= 18:
            return direction == "p", int(job_id)
    except (ValueError, UnicodeDecodeError):
        pass
    raise bad_field("cursor", "is not a cursor of this API; copy it from a next or previous link")


def _cursor_link(request: Request, params: Any, direction: str, job_id: int) -> str:
    """The same query, from the cursor instead of any offset."""
    query = params.copy()
    query.pop("offset", None)
    query["cursor"] = _encode_cursor(direction, job_id)
    return request.build_absolute_uri(f"{request.path}?{query.urlencode()}")


def _within_budget(
    request: Request, rows: list[Job], budget: int
) -> tuple[list[dict[str, Any]], bool]:
    """The rows serialized, as many as fit ``budget`` bytes of JSON (at least one), their
    oversized payloads, results and outputs replaced by the marker; and whether any was left out."""
    results: list[dict[str, Any]] = []
    used = 0
    serializer = JobListItemSerializer()  # one instance: its fields are built once, not per job
    for job in rows:
        for field in ("payload", "result", "output"):
            size = getattr(job, f"{field}_bytes")
            if size is not None and getattr(job, f"{field}_cut"):
                url = request.build_absolute_uri(reverse("pgqueue:job", kwargs={"job_id": job.id}))
                setattr(job, field, {"truncated": True, "bytes": size, "url": url})
        data = serializer.to_representation(job)
        size = len(json.dumps(data, cls=DjangoJSONEncoder))
        if results and used + size > budget:
            return results, True
        results.append(data)
        used += size
    return results, False


def _int_param(params: Any, name: str, default: int, low: int, high: int | None) -> int:
    if name not in params:
        return default
    try:
        value = int(params[name])
    except ValueError:
        raise bad_field(name, "must be an integer") from None
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise bad_field(name, f"must be {bound}")
    return value


class SafeJSONParser(JSONParser):
    """JSON bodies; one nested too deeply for Python's parser is a 400, not a crash."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply") from None


def limit_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The limit fields a PUT body gives (``max_running``, ``rate_limit``), for
    ``pgqueue.limits``; those it leaves out are kept as they are. The service validates
    them (a 400 naming the field and why)."""
    return {k: data[k] for k in ("max_running", "rate_limit") if k in data}
