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
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.db import close_old_connections

from ..exceptions import PermanentError
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

    def start(self, job: ClaimedJob) -> JobContext:
        """Queue a claimed job's handler; returns the context the handler will see.

        The context's ``future`` can still be cancelled until the handler starts.
        """
        ctx = JobContext(
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
        outcome = (
            future.result()
            if exc is None
            else HandlerOutcome(ctx, ok=False, error=describe_error(exc))
        )
        self.deliver(outcome)


def run_handler(ctx: JobContext) -> HandlerOutcome:
    """Run the job's handler once and say how it ended; an Exception is an outcome too."""
    ctx.started = True
    started = time.perf_counter()
    outcome = HandlerOutcome(ctx, ok=False)
    try:
        value = get_task(ctx.task).func(ctx.payload, ctx)
        try:
            outcome.result_json = encode_result(value)
            outcome.ok = True
        except (TypeError, ValueError) as exc:
            # The same code would return the same thing again: retrying cannot help.
            outcome.error = f"result is not JSON-serialisable: {exc}"
            outcome.permanent = True
    except PermanentError as exc:
        outcome.error, outcome.permanent = describe_error(exc), True
        outcome.traceback = traceback.format_exc()
    except Exception as exc:
        outcome.error = describe_error(exc)
        outcome.traceback = traceback.format_exc()
    finally:
        outcome.duration = time.perf_counter() - started
        close_old_connections()
    return outcome


def encode_result(value: Any) -> str | None:
    """A handler's return value as the JSON text stored in the job's result."""
    if value is None:
        return None
    return json.dumps(value, allow_nan=False, separators=(",", ":"))


def describe_error(exc: BaseException) -> str:
    """``module.Type: message`` (builtins unqualified), the job's ``last_error``."""
    text = str(exc)
    name = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
    return f"{name}: {text}" if text else name
