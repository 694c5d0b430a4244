"""Periodic schedules: ``periodic`` (list them), ``periodic-enable`` and ``periodic-disable``.

Schedules are declared in code or created in the admin; these commands never add, change
or delete one, only turn it on or off, through ``pgqueue.schedules.set_periodic_enabled``,
as the admin's actions do. A schedule's cadence is listed as its cron expression or as
``every 5m`` (an interval); ``--json`` gives ``cron`` or ``every_seconds`` (the other null).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import CommandParser

from .. import pages
from ..schedules import SCHEDULE_NAME_RE, ScheduleNotFound, format_every, set_periodic_enabled
from . import output
from .base import EXIT_OK, EXIT_SKIPPED, OperatorCommand, limit_option, matching


class PeriodicCommand(OperatorCommand):
    name = "periodic"
    help = (
        "Periodic schedules by name: cron or interval, time zone, task, next and last run, on "
        "or off, and whether code or the admin defines each."
    )

    def add_options(self, parser: CommandParser) -> None:
        limit_option(parser, "schedules")

    def run(self, options: dict[str, Any]) -> int:
        rows = [_document(r) for r in pages.periodic_schedules(options["limit"], using=self.using)]

        def human() -> str:
            if not rows:
                return (
                    "no periodic schedules (they are declared in code and synced by runworker, "
                    "or created in the admin)"
                )
            return output.table(
                ["NAME", "SCHEDULE", "TIME ZONE", "TASK", "TENANT", "QUEUE", "STATE",
                 "NEXT RUN (UTC)", "LAST RUN (UTC)", "LAST JOB", "DEFINED IN"],
                [
                    [r["name"], _cadence(r), _zone(r), r["task"], r["tenant"], r["queue"],
                     _state(r), output.when(r["next_run_at"]), output.when(r["last_run_at"]),
                     r["last_job_id"] or "", r["source"]]
                    for r in rows
                ],
                right=(9,),
            )  # fmt: skip

        self.emit(options, {"results": rows, "limit": options["limit"]}, human)
        return EXIT_OK


def _document(row: dict[str, Any]) -> dict[str, Any]:
    """A schedule as ``--json`` gives it: the interval in whole seconds."""
    every = row.pop("every")
    return {**row, "every_seconds": None if every is None else int(every.total_seconds())}


def _cadence(row: dict[str, Any]) -> str:
    if row["every_seconds"] is None:
        return row["cron"]
    return f"every {format_every(dt.timedelta(seconds=row['every_seconds']))}"


def _zone(row: dict[str, Any]) -> str:
    return output.NONE if row["every_seconds"] is not None else row["timezone"]


def _state(row: dict[str, Any]) -> str:
    if row["removed_at"] is not None:
        return "removed from code"
    return "enabled" if row["enabled"] else "disabled"


class _Switch(OperatorCommand):
    enabled = True

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="+", type=matching(SCHEDULE_NAME_RE, "schedule"))

    def run(self, options: dict[str, Any]) -> int:
        changed, unchanged, missing = [], [], []
        for name in options["names"]:
            try:
                did = set_periodic_enabled(name, self.enabled, using=self.using)
            except ScheduleNotFound:
                missing.append(name)
                continue
            (changed if did else unchanged).append(name)
        verb = "enabled" if self.enabled else "disabled"
        for name in missing:
            self.warn(f"no periodic schedule is named {name!r}")
        self.emit(
            options,
            {"changed": changed, "unchanged": unchanged, "missing": missing},
            lambda: (
                f"{verb}: {', '.join(changed) or 'none'}"
                + (f"; already {verb}: {', '.join(unchanged)}" if unchanged else "")
            ),
        )
        return EXIT_SKIPPED if missing else EXIT_OK


class PeriodicEnableCommand(_Switch):
    name = "periodic-enable"
    help = (
        "Turn periodic schedules on (from their next tick; the time they were off is not missed)."
    )
    enabled = True


class PeriodicDisableCommand(_Switch):
    name = "periodic-disable"
    help = "Turn periodic schedules off until enabled again; a deploy does not re-enable them."
    enabled = False


COMMANDS = [PeriodicCommand, PeriodicEnableCommand, PeriodicDisableCommand]
