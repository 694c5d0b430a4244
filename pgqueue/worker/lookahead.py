"""How many jobs a worker claims beyond its idle threads: the look-ahead, bounded in time.

Jobs claimed ahead wait, unstarted, in the process for a thread. They are what keeps the
threads busy while the loop records and claims (a round trip and a commit, a millisecond
or two), and what lets one commit carry many jobs; they are also what a job of another
tenant, claimed later, may have to wait behind: ``K`` jobs ahead on ``N`` threads hold it
back by about ``K / N`` run times. For no-op jobs that is nothing and a large look-ahead
pays (more jobs per commit); for jobs of a second it is seconds, and buys nothing.

So the look-ahead is the number of jobs the threads get through in ``horizon`` seconds
(``PGQUEUE["PREFETCH_SECONDS"]``),
from the mean run time of the jobs this worker ran lately (at least one, at most
``PGQUEUE["PREFETCH"]``): what a claimed-ahead job adds to another's wait stays about
``horizon``, whatever the jobs' length. Until a job has finished, the look-ahead is
the whole ``PREFETCH``.
"""

from __future__ import annotations

import math


class LookAhead:
    """The look-ahead of one worker process: ``size`` follows the jobs' mean run time."""

    #: Weight of each new run time in the moving mean (about the last 20 jobs).
    WEIGHT = 0.05

    __slots__ = ("cap", "horizon", "mean", "size", "threads")

    def __init__(self, cap: int, threads: int, horizon: float) -> None:
        self.cap = cap  # PGQUEUE["PREFETCH"] (or --prefetch): never more than this
        self.threads = threads
        self.horizon = horizon  # PGQUEUE["PREFETCH_SECONDS"]
        self.mean: float | None = None  # seconds; None until a job has finished
        self.size = cap

    def observe(self, durations: list[float]) -> None:
        """Fold the run times of jobs that just finished into the mean; resize."""
        if not durations or not self.cap:
            return
        mean = self.mean
        for d in durations:
            mean = d if mean is None else mean + self.WEIGHT * (d - mean)
        assert mean is not None
        self.mean = mean
        fits = self.threads * self.horizon / mean if mean > 0 else self.cap
        self.size = min(self.cap, max(1, math.floor(fits)))
