"""Tenants: ``tenants`` (GET /tenants' page) and ``weight`` (PUT /tenants/<name>)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandParser

from .. import reads, services
from ..exceptions import InvalidJob
from . import documents, output
from .base import EXIT_OK, EXIT_USAGE, MAX_ID, OperatorCommand, bounded_int, limit_option


def tenant_document(summary: dict[str, Any]) -> dict[str, Any]:
    """A tenant as GET /tenants/<name> shows it (without DRF: pgqueue.cli.documents)."""
    return documents.tenant(summary)


def _weights(row: dict[str, Any]) -> str:
    return ", ".join(f"{q}={w:g}" for q, w in sorted(row["queue_weights"].items())) or output.NONE


def _limits(limits: dict[str, Any]) -> str:
    """One scope's limits, compactly: ``max 3, 10/m, paused`` (``-``: none)."""
    parts = []
    if limits.get("max_running") is not None:
        parts.append(f"max {limits['max_running']}")
    if limits.get("rate_limit"):
        parts.append(limits["rate_limit"])
    if limits.get("paused"):
        parts.append("paused")
    return ", ".join(parts) or output.NONE


def _queue_limits(row: dict[str, Any]) -> str:
    """Per-queue limits: ``reports=[max 1, 10/m; running 1]``."""
    return (
        "; ".join(
            f"{q}=[{_limits(lim)}; running {lim.get('running', 0)}]"
            for q, lim in sorted(row.get("queue_limits", {}).items())
        )
        or output.NONE
    )


def tenant_table(rows: Sequence[dict[str, Any]]) -> str:
    """Tenants as ``tenants`` prints them: weights, counts, and limits (its own and per
    queue), as GET /tenants shows them."""
    none = output.NONE
    return output.table(
        ["NAME", "WEIGHT", "QUEUE WEIGHTS", "BACKLOG", "RUNNING", "MAX RUNNING", "RATE LIMIT",
         "PAUSED", "DONE", "DEAD", "QUEUE LIMITS", "CREATED (UTC)"],
        [
            [r["name"], f"{r['weight']:g}", _weights(r), r["backlog"], r["running"],
             none if r.get("max_running") is None else r["max_running"],
             r.get("rate_limit") or none, "paused" if r.get("paused") else "no", r["done"],
             r["dead"], _queue_limits(r), output.when(r["created_at"])]
            for r in rows
        ],
        right=(1, 3, 4, 5, 8, 9),
    )  # fmt: skip


class TenantsCommand(OperatorCommand):
    name = "tenants"
    help = (
        "Tenants by name, with their weights, job counts (backlog = queued + scheduled) and "
        "limits (max_running, rate limit, pause; per queue too), a page of --limit from "
        "--offset."
    )

    def add_options(self, parser: CommandParser) -> None:
        limit_option(parser, "tenants")
        parser.add_argument(
            "--offset", type=bounded_int(0, MAX_ID), default=0, help="tenants to skip, by name"
        )

    def run(self, options: dict[str, Any]) -> int:
        limit, offset = options["limit"], options["offset"]
        count, rows = reads.tenant_page(offset=offset, limit=limit, using=self.using)
        document = {"count": count, "results": [tenant_document(r) for r in rows]}

        def human() -> str:
            if not rows:
                return "no tenants" if count == 0 else f"no tenants past {offset} (of {count})"
            shown = f"tenants {offset + 1}-{offset + len(rows)} of {count}"
            return f"{tenant_table(rows)}\n({shown})"

        self.emit(options, document, human)
        return EXIT_OK


class WeightCommand(OperatorCommand):
    name = "weight"
    help = (
        "Set a tenant's weight in every queue, or with --queue in that queue only; creates "
        "the tenant if new. Applies to jobs that become runnable from now on."
    )

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="the tenant's name")
        parser.add_argument("weight", type=float, help="the weight, > 0")
        parser.add_argument("--queue", help="set the weight in this queue only")

    def run(self, options: dict[str, Any]) -> int:
        tenant = options["tenant"]
        try:
            services.set_tenant_weight(
                tenant, options["weight"], queue=options["queue"], using=self.using
            )
        except InvalidJob as exc:
            self.fail(EXIT_USAGE, exc.detail)
        summary = reads.tenant_summaries([tenant], using=self.using)[0]
        self.emit(options, tenant_document(summary), lambda: tenant_table([summary]))
        return EXIT_OK


COMMANDS = [TenantsCommand, WeightCommand]
