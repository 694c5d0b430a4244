"""Workflows: ``workflows list`` (newest first, whether each still has unfinished jobs),
``workflows show ID`` (its status, and each job with its step, status and dependencies)
and ``workflows cancel ID`` (``services.cancel_workflow``, as the admin's button and
DELETE /workflows/<id> do).

The reads are ``pgqueue.workflow_reads``': a page of workflows with one probe of the live
jobs' index per row, and one workflow's jobs (at most MAX_WORKFLOW_JOBS) with their edges.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser

from .. import services, workflow_reads
from ..exceptions import JobNotFound
from ..models import FINISHED_STATUSES, LIVE_STATUSES
from . import output
from .base import (
    EXIT_CODES_HELP,
    EXIT_OK,
    EXIT_SKIPPED,
    MAX_ID,
    OperatorCommand,
    bounded_int,
    limit_option,
    matching,
)

workflow_id = bounded_int(1, MAX_ID)
workflow_id.__name__ = "workflow id"

#: The order statuses are listed in: a job's life, then how it ended.
STATUS_ORDER = (*LIVE_STATUSES, *FINISHED_STATUSES)


def summary_document(row: workflow_reads.WorkflowSummary) -> dict[str, Any]:
    """A workflow of the list, as GET /workflows lists it."""
    return {
        "id": row.id,
        "tenant": row.tenant,
        "name": row.name,
        "created_at": row.created_at,
        "live": row.live,
    }


class WorkflowsCommand(OperatorCommand):
    name = "workflows"
    help = (
        "Workflows: `list` them newest first (--tenant, --limit, --before), `show ID` (its "
        "status and each job's step, status and dependencies), `cancel ID` (its unfinished "
        "jobs; running ones are asked to stop)."
    )

    def add_options(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(
            dest="action", metavar="ACTION", title="actions", required=True
        )
        listing = actions.add_parser(
            "list",
            help="workflows newest first, and whether each has unfinished jobs",
            description="Workflows newest first (of --tenant), at most --limit; each says "
            "whether it is live (has an unfinished job) or finished.",
        )
        listing.add_argument(
            "--tenant", type=matching(services.NAME_RE, "tenant"), help="only this tenant's"
        )
        limit_option(listing, "workflows")
        listing.add_argument(
            "--before",
            type=workflow_id,
            metavar="ID",
            help="only workflows with a smaller id: the next page after the last id shown",
        )
        show = actions.add_parser(
            "show",
            help="one workflow: its status and its jobs with their dependencies",
            description="One workflow, as GET /workflows/<id> shows it: its status, its "
            "jobs' counts by status, and each job (dependencies first) with its step, task, "
            "status and the jobs it depends on.",
        )
        show.add_argument("id", type=workflow_id, help="the workflow's id")
        cancel = actions.add_parser(
            "cancel",
            help="cancel its unfinished jobs (running ones are asked to stop)",
            description="Cancel every unfinished job of the workflow, as the admin's Cancel "
            "workflow button does: waiting, scheduled and queued jobs end cancelled, running "
            "ones are asked to stop. Exit 0 when the workflow exists (even if nothing was "
            "left to cancel), 1 when it does not.",
        )
        cancel.add_argument("id", type=workflow_id, help="the workflow's id")
        for sub in (listing, show, cancel):
            sub.epilog = EXIT_CODES_HELP
            # Also after the action (``workflows list --json``); given before it, its value
            # stands (SUPPRESS: an absent option does not overwrite it).
            sub.add_argument(
                "--json",
                action="store_true",
                default=argparse.SUPPRESS,
                help="print one JSON document on stdout, for scripts",
            )
            sub.add_argument(
                "--database",
                choices=list(settings.DATABASES),
                default=argparse.SUPPRESS,
                help='the database alias (default: PGQUEUE["DATABASE"])',
            )

    def run(self, options: dict[str, Any]) -> int:
        return {"list": self._list, "show": self._show, "cancel": self._cancel}[options["action"]](
            options
        )

    def _list(self, options: dict[str, Any]) -> int:
        limit = options["limit"]
        rows = workflow_reads.page(
            tenant=options["tenant"], before=options["before"], limit=limit + 1, using=self.using
        )
        more = len(rows) > limit
        rows = rows[:limit]
        document = {
            "results": [summary_document(r) for r in rows],
            "limit": limit,
            "more": more,
            "next_before": rows[-1].id if more else None,
        }
        self.emit(options, document, lambda: _list_table(rows, more))
        return EXIT_OK

    def _show(self, options: dict[str, Any]) -> int:
        view = workflow_reads.describe(options["id"], using=self.using)
        if view is None:
            self.warn(f"workflow {options['id']} does not exist")
            return EXIT_SKIPPED
        self.emit(options, workflow_reads.as_dict(view), lambda: _workflow_page(view))
        return EXIT_OK

    def _cancel(self, options: dict[str, Any]) -> int:
        try:
            result = services.cancel_workflow(options["id"], using=self.using)
        except JobNotFound as exc:
            self.warn(str(exc))
            return EXIT_SKIPPED
        skipped = [
            {"id": i, "status": result.statuses.get(i), "reason": reason}
            for i, reason in result.skipped.items()
        ]
        document = {
            "id": options["id"],
            "cancelled": result.changed,
            "cancelling": result.requested,
            "skipped": skipped,
        }

        def human() -> str:
            n = len(result.changed)
            lines = [
                f"cancelled {n} job{'s' * (n != 1)} of workflow {options['id']}: "
                + (", ".join(str(i) for i in result.changed) or output.NONE)
            ]
            if result.requested:
                asked = ", ".join(str(i) for i in result.requested)
                lines.append(f"asked {len(result.requested)} running to stop: {asked}")
            if not result.changed and not result.requested and not result.skipped:
                lines.append("(nothing was left to cancel: every job of it had ended)")
            return "\n".join(lines)

        self.emit(options, document, human)
        if not options["json"]:
            for reason in result.skipped.values():  # ended meanwhile
                self.warn(f"skipped: {reason}")
        return EXIT_OK


def _list_table(rows: Sequence[workflow_reads.WorkflowSummary], more: bool) -> str:
    if not rows:
        return "no workflows"
    text = output.table(
        ["ID", "NAME", "TENANT", "CREATED (UTC)", "STATE"],
        [
            [r.id, r.name or output.NONE, r.tenant, output.when(r.created_at),
             "live" if r.live else "finished"]
            for r in rows
        ],
        right=(0,),
    )  # fmt: skip
    if more:
        text += f"\n(more: --before {rows[-1].id} shows the next page)"
    return text


def _workflow_page(view: workflow_reads.WorkflowView) -> str:
    counts = ", ".join(f"{n} {s}" for s in STATUS_ORDER if (n := view.counts.get(s, 0)))
    fields = [
        ("id", view.id),
        ("name", view.name or output.NONE),
        ("tenant", view.tenant),
        ("status", view.status),
        ("created", output.when(view.created_at)),
        ("jobs", f"{len(view.jobs)}" + (f" ({counts})" if counts else "")),
    ]
    width = max(len(label) for label, _ in fields)
    lines = [f"{label + ':':<{width + 1}} {value}" for label, value in fields]
    steps = {j.id: j.step for j in view.jobs}

    def dependency(upstream: int) -> str:
        """A dependency by its step's name; by its id when it is not of the workflow."""
        step = steps.get(upstream)
        return step if step is not None else f"job {upstream}"

    lines.append("")
    if not view.jobs:
        lines.append("no jobs")
        return "\n".join(lines)
    lines.append("jobs (dependencies first; times in UTC):")
    lines.append(
        output.table(
            ["ID", "STEP", "TASK", "STATUS", "DEPENDS ON", "FINISHED", "LAST ERROR"],
            [
                [
                    j.id,
                    j.step or output.NONE,
                    j.task,
                    j.status,
                    ",".join(dependency(u) for u in j.depends_on) or output.NONE,
                    output.when(j.finished_at),
                    output.short(j.last_error, 50),
                ]
                for j in view.jobs
            ],
            right=(0,),
        )
    )
    if view.edges_truncated:
        lines.append(
            f"(more than {workflow_reads.MAX_EDGES_SHOWN:,} dependencies: not all are shown)"
        )
    return "\n".join(lines)


COMMANDS = [WorkflowsCommand]
