"""``manage.py pgqueue prune [--dry-run]``: remove finished jobs past their retention now.

Also ``manage.py pgqueue_prune``, its alias (pgqueue/management/commands/pgqueue_prune.py).
Maintenance already does this a few batches at a time; the command is for an operator who
has just shortened ``RETENTION``, or turned retention on over a table of a year's jobs, and
wants the backlog gone now. It runs the same statement until nothing is left, each batch
in its own transaction, so it never holds a long transaction however much it removes.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connections

from .. import prune_store
from ..conf import pgqueue_settings, queue_db
from ..worker.maintenance import prune_finished_jobs

#: --dry-run counts at most this many jobs per status, and prints "N+" beyond it.
DRY_RUN_CAP = 100_000


class PruneCommand(BaseCommand):
    #: The subcommand's name: ``manage.py pgqueue prune``.
    name = "prune"
    help = (
        "Delete finished jobs older than PGQUEUE RETENTION (per status) with their attempt "
        "rows, in batches of PRUNE_BATCH_SIZE, each its own transaction, until none is left; "
        "print what was removed. --dry-run prints what would be removed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help=f"count what would be removed (at most {DRY_RUN_CAP:,} jobs per status)",
        )
        parser.add_argument(
            "--database", default=None, help='database alias (default: PGQUEUE["DATABASE"])'
        )

    def handle(self, *args: Any, dry_run: bool, database: str | None, **options: Any) -> None:
        from ..checks import require_postgresql

        database = queue_db(database)
        require_postgresql(database)
        connection = connections[database]
        retention = pgqueue_settings.retention_seconds
        kept = [s for s, keep in retention.items() if keep is None]
        if dry_run:
            lines = self._count(connection, retention)
            verb = "would remove"
        else:
            connection.ensure_connection()
            removed = prune_finished_jobs(connection.connection, max_batches=0)
            lines = [(s, str(r.jobs), str(r.attempts)) for s, r in removed.items()]
            verb = "removed"
        for status, jobs, attempts in lines:
            self.stdout.write(f"{verb} {jobs} {status} jobs, {attempts} attempts")
        for status in kept:
            self.stdout.write(f"kept all {status} jobs (RETENTION {status!r} is None)")

    def _count(self, connection: Any, retention: dict[str, float | None]) -> list[tuple]:
        lines = []
        with connection.cursor() as cur:
            for status, keep in retention.items():
                if keep is None:
                    continue
                got = prune_store.count_prunable(
                    cur, status=status, keep_seconds=keep, limit=DRY_RUN_CAP + 1
                )
                capped = got.jobs > DRY_RUN_CAP
                jobs = f"{DRY_RUN_CAP}+" if capped else str(got.jobs)
                attempts = f"{got.attempts}+" if capped else str(got.attempts)
                lines.append((status, jobs, attempts))
        return lines
