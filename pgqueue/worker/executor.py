"""Running handlers: a claimed job's handler on a thread, its return or raise an outcome.

The loop (``runtime``) decides what to claim and records what came of it; this module
runs: it gives each claimed job the context its handler sees, runs the handler on one of
the pool's threads and turns whatever it returned or raised into a ``HandlerOutcome``.
It never writes the queue's rows (a handler may use Django's connections, closed again
after each job), so every write of the worker stays on the loop's connection and thread.
Each outcome goes back through ``deliver``, which the loop gives and which must be safe to
call from any thread.
"""

from __future__ import annotations

import functools
import json
import re
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.db import close_old_connections

from ..conf import pgqueue_settings
from ..exceptions import PermanentError
from ..log import job_context
from ..registry import get_task
from ..store import ClaimedJob
from .context import JobContext


@dataclass(slots=True)
class HandlerOutcome:
    """How one run of a handler ended, waiting to be recorded."""

    ctx: JobContext
    ok: bool
    result_json: str | None = None
    error: str | None = None
    traceback: str | None = None
    permanent: bool = False
    duration: float = 0.0


class JobExecutor:
    """A pool of handler threads that hands every outcome to ``deliver``."""

    def __init__(
        self,
        threads: int,
        *,
        worker_id: str,
        heartbeat: Callable[[float], None],
        deliver: Callable[[HandlerOutcome], None],
    ) -> None:
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="pgqueue-job")
        self.worker_id = worker_id
        self.heartbeat = heartbeat
        self.deliver = deliver

    def context(self, job: ClaimedJob) -> JobContext:
        """The context a claimed job's handler sees (not started yet)."""
        return JobContext(
            id=job.id,
            task=job.task,
            payload=job.payload,
            tenant=job.tenant,
            queue=job.queue,
            priority=job.priority,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            worker_id=self.worker_id,
            heartbeat=self.heartbeat,
        )

    def start(self, job: ClaimedJob) -> JobContext:
        """Queue a claimed job's handler; returns the context the handler will see.

        The context's ``future`` can still be cancelled until the handler starts.
        """
        ctx = self.context(job)
        ctx.future = self.pool.submit(run_handler, ctx)
        ctx.future.add_done_callback(functools.partial(self._on_done, ctx))
        return ctx

    def shutdown(self, wait: bool = True) -> None:
        self.pool.shutdown(wait=wait)

    def _on_done(self, ctx: JobContext, future: Future) -> None:
        """Hand the outcome to the loop; also covers a handler that raised SystemExit."""
        if future.cancelled():
            return  # given back unstarted: there is nothing to record
        exc = future.exception()  # a BaseException that escaped run_handler, e.g. sys.exit()
        outcome = future.result() if exc is None else HandlerOutcome(ctx, ok=False)
        if exc is not None:
            outcome.error = describe_error(exc)
        self.deliver(outcome)


def run_handler(ctx: JobContext) -> HandlerOutcome:
    """Run the job's handler once and say how it ended; an Exception is an outcome too.

    Whatever the handler returned or raised, the outcome holds only what PostgreSQL
    stores: a result that cannot be stored fails the attempt instead (retried or dead as
    any failure), and error texts are made storable and bounded, never refused.
    """
    ctx.started = True
    started = time.perf_counter()
    outcome = HandlerOutcome(ctx, ok=False)
    try:
        with job_context(ctx):
            value = get_task(ctx.task).func(ctx.payload, ctx)
        try:
            outcome.result_json = encode_result(value)
            outcome.ok = True
        except ResultNotStorable as exc:
            outcome.error = storable_text(f"result not storable: {exc}", ERROR_MAX_BYTES)
    except PermanentError as exc:
        outcome.error, outcome.permanent = describe_error(exc), True
        outcome.traceback = format_traceback()
    except Exception as exc:
        outcome.error = describe_error(exc)
        outcome.traceback = format_traceback()
    finally:
        outcome.duration = time.perf_counter() - started
        close_old_connections()
    return outcome


#: Bounds of the error texts recorded for a failed attempt, in bytes of UTF-8: the job's
#: ``last_error`` (and the attempt's error) keeps its first 4 KiB, the attempt's traceback
#: its last 64 KiB (where the innermost frames and the exception are).
ERROR_MAX_BYTES = 4 * 1024
TRACEBACK_MAX_BYTES = 64 * 1024
TRUNCATED = " [truncated]"

# An escaped NUL in JSON text: \u0000 not itself preceded by an escaping backslash.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class ResultNotStorable(ValueError):
    """A handler's return value that the job's result (jsonb) cannot hold; says why."""


def encode_result(value: Any) -> str | None:
    """A handler's return value as the JSON text stored in the job's result.

    Raises ``ResultNotStorable`` for what jsonb refuses (NUL characters, lone
    surrogates), what JSON cannot express (NaN, Infinity, sets, arbitrary objects) and
    what is larger than ``PGQUEUE["MAX_RESULT_BYTES"]``.
    """
    if value is None:
        return None
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        raise ResultNotStorable("nested too deeply for JSON") from None
    except ValueError as exc:
        if "Out of range float" in str(exc):
            raise ResultNotStorable("holds NaN or Infinity, which JSON cannot express") from None
        raise ResultNotStorable(f"not JSON-serialisable: {describe_error(exc)}") from None
    except Exception as exc:
        raise ResultNotStorable(f"not JSON-serialisable: {describe_error(exc)}") from None
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise ResultNotStorable("holds a lone surrogate, which is not text") from None
    if _JSON_NUL.search(text):
        raise ResultNotStorable("holds a NUL character, which PostgreSQL cannot store")
    limit = int(pgqueue_settings.MAX_RESULT_BYTES)
    if size > limit:
        raise ResultNotStorable(
            f"{size} bytes of JSON, more than PGQUEUE['MAX_RESULT_BYTES'] ({limit})"
        )
    return text


def storable_text(text: str, limit: int, *, keep_end: bool = False) -> str:
    """``text`` as PostgreSQL stores it and at most ``limit`` bytes of UTF-8.

    NUL becomes the four characters ``\\x00`` and a lone surrogate its ``\\udcff`` escape,
    so the text says what was there; too long, it keeps its start (or its end) and says so.
    """
    data = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return data.decode()
    room = limit - len(TRUNCATED)
    if keep_end:
        return TRUNCATED.lstrip() + " " + data[-(room - 1) :].decode(errors="ignore")
    return data[:room].decode(errors="ignore") + TRUNCATED


def describe_error(exc: BaseException) -> str:
    """``module.Type: message`` (builtins unqualified), the job's ``last_error``.

    Storable and bounded (see ``storable_text``), even when ``str(exc)`` itself raises.
    """
    try:
        text = str(exc)
    except Exception as failure:
        text = f"<str() raised {type(failure).__name__}: {_safe_str(failure)}>"
    name = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
    return storable_text(f"{name}: {text}" if text else name, ERROR_MAX_BYTES)


def format_traceback() -> str:
    """The traceback of the exception being handled, storable and bounded."""
    try:
        text = traceback.format_exc()
    except Exception as failure:
        text = f"<the traceback could not be formatted: {_safe_str(failure)}>"
    return storable_text(text, TRACEBACK_MAX_BYTES, keep_end=True)


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return type(exc).__name__
