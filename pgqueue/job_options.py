"""What an enqueue may ask for, checked: names, priorities, attempts, delays, payloads,
timeouts and concurrency keys, and the options of a call with the task's and the settings'
defaults filled in (``resolve_options``).

Every entry point (the Python API, the HTTP API, the Tasks backend, periodic schedules)
goes through ``pgqueue.services``, which re-exports these, so bad input is refused with the
same field and reason wherever it comes from.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from .conf import pgqueue_settings
from .exceptions import InvalidJob, PayloadTooLarge
from .key_models import KEY_MAX_LENGTH, KEY_MAX_RUNNING_BOUND
from .models import MAX_WEIGHT, MIN_WEIGHT
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
        raise PayloadTooLarge(size, limit, field_name)
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
