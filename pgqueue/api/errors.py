"""Every API error is JSON: ``{"error": <code>, "detail": <message>, "fields": {...}?}``."""

from __future__ import annotations

from typing import Any

from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from .. import exceptions as pgq


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
    return ApiError(400, "invalid", f"{field}: {reason}", {field: reason})


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


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, reshaped; pgqueue's own errors mapped to their status codes."""
    if isinstance(exc, pgq.PgQueueError):
        exc = from_pgqueue(exc)
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
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
    response.data = body
    return response


def not_found(request: Any, exception: Exception | None = None) -> JsonResponse:
    """handler404 for projects that serve the API at their root: JSON, not HTML."""
    return JsonResponse(
        {"error": "not_found", "detail": f"no such resource: {request.path}"},
        status=status.HTTP_404_NOT_FOUND,
    )


def server_error(request: Any) -> JsonResponse:
    """handler500: even an unexpected failure answers in JSON."""
    return JsonResponse(
        {"error": "server_error", "detail": "internal error; see the server's logs"},
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )
