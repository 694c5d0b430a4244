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

Fairness by worker time (``FAIRNESS = "time"``; the default ``"jobs"`` is the above). The
unit of virtual time becomes a second of worker time: a job costs its run time, not 1, so
a tenant of 1 s jobs and a tenant of 10 ms jobs, both backlogged, get equal shares of the
workers' time (by weight), where ``"jobs"`` gives them equal shares of starts (the first
then holds about 99% of the workers). Run time is known only once a job has run, but its
vtime is fixed when it becomes runnable, so a job is charged an *estimate* then::

    charge = max(FAIRNESS_MIN_SECONDS, mean run time of the job's task)
    vtime_i = start + (charge_1 + ... + charge_i) / w

the mean over the task's attempts folded into ``pgqueue_task_stat`` (FAIRNESS_DEFAULT_SECONDS
while a task has none). The charge is kept on the job (``charge``), and maintenance corrects
the tenant's clock by ``(actual - charge) / w`` for each attempt once it has settled
(FAIR_CLOCK_CORRECT), so the tenant's later jobs pay for the estimate's error. The
correction moves the clock on without bound; a credit (a job shorter than charged) moves it
back at most to the level's head, so an idle tenant still banks nothing, and a tenant's
newer jobs can then run before the tail of its own older backlog by at most that credit.

What it costs: a few index tuples of ``pgqueue_task_stat`` read per enqueue and per task in a
promotion, and one maintenance statement per pass; the claim, the completion and the
``"jobs"`` statements are unchanged. What it cannot do: it orders who runs *next*, so a short
job still waits for a slot to free; when one tenant's long jobs fill every slot the short
job's wait is the long jobs' run time, whatever the order. Only a cap on the long tenant's
running jobs bounds that. A corrected error reaches only jobs that become runnable after
the correction (about 5 s after the attempt): queued jobs keep their vtime.
"""

from __future__ import annotations

from typing import Any

from .conf import pgqueue_settings

ORDERINGS = ("fair", "fifo")
FAIRNESS_MODES = ("jobs", "time")


def level_head(queue: str, priority: str) -> str:
    """SQL for the current virtual time of one (queue, priority) level.

    The lowest queued (ungated) vtime there is read from the claim index (pgqueue_job_claim, an
    equality on queue and priority, then vtime order: one index tuple). When no ungated job
    is queued there but limited tenants' gated jobs are, the head is the lowest of theirs
    (one probe of pgqueue_job_gated per tenant with a limit row; only then): otherwise a
    tenant arriving behind a capped tenant's backlog would start after all of it, and the
    capped tenant's older vtimes would win every slot its cap leaves it. When the level
    has nothing queued, everything assigned there has been claimed, so the current time is
    the largest clock of the level (pgqueue_fair_clock_level, a backward scan of one
    tuple). ``queue`` and ``priority`` are SQL expressions.
    """
    return f"""COALESCE(
        {queued_head(queue, priority)},
        {gated_head(queue, priority)},
        {clock_head(queue, priority)},
        0.0)"""


def queued_head(queue: str, priority: str) -> str:
    """SQL: the lowest vtime of the level's queued ungated jobs (NULL: none); one tuple of
    pgqueue_job_claim. The first term of ``level_head``."""
    return f"""(SELECT hj.vtime FROM pgqueue_job hj
          WHERE hj.queue = {queue} AND hj.priority = {priority} AND hj.status = 'queued'
            AND NOT hj.gated
          ORDER BY hj.vtime LIMIT 1)"""


def gated_head(queue: str, priority: str) -> str:
    """SQL: the lowest vtime of the level's gated jobs, those of tenants with a limit row
    (the only ones that can have gated jobs: LIMIT_DELETE_UNUSED keeps a row while its scope
    has any); NULL: none. The second term of ``level_head``."""
    return f"""(SELECT min(hg.vtime)
           FROM (SELECT DISTINCT hl.tenant FROM pgqueue_limit hl WHERE hl.tenant <> '') ht
          CROSS JOIN LATERAL (
                SELECT g.vtime FROM pgqueue_job g
                 WHERE g.queue = {queue} AND g.tenant = ht.tenant
                   AND g.priority = {priority} AND g.status = 'queued' AND g.gated
                 ORDER BY g.priority DESC, g.vtime LIMIT 1) hg)"""


def clock_head(queue: str, priority: str) -> str:
    """SQL: the largest clock of the level (NULL: none); a backward scan of one tuple of
    pgqueue_fair_clock_level. The third term of ``level_head``."""
    return f"""(SELECT max(hc.vtime) FROM pgqueue_fair_clock hc
          WHERE hc.queue = {queue} AND hc.priority = {priority})"""


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


def by_time() -> bool:
    """Whether jobs are charged their run time (``FAIRNESS = "time"``) rather than 1."""
    return pgqueue_settings.FAIRNESS == "time"


def run_time_charge(task: str) -> str:
    """SQL for the seconds a job of ``task`` (an SQL expression) is charged when it becomes
    runnable: its task's mean run time, at least ``%(charge_min)s``; ``%(charge_default)s``
    while the task has no folded attempt (see ``charge_params``).

    Every outcome counts: a failed attempt held a slot as long as a successful one. The
    rows of one task in pgqueue_task_stat are at most outcomes x run-time buckets (a few
    dozen), read from pgqueue_task_stat_uniq (task first).
    """
    return f"""GREATEST(%(charge_min)s::float8, COALESCE(
        (SELECT sum(ts.seconds) / NULLIF(sum(ts.count), 0) FROM pgqueue_task_stat ts
          WHERE ts.task = {task}),
        %(charge_default)s::float8))"""


def charge_params() -> dict[str, float]:
    """The values of ``%(charge_min)s`` and ``%(charge_default)s``."""
    return {
        "charge_min": float(pgqueue_settings.FAIRNESS_MIN_SECONDS),
        "charge_default": float(pgqueue_settings.FAIRNESS_DEFAULT_SECONDS),
    }


def statement(by_jobs: str, by_time_: str, params: dict[str, Any]) -> str:
    """The statement of the configured fairness, of a pair of sql.py's (X, X_BY_TIME).

    By time, ``params`` gains the charge's parameters (``charge_params``); by jobs it is
    left as it is, so the statement and its parameters are exactly those of ``"jobs"``.
    """
    if not by_time():
        return by_jobs
    params.update(charge_params())
    return by_time_


def charge_units(by_time: bool, count: str, charge: str) -> str:
    """SQL for what ``count`` jobs of one charge cost in clock units (before the weight):
    the count itself by jobs, ``count`` times the ``charge`` by time."""
    return f"({count} * {charge})" if by_time else count
