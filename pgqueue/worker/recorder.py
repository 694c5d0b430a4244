"""Recording outcomes: a batch of finished jobs written in one go, fenced, then logged.

The loop (``runtime``) owns one ``OutcomeRecorder`` and calls it on its own thread and
connection, so every write of the worker stays there. The steady-state path (successes
written by the claim statement itself) is the loop's; this module writes the batches that
hold a failure, falls back to one transaction per outcome when the database refuses a
batch (one outcome it cannot take must not cost the others theirs), and logs the outcomes
once they are durable: one INFO line per batch, a WARNING per failure. It also gives back
the jobs the worker claimed and did not run (not started when it stops, or of a task it
has no handler for): not an attempt.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Iterable
from typing import Any

import psycopg

from .. import claim_store, key_store, signals, stop_store, store, workflow_store
from ..claim_store import Success
from .clock import DatabaseClock
from .connection import CONNECTION_ERRORS, error_text
from .context import JobContext
from .executor import ERROR_MAX_BYTES, HandlerOutcome, storable_text

logger = logging.getLogger("pgqueue.worker")


def stopped_outcome(ctx: JobContext) -> str | None:
    """What the worker recorded when it ended ``ctx``'s attempt itself, without waiting for
    its handler (``JobStops``): "cancelled", or for a timeout "failed" ("dead" on the last
    attempt); None when it did not, and the handler's outcome was lost with the lease.

    The batch line counts the job so when the handler's outcome comes in (dropped, since
    the attempt is over), not as "discarded": that is an outcome the worker lost.
    """
    if not ctx.settled or ctx.lost:
        return None
    if ctx.stop_reason == "cancelled":
        return "cancelled"
    if ctx.stop_reason == "timed_out":
        return "dead" if ctx.attempt >= ctx.max_attempts else "failed"
    return None


#: Most job ids the INFO line of a recorded batch names (then ``,+N`` more).
LOGGED_IDS = 20


def settle_dependents(db: psycopg.Connection, ended: Iterable[int]) -> bool:
    """Settle the jobs waiting for ``ended`` (jobs this worker ended, committed): runnable
    once all they wait for is done, or cancelled after a failure (pgqueue.workflows).
    Returns whether it made a job runnable (a burst worker then looks for it). A failure
    here is logged and left: the outcomes stand, and maintenance's sweep settles the
    dependents."""
    upstreams = sorted(ended)
    if not upstreams:
        return False
    try:
        settled = workflow_store.settle_rounds(
            workflow_store.psycopg_atomic(db), upstreams=upstreams
        )
        return "scheduled" in settled.values()
    except psycopg.Error as exc:
        logger.warning(
            "event=settle_failed upstreams=%s error=%r action=left_to_maintenance",
            ",".join(map(str, upstreams[:20])),
            error_text(exc),
        )
        return False


def announce(outcomes: list[tuple[str, HandlerOutcome]]) -> None:
    """Send the signals of recorded, committed outcomes (``pgqueue.signals``): a success,
    a failure to be retried, a dead job. A snooze or a cancellation sends none."""
    for outcome, o in outcomes:
        ctx = o.ctx
        if outcome == "done":
            if signals.job_succeeded.receivers:  # decode the result only for a receiver
                result = None if o.result_json is None else json.loads(o.result_json)
                signals.send(signals.job_succeeded, ctx.task, job=ctx, result=result)
        elif outcome in ("failed", "dead"):
            signal = signals.job_failed if outcome == "failed" else signals.job_dead
            signals.send(signal, ctx.task, job=ctx, error=o.error, traceback=o.traceback)


class OutcomeRecorder:
    """Writes and logs the outcomes of one worker's jobs; counts those it is done with."""

    def __init__(
        self,
        worker_id: str,
        *,
        served: int = 0,
        unknown_task_delay: float = 60.0,
        clock: DatabaseClock | None = None,
    ):
        self.worker_id = worker_id
        #: Gives the handlers' times in the database's clock.
        self.clock = clock or DatabaseClock()
        self.served = served  # how many tasks the worker has handlers for (for the log)
        self.unknown_task_delay = unknown_task_delay
        #: Outcomes dealt with (recorded, fenced out or left to lease recovery).
        self.finished = 0
        #: The new status of each failure recorded and not yet logged ('scheduled', 'dead',
        #: 'snoozed'), from JOB_FAIL_MANY: what ``log`` reports and signals.
        self.statuses: dict[int, str] = {}
        #: The tasks without a handler already logged (at ERROR, once each).
        self.unknown_tasks_logged: set[str] = set()
        #: Claimed jobs of tasks without a handler, held (their leases renewed) until
        #: ``give_back`` has written them.
        self.unrunnable: list[store.ClaimedJob] = []

    def split(self, outcomes: list[HandlerOutcome]) -> tuple[list[Success], list[store.Failure]]:
        """Successes and failures to write, each with its handler's start and end; the
        outcome of a lost job, or of one the worker already ended (cancelled, timed out:
        ``settled``), is not written at all."""
        live = [o for o in outcomes if not o.ctx.lost and not o.ctx.settled]
        successes = [
            Success(o.ctx.id, o.ctx.attempt, o.result_json, *self.times(o)) for o in live if o.ok
        ]
        failures = [
            store.Failure(
                o.ctx.id,
                o.ctx.attempt,
                o.error or "",
                o.traceback,
                o.permanent,
                *self.times(o),
                retry_in=o.retry_in,
                snooze=o.snooze,
            )
            for o in live
            if not o.ok
        ]
        return successes, failures

    def times(self, outcome: HandlerOutcome) -> tuple[dt.datetime | None, dt.datetime | None]:
        """When the outcome's handler began and ended, in the database's clock (None: it
        did not begin; it did not end, the worker ended the attempt: the statement's now)."""
        began, ended = outcome.ctx.began, outcome.ended
        return (
            None if began is None else self.clock.at(began),
            None if ended is None else self.clock.at(ended),
        )

    def started(self, contexts: Iterable[JobContext]) -> dict[int, dt.datetime]:
        """The start, in the database's clock, of each of ``contexts`` whose handler began."""
        return {c.id: self.clock.at(c.began) for c in contexts if c.began is not None}

    def record(
        self, cur: Any, outcomes: list[HandlerOutcome], ended: set[int] | None = None
    ) -> set[int]:
        """Write outcomes (fenced); returns the ids whose outcome was recorded. Adds to
        ``ended`` the jobs it ended that a job may wait for (done and awaited, dead,
        cancelled): ``settle_dependents`` of them once this has committed."""
        successes, failures = self.split(outcomes)
        recorded: set[int] = set()
        ended = set() if ended is None else ended
        if successes and failures:  # two statements: their limit rows locked first, in order
            claim_store.lock_turn(
                cur, worker=self.worker_id, ids=[o.id for o in [*successes, *failures]]
            )
        if successes:
            recorded |= store.complete_many(
                cur, worker=self.worker_id, results=successes, awaited=ended
            )
        if failures:
            statuses = store.fail_many(cur, worker=self.worker_id, failures=failures)
            self.statuses.update(statuses)
            recorded |= set(statuses)
            ended.update(i for i, status in statuses.items() if status == "dead")
        stopped = self.cancel_refused(cur, outcomes, recorded)
        recorded |= stopped
        ended |= stopped
        key_store.settle(cur, sorted(recorded))  # their concurrency keys' slots, if any
        return recorded

    def refused(self, outcomes: list[HandlerOutcome], recorded: set[int]) -> list[JobContext]:
        """The jobs of ``outcomes`` the fence refused that are neither lost nor settled:
        their cancellation was requested first (``cancel_refused`` records them)."""
        return [
            o.ctx
            for o in outcomes
            if o.ctx.id not in recorded and not o.ctx.lost and not o.ctx.settled
        ]

    def cancel_refused(
        self, cur: Any, outcomes: list[HandlerOutcome], recorded: set[int]
    ) -> set[int]:
        """Record cancelled the jobs whose outcome the fence refused because their
        cancellation was requested first (the request won the race); returns their ids.

        One more statement only when an outcome was refused (a cancel race, or a lost
        lease the worker has not heard of yet).
        """
        refused = self.refused(outcomes, recorded)
        if not refused:
            return set()
        stopped = stop_store.confirm_cancel_many(
            cur,
            worker=self.worker_id,
            held=[(c.id, c.attempt) for c in refused],
            started=self.started(refused),
        )
        for ctx in refused:
            if ctx.id in stopped:
                ctx.mark_stopped("cancelled", force=True)
        return stopped

    def record_in_transaction(
        self, db: psycopg.Connection, outcomes: list[HandlerOutcome]
    ) -> set[int]:
        ended: set[int] = set()
        with db.transaction(), db.cursor() as cur:
            recorded = self.record(cur, outcomes, ended)
        settle_dependents(db, ended)
        return recorded

    def flush(self, db: psycopg.Connection, pending: list[HandlerOutcome]) -> None:
        """Record and log all of ``pending`` in one transaction, or one by one when the
        database refuses the batch; ``pending`` is empty afterwards (but for a lost
        connection, which is raised)."""
        try:
            recorded = self.record_in_transaction(db, pending)
        except CONNECTION_ERRORS:
            raise
        except psycopg.Error as exc:
            logger.error("event=batch_refused error=%r action=record_one_by_one", error_text(exc))
            self.record_one_by_one(db, pending)
            return
        self.log(pending, recorded)
        pending.clear()

    def record_one_by_one(self, db: psycopg.Connection, pending: list[HandlerOutcome]) -> None:
        """Record each of ``pending`` in a transaction of its own, log it and remove it.

        An outcome the database refuses is logged at ERROR with its job and replaced by a
        failed attempt whose error says why, which is storable; if even that is refused,
        the job is left to its lease (it runs again). A lost connection stops the walk
        (the outcomes not yet recorded stay in ``pending`` for the next turn).
        """
        while pending:
            outcome = pending[0]
            try:
                recorded = self.record_in_transaction(db, [outcome])
            except CONNECTION_ERRORS:
                raise
            except psycopg.Error as exc:
                ctx = outcome.ctx
                reason = error_text(exc)
                logger.error(
                    "job=%d task=%s tenant=%s attempt=%d event=outcome_refused error=%r "
                    "action=record_as_failed",
                    ctx.id,
                    ctx.task,
                    ctx.tenant,
                    ctx.attempt,
                    reason,
                )
                outcome = HandlerOutcome(
                    ctx,
                    ok=False,
                    error=storable_text(f"outcome not storable: {reason}", ERROR_MAX_BYTES),
                    traceback=None,
                    duration=outcome.duration,
                    ended=outcome.ended,
                )
                try:
                    recorded = self.record_in_transaction(db, [outcome])
                except CONNECTION_ERRORS:
                    raise
                except psycopg.Error as again:
                    logger.error(
                        "job=%d attempt=%d event=outcome_refused error=%r "
                        "action=left_to_lease_recovery",
                        ctx.id,
                        ctx.attempt,
                        error_text(again),
                    )
                    pending.pop(0)
                    self.finished += 1  # logged above, not as fenced out
                    continue
            pending.pop(0)
            self.log([outcome], recorded)

    def log(self, outcomes: list[HandlerOutcome], recorded: set[int]) -> None:
        """One INFO line per recorded batch; each outcome at DEBUG, each failure and
        discard at WARNING. The outcome of an attempt the worker had already ended
        (cancelled, timed out: logged then) is counted as what was recorded, at DEBUG.

        A line per job was a fifth of a no-op job's cost at thousands of jobs/s
        (bench/results/worker-profile.md); the batch line keeps the counts and a bounded list
        of ids, and an operator still sees every failure (its job, attempt and error) and every
        outcome lost with its lease.
        """
        counts = {"done": 0, "failed": 0, "dead": 0, "cancelled": 0, "discarded": 0, "snoozed": 0}
        announced: list[tuple[str, HandlerOutcome]] = []
        debug = logger.isEnabledFor(logging.DEBUG)
        for o in outcomes:
            self.finished += 1
            ctx = o.ctx
            status = self.statuses.pop(ctx.id, None)  # taken whatever comes of it
            if ctx.id not in recorded:
                stopped = stopped_outcome(ctx)
                if stopped is not None:  # logged as the worker ended it (JobStops)
                    counts[stopped] += 1
                    logger.debug(
                        "job=%d task=%s tenant=%s queue=%s attempt=%d outcome=%s reason=%s "
                        "event=returned_after_stop action=discarded duration_ms=%.1f",
                        ctx.id,
                        ctx.task,
                        ctx.tenant,
                        ctx.queue,
                        ctx.attempt,
                        stopped,
                        ctx.stop_reason,
                        o.duration * 1000,
                    )
                    continue
                counts["discarded"] += 1
                logger.warning(
                    "job=%d task=%s tenant=%s queue=%s attempt=%d outcome=discarded "
                    "reason=%s duration_ms=%.1f",
                    ctx.id,
                    ctx.task,
                    ctx.tenant,
                    ctx.queue,
                    ctx.attempt,
                    ctx.stop_reason if ctx.settled else "lease_lost",
                    o.duration * 1000,
                )
                continue
            # A failure's as JOB_FAIL_MANY decided it; one without a status was refused by the
            # fence and recorded cancelled (the test below).
            outcome = "done" if o.ok else status if status in ("dead", "snoozed") else "failed"
            if ctx.stop_reason == "cancelled":  # its cancel request won the race
                outcome = "cancelled"
            counts[outcome] += 1
            announced.append((outcome, o))
            if o.ok and not debug:
                continue
            level = {"done": logger.debug, "snoozed": logger.info}.get(outcome, logger.warning)
            level(
                "job=%d task=%s tenant=%s queue=%s attempt=%d outcome=%s duration_ms=%.1f%s",
                ctx.id,
                ctx.task,
                ctx.tenant,
                ctx.queue,
                ctx.attempt,
                outcome,
                o.duration * 1000,
                "" if o.ok else f" error={o.error!r}",
            )
        if outcomes and logger.isEnabledFor(logging.INFO):
            ids = [o.ctx.id for o in outcomes]
            shown = ",".join(map(str, ids[:LOGGED_IDS]))
            more = f",+{len(ids) - LOGGED_IDS}" if len(ids) > LOGGED_IDS else ""
            logger.info(
                "event=recorded jobs=%d done=%d failed=%d dead=%d cancelled=%d discarded=%d"
                " snoozed=%d ids=%s%s",
                len(outcomes),
                counts["done"],
                counts["failed"],
                counts["dead"],
                counts["cancelled"],
                counts["discarded"],
                counts["snoozed"],
                shown,
                more,
            )
        announce(announced)

    def release(
        self, db: psycopg.Connection, unstarted: list[JobContext], *, reason: str = "stopping"
    ) -> None:
        """Give back jobs claimed but not yet started (JOB_RELEASE_MANY), queued again at
        once with their place and the attempt not counted, so that other workers run them
        now: on stop, or when they waited too long for a thread (``reason``)."""
        with db.cursor() as cur:
            released = store.release_many(
                cur, worker=self.worker_id, held=[(c.id, c.attempt) for c in unstarted]
            )
        logger.info(
            "event=released_unstarted count=%d reason=%s ids=%s",
            len(released),
            reason,
            ",".join(str(c.id) for c in unstarted[:LOGGED_IDS]),
        )

    def give_back(self, db: psycopg.Connection) -> None:
        """Give back the ``unrunnable`` jobs: their task the worker has no handler for.

        The attempt is not counted and the job waits ``unknown_task_delay`` seconds in
        'scheduled' (JOB_GIVE_BACK_MANY): a worker started with the wrong
        ``TASK_MODULES``, or an older release, must not spend the attempts of jobs another
        worker can run, nor take them again at once. Logged at ERROR once per task: a
        backlog of such jobs would drown the log otherwise.
        """
        jobs = self.unrunnable
        with db.cursor() as cur:
            given = store.give_back_many(
                cur,
                worker=self.worker_id,
                held=[(j.id, j.attempt) for j in jobs],
                delay=self.unknown_task_delay,
            )
        self.unrunnable = []
        for job in jobs:
            if job.task in self.unknown_tasks_logged:
                continue
            self.unknown_tasks_logged.add(job.task)
            logger.error(
                "event=unknown_task task=%s job=%d queue=%s tenant=%s action=given_back "
                "retry_in=%gs tasks_served=%d hint=%r",
                job.task,
                job.id,
                job.queue,
                job.tenant,
                self.unknown_task_delay,
                self.served,
                "this worker has no handler for the task (check PGQUEUE['TASK_MODULES'] "
                "and the deployed code); its jobs are given back without spending an "
                "attempt; logged once per task",
            )
        logger.info(
            "event=given_back_unknown count=%d fenced_out=%d", len(given), len(jobs) - len(given)
        )
