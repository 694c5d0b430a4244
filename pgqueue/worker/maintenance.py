"""Maintenance: the queue's background duties, run by one worker at a time.

- ``stop_abandoned_jobs``: a job asked to stop whose lease ran out is cancelled (not
  retried); a job held a lease's length past its timeout, which its worker did not record,
  fails "timed out after N s" (retried or dead). See ``pgqueue.timeouts``.
- ``rescue_expired_leases``: a job whose lease ran out (its worker crashed, was killed or
  stalled) is taken back: scheduled again with backoff, or dead when out of attempts; or,
  when its start had not been recorded, queued again at its place without spending an
  attempt (dead at MAX_LOST_CLAIMS such losses).
- ``promote_due_jobs``: scheduled jobs whose run_at has come (delays, backoffs) become
  runnable, each with a fresh fair vtime, and their queues are notified.
- ``prune_dead_workers``: worker rows not seen for a day leave the registry.
- ``fold_task_stats``: finished attempts are folded into the per-task totals of the metrics,
  and into the per-queue, per-tenant wait and run-time totals (a bounded number of tenants
  a queue, the rest as "other"; an idle tenant gives its place up).
- ``correct_fair_clocks`` (only with ``FAIRNESS = "time"``): each settled attempt moves its
  tenant's clock by the error of its run-time charge (see ``pgqueue.fairness``).
- ``enqueue_due_periodic``: each due periodic schedule enqueues its tick's job (one per
  tick, held so by the job's idempotency key) and moves on to its next tick.
- ``prune_idle_clocks``: the fair clocks no future vtime depends on are deleted (a level
  with nothing live loses all of them; a tenant not live there, its clock at or below
  every vtime the level can still see), walking ``MAINTENANCE_BATCH_SIZE`` levels a pass,
  so a tenant's queues stop counting against ``MAX_QUEUES_PER_TENANT`` once their jobs
  are done. In a short transaction of its own after the pass's has committed (its locks
  are held for two statements, and a failure of it undoes none of the pass).
- ``settle_dependents`` / ``settle_waiting``: the jobs waiting for the jobs the pass ended
  are settled (``pgqueue.workflows``), and a page of ``WAITING_SWEEP_BATCH`` waiting jobs,
  going round in id order, is settled again: the repair for a settle a crash interrupted.
  Each round in a short transaction of its own after the pass's has committed.
- ``prune_finished_jobs``: finished jobs older than ``RETENTION`` leave the table with their
  attempt rows, in batches of ``PRUNE_BATCH_SIZE``, at most ``PRUNE_BATCHES_PER_PASS`` of
  them per pass, each in its own short transaction after the pass's has committed (so the
  fold it waits for is visible, and the advisory-locked transaction is not lengthened).

Who and how often: every worker's loop calls ``run_maintenance`` when it starts and then
about once per ``MAINTENANCE_SECONDS`` (jittered, so workers do not try in step; not while
stopping). A transaction-scoped advisory lock lets exactly one of them do the work each
time, and a worker that dies mid-run releases it with its transaction. The duties run in
that one transaction, in the order above. Rescue and promotion take their rows with SKIP
LOCKED (at most ``MAINTENANCE_BATCH_SIZE`` each per run) and promotion locks tenant clocks
in sorted order, so maintenance never deadlocks with enqueues or with itself.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from .. import (
    fair_store,
    key_store,
    limits_store,
    prune_store,
    stop_store,
    store,
    workflow_store,
)
from ..conf import pgqueue_settings
from ..fairness import by_time
from ..schedules import Fired, enqueue_due
from .connection import CONNECTION_ERRORS, error_text
from .recorder import settle_dependents

logger = logging.getLogger("pgqueue.worker")


@dataclass
class MaintenanceResult:
    ran: bool  # False: another worker held the lock, nothing was done
    rescued: dict[int, str]
    promoted: list[int]


def maintain(db: Any) -> None:
    """One pass from a worker's loop; an error of the database in it does not stop the
    worker: the pass's transaction has rolled back and the next pass tries again. A lost
    connection is the loop's to handle (it reconnects)."""
    try:
        run_maintenance(db)
    except CONNECTION_ERRORS:
        raise
    except psycopg.Error as exc:
        logger.exception("event=maintenance_error error=%r action=retry_next_pass", error_text(exc))


def run_maintenance(conn: Any) -> MaintenanceResult:
    """One maintenance pass on ``conn`` (a psycopg connection in autocommit mode)."""
    with conn.transaction(), conn.cursor() as cur:
        if not store.try_maintenance_lock(cur):
            return MaintenanceResult(False, {}, [])
        head = store.attempt_head(cur)  # before any write: see TASK_STAT_FOLD
        stopped = stop_abandoned_jobs(cur)
        rescued = rescue_expired_leases(cur)
        promoted = promote_due_jobs(cur)
        settle_keys(cur, [*stopped, *rescued])
        prune_dead_workers(cur)
        fold_task_stats(cur, head)
        store.release_idle_tenant_stats(cur)
        if by_time():
            correct_fair_clocks(cur)
        enqueue_due_periodic(cur)
        recount_limits(cur)
    # The dependents of the jobs the pass ended, and a page of the waiting jobs, each in
    # transactions of their own once the pass has committed.
    settle_dependents(conn, [*stopped, *rescued])
    settle_waiting(conn)
    prune_idle_clocks(conn)
    prune_finished_jobs(conn)
    # Logged once committed: a pass that rolled back rescued and promoted nothing.
    for job_id, status in rescued.items():
        logger.warning("job=%d event=lease_expired new_status=%s", job_id, status)
    for job_id, event in stopped.items():
        logger.warning("job=%d event=%s action=recorded_by_maintenance", job_id, event)
    if promoted:
        logger.debug("event=promoted count=%d", len(promoted))
    return MaintenanceResult(True, rescued, promoted)


# Each duty runs on the cursor of run_maintenance's transaction, under its advisory lock.


def stop_abandoned_jobs(cur: Any) -> dict[int, str]:
    """End the jobs their worker did not stop: asked to stop with an expired lease
    (cancelled, not retried), or held a lease's length past their timeout (failed "timed
    out after N s", retried or dead). ``{job id: event}``. Runs before the reaper, which
    would schedule the former for another attempt."""
    stopped = dict.fromkeys(stop_store.reap_cancelled(cur), "cancelled")
    for job_id, status in stop_store.reap_timed_out(cur).items():
        stopped[job_id] = f"timed_out new_status={status}"
    return stopped


#: When this process last recounted the limit counters (time.monotonic()).
_last_recount = float("-inf")


def recount_limits(cur: Any, *, force: bool = False) -> list[tuple[int, int, int]]:
    """Every LIMITS_RECOUNT_SECONDS: recount the ``running`` of each limit row whose counter
    disagrees with its running jobs, under its lock with a fresh snapshot, so a counter
    can never drift for ever (the claim and every exit from running keep it exact; a job
    lost some other way, a row deleted by hand, would not). The rows that agree are read,
    never locked or written. Logs each correction at WARNING: one means something bypassed
    pgqueue. Then deletes the rows that limit nothing any more and hold nothing back."""
    global _last_recount
    now = time.monotonic()
    if not force and now - _last_recount < float(pgqueue_settings.LIMITS_RECOUNT_SECONDS):
        return []
    _last_recount = now
    fixed = limits_store.recount(cur)
    for row_id, was, count in fixed:
        logger.warning("event=limit_recounted limit=%d was=%d now=%d", row_id, was, count)
    # Rows left limiting nothing go (each locked and re-checked as it is deleted): the
    # claims of queues no row applies to any more are plain again.
    for row_id in limits_store.delete_unused(cur):
        logger.info("event=limit_row_deleted limit=%d reason=unused", row_id)
    return fixed


def rescue_expired_leases(cur: Any) -> dict[int, str]:
    """Take back jobs whose worker died or stalled past its lease; ``{job id: new status}``.

    An expiry after the job's start was recorded counts as an attempt, so a job that
    crashes every worker that runs it ends dead instead of going round forever. One
    before it (a job claimed ahead whose worker a neighbour's handler crashed or stalled)
    gives the job back at its place without spending an attempt, until the
    MAX_LOST_CLAIMS-th such loss makes it dead. The worker that held it is fenced out:
    whatever it records later for that attempt is discarded.
    """
    return store.reap_expired(cur)


def settle_keys(cur: Any, ended: list[int]) -> int:
    """Give back the concurrency keys' slots of the jobs this pass ended (``ended``), and
    examine up to KEY_ADMIT_BATCH new keyed jobs: the workers do so when told of new keyed
    work, this is the net under a wake-up they missed. Returns how many it examined."""
    return key_store.settle(cur, sorted(ended), admit=int(pgqueue_settings.KEY_ADMIT_BATCH))


def promote_due_jobs(cur: Any) -> list[int]:
    """Make due scheduled jobs runnable; returns their ids.

    Each gets a fresh fair vtime, so a job back from a backoff does not jump the line.
    """
    return store.promote_due(cur)


#: Where the sweep of waiting jobs goes on from (an id; 0: from the first), in this process.
_sweep_after = 0


def settle_waiting(conn: Any) -> dict[int, str]:
    """Settle the next WAITING_SWEEP_BATCH waiting jobs in id order, going round: the
    repair for a job whose settle a process's death interrupted (workflows.sql). Most
    stay waiting, their dependencies unfinished."""
    global _sweep_after
    with conn.cursor() as cur:
        page = workflow_store.waiting_page(
            cur, after=_sweep_after, limit=int(pgqueue_settings.WAITING_SWEEP_BATCH)
        )
    _sweep_after = page[-1] if page else 0
    if not page:
        return {}
    settled = workflow_store.settle_rounds(workflow_store.psycopg_atomic(conn), ids=page)
    if settled:
        logger.info("event=waiting_swept examined=%d settled=%d", len(page), len(settled))
    return settled


def prune_dead_workers(cur: Any) -> None:
    """Forget worker rows not seen for a day: the registry is for the living."""
    store.prune_workers(cur)


def fold_task_stats(cur: Any, head: int) -> int:
    """Fold finished attempts into the per-task totals, and into the per-tenant waits and
    run times; returns how many were folded.

    The metrics endpoint then reads a few rows per task, not the whole attempt history.
    ``head`` was read before this transaction's first write. No attempt is ever skipped:
    the fold stops short of any id whose transaction may still be open (TASK_STAT_FOLD)
    and takes it on a later pass, so the counters may lag a long transaction, never lose.
    """
    return store.fold_task_stats(cur, head=head)


def correct_fair_clocks(cur: Any) -> int:
    """Charge tenants the error of their jobs' run-time estimates; returns the new mark.

    The estimate fixed a job's place when it became runnable; the correction makes the
    tenant's later jobs pay for the difference, so that shares follow actual worker time.
    """
    return fair_store.correct_fair_clocks(cur)


#: Where this process's next prune of idle clocks goes on (None: from the first level).
_clocks_after: tuple[str, int] | None = None


def prune_idle_clocks(conn: Any) -> int:
    """Delete the fair clocks whose absence changes no future vtime, over the next
    MAINTENANCE_BATCH_SIZE levels (queue, priority) of this process's walk; returns how
    many. On ``conn`` (psycopg, autocommit), in a transaction of its own. Locked with SKIP
    LOCKED and decided again with a fresh snapshot before the delete
    (fair_store.prune_fair_clocks), so an open enqueue's clock is never taken, and a
    promotion or a correction of another worker's pass is never waited for (nor waits)."""
    global _clocks_after
    with conn.transaction(), conn.cursor() as cur:
        pruned = fair_store.prune_fair_clocks(cur, after=_clocks_after)
    _clocks_after = pruned.after
    if pruned.deleted:
        logger.debug("event=fair_clocks_pruned count=%d", len(pruned.deleted))
    return len(pruned.deleted)


def enqueue_due_periodic(cur: Any, now: dt.datetime | None = None) -> list[Fired]:
    """Enqueue the job of each due periodic schedule's tick; returns what each did.

    Through ``store.enqueue``, so the tenant's fair clock is charged as for any job. A tick
    missed while no worker ran becomes one job, or none (``missed="skip"``), not a burst.
    """
    return enqueue_due(cur, now=now)


def prune_finished_jobs(
    conn: Any, *, max_batches: int | None = None, now: dt.datetime | None = None
) -> dict[str, prune_store.Pruned]:
    """Delete finished jobs past their retention, with their attempts; ``{status: removed}``.

    Runs on ``conn`` (psycopg, autocommit) in transactions of its own, one per batch of at
    most ``PRUNE_BATCH_SIZE`` jobs: none of them holds locks or a snapshot for long, and
    rows something else holds are skipped (SKIP LOCKED), so a prune never delays a claim or
    an enqueue. The statuses take turns, one batch each, until each has fewer than a batch
    left or ``max_batches`` have run (None: ``PRUNE_BATCHES_PER_PASS``; 0: no bound, until
    nothing is left, as ``manage.py pgqueue prune`` does). Jobs whose attempts the metrics
    have not folded yet stay until a later pass.
    """
    budget = pgqueue_settings.PRUNE_BATCHES_PER_PASS if max_batches is None else max_batches
    limit = int(pgqueue_settings.PRUNE_BATCH_SIZE)
    pending = {s: k for s, k in pgqueue_settings.retention_seconds.items() if k is not None}
    removed = {status: prune_store.Pruned(0, 0) for status in pending}
    batches = 0
    while pending and (budget == 0 or batches < budget):
        for status, keep in list(pending.items()):
            if budget and batches >= budget:
                break
            with conn.transaction(), conn.cursor() as cur:
                got = prune_store.prune_finished(
                    cur, status=status, keep_seconds=keep, limit=limit, now=now
                )
            batches += 1
            total = removed[status]
            removed[status] = prune_store.Pruned(
                total.jobs + got.jobs, total.attempts + got.attempts
            )
            if got.jobs < limit:
                del pending[status]
    pruned = {s: r for s, r in removed.items() if r.jobs}
    if pruned:
        logger.debug(
            "event=pruned %s",
            " ".join(f"{s}={r.jobs} attempts_{s}={r.attempts}" for s, r in pruned.items()),
        )
    return removed
