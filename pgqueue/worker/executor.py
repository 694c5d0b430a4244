"""Running handlers: a claimed job's handler on a thread, its return or raise an outcome.

The loop (``runtime``) decides what to claim and records what came of it; this module
runs: it gives each claimed job the context its handler sees, queues it for one of the
``concurrency`` handler threads and turns whatever the handler returned or raised into a
``HandlerOutcome``. An ``async def`` handler is awaited on the process's one event loop,
which runs on a thread of its own (``EventLoopThread``, started with the first such job),
while the handler thread that took the job waits for it: async and thread jobs share the
worker's ``concurrency`` slots, and jobs claimed ahead (``PGQUEUE["PREFETCH"]``) wait in
the queue, unstarted, whichever kind they are. A job begins when a thread takes it
(``JobContext.began``): its timeout and its ``started_at`` count from then.
It never writes the queue's rows (a handler may use Django's connections, closed again
after each job), so every write of the worker stays on the loop's connection and thread.
Each outcome goes back through ``deliver``, which the loop gives and which must be safe to
call from any thread.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import close_old_connections

from .. import signals, tracing
from ..exceptions import Retry, UnknownTask
from ..log import job_context
from ..registry import get_task
from ..retry import RetryPolicy, bounded_delay
from ..store import ClaimedJob
from .context import JobContext
from .outcome_text import (
    ERROR_MAX_BYTES,
    ResultNotStorable,
    describe_error,
    encode_result,
    format_traceback,
    storable_text,
)

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
    #: Seconds before the next attempt, from the task's backoff (None: the global one).
    retry_in: float | None = None
    #: Seconds to snooze (``pgqueue.Retry``): not a failure, the attempt given back.
    snooze: float | None = None
    duration: float = 0.0  # seconds the handler ran (ended - ctx.began)
    #: time.monotonic() when the handler returned or raised; None when it did not run or
    #: the worker ended the attempt first (the outcome is recorded as of then).
    ended: float | None = None


#: What a handler may raise that ends its attempt (and nothing else). SystemExit and
#: KeyboardInterrupt are a handler's outcome like any error: a handler thread is not the
#: main thread, so neither can come from a signal there, and letting them through would
#: end a thread of the worker (or its event loop) instead of the job.
HANDLER_ERRORS = (Exception, SystemExit, KeyboardInterrupt)

logger = logging.getLogger("pgqueue.worker")


class EventLoopThread:
    """One asyncio event loop, run for ever on a thread of its own, for async handlers.

    Handlers share it, so none may end it: a handler can stop the running loop
    (``asyncio.get_running_loop().stop()``) or have SystemExit raised from a callback,
    which asyncio lets out of ``run_forever``. Either would leave every other async job
    awaiting for ever and the next one refused ("Event loop is closed"). So the loop runs
    again at once whenever it stops without ``stop()`` having been called; its tasks are
    untouched in between.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._stopping = False
        self.thread = threading.Thread(target=self._run, name="pgqueue-asyncio", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            while True:
                try:
                    self.loop.run_forever()
                except (SystemExit, KeyboardInterrupt) as exc:  # raised by a handler's code
                    logger.error(
                        "event=event_loop_interrupted error=%r action=run_again",
                        describe_error(exc),
                    )
                if self._stopping:
                    break
                logger.warning("event=event_loop_stopped_by_a_handler action=run_again")
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the loop from any thread; its future resolves with it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self._stopping = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


class JobExecutor:
    """Long-lived handler threads fed from one local queue; every outcome goes to ``deliver``.

    The loop ``start``s each claimed job: it waits in the queue until one of the
    ``threads`` takes it, runs it and hands the outcome to ``deliver``. A plain queue of
    contexts and N threads that never end cost a job two queue operations; a pool's
    per-job Future, its Condition, work item and done-callback cost several times that
    (bench/results/worker-profile.md). A job still in the queue has not started and can be
    taken back (``take_unstarted``): each item of the queue goes to exactly one taker, a thread or
    the loop, so nothing runs after being given back.
    """

    def __init__(
        self,
        threads: int,
        *,
        worker_id: str,
        heartbeat: Callable[[float], None],
        deliver: Callable[[HandlerOutcome], None],
        timing: Callable[[], None] | None = None,
    ) -> None:
        self.threads = threads
        self.worker_id = worker_id
        self.heartbeat = heartbeat
        self.deliver = deliver
        #: Called on a handler thread when a job with a timeout begins (its deadline runs
        #: from now, and the loop must know to watch it), or reports progress or output
        #: first since the last round (the loop must know to write it): wakes the loop.
        self.timing = timing
        self._jobs: queue.SimpleQueue[JobContext | None] = queue.SimpleQueue()
        #: Set when the worker is asked to stop (``stop_starting``): a thread that frees up
        #: then starts no job it takes from the queue, but keeps it in ``_declined`` for
        #: ``take_unstarted``, so that a job claimed ahead is given back, not run, however
        #: late the loop comes to give the queued ones back.
        self._no_new_starts = threading.Event()
        self._declined: list[JobContext] = []
        self._declined_lock = threading.Lock()
        self._pool: list[threading.Thread] = []  # started with the first job
        self._events: EventLoopThread | None = None
        self._events_lock = threading.Lock()

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
            timeout=job.timeout,
            record_start_first=job.lost_claims > 0,
            workflow_id=job.workflow_id,
            step=job.step,
            traceparent=job.traceparent,
            tracestate=job.tracestate,
            wake=self.timing,
        )

    def start(self, job: ClaimedJob) -> JobContext:
        """Queue a claimed job for the next free thread; returns the context it will see.

        Until a thread takes it (``started`` turns true then), ``take_unstarted`` can
        still give it back. An async job, too, waits for a thread, which awaits it on the
        event loop: async and thread jobs share the ``threads`` slots.
        """
        ctx = self.context(job)
        if not self._pool:
            self._pool = [
                threading.Thread(target=self._work, name=f"pgqueue-job_{i}", daemon=True)
                for i in range(self.threads)
            ]
            for thread in self._pool:
                thread.start()
        self._jobs.put(ctx)
        return ctx

    def queued(self) -> int:
        """Jobs waiting for a thread (approximate while the threads take them)."""
        return self._jobs.qsize()

    def stop_starting(self) -> None:
        """From now on no thread starts a job it has not started yet (the worker stops: it
        gives those back). Safe from any thread."""
        self._no_new_starts.set()

    def take_unstarted(self) -> list[JobContext]:
        """Take back every job no thread has started: none of them will run here."""
        with self._declined_lock:
            taken, self._declined = self._declined, []
        stops = 0
        while True:
            try:
                ctx = self._jobs.get_nowait()
            except queue.Empty:
                break
            if ctx is None:
                stops += 1
            else:
                taken.append(ctx)
        for _ in range(stops):
            self._jobs.put(None)
        return taken

    def shutdown(self, wait: bool = True) -> None:
        """Run what is queued, let the threads end, then stop the event loop."""
        for _ in self._pool:
            self._jobs.put(None)  # after the queued jobs: those still run
        if wait:
            for thread in self._pool:
                thread.join()
        self._pool = []
        if self._events is None:
            return
        self._events.stop()
        self._events = None

    #: Longest a handler thread waits for the loop to write a start (``_write_start``)
    #: before it runs the handler anyway: with the loop held up that long (a neighbour
    #: holding the GIL, the database away) the job is as it was, a loss of it given back
    #: free once more, up to MAX_LOST_CLAIMS.
    START_WAIT_SECONDS = 10.0

    def _work(self) -> None:
        """A handler thread: take a job, run it, deliver its outcome, until told to stop."""
        while True:
            ctx = self._jobs.get()
            if ctx is None:
                return
            if ctx.settled or ctx.lost:  # cancelled, or recovered elsewhere: not run at all
                why = ctx.stop_reason or "lease lost"
                self.deliver(HandlerOutcome(ctx, ok=False, error=f"not run: {why}"))
                continue
            if self._no_new_starts.is_set():  # stopping: kept for take_unstarted, given back
                with self._declined_lock:
                    self._declined.append(ctx)
                continue
            ctx.mark_started()
            if ctx.timeout is not None and self.timing is not None:
                self.timing()
            if ctx.record_start_first and not self._write_start(ctx):
                why = ctx.stop_reason or "lease lost"
                self.deliver(HandlerOutcome(ctx, ok=False, error=f"not run: {why}"))
                continue
            outcome = self._run(ctx)
            if outcome.ended is None:  # an outcome _run made itself (a BaseException)
                _ended(outcome)
            self.deliver(outcome)

    def _write_start(self, ctx: JobContext) -> bool:
        """Have the loop write the start of ``ctx`` to the job's row before its handler runs
        (heartbeat rounds, asked for and waited on); returns whether the job is still this
        worker's to run.

        For a job that lost a lease before its start was recorded (``record_start_first``):
        maintenance gave it back without spending an attempt (JOB_REAP_EXPIRED), since a
        job waiting for a thread in a process that a neighbour's handler crashed or stalled
        must not pay for it. A handler that ends its process at once is never seen to
        start either, so without this it and the jobs claimed ahead with it would be given
        back together again and again, alike, until each went dead at MAX_LOST_CLAIMS. With
        its start written first, its next loss spends one of its own attempts and sends it
        to a backoff, while the jobs beside it, never started, are still given back free.
        Costs a round trip before the handler of such a job only.
        """
        deadline = time.monotonic() + self.START_WAIT_SECONDS
        while not (ctx.start_written or ctx.lost or ctx.settled):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.heartbeat(remaining)
        return not (ctx.lost or ctx.settled)

    def _run(self, ctx: JobContext) -> HandlerOutcome:
        """The outcome of one job; a BaseException its handler raised is one too.

        A handler that calls ``sys.exit()`` fails its attempt instead of ending the
        thread (and, with it, one of the worker's slots).
        """
        try:
            func = _handler_of(ctx.task)
            if func is not None and inspect.iscoroutinefunction(func):
                ctx.future = future = self._event_loop().submit(run_async_handler(ctx, func))
                if ctx.settled:  # the loop ended the attempt before the future was in hand
                    future.cancel()
                return future.result()
            return run_handler(ctx, self._await)
        except futures.CancelledError:
            return HandlerOutcome(ctx, ok=False, error="the handler was cancelled")
        except BaseException as exc:  # an outcome to record, as the job's last_error
            return HandlerOutcome(ctx, ok=False, error=describe_error(exc))

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
    ctx: JobContext,
    await_: Callable[[Awaitable[Any]], Any] | None = None,
    *,
    close_connections: bool = True,
) -> HandlerOutcome:
    """Run the job's handler once and say how it ended; an Exception is an outcome too.

    Whatever the handler returned or raised, the outcome holds only what PostgreSQL
    stores: a result that cannot be stored fails the attempt instead (retried or dead as
    any failure), and error texts are made storable and bounded, never refused. A plain
    function that returns an awaitable (a wrapped ``async def``) has it awaited through
    ``await_`` (on the event loop) while this thread waits.

    Afterwards the thread's Django connections that are broken or past their age are
    closed, as between two requests; ``close_connections=False`` leaves them to a caller
    that ran the handler on its own connections and transaction (``pgqueue.testing``).

    The attempt runs in its span (``pgqueue.tracing``), current for the handler, from
    here to its return or raise.
    """
    ctx.mark_started()
    outcome = HandlerOutcome(ctx, ok=False)
    error: BaseException | None = None
    tracing.start_attempt(ctx)
    try:
        with job_context(ctx), tracing.current(ctx):
            signals.send(signals.job_started, ctx.task, job=ctx)
            value = get_task(ctx.task).func(ctx.payload, ctx)
            if await_ is not None and inspect.isawaitable(value):
                value = await_(_in_job(ctx, value))
        _returned(outcome, value)
    except HANDLER_ERRORS as exc:
        _raised(outcome, exc)
        error = exc
    finally:
        _ended(outcome)
        _end_span(outcome, error)
        if close_connections:
            close_old_connections()
    return outcome


async def run_async_handler(ctx: JobContext, func: Callable[..., Awaitable[Any]]) -> HandlerOutcome:
    """``run_handler`` for an ``async def`` handler, awaited on the event loop.

    Django's connections are not closed afterwards: an async handler reaches the ORM
    through ``sync_to_async``, whose thread keeps its own.
    """
    ctx.mark_started()
    outcome = HandlerOutcome(ctx, ok=False)
    error: BaseException | None = None
    tracing.start_attempt(ctx)
    try:
        with job_context(ctx), tracing.current(ctx):
            signals.send(signals.job_started, ctx.task, job=ctx)
            value = await func(ctx.payload, ctx)
        _returned(outcome, value)
    except (*HANDLER_ERRORS, asyncio.CancelledError) as exc:
        _raised(outcome, exc)
        error = exc
    finally:
        _ended(outcome)
        _end_span(outcome, error)
    return outcome


def _ended(outcome: HandlerOutcome) -> None:
    """The handler returned or raised just now."""
    outcome.ended = time.monotonic()
    outcome.duration = outcome.ended - (outcome.ctx.began or outcome.ended)


def _end_span(outcome: HandlerOutcome, error: BaseException | None) -> None:
    """End the attempt's span (if it has one) with how the attempt ended."""
    if outcome.ctx.span is None:
        return
    name = span_outcome(outcome)
    if name == "snoozed":
        error = None  # pgqueue.Retry asks for a later run: not an error
    tracing.end_attempt(outcome.ctx, name, error=error, description=outcome.error)


def span_outcome(outcome: HandlerOutcome) -> str:
    """How the attempt ended, as its handler's return or raise shows it: what the worker
    will record, but for the rare race it cannot see yet (a lease lost meanwhile). A
    timeout counts from the handler's start, so a handler that returns after its deadline
    timed out, whatever it returned."""
    ctx = outcome.ctx
    if ctx.lost:
        return "lost"
    if ctx.stop_reason == "cancelled":
        return "cancelled"
    ended = outcome.ended
    if ctx.stop_reason == "timed_out" or (
        ctx.deadline is not None and ended is not None and ended >= ctx.deadline
    ):
        return "timed_out"
    if outcome.ok:
        return "done"
    if outcome.snooze is not None:
        return "snoozed"
    if outcome.permanent or ctx.attempt >= ctx.max_attempts:
        return "dead"
    return "failed"


def cancel_coroutine(ctx: JobContext) -> None:
    """The worker ended ``ctx``'s attempt (cancelled, timed out, lost): an ``async def``
    handler's coroutine is cancelled, so its slot is free at once. A thread cannot be
    cancelled; a plain handler learns it through ``job.cancelled`` and ``heartbeat()``."""
    if ctx.future is not None:
        ctx.future.cancel()


async def _in_job(ctx: JobContext, awaitable: Awaitable[T]) -> T:
    with job_context(ctx), tracing.current(ctx):
        return await awaitable


def _returned(outcome: HandlerOutcome, value: Any) -> None:
    try:
        outcome.result_json = encode_result(value)
        outcome.ok = True
    except ResultNotStorable as exc:
        outcome.error = storable_text(f"result not storable: {exc}", ERROR_MAX_BYTES)


def _raised(outcome: HandlerOutcome, exc: BaseException) -> None:
    """Called in the ``except`` block, while the traceback is at hand. The task's retry
    policy (``pgqueue.retry``) decides here whether the error is worth another attempt and
    when; a ``pgqueue.Retry`` is a snooze, not a failure."""
    outcome.error = describe_error(exc)
    if isinstance(exc, Retry):
        seconds = bounded_delay(exc.seconds)
        if seconds is not None and seconds > 0:
            outcome.snooze = seconds
            outcome.error = storable_text(str(exc), ERROR_MAX_BYTES)
            return
        outcome.error = f"Retry(in_={exc.seconds!r}): a snooze needs a delay above 0 seconds"
    outcome.traceback = format_traceback()
    policy = _policy_of(outcome.ctx.task)
    outcome.permanent = policy.permanent(exc)
    if not outcome.permanent:
        outcome.retry_in = policy.delay(outcome.ctx.attempt, exc)


#: A task without a policy of its own: every error retried (but PermanentError), the
#: global backoff.
GLOBAL_POLICY = RetryPolicy()


def _policy_of(task: str) -> RetryPolicy:
    try:
        return get_task(task).retry or GLOBAL_POLICY
    except Exception:  # an unknown task: its failure is already the outcome
        return GLOBAL_POLICY
