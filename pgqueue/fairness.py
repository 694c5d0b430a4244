"""The fairness policy: which job runs next.

pgqueue orders runnable jobs by ``priority DESC, vtime, id`` and never changes that order
in the claim: all of the policy is in how ``vtime`` is assigned when a job becomes
runnable (enqueued without delay, promoted from scheduled, or retried). That keeps the
claim a single index scan and puts every policy decision in the statements that assign
``vtime`` (pgqueue/queries/enqueue.sql and promotion.sql, their fair clocks in
fair_clock.sql); this module holds the settings' values they are bound with.

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


def fifo_param() -> bool:
    """The value of ``%(fifo)s``: whether the configured ordering is FIFO."""
    return pgqueue_settings.ORDERING == "fifo"


def by_time() -> bool:
    """Whether jobs are charged their run time (``FAIRNESS = "time"``) rather than 1."""
    return pgqueue_settings.FAIRNESS == "time"


def charge_params() -> dict[str, float]:
    """The values of ``%(charge_min)s`` and ``%(charge_default)s``."""
    return {
        "charge_min": float(pgqueue_settings.FAIRNESS_MIN_SECONDS),
        "charge_default": float(pgqueue_settings.FAIRNESS_DEFAULT_SECONDS),
    }


def statement(by_jobs: str, by_time_: str, params: dict[str, Any]) -> str:
    """The statement of the configured fairness, of a pair (X, X_BY_TIME) of pgqueue.sql's.

    By time, ``params`` gains the charge's parameters (``charge_params``); by jobs it is
    left as it is, so the statement and its parameters are exactly those of ``"jobs"``.
    """
    if not by_time():
        return by_jobs
    params.update(charge_params())
    return by_time_
