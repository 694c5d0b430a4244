"""The loop of one worker process: claim for free slots, record outcomes in batches.

One thread (the loop) owns the bookkeeping connection and does every database write of
the worker: claims, completions, failures, heartbeats and maintenance. Handlers run on the
``executor`` module's ``concurrency`` threads and hand their outcomes back through a queue.
Each turn of the loop records every outcome that has arrived and claims as many jobs as
there are idle slots, in one transaction: one commit carries as many jobs as it can,
because the commit (the WAL flush), not the CPU, is what a job queue on PostgreSQL waits for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import random
import socket
import threading
import time
from collections.abc import Sequence

import psycopg

from .. import claim_store, key_store, limits_store, store
from ..conf import pgqueue_settings
from ..registry import served_names
from .clock import DatabaseClock
from .connection import (
    CONNECTION_ERRORS,
    DatabaseUnreachable,
    connect,
    connect_params,
    connect_until_up,
    error_text,
)
from .context import JobContext
from .executor import HandlerOutcome, JobExecutor, serves
from .hand import JobsInHand
from .health import HealthFile, silent_server_bound
from .heartbeat import Heartbeats
from .listener import Listener
from .lookahead import LookAhead
from .maintenance import maintain
from .recorder import OutcomeRecorder, settle_dependents
from .stops import JobStops

logger = logging.getLogger("pgqueue.worker")


class WorkerLoop(JobsInHand):
    """The loop of one worker process. ``run()`` returns the process exit status."""

    def __init__(
        self,
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int = 4,
        batch_size: int | None = None,
        prefetch: int | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
        alias: str | None = None,  # None: PGQUEUE["DATABASE"]
        worker_id: str | None = None,
    ) -> None:
        self.queues = list(dict.fromkeys(queues))
        self.concurrency = concurrency
        self.batch_size = batch_size or int(pgqueue_settings.BATCH_SIZE)
        # Jobs held beyond the busy slots: they wait, unstarted, in the executor's queue,
        # so a thread that finishes takes the next job at once instead of waiting for the
        # loop's round trip, and one turn records and claims for many jobs. At most
        # ``prefetch``, and as many as the threads start in a few milliseconds (lookahead);
        # one still waiting after ``hold`` seconds is given back (_give_back_stranded).
        self.prefetch = int(pgqueue_settings.PREFETCH if prefetch is None else prefetch)
        self.lookahead = LookAhead(self.prefetch, float(pgqueue_settings.PREFETCH_SECONDS))
        self.hold = float(pgqueue_settings.PREFETCH_HOLD_SECONDS)
        self.ahead = 0  # the look-ahead of the last claim
        #: Jobs were given back unstarted: claim none ahead until a thread is free again.
        self.gave_back = False
        self.burst = burst
        self.max_jobs = max_jobs
        self.alias = alias
        self.host = host = socket.gethostname()
        self.id = worker_id or f"{host}:{os.getpid()}:{os.urandom(3).hex()}"
        self.lease = float(pgqueue_settings.LEASE_SECONDS)
        self.heartbeat_every = pgqueue_settings.heartbeat_seconds
        self.poll_every = float(pgqueue_settings.POLL_SECONDS)
        self.maintenance_every = float(pgqueue_settings.MAINTENANCE_SECONDS)

        self.params = silent_server_bound(
            connect_params(alias, application_name=f"pgqueue worker {self.id}"[:63])
        )
        #: What ``manage.py pgqueue healthcheck`` reads: written by this loop's thread at
        #: its turns (pgqueue.worker.health), from ``run()`` on.
        self.health = HealthFile("worker", worker=self.id, lease_seconds=self.lease)
        self.db: psycopg.Connection | None = None
        self.outcomes: queue.SimpleQueue[HandlerOutcome] = queue.SimpleQueue()
        self.executor = JobExecutor(
            concurrency,
            worker_id=self.id,
            heartbeat=self._request_heartbeat,
            deliver=self._deliver,
            timing=self.wake,
        )
        self.wake_event = threading.Event()
        self.stopping = threading.Event()
        self.in_flight: dict[int, JobContext] = {}
        self.pending: list[HandlerOutcome] = []  # taken from the queue, not yet recorded
        self.claimed_total = 0
        #: Ids of the jobs in hand counted in limit rows: a turn locks their rows first.
        self.counted: set[int] = set()
        #: Ids of the jobs in hand with a concurrency key: a turn that records one of them
        #: gives its key's slot back (KEY_SETTLE).
        self.keyed: set[int] = set()
        #: New keyed jobs may wait for admission (a 'key:<queue>' wake-up, a start, or an
        #: admission that took a whole batch): the next turn examines some (KEY_SETTLE).
        self.admit_due = True
        #: Seconds to the next token of a rate limit holding back work of the queues, after
        #: a claim that came up short (None: none): the loop wakes for it.
        self.token_wait: float | None = None
        self.tasks = served_names()
        self.clock = DatabaseClock()  # read at each connection and heartbeat round
        self.recorder = OutcomeRecorder(
            self.id,
            served=len(self.tasks),
            unknown_task_delay=float(pgqueue_settings.UNKNOWN_TASK_DELAY_SECONDS),
            clock=self.clock,
        )
        self.heartbeats = Heartbeats(self.id, self.lease, self.wake_event.set, self.clock)
        self.stops = JobStops(self.id, self.heartbeats, self.recorder)  # cancels, timeouts
        self.listener = Listener(
            connect_params(alias, application_name=f"pgqueue listener {self.id}"[:63]),
            pgqueue_settings.NOTIFY_CHANNEL,
            self.queues,
            self.wake,
            on_payload={
                self.stops.cancel_payload: self.stops.notified,
                **{f"key:{q}": self._key_work for q in self.queues},
            },
        )

    # -- signals and wake-ups -----------------------------------------------------------

    def wake(self) -> None:
        self.wake_event.set()

    def _key_work(self) -> None:
        """New keyed jobs in one of the queues (the listener's thread): admit some next turn."""
        self.admit_due = True
        self.wake_event.set()

    def request_stop(self) -> None:
        """Stop claiming, finish the jobs in hand, record them and exit.

        Safe in a signal handler: the handler runs on the loop's own thread, between any two
        bytecodes, possibly while that thread holds an Event's internal lock (inside
        ``wake_event.clear()``, say). Setting an Event from the handler could then wait on
        a lock its own thread holds, forever; a short-lived thread sets them instead.
        """
        threading.Thread(target=self._stop_now, name="pgqueue-stop", daemon=True).start()

    def _stop_now(self) -> None:
        self.executor.stop_starting()  # first: a thread freed meanwhile starts nothing new
        self.stopping.set()
        self.wake_event.set()

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (or idle with ``burst``, or ``max_jobs`` done); returns 0.

        Raises ``DatabaseUnreachable`` when the database cannot be reached at start-up
        within ``PGQUEUE["CONNECT_ATTEMPTS"]`` tries; a stop requested meanwhile returns 0.

        The health file lives as long as this call: removed when it returns or gives up on
        the database, both clean ends. An unexpected error leaves it behind, as a process
        killed would, so that a loop that died in a process that lives on reads as stuck.
        """
        self.health.open()
        try:
            status = self._serve()
        except DatabaseUnreachable:
            self.health.close()
            raise
        self.health.close()
        return status

    def _serve(self) -> int:
        """``run()`` within the health file's life: connect, loop, shut down."""
        if not self._connect_until_up(attempts=int(pgqueue_settings.CONNECT_ATTEMPTS)):
            logger.info("event=worker_stopped worker=%s jobs=0", self.id)
            return 0
        self.health.set_state("running")
        self.listener.start()
        logger.info(
            "event=worker_started worker=%s queues=%s concurrency=%d prefetch=%d batch_size=%d",
            self.id,
            ",".join(self.queues),
            self.concurrency,
            self.prefetch,
            self.batch_size,
        )
        logger.info(
            "event=worker_tasks worker=%s count=%d tasks=%s",
            self.id,
            len(self.tasks),
            ",".join(self.tasks) or "-",
        )
        next_heartbeat = time.monotonic() + self.heartbeat_every
        next_maintenance = time.monotonic()
        try:
            while True:
                # A turn: marked by this thread, so that a loop stuck anywhere (a lock, a
                # statement that never returns) stops marking. Handlers run on threads of
                # their own; a long one holds a slot, never the loop.
                self.health.turn()
                if self.stopping.is_set():
                    self.health.set_state("stopping")
                self.wake_event.clear()
                try:
                    if self.stopping.is_set() and not self._released:
                        self._release_unstarted()
                    claimed_all = self._turn()
                    self._give_back_stranded()
                    now = time.monotonic()
                    if (
                        now >= next_heartbeat
                        or self.heartbeats.requested
                        or now >= self._start_to_write()
                    ):
                        self._heartbeat()
                        next_heartbeat = now + self.heartbeat_every
                    self.stops.expire(self.db, self.in_flight.values())  # past their timeout
                    if now >= next_maintenance and not self.stopping.is_set():
                        maintain(self.db)
                        next_maintenance = now + self.maintenance_every * (
                            0.8 + 0.4 * random.random()
                        )
                except CONNECTION_ERRORS as exc:
                    logger.warning("event=db_error error=%r action=reconnect", str(exc).strip())
                    self.health.set_state("reconnecting")
                    if not self._connect_until_up():
                        break  # stopped while the database was away: _shutdown records
                    self.health.set_state("stopping" if self.stopping.is_set() else "running")
                    continue
                if self._finished(claimed_all):
                    break
                if claimed_all and self._want() > 0:
                    continue  # the batch size capped the claim: more may be waiting now
                deadline = min(
                    self.stops.next_deadline(self.in_flight.values()) or next_heartbeat,
                    self._stranded_at(),
                    self._start_to_write(),
                )
                token = self.token_wait  # a rate-limited scope's next token
                timeout = min(
                    self.poll_every * (0.75 + 0.5 * random.random()),
                    self.poll_every if token is None else token + 0.001,
                    max(0.0, min(next_heartbeat, deadline) - time.monotonic()),
                    max(0.0, next_maintenance - time.monotonic())
                    if not self.stopping.is_set()
                    else self.poll_every,
                )
                self.wake_event.wait(timeout)
                self._linger()
        finally:
            self._shutdown()
        return 0

    def _turn(self) -> bool:
        """Record what finished and claim for the idle slots and the look-ahead, in one
        transaction. The handler threads run on meanwhile, on the jobs claimed ahead.

        Returns True when the claim filled every slot it asked for (more may be waiting).
        """
        assert self.db is not None
        if self.recorder.unrunnable:  # a give-back a lost connection interrupted
            self.recorder.give_back(self.db)
        self._take_outcomes()
        self._write_reports()
        want = self._want()
        if not self.pending and not want:
            return False
        successes, failures = self.recorder.split(self.pending)
        # Cleared before the turn: a wake-up for keyed work during it sets it again.
        admit = int(pgqueue_settings.KEY_ADMIT_BATCH) if self.admit_due and want else 0
        if admit:
            self.admit_due = False
        try:
            done = claim_store.turn(
                self.db,
                worker=self.id,
                queues=self.queues,
                limit=want,
                successes=successes,
                failures=failures,
                counted=self.counted,
                settle=any(o.ctx.id in self.keyed for o in self.pending),
                admit=admit,
                lease_seconds=self.lease,
            )
            if admit and done.examined >= admit:
                self.admit_due = True  # a whole batch: more may be waiting
            # A success or failure the cancel fence refused is recorded cancelled: more
            # statements, only after a cancel race or a lease lost unheard of.
            recorded = done.recorded
            # Jobs it ended that others may wait for, settled once committed (below).
            ended = set(done.awaited) | {i for i, st in done.failed.items() if st == "dead"}
            if self.recorder.refused(self.pending, done.recorded):
                with self.db.transaction(), self.db.cursor() as cur:
                    stopped = self.recorder.cancel_refused(cur, self.pending, done.recorded)
                    key_store.settle(cur, sorted(stopped))
                recorded = recorded | stopped
                ended |= stopped
        except CONNECTION_ERRORS:
            self.admit_due = self.admit_due or bool(admit)
            raise
        except psycopg.Error as exc:
            self.admit_due = self.admit_due or bool(admit)
            # The database refused a statement (the turn rolled back: nothing of it
            # happened). One outcome it cannot take must not cost the others theirs:
            # record them one by one; the claim waits for the next turn.
            logger.error(
                "event=batch_refused jobs=%s error=%r action=record_one_by_one",
                ",".join(str(o.ctx.id) for o in self.pending),
                error_text(exc),
            )
            had_outcomes = bool(self.pending)
            self.recorder.record_one_by_one(self.db, self.pending)
            self._burst_idle = False
            # Claim again at once after recording; a refused claim waits for the next poll.
            return had_outcomes
        # Committed: the outcomes are durable and the claims are ours.
        self.recorder.statuses.update(done.failed)
        self.recorder.log(self.pending, recorded)
        self.pending = []
        self._dispatch(done.jobs)
        released = settle_dependents(self.db, ended)  # after the dispatch: claimed jobs first
        self.counted &= self.in_flight.keys()  # those recorded, given back or lost go
        self.keyed &= self.in_flight.keys()
        # Idle: nothing claimed, and no new keyed job left unexamined that might be admitted.
        self._burst_idle = want > 0 and not done.jobs and not self.admit_due and not released
        self.token_wait = None
        if len(done.jobs) < want:  # a rate limit may hold jobs back: wake for its next token
            with self.db.cursor() as cur:
                self.token_wait = limits_store.next_token_in(cur, self.queues)
        return bool(want) and len(done.jobs) == want

    def _finished(self, claimed_all: bool) -> bool:
        if self.in_flight or self.stops.lingering or self.pending or self.recorder.unrunnable:
            return False
        if not self.outcomes.empty():
            return False
        if self.stopping.is_set():
            return True
        if self.max_jobs is not None and self.finished_total >= self.max_jobs:
            return True
        return self.burst and self._burst_idle and not claimed_all

    _burst_idle = False

    @property
    def finished_total(self) -> int:
        """Jobs whose outcome the loop is done with (the recorder counts them)."""
        return self.recorder.finished

    # -- handing jobs to the executor -----------------------------------------------------

    def _dispatch(self, claimed: list[store.ClaimedJob]) -> None:
        for job in claimed:
            if not serves(job.task):
                self.recorder.unrunnable.append(job)  # given back below, uncounted
                continue
            held = self.in_flight.get(job.id)
            if held is not None and held.attempt == job.attempt and not held.lost:
                # Maintenance gave the job back while this process was held up (its lease
                # ran out before its start was recorded: no attempt spent) and this claim
                # took it again under the same number: the old context is no longer ours.
                held.mark_lost()
                logger.warning(
                    "job=%d attempt=%d event=lease_lost action=result_will_be_discarded",
                    held.id,
                    held.attempt,
                )
            if held is not None:  # a timed-out or lost attempt whose handler may still run
                self.stops.lingering.append(held)
            self.in_flight[job.id] = self.executor.start(job)
            if job.limit_ids:
                self.counted.add(job.id)
            if job.concurrency_key is not None:
                self.keyed.add(job.id)
            self.claimed_total += 1
        if self.recorder.unrunnable:
            self.recorder.give_back(self.db)

    def _deliver(self, outcome: HandlerOutcome) -> None:
        """Called on a handler thread when a job ends: the loop records it next turn."""
        self.outcomes.put(outcome)
        self.wake_event.set()

    # -- heartbeats -----------------------------------------------------------------------

    def _request_heartbeat(self, timeout: float) -> None:
        self.heartbeats.request(timeout)

    def _write_reports(self) -> None:
        """A heartbeat round before the outcomes of ``pending`` are recorded when one of
        their handlers reported progress or output the rounds have not written yet: its
        last report is kept, and the round is fenced as the outcome will be. Costs a
        statement in the turns that record such a job only."""
        if any(
            o.ctx.report_since is not None and not (o.ctx.settled or o.ctx.lost)
            for o in self.pending
        ):
            self._heartbeat()

    def _heartbeat(self) -> None:
        assert self.db is not None
        with self.db.cursor() as cur:
            self.clock.read(cur)
        contexts = [*self.in_flight.values(), *(o.ctx for o in self.pending)]
        unrunnable = [(j.id, j.attempt) for j in self.recorder.unrunnable]
        self.stops.beat(self.db, contexts, unrunnable)
        self.health.database_ok()  # what readiness reads

    # -- connection, registry, shutdown ---------------------------------------------------

    def _connect_until_up(self, attempts: int | None = None) -> bool:
        """(Re)make the bookkeeping connection and register; False if stopped first.

        The retry policy is ``connection.connect_until_up``'s.
        """
        if self.db is not None:
            with contextlib.suppress(psycopg.Error):
                self.db.close()
            self.db = None
        self.db = connect_until_up(
            self.params,
            stopping=self.stopping,
            on_connect=self._register_on,
            attempts=attempts,
            tick=self.health.turn,  # waiting for the database is not being stuck
        )
        return self.db is not None

    def _register_on(self, db: psycopg.Connection) -> None:
        with db.cursor() as cur:
            self.clock.read(cur)
            store.register_worker(
                cur,
                worker=self.id,
                host=self.host,
                pid=os.getpid(),
                queues=self.queues,
                concurrency=self.concurrency,
                tasks=self.tasks,
            )
        self.health.database_ok()

    def _shutdown(self) -> None:
        """Record whatever finished, deregister and close. Runs on every exit of the loop.

        On a graceful stop the loop has already finished the jobs in hand and released the
        unstarted ones; after an unexpected error, handlers still running are waited for
        and recorded, and anything not recorded is recovered by its lease.
        """
        self.stopping.set()
        self.health.set_state("stopping")
        self.executor.shutdown(wait=True)
        self.listener.stop()
        for attempt in range(3):
            self.health.turn()  # each try may wait for a connect timeout
            try:
                if self.db is None or self.db.closed:
                    self.db = None
                    self.db = connect(self.params)  # once: a stop does not wait for it
                    self._register_on(self.db)
                if self.recorder.unrunnable:
                    self.recorder.give_back(self.db)
                # A job a thread took from the queue as the loop gave the queued ones back,
                # and did not start (the stop came first): given back too.
                late = self._take_unstarted()
                if late:
                    self.recorder.release(self.db, late)
                self._take_outcomes()
                self._write_reports()
                self.recorder.flush(self.db, self.pending)
                with self.db.cursor() as cur:
                    store.stop_worker(cur, worker=self.id)
                break
            except CONNECTION_ERRORS as exc:
                logger.warning(
                    "event=db_error_on_shutdown error=%r attempt=%d", str(exc).strip(), attempt
                )
                self.db = None
        if self.db is not None:
            self.db.close()
        logger.info("event=worker_stopped worker=%s jobs=%d", self.id, self.finished_total)
