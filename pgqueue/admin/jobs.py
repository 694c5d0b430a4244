"""The job list and a job's page: filters, the attempt history, the job's workflow and
the jobs it waits for or that wait for it, and the actions (retry, cancel, run now) that
call the service layer, on the list for the selected jobs and on a job's page as buttons
for that job."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from .. import liveness, pages, services, workflow_reads
from ..conf import queue_db
from ..durations import format_seconds
from ..key_models import KeyState
from ..limit_reads import waiting_for
from ..models import LIVE_STATUSES, FairClock, Job, JobAttempt, Status, Tenant, Workflow
from ..progress import progress_text
from ..registry import registered_tasks
from .common import (
    ColumnFilter,
    EstimatedCountPaginator,
    pretty_json,
    report_changes,
    timestamp,
)

#: The statuses of jobs due to run (now or at their run_at), which a task no worker serves
#: keeps waiting. (A job in status "waiting" waits for its dependencies first.)
PENDING = (Status.SCHEDULED, Status.QUEUED)

#: What the job page says of each ``waiting_for`` reason.
WAITING_REASONS = {
    "backoff": "backoff: its retry is scheduled after a failed attempt",
    "run_at": "run_at: scheduled for later",
    "paused": "paused: its queue or tenant is paused",
    "tenant_cap": "tenant_cap: its tenant runs as many jobs as its cap allows",
    "queue_cap": "queue_cap: its queue runs as many jobs as its cap allows",
    "rate_limit": "rate_limit: its queue's or tenant's rate limit has no token now",
    "key_cap": "key_cap: its concurrency key runs as many jobs as its cap allows",
    "turn": "turn: its turn in line",
}

STATUS_COLOURS = {
    Status.WAITING: "#6f42c1",
    Status.SCHEDULED: "#6c757d",
    Status.QUEUED: "#0d6efd",
    Status.RUNNING: "#fd7e14",
    Status.DONE: "#198754",
    Status.DEAD: "#dc3545",
    Status.CANCELLED: "#495057",
}


def status_badge_html(status: str) -> str:
    """A status as the job list shows it: a pill in the status's colour."""
    return format_html(
        '<span style="background:{};color:#fff;padding:2px 8px;border-radius:10px;'
        'font-size:11px;font-weight:600">{}</span>',
        STATUS_COLOURS.get(status, "#333"),
        status,
    )


@dataclass(frozen=True)
class JobAction:
    """A button on a job's page: the same service call as the list action of that name."""

    slug: str  # the URL's last segment
    label: str
    verb: str  # of the message: "Retried 1 job(s)."
    statuses: tuple[str, ...]  # the jobs it applies to; the service skips the others
    call: Callable[[list[int]], services.BulkResult]


JOB_ACTIONS = [
    JobAction(
        "retry",
        "Retry",
        "Retried",
        (Status.DEAD, Status.CANCELLED),
        services.retry_jobs,
    ),
    JobAction(
        "cancel",
        "Cancel",
        "Cancelled",
        (Status.WAITING, Status.SCHEDULED, Status.QUEUED, Status.RUNNING),
        services.cancel_jobs,
    ),
    JobAction(
        "run-now",
        "Run now",
        "Made runnable",
        (Status.SCHEDULED,),
        services.run_jobs_now,
    ),
]


class QueueFilter(ColumnFilter):
    """Queues known to the fair clocks (a small table), not a DISTINCT over every job. A
    queue with runnable jobs and no live worker serving it says so."""

    title = parameter_name = column = "queue"

    def choices_of(self) -> Iterable[str]:
        return (
            FairClock.objects.using(queue_db())
            .order_by("queue")
            .values_list("queue", flat=True)
            .distinct()
        )

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        unserved = set(liveness.unserved_queues())
        return [
            (q, f"{q} (no live worker serves this queue)" if q in unserved else q)
            for q in self.choices_of()
        ]


class TaskFilter(ColumnFilter):
    """The registered tasks."""

    title = parameter_name = column = "task"

    def choices_of(self) -> Iterable[str]:
        return sorted(registered_tasks())


class TenantFilter(ColumnFilter):
    title = parameter_name = "tenant"
    column = "tenant_id"

    def choices_of(self) -> Iterable[str]:
        return Tenant.objects.using(queue_db()).order_by("name").values_list("name", flat=True)


class AttemptInline(admin.TabularInline):
    model = JobAttempt
    extra = 0
    can_delete = False
    fields = [
        "attempt",
        "outcome",
        "worker",
        "claimed",
        "started",
        "finished",
        "run_time",
        "error",
        "trace",
    ]
    readonly_fields = fields
    ordering = ["id"]

    claimed = timestamp("claimed_at")
    started = timestamp("started_at")
    finished = timestamp("finished_at")

    @admin.display(description="run time")
    def run_time(self, obj: JobAttempt) -> str:
        if obj.started_at is None or obj.finished_at is None:
            return "—"
        return format_seconds((obj.finished_at - obj.started_at).total_seconds())

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
        "tenant_name",
        "task_served",
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
    search_fields = ["=idempotency_key", "=task", "=concurrency_key"]

    @property
    def search_help_text(self) -> str:  # type: ignore[override]
        return (
            "A job id (any job, however old), an idempotency key, a task name or a "
            "concurrency key. The list "
            f"holds the newest {pages.list_window():,} jobs (of the tenant filtered on)."
        )

    ordering = ["-id"]
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    actions = ["retry_jobs", "cancel_jobs", "run_now"]
    inlines = [AttemptInline]
    change_form_template = "admin/pgqueue/job/change_form.html"
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "id",
                    "task_served",
                    "tenant_name",
                    "queue",
                    "status_badge",
                    "waiting",
                    "priority",
                ]
            },
        ),
        (
            "Data",
            {
                "fields": [
                    "payload_pretty",
                    "progress_shown",
                    "output_pretty",
                    "result_pretty",
                    "last_error",
                ]
            },
        ),
        (
            "Workflow",
            {
                "fields": [
                    "workflow_link",
                    "step",
                    "depends_on_links",
                    "dependents_links",
                    "upstream_failure",
                ]
            },
        ),
        ("Concurrency key", {"fields": ["concurrency_key", "key_max_running", "key_slot"]}),
        (
            "Attempts and timing",
            {
                "fields": [
                    "tries",
                    "idempotency_key",
                    "runs_at",
                    "created",
                    "claimed",
                    "started",
                    "finished",
                    "run_time",
                    "lease_owner",
                    "lease_expires",
                    "vtime",
                    "traceparent",
                ]
            },
        ),
    ]
    # Every field of the page is read-only: jobs change only through the actions.
    readonly_fields = [name for _, options in fieldsets for name in options["fields"]]

    @admin.display(description="slot of its key")
    def key_slot(self, obj: Job) -> str:
        """Where the job stands with its concurrency key (pgqueue.key_models.KeyState)."""
        if obj.concurrency_key is None:
            return "—"
        return KeyState(obj.key_state).label

    runs_at = timestamp("run_at", "run at")
    created = timestamp("created_at")
    claimed = timestamp("claimed_at")
    started = timestamp("started_at")
    finished = timestamp("finished_at")
    lease_expires = timestamp("lease_expires_at")

    # Jobs are created by enqueueing and changed by actions, never edited by hand.
    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        # The list (and its actions) need "change"; a job's own page is read-only.
        return obj is None and super().has_change_permission(request, obj)

    def get_search_results(self, request: Any, queryset: QuerySet, term: str) -> Any:
        """The filtered jobs among the newest LIST_WINDOW (of the tenant filtered on), as
        GET /jobs' first page examines them, so that no filter, search, sort or page of the
        list reads the whole history. A number that is a job's id finds that job however
        old; otherwise a term is an idempotency key or a task name."""
        in_reach = Job.objects.using(queue_db())
        if request.GET.get("tenant"):
            in_reach = in_reach.filter(tenant_id=request.GET["tenant"])
        edge = pages.window_edge(in_reach, key=None, backward=False)
        window = Q() if edge is None else Q(id__gte=edge)
        term = term.strip()
        if term.isdigit() and len(term) <= 18 and in_reach.filter(pk=int(term)).exists():
            # A job's id: that job (one probe of the primary key; an OR of it with the
            # window's other matches would be planned as a walk of the primary key).
            return queryset.filter(pk=int(term)), False
        queryset, duplicates = super().get_search_results(request, queryset, term)
        return queryset.filter(window), duplicates

    def get_urls(self) -> list[URLPattern]:
        # Before the admin's own: its "<path:object_id>/" would take these too.
        buttons = [
            path(
                f"<int:job_id>/{action.slug}/",
                self.admin_site.admin_view(self._action_view(action)),
                name=f"pgqueue_job_{action.slug.replace('-', '_')}",
            )
            for action in JOB_ACTIONS
        ]
        return buttons + super().get_urls()

    def _action_view(self, action: JobAction) -> Callable[..., HttpResponse]:
        def view(request: HttpRequest, job_id: int) -> HttpResponse:
            """A job page's button: POST only (the admin wraps this view in csrf_protect),
            with the permission the list's actions need."""
            if request.method != "POST":
                return HttpResponseNotAllowed(["POST"])
            if not super(JobAdmin, self).has_change_permission(request):
                raise PermissionDenied
            report_changes(self, request, action.verb, action.call([job_id]))
            return HttpResponseRedirect(reverse("admin:pgqueue_job_change", args=[job_id]))

        return view

    def job_buttons(self, request: HttpRequest, job: Job | None) -> list[dict[str, str]]:
        """The buttons a job's page shows: those whose action applies to the job's status,
        for a user who may change jobs."""
        if job is None or not super().has_change_permission(request):
            return []
        return [
            {
                "label": action.label,
                "slug": action.slug,
                "url": reverse(f"admin:pgqueue_job_{action.slug.replace('-', '_')}", args=[job.pk]),
            }
            for action in JOB_ACTIONS
            if job.status in action.statuses
        ]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        job = self.get_object(request, object_id)
        context = {**(extra_context or {}), "job_buttons": self.job_buttons(request, job)}
        return super().change_view(request, object_id, form_url, context)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The list, with each waiting job of a task no live worker serves marked as such:
        one read for the page's tasks (``liveness.unserved_tasks``), not one per row."""
        changelist = super().get_changelist_instance(request)
        jobs = list(changelist.result_list)
        unserved = liveness.unserved_tasks(j.task for j in jobs if j.status in PENDING)
        for job in jobs:
            job.pgq_unserved = job.task in unserved
        return changelist

    @admin.display(description="task", ordering="task")
    def task_served(self, obj: Job) -> str:
        """The task, and for a job waiting to run, "no worker serves this task" when no
        live worker has a handler for it: it waits however long the backlog looks."""
        if obj.status not in PENDING:
            return obj.task
        unserved = getattr(obj, "pgq_unserved", None)
        if unserved is None:  # the job's page: this job alone
            unserved = obj.task in liveness.unserved_tasks([obj.task])
        if not unserved:
            return obj.task
        return format_html(
            '{} <span class="pgq-unserved" style="background:#dc3545;color:#fff;padding:1px 7px;'
            'border-radius:9px;font-size:11px;font-weight:600" title="No live worker has a '
            'handler for this task: each gives its jobs back, and they wait.">'
            "no worker serves this task</span>",
            obj.task,
        )

    @admin.display(description="waiting for")
    def waiting(self, obj: Job) -> str:
        """Why a queued or scheduled job is not running yet (``limit_reads.waiting_for``, as
        GET /jobs/<id> says): a few reads of this job's limit rows, and its place in line
        counted up to COUNT_CAP. A waiting job waits for its dependencies to end."""
        if obj.status == Status.WAITING:
            upstream = self._neighbours(obj)["upstream"]
            unfinished = sum(1 for _, status, _ in upstream if status in LIVE_STATUSES)
            return f"dependencies: {unfinished} of {len(upstream)} listed below not ended yet"
        if obj.status not in PENDING:
            return "—"
        why = waiting_for(obj, using=obj._state.db or "default")
        reason = WAITING_REASONS.get(why["waiting_for"], why["waiting_for"] or "—")
        if why["position"] is not None:
            return f"{reason} ({why['position']} job(s) ahead of it)"
        return reason

    # -- the job's workflow and dependencies ------------------------------------------------

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> list[tuple[Any, dict]]:
        """The page's sections; "Workflow" only for a job of a workflow or one that waits
        for others or is waited for (``enqueue(depends_on=…)``)."""
        fieldsets = super().get_fieldsets(request, obj)
        neighbours = self._neighbours(obj) if obj is not None else None
        if neighbours is None or (
            obj.workflow_id is None and not neighbours["upstream"] and not neighbours["dependents"]
        ):
            return [f for f in fieldsets if f[0] != "Workflow"]
        return fieldsets

    def _neighbours(self, obj: Job) -> dict[str, list[tuple[int, str, str | None]]]:
        """The job's dependencies and dependents, (id, status, step) each, at most
        ``workflow_reads.MAX_NEIGHBOURS_SHOWN`` of each: read once per page (two bounded
        reads: their ids, then their rows by primary key) and kept on the job."""
        cached = getattr(obj, "_pgq_neighbours", None)
        if cached is not None:
            return cached
        db = obj._state.db or queue_db()
        ids = workflow_reads.neighbours(obj.pk, using=db)
        wanted = ids["depends_on"] + ids["dependents"]
        rows = {
            pk: (pk, status, step)
            for pk, status, step in Job.objects.using(db)
            .filter(pk__in=wanted)
            .values_list("id", "status", "step")
        }
        found = {
            "upstream": [rows[i] for i in ids["depends_on"] if i in rows],
            "dependents": [rows[i] for i in ids["dependents"] if i in rows],
        }
        obj._pgq_neighbours = found  # type: ignore[attr-defined]
        return found

    @staticmethod
    def _job_links(jobs: list[tuple[int, str, str | None]]) -> str:
        if not jobs:
            return "—"
        links = format_html_join(
            "",
            '<li><a href="{}">job {}</a>{} {}</li>',
            (
                (
                    reverse("admin:pgqueue_job_change", args=[pk]),
                    pk,
                    f" ({step})" if step else "",
                    status_badge_html(status),
                )
                for pk, status, step in jobs
            ),
        )
        more, bound = "", workflow_reads.MAX_NEIGHBOURS_SHOWN
        if len(jobs) >= bound:
            more = format_html('<li class="pgq-more">(at most the first {} are listed)</li>', bound)
        return format_html(
            '<ul class="pgq-neighbours" style="margin:0;padding-left:1.2em">{}{}</ul>', links, more
        )

    @admin.display(description="workflow")
    def workflow_link(self, obj: Job) -> str:
        if obj.workflow_id is None:
            return "—"
        db = obj._state.db or queue_db()
        name = Workflow.objects.using(db).filter(pk=obj.workflow_id).values_list("name").first()
        name = name[0] if name else ""
        url = reverse("admin:pgqueue_workflow_change", args=[obj.workflow_id])
        label = f" ({name})" if name else ""
        return format_html('<a href="{}">workflow {}</a>{}', url, obj.workflow_id, label)

    @admin.display(description="depends on")
    def depends_on_links(self, obj: Job) -> str:
        """The jobs this one waits for: it runs once each has ended."""
        return self._job_links(self._neighbours(obj)["upstream"])

    @admin.display(description="dependents")
    def dependents_links(self, obj: Job) -> str:
        """The jobs that wait for this one."""
        return self._job_links(self._neighbours(obj)["dependents"])

    @admin.display(description="if a dependency fails")
    def upstream_failure(self, obj: Job) -> str:
        """What the job does when a dependency ends dead or cancelled, and which one
        cancelled it, if one did."""
        if obj.run_on_upstream_failure:
            text = "run: it runs however its dependencies end"
        else:
            text = "cancel: it is cancelled when a dependency ends dead or cancelled"
        if obj.failed_upstream_id is None:
            return text
        url = reverse("admin:pgqueue_job_change", args=[obj.failed_upstream_id])
        return format_html(
            '{}<br>Cancelled because <a href="{}">job {}</a> ended without success.',
            text,
            url,
            obj.failed_upstream_id,
        )

    @admin.display(description="tenant", ordering="tenant_id")
    def tenant_name(self, obj: Job) -> str:
        return obj.tenant_id

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Job) -> str:
        return status_badge_html(obj.status)

    @admin.display(description="attempts")
    def tries(self, obj: Job) -> str:
        tries = f"{obj.attempts}/{obj.max_attempts}"
        if obj.lost_claims:  # given back uncounted (JOB_REAP_EXPIRED): said, not hidden
            tries += f" (+{obj.lost_claims} lost before its start)"
        return tries

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: Job) -> str:
        return format_seconds((timezone.now() - obj.created_at).total_seconds())

    @admin.display(description="run time")
    def run_time(self, obj: Job) -> str:
        if obj.started_at is None:
            return "—"
        end = obj.finished_at or (timezone.now() if obj.status == Status.RUNNING else None)
        return format_seconds((end - obj.started_at).total_seconds()) if end else "—"

    @admin.display(description="payload")
    def payload_pretty(self, obj: Job) -> str:
        return pretty_json(obj.payload)

    @admin.display(description="progress")
    def progress_shown(self, obj: Job) -> str:
        """What its handler last reported (job.progress()): "3 / 10 (30 %) — note"."""
        return progress_text(obj.progress) or "—"

    @admin.display(description="output")
    def output_pretty(self, obj: Job) -> str:
        return "—" if obj.output is None else pretty_json(obj.output)

    @admin.display(description="result")
    def result_pretty(self, obj: Job) -> str:
        return "—" if obj.result is None else pretty_json(obj.result)

    @admin.action(description="Retry the selected dead or cancelled jobs", permissions=["change"])
    def retry_jobs(self, request: Any, queryset: QuerySet) -> None:
        ids = list(queryset.values_list("id", flat=True))
        report_changes(self, request, "Retried", services.retry_jobs(ids))

    @admin.action(
        description="Cancel the selected jobs (running ones are asked to stop)",
        permissions=["change"],
    )
    def cancel_jobs(self, request: Any, queryset: QuerySet) -> None:
        ids = list(queryset.values_list("id", flat=True))
        report_changes(self, request, "Cancelled", services.cancel_jobs(ids))

    @admin.action(description="Run the selected scheduled jobs now", permissions=["change"])
    def run_now(self, request: Any, queryset: QuerySet) -> None:
        ids = list(queryset.values_list("id", flat=True))
        report_changes(self, request, "Made runnable", services.run_jobs_now(ids))
