"""Stopping the jobs a worker holds before their handlers return: cancel requests, timeouts.

Both end the attempt on the loop's thread and connection, fenced like any outcome, without
waiting for the handler: a requested cancellation is recorded 'cancelled'
(JOB_CANCEL_CONFIRM_MANY), a timeout a failed attempt "timed out after N s"
(JOB_FAIL_MANY: retried with backoff, or dead). The handler is told through its context
(``job.cancelled``; ``job.heartbeat()`` raises) and whatever it returns afterwards is
discarded (the context is ``settled``). An ``async def`` handler's coroutine is cancelled
and its slot freed at once; a plain handler's thread stays busy until it returns: a thread
cannot be killed, so the slot is not handed to another job before then.

A cancel request reaches the worker by a notification on the wake-up channel
('cancel:<worker id>', sent by JOB_CANCEL_REQUEST_MANY), which makes the loop run a
heartbeat round at once, or, if that notification was missed, at its next round (every
``lease / 3``): each round returns which of the jobs beaten were asked to stop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

import psycopg

from .. import key_store, stop_store
from ..timeouts import timed_out_text
from .context import JobContext
from .executor import HandlerOutcome, cancel_coroutine
from .heartbeat import Heartbeats
from .recorder import OutcomeRecorder, settle_dependents

logger = logging.getLogger("pgqueue.worker")


class JobStops:
    """Cancel requests and timeouts of one worker's jobs; runs on the loop's thread."""

    def __init__(self, worker_id: str, heartbeats: Heartbeats, recorder: OutcomeRecorder):
        self.worker_id = worker_id
        self.heartbeats = heartbeats
        self.recorder = recorder
        self._notified = False  # a cancel notification arrived since the last round
        #: Ended attempts whose handler still runs (or, never started, waits for a thread to
        #: drop it) while the worker runs the job again: a timeout, retried, or a lease
        #: lost and the job given back, each claimed again by this worker. Each holds a
        #: thread, or will until dropped.
        self.lingering: list[JobContext] = []

    @property
    def cancel_payload(self) -> str:
        """The notification payload that names this worker (JOB_CANCEL_REQUEST_MANY)."""
        return f"cancel:{self.worker_id}"

    def notified(self) -> None:
        """Called on the listener's thread: a job of this worker was asked to stop."""
        self._notified = True
        self.heartbeats.soon()

    def beat(
        self,
        db: psycopg.Connection,
        contexts: Sequence[JobContext],
        others: Iterable[tuple[int, int]] = (),
    ) -> None:
        """A heartbeat round, then the cancellation of the jobs it found asked to stop,
        before the handlers waiting on the round are released (so that a handler's
        ``heartbeat()`` raises as soon as the worker knows)."""
        via = "notify" if self._notified else "heartbeat"
        self._notified = False
        unwritten = [c for c in contexts if not c.start_written]
        asked = self.heartbeats.beat(db, contexts, others, self.recorder.started(unwritten))
        if asked:
            self.cancel(db, asked, via=via)
        self.heartbeats.round_done()

    def cancel(self, db: psycopg.Connection, asked: Sequence[JobContext], *, via: str) -> None:
        """Record the attempts of ``asked`` cancelled; their handlers' outcomes are dropped."""
        for ctx in asked:
            ctx.mark_stopped("cancelled")
        with db.transaction(), db.cursor() as cur:
            stopped = stop_store.confirm_cancel_many(
                cur,
                worker=self.worker_id,
                held=[(c.id, c.attempt) for c in asked],
                started=self.recorder.started(asked),
            )
            key_store.settle(cur, sorted(stopped))  # their concurrency keys' slots, if any
        for ctx in asked:
            ctx.settled = True  # recorded now, or recorded / lost before: nothing left to do
            cancel_coroutine(ctx)
            logger.info(
                "job=%d task=%s tenant=%s queue=%s attempt=%d event=cancel_requested via=%s "
                "outcome=%s",
                ctx.id,
                ctx.task,
                ctx.tenant,
                ctx.queue,
                ctx.attempt,
                via,
                "cancelled" if ctx.id in stopped else "already_recorded_or_lost",
            )
        settle_dependents(db, stopped)  # after the log lines: the job's end is told first

    def expire(self, db: psycopg.Connection, running: Iterable[JobContext]) -> None:
        """Fail the attempts of ``running`` whose deadline has passed (their handlers may
        still run: their outcomes will be discarded). A job whose cancellation was
        requested first is refused by the failure's fence and recorded cancelled instead."""
        now = time.monotonic()
        late = [
            c
            for c in running
            if c.deadline is not None and now >= c.deadline and not c.settled and not c.lost
        ]
        if not late:
            return
        for ctx in late:
            ctx.mark_stopped("timed_out")
        outcomes = [
            HandlerOutcome(ctx, ok=False, error=timed_out_text(ctx.timeout or 0.0)) for ctx in late
        ]
        recorded = self.recorder.record_in_transaction(db, outcomes)
        for ctx in late:
            ctx.settled = True
            cancel_coroutine(ctx)
            # Logged here, not by the recorder's batch line: its status is taken here too.
            status = self.recorder.statuses.pop(ctx.id, None)
            logger.warning(
                "job=%d task=%s tenant=%s queue=%s attempt=%d event=timed_out timeout_s=%g "
                "outcome=%s action=result_will_be_discarded",
                ctx.id,
                ctx.task,
                ctx.tenant,
                ctx.queue,
                ctx.attempt,
                ctx.timeout or 0.0,
                ("dead" if status == "dead" else "failed")
                if ctx.id in recorded
                else "already_recorded_or_lost",
            )

    @staticmethod
    def next_deadline(running: Iterable[JobContext]) -> float | None:
        """The earliest deadline among ``running`` not yet dealt with (monotonic), if any."""
        deadlines = [c.deadline for c in running if c.deadline is not None and not c.settled]
        return min(deadlines) if deadlines else None
