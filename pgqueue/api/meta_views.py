"""The two endpoints outside the job API: the health probe (no credentials) and the
OpenAPI schema. Their errors answer in pgqueue's JSON form like every other endpoint.
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, inline_serializer
from drf_spectacular.views import SCHEMA_KWARGS, SpectacularAPIView
from rest_framework import serializers, status
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from ..conf import queue_db
from .errors import exception_handler, logger
from .schema import extend_schema
from .serializers import ErrorSerializer
from .views import KnownQueryParams


class HealthView(KnownQueryParams):
    authentication_classes: list = []
    permission_classes: list = []
    renderer_classes = [JSONRenderer]
    schema = AutoSchema()

    def get_exception_handler(self) -> Any:
        return exception_handler

    @extend_schema(
        summary="Liveness and database check (no credentials needed)",
        operation_id="health_retrieve",
        responses={
            200: inline_serializer(
                "Health", {"status": serializers.CharField(), "database": serializers.CharField()}
            ),
            503: inline_serializer(
                "Unhealthy",
                {"status": serializers.CharField(), "database": serializers.CharField()},
            ),
        },
    )
    def get(self, request: Request) -> Response:
        try:
            with connections[queue_db()].cursor() as cursor:
                cursor.execute("SELECT 1")
        except Exception as exc:  # any failure to reach the database is the answer
            # The error names the database's host and port: for the log, not the caller.
            logger.warning("health check: the database is unavailable: %s", str(exc).strip())
            return Response(
                {"status": "unavailable", "database": "unavailable"},
                status=status.HTTP_503_SERVICE_UNAVAILABLE,
            )
        return Response({"status": "ok", "database": "ok"})


class SchemaView(SpectacularAPIView):
    """The OpenAPI schema; its errors (a wrong method) answer in pgqueue's JSON form.

    Its own ``schema`` is drf-spectacular's, as every pgqueue view's is: without it the view
    takes the project's ``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]`` (DRF's own when unset),
    which drf-spectacular's generator cannot call, and /schema would answer 500.
    """

    schema = AutoSchema()

    @extend_schema(
        summary="This OpenAPI schema (YAML; JSON with ?format=json)",
        operation_id="schema_retrieve",
        parameters=[
            OpenApiParameter("format", str, enum=["json", "yaml"]),
            *SCHEMA_KWARGS.get("parameters", []),
        ],
        responses={
            200: OpenApiTypes.OBJECT,
            (404, "application/json"): ErrorSerializer,
            (406, "application/json"): ErrorSerializer,
        },
    )
    def get(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return super().get(request, *args, **kwargs)

    def get_exception_handler(self) -> Any:
        return exception_handler

    def finalize_response(self, request: Any, response: Any, *args: Any, **kwargs: Any) -> Any:
        if response.status_code >= 400 and isinstance(getattr(response, "data", None), dict):
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = "application/json"
        return super().finalize_response(request, response, *args, **kwargs)
