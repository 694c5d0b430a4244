"""Jobs: ``jobs`` (the list, with GET /jobs' filters), ``show`` (one job and its attempts),
and ``retry``, ``cancel``, ``run-now`` (the admin's actions, through the service layer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandParser

from .. import pages, services, workflow_reads
from ..limit_reads import waiting_for
from ..models import Job, JobAttempt, Status
from ..progress import progress_text
from ..registry import TASK_NAME_RE
from . import documents, output
from .base import (
    EXIT_OK,
    EXIT_SKIPPED,
    OperatorCommand,
    bounded_int,
    job_id,
    limit_option,
    matching,
    moment,
)

#: ``show``'s bound on the attempts it prints: the last ones.
DEFAULT_ATTEMPTS = 10
MAX_ATTEMPTS = 100


def job_document(job: Job) -> dict[str, Any]:
    """A job as GET /jobs/<id> shows it (without DRF: pgqueue.cli.documents)."""
    return documents.job(job)


def attempt_document(attempt: JobAttempt) -> dict[str, Any]:
    return documents.attempt(attempt)


class JobsCommand(OperatorCommand):
    name = "jobs"
    help = (
        "List jobs, newest first, with the filters of GET /jobs. At most --limit (default 50, "
        "at most 500) are read, from the newest LIST_WINDOW jobs (of --tenant, when given); the "
        "output says when more match or older jobs were not examined."
    )

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("--status", choices=Status.values, help="only jobs in this status")
        for name, pattern in (
            ("queue", services.NAME_RE),
            ("tenant", services.NAME_RE),
            ("task", TASK_NAME_RE),
        ):
            parser.add_argument(
                f"--{name}", type=matching(pattern, name), help=f"only jobs of this {name}"
            )
        parser.add_argument(
            "--created-after", type=moment, help="ISO-8601, inclusive; without an offset, UTC"
        )
        parser.add_argument(
            "--created-before", type=moment, help="ISO-8601, inclusive; without an offset, UTC"
        )
        limit_option(parser, "jobs")

    def run(self, options: dict[str, Any]) -> int:
        rows, more, unexamined = pages.job_list(
            status=options["status"],
            queue=options["queue"],
            tenant=options["tenant"],
            task=options["task"],
            created_after=options["created_after"],
            created_before=options["created_before"],
            limit=options["limit"],
            using=self.using,
        )
        document = {
            "results": [job_document(job) for job in rows],
            "limit": options["limit"],
            "more": more,
            "older_unexamined": unexamined,
        }
        self.emit(options, document, lambda: _job_table(rows, more, unexamined, options["limit"]))
        return EXIT_OK


def _job_table(rows: Sequence[Job], more: bool, unexamined: bool, limit: int) -> str:
    window = f"the newest {pages.list_window():,} jobs"
    if not rows:
        return f"no jobs match among {window}" if unexamined else "no jobs match"
    text = output.table(
        ["ID", "STATUS", "QUEUE", "TENANT", "TASK", "PRIO", "ATTEMPTS", "CREATED (UTC)",
         "RUN AT (UTC)", "FINISHED (UTC)"],
        [
            [job.id, job.status, job.queue, job.tenant_id, job.task, job.priority,
             f"{job.attempts}/{job.max_attempts}", output.when(job.created_at),
             output.when(job.run_at), output.when(job.finished_at)]
            for job in rows
        ],
        right=(0, 5, 6),
    )  # fmt: skip
    if more:
        text += f"\n(the newest {limit}; more match: narrow the filters or raise --limit)"
    elif unexamined:
        text += f"\n(all that match among {window}; older jobs were not examined)"
    return text


class ShowCommand(OperatorCommand):
    name = "show"
    help = (
        "One job, as GET /jobs/<id> shows it, with its last --attempts attempts (default "
        f"{DEFAULT_ATTEMPTS}, at most {MAX_ATTEMPTS})."
    )

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("id", type=job_id, help="the job's id")
        parser.add_argument(
            "--attempts",
            type=bounded_int(1, MAX_ATTEMPTS),
            default=DEFAULT_ATTEMPTS,
            help=f"show the last this many attempts: 1 to {MAX_ATTEMPTS}, "
            f"default {DEFAULT_ATTEMPTS}",
        )

    def run(self, options: dict[str, Any]) -> int:
        job = Job.objects.using(self.using).filter(pk=options["id"]).first()
        if job is None:
            self.warn(f"job {options['id']} does not exist")
            return EXIT_SKIPPED
        total, attempts = pages.job_history(job.id, options["attempts"], using=self.using)
        neighbours = workflow_reads.neighbours(job.id, using=self.using)
        document = {
            **job_document(job),
            "history": [attempt_document(a) for a in attempts],
            **waiting_for(job, using=self.using),
            **neighbours,
            "history_total": total,
        }
        self.emit(options, document, lambda: _job_page(job, attempts, total, neighbours))
        return EXIT_OK


def _ids(ids: Sequence[int]) -> str:
    """Job ids, and "…" when there may be more than the read returns."""
    text = ", ".join(str(i) for i in ids) or output.NONE
    return text + ", …" if len(ids) >= workflow_reads.MAX_NEIGHBOURS_SHOWN else text


def _job_page(
    job: Job, attempts: Sequence[JobAttempt], total: int, neighbours: dict[str, list[int]]
) -> str:
    fields = [
        ("id", job.id),
        ("task", job.task),
        ("tenant", job.tenant_id),
        ("queue", job.queue),
        ("status", job.status),
        ("workflow", output.NONE if job.workflow_id is None else job.workflow_id),
        ("step", job.step or output.NONE),
        ("depends on", _ids(neighbours["depends_on"])),
        ("dependents", _ids(neighbours["dependents"])),
        ("priority", job.priority),
        ("attempts", f"{job.attempts}/{job.max_attempts}"),
        ("run at", output.when(job.run_at)),
        ("created", output.when(job.created_at)),
        ("claimed", output.when(job.claimed_at)),
        ("started", output.when(job.started_at)),
        ("finished", output.when(job.finished_at)),
        ("idempotency key", job.idempotency_key or output.NONE),
        ("traceparent", job.traceparent or output.NONE),
        ("payload", output.compact(job.payload)),
        ("progress", progress_text(job.progress) or output.NONE),
        ("output", output.compact(job.output) if job.output is not None else output.NONE),
        ("result", output.compact(job.result) if job.result is not None else output.NONE),
        ("last error", output.short(job.last_error, 200)),
    ]
    width = max(len(label) for label, _ in fields)
    lines = [f"{label + ':':<{width + 1}} {value}" for label, value in fields]
    lines.append("")
    if not attempts:
        lines.append("no attempts yet")
        return "\n".join(lines)
    shown = f"the last {len(attempts)} of {total}" if total > len(attempts) else f"{total}"
    lines.append(f"attempts ({shown}; times in UTC):")
    lines.append(
        output.table(
            ["ATTEMPT", "WORKER", "CLAIMED", "STARTED", "FINISHED", "RUN", "OUTCOME", "ERROR"],
            [
                [
                    a.attempt,
                    a.worker,
                    output.when(a.claimed_at),
                    output.when(a.started_at),
                    output.when(a.finished_at),
                    output.duration(a.started_at, a.finished_at),
                    a.outcome,
                    output.short(a.error),
                ]
                for a in attempts
            ],
            right=(0, 5),
        )
    )
    return "\n".join(lines)


class _BulkCommand(OperatorCommand):
    """An action on the jobs named, through the service layer: exit 1 when any was skipped
    (its status does not allow the action) or does not exist."""

    #: The service function, and what the output says it did (``{jobs}``: "2 jobs").
    action: staticmethod[..., services.BulkResult]
    done: str = ""

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="+", type=job_id, metavar="ID", help="job ids")

    def run(self, options: dict[str, Any]) -> int:
        result = self.action(options["ids"], using=self.using)
        missing = set(result.missing)
        skipped = [
            {"id": i, "status": result.statuses[i], "reason": reason}
            for i, reason in result.skipped.items()
            if i not in missing
        ]
        document = {"changed": result.changed, "skipped": skipped, "missing": result.missing}
        if result.requested:  # cancel: running jobs asked to stop (their workers end them)
            document["requested"] = result.requested
        n = len(result.changed)
        jobs = f"{n} job{'s' * (n != 1)}"
        ids = ", ".join(str(i) for i in result.changed) or "-"
        self.emit(options, document, lambda: f"{self.done.format(jobs=jobs)}: {ids}")
        if not options["json"]:
            if result.requested:
                asked = ", ".join(str(i) for i in result.requested)
                self.stdout.write(f"asked {len(result.requested)} running to stop: {asked}")
            for reason in result.skipped.values():
                self.warn(f"skipped: {reason}")
        return EXIT_SKIPPED if result.skipped else EXIT_OK


class RetryCommand(_BulkCommand):
    name = "retry"
    help = "Send dead or cancelled jobs back to run (attempts restart from 0; history is kept)."
    action = staticmethod(services.retry_jobs)
    done = "retried {jobs}"


class CancelCommand(_BulkCommand):
    name = "cancel"
    help = (
        "Cancel waiting, scheduled or queued jobs, and ask running ones to stop (finished "
        "ones are skipped)."
    )
    action = staticmethod(services.cancel_jobs)
    done = "cancelled {jobs}"


class RunNowCommand(_BulkCommand):
    name = "run-now"
    help = "Make scheduled jobs runnable now instead of at their run_at."
    action = staticmethod(services.run_jobs_now)
    done = "made {jobs} runnable now"


COMMANDS = [JobsCommand, ShowCommand, RetryCommand, CancelCommand, RunNowCommand]
