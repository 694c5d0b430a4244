"""How many jobs a worker claims beyond its idle threads: the look-ahead, bounded in time.

Jobs claimed ahead wait, unstarted, in the process for a thread. They are what keeps the
threads busy while the loop records and claims (a round trip and a commit, a millisecond
or two), and what lets one commit carry many jobs; they are also what a job of another
tenant, claimed later, may wait behind, and what an idle worker elsewhere could have run.
For no-op jobs that costs nothing and a large look-ahead pays (more jobs per commit); for
jobs of a second it buys nothing and holds work back.

So the look-ahead is the number of jobs the threads start in ``horizon`` seconds
(``PGQUEUE["PREFETCH_SECONDS"]``) at the mean run time of the jobs this worker ran lately,
at most ``PGQUEUE["PREFETCH"]``, and none when not even one would start that soon (jobs
longer than the threads times the horizon). Only threads that may be free soon count: not
one whose job has run longer than ``PGQUEUE["PREFETCH_HOLD_SECONDS"]`` (a long job), so a
worker whose threads are all on long jobs claims nothing ahead. Until a job has finished
the mean is unknown, and each such thread gets one job ahead.

A job claimed ahead that still waits after ``PREFETCH_HOLD_SECONDS`` is given back (the
worker's loop; JOB_RELEASE_MANY): the look-ahead is an estimate, the bound is a promise.
"""

from __future__ import annotations

import math


class LookAhead:
    """The look-ahead of one worker process: ``size`` follows the jobs' mean run time."""

    #: Weight of each new run time in the moving mean (about the last 20 jobs).
    WEIGHT = 0.05

    __slots__ = ("cap", "horizon", "mean")

    def __init__(self, cap: int, horizon: float) -> None:
        self.cap = cap  # PGQUEUE["PREFETCH"] (or --prefetch): never more than this
        self.horizon = horizon  # PGQUEUE["PREFETCH_SECONDS"]
        self.mean: float | None = None  # seconds; None until a job has finished

    def observe(self, durations: list[float]) -> None:
        """Fold the run times of jobs that just finished into the mean."""
        mean = self.mean
        for d in durations:
            mean = d if mean is None else mean + self.WEIGHT * (d - mean)
        self.mean = mean

    def size(self, threads: int) -> int:
        """Jobs to hold beyond the idle threads, for ``threads`` threads that may be free
        soon (idle, or on a job that has not run long)."""
        if self.cap <= 0 or threads <= 0:
            return 0
        if self.mean is None:
            return min(self.cap, threads)
        if self.mean <= 0:
            return self.cap
        return min(self.cap, math.floor(threads * self.horizon / self.mean))
