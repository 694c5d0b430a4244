"""Periodic schedules: what code declared, when each runs next, and its on/off switch.

Code owns the schedules (no add, no delete, no edit); the operator owns ``enabled``, turned
through ``schedules.set_periodic_enabled`` by the actions below, never by a row write here.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.urls import reverse
from django.utils.html import format_html

from .. import schedules
from ..models import PeriodicSchedule


@admin.register(PeriodicSchedule)
class PeriodicScheduleAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "cron",
        "timezone",
        "task",
        "tenant",
        "state",
        "next_run_at",
        "last_run_at",
        "last_job",
    ]
    list_filter = ["enabled"]
    search_fields = ["name", "task"]
    ordering = ["name"]
    list_per_page = 100
    actions = ["enable", "disable"]

    def has_add_permission(self, request: Any) -> bool:
        return False  # code declares schedules

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False  # a schedule leaves when code stops declaring it

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        # The list (and its actions) need "change"; a schedule's own page is read-only.
        return obj is None and super().has_change_permission(request, obj)

    def get_readonly_fields(self, request: Any, obj: Any = None) -> list[str]:
        return [f.name for f in PeriodicSchedule._meta.fields]

    @admin.display(description="state", ordering="enabled")
    def state(self, obj: PeriodicSchedule) -> str:
        if obj.removed_at is not None:
            label, colour = "removed from code", "#6c757d"
        elif not obj.enabled:
            label, colour = "disabled", "#dc3545"
        else:
            label, colour = "enabled", "#198754"
        return format_html('<b style="color:{}">{}</b>', colour, label)

    @admin.display(description="last job")
    def last_job(self, obj: PeriodicSchedule) -> str:
        if obj.last_job_id is None:
            return "-"
        url = reverse("admin:pgqueue_job_change", args=[obj.last_job_id])
        return format_html('<a href="{}">{}</a>', url, obj.last_job_id)

    def _switch(self, request: Any, queryset: QuerySet, enabled: bool) -> None:
        changed = sum(
            schedules.set_periodic_enabled(name, enabled)
            for name in queryset.values_list("name", flat=True)
        )
        verb = "Enabled" if enabled else "Disabled"
        self.message_user(request, f"{verb} {changed} schedule(s).", messages.SUCCESS)

    @admin.action(description="Enable the selected schedules", permissions=["change"])
    def enable(self, request: Any, queryset: QuerySet) -> None:
        self._switch(request, queryset, True)

    @admin.action(description="Disable the selected schedules", permissions=["change"])
    def disable(self, request: Any, queryset: QuerySet) -> None:
        self._switch(request, queryset, False)
