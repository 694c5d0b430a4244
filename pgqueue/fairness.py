"""The fairness policy: which job runs next.

pgqueue orders runnable jobs by ``priority DESC, vtime, id`` and never changes that order
in the claim: all of the policy is in how ``vtime`` is assigned when a job becomes
runnable (enqueued without delay, promoted from scheduled, or retried). That keeps the
claim a single index scan and puts every policy decision in this module.

Fair ordering (the default) is start-time fair queuing with virtual time. Each priority
level of each queue is an independent fair-queuing system; a tenant's clock there is one
row of ``pgqueue_fair_clock``. When ``n`` jobs of a tenant with weight ``w`` become
runnable at a level whose head is ``h`` (the lowest vtime queued there, or the level's
largest clock when nothing is queued), they get::

    start = max(tenant's clock, h)
    vtime_i = start + i / w      for i = 1..n
    tenant's clock = start + n / w

- A flood of one tenant gets vtimes 1, 2, 3, ...; a tenant arriving later starts at the
  head, so its jobs interleave with the flood instead of waiting behind it.
- An idle tenant banks no credit: ``max(clock, h)`` restarts it at the head.
- A tenant with weight 3 advances its clock a third as fast: three of its jobs per one
  of a weight-1 tenant.
- A tenant's clock only grows, so its own jobs keep their order within a level.

FIFO ordering assigns ``vtime`` = the enqueue (or promotion) transaction's timestamp, so
jobs run in the order they became runnable. It exists to measure what fairness buys.
"""

from __future__ import annotations

from .conf import pgqueue_settings

ORDERINGS = ("fair", "fifo")


def level_head(queue: str, priority: str) -> str:
    """SQL for the current virtual time of one (queue, priority) level.

    The lowest queued (ungated) vtime there is read from the claim index (pgqueue_job_claim, an
    equality on queue and priority, then vtime order: one index tuple). When the level has
    nothing queued, everything assigned there has been claimed, so the current time is the
    largest clock of the level (pgqueue_fair_clock_level, a backward scan of one tuple).
    ``queue`` and ``priority`` are SQL expressions.
    """
    return f"""COALESCE(
        (SELECT hj.vtime FROM pgqueue_job hj
          WHERE hj.queue = {queue} AND hj.priority = {priority} AND hj.status = 'queued'
            AND NOT hj.gated
          ORDER BY hj.vtime LIMIT 1),
        (SELECT max(hc.vtime) FROM pgqueue_fair_clock hc
          WHERE hc.queue = {queue} AND hc.priority = {priority}),
        0.0)"""


def tenant_weight(tenant: str, queue: str) -> str:
    """SQL for a tenant's weight in a queue: the queue's override, else the tenant's weight.

    A tenant created by the same statement is not visible to it yet; it has weight 1.
    """
    return f"""COALESCE(
        (SELECT qw.weight FROM pgqueue_queue_weight qw
          WHERE qw.tenant = {tenant} AND qw.queue = {queue}),
        (SELECT t.weight FROM pgqueue_tenant t WHERE t.name = {tenant}),
        1.0)"""


def job_vtime(start: str, rank: str, weight: str) -> str:
    """SQL for the vtime of the ``rank``-th (1-based) job of a group starting at ``start``.

    ``%(fifo)s`` is bound by every statement that assigns vtimes (see ``fifo_param``).
    """
    return (
        f"CASE WHEN %(fifo)s THEN extract(epoch FROM now())::float8 "
        f"ELSE {start} + {rank} / {weight} END"
    )


def fifo_param() -> bool:
    """The value of ``%(fifo)s``: whether the configured ordering is FIFO."""
    return pgqueue_settings.ORDERING == "fifo"
