"""Running handlers: a claimed job's handler on a thread, its return or raise an outcome.

The loop (``runtime``) decides what to claim and records what came of it; this module
runs: it gives each claimed job the context its handler sees, runs the handler on one of
the pool's threads and turns whatever it returned or raised into a ``HandlerOutcome``.
An ``async def`` handler is awaited instead on the process's one event loop, which runs on
a thread of its own (``EventLoopThread``, started with the first such job). Async and
thread jobs share the worker's ``concurrency`` slots: the loop claims no more jobs than
it has free slots, whichever kind they are.
It never writes the queue's rows (a handler may use Django's connections, closed again
after each job), so every write of the worker stays on the loop's connection and thread.
Each outcome goes back through ``deliver``, which the loop gives and which must be safe to
call from any thread.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import re
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import close_old_connections

from ..conf import pgqueue_settings
from ..exceptions import PermanentError, UnknownTask
from ..log import job_context
from ..registry import get_task
from ..store import ClaimedJob
from .context import JobContext

T = TypeVar("T")


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


class EventLoopThread:
    """One asyncio event loop, run for ever on a thread of its own, for async handlers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="pgqueue-asyncio", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the loop from any thread; its future resolves with it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


class JobExecutor:
    """A pool of handler threads (and an event loop) that hands every outcome to ``deliver``."""

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
        self._events: EventLoopThread | None = None
        self._events_lock = threading.Lock()
        self._awaiting: set[Future] = set()  # futures of async handlers not finished yet

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

        A thread job's ``future`` can still be cancelled until the handler starts. An async
        job starts on the event loop at once (a free slot was claimed for it), so it counts
        as started from here and is never given back unstarted.
        """
        ctx = self.context(job)
        func = _handler_of(ctx.task)
        if func is not None and inspect.iscoroutinefunction(func):
            ctx.started = True
            ctx.future = self._event_loop().submit(run_async_handler(ctx, func))
            self._awaiting.add(ctx.future)
        else:
            ctx.future = self.pool.submit(run_handler, ctx, self._await)
        ctx.future.add_done_callback(functools.partial(self._on_done, ctx))
        return ctx

    def shutdown(self, wait: bool = True) -> None:
        """Wait for the thread jobs, then for the async ones, then stop the event loop."""
        self.pool.shutdown(wait=wait)
        if self._events is None:
            return
        if wait:
            futures.wait(list(self._awaiting))
        self._events.stop()
        self._events = None

    def _event_loop(self) -> EventLoopThread:
        with self._events_lock:
            if self._events is None:
                self._events = EventLoopThread()
            return self._events

    def _await(self, awaitable: Awaitable[T]) -> T:
        """On a handler thread: await what a plain function returned (on the event loop)."""

        async def wait() -> T:
            return await awaitable

        return self._event_loop().submit(wait()).result()

    def _on_done(self, ctx: JobContext, future: Future) -> None:
        """Hand the outcome to the loop; also covers a handler that raised SystemExit."""
        self._awaiting.discard(future)
        if future.cancelled():
            if not ctx.started:
                return  # given back unstarted: there is nothing to record
            self.deliver(HandlerOutcome(ctx, ok=False, error="the handler was cancelled"))
            return
        exc = future.exception()  # a BaseException that escaped run_handler, e.g. sys.exit()
        outcome = future.result() if exc is None else HandlerOutcome(ctx, ok=False)
        if exc is not None:
            outcome.error = describe_error(exc)
        self.deliver(outcome)


def serves(task: str) -> bool:
    """Whether this process has a handler for ``task`` (the registry resolves it)."""
    try:
        get_task(task)
    except UnknownTask:
        return False
    return True


def _handler_of(task: str) -> Callable[..., Any] | None:
    try:
        return get_task(task).func
    except Exception:
        return None  # run_handler records the lookup's error as the attempt's failure


def run_handler(
    ctx: JobContext, await_: Callable[[Awaitable[Any]], Any] | None = None
) -> HandlerOutcome:
    """Run the job's handler once and say how it ended; an Exception is an outcome too.

    Whatever the handler returned or raised, the outcome holds only what PostgreSQL
    stores: a result that cannot be stored fails the attempt instead (retried or dead as
    any failure), and error texts are made storable and bounded, never refused. A plain
    function that returns an awaitable (a wrapped ``async def``) has it awaited through
    ``await_`` (on the event loop) while this thread waits.
    """
    ctx.started = True
    started = time.perf_counter()
    outcome = HandlerOutcome(ctx, ok=False)
    try:
        with job_context(ctx):
            value = get_task(ctx.task).func(ctx.payload, ctx)
            if await_ is not None and inspect.isawaitable(value):
                value = await_(_in_job(ctx, value))
        _returned(outcome, value)
    except Exception as exc:
        _raised(outcome, exc)
    finally:
        outcome.duration = time.perf_counter() - started
        close_old_connections()
    return outcome


async def run_async_handler(ctx: JobContext, func: Callable[..., Awaitable[Any]]) -> HandlerOutcome:
    """``run_handler`` for an ``async def`` handler, awaited on the event loop.

    Django's connections are not closed afterwards: an async handler reaches the ORM
    through ``sync_to_async``, whose thread keeps its own.
    """
    ctx.started = True
    started = time.perf_counter()
    outcome = HandlerOutcome(ctx, ok=False)
    try:
        with job_context(ctx):
            value = await func(ctx.payload, ctx)
        _returned(outcome, value)
    except (Exception, asyncio.CancelledError) as exc:
        _raised(outcome, exc)
    finally:
        outcome.duration = time.perf_counter() - started
    return outcome


async def _in_job(ctx: JobContext, awaitable: Awaitable[T]) -> T:
    with job_context(ctx):
        return await awaitable


def _returned(outcome: HandlerOutcome, value: Any) -> None:
    try:
        outcome.result_json = encode_result(value)
        outcome.ok = True
    except ResultNotStorable as exc:
        outcome.error = storable_text(f"result not storable: {exc}", ERROR_MAX_BYTES)


def _raised(outcome: HandlerOutcome, exc: BaseException) -> None:
    """Called in the ``except`` block, while the traceback is at hand."""
    outcome.error = describe_error(exc)
    outcome.permanent = isinstance(exc, PermanentError)
    outcome.traceback = format_traceback()


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
