"""What a handler receives as its second argument."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ..exceptions import JobCancelled, JobTimedOut


class JobContext:
    """The job a handler is running, and its line back to the worker.

    ``lost`` turns true when a heartbeat finds that the worker no longer holds the job (its
    lease expired and the job was recovered): the handler should stop, and whatever it
    returns is not recorded. Long loops call ``heartbeat()`` to learn that early.

    ``cancelled`` turns true when the job's cancellation was requested (``DELETE /jobs/<id>``,
    the admin, ``pgqueue.cancel``) or its attempt ran past its timeout: the worker records
    the attempt (cancelled, or failed "timed out after N s") without waiting for the
    handler, whose return is then discarded. ``heartbeat()`` raises ``JobCancelled`` (or
    its subclass ``JobTimedOut``) from then on. A handler that never looks keeps its
    thread, and so one of the worker's slots, until it returns: threads cannot be killed.
    """

    __slots__ = (
        "_heartbeat",
        "_lost",
        "_stop",
        "_upstream",
        "attempt",
        "began",
        "claimed",
        "deadline",
        "future",
        "id",
        "max_attempts",
        "payload",
        "priority",
        "queue",
        "record_start_first",
        "settled",
        "span",
        "start_written",
        "step",
        "task",
        "tenant",
        "timeout",
        "traceparent",
        "tracestate",
        "worker_id",
        "workflow_id",
    )

    def __init__(
        self,
        *,
        id: int,
        task: str,
        payload: Any,
        tenant: str,
        queue: str,
        priority: int,
        attempt: int,
        max_attempts: int,
        worker_id: str,
        heartbeat: Callable[[float], None],
        timeout: float | None = None,
        record_start_first: bool = False,
        workflow_id: int | None = None,
        step: str | None = None,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> None:
        self.id = id
        self.task = task
        self.payload = payload
        self.tenant = tenant
        self.queue = queue
        self.priority = priority
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.worker_id = worker_id
        #: time.monotonic() when the worker got it from its claim, and when a thread took
        #: it and its handler began (None until then: it waits, claimed ahead).
        self.claimed = time.monotonic()
        self.began: float | None = None
        #: Its start was written to the job's row (by a heartbeat round).
        self.start_written = False
        #: The job lost a lease before its start was recorded (``lost_claims``): its start
        #: is written before its handler runs (JobExecutor._write_start).
        self.record_start_first = record_start_first
        self.future: Any = None
        self._heartbeat = heartbeat
        self._lost = False  # written by the worker's loop thread only
        self._stop: str | None = None  # "cancelled" or "timed_out"; the loop thread's too
        #: True once the worker is done with this attempt (recorded it cancelled or timed
        #: out): the handler's own outcome, whenever it comes, is discarded.
        self.settled = False
        self.timeout = timeout
        #: time.monotonic() past which the attempt has timed out: counted from the
        #: handler's start (None until then: a job that has not begun cannot time out).
        self.deadline: float | None = None
        self._upstream: list[Any] | None = None
        #: The workflow it is a step of, and the step's name (None: none).
        self.workflow_id = workflow_id
        self.step = step
        #: The W3C trace context it was enqueued in (None: none was recorded), and the
        #: span its attempt runs in while the handler runs (``pgqueue.tracing``).
        self.traceparent = traceparent
        self.tracestate = tracestate
        self.span: Any = None

    @property
    def upstream(self) -> list[Any]:
        """The jobs this one waited for (``depends_on``, a workflow's dependencies), in id
        order, each ``(id, step, status, result)`` (``pgqueue.workflow_store.Upstream``):
        read once, on first use, from the handler's thread. Empty for a job without
        dependencies."""
        if self._upstream is None:
            from django.db import connections

            from ..conf import queue_db
            from ..workflow_store import upstream

            with connections[queue_db(None)].cursor() as cursor:
                self._upstream = upstream(cursor, self.id)
        return self._upstream

    @property
    def upstream_results(self) -> dict[str | int, Any]:
        """The results of the jobs this one waited for, by step name (a workflow's step)
        or, for a job without one, by id. A dependency that ended dead or cancelled (the
        job runs anyway: ``on_upstream_failure="run"``) has None."""
        return {u.id if u.step is None else u.step: u.result for u in self.upstream}

    def mark_started(self) -> None:
        """The executor's, as a thread takes the job: its handler begins now."""
        if self.began is None:
            now = time.monotonic()
            if self.timeout is not None:  # set first: a loop that sees began sees it too
                self.deadline = now + self.timeout
            self.began = now

    @property
    def started(self) -> bool:
        """Its handler has begun (a thread took it): no longer one to give back."""
        return self.began is not None

    @property
    def lost(self) -> bool:
        """True once the worker learnt that this job's lease was lost."""
        return self._lost

    def mark_lost(self) -> None:
        self._lost = True

    @property
    def cancelled(self) -> bool:
        """True once the job was asked to stop, or its attempt timed out: stop, and return."""
        return self._stop is not None

    @property
    def stop_reason(self) -> str | None:
        """Why the handler should stop: "cancelled", "timed_out", or None."""
        return self._stop

    def mark_stopped(self, reason: str, *, force: bool = False) -> None:
        """The loop's: the first reason stays, unless ``force`` (what was recorded)."""
        if self._stop is None or force:
            self._stop = reason

    def heartbeat(self, timeout: float = 10.0) -> bool:
        """Ask the worker to renew its leases now; returns whether this job is still held.

        The worker renews every lease it holds every ``lease / 3`` anyway; calling this
        from a long loop is how a handler finds out promptly that it should stop. Raises
        ``JobCancelled`` when the job was asked to stop, ``JobTimedOut`` when its attempt
        ran past its timeout (the worker learns a request at once through a notification,
        or at the latest at its next round, ``lease / 3``).
        """
        self._raise_if_stopped()
        if not self.lost:
            self._heartbeat(timeout)
        self._raise_if_stopped()
        return not self.lost

    def _raise_if_stopped(self) -> None:
        if self._stop == "timed_out":
            raise JobTimedOut(f"job {self.id} attempt {self.attempt} ran past its timeout")
        if self._stop is not None:
            raise JobCancelled(f"job {self.id} was asked to stop")

    async def aheartbeat(self, timeout: float = 10.0) -> bool:
        """``heartbeat()`` for ``async def`` handlers: the event loop runs on meanwhile.

        ``heartbeat()`` waits for the worker's loop to renew the leases (usually a few
        milliseconds, at most ``timeout``); called from a coroutine it would hold up every
        other async job of the process for that long. This waits on a thread instead.
        """
        return await asyncio.to_thread(self.heartbeat, timeout)

    def __repr__(self) -> str:
        return f"<JobContext id={self.id} task={self.task} attempt={self.attempt}>"
