"""The service layer: every state change a user or operator asks for.

The Python API, the HTTP API, the admin and the Tasks backend all call these functions;
none of them writes job rows itself. What an enqueue may ask for is checked in
``pgqueue.job_options`` (re-exported here), so every entry point refuses bad input with
the same field and reason.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from django.db import connections, transaction

from . import stop_store, store, tracing, workflow_store, workflows
from .conf import pgqueue_settings, queue_db
from .exceptions import (
    InvalidJob,
    InvalidTransition,
    JobNotFound,
    TooManyQueues,
)
from .job_options import (  # noqa: F401  (what the entry points import from here)
    IDEMPOTENCY_KEY_MAX,
    MAX_BATCH,
    MAX_DELAY_SECONDS,
    MAX_WEIGHT,
    MIN_WEIGHT,
    NAME_RE,
    RESERVED_KEY_PREFIX,
    JobOptions,
    KeyRule,
    _run_at,
    encode_payload,
    resolve_options,
    validate_key,
    validate_key_max_running,
    validate_max_attempts,
    validate_name,
    validate_priority,
    validate_weight,
)
from .key_models import KeyState
from .models import LIVE_STATUSES, Job, Status
from .models import Workflow as WorkflowRow
from .registry import RegisteredTask

CANCELLABLE = "waiting, scheduled, queued or running"


class Enqueued(NamedTuple):
    """What ``enqueue`` returns: the job, and False when an idempotency key matched."""

    job: Job
    created: bool


@dataclass
class BulkResult:
    """What an operation on several jobs did: which changed, and why others did not."""

    changed: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)  # id -> reason
    missing: list[int] = field(default_factory=list)  # ids that name no job
    statuses: dict[int, str] = field(default_factory=dict)  # status of each skipped job
    requested: list[int] = field(default_factory=list)  # running jobs asked to stop

    def __len__(self) -> int:
        return len(self.changed)


# -- enqueue ------------------------------------------------------------------------------


def enqueue(
    task: RegisteredTask | str,
    payload: Any = None,
    *,
    tenant: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    timeout: float | dt.timedelta | None = None,
    concurrency_key: KeyRule = None,
    key_max_running: int | None = None,
    depends_on: Iterable[int | Job] | None = None,
    on_upstream_failure: str = "cancel",
    using: str | None = None,
) -> Enqueued:
    """Enqueue one job in the current transaction of ``using``.

    A rollback of the surrounding transaction leaves no job, charges the tenant no
    virtual time and wakes no worker (the notification is delivered on commit only).
    With an idempotency key already used by the tenant, returns that job and False.
    With ``depends_on`` (jobs of the tenant, or their ids) it waits until they have
    ended (``pgqueue.workflows``): cancelled if one ends dead or cancelled, unless
    ``on_upstream_failure="run"``.
    """
    opts = resolve_options(
        task,
        tenant=tenant,
        queue=queue,
        priority=priority,
        run_at=run_at,
        delay=delay,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
        timeout=timeout,
        concurrency_key=concurrency_key,
        key_max_running=key_max_running,
    )
    payloads_json = f"[{encode_payload(payload)}]"
    keys = opts.keys([payload])
    deps = workflows.dependency_ids(depends_on)
    with tracing.enqueue(opts.task, queue=opts.queue, tenant=opts.tenant) as sending:
        enqueued = _enqueue_one(
            opts, payload, payloads_json, keys, deps, on_upstream_failure, using, sending.context
        )
        sending.set(tracing.JOB_ID, enqueued.job.id)
    return enqueued


def _enqueue_one(
    opts: JobOptions,
    payload: Any,
    payloads_json: str,
    keys: list[str | None] | None,
    deps: list[int],
    on_upstream_failure: str,
    using: str | None,
    trace: tracing.TraceContext | None,
) -> Enqueued:
    if deps:
        return _enqueue_waiting(
            opts, payload, payloads_json, keys, deps, on_upstream_failure, using, trace
        )
    if opts.idempotency_key is None:
        with connections[queue_db(using)].cursor() as cursor:
            (new,), _ = _insert(cursor, opts, payloads_json, 1, keys, trace=trace)
        return Enqueued(_job(new, opts, payload, using, keys, trace), True)

    # A savepoint makes the refund below exact: the clock row stays locked until it ends.
    with transaction.atomic(using=queue_db(using)), connections[queue_db(using)].cursor() as cursor:
        inserted, charged = _insert(cursor, opts, payloads_json, 1, keys, trace=trace)
        if inserted:
            return Enqueued(_job(inserted[0], opts, payload, using, keys, trace), True)
        if charged:
            store.refund_clock(
                cursor,
                task=opts.task,
                tenant=opts.tenant,
                queue=opts.queue,
                priority=opts.priority,
                count=1,
            )
    existing = Job.objects.using(queue_db(using)).get(
        tenant_id=opts.tenant, idempotency_key=opts.idempotency_key
    )
    return Enqueued(existing, False)


def enqueue_many(
    task: RegisteredTask | str,
    payloads: Iterable[Any],
    *,
    tenant: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    max_attempts: int | None = None,
    timeout: float | dt.timedelta | None = None,
    concurrency_key: KeyRule = None,
    key_max_running: int | None = None,
    depends_on: Iterable[int | Job] | None = None,
    on_upstream_failure: str = "cancel",
    using: str | None = None,
) -> list[int]:
    """Enqueue one job per payload, in order, and return their ids.

    Each chunk of up to 1,000 jobs is one statement; all chunks share one transaction, so
    either every job is enqueued or none is. The tenant's jobs keep the payloads' order.
    ``depends_on``: every job waits for those jobs, as in ``enqueue``.
    """
    if isinstance(payloads, str | bytes | dict):
        raise InvalidJob("payloads", "must be a list of payloads")
    opts = resolve_options(
        task,
        tenant=tenant,
        queue=queue,
        priority=priority,
        run_at=run_at,
        delay=delay,
        max_attempts=max_attempts,
        timeout=timeout,
        concurrency_key=concurrency_key,
        key_max_running=key_max_running,
    )
    payloads = list(payloads)
    encoded = [encode_payload(p, f"payloads[{i}]") for i, p in enumerate(payloads)]
    if not encoded:
        return []
    keys = opts.keys(payloads)
    deps = workflows.dependency_ids(depends_on)
    run_anyway = _run_anyway(on_upstream_failure)
    ids: list[int] = []
    db = queue_db(using)
    with (
        tracing.enqueue(
            opts.task, queue=opts.queue, tenant=opts.tenant, count=len(encoded)
        ) as sending,
        transaction.atomic(using=db),
        connections[db].cursor() as cursor,
    ):
        workflows.check_dependencies(cursor, deps, opts.tenant)
        for start in range(0, len(encoded), MAX_BATCH):
            chunk = encoded[start : start + MAX_BATCH]
            chunk_keys = None if keys is None else keys[start : start + MAX_BATCH]
            inserted, _ = _insert(
                cursor,
                opts,
                f"[{','.join(chunk)}]",
                len(chunk),
                chunk_keys,
                waiting=bool(deps),
                run_anyway=run_anyway,
                trace=sending.context,
            )
            ids.extend(new.id for new in inserted)
        if deps:
            workflow_store.insert_dependencies(cursor, [(i, u) for i in ids for u in deps])
            transaction.on_commit(partial(workflows.settle_after_commit, db, ids=ids), using=db)
    return ids


def _run_anyway(on_upstream_failure: Any) -> bool:
    if on_upstream_failure not in workflows.ON_UPSTREAM_FAILURE:
        raise InvalidJob("on_upstream_failure", "must be 'cancel' or 'run'")
    return on_upstream_failure == "run"


def _enqueue_waiting(
    opts: JobOptions,
    payload: Any,
    payloads_json: str,
    keys: list[str | None] | None,
    deps: list[int],
    on_upstream_failure: str,
    using: str | None,
    trace: tracing.TraceContext | None = None,
) -> Enqueued:
    """``enqueue`` of a job with dependencies: inserted waiting with its edges, settled
    once the caller's transaction commits (it may run at once if they have all ended)."""
    run_anyway = _run_anyway(on_upstream_failure)
    db = queue_db(using)
    with transaction.atomic(using=db), connections[db].cursor() as cursor:
        workflows.check_dependencies(cursor, deps, opts.tenant)
        inserted, _ = _insert(
            cursor, opts, payloads_json, 1, keys, waiting=True, run_anyway=run_anyway, trace=trace
        )
        if inserted:
            new = inserted[0].id
            workflow_store.insert_dependencies(cursor, [(new, u) for u in deps])
            transaction.on_commit(partial(workflows.settle_after_commit, db, ids=[new]), using=db)
            job = _job(inserted[0], opts, payload, using, keys, trace)
            job.status, job.run_on_upstream_failure = Status.WAITING, run_anyway
            return Enqueued(job, True)
    existing = Job.objects.using(db).get(
        tenant_id=opts.tenant, idempotency_key=opts.idempotency_key
    )
    return Enqueued(existing, False)


def _insert(
    cursor: Any,
    opts: JobOptions,
    payloads_json: str,
    count: int,
    keys: list[str | None] | None = None,
    *,
    waiting: bool = False,
    run_anyway: bool = False,
    trace: tracing.TraceContext | None = None,
) -> tuple[list[store.NewJob], bool]:
    return store.enqueue(
        cursor,
        task=opts.task,
        tenant=opts.tenant,
        queue=opts.queue,
        priority=opts.priority,
        max_attempts=opts.max_attempts,
        payloads_json=payloads_json,
        count=count,
        idempotency_key=opts.idempotency_key,
        run_at=opts.run_at,
        timeout=opts.timeout,
        max_queues=pgqueue_settings.MAX_QUEUES_PER_TENANT,
        keys=keys,
        key_max_running=opts.key_max_running,
        waiting=waiting,
        run_anyway=run_anyway,
        trace=trace,
    )


def _job(
    new: store.NewJob,
    opts: JobOptions,
    payload: Any,
    using: str | None,
    keys: list[str | None] | None = None,
    trace: tracing.TraceContext | None = None,
) -> Job:
    """The new job as a model instance, complete without reading it back: what the caller
    gave, and what the enqueue statement returned (id, run_at, created_at, vtime)."""
    job = Job(
        id=new.id,
        queue=opts.queue,
        tenant_id=opts.tenant,
        task=opts.task,
        payload=payload,
        status=Status.QUEUED if opts.run_at is None else Status.SCHEDULED,
        priority=opts.priority,
        vtime=new.vtime,
        attempts=0,
        max_attempts=opts.max_attempts,
        run_at=new.run_at,
        idempotency_key=opts.idempotency_key,
        created_at=new.created_at,
        timeout_seconds=opts.timeout,
    )
    if keys and keys[0] is not None:
        job.concurrency_key, job.key_max_running = keys[0], opts.key_max_running
        job.key_state, job.gated = KeyState.NEW, None
    if trace is not None and tracing.well_formed(trace.traceparent):  # as store.enqueue kept it
        job.traceparent = trace.traceparent
        job.tracestate = tracing.bounded_tracestate(trace.tracestate)
    job._state.adding = False
    job._state.db = queue_db(using)
    return job


# -- operator actions ---------------------------------------------------------------------


def _bulk(
    ids: Sequence[int], using: str | None, action: str, allowed: str, change: Any
) -> BulkResult:
    ids = list(dict.fromkeys(int(i) for i in ids))
    result = BulkResult()
    if not ids:
        return result
    with transaction.atomic(using=queue_db(using)), connections[queue_db(using)].cursor() as cursor:
        result.changed = sorted(change(cursor, ids))
        rest = [i for i in ids if i not in set(result.changed)]
        if rest:
            result.statuses = store.statuses(cursor, rest)
            for i in rest:
                if i in result.statuses:
                    status = result.statuses[i]
                    result.skipped[i] = f"job {i} is {status}; only {allowed} jobs can be {action}"
                else:
                    result.missing.append(i)
                    result.skipped[i] = f"job {i} does not exist"
    return result


def cancel_jobs(ids: Sequence[int], *, using: str | None = None) -> BulkResult:
    """Cancel waiting, scheduled or queued jobs at once; ask running ones to stop
    (``requested``: their worker ends them 'cancelled', see ``pgqueue.stop_store``).
    Finished are skipped. Their dependents are settled once this commits: cancelled too,
    unless they run anyway (``pgqueue.workflows``)."""
    asked: list[int] = []
    db = queue_db(using)

    def change(cursor: Any, ids: list[int]) -> list[int]:
        changed = stop_store.cancel(cursor, ids, asked=asked)
        ended = sorted(set(changed) - set(asked))
        if ended:  # their dependents are cancelled too, or run anyway
            transaction.on_commit(
                partial(workflows.settle_after_commit, db, upstreams=ended), using=db
            )
        return changed

    result = _bulk(ids, using, "cancelled", CANCELLABLE, change)
    result.requested, result.changed = sorted(asked), sorted(set(result.changed) - set(asked))
    return result


def retry_jobs(ids: Sequence[int], *, using: str | None = None) -> BulkResult:
    """Send dead or cancelled jobs back to run: attempts restart from 0, history is kept.

    A job whose run_at is still ahead waits in scheduled; the others are queued now with a
    fresh fair vtime. A job with dependencies waits for them again (it runs once they are
    done, and is cancelled again if one is still dead or cancelled), and the dependents the
    end of a retried job cancelled wait for it again (``pgqueue.workflows``).
    """

    db = queue_db(using)

    def change(cursor: Any, ids: list[int]) -> list[int]:
        retried = store.retry_many(cursor, ids)
        # One with dependencies waits for them again; the dependents the end of those
        # retried cancelled wait again too. Both are settled once this commits.
        waiting = set(workflow_store.wait_again(cursor, [job_id for job_id, _ in retried]))
        due = [job_id for job_id, is_due in retried if is_due and job_id not in waiting]
        if due:
            store.promote_ids(cursor, due)
        resumed = workflow_store.resume(cursor, [job_id for job_id, _ in retried])
        if waiting or resumed:
            transaction.on_commit(
                partial(workflows.settle_after_commit, db, ids=sorted(waiting | set(resumed))),
                using=db,
            )
        return [job_id for job_id, _ in retried]

    return _bulk(ids, using, "retried", "dead or cancelled", change)


def run_jobs_now(ids: Sequence[int], *, using: str | None = None) -> BulkResult:
    """Make scheduled jobs runnable now instead of at their run_at."""

    def change(cursor: Any, ids: list[int]) -> list[int]:
        changed = store.run_now_many(cursor, ids)
        if changed:
            store.promote_ids(cursor, changed)
        return changed

    return _bulk(ids, using, "run now", "scheduled", change)


def _single(result: BulkResult, job_id: int, action: str, allowed: str, using: str | None) -> Job:
    job_id = int(job_id)
    if job_id in result.missing:
        raise JobNotFound(f"job {job_id} does not exist")
    if job_id in result.skipped:
        raise InvalidTransition(job_id, result.statuses[job_id], action, allowed)
    return Job.objects.using(queue_db(using)).get(pk=job_id)


def cancel(job_id: int, *, using: str | None = None) -> Job:
    """Cancel one job, or ask it to stop when running (the Job returned is then running,
    its ``cancel_requested_at`` set, unless its worker ended it before the Job was read);
    raises JobNotFound or InvalidTransition (finished)."""
    return cancel_or_ask(job_id, using=using)[0]


def cancel_or_ask(job_id: int, *, using: str | None = None) -> tuple[Job, bool]:
    """``cancel``, and whether the job was running and asked to stop: what the request did,
    which the Job read afterwards may no longer show (its worker, told at once, can end it
    first)."""
    result = cancel_jobs([job_id], using=using)
    job = _single(result, job_id, "cancelled", CANCELLABLE, using)
    return job, int(job_id) in result.requested


def cancel_workflow(
    workflow_id: int, *, tenant: str | None = None, using: str | None = None
) -> BulkResult:
    """Cancel every unfinished job of a workflow (running ones are asked to stop, as
    ``cancel_jobs`` does). ``tenant``: the workflow must be that tenant's, else
    JobNotFound, as for a workflow that does not exist."""
    db = queue_db(using)
    workflow = WorkflowRow.objects.using(db).filter(pk=workflow_id)
    if tenant is not None:
        workflow = workflow.filter(tenant_id=tenant)
    if not workflow.exists():
        raise JobNotFound(f"workflow {workflow_id} does not exist")
    live = list(
        Job.objects.using(db)
        .filter(workflow_id=workflow_id, status__in=LIVE_STATUSES)
        .order_by("id")
        .values_list("id", flat=True)
    )
    return cancel_jobs(live, using=using)


def check_queue_bound(tenant: str, queue: str, *, using: str | None = None) -> None:
    """Raise TooManyQueues unless a job of ``tenant`` may become live in ``queue`` under
    PGQUEUE["MAX_QUEUES_PER_TENANT"], as an enqueue there would be: for a retry asked by
    the tenant (the HTTP API's), which would otherwise bring its finished jobs of any
    number of old queues back to life. Not atomic with the retry: racing ones may pass the
    bound by their number, as racing enqueues may."""
    bound = pgqueue_settings.MAX_QUEUES_PER_TENANT
    if bound is None:
        return
    with connections[queue_db(using)].cursor() as cursor:
        if not store.queue_admitted(cursor, tenant=tenant, queue=queue, max_queues=bound):
            raise TooManyQueues(tenant, queue, bound)


def retry(job_id: int, *, using: str | None = None) -> Job:
    """Retry one dead or cancelled job; raises JobNotFound or InvalidTransition."""
    return _single(retry_jobs([job_id], using=using), job_id, "retried", "dead or cancelled", using)


def set_tenant_weight(
    tenant: str, weight: float, *, queue: str | None = None, using: str | None = None
) -> None:
    """Set a tenant's weight in every queue, or with ``queue`` in that queue only.

    Creates the tenant if new. Applies to jobs that become runnable from now on.
    """
    tenant = validate_name(tenant, "tenant")
    if queue is not None:
        queue = validate_name(queue, "queue")
    weight = validate_weight(weight)
    with connections[queue_db(using)].cursor() as cursor:
        store.set_weight(cursor, tenant=tenant, weight=weight, queue=queue)
