"""Which claim statement a worker runs: the plain one while no limit row applies to its
queues, the limited one while one does.

The choice is the statements' own (``claim_store``): each checks, once and in its own
snapshot, whether a limit row applies, and says so when it is the wrong one. A worker
starts plain; a plain claim that finds a limit row claims nothing and the limited claim
follows at once, in the same turn; a limited claim that finds none sends the next turn
back to the plain one. No cache is kept of what the tables hold: a plain claim is always
one whose snapshot had no limit row, exactly a claim from before the limit was set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from .. import limits_store
from ..claim_store import ClaimedJob, claim_once


class Claims:
    """The claims of one worker (on its loop's thread)."""

    def __init__(self, worker: str, queues: Sequence[str], lease: float) -> None:
        self.worker = worker
        self.queues = list(queues)
        self.lease = lease
        #: The last claim found a limit row applying to the queues: claim within limits.
        self.limited = False
        #: Seconds to a rate-limited scope's next token (None: none, or not limited).
        self.token_wait: float | None = None

    def claim(
        self, cur: Any, want: int, successes: Sequence[tuple[int, int, str | None]] = ()
    ) -> tuple[set[int], list[ClaimedJob]]:
        """Claim up to ``want`` jobs, recording ``successes`` in the same statement.

        Returns the ids recorded (the others were fenced out) and the jobs claimed.
        """
        args = {"worker": self.worker, "queues": self.queues, "lease_seconds": self.lease}
        # The claim statements in their positional form: not parsed again on each turn.
        with psycopg.RawCursor(cur.connection) as raw:
            first = claim_once(raw, limit=want, limited=self.limited, results=successes, **args)
            if not first.switch:
                return first.recorded, first.jobs
            self.limited = not self.limited
            if not self.limited:  # it claimed as usual; the next turn claims plain
                return first.recorded, first.jobs
            second = claim_once(raw, limit=want, limited=True, **args)
        if second.switch:  # the limits went away between the two statements
            self.limited = False
        return first.recorded, second.jobs

    def short(self, cur: Any, want: int, got: int) -> None:
        """After a claim: if it was short under limits, a rate limit may be holding jobs
        back; note when its next token comes, to wake for it (a round trip only then)."""
        self.token_wait = None
        if self.limited and got < want:
            self.token_wait = limits_store.next_token_in(cur, self.queues)
