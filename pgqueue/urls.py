"""pgqueue's HTTP API. Mount it with ``path("queue/", include("pgqueue.urls"))`` (any prefix,
or ``""`` for the site's root).

Every path answers with and without a trailing slash. An unknown path under one of the API's
own (``jobs/abc``, ``tenants/a/b``) is a JSON 404 from the last pattern, so the project needs
no ``handler404``, and the rest of the site keeps its own 404 pages.
"""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern, re_path

from .api import docs, errors, views

app_name = "pgqueue"


def _path(pattern: str, view: Any, name: str) -> URLPattern:
    return re_path(rf"^{pattern}/?$", view, name=name)


urlpatterns = [
    _path("jobs", views.JobsView.as_view(), "jobs"),
    _path("jobs/batch", views.JobBatchView.as_view(), "jobs-batch"),
    _path(r"jobs/(?P<job_id>[0-9]{1,18})", views.JobView.as_view(), "job"),
    _path(r"jobs/(?P<job_id>[0-9]{1,18})/retry", views.JobRetryView.as_view(), "job-retry"),
    _path("tenants", views.TenantsView.as_view(), "tenants"),
    _path(r"tenants/(?P<name>[A-Za-z0-9_.\-]{1,64})", views.TenantView.as_view(), "tenant"),
    _path("stats", views.StatsView.as_view(), "stats"),
    _path("metrics", views.MetricsView.as_view(), "metrics"),
    _path("health", views.HealthView.as_view(), "health"),
    _path(
        "schema",
        views.SchemaView.as_view(custom_settings=docs.SCHEMA_SETTINGS),
        "schema",
    ),
    _path("docs", docs.docs, "docs"),
    re_path(r"^docs/assets/(?P<name>[A-Za-z0-9_.\-]+)$", docs.asset, name="docs-asset"),
    # Last: whatever else is under the API's own paths. Nothing beyond them, so that the API
    # mounted at the root leaves every other path to the project.
    re_path(r"^(?:jobs|tenants|stats|metrics|health|schema|docs)(?:/.*)?$", errors.not_found),
]
