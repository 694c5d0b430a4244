"""The whole queue: ``workers`` (the registry: alive, stale, stopped) and ``stats`` (what
GET /stats shows)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser
from django.utils import timezone

from .. import liveness, reads
from ..models import Status
from . import output
from .base import EXIT_OK, OperatorCommand, limit_option


class WorkersCommand(OperatorCommand):
    name = "workers"
    help = (
        "Worker processes, the alive ones first: alive (seen within a lease), stale (silent "
        "longer, its leases lost) or stopped, with the counts of each."
    )

    def add_options(self, parser: CommandParser) -> None:
        limit_option(parser, "workers")

    def run(self, options: dict[str, Any]) -> int:
        overview = liveness.workers_overview(timezone.now(), options["limit"], using=self.using)
        rows = overview.pop("rows")
        document = {**overview, "results": rows}

        def human() -> str:
            counts = (
                f"{overview['alive']} alive, {overview['stale']} stale, "
                f"{overview['stopped']} stopped (alive: seen within "
                f"{overview['lease_seconds']:g}s)"
            )
            if not rows:
                return counts
            listed = output.table(
                ["ID", "HOST", "PID", "QUEUES", "CONCURRENCY", "STATE", "LAST SEEN (UTC)",
                 "STOPPED (UTC)"],
                [
                    [w["id"], w["host"], w["pid"], ",".join(w["queues"]), w["concurrency"],
                     w["state"], output.when(w["last_seen_at"]), output.when(w["stopped_at"])]
                    for w in rows
                ],
                right=(2, 4),
            )  # fmt: skip
            more = len(rows) < overview["total"]
            return f"{listed}\n{counts}" + (f"; {len(rows)} of {overview['total']} shown" * more)

        self.emit(options, document, human)
        return EXIT_OK


class StatsCommand(OperatorCommand):
    name = "stats"
    help = "What GET /stats shows: jobs by queue and status, and the last minute's throughput."

    def run(self, options: dict[str, Any]) -> int:
        stats = reads.stats(using=self.using)

        def human() -> str:
            statuses = list(Status.values)
            lines = []
            if stats["queues"]:
                lines.append(
                    output.table(
                        ["QUEUE", *(s.upper() for s in statuses)],
                        [
                            [queue, *(counts.get(s, 0) for s in statuses)]
                            for queue, counts in stats["queues"].items()
                        ],
                        right=range(1, len(statuses) + 1),
                    )
                )
            else:
                lines.append("no jobs")
            mean = stats["mean_run_seconds_60s"]
            lines += [
                "",
                f"throughput (60s):    {stats['throughput_per_s_60s']:g} jobs/s",
                f"error rate (60s):    {stats['error_rate_60s'] * 100:g}%",
                f"mean run time (60s): {output.NONE if mean is None else f'{mean:g}s'}",
                f"workers alive:       {stats['workers_alive']}",
                f"dead jobs:           {stats['dead']}",
            ]
            return "\n".join(lines)

        self.emit(options, stats, human)
        return EXIT_OK


COMMANDS = [WorkersCommand, StatsCommand]
