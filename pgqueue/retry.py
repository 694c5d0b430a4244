"""Per-task retry policies: which errors are retried, and after how long.

A task may say which exceptions are worth another attempt (``retry_on``), which end the
job at once (``discard_on``), and how long to wait before the next attempt (``backoff``).
The worker applies them on its handler thread, when the handler raises, before the
outcome is recorded: a refused retry is recorded as a permanent failure (the job ends
dead, its error kept), a delay as the run time of the next attempt. Without a policy a
task keeps the global one: every exception is retried until ``max_attempts``, with the
full-jitter exponential backoff of ``PGQUEUE["BACKOFF_BASE"]`` and ``["BACKOFF_CAP"]``.

A lease that runs out (the worker died) is not an exception of the handler's: it always
takes the global backoff, whatever the task's policy.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .conf import pgqueue_settings
from .exceptions import PermanentError

#: A task's backoff: a ``Backoff``, or ``f(attempt, error)`` giving seconds or a timedelta
#: before the next attempt (``attempt``: the one that just failed, from 1).
BackoffFunction = Callable[[int, BaseException], float | dt.timedelta]


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: ``min(cap, base * 2 ** (attempt - 1))`` seconds after the failed
    attempt, or a random time up to that with ``jitter`` (the default: "full jitter", so
    that jobs failing together do not all come back together)."""

    base: float = 1.0
    cap: float = 300.0
    jitter: bool = True

    def __post_init__(self) -> None:
        for name in ("base", "cap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"Backoff {name} must be a number of seconds >= 0")
            if not math.isfinite(value):
                raise ValueError(f"Backoff {name} must be finite")

    def __call__(self, attempt: int, error: BaseException | None = None) -> float:
        ceiling = min(float(self.cap), float(self.base) * 2.0 ** min(max(attempt - 1, 0), 64))
        return random.uniform(0.0, ceiling) if self.jitter else ceiling


@dataclass(frozen=True)
class RetryPolicy:
    """What a task says about its failures (``@pgqueue.task(retry_on=..., discard_on=...,
    backoff=...)``); every part None keeps the global behaviour."""

    retry_on: tuple[type[BaseException], ...] | None = None
    discard_on: tuple[type[BaseException], ...] = ()
    backoff: Backoff | BackoffFunction | None = None

    def permanent(self, error: BaseException) -> bool:
        """Whether ``error`` ends the job without another attempt. ``PermanentError``
        always does; ``discard_on`` wins over ``retry_on``; with ``retry_on`` given, an
        error that is none of its classes is not retried."""
        if isinstance(error, PermanentError):
            return True
        if self.discard_on and isinstance(error, self.discard_on):
            return True
        return self.retry_on is not None and not isinstance(error, self.retry_on)

    def delay(self, attempt: int, error: BaseException) -> float | None:
        """Seconds before the next attempt (None: the global backoff, applied by the
        database). A backoff function that raises or gives no usable number falls back to
        the global backoff rather than costing the job its retry; a delay is cut to
        ``PGQUEUE["MAX_RETRY_DELAY_SECONDS"]``."""
        if self.backoff is None:
            return None
        try:
            value = self.backoff(attempt, error)
        except Exception:
            return None
        return bounded_delay(value)


def bounded_delay(value: Any) -> float | None:
    """``value`` (seconds or a timedelta) as seconds in 0..MAX_RETRY_DELAY_SECONDS, or None
    when it is not a usable number."""
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return min(max(float(value), 0.0), float(pgqueue_settings.MAX_RETRY_DELAY_SECONDS))


def exception_classes(name: str, value: Any) -> tuple[type[BaseException], ...] | None:
    """``retry_on`` / ``discard_on`` as a tuple of exception classes (checked when the task
    is declared, so a typo fails at import rather than at the first failure)."""
    if value is None:
        return None
    classes = (value,) if isinstance(value, type) else tuple(value)
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise ValueError(f"{name} must be exception classes, not {cls!r}")
    return classes


def policy(retry_on: Any = None, discard_on: Any = None, backoff: Any = None) -> RetryPolicy | None:
    """The task's policy from ``@pgqueue.task``'s options (None when it has none)."""
    if backoff is not None and not callable(backoff):
        raise ValueError("backoff must be a pgqueue.Backoff or a function (attempt, error)")
    retry = exception_classes("retry_on", retry_on)
    discard = exception_classes("discard_on", discard_on) or ()
    if retry is None and not discard and backoff is None:
        return None
    return RetryPolicy(retry, discard, backoff)
