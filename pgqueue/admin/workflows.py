"""Workflows: the list, newest first, with whether each still has an unfinished job, and a
workflow's page, which draws its graph.

The page is read-only: a workflow changes only through its jobs, and the one change
offered here, "Cancel workflow", calls ``services.cancel_workflow`` with the permission the
job list's cancel action needs (``change_job``). Its figures come from
``workflow_reads.describe`` (one read of the workflow's jobs, at most MAX_WORKFLOW_JOBS, and
one of their dependencies); the graph is an SVG drawn here on the server, no script.
A workflow of more than MAX_DRAWN jobs is listed as a table instead: a drawing of
thousands of boxes says less than its counts do.

The list reads one page of pgqueue_workflow (its primary key, or pgqueue_workflow_tenant_id
for a tenant) and, for the page's rows, whether each has a live job: one probe of the
partial index pgqueue_job_workflow_live per row, so finished workflows and their jobs cost
nothing however many are kept.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe

from .. import pages, services, workflow_reads
from ..conf import queue_db
from ..exceptions import JobNotFound
from ..models import FINISHED_STATUSES, LIVE_STATUSES, Job, Status, Workflow
from .common import EstimatedCountPaginator, report_changes, timestamp
from .jobs import STATUS_COLOURS, TenantFilter

DETAIL_TEMPLATE = "admin/pgqueue/workflow/detail.html"

#: Most jobs a workflow's page draws; past it the page shows the counts and a table.
MAX_DRAWN = 200
#: Most jobs the table of a large workflow lists (``manage.py pgqueue workflows show ID
#: --json`` lists them all).
MAX_LISTED = 1_000
#: Most dependencies a row of the table links to.
MAX_DEPENDENCIES_LISTED = 10

#: A workflow's status (``workflow_reads.status_of``) as its page colours it.
WORKFLOW_COLOURS = {
    "running": STATUS_COLOURS[Status.RUNNING],
    "done": STATUS_COLOURS[Status.DONE],
    "failed": STATUS_COLOURS[Status.DEAD],
    "cancelled": STATUS_COLOURS[Status.CANCELLED],
}

#: The order the page lists statuses in: a job's life, then how it ended.
STATUS_ORDER = (*LIVE_STATUSES, *FINISHED_STATUSES)


# -- the graph ---------------------------------------------------------------------------

#: A box's size, the gaps between boxes, and the height a passing edge takes in a column.
NODE_WIDTH = 180
NODE_HEIGHT = 58
LAYER_GAP = 56
ROW_GAP = 14
LANE_HEIGHT = 8
MARGIN = 12
#: Most waypoints the layout adds for edges that skip columns (past it, such edges are
#: drawn straight across: a dense graph would need one per edge and column).
MAX_WAYPOINTS = 1_000
#: Passes of the ordering that reduce crossings (down, up, down, ...).
ORDER_SWEEPS = 4


@dataclass(eq=False)
class Placed:
    """A box of the graph, or a waypoint (``job`` None) of an edge that skips a column:
    its column, its place in the column, and where it is drawn."""

    job: workflow_reads.WorkflowJob | None
    layer: int
    key: int  # the job's id, or the id of the job a waypoint's edge leads to
    before: list[Placed] = field(default_factory=list)  # linked items of the column before
    after: list[Placed] = field(default_factory=list)  # and of the column after
    row: int = 0
    x: float = 0.0
    y: float = 0.0

    @property
    def height(self) -> int:
        return NODE_HEIGHT if self.job is not None else LANE_HEIGHT


@dataclass
class Layout:
    columns: list[list[Placed]]
    boxes: dict[int, Placed]
    #: Each drawn edge (from, to) with the points it passes through, left to right.
    edges: list[tuple[int, int, list[Placed]]]
    width: int
    height: int


def layers(jobs: list[workflow_reads.WorkflowJob]) -> dict[int, int]:
    """Each job's layer: 0 for a job with no dependency in the workflow, else one more than
    its deepest dependency's. ``jobs`` come dependencies first (a dependency's id is always
    the smaller), so one pass settles them all; a dependency on a job outside the workflow
    does not count."""
    layer: dict[int, int] = {}
    for job in jobs:
        deps = [layer[u] for u in job.depends_on if u in layer]
        layer[job.id] = 1 + max(deps) if deps else 0
    return layer


def place(jobs: list[workflow_reads.WorkflowJob]) -> Layout:
    """The jobs in columns by layer (dependencies on the left). An edge that skips columns
    passes through a waypoint in each, so that it runs between boxes, not under them.
    Each column is ordered by the mean place of what it is linked to in the column before
    (then after, and again: a few sweeps), which keeps crossings few; then the columns are
    centred on the tallest."""
    depth = layers(jobs)
    columns: list[list[Placed]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    boxes: dict[int, Placed] = {}
    for job in jobs:
        boxes[job.id] = Placed(job, depth[job.id], job.id)
        columns[depth[job.id]].append(boxes[job.id])
    skips = sum(
        max(depth[j.id] - depth[u] - 1, 0) for j in jobs for u in j.depends_on if u in depth
    )
    edges: list[tuple[int, int, list[Placed]]] = []
    for job in jobs:
        target = boxes[job.id]
        for upstream in job.depends_on:
            source = boxes.get(upstream)
            if source is None:
                continue
            route = [source]
            if skips <= MAX_WAYPOINTS:
                for layer in range(source.layer + 1, target.layer):
                    waypoint = Placed(None, layer, job.id)
                    columns[layer].append(waypoint)
                    route.append(waypoint)
            route.append(target)
            for a, b in itertools.pairwise(route):
                a.after.append(b)
                b.before.append(a)
            edges.append((upstream, job.id, route))
    for column in columns:  # the first order: by id, waypoints after the boxes they reach
        column.sort(key=lambda p: (p.key, p.job is None))
        for row, item in enumerate(column):
            item.row = row
    for sweep in range(ORDER_SWEEPS):
        down = sweep % 2 == 0
        order = columns[1:] if down else columns[-2::-1]
        for column in order:

            def mean(item: Placed, down: bool = down) -> tuple[float, int]:
                linked = item.before if down else item.after
                if not linked:
                    return (float(item.row), item.key)
                return (sum(p.row for p in linked) / len(linked), item.key)

            column.sort(key=mean)
            for row, item in enumerate(column):
                item.row = row
    heights = [sum(p.height for p in c) + ROW_GAP * max(len(c) - 1, 0) for c in columns]
    tallest = max(heights, default=0)
    for layer, column in enumerate(columns):
        y = MARGIN + (tallest - heights[layer]) / 2
        for item in column:
            item.x = MARGIN + layer * (NODE_WIDTH + LAYER_GAP)
            item.y = y
            y += item.height + ROW_GAP
    width = 2 * MARGIN + len(columns) * NODE_WIDTH + max(len(columns) - 1, 0) * LAYER_GAP
    return Layout(columns, boxes, edges, width, 2 * MARGIN + tallest)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _edge_path(route: list[Placed]) -> str:
    """An edge from the right side of its first box to the left side of its last, through
    its waypoints: a curve across each gap between columns, a line across each column."""
    first, last = route[0], route[-1]
    x, y = first.x + NODE_WIDTH, first.y + first.height / 2
    d = [f"M {x:g} {y:g}"]
    for point in route[1:]:
        x2 = point.x - 2 if point is last else point.x
        y2 = point.y + point.height / 2
        bend = (x2 - x) / 2
        d.append(f"C {x + bend:g} {y:g}, {x2 - bend:g} {y2:g}, {x2:g} {y2:g}")
        x, y = x2, y2
        if point is not last:
            x += NODE_WIDTH
            d.append(f"L {x:g} {y:g}")
    return " ".join(d)


def graph_svg(view: workflow_reads.WorkflowView, job_url: Callable[[int], str]) -> str:
    """The workflow as an SVG: a box per job in its status's colour, linking to
    ``job_url(id)``, and an arrow from each dependency to the job that waits for it. Every
    text in it is escaped."""
    layout = place(view.jobs)
    width, height = layout.width, layout.height
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="pgq-graph" id="pgq-workflow-graph" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(_graph_label(view))}" font-family="sans-serif">',
        '<defs><marker id="pgq-arrow" viewBox="0 0 10 10" refX="9" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M 0 0 L 10 5 L 0 10 z" fill="#8a8a8a" class="pgq-arrow"/></marker></defs>',
    ]
    for upstream, job_id, route in layout.edges:  # edges first: boxes cover their ends
        parts.append(
            f'<path class="pgq-edge" data-from="{upstream}" data-to="{job_id}" '
            f'd="{_edge_path(route)}" fill="none" stroke="#8a8a8a" stroke-width="1.5" '
            'marker-end="url(#pgq-arrow)"/>'
        )
    for node in layout.boxes.values():
        job = node.job
        assert job is not None
        step = job.step if job.step is not None else f"job {job.id}"
        colour = STATUS_COLOURS.get(job.status, "#333")
        title = f"job {job.id}: step {step}, task {job.task}, {job.status}"
        if job.last_error:
            title += f"\n{job.last_error.strip().splitlines()[-1][:200]}"
        x, y = node.x, node.y
        parts.append(
            f'<a href="{escape(job_url(job.id))}" class="pgq-node" data-job="{job.id}" '
            f'data-step="{escape(step)}" data-status="{escape(job.status)}">'
            f"<title>{escape(title)}</title>"
            f'<rect x="{x:g}" y="{y:g}" width="{NODE_WIDTH}" height="{NODE_HEIGHT}" rx="7" '
            f'fill="{colour}"/>'
            f'<text x="{x + 10:g}" y="{y + 19:g}" fill="#fff" font-size="13" '
            f'font-weight="bold">{escape(_cut(step, 21))}</text>'
            f'<text x="{x + 10:g}" y="{y + 35:g}" fill="#fff" font-size="11">'
            f"{escape(_cut(job.task, 27))}</text>"
            f'<text x="{x + 10:g}" y="{y + 50:g}" fill="#fff" font-size="11" '
            f'font-style="italic">{escape(job.status)} · job {job.id}</text></a>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _graph_label(view: workflow_reads.WorkflowView) -> str:
    counts = ", ".join(f"{n} {s}" for s in STATUS_ORDER if (n := view.counts.get(s, 0)))
    return f"Workflow {view.id}: {len(view.jobs)} jobs ({counts})"


# -- the admin ---------------------------------------------------------------------------


@admin.register(Workflow)
class WorkflowAdmin(admin.ModelAdmin):
    list_display = ["id", "workflow_name", "tenant_name", "created", "state"]
    list_display_links = ["id", "workflow_name"]
    list_filter = [TenantFilter]
    search_fields = ["name"]
    ordering = ["-id"]
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    # Counts by tenant would count every workflow kept.
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 50

    @property
    def search_help_text(self) -> str:  # type: ignore[override]
        return (
            "A workflow id (any workflow, however old), or part of a name among the newest "
            f"{pages.list_window():,} workflows (of the tenant filtered on)."
        )

    created = timestamp("created_at")

    # -- who may do what -------------------------------------------------------------------

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Its own view permission, or the job's: a workflow's page shows jobs, and who
        may see jobs may see how they hang together."""
        user = request.user
        return super().has_view_permission(request, obj) or any(
            user.has_perm(f"{Job._meta.app_label}.{get_permission_codename(a, Job._meta)}")
            for a in ("view", "change")
        )

    # Workflows are enqueued from code or the HTTP API and change through their jobs.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @staticmethod
    def may_cancel(request: HttpRequest) -> bool:
        """What the job list's cancel action asks: the change permission of jobs."""
        codename = get_permission_codename("change", Job._meta)
        return request.user.has_perm(f"{Job._meta.app_label}.{codename}")

    # -- the list --------------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).using(queue_db())

    def get_search_results(self, request: Any, queryset: QuerySet, term: str) -> Any:
        """A number that is a workflow's id finds that workflow however old; otherwise a
        part of a name, among the newest LIST_WINDOW workflows (of the tenant filtered on),
        so that no search reads every workflow kept."""
        in_reach = Workflow.objects.using(queue_db())
        if request.GET.get("tenant"):
            in_reach = in_reach.filter(tenant_id=request.GET["tenant"])
        term = term.strip()
        if not term:
            return queryset, False
        if term.isdigit() and len(term) <= 18 and in_reach.filter(pk=int(term)).exists():
            return queryset.filter(pk=int(term)), False
        edge = pages.window_edge(in_reach, key=None, backward=False)
        queryset, duplicates = super().get_search_results(request, queryset, term)
        return queryset.filter(Q() if edge is None else Q(id__gte=edge)), duplicates

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The list, with whether each workflow of the page still has an unfinished job:
        one read for the page (a probe of pgqueue_job_workflow_live per row)."""
        changelist = super().get_changelist_instance(request)
        rows = list(changelist.result_list)
        live_jobs = Job.objects.filter(workflow_id=OuterRef("pk"), status__in=LIVE_STATUSES)
        live = set(
            Workflow.objects.using(queue_db())
            .filter(pk__in=[w.pk for w in rows])
            .filter(Exists(live_jobs))
            .values_list("id", flat=True)
        )
        for workflow in rows:
            workflow.pgq_live = workflow.pk in live
        return changelist

    @admin.display(description="name", ordering="name")
    def workflow_name(self, obj: Workflow) -> str:
        return obj.name or "—"

    @admin.display(description="tenant", ordering="tenant_id")
    def tenant_name(self, obj: Workflow) -> str:
        return obj.tenant_id

    @admin.display(description="state")
    def state(self, obj: Workflow) -> str:
        """ "live" while any job is unfinished, else "finished" (how it ended is on its page:
        the list reads no finished job)."""
        live = getattr(obj, "pgq_live", None)
        if live is None:
            return "—"
        label, colour = ("live", STATUS_COLOURS[Status.QUEUED]) if live else ("finished", "#6c757d")
        return format_html(
            '<span class="pgq-live" data-live="{}" style="background:{};color:#fff;padding:2px 8px;'
            'border-radius:10px;font-size:11px;font-weight:600">{}</span>',
            "true" if live else "false",
            colour,
            label,
        )

    # -- a workflow's page -----------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        # Before the admin's own: its "<path:object_id>/" would take it too.
        cancel = path(
            "<int:workflow_id>/cancel/",
            self.admin_site.admin_view(self.cancel_view),
            name="pgqueue_workflow_cancel",
        )
        return [cancel, *super().get_urls()]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """The workflow's page: its status, its jobs' counts by status, its graph (or a
        table past MAX_DRAWN jobs), and "Cancel workflow" while it has unfinished jobs."""
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        if not self.has_view_permission(request):
            raise PermissionDenied
        view = None
        if object_id.isdigit() and len(object_id) <= 18:
            view = workflow_reads.describe(int(object_id), using=queue_db())
        if view is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)

        def job_url(job_id: int) -> str:
            return reverse("admin:pgqueue_job_change", args=[job_id])

        drawn = len(view.jobs) <= MAX_DRAWN
        listed = view.jobs if drawn else view.jobs[:MAX_LISTED]
        context = {
            **self.admin_site.each_context(request),
            **(extra_context or {}),
            "opts": self.opts,
            "title": f"Workflow {view.id}" + (f": {view.name}" if view.name else ""),
            "workflow": view,
            "status_colour": WORKFLOW_COLOURS.get(view.status, "#333"),
            "counts": [
                {"status": s, "n": view.counts.get(s, 0), "colour": STATUS_COLOURS[s]}
                for s in STATUS_ORDER
            ],
            "total": len(view.jobs),
            "drawn": drawn,
            "max_drawn": MAX_DRAWN,
            "graph": mark_safe(graph_svg(view, job_url)) if drawn else None,  # escaped inside
            "rows": [_row(job, job_url) for job in listed],
            "listed_all": len(listed) == len(view.jobs),
            "can_cancel": view.status == "running" and self.may_cancel(request),
            "cancel_url": reverse("admin:pgqueue_workflow_cancel", args=[view.id]),
        }
        return TemplateResponse(request, DETAIL_TEMPLATE, context)

    def cancel_view(self, request: HttpRequest, workflow_id: int) -> HttpResponse:
        """ "Cancel workflow": POST only (the admin wraps this view in csrf_protect), with
        the permission the job list's cancel action needs; ``services.cancel_workflow``
        cancels the unfinished jobs and asks the running ones to stop."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.may_cancel(request):
            raise PermissionDenied
        try:
            result = services.cancel_workflow(workflow_id, using=queue_db())
        except JobNotFound as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(reverse("admin:pgqueue_workflow_changelist"))
        report_changes(self, request, "Cancelled", result)
        return HttpResponseRedirect(reverse("admin:pgqueue_workflow_change", args=[workflow_id]))


def _row(job: workflow_reads.WorkflowJob, job_url: Callable[[int], str]) -> dict[str, Any]:
    """A job of the table: its links, and those of its first dependencies."""
    return {
        "id": job.id,
        "url": job_url(job.id),
        "step": job.step,
        "task": job.task,
        "status": job.status,
        "colour": STATUS_COLOURS.get(job.status, "#333"),
        "depends_on": [
            {"id": u, "url": job_url(u)} for u in job.depends_on[:MAX_DEPENDENCIES_LISTED]
        ],
        "more_dependencies": max(len(job.depends_on) - MAX_DEPENDENCIES_LISTED, 0),
    }
