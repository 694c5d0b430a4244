"""OpenAPI schema and interactive docs, served entirely by this server (no CDN).

The Swagger UI files come from the drf-spectacular-sidecar package and are served by
pgqueue itself, so they need neither a CDN nor extra INSTALLED_APPS.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path
from typing import Any

import drf_spectacular_sidecar
from django.http import FileResponse, Http404, HttpResponse, JsonResponse
from django.urls import reverse
from django.utils.html import escape

SWAGGER_DIR = (
    Path(drf_spectacular_sidecar.__file__).parent
    / "static"
    / "drf_spectacular_sidecar"
    / "swagger-ui-dist"
)
ASSETS = {
    "swagger-ui-bundle.js",
    "swagger-ui-standalone-preset.js",
    "swagger-ui.css",
    "favicon-32x32.png",
}

SCHEMA_SETTINGS = {
    "TITLE": "pgqueue API",
    "DESCRIPTION": (
        "A durable, multi-tenant, fairly scheduled job queue on PostgreSQL. Authenticate with "
        "`Authorization: Bearer <API key>` (manage.py pgqueue apikey create). Every error is "
        '`{"error": code, "detail": message, "fields": {field: reason}?}`.'
    ),
    "VERSION": "1",
    "COMPONENT_SPLIT_REQUEST": True,
}

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>pgqueue API</title>
<link rel="icon" href="{assets}favicon-32x32.png">
<link rel="stylesheet" href="{assets}swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="{assets}swagger-ui-bundle.js"></script>
<script src="{assets}swagger-ui-standalone-preset.js"></script>
<script src="{assets}init.js" data-schema="{schema}"></script>
</body></html>"""

INIT = """const script = document.currentScript || document.querySelector("script[data-schema]");
window.ui = SwaggerUIBundle({
  url: script.dataset.schema,
  dom_id: "#swagger-ui",
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
  layout: "BaseLayout",
  persistAuthorization: true,
});
"""


def _safe_only(view: Any) -> Any:
    """GET and HEAD only; anything else is a JSON 405 like the rest of the API."""

    def wrapper(request: Any, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            response = JsonResponse(
                {
                    "error": "method_not_allowed",
                    "detail": f'Method "{request.method}" not allowed.',
                },
                status=405,
            )
            response["Allow"] = "GET, HEAD"
            return response
        return view(request, *args, **kwargs)

    wrapper.__name__ = view.__name__
    wrapper.__doc__ = view.__doc__
    return wrapper


@_safe_only
def docs(request: Any) -> HttpResponse:
    assets = reverse("pgqueue:docs-asset", args=["x"])[:-1]
    page = PAGE.format(assets=escape(assets), schema=escape(reverse("pgqueue:schema")))
    return HttpResponse(page, content_type="text/html; charset=utf-8")


@_safe_only
def asset(request: Any, name: str) -> HttpResponse:
    if name == "init.js":
        return HttpResponse(INIT, content_type="text/javascript; charset=utf-8")
    if name not in ASSETS:
        raise Http404(name)
    content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
    # FileResponse closes the file when the response is done.
    response = FileResponse((SWAGGER_DIR / name).open("rb"), content_type=content_type)
    response["Cache-Control"] = "public, max-age=86400"
    return response
