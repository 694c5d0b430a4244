"""Queues: a queue has no model of its own, so its admin page hangs on the limit rows'
(``Limit``, listed as "Limits" on the admin index): every queue with jobs or limits, its jobs
by status, running, cap, rate limit and pause, with Pause / Resume buttons and a page to set
its cap and rate limit. Reads are ``reads.job_counts`` and ``limit_reads.queue_summaries``
(bounded: live statuses exact through their partial indexes, finished ones up to
COUNT_CAP); changes go through ``pgqueue.limits``. Viewing needs the view permission of
limits, changing their change permission (as every pgqueue admin page does)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import URLPattern, path, reverse

from .. import limits, reads
from ..limit_models import Limit
from ..limit_reads import queue_summaries
from ..models import Status
from ..services import NAME_RE
from .limit_forms import ScopeLimitsForm

LIST_TEMPLATE = "admin/pgqueue/queues.html"
FORM_TEMPLATE = "admin/pgqueue/queue_form.html"


def count_label(n: int) -> str:
    return f"{int(n) - 1}+" if isinstance(n, reads.BoundedCount) else str(n)


@admin.register(Limit)
class QueueAdmin(admin.ModelAdmin):
    """The queues' page, in place of a list of limit rows (tenants' rows are on their
    tenants' pages)."""

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path("", view(self.queues_view), name="pgqueue_limit_changelist"),
            path("queue/<str:name>/", view(self.queue_view), name="pgqueue_queue_change"),
            path(
                "queue/<str:name>/pause/",
                view(self.switch_view(True)),
                name="pgqueue_queue_pause",
            ),
            path(
                "queue/<str:name>/resume/",
                view(self.switch_view(False)),
                name="pgqueue_queue_resume",
            ),
        ]

    def _context(self, request: HttpRequest, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "can_change": self.has_change_permission(request),
            **extra,
        }

    def queues_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        counts = reads.job_counts()
        rows = []
        for q in queue_summaries(counts=counts):
            jobs = counts.get(q["name"], {})
            labels = {s: count_label(jobs.get(s, 0)) for s in Status.values}
            rows.append({**q, "labels": labels})
        return render(request, LIST_TEMPLATE, self._context(request, title="Queues", rows=rows))

    def queue_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """A queue's cap, rate limit and pause: GET shows the form, POST saves what changed
        through ``limits.set_limits`` (a refused value is a form error)."""
        if not NAME_RE.match(name):
            raise Http404("no such queue")
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        (summary,) = queue_summaries([name])
        initial = {k: summary[k] for k in ("max_running", "rate_limit", "paused")}
        if request.method == "POST":
            if not self.has_change_permission(request):
                raise PermissionDenied
            form = ScopeLimitsForm(request.POST, initial=initial)
            if form.is_valid():
                changes = form.limit_changes()
                if changes:
                    limits.set_limits(queue=name, **changes)
                self.message_user(request, f"Saved the limits of queue {name}.", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:pgqueue_limit_changelist"))
        else:
            form = ScopeLimitsForm(initial=initial)
        context = self._context(request, title=f"Queue {name}", queue=summary, form=form)
        return render(request, FORM_TEMPLATE, context)

    def switch_view(self, pause: bool) -> Any:
        def view(request: HttpRequest, name: str) -> HttpResponse:
            """Pause / Resume a queue: POST only (the admin wraps it in csrf_protect)."""
            if request.method != "POST":
                return HttpResponse(status=405, headers={"Allow": "POST"})
            if not NAME_RE.match(name):
                raise Http404("no such queue")
            if not self.has_change_permission(request):
                raise PermissionDenied
            (limits.pause_queue if pause else limits.resume_queue)(name)
            verb = "Paused" if pause else "Resumed"
            self.message_user(request, f"{verb} queue {name}.", messages.SUCCESS)
            return HttpResponseRedirect(reverse("admin:pgqueue_limit_changelist"))

        return view
