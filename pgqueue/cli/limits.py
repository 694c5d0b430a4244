"""Caps, rate limits and pause: ``queues`` (GET /queues, with the jobs' counts), ``limits``
(PUT /queues/<name>, PUT /tenants/<name>), ``pause`` and ``resume`` (their POSTs).

A scope is ``--queue Q`` (every tenant there), ``--tenant T`` (its jobs in every queue) or
``--tenant T --queue Q``. Changes go through ``pgqueue.limits``, which validates every value
as the HTTP API's does: what it refuses is a usage error (exit 2) naming the field.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandParser

from .. import limits, reads
from ..exceptions import InvalidJob
from ..limit_reads import queue_summaries
from ..models import Status
from ..services import NAME_RE
from . import documents, output
from .base import EXIT_OK, EXIT_USAGE, OperatorCommand, matching
from .tenants import tenant_document, tenant_table

#: What ``--max-running`` and ``--rate-limit`` take to remove a limit.
NONE_WORDS = ("none", "null", "off")


def queue_document(summary: dict[str, Any]) -> dict[str, Any]:
    """A queue as GET /queues/<name> shows it, and with ``jobs`` its counts by status when
    the summary has them (the ``queues`` listing)."""
    document = documents.queue(summary)
    if "jobs" in summary:
        document["jobs"] = {status: int(n) for status, n in summary["jobs"].items()}
    return document


def cap_label(running: int, max_running: int | None) -> str:
    """``3/10``: running of the cap, or the running count alone without a cap."""
    return f"{running}" if max_running is None else f"{running}/{max_running}"


def _queue_table(rows: Sequence[dict[str, Any]]) -> str:
    """Queues with their jobs' counts: each row needs ``jobs`` (``reads.job_counts``), so
    that a count never read cannot be shown as a zero."""

    def count(row: dict[str, Any], status: str) -> str:
        n = row["jobs"].get(status, 0)
        return f"{int(n) - 1}+" if isinstance(n, reads.BoundedCount) else str(n)

    return output.table(
        ["QUEUE", "SCHEDULED", "QUEUED", "RUNNING", "MAX RUNNING", "RATE LIMIT", "PAUSED",
         "DONE", "DEAD"],
        [
            [r["name"], count(r, Status.SCHEDULED), count(r, Status.QUEUED), r["running"],
             output.NONE if r["max_running"] is None else r["max_running"],
             r["rate_limit"] or output.NONE, "paused" if r["paused"] else "no",
             count(r, Status.DONE), count(r, Status.DEAD)]
            for r in rows
        ],
        right=(1, 2, 3, 4, 7, 8),
    )  # fmt: skip


def max_running_value(text: str) -> int | None:
    """An argparse type: an integer (the service checks its range) or "none"."""
    if text.strip().lower() in NONE_WORDS:
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer or none (no cap)") from None


max_running_value.__name__ = "max running"


def rate_value(text: str) -> str | None:
    """An argparse type: the rate as given ("10/s"; the service parses it) or "none"."""
    return None if text.strip().lower() in NONE_WORDS else text


rate_value.__name__ = "rate limit"


def scope_options(parser: CommandParser, *, tenant_help: str) -> None:
    parser.add_argument("--queue", type=matching(NAME_RE, "queue"), help="the queue")
    parser.add_argument("--tenant", type=matching(NAME_RE, "tenant"), help=tenant_help)


class ScopeCommand(OperatorCommand):
    """A command acting on one scope: ``--queue``, ``--tenant`` or both."""

    def scope(self, options: dict[str, Any]) -> tuple[str | None, str | None]:
        queue, tenant = options["queue"], options["tenant"]
        if queue is None and tenant is None:
            self.fail(EXIT_USAGE, "give --queue Q, --tenant T, or both")
        return queue, tenant

    def show(self, options: dict[str, Any], queue: str | None, tenant: str | None) -> int:
        """Print the scope as it is now: the tenant (its per-queue limits included) or the
        queue, as the HTTP API's answer to the same change (``--json``). The queue's table
        shows its jobs' counts as ``queues`` does: the one bounded read of them
        (JOB_COUNTS_BOUNDED) that ``queue_summaries`` makes for ``running`` anyway."""
        if tenant is not None:
            summary = reads.tenant_summaries([tenant], using=self.using)[0]
            self.emit(options, tenant_document(summary), lambda: tenant_table([summary]))
        else:
            counts = reads.job_counts(using=self.using)
            summary = queue_summaries([queue], counts=counts, using=self.using)[0]
            row = {**summary, "jobs": counts.get(queue, {})}
            self.emit(options, queue_document(summary), lambda: _queue_table([row]))
        return EXIT_OK


class QueuesCommand(OperatorCommand):
    name = "queues"
    help = (
        "Queues (with jobs or limits) by name: their jobs by status (done and dead counted "
        "up to COUNT_CAP), running, max_running, rate limit and pause."
    )

    def run(self, options: dict[str, Any]) -> int:
        counts = reads.job_counts(using=self.using)
        rows = [
            {**summary, "jobs": counts.get(summary["name"], {})}
            for summary in queue_summaries(counts=counts, using=self.using)
        ]
        document = {"count": len(rows), "results": [queue_document(r) for r in rows]}
        self.emit(options, document, lambda: _queue_table(rows) if rows else "no queues")
        return EXIT_OK


class LimitsCommand(ScopeCommand):
    name = "limits"
    help = (
        "Set a scope's concurrency cap and rate limit: --queue Q (every tenant's jobs there "
        "together), --tenant T (its jobs in every queue) or both (the tenant in that queue, "
        "on top of its own). 'none' removes a limit; an option left out keeps it. Takes "
        "effect at the next claim; running jobs are never stopped."
    )

    def add_options(self, parser: CommandParser) -> None:
        scope_options(parser, tenant_help="the tenant (with --queue: in that queue only)")
        parser.add_argument(
            "--max-running",
            type=max_running_value,
            default=limits.UNSET,
            help="most jobs of the scope running at once: 1 to 100000, or none",
        )
        parser.add_argument(
            "--rate-limit",
            type=rate_value,
            default=limits.UNSET,
            help='most starts per period: "N/s", "N/m" or "N/h", or none',
        )

    def run(self, options: dict[str, Any]) -> int:
        queue, tenant = self.scope(options)
        max_running, rate = options["max_running"], options["rate_limit"]
        if max_running is limits.UNSET and rate is limits.UNSET:
            self.fail(EXIT_USAGE, "give --max-running, --rate-limit or both")
        try:
            limits.set_limits(
                queue=queue, tenant=tenant, max_running=max_running, rate_limit=rate,
                using=self.using,
            )  # fmt: skip
        except InvalidJob as exc:
            self.fail(EXIT_USAGE, exc.detail)
        return self.show(options, queue, tenant)


class PauseCommand(ScopeCommand):
    name = "pause"
    pause = True
    help = (
        "Pause a queue (--queue Q), a tenant (--tenant T) or a tenant in one queue (both): "
        "no job of it starts from the next claim on; jobs keep arriving and wait, running "
        "ones finish."
    )

    def add_options(self, parser: CommandParser) -> None:
        scope_options(parser, tenant_help="the tenant (with --queue: in that queue only)")

    def run(self, options: dict[str, Any]) -> int:
        queue, tenant = self.scope(options)
        try:
            limits.set_limits(queue=queue, tenant=tenant, paused=self.pause, using=self.using)
        except InvalidJob as exc:
            self.fail(EXIT_USAGE, exc.detail)
        return self.show(options, queue, tenant)


class ResumeCommand(PauseCommand):
    name = "resume"
    pause = False
    help = "Resume what pause paused (the same --queue / --tenant): its jobs start again."


COMMANDS = [QueuesCommand, LimitsCommand, PauseCommand, ResumeCommand]
