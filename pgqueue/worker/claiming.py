"""Which claim statement a worker runs: the plain one while no limit row applies to its
queues, the limited one while one does.

The choice is the statements' own (``claim_store``): each checks, once and in its own
snapshot, whether a limit row applies, and says so when it is the wrong one. A worker
starts plain; a plain claim that finds a limit row claims nothing and the limited claim
follows at once, in the same turn; a limited claim that finds none sends the next turn
back to the plain one. No cache is kept of what the tables hold: a plain claim is always
one whose snapshot had no limit row, exactly a claim from before the limit was set.

While its claims are limited, a worker whose turns come faster than
``PGQUEUE["LIMITS_CLAIM_SECONDS"]`` (short jobs) runs the limited claim at most that often:
the turns in between run the open claim (JOB_CLAIM_OPEN), which costs what the plain one
does and starts only jobs of tenants with no limit row, and keep the successes of jobs
counted in limit rows for the next limited claim. The limited claim's fixed work (its
limit rows, probes and counters, about a third of a no-op turn) is then paid once per
period instead of once per turn, and limited tenants' jobs start, and their slots free,
up to that much later. An open claim that comes up short (what is left may be limited
work) or finds a queue's own row is followed at once, in the same turn, by the limited
claim, and no open claim is tried for OPEN_PAUSE seconds.

The delay must fall only on limited tenants that keep up with their share, never bound a
tenant's starts to a cap's worth per period: a limited claim that filled some tenant's
room with jobs that were all among the best it took (room-bound: its jobs wait on its
room, not on their turn; sql._room_bound) is followed by another on the next turn, and so
is a counted job that ran a period or longer (its slot back at once: next to the job, a
limited claim among turns that slow costs nothing).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from .. import limits_store
from ..claim_store import ClaimedJob, claim_once
from ..conf import pgqueue_settings

Successes = Sequence[tuple[int, int, str | None]]


class Claims:
    """The claims of one worker (on its loop's thread)."""

    #: Seconds without an open claim after one came up short or found a queue's own row.
    OPEN_PAUSE = 1.0

    def __init__(
        self,
        worker: str,
        queues: Sequence[str],
        lease: float,
        *,
        limited_every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker = worker
        self.queues = list(queues)
        self.lease = lease
        #: The last claim found a limit row applying to the queues: claim within limits.
        self.limited = False
        #: Seconds to a rate-limited scope's next token (None: none, or not limited).
        self.token_wait: float | None = None
        #: PGQUEUE["LIMITS_CLAIM_SECONDS"]: the longest time between two limited claims
        #: while open ones run between them (0: every claim limited).
        self.limited_every = float(
            pgqueue_settings.LIMITS_CLAIM_SECONDS if limited_every is None else limited_every
        )
        self.clock = clock
        #: The last limited claim started all that some tenant's room allowed: the next
        #: turn claims limited too (see open_turn).
        self.room_bound = False
        self._limited_at = float("-inf")  # the last limited claim (clock())
        self._open_after = float("-inf")  # no open claim before this (clock())

    def open_turn(self, held: float = 0.0) -> bool:
        """Whether this turn claims open: the claims are limited, the last limited claim
        ran less than ``limited_every`` ago and found no tenant bound by its room, open
        claims are not paused, and no job counted in a limit row that finished since ran
        ``limited_every`` or longer (``held``: the longest such run, in seconds).

        A room-bound tenant has jobs waiting on nothing but its room: open turns would
        hold them back. A long job's slot goes back at once: kept for up to a period more,
        it would cost its tenant a share of its cap comparable to the job itself, while a
        limited claim among turns that slow costs next to nothing."""
        now = self.clock()
        return (
            self.limited
            and not self.room_bound
            and held < self.limited_every
            and now - self._limited_at < self.limited_every
            and now >= self._open_after
        )

    def claim_open(
        self, cur: Any, want: int, successes: Successes, counted: Successes
    ) -> tuple[set[int], list[ClaimedJob], bool]:
        """Claim up to ``want`` jobs with the open claim, recording ``successes`` (none
        counted in a limit row) in the same statement; when it comes up short or finds a
        queue's own row, the limited claim follows at once for the rest, recording the
        ``counted`` successes too. Otherwise those wait for a later turn.

        Returns the ids recorded, the jobs claimed and whether ``counted`` was submitted.
        """
        args = {"worker": self.worker, "queues": self.queues, "lease_seconds": self.lease}
        with psycopg.RawCursor(cur.connection) as raw:
            first = claim_once(
                raw, limit=want, limited=False, results=successes, open_=True, **args
            )
        if not first.switch and len(first.jobs) >= want:
            return first.recorded, first.jobs, False
        self._open_after = self.clock() + self.OPEN_PAUSE
        recorded, jobs = self.claim(cur, want - len(first.jobs), counted)
        return first.recorded | recorded, first.jobs + jobs, True

    def claim(
        self, cur: Any, want: int, successes: Successes = ()
    ) -> tuple[set[int], list[ClaimedJob]]:
        """Claim up to ``want`` jobs, recording ``successes`` in the same statement.

        Returns the ids recorded (the others were fenced out) and the jobs claimed.
        """
        now = self.clock()
        if self.limited:
            self._limited_at = now
        args = {"worker": self.worker, "queues": self.queues, "lease_seconds": self.lease}
        # The claim statements in their positional form: not parsed again on each turn.
        with psycopg.RawCursor(cur.connection) as raw:
            first = claim_once(raw, limit=want, limited=self.limited, results=successes, **args)
            self.room_bound = first.room_bound
            if not first.switch:
                return first.recorded, first.jobs
            self.limited = not self.limited
            if not self.limited:  # it claimed as usual; the next turn claims plain
                return first.recorded, first.jobs
            self._limited_at = now
            second = claim_once(raw, limit=want, limited=True, **args)
        self.room_bound = second.room_bound
        if second.switch:  # the limits went away between the two statements
            self.limited = False
        return first.recorded, second.jobs

    def short(self, cur: Any, want: int, got: int) -> None:
        """After a claim: if it was short under limits, a rate limit may be holding jobs
        back; note when its next token comes, to wake for it (a round trip only then)."""
        self.token_wait = None
        if self.limited and got < want:
            self.token_wait = limits_store.next_token_in(cur, self.queues)
