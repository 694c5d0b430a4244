"""The dashboard's place in the admin: listed on the index like a model, served by
``pgqueue.dashboard``."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.urls import path

from ..models import Dashboard
from .common import ViewOnlyAdmin


@admin.register(Dashboard)
class DashboardAdmin(ViewOnlyAdmin):
    """The dashboard, listed on the admin index like a model."""

    def has_view_permission(self, request: Any, obj: Any = None) -> bool:
        """Staff who may view jobs, as GET /stats asks: the page shows every tenant's
        backlog, running jobs and failures."""
        from ..dashboard import VIEW_PERMISSION

        user = request.user
        return user.is_active and user.is_staff and user.has_perm(VIEW_PERMISSION)

    def get_urls(self) -> list:
        def view(request: Any) -> Any:
            from ..dashboard import dashboard_view

            return dashboard_view(request, self.admin_site.each_context(request))

        page = self.admin_site.admin_view(view)
        # The admin index links each entry to its "changelist": the dashboard is that too.
        return [
            path("", page, name="pgqueue_dashboard"),
            path("", page, name="pgqueue_dashboard_changelist"),
        ]

    def get_model_perms(self, request: Any) -> dict[str, bool]:
        return {"view": self.has_view_permission(request)}
