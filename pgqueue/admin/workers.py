"""Workers, to look at: who is alive, stale or stopped (``liveness.worker_state``), and which
queues with runnable jobs none of the live ones serves (``liveness.unserved_queues``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html

from .. import liveness
from ..models import Worker
from .common import ViewOnlyAdmin, timestamp

WORKER_STATE_COLOURS = {"alive": "#198754", "stale": "#dc3545", "stopped": "#6c757d"}


@admin.register(Worker)
class WorkerAdmin(ViewOnlyAdmin):
    list_display = [
        "host",
        "pid",
        "queue_list",
        "concurrency",
        "started",
        "last_seen",
        "state",
    ]
    fields = ["id", "host", "pid", "queue_list", "concurrency", "started", "last_seen", "stopped"]
    readonly_fields = fields
    ordering = ["-last_seen_at"]
    list_per_page = 100

    started = timestamp("started_at")
    last_seen = timestamp("last_seen_at", "last seen")
    stopped = timestamp("stopped_at")

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Shown on this page's own render: the messages are read back within the request.
        queues = liveness.unserved_queues() if self.has_view_permission(request) else []
        for queue in queues:
            self.message_user(
                request,
                f"Queue {queue!r} has runnable jobs and no live worker serves this queue.",
                messages.WARNING,
            )
        return super().changelist_view(request, extra_context)

    @admin.display(description="queues")
    def queue_list(self, obj: Worker) -> str:
        return ", ".join(obj.queues or [])

    @admin.display(description="state")
    def state(self, obj: Worker) -> str:
        label = liveness.worker_state(obj.stopped_at, obj.last_seen_at, timezone.now())
        colour = WORKER_STATE_COLOURS[label]
        return format_html('<b style="color:{}">{}</b>', colour, label)
