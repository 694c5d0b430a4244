"""drf-spectacular's ``extend_schema``, bound to drf-spectacular's AutoSchema whatever the
project's ``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]``.

``extend_schema`` on a view method subclasses the schema class it finds on the function,
else the project's default schema class, read when pgqueue's URLconf is first imported.
A project that leaves that setting unset (DRF's own AutoSchema) or points it at another
generator would get schema classes drf-spectacular cannot call, and /schema would answer
500. Every pgqueue view method is decorated through this module instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import extend_schema as _extend_schema


def extend_schema(**kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorator(method: Callable[..., Any]) -> Callable[..., Any]:
        if getattr(method, "schema", None) is None:
            method.schema = AutoSchema  # type: ignore[attr-defined]
        return _extend_schema(**kwargs)(method)

    return decorator
