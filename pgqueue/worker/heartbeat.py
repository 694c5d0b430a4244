"""Heartbeats: renew the leases of every job a worker holds, in one statement.

The loop renews them every ``LEASE_SECONDS / 3``; a handler that calls ``job.heartbeat()``
asks for a round now and waits until one has run, so that it learns whether it still holds
its job (a lease it lost is never renewed: its result will be discarded). Only the loop
thread writes to the database; handler threads wait on a condition for the round's end.

A round also writes what the handlers reported since the last one (``job.progress()``,
``job.output()``), in the same statement: at most one write per job per round, whatever
the rate of calls, fenced like the lease (a job lost is not written).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

import psycopg

from .. import store
from .clock import DatabaseClock
from .context import JobContext, Report

logger = logging.getLogger("pgqueue.worker")


class Heartbeats:
    """Rounds of lease renewal, run by the loop, requested by handlers."""

    def __init__(
        self,
        worker_id: str,
        lease_seconds: float,
        wake: Callable[[], None],
        clock: DatabaseClock | None = None,
    ) -> None:
        self.worker_id = worker_id
        #: Gives a progress report's time in the database's clock.
        self.clock = clock or DatabaseClock()
        self.lease_seconds = lease_seconds
        self._wake = wake
        self._requested = threading.Event()
        self._done = threading.Condition()
        self._round = 0

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    def soon(self) -> None:
        """Have the loop run a round now, without waiting for it (a cancel notification)."""
        self._requested.set()
        self._wake()

    def request(self, timeout: float) -> None:
        """Called from a handler thread: renew leases now and wait for that to happen."""
        with self._done:
            target = self._round + 1
            self._requested.set()
            self._wake()
            self._done.wait_for(lambda: self._round >= target, timeout)

    def beat(
        self,
        db: psycopg.Connection,
        contexts: Sequence[JobContext],
        others: Iterable[tuple[int, int]] = (),
        started: Mapping[int, dt.datetime] | None = None,
    ) -> list[JobContext]:
        """One round on the loop's connection: the running jobs' ``contexts`` (those whose
        lease is lost are marked so) and ``others`` held but not running, as (id, attempt).
        ``started``: the handlers' starts to write, by job id (``start_written`` then).

        Returns the contexts whose cancellation was requested (and not yet dealt with):
        the caller ends them before it tells the handlers that the round has run.
        """
        self._requested.clear()
        live = [c for c in contexts if not c.lost and not c.settled]
        held = [(c.id, c.attempt) for c in live]
        held += list(others)
        reports = {c.id: (c, r) for c in live if (r := c.take_report()) is not None}
        with db.cursor() as cur:
            kept = store.heartbeat_flags(
                cur,
                worker=self.worker_id,
                held=held,
                lease_seconds=self.lease_seconds,
                started=started,
                progress={i: self._progress_json(r) for i, (_, r) in reports.items()},
                output={i: r.output_json for i, (_, r) in reports.items()},
            )
        for ctx, report in reports.values():  # written, or nothing to write (lost)
            ctx.report_written(report)
        for ctx in contexts:
            if started and ctx.id in started:  # written, or nothing to write (lost)
                ctx.start_written = True
            if not ctx.lost and not ctx.settled and ctx.id not in kept:
                ctx.mark_lost()
                logger.warning(
                    "job=%d attempt=%d event=lease_lost action=result_will_be_discarded",
                    ctx.id,
                    ctx.attempt,
                )
        return [c for c in contexts if kept.get(c.id) and not c.lost and not c.settled]

    def _progress_json(self, report: Report) -> str | None:
        """A report's progress as the JSON the job's row keeps (None: unchanged)."""
        if report.progress is None:
            return None
        done, total, note = report.progress
        at = self.clock.at(report.progress_at).isoformat()
        return json.dumps({"done": done, "total": total, "note": note, "at": at})

    def round_done(self) -> None:
        """Release the handlers waiting in ``request``: the round (and what came of it) ran."""
        with self._done:
            self._round += 1
            self._done.notify_all()
