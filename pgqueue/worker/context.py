"""What a handler receives as its second argument."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class JobContext:
    """The job a handler is running, and its line back to the worker.

    ``lost`` turns true when a heartbeat finds that the worker no longer holds the job (its
    lease expired and the job was recovered): the handler should stop, and whatever it
    returns is not recorded. Long loops call ``heartbeat()`` to learn that early.
    """

    __slots__ = (
        "_heartbeat",
        "_lost",
        "attempt",
        "future",
        "id",
        "max_attempts",
        "payload",
        "priority",
        "queue",
        "started",
        "started_at",
        "task",
        "tenant",
        "worker_id",
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
        self.started = False
        self.started_at = 0.0
        self.future: Any = None
        self._heartbeat = heartbeat
        self._lost = False  # written by the worker's loop thread only

    @property
    def lost(self) -> bool:
        """True once the worker learnt that this job's lease was lost."""
        return self._lost

    def mark_lost(self) -> None:
        self._lost = True

    def heartbeat(self, timeout: float = 10.0) -> bool:
        """Ask the worker to renew its leases now; returns whether this job is still held.

        The worker renews every lease it holds every ``lease / 3`` anyway; calling this
        from a long loop is how a handler finds out promptly that it should stop.
        """
        if not self.lost:
            self._heartbeat(timeout)
        return not self.lost

    async def aheartbeat(self, timeout: float = 10.0) -> bool:
        """``heartbeat()`` for ``async def`` handlers: the event loop runs on meanwhile.

        ``heartbeat()`` waits for the worker's loop to renew the leases (usually a few
        milliseconds, at most ``timeout``); called from a coroutine it would hold up every
        other async job of the process for that long. This waits on a thread instead.
        """
        return await asyncio.to_thread(self.heartbeat, timeout)

    def __repr__(self) -> str:
        return f"<JobContext id={self.id} task={self.task} attempt={self.attempt}>"
