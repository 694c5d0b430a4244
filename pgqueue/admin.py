"""The Django admin for pgqueue: jobs, tenants, workers, API keys and the dashboard.

Every state change goes through the service layer (actions and saves call
``pgqueue.services``); nothing here writes job rows itself. List pages stay fast on large
tables: no full-table COUNT on a page load (an estimate when unfiltered, a bounded count
when filtered), and filters list their choices from small tables.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.urls import path
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html

from . import keys, services
from .conf import pgqueue_settings
from .models import ApiKey, Dashboard, FairClock, Job, JobAttempt, Status, Tenant, Worker
from .registry import registered_tasks

#: Filtered lists count at most this many rows (pagination shows "N+" past it).
COUNT_BOUND = 10_000

STATUS_COLOURS = {
    Status.SCHEDULED: "#6c757d",
    Status.QUEUED: "#0d6efd",
    Status.RUNNING: "#fd7e14",
    Status.DONE: "#198754",
    Status.DEAD: "#dc3545",
    Status.CANCELLED: "#495057",
}


class BoundedCount(int):
    """A count that stopped at the bound: compares as a number, reads as "N+"."""

    def __str__(self) -> str:
        return f"{int(self) - 1}+"

    __format__ = None  # type: ignore[assignment]  # set below, after the class exists


def _format_bounded(self: BoundedCount, spec: str) -> str:
    return str(self) if not spec else int.__format__(int(self) - 1, spec) + "+"


BoundedCount.__format__ = _format_bounded  # type: ignore[method-assign]


class EstimatedCountPaginator(Paginator):
    """Counts without scanning the whole table.

    Unfiltered, the planner's row estimate for the table (``pg_class.reltuples``) is used
    once it is large; filtered, rows are counted up to COUNT_BOUND and no further.
    """

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if isinstance(qs, QuerySet) and not qs.query.where:
            with connections[qs.db].cursor() as cursor:
                cursor.execute(
                    "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                    [qs.model._meta.db_table],
                )
                row = cursor.fetchone()
            if row and row[0] > COUNT_BOUND:
                return int(row[0])
        if isinstance(qs, QuerySet):
            counted = qs.order_by()[: COUNT_BOUND + 1].count()
            return BoundedCount(counted) if counted > COUNT_BOUND else counted
        return len(qs)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def _pretty_json(value: Any) -> str:
    return format_html(
        '<pre style="white-space: pre-wrap; margin: 0">{}</pre>',
        json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False),
    )


def _report(modeladmin: admin.ModelAdmin, request: Any, verb: str, result: Any) -> None:
    """Tell the operator how many jobs changed, and why the others did not."""
    modeladmin.message_user(request, f"{verb} {len(result.changed)} job(s).", messages.SUCCESS)
    if result.skipped:
        reasons = Counter(
            f"{result.statuses[i]}" if i in result.statuses else "missing" for i in result.skipped
        )
        detail = ", ".join(f"{n} {status}" for status, n in sorted(reasons.items()))
        sample = next(iter(result.skipped.values()))
        modeladmin.message_user(
            request,
            f"Skipped {len(result.skipped)} job(s) ({detail}), e.g. {sample}.",
            messages.WARNING,
        )


class _ColumnFilter(admin.SimpleListFilter):
    """Filters on one column, their choices read from a small table, never from the jobs."""

    column = ""

    def choices_of(self) -> Iterable[str]:
        raise NotImplementedError

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [(value, value) for value in self.choices_of()]

    def queryset(self, request: Any, queryset: QuerySet) -> QuerySet:
        return queryset.filter(**{self.column: self.value()}) if self.value() else queryset


class QueueFilter(_ColumnFilter):
    """Queues known to the fair clocks (a small table), not a DISTINCT over every job."""

    title = parameter_name = column = "queue"

    def choices_of(self) -> Iterable[str]:
        return FairClock.objects.order_by("queue").values_list("queue", flat=True).distinct()


class TaskFilter(_ColumnFilter):
    """The registered tasks."""

    title = parameter_name = column = "task"

    def choices_of(self) -> Iterable[str]:
        return sorted(registered_tasks())


class TenantFilter(_ColumnFilter):
    title = parameter_name = "tenant"
    column = "tenant_id"

    def choices_of(self) -> Iterable[str]:
        return Tenant.objects.order_by("name").values_list("name", flat=True)


class AttemptInline(admin.TabularInline):
    model = JobAttempt
    extra = 0
    can_delete = False
    fields = ["attempt", "outcome", "worker", "started_at", "finished_at", "error", "trace"]
    readonly_fields = fields
    ordering = ["id"]

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    @admin.display(description="traceback")
    def trace(self, obj: JobAttempt) -> str:
        if not obj.traceback:
            return "—"
        return format_html(
            '<details><summary>show</summary><pre style="white-space: pre-wrap; '
            'max-width: 60em">{}</pre></details>',
            obj.traceback,
        )


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "status_badge",
        "tenant_id",
        "task",
        "queue",
        "priority",
        "tries",
        "age",
        "run_time",
    ]
    list_display_links = ["id"]
    list_filter = [
        "status",
        QueueFilter,
        TenantFilter,
        TaskFilter,
        ("created_at", admin.DateFieldListFilter),
    ]
    search_fields = ["=idempotency_key", "=task"]
    search_help_text = "A job id, an idempotency key, or a task name."
    ordering = ["-id"]
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    actions = ["retry_jobs", "cancel_jobs", "run_now"]
    inlines = [AttemptInline]
    fieldsets = [
        (None, {"fields": ["id", "task", "tenant_id", "queue", "status_badge", "priority"]}),
        ("Data", {"fields": ["payload_pretty", "result_pretty", "last_error"]}),
        (
            "Attempts and timing",
            {
                "fields": [
                    "tries",
                    "idempotency_key",
                    "run_at",
                    "created_at",
                    "started_at",
                    "finished_at",
                    "lease_owner",
                    "lease_expires_at",
                    "vtime",
                ]
            },
        ),
    ]
    readonly_fields = [
        "id",
        "task",
        "tenant_id",
        "queue",
        "status_badge",
        "priority",
        "payload_pretty",
        "result_pretty",
        "last_error",
        "tries",
        "idempotency_key",
        "run_at",
        "created_at",
        "started_at",
        "finished_at",
        "lease_owner",
        "lease_expires_at",
        "vtime",
    ]

    # Jobs are created by enqueueing and changed by actions, never edited by hand.
    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        # The list (and its actions) need "change"; a job's own page is read-only.
        return obj is None and super().has_change_permission(request, obj)

    def get_search_results(self, request: Any, queryset: QuerySet, term: str) -> Any:
        term = term.strip()
        if term.isdigit():
            return queryset.filter(Q(pk=int(term)) | Q(idempotency_key=term) | Q(task=term)), False
        return super().get_search_results(request, queryset, term)

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Job) -> str:
        return format_html(
            '<span style="background:{};color:#fff;padding:2px 8px;border-radius:10px;'
            'font-size:11px;font-weight:600">{}</span>',
            STATUS_COLOURS.get(obj.status, "#333"),
            obj.status,
        )

    @admin.display(description="attempts")
    def tries(self, obj: Job) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: Job) -> str:
        return _duration((timezone.now() - obj.created_at).total_seconds())

    @admin.display(description="run time")
    def run_time(self, obj: Job) -> str:
        if obj.started_at is None:
            return "—"
        end = obj.finished_at or (timezone.now() if obj.status == Status.RUNNING else None)
        return _duration((end - obj.started_at).total_seconds()) if end else "—"

    @admin.display(description="payload")
    def payload_pretty(self, obj: Job) -> str:
        return _pretty_json(obj.payload)

    @admin.display(description="result")
    def result_pretty(self, obj: Job) -> str:
        return "—" if obj.result is None else _pretty_json(obj.result)

    @admin.action(description="Retry the selected dead or cancelled jobs", permissions=["change"])
    def retry_jobs(self, request: Any, queryset: QuerySet) -> None:
        ids = list(queryset.values_list("id", flat=True))
        _report(self, request, "Retried", services.retry_jobs(ids))

    @admin.action(
        description="Cancel the selected scheduled or queued jobs", permissions=["change"]
    )
    def cancel_jobs(self, request: Any, queryset: QuerySet) -> None:
        ids = list(queryset.values_list("id", flat=True))
        _report(self, request, "Cancelled", services.cancel_jobs(ids))

    @admin.action(description="Run the selected scheduled jobs now", permissions=["change"])
    def run_now(self, request: Any, queryset: QuerySet) -> None:
        ids = list(queryset.values_list("id", flat=True))
        _report(self, request, "Made runnable", services.run_jobs_now(ids))


class TenantForm(forms.ModelForm):
    class Meta:
        model = Tenant
        fields = ["name", "weight"]

    def clean_name(self) -> Any:
        name = self.cleaned_data["name"]
        if not isinstance(name, str):  # the list's hidden primary-key field: a Tenant
            return name
        try:
            return services.validate_name(name, "tenant")
        except services.InvalidJob as exc:
            raise forms.ValidationError(exc.reason) from None

    def clean_weight(self) -> float:
        weight = self.cleaned_data["weight"]
        if weight is None or not weight > 0:
            raise forms.ValidationError("The weight must be greater than 0.")
        return weight


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    form = TenantForm
    list_display = ["name", "weight", "backlog", "running", "done", "dead", "share_last_hour"]
    list_editable = ["weight"]
    search_fields = ["name"]
    ordering = ["name"]
    list_per_page = 50

    def get_queryset(self, request: Any) -> QuerySet:
        # Counts for the tenants of one page (index pgqueue_job_tenant_status), and their
        # share of the jobs done in the last hour (index pgqueue_attempt_finished).
        since = timezone.now() - dt.timedelta(hours=1)
        done_last_hour = JobAttempt.objects.filter(finished_at__gte=since, outcome="done")
        per_tenant = (
            done_last_hour.filter(job__tenant_id=OuterRef("name"))
            .order_by()
            .values("job__tenant_id")
            .annotate(n=Count("id"))
            .values("n")
        )
        total = done_last_hour.order_by().values("outcome").annotate(n=Count("id")).values("n")
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_backlog=Count("jobs", filter=Q(jobs__status__in=["queued", "scheduled"])),
                n_running=Count("jobs", filter=Q(jobs__status="running")),
                n_done=Count("jobs", filter=Q(jobs__status="done")),
                n_dead=Count("jobs", filter=Q(jobs__status="dead")),
                n_hour=Subquery(per_tenant),
                n_hour_total=Subquery(total),
            )
        )

    def get_readonly_fields(self, request: Any, obj: Any = None) -> list[str]:
        return ["name"] if obj is not None else []

    def get_changelist_form(self, request: Any, **kwargs: Any) -> Any:
        # The list's weight column validates like the change page.
        return super().get_changelist_form(request, form=TenantForm, **kwargs)

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def save_model(self, request: Any, obj: Tenant, form: Any, change: bool) -> None:
        services.set_tenant_weight(obj.name, obj.weight)

    @admin.display(description="backlog", ordering="n_backlog")
    def backlog(self, obj: Tenant) -> int:
        return obj.n_backlog

    @admin.display(description="running", ordering="n_running")
    def running(self, obj: Tenant) -> int:
        return obj.n_running

    @admin.display(description="done", ordering="n_done")
    def done(self, obj: Tenant) -> int:
        return obj.n_done

    @admin.display(description="dead", ordering="n_dead")
    def dead(self, obj: Tenant) -> int:
        return obj.n_dead

    @admin.display(description="share of work, last hour", ordering="n_hour")
    def share_last_hour(self, obj: Tenant) -> str:
        if not obj.n_hour_total:
            return "—"
        return f"{(obj.n_hour or 0) / obj.n_hour_total:.0%}"


class ViewOnlyAdmin(admin.ModelAdmin):
    """Pages to look at: nothing added, changed or deleted through them."""

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


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
        if obj.stopped_at is not None:
            label, colour = "stopped", "#6c757d"
        elif timezone.now() - obj.last_seen_at <= dt.timedelta(
            seconds=float(pgqueue_settings.LEASE_SECONDS)
        ):
            label, colour = "alive", "#198754"
        else:
            label, colour = "stale", "#dc3545"
        return format_html('<b style="color:{}">{}</b>', colour, label)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Create a key (shown once, in a message), revoke keys, see their last use."""

    list_display = ["prefix", "scope", "name", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "name", "tenant__name"]
    fields = ["tenant", "name"]
    actions = ["revoke"]

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    @admin.display(description="tenant")
    def scope(self, obj: ApiKey) -> str:
        return obj.tenant_id or "all tenants"

    def save_model(self, request: Any, obj: ApiKey, form: Any, change: bool) -> None:
        row, key = keys.create_api_key(tenant=obj.tenant_id, name=obj.name)
        obj.pk = row.pk
        obj.prefix = row.prefix
        self.message_user(
            request,
            f"API key {row.prefix} created. It is shown only now; store it: {key}",
            messages.WARNING,
        )

    @admin.action(description="Revoke the selected API keys", permissions=["change"])
    def revoke(self, request: Any, queryset: QuerySet) -> None:
        prefixes = list(queryset.values_list("prefix", flat=True))
        for prefix in prefixes:
            keys.revoke_api_key(prefix)
        self.message_user(request, f"Revoked {len(prefixes)} key(s).")


@admin.register(Dashboard)
class DashboardAdmin(ViewOnlyAdmin):
    """The dashboard, listed on the admin index like a model."""

    def has_view_permission(self, request: Any, obj: Any = None) -> bool:
        return request.user.is_active and request.user.is_staff

    def get_urls(self) -> list:
        def view(request: Any) -> Any:
            from .dashboard import dashboard_view

            return dashboard_view(request, self.admin_site.each_context(request))

        page = self.admin_site.admin_view(view)
        # The admin index links each entry to its "changelist": the dashboard is that too.
        return [
            path("", page, name="pgqueue_dashboard"),
            path("", page, name="pgqueue_dashboard_changelist"),
        ]

    def get_model_perms(self, request: Any) -> dict[str, bool]:
        return {"view": self.has_view_permission(request)}
