"""pgqueue's HTTP API. Mount it with ``path("queue/", include("pgqueue.urls"))`` (any prefix,
or ``""`` for the site's root).

Every path answers with and without a trailing slash. An unknown path under one of
pgqueue's resources (``jobs/abc``, ``workflows/x``, ``tenants/x/y``) is a JSON 404; the
rest of the site keeps the project's own pages, even when pgqueue is mounted at the root.

The API needs the ``api`` extra (Django REST framework, drf-spectacular and its sidecar);
the rest of pgqueue does not, so a project without them that includes this URLconf gets
an ImproperlyConfigured that says what to install, not an ImportError from deep inside.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.http import Http404
from django.urls import URLPattern, re_path
from django.views.decorators.csrf import csrf_exempt

#: What ``include("pgqueue.urls")`` says when a package of the ``api`` extra is missing.
MISSING_API_EXTRA = (
    "pgqueue's HTTP API (pgqueue.urls) needs the packages of its 'api' extra, and {missing} "
    "is not installed. Install them with: pip install 'django-pgqueue-fair[api]' (with a "
    "wheel built from the repository: pip install --find-links <the wheel's folder> "
    "'django-pgqueue-fair[api]'), and add the apps to settings.py: "
    'INSTALLED_APPS += ["rest_framework", "drf_spectacular"]. The rest of pgqueue '
    "(enqueue, workers, the admin, the commands, the metrics collector) works without them."
)

try:
    import drf_spectacular  # noqa: F401
    import drf_spectacular_sidecar  # noqa: F401
    import rest_framework  # noqa: F401
except ImportError as exc:
    raise ImproperlyConfigured(MISSING_API_EXTRA.format(missing=exc.name or "one")) from exc

#: ... and when the packages are there but their apps are not in INSTALLED_APPS: the
#: browsable API's templates and the schema's settings come from the apps.
MISSING_API_APPS = (
    "pgqueue's HTTP API (pgqueue.urls) needs {missing} in INSTALLED_APPS: "
    'INSTALLED_APPS += ["rest_framework", "drf_spectacular"].'
)

_missing_apps = [a for a in ("rest_framework", "drf_spectacular") if not apps.is_installed(a)]
if _missing_apps:
    raise ImproperlyConfigured(MISSING_API_APPS.format(missing=" and ".join(_missing_apps)))

from .api import docs, errors, limits_views, meta_views, views, workflow_views  # noqa: E402

app_name = "pgqueue"


def _path(pattern: str, view: Any, name: str) -> URLPattern:
    return re_path(rf"^{pattern}/?$", view, name=name)


def _page(view: Any) -> Any:
    """A plain Django view of pgqueue's: CSRF-exempt (it only reads, so a POST gets its
    JSON 405, not a CSRF page) and its 404 in JSON whatever the project's handler404."""

    @csrf_exempt
    def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return view(request, *args, **kwargs)
        except Http404:
            return errors.not_found(request)

    return wrapper


urlpatterns = [
    _path("jobs", views.JobsView.as_view(), "jobs"),
    _path("jobs/batch", views.JobBatchView.as_view(), "jobs-batch"),
    _path(r"jobs/(?P<job_id>[0-9]{1,18})", views.JobView.as_view(), "job"),
    _path(r"jobs/(?P<job_id>[0-9]{1,18})/retry", views.JobRetryView.as_view(), "job-retry"),
    _path("workflows", workflow_views.WorkflowsView.as_view(), "workflows"),
    _path(
        r"workflows/(?P<workflow_id>[0-9]{1,18})",
        workflow_views.WorkflowView.as_view(),
        "workflow",
    ),
    _path("tenants", views.TenantsView.as_view(), "tenants"),
    _path(r"tenants/(?P<name>[A-Za-z0-9_.\-]{1,64})", views.TenantView.as_view(), "tenant"),
    _path(
        r"tenants/(?P<name>[A-Za-z0-9_.\-]{1,64})/pause",
        limits_views.TenantPauseView.as_view(),
        "tenant-pause",
    ),
    _path(
        r"tenants/(?P<name>[A-Za-z0-9_.\-]{1,64})/resume",
        limits_views.TenantResumeView.as_view(),
        "tenant-resume",
    ),
    _path("queues", limits_views.QueuesView.as_view(), "queues"),
    _path(r"queues/(?P<name>[A-Za-z0-9_.\-]{1,64})", limits_views.QueueView.as_view(), "queue"),
    _path(
        r"queues/(?P<name>[A-Za-z0-9_.\-]{1,64})/pause",
        limits_views.QueuePauseView.as_view(),
        "queue-pause",
    ),
    _path(
        r"queues/(?P<name>[A-Za-z0-9_.\-]{1,64})/resume",
        limits_views.QueueResumeView.as_view(),
        "queue-resume",
    ),
    _path("stats", views.StatsView.as_view(), "stats"),
    _path("metrics", views.MetricsView.as_view(), "metrics"),
    _path("health", meta_views.HealthView.as_view(), "health"),
    _path(
        "schema",
        meta_views.SchemaView.as_view(custom_settings=docs.SCHEMA_SETTINGS),
        "schema",
    ),
    _path("docs", _page(docs.docs), "docs"),
    re_path(r"^docs/assets/(?P<name>[A-Za-z0-9_.\-]+)$", _page(docs.asset), name="docs-asset"),
    # Last: anything else under pgqueue's own first path segments.
    re_path(
        r"^(?:jobs|workflows|tenants|queues|stats|metrics|health|schema|docs)(?:/.*)?$",
        _page(errors.not_found),
        name="not-found",
    ),
]
