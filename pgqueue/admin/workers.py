"""Workers, to look at: who is alive, stale or stopped (``reads.worker_state``)."""

from __future__ import annotations

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html

from .. import reads
from ..models import Worker
from .common import ViewOnlyAdmin

WORKER_STATE_COLOURS = {"alive": "#198754", "stale": "#dc3545", "stopped": "#6c757d"}


@admin.register(Worker)
class WorkerAdmin(ViewOnlyAdmin):
    list_display = [
        "host",
        "pid",
        "queue_list",
        "concurrency",
        "started_at",
        "last_seen_at",
        "state",
    ]
    ordering = ["-last_seen_at"]
    list_per_page = 100

    @admin.display(description="queues")
    def queue_list(self, obj: Worker) -> str:
        return ", ".join(obj.queues or [])

    @admin.display(description="state")
    def state(self, obj: Worker) -> str:
        label = reads.worker_state(obj.stopped_at, obj.last_seen_at, timezone.now())
        colour = WORKER_STATE_COLOURS[label]
        return format_html('<b style="color:{}">{}</b>', colour, label)
