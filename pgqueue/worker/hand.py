"""The jobs a worker holds, and when it turns: what to claim (the idle slots and the
look-ahead), when enough has finished to record it in one commit, and which jobs claimed
ahead to give back because no thread freed for them.

``JobsInHand`` is a part of ``WorkerLoop`` (worker/runtime.py), kept apart so that the
loop's own module holds the loop: the turn, the connection and the shutdown. Its methods
read and change the loop's state, named below.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING

from .context import JobContext

if TYPE_CHECKING:
    import psycopg

    from .executor import HandlerOutcome, JobExecutor
    from .lookahead import LookAhead
    from .recorder import OutcomeRecorder
    from .stops import JobStops


class JobsInHand:
    """The loop's jobs in hand: in flight (claimed, running or waiting for a thread),
    finished but not yet recorded (``outcomes``, then ``pending``), and given back."""

    # The loop's state these methods use (set in WorkerLoop.__init__).
    concurrency: int
    batch_size: int
    max_jobs: int | None
    claimed_total: int
    hold: float  # PREFETCH_HOLD_SECONDS
    ahead: int  # the look-ahead of the last claim
    gave_back: bool
    db: psycopg.Connection | None
    in_flight: dict[int, JobContext]
    pending: list[HandlerOutcome]
    outcomes: queue.SimpleQueue[HandlerOutcome]
    executor: JobExecutor
    lookahead: LookAhead
    recorder: OutcomeRecorder
    stops: JobStops
    stopping: threading.Event
    wake_event: threading.Event

    _released = False

    #: Longest a turn waits, once a job has finished, for the rest in flight to finish too.
    LINGER_SECONDS = 0.002

    def _linger(self) -> None:
        """Let finished jobs gather so that one commit records several.

        Short jobs started together finish within microseconds of one another; recording
        the first alone would split the slots into small cohorts, each paying a commit.
        Waiting a couple of milliseconds at most merges them. Nothing waits when no job
        has finished yet (a wake-up for new work claims at once). With a look-ahead the
        threads are busy with the jobs claimed ahead meanwhile, and the turn goes out once
        half of those have been taken, so that it is back before the queue runs dry.
        """
        if not self.in_flight or self.outcomes.empty() or self.stopping.is_set():
            return
        deadline = time.monotonic() + self.LINGER_SECONDS
        while not self._ripe():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self.wake_event.clear()
            if self._ripe():
                return
            self.wake_event.wait(remaining)

    def _ripe(self) -> bool:
        """Time for a turn: every job in hand has finished, or the look-ahead runs low."""
        if self.outcomes.qsize() >= len(self.in_flight):
            return True
        return self.ahead > 0 and self.executor.queued() <= self.ahead // 2

    def _take_outcomes(self) -> None:
        """Move finished jobs from in flight to pending: their slots are free again, and
        they stay in the heartbeat set until their outcome is recorded."""
        durations: list[float] = []
        while True:
            try:
                outcome = self.outcomes.get_nowait()
            except queue.Empty:
                self.lookahead.observe(durations)
                return
            if outcome.ctx.started:
                durations.append(outcome.duration)
                self.gave_back = False  # a thread is free again
            if self.in_flight.get(outcome.ctx.id) is outcome.ctx:
                del self.in_flight[outcome.ctx.id]
            else:  # an attempt the worker ended (timed out) whose job it runs again now
                self.stops.lingering.remove(outcome.ctx)
            self.pending.append(outcome)

    def _release_unstarted(self) -> None:
        """On stop: give back jobs claimed but not yet started (those claimed ahead among
        them), so others run them now; the executor will not start them any more."""
        unstarted = self._take_unstarted()
        if unstarted:
            assert self.db is not None
            self.recorder.release(self.db, unstarted)
        self._released = True

    def _give_back_stranded(self) -> None:
        """Give back the jobs claimed ahead once the oldest of them has waited ``hold``
        seconds for a thread: no thread freed that long, so those behind it would wait
        too, while another worker may be idle. Queued again at their old place, the
        attempt not counted, their limit slots returned, the queue's workers woken
        (JOB_RELEASE_MANY); none is claimed ahead again until a thread is free."""
        if time.monotonic() < self._stranded_at():
            return
        unstarted = self._take_unstarted()
        if not unstarted:
            return
        assert self.db is not None
        self.recorder.release(self.db, unstarted, reason="not_started_within_hold")
        self.gave_back = True

    def _take_unstarted(self) -> list[JobContext]:
        """Take back from the executor the jobs no thread has started, no longer in hand,
        and return those to give back: not one whose lease was lost. That job is not this
        worker's any more; the worker may even hold it again, claimed anew under the same
        attempt number (see _dispatch), and a give-back fenced on (worker, attempt) would
        then hit the new claim."""
        taken: list[JobContext] = []
        for ctx in self.executor.take_unstarted():
            if self.in_flight.get(ctx.id) is ctx:
                del self.in_flight[ctx.id]
            elif ctx in self.stops.lingering:
                self.stops.lingering.remove(ctx)
            if not ctx.lost:
                taken.append(ctx)
        return taken

    def _stranded_at(self) -> float:
        """When the oldest job waiting for a thread is to be given back (monotonic; inf
        when none waits)."""
        if not self.executor.queued():
            return float("inf")
        waiting = [c.claimed for c in self.in_flight.values() if not c.started]
        return min(waiting) + self.hold if waiting else float("inf")

    #: A running job's start is written to its row (a heartbeat round) once it has run
    #: this long, so that the API and the admin show when a long job began.
    START_WRITE_SECONDS = 1.0

    def _start_to_write(self) -> float:
        """When the next heartbeat round is due for a start or a report to write
        (monotonic; inf when no job in hand needs one): a job that has run
        START_WRITE_SECONDS unrecorded, or whose handler's progress or output has waited
        that long (``JobContext.report_since``): one write a second at most, whatever the
        rate of its reports."""
        due = float("inf")
        for c in self.in_flight.values():
            if c.settled or c.lost:
                continue
            if c.began is not None and not c.start_written:
                due = min(due, c.began)
            since = c.report_since
            if since is not None:
                due = min(due, since)
        return due + self.START_WRITE_SECONDS

    def _soon_threads(self) -> int:
        """Threads that may take a job soon: idle, or on a job that has run less than
        ``hold`` seconds (one longer is a long job, and nothing is held for its thread)."""
        now = time.monotonic()
        long = sum(
            1 for c in self.in_flight.values() if c.began is not None and now - c.began > self.hold
        )
        return self.concurrency - long - len(self.stops.lingering)

    def _want(self) -> int:
        """Jobs to claim: the idle slots plus the look-ahead, less what is held already."""
        if self.stopping.is_set():
            return 0
        held = len(self.in_flight) + len(self.stops.lingering)  # the latter hold threads
        self.ahead = 0 if self.gave_back else self.lookahead.size(self._soon_threads())
        want = min(self.concurrency + self.ahead - held, self.batch_size)
        if self.max_jobs is not None:
            want = min(want, self.max_jobs - self.claimed_total)
        return max(want, 0)
