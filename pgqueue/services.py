"""The service layer: every state change a user or operator asks for.

The Python API, the HTTP API, the admin and the Tasks backend all call these functions;
none of them writes job rows itself. Validation lives here too, so every entry point
refuses bad input with the same field and reason.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from django.db import connections, transaction
from django.utils import timezone

from . import stop_store, store
from .conf import pgqueue_settings, queue_db
from .exceptions import (
    InvalidJob,
    InvalidTransition,
    JobNotFound,
    PayloadTooLarge,
    TooManyQueues,
)
from .key_models import KEY_MAX_LENGTH, KEY_MAX_RUNNING_BOUND, KeyState
from .models import MAX_WEIGHT, MIN_WEIGHT, Job, Status
from .nesting import nested_deeper_than
from .registry import RegisteredTask, get_task
from .timeouts import resolve_timeout

#: Idempotency keys starting so belong to periodic schedules (schedules.tick_key): the
#: schedules enqueue through the store, the service layer refuses them to everyone else.
RESERVED_KEY_PREFIX = "periodic:"

NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}\Z")
MAX_DELAY_SECONDS = 365 * 24 * 3600
MAX_BATCH = 1000
IDEMPOTENCY_KEY_MAX = 255
CANCELLABLE = "scheduled, queued or running"


class Enqueued(NamedTuple):
    """What ``enqueue`` returns: the job, and False when an idempotency key matched."""

    job: Job
    created: bool


#: A concurrency key: text for every job, a list with one per payload (enqueue_many), or a
#: function of the payload; None: no key.
KeyRule = str | Sequence[str | None] | Callable[[Any], str | None] | None


@dataclass(frozen=True)
class JobOptions:
    """Validated, defaulted options of an enqueue call."""

    task: str
    tenant: str
    queue: str
    priority: int
    max_attempts: int
    run_at: dt.datetime | None  # None: runnable now
    idempotency_key: str | None
    timeout: float | None = None  # seconds per attempt (pgqueue.timeouts)
    #: A key for every job, or a function of its payload giving one (or None: no key).
    concurrency_key: KeyRule = None
    key_max_running: int = 1  # the cap of the keyed jobs' key (pgqueue.key_models)

    def keys(self, payloads: Sequence[Any]) -> list[str | None] | None:
        """Each payload's concurrency key, checked; None when no job has one."""
        key = self.concurrency_key
        if key is None:
            return None
        if isinstance(key, list | tuple):  # one per payload (enqueue_many)
            if len(key) != len(payloads):
                raise InvalidJob("concurrency_key", "must give one key (or None) per payload")
            keys = [validate_key(k) for k in key]
        else:
            keys = [validate_key(key(p) if callable(key) else key) for p in payloads]
        return keys if any(k is not None for k in keys) else None


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


# -- validation ---------------------------------------------------------------------------


def validate_name(value: Any, field_name: str) -> str:
    if not isinstance(value, str):
        raise InvalidJob(field_name, "must be a string")
    if not value:
        raise InvalidJob(field_name, "must not be empty")
    if not NAME_RE.match(value):
        raise InvalidJob(field_name, "must match [A-Za-z0-9_.-]{1,64}")
    return value


def _int_in_range(value: Any, field_name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJob(field_name, f"must be an integer from {low} to {high}")
    if not low <= value <= high:
        raise InvalidJob(field_name, f"must be from {low} to {high}, got {value}")
    return value


def validate_key(value: Any, field_name: str = "concurrency_key") -> str | None:
    """A concurrency key: text of 1 to KEY_MAX_LENGTH characters, or None (no key)."""
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= KEY_MAX_LENGTH or not _storable(value):
        raise InvalidJob(
            field_name, f"must be text of 1 to {KEY_MAX_LENGTH} characters, without NUL"
        )
    return value


def validate_key_max_running(value: Any) -> int:
    return _int_in_range(value, "key_max_running", 1, KEY_MAX_RUNNING_BOUND)


def validate_priority(value: Any) -> int:
    return _int_in_range(value, "priority", -100, 100)


def validate_max_attempts(value: Any) -> int:
    return _int_in_range(value, "max_attempts", 1, 100)


def validate_weight(value: Any) -> float:
    """A weight within [MIN_WEIGHT, MAX_WEIGHT] (``models``; the CHECK constraints hold the
    same bounds): outside them ``1 / weight`` overflows float8 or stops a tenant's clock."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidJob("weight", f"must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidJob("weight", f"must be a finite number greater than 0, got {value}")
    if not MIN_WEIGHT <= value <= MAX_WEIGHT:
        raise InvalidJob("weight", f"must be from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, got {value:g}")
    return float(value)


def _run_at(run_at: Any, delay: Any) -> dt.datetime | None:
    """When the job becomes runnable; None means now (it is queued, not scheduled)."""
    if run_at is not None and delay is not None:
        raise InvalidJob("run_at", "give run_at or delay, not both")
    if delay is not None:
        if isinstance(delay, dt.timedelta):
            seconds = delay.total_seconds()
        elif isinstance(delay, int | float) and not isinstance(delay, bool):
            seconds = float(delay)
        else:
            raise InvalidJob("delay", "must be a number of seconds or a timedelta")
        if not math.isfinite(seconds) or not 0 <= seconds <= MAX_DELAY_SECONDS:
            raise InvalidJob("delay", f"must be from 0 to {MAX_DELAY_SECONDS} seconds")
        return timezone.now() + dt.timedelta(seconds=seconds) if seconds > 0 else None
    if run_at is not None:
        if not isinstance(run_at, dt.datetime):
            raise InvalidJob("run_at", "must be a datetime")
        if timezone.is_naive(run_at):
            # A guess (UTC, or TIME_ZONE) would silently move the job by the offset the
            # caller meant; HTTP refuses a run_at without an offset the same way.
            raise InvalidJob(
                "run_at",
                "must be timezone-aware: give a UTC offset (2030-01-01T09:00:00Z, +01:00) "
                "or build it with django.utils.timezone (now(), make_aware())",
            )
        return run_at if run_at > timezone.now() else None
    return None


def encode_payload(payload: Any, field_name: str = "payload") -> str:
    """The payload as JSON text, refusing what JSON (and jsonb) cannot hold, and what is
    nested deeper than PGQUEUE["MAX_JSON_DEPTH"] (see pgqueue.nesting)."""
    depth = int(pgqueue_settings.MAX_JSON_DEPTH)
    if nested_deeper_than(payload, depth):
        raise InvalidJob(
            field_name,
            f"is nested more than {depth} levels deep (PGQUEUE['MAX_JSON_DEPTH'])",
        )
    try:
        text = json.dumps(payload, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        data = text.encode()
    except RecursionError:
        raise InvalidJob(field_name, "is nested too deeply") from None
    except UnicodeEncodeError:
        raise InvalidJob(field_name, "contains an unpaired surrogate, which is not text") from None
    except (TypeError, ValueError) as exc:
        raise InvalidJob(field_name, f"is not JSON-serialisable: {exc}") from None
    if "\\u0000" in text:
        raise InvalidJob(field_name, "contains a NUL character, which PostgreSQL cannot store")
    limit = int(pgqueue_settings.MAX_PAYLOAD_BYTES)
    size = len(data)
    if size > limit:
        raise PayloadTooLarge(size, limit)
    return text


def resolve_options(
    task: RegisteredTask | str,
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
) -> JobOptions:
    """Validate an enqueue call's options and fill in the task's and settings' defaults."""
    if isinstance(task, str):
        task = get_task(task)
    elif not isinstance(task, RegisteredTask):
        raise InvalidJob("task", "must be a task name or a @pgqueue.task function")
    s = pgqueue_settings
    if idempotency_key is not None and (
        not isinstance(idempotency_key, str)
        or not 1 <= len(idempotency_key) <= IDEMPOTENCY_KEY_MAX
        or not _storable(idempotency_key)
    ):
        raise InvalidJob(
            "idempotency_key",
            f"must be text of 1 to {IDEMPOTENCY_KEY_MAX} characters, without NUL",
        )
    if idempotency_key is not None and idempotency_key.startswith(RESERVED_KEY_PREFIX):
        # A periodic schedule's job of a tick is keyed periodic:<name>:<tick>; a job
        # enqueued first under that key (a 300-day delay, say) would be taken for the
        # tick's and the real one would never run.
        raise InvalidJob(
            "idempotency_key",
            f"keys starting {RESERVED_KEY_PREFIX!r} are reserved for periodic schedules",
        )
    return JobOptions(
        task=task.name,
        tenant=validate_name(s.DEFAULT_TENANT if tenant is None else tenant, "tenant"),
        queue=validate_name(_first(queue, task.queue, s.DEFAULT_QUEUE), "queue"),
        priority=validate_priority(_first(priority, task.priority, 0)),
        max_attempts=validate_max_attempts(
            _first(max_attempts, task.max_attempts, s.DEFAULT_MAX_ATTEMPTS)
        ),
        run_at=_run_at(run_at, delay),
        idempotency_key=idempotency_key,
        timeout=resolve_timeout(timeout, task.timeout),
        concurrency_key=_key_rule(
            task.concurrency_key if concurrency_key is None else concurrency_key
        ),
        key_max_running=validate_key_max_running(
            _first(key_max_running, task.key_max_running, s.DEFAULT_KEY_MAX_RUNNING)
        ),
    )


def _key_rule(
    key: KeyRule,
) -> KeyRule:
    """A concurrency key given as text is checked now; a function of the payload, per job."""
    if key is None or callable(key) or isinstance(key, list | tuple):
        return key  # checked per job
    return validate_key(key)


def _storable(text: str) -> bool:
    """Text PostgreSQL can store: no NUL, no unpaired surrogate."""
    if "\x00" in text:
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)


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
    using: str | None = None,
) -> Enqueued:
    """Enqueue one job in the current transaction of ``using``.

    A rollback of the surrounding transaction leaves no job, charges the tenant no
    virtual time and wakes no worker (the notification is delivered on commit only).
    With an idempotency key already used by the tenant, returns that job and False.
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
    if opts.idempotency_key is None:
        with connections[queue_db(using)].cursor() as cursor:
            (new,), _ = _insert(cursor, opts, payloads_json, 1, keys)
        return Enqueued(_job(new, opts, payload, using, keys), True)

    # A savepoint makes the refund below exact: the clock row stays locked until it ends.
    with transaction.atomic(using=queue_db(using)), connections[queue_db(using)].cursor() as cursor:
        inserted, charged = _insert(cursor, opts, payloads_json, 1, keys)
        if inserted:
            return Enqueued(_job(inserted[0], opts, payload, using, keys), True)
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
    using: str | None = None,
) -> list[int]:
    """Enqueue one job per payload, in order, and return their ids.

    Each chunk of up to 1,000 jobs is one statement; all chunks share one transaction, so
    either every job is enqueued or none is. The tenant's jobs keep the payloads' order.
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
    ids: list[int] = []
    with transaction.atomic(using=queue_db(using)), connections[queue_db(using)].cursor() as cursor:
        for start in range(0, len(encoded), MAX_BATCH):
            chunk = encoded[start : start + MAX_BATCH]
            chunk_keys = None if keys is None else keys[start : start + MAX_BATCH]
            inserted, _ = _insert(cursor, opts, f"[{','.join(chunk)}]", len(chunk), chunk_keys)
            ids.extend(new.id for new in inserted)
    return ids


def _insert(
    cursor: Any,
    opts: JobOptions,
    payloads_json: str,
    count: int,
    keys: list[str | None] | None = None,
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
    )


def _job(
    new: store.NewJob,
    opts: JobOptions,
    payload: Any,
    using: str | None,
    keys: list[str | None] | None = None,
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
    """Cancel scheduled or queued jobs at once; ask running ones to stop (``requested``:
    their worker ends them 'cancelled', see ``pgqueue.stop_store``). Finished are skipped."""
    asked: list[int] = []
    result = _bulk(ids, using, "cancelled", CANCELLABLE, partial(stop_store.cancel, asked=asked))
    result.requested, result.changed = sorted(asked), sorted(set(result.changed) - set(asked))
    return result


def retry_jobs(ids: Sequence[int], *, using: str | None = None) -> BulkResult:
    """Send dead or cancelled jobs back to run: attempts restart from 0, history is kept.

    A job whose run_at is still ahead waits in scheduled; the others are queued now with a
    fresh fair vtime.
    """

    def change(cursor: Any, ids: list[int]) -> list[int]:
        retried = store.retry_many(cursor, ids)
        due = [job_id for job_id, is_due in retried if is_due]
        if due:
            store.promote_ids(cursor, due)
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
