"""Every API error is JSON: ``{"error": <code>, "detail": <message>, "fields": {...}?}``.

Errors echo what the caller sent (an unknown field's name, a tenant, a path). Echoed text
is made encodable (a lone surrogate becomes ``\\ud800``) and bounded, so that no input can
turn an error into a 500 or a megabyte of reflected text. An unexpected exception in a
pgqueue view is logged with its traceback on the ``pgqueue.api`` logger and answered with
a JSON 500 that says nothing about it.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from .. import exceptions as pgq

logger = logging.getLogger("pgqueue.api")

#: Most characters of a name echoed from input (a field name, a path) in an error.
ECHO_MAX_CHARS = 100
#: Most characters of any string in an error body (its detail, a field's reason).
DETAIL_MAX_CHARS = 1000


def safe_text(text: Any, limit: int = DETAIL_MAX_CHARS) -> str:
    """``text`` as a string that encodes to UTF-8 and holds at most ``limit`` characters."""
    text = str(text)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    clean = text.encode("utf-8", "backslashreplace").decode("utf-8")
    # Escaping can lengthen the text (one character becomes six): bound it again.
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


class ApiError(exceptions.APIException):
    """An error with a code, a message and optionally the fields at fault."""

    def __init__(
        self, status_code: int, code: str, detail: str, fields: dict[str, str] | None = None
    ) -> None:
        self.status_code = status_code
        self.error_code = code
        self.fields = fields
        super().__init__(detail, code)


def bad_field(field: str, reason: str) -> ApiError:
    """A 400 naming the field at fault; the name may come from the caller, so it is made
    safe to echo."""
    field = safe_text(field, ECHO_MAX_CHARS)
    return ApiError(400, "invalid", f"{field}: {reason}", {field: reason})


def too_large() -> ApiError:
    """A body over DATA_UPLOAD_MAX_MEMORY_SIZE: the same 413 as an oversize payload."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    reason = f"the request body is larger than the limit of {limit} bytes"
    return ApiError(413, pgq.PayloadTooLarge.code, f"payload: {reason}", {"payload": reason})


def from_pgqueue(exc: pgq.PgQueueError) -> ApiError:
    if isinstance(exc, pgq.PayloadTooLarge):
        return ApiError(413, exc.code, exc.detail, exc.fields)
    if isinstance(exc, pgq.InvalidJob):
        return ApiError(400, exc.code, exc.detail, exc.fields)
    if isinstance(exc, pgq.JobNotFound):
        return ApiError(404, "not_found", exc.detail)
    if isinstance(exc, pgq.InvalidTransition):
        return ApiError(409, "conflict", exc.detail)
    return ApiError(400, exc.code, exc.detail)


_CODES = {
    exceptions.ParseError: "malformed_json",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "forbidden",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.Throttled: "rate_limited",
    exceptions.NotAcceptable: "not_acceptable",
}


def _flatten(detail: Any) -> dict[str, str]:
    if isinstance(detail, dict):
        return {
            k: "; ".join(str(m) for m in (v if isinstance(v, list) else [v]))
            for k, v in detail.items()
        }
    return {}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """DRF's handler, reshaped; pgqueue's own errors mapped to their status codes, and
    anything else a logged, bare 500 (never Django's error page)."""
    if isinstance(exc, pgq.PgQueueError):
        exc = from_pgqueue(exc)
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, RequestDataTooBig):
        exc = too_large()
    elif isinstance(exc, SuspiciousOperation):
        exc = ApiError(400, "bad_request", "the request was refused as malformed")
    response = drf_exception_handler(exc, context)
    if response is None:
        return unexpected(context.get("request"), exc)
    if isinstance(exc, ApiError):
        body: dict[str, Any] = {"error": exc.error_code, "detail": str(exc.detail)}
        if exc.fields:
            body["fields"] = exc.fields
    elif isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        first = next(iter(fields.items()), ("", "invalid input"))
        body = {"error": "invalid", "detail": f"{first[0]}: {first[1]}", "fields": fields}
    else:
        code = next((c for cls, c in _CODES.items() if isinstance(exc, cls)), "error")
        body = {"error": code, "detail": str(getattr(exc, "detail", exc))}
    response.data = _clean(body)
    return response


def _clean(value: Any) -> Any:
    """Every string of an error body (keys too) encodable and bounded."""
    if isinstance(value, dict):
        return {safe_text(k, ECHO_MAX_CHARS): _clean(v) for k, v in value.items()}
    if isinstance(value, str):
        return safe_text(value)
    return value


def unexpected(request: Any, exc: BaseException) -> Response:
    """A failure no handler expected: its traceback to the log, a bare 500 to the caller."""
    where = f"{request.method} {request.path}" if request is not None else "a request"
    logger.error(
        "unexpected error answering %s", safe_text(where, ECHO_MAX_CHARS * 3), exc_info=exc
    )
    set_rollback()
    return Response(
        {"error": "server_error", "detail": "internal error; see the server's logs"},
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )


def not_found(request: Any, exception: Exception | None = None) -> JsonResponse:
    """handler404 for projects that serve the API at their root: JSON, not HTML."""
    return JsonResponse(
        {"error": "not_found", "detail": f"no such resource: {safe_text(request.path, 200)}"},
        status=status.HTTP_404_NOT_FOUND,
    )


def server_error(request: Any) -> JsonResponse:
    """handler500: even an unexpected failure answers in JSON."""
    return JsonResponse(
        {"error": "server_error", "detail": "internal error; see the server's logs"},
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )
