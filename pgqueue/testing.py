"""Test helpers: run the jobs a test enqueued, in the test, and assert on what was enqueued.

A job is a row that ``pgqueue.enqueue`` writes in the caller's transaction, so a test sees
it at once. ``run_jobs`` runs the jobs that are due, one after another, in the test's own
process, thread and database connection: inside the transaction of a
``django.test.TestCase`` (or pytest-django's plain ``django_db``) as well as in a
``TransactionTestCase`` (``transaction=True``). It is not an imitation of the queue: it
claims with the worker's claim (``JOB_CLAIM``, restricted to the jobs asked for), runs each
handler through the worker's own ``run_handler`` and records the outcome with the worker's
``OutcomeRecorder``, so results, retries and their backoff, ``PermanentError``,
snoozes, retry policies, signals, concurrency keys, tenant limits and fair order are
those a worker gives.

``enqueued``, ``assert_enqueued`` and ``assert_not_enqueued`` read the jobs. The pytest
plugin (``pgqueue.testing_plugin``, loaded by pytest when pgqueue is installed) offers all of
them as the ``pgqueue_jobs`` fixture. docs/how-to/testing.md shows them at work.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import threading
import time
from collections.abc import Awaitable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections, transaction
from django.db.models import QuerySet
from psycopg.pq import TransactionStatus

from . import claim_store, key_store, services, store, workflow_store
from .conf import pgqueue_settings, queue_db
from .models import Job
from .queries import load
from .registry import RegisteredTask, get_task, served_names
from .timeouts import timed_out_text
from .worker.clock import DatabaseClock
from .worker.context import JobContext
from .worker.executor import HandlerOutcome, JobExecutor, run_async_handler, run_handler, serves
from .worker.heartbeat import Heartbeats
from .worker.recorder import OutcomeRecorder

__all__ = [
    "JobRun",
    "JobsFailed",
    "PgQueueJobs",
    "RunReport",
    "assert_enqueued",
    "assert_not_enqueued",
    "enqueued",
    "run_jobs",
]

#: The statements of queries/testing.sql, by name.
STATEMENTS = load("testing.sql")

#: The lease owner of the jobs ``run_jobs`` claims, and the worker of their attempt rows.
WORKER_ID = "test-runner"

#: The outcomes ``RunReport.failures`` (and ``raise_on_failure``) count: the handler raised,
#: ran past its timeout or returned what cannot be stored, or no handler exists for the task.
FAILED = frozenset({"failed", "dead", "no_handler"})

#: Most jobs an assertion's message lists.
LISTED_JOBS = 50

TaskRef = Any  # a task name, a ``pgqueue.Task``, or a task of Django's Tasks framework

#: Django 6.1 renamed ``transaction.savepoint`` (deprecated there) ``savepoint_create``.
_savepoint_create = getattr(transaction, "savepoint_create", None) or transaction.savepoint


# -- the report -----------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRun:
    """One run of a job's handler by ``run_jobs``, and how it was recorded.

    ``outcome`` is one of:

    - ``"done"``: the handler returned; ``result`` is what was stored.
    - ``"failed"``: it raised (or ran past its timeout, or returned what cannot be stored)
      with attempts left: the job is scheduled for its retry after a backoff.
    - ``"dead"``: it raised with no attempt left, or raised ``pgqueue.PermanentError``.
    - ``"cancelled"``: its cancellation was requested while it ran.
    - ``"snoozed"``: it raised ``pgqueue.Retry``: scheduled again, the attempt not spent.
    - ``"discarded"``: the job's lease was lost meanwhile; nothing was recorded.
    - ``"no_handler"``: this process has no handler for the task: the job was given back
      (scheduled ``UNKNOWN_TASK_DELAY_SECONDS`` later, no attempt spent), as a worker does.
    """

    id: int
    task: str
    tenant: str
    queue: str
    attempt: int
    outcome: str
    result: Any = None
    error: str | None = None
    traceback: str | None = None
    duration: float = 0.0  # seconds the handler ran

    @property
    def failed(self) -> bool:
        """Whether this run is one of ``RunReport.failures``."""
        return self.outcome in FAILED

    def describe(self) -> str:
        """One line: the job, the attempt and how it ended (with its error, if any)."""
        text = (
            f"job {self.id} ({self.task}, tenant={self.tenant}, queue={self.queue}) "
            f"attempt {self.attempt}: {self.outcome}"
        )
        return f"{text}: {self.error}" if self.error else text


class JobsFailed(AssertionError):
    """Raised by ``RunReport.raise_failures`` (and ``run_jobs(raise_on_failure=True)``):
    some handler failed. An ``AssertionError``, so a test reports it as a failure; the
    message has each failed run and its traceback."""

    def __init__(self, failures: list[JobRun]):
        self.failures = failures
        lines = [f"{len(failures)} job run(s) failed:"]
        for run in failures:
            lines.append(f"- {run.describe()}")
            if run.traceback:
                lines.extend(f"    {line}" for line in run.traceback.rstrip().splitlines())
        super().__init__("\n".join(lines))


@dataclass
class RunReport:
    """What ``run_jobs`` ran, in order: one ``JobRun`` per run of a handler (a job retried
    within the call appears once per attempt)."""

    runs: list[JobRun] = field(default_factory=list)
    #: The call stopped at its ``limit``: more jobs may be due.
    limit_reached: bool = False

    def __iter__(self) -> Iterator[JobRun]:
        return iter(self.runs)

    def __len__(self) -> int:
        return len(self.runs)

    @property
    def ids(self) -> list[int]:
        """The ids of the jobs that ran, each once, in the order of their first run."""
        return list(dict.fromkeys(run.id for run in self.runs))

    @property
    def outcomes(self) -> dict[int, str]:
        """Each job's last outcome in this call, by job id."""
        return {run.id: run.outcome for run in self.runs}

    def outcome(self, job: Job | int) -> str | None:
        """The last outcome of ``job`` (a ``Job`` or its id) in this call; None: not run."""
        return self.outcomes.get(job if isinstance(job, int) else job.pk)

    @property
    def failures(self) -> list[JobRun]:
        """The runs whose handler failed (outcome "failed" or "dead") and the jobs given
        back for want of a handler ("no_handler")."""
        return [run for run in self.runs if run.failed]

    def raise_failures(self) -> RunReport:
        """Raise ``JobsFailed`` if any run failed; returns the report otherwise, so that
        ``run_jobs().raise_failures()`` reads as one step."""
        failures = self.failures
        if failures:
            raise JobsFailed(failures)
        return self

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for run in self.runs:
            counts[run.outcome] = counts.get(run.outcome, 0) + 1
        shown = ", ".join(f"{n} {outcome}" for outcome, n in counts.items()) or "none"
        more = ", limit reached" if self.limit_reached else ""
        return f"<RunReport {len(self.runs)} run(s): {shown}{more}>"


# -- running jobs ---------------------------------------------------------------------------


def run_jobs(
    *,
    task: TaskRef | Iterable[TaskRef] | None = None,
    tenant: str | Iterable[str] | None = None,
    queue: str | Iterable[str] | None = None,
    limit: int = 1000,
    include_scheduled: bool = False,
    now: dt.datetime | dt.timedelta | None = None,
    raise_on_failure: bool = False,
    using: str | None = None,
) -> RunReport:
    """Run the due jobs, one at a time, here: in this process, thread and transaction.

    Each job is claimed with the worker's claim, its handler run through the worker's
    ``run_handler`` and its outcome recorded by the worker's ``OutcomeRecorder``, on
    Django's connection (the queue's alias, ``PGQUEUE["DATABASE"]``, unless ``using``).
    So it works inside a ``TestCase``'s transaction, where no worker could see the jobs,
    and jobs end as a worker would end them: results stored, failures retried after a
    backoff or dead, signals sent, limits and concurrency keys obeyed, tenants served in
    fair order.

    Jobs the handlers enqueue run too, when they are due, until none is left: the call
    returns when no matching job is due, or after ``limit`` runs (``RunReport.limit_reached``:
    more may be due), which bounds a job that enqueues itself for ever.

    Which jobs: those of the tasks ``task`` (a name, a ``pgqueue.Task``, a Django Tasks
    task, or several), the tenants ``tenant`` and the queues ``queue`` (a name or several),
    each None for any; unlike a worker, every queue is served unless ``queue`` says which
    (at equal priority, queues in name order).

    When: a job is due if it is queued, or scheduled with a ``run_at`` that has come by the
    database's clock as the call starts. Retries are scheduled after a backoff from the
    database's clock, so a failed job waits for its retry (outcome "failed") and the call
    does not run it again. To move time, pass ``now`` (a moment, or a ``timedelta`` from the
    database's clock): scheduled jobs due by then run too, retries included if their
    backoff ends by then; or ``include_scheduled=True``: every scheduled job runs, retries
    included, so a failing job runs until it is dead. The jobs made due so are runnable at
    once, as the admin's "run now" makes them.

    Timeouts: a handler runs to its end (a test thread is not interrupted); one that ran
    past its timeout has its attempt failed "timed out after N s" and its return
    discarded, as a worker records it, and its ``job.heartbeat()`` raises ``JobTimedOut``
    once the deadline has passed.

    Returns a ``RunReport``; with ``raise_on_failure=True`` it raises ``JobsFailed``
    instead when a handler failed, after every due job has run and been recorded.
    Call it from synchronous code: an ``async def`` handler is awaited on an event loop of
    its own, while the calling thread waits.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit: must be a whole number of at least 1, not {limit!r}")
    if include_scheduled and now is not None:
        raise ValueError("now: give either now or include_scheduled=True, not both")
    if isinstance(now, dt.datetime) and now.utcoffset() is None:
        raise ValueError("now: a datetime needs a UTC offset (timezone-aware)")
    if now is not None and not isinstance(now, dt.datetime | dt.timedelta):
        raise TypeError(f"now: a datetime or a timedelta, not {type(now).__name__}")
    runner = JobRunner(
        tasks=_task_names(task),
        tenants=_names(tenant, "tenant"),
        queues=_names(queue, "queue"),
        using=using,
    )
    report = runner.run(limit=limit, include_scheduled=include_scheduled, now=now)
    if raise_on_failure:
        report.raise_failures()
    return report


class JobRunner:
    """One ``run_jobs`` call: the worker's claim, handler runner and recorder, driven one
    job at a time on the calling thread's Django connection."""

    def __init__(
        self,
        *,
        tasks: list[str] | None = None,
        tenants: list[str] | None = None,
        queues: list[str] | None = None,
        using: str | None = None,
    ) -> None:
        self.alias = queue_db(using)
        self.tasks, self.tenants, self.queues = tasks, tenants, queues
        self.lease = float(pgqueue_settings.LEASE_SECONDS)
        self.clock = DatabaseClock()
        self.recorder = OutcomeRecorder(
            WORKER_ID,
            served=len(served_names()),
            unknown_task_delay=float(pgqueue_settings.UNKNOWN_TASK_DELAY_SECONDS),
            clock=self.clock,
        )
        self.heartbeats = Heartbeats(WORKER_ID, self.lease, lambda: None, self.clock)
        # Builds each job's context as a worker's executor does; never starts a thread here.
        self.contexts = JobExecutor(
            1, worker_id=WORKER_ID, heartbeat=self._heartbeat, deliver=lambda outcome: None
        )
        self.thread = threading.get_ident()
        self.current: JobContext | None = None  # the job whose handler runs
        #: Jobs given back for want of a handler: not made runnable again by this call.
        self.given_back: list[int] = []

    @property
    def connection(self) -> Any:
        return connections[self.alias]

    def run(
        self, *, limit: int, include_scheduled: bool, now: dt.datetime | dt.timedelta | None
    ) -> RunReport:
        report = RunReport()
        with self.connection.cursor() as cur:
            self.clock.read(cur)
            start = store.database_clock(cur)
        if include_scheduled:
            until: dt.datetime | None = None
        elif isinstance(now, dt.timedelta):
            until = start + now
        else:
            until = now or start
        while len(report.runs) < limit:
            self._make_due(start, until)
            job = self._claim()
            if job is None:
                return report
            if not serves(job.task):
                report.runs.append(self._give_back(job))
            else:
                report.runs.append(self._run(job))
        report.limit_reached = True
        return report

    # -- one round: due jobs made runnable, keyed jobs admitted, one job claimed ------------

    def _filters(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "tenants": self.tenants, "queues": self.queues}

    def _make_due(self, clock: dt.datetime, until: dt.datetime | None) -> None:
        """Promote the matching scheduled jobs due by ``until`` (JOB_PROMOTE_MANY, as
        maintenance promotes them; those not due by the database's clock ``clock`` are made
        due now first, as "run now" does), and have KEY_SETTLE admit new keyed jobs, as a
        worker's turn and maintenance do."""
        batch = int(pgqueue_settings.MAINTENANCE_BATCH_SIZE)
        admit = int(pgqueue_settings.KEY_ADMIT_BATCH)
        with transaction.atomic(using=self.alias), self.connection.cursor() as cur:
            cur.execute(
                STATEMENTS["JOB_SCHEDULED_MATCHING"],
                {
                    **self._filters(),
                    "clock": clock,
                    "until": until,
                    "skip": self.given_back,
                    "limit": batch,
                },
            )
            rows = cur.fetchall()
            due = [row[0] for row in rows if row[1]]
            if due:
                store.promote_ids(cur, due)
            moved = [row[0] for row in rows if not row[1]]
            if moved:
                services.run_jobs_now(moved, using=self.alias)
            self._settle_waiting(cur, batch)  # first: a step it makes runnable may be keyed
            while key_store.settle(cur, admit=admit) >= admit:
                pass  # a whole batch examined: more new keyed jobs may wait

    def _settle_waiting(self, cur: Any, batch: int) -> None:
        """Settle every waiting job (pgqueue.workflows), as a worker does after the commit
        that ended a dependency: in a test's transaction nothing commits, so each round
        looks at them all, again until a pass settles none (a cancellation cascades a
        level a pass)."""
        while True:
            settled, after = False, 0
            while page := workflow_store.waiting_page(cur, after=after, limit=batch):
                settled = bool(workflow_store.settle(cur, ids=page)) or settled
                after = page[-1]
            if not settled:
                return

    def _claim(self) -> claim_store.ClaimedJob | None:
        """The next job a worker of the matching queues would claim, of the tasks and
        tenants asked for (JOB_CLAIM_MATCHING), or None."""
        with self.connection.cursor() as cur:
            cur.execute(STATEMENTS["JOB_QUEUES_MATCHING"], self._filters())
            queues = [row[0] for row in cur.fetchall()]
            if not queues:
                return None
            # JOB_CLAIM's own parameters and rows: its twin takes and returns the same.
            params = claim_store._params(WORKER_ID, queues, 1, self.lease, None)
            params.update(tasks=self.tasks, tenants=self.tenants)
            cur.execute(STATEMENTS["JOB_CLAIM_MATCHING"], params)
            jobs = claim_store._jobs(cur.fetchall())
        return jobs[0] if jobs else None

    # -- a job without a handler ------------------------------------------------------------

    def _give_back(self, job: claim_store.ClaimedJob) -> JobRun:
        """Give the job back as a worker does (not an attempt; scheduled later)."""
        self.recorder.unrunnable.append(job)
        with transaction.atomic(using=self.alias):
            self.recorder.give_back(self.connection)
        self.given_back.append(job.id)
        return JobRun(
            job.id,
            job.task,
            job.tenant,
            job.queue,
            job.attempt,
            "no_handler",
            error=f"no handler for task {job.task!r} in this process: given back, not run",
        )

    # -- a job's handler and its outcome ----------------------------------------------------

    def _run(self, job: claim_store.ClaimedJob) -> JobRun:
        ctx = self.contexts.context(job)
        self.current = ctx
        try:
            outcome = self._run_handler(ctx)
        finally:
            self.current = None
        if ctx.deadline is not None and (
            ctx.stop_reason == "timed_out" or (outcome.ended or 0.0) >= ctx.deadline
        ):
            # A worker fails the attempt at its deadline and discards what the handler
            # returns afterwards; this thread could only wait for the handler's end.
            ctx.mark_stopped("timed_out")
            outcome = HandlerOutcome(
                ctx,
                ok=False,
                error=timed_out_text(ctx.timeout or 0.0),
                duration=outcome.duration,
            )
        if ctx.report_since is not None and not (ctx.lost or ctx.settled):
            # The handler's last progress and output, written as a worker's round before
            # its outcome would (job.heartbeat() writes those reported until then).
            self.heartbeats.beat(self.connection, [ctx])
        recorded = self._record(outcome)
        status = self.recorder.statuses.get(ctx.id)
        self.recorder.log([outcome], recorded)  # the worker's log lines and signals
        return JobRun(
            ctx.id,
            ctx.task,
            ctx.tenant,
            ctx.queue,
            ctx.attempt,
            _outcome(outcome, recorded, status),
            result=None if outcome.result_json is None else json.loads(outcome.result_json),
            error=outcome.error,
            traceback=outcome.traceback,
            duration=outcome.duration,
        )

    def _run_handler(self, ctx: JobContext) -> HandlerOutcome:
        """Run the handler on this thread. Inside a transaction (a ``TestCase``'s), in a
        savepoint of its own: a worker's handler runs in autocommit, where a failed
        statement leaves the connection usable, so a handler's database error is rolled
        back to the savepoint instead of breaking the test's transaction."""
        func = get_task(ctx.task).func
        conn = self.connection
        savepoint = _savepoint_create(using=self.alias) if conn.in_atomic_block else None
        if inspect.iscoroutinefunction(func):
            outcome = async_to_sync(run_async_handler)(ctx, func)
        else:
            outcome = run_handler(ctx, _await, close_connections=False)
        if savepoint is not None:
            if conn.needs_rollback or _transaction_failed(conn):
                transaction.savepoint_rollback(savepoint, using=self.alias)
                transaction.set_rollback(False, using=self.alias)
            else:
                transaction.savepoint_commit(savepoint, using=self.alias)
        return outcome

    def _record(self, outcome: HandlerOutcome) -> set[int]:
        """Record the outcome as a worker's recorder does, in a transaction of its own (a
        savepoint in a test's). An error of the database is raised: a worker records such
        an outcome as a failure and goes on, a test is better told."""
        with transaction.atomic(using=self.alias), self.connection.cursor() as cur:
            return self.recorder.record(cur, [outcome])

    def _heartbeat(self, timeout: float) -> None:
        """``job.heartbeat()``: renew the lease, write the start, learn of a cancellation
        request (a worker's heartbeat round), on this thread's connection. From another
        thread (an async handler's ``aheartbeat``) only the deadline is looked at: that
        thread's connection is not the test's."""
        ctx = self.current
        if ctx is None or ctx.lost or ctx.settled:
            return
        if ctx.deadline is not None and time.monotonic() >= ctx.deadline:
            ctx.mark_stopped("timed_out")
            return
        if threading.get_ident() != self.thread:
            return
        started = None if ctx.start_written else self.recorder.started([ctx])
        asked = self.heartbeats.beat(self.connection, [ctx], started=started)
        for stopped in asked:
            stopped.mark_stopped("cancelled")


def _await(awaitable: Awaitable[Any]) -> Any:
    """Await what a plain handler returned (a wrapped ``async def``) while this thread
    waits: asgiref runs the handler's ``sync_to_async`` calls back on this thread, so they
    use the test's connection."""

    async def wait() -> Any:
        return await awaitable

    return async_to_sync(wait)()


def _transaction_failed(conn: Any) -> bool:
    """Whether the connection's transaction is aborted (a statement failed in it)."""
    info = getattr(conn.connection, "info", None)  # psycopg's
    return info is not None and info.transaction_status == TransactionStatus.INERROR


def _outcome(outcome: HandlerOutcome, recorded: set[int], status: str | None) -> str:
    """How a run ended, as the recorder's log line says it."""
    ctx = outcome.ctx
    if ctx.id not in recorded:
        return "discarded"
    if ctx.stop_reason == "cancelled":  # its cancel request won
        return "cancelled"
    if outcome.ok:
        return "done"
    if status in ("dead", "snoozed"):
        return status
    return "failed"


# -- reading what was enqueued --------------------------------------------------------------


def enqueued(
    task: TaskRef | Iterable[TaskRef] | None = None,
    *,
    tenant: str | Iterable[str] | None = None,
    queue: str | Iterable[str] | None = None,
    status: str | Iterable[str] | None = None,
    payload: Any = None,
    using: str | None = None,
    **filters: Any,
) -> QuerySet[Job]:
    """The jobs of ``task`` (a name, a ``pgqueue.Task``, a Django Tasks task, or several;
    None: any), oldest first, as a ``QuerySet`` of ``pgqueue.models.Job``.

    ``tenant``, ``queue`` and ``status`` take a name or several. ``payload`` matches jobs
    whose payload contains it (PostgreSQL's ``@>``: the keys given, with those values, at
    any depth; other keys may be there too); for an exact match pass
    ``payload__exact=...``. Any other keyword is a lookup on ``Job``
    (``priority=5``, ``idempotency_key="k"``, ``run_at__gt=...``).
    """
    jobs = Job.objects.using(queue_db(using)).order_by("id")
    names = _task_names(task)
    if names is not None:
        jobs = jobs.filter(task__in=names)
    for field_name, value in (("tenant_id", tenant), ("queue", queue), ("status", status)):
        values = _names(value, field_name.removesuffix("_id"))
        if values is not None:
            jobs = jobs.filter(**{f"{field_name}__in": values})
    if payload is not None:
        jobs = jobs.filter(payload__contains=payload)
    return jobs.filter(**filters) if filters else jobs


def assert_enqueued(
    task: TaskRef | Iterable[TaskRef] | None = None,
    *,
    count: int | None = None,
    using: str | None = None,
    **filters: Any,
) -> list[Job]:
    """Assert that jobs of ``task`` matching ``filters`` (those of ``enqueued``) exist:
    exactly ``count`` of them, or at least one. Returns them, oldest first.

    The ``AssertionError`` says what was expected and lists the jobs of the queue's table
    (at most 50), so a test that fails shows what was enqueued instead.
    """
    jobs = list(enqueued(task, using=using, **filters))
    if (count is None and jobs) or len(jobs) == count:
        return jobs
    wanted = "at least 1 job" if count is None else f"{count} job(s)"
    raise AssertionError(
        f"expected {wanted} {_describe(task, filters)}, found {len(jobs)}.\n{_listing(using)}"
    )


def assert_not_enqueued(
    task: TaskRef | Iterable[TaskRef] | None = None,
    *,
    using: str | None = None,
    **filters: Any,
) -> None:
    """Assert that no job of ``task`` matches ``filters`` (those of ``enqueued``); the
    ``AssertionError`` lists the jobs that do."""
    jobs = list(enqueued(task, using=using, **filters)[: LISTED_JOBS + 1])
    if jobs:
        shown = "\n".join(_line(job) for job in jobs[:LISTED_JOBS])
        more = "\n  ..." if len(jobs) > LISTED_JOBS else ""
        raise AssertionError(f"expected no job {_describe(task, filters)}, found:\n{shown}{more}")


class PgQueueJobs:
    """The helpers of this module for one database alias: what the pytest fixture
    ``pgqueue_jobs`` gives a test (``pgqueue_jobs.run()``, ``.enqueued(...)``,
    ``.assert_enqueued(...)``, ``.assert_not_enqueued(...)``)."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def run(self, **options: Any) -> RunReport:
        """``run_jobs(**options)``."""
        options.setdefault("using", self.using)
        return run_jobs(**options)

    def enqueued(self, task: Any = None, **filters: Any) -> QuerySet[Job]:
        """``enqueued(task, **filters)``."""
        filters.setdefault("using", self.using)
        return enqueued(task, **filters)

    def assert_enqueued(self, task: Any = None, **filters: Any) -> list[Job]:
        """``assert_enqueued(task, **filters)``."""
        filters.setdefault("using", self.using)
        return assert_enqueued(task, **filters)

    def assert_not_enqueued(self, task: Any = None, **filters: Any) -> None:
        """``assert_not_enqueued(task, **filters)``."""
        filters.setdefault("using", self.using)
        assert_not_enqueued(task, **filters)


# -- names and messages ---------------------------------------------------------------------


def _task_name(task: TaskRef) -> str:
    if isinstance(task, str):
        return task
    if isinstance(task, RegisteredTask):
        return task.name
    module_path = getattr(task, "module_path", None)
    if isinstance(module_path, str):  # a task of Django's Tasks framework
        from .backends.runner import job_task

        return job_task(module_path).name
    raise TypeError(f"task: a task name or a task, not {type(task).__name__}")


def _task_names(task: TaskRef | Iterable[TaskRef] | None) -> list[str] | None:
    if task is None:
        return None
    if isinstance(task, str) or not isinstance(task, Iterable):
        return [_task_name(task)]
    return [_task_name(t) for t in task]


def _names(value: str | Iterable[str] | None, what: str) -> list[str] | None:
    if value is None:
        return None
    values = [value] if isinstance(value, str) else list(value)
    for v in values:
        if not isinstance(v, str):
            raise TypeError(f"{what}: a name or several, not {type(v).__name__}")
    return values


def _describe(task: Any, filters: dict[str, Any]) -> str:
    names = _task_names(task)
    text = "of any task" if names is None else f"of task {' or '.join(map(repr, names))}"
    shown = {k: v for k, v in filters.items() if v is not None}
    if shown:
        text += " with " + ", ".join(f"{k}={v!r}" for k, v in shown.items())
    return text


def _line(job: Job) -> str:
    return (
        f"  #{job.pk} {job.task} tenant={job.tenant_id} queue={job.queue} "
        f"status={job.status} payload={job.payload!r}"
    )


def _listing(using: str | None) -> str:
    jobs = list(Job.objects.using(queue_db(using)).order_by("id")[: LISTED_JOBS + 1])
    if not jobs:
        return "No job was enqueued."
    total = Job.objects.using(queue_db(using)).count() if len(jobs) > LISTED_JOBS else len(jobs)
    head = f"The {total} job(s) enqueued:" if total <= LISTED_JOBS else f"{total} jobs, the first:"
    return "\n".join([head, *(_line(job) for job in jobs[:LISTED_JOBS])])
