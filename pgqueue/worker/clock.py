"""The database's clock, read on the worker's own monotonic clock.

A job's ``claimed_at`` is written by the claim statement, in the database server's clock;
its ``started_at`` and ``finished_at`` are when its handler began and ended, which only the
worker knows. If the worker wrote its host's wall clock, a host whose clock is off by a
second would show jobs starting before they were claimed, or waits of minus a second. So
the worker reads the database's clock (one ``SELECT clock_timestamp()``, timed on
``time.monotonic()``) when it connects and at each heartbeat round, and gives each moment
it measured on its monotonic clock as that reading plus the monotonic time since: every
time pgqueue stores is in the database server's clock, whatever the hosts' clocks say, to
within half that round trip (well under a millisecond on a local network). A handler's
start and end come from one reading, so their order and the run time between them are the
worker's own measurements, exact to the microsecond.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from .. import store


class DatabaseClock:
    """The database's clock as the worker last read it, and moments in it."""

    #: A reading is replaced by a later one whose round trip was no longer than this
    #: (seconds), or than the reading in use, or once the reading in use is this old: a
    #: round trip slowed by a busy server must not move every later time by half of it.
    GOOD_ROUND_TRIP = 0.001
    MAX_AGE = 600.0

    __slots__ = ("_at", "_mono", "_round_trip")

    def __init__(self) -> None:
        self._mono: float | None = None  # time.monotonic() at the reading's midpoint
        self._at: dt.datetime | None = None  # the database's clock then
        self._round_trip = float("inf")

    def read(self, cursor: Any) -> None:
        """Read the database's clock (one round trip) and keep the reading if it is good."""
        before = time.monotonic()
        at = store.database_clock(cursor)
        after = time.monotonic()
        round_trip = after - before
        stale = self._mono is None or after - self._mono > self.MAX_AGE
        if stale or round_trip <= max(self.GOOD_ROUND_TRIP, self._round_trip):
            self._mono, self._at, self._round_trip = (before + after) / 2, at, round_trip

    def at(self, mono: float) -> dt.datetime:
        """The moment ``mono`` (a ``time.monotonic()`` value) in the database's clock; in
        this host's wall clock (UTC) before the first reading."""
        if self._mono is None or self._at is None:
            return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=time.monotonic() - mono)
        return self._at + dt.timedelta(seconds=mono - self._mono)
