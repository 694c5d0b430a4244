"""What a handler receives as its second argument."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from ..conf import pgqueue_settings
from ..exceptions import InvalidJob, JobCancelled, JobTimedOut
from .outcome_text import ResultNotStorable, encode_result


class Report(NamedTuple):
    """What a heartbeat round writes of a job's progress and output: each as JSON text,
    None when unchanged since the last write. ``progress_at`` is the report's time
    (``time.monotonic()``); the versions are what ``report_written`` is told back."""

    progress: tuple[float, float | None, str | None] | None
    progress_at: float
    output_json: str | None
    progress_version: int
    output_version: int


class JobContext:
    """The job a handler is running, and its line back to the worker.

    ``lost`` turns true when a heartbeat finds that the worker no longer holds the job (its
    lease expired and the job was recovered): the handler should stop, and whatever it
    returns is not recorded. Long loops call ``heartbeat()`` to learn that early.

    ``cancelled`` turns true when the job's cancellation was requested (``DELETE /jobs/<id>``,
    the admin, ``pgqueue.cancel``) or its attempt ran past its timeout: the worker records
    the attempt (cancelled, or failed "timed out after N s") without waiting for the
    handler, whose return is then discarded. ``heartbeat()`` raises ``JobCancelled`` (or
    its subclass ``JobTimedOut``) from then on. A handler that never looks keeps its
    thread, and so one of the worker's slots, until it returns: threads cannot be killed.
    """

    __slots__ = (
        "_heartbeat",
        "_lost",
        "_output_json",
        "_output_version",
        "_output_written",
        "_progress",
        "_progress_at",
        "_progress_version",
        "_progress_written",
        "_report_lock",
        "_stop",
        "_upstream",
        "_wake",
        "attempt",
        "began",
        "claimed",
        "deadline",
        "future",
        "id",
        "max_attempts",
        "payload",
        "priority",
        "queue",
        "record_start_first",
        "report_since",
        "settled",
        "span",
        "start_written",
        "step",
        "task",
        "tenant",
        "timeout",
        "traceparent",
        "tracestate",
        "worker_id",
        "workflow_id",
    )

    def __init__(
        self,
        *,
        id: int,
        task: str,
        payload: Any,
        tenant: str,
        queue: str,
        priority: int,
        attempt: int,
        max_attempts: int,
        worker_id: str,
        heartbeat: Callable[[float], None],
        timeout: float | None = None,
        record_start_first: bool = False,
        workflow_id: int | None = None,
        step: str | None = None,
        traceparent: str | None = None,
        tracestate: str | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        self.id = id
        self.task = task
        self.payload = payload
        self.tenant = tenant
        self.queue = queue
        self.priority = priority
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.worker_id = worker_id
        #: time.monotonic() when the worker got it from its claim, and when a thread took
        #: it and its handler began (None until then: it waits, claimed ahead).
        self.claimed = time.monotonic()
        self.began: float | None = None
        #: Its start was written to the job's row (by a heartbeat round).
        self.start_written = False
        #: The job lost a lease before its start was recorded (``lost_claims``): its start
        #: is written before its handler runs (JobExecutor._write_start).
        self.record_start_first = record_start_first
        self.future: Any = None
        self._heartbeat = heartbeat
        self._lost = False  # written by the worker's loop thread only
        self._stop: str | None = None  # "cancelled" or "timed_out"; the loop thread's too
        #: True once the worker is done with this attempt (recorded it cancelled or timed
        #: out): the handler's own outcome, whenever it comes, is discarded.
        self.settled = False
        self.timeout = timeout
        #: time.monotonic() past which the attempt has timed out: counted from the
        #: handler's start (None until then: a job that has not begun cannot time out).
        self.deadline: float | None = None
        self._upstream: list[Any] | None = None
        #: The workflow it is a step of, and the step's name (None: none).
        self.workflow_id = workflow_id
        self.step = step
        #: The W3C trace context it was enqueued in (None: none was recorded), and the
        #: span its attempt runs in while the handler runs (``pgqueue.tracing``).
        self.traceparent = traceparent
        self.tracestate = tracestate
        self.span: Any = None
        #: Progress and output the handler reported (``progress()``, ``output()``): the
        #: latest of each, and how many reports of each the next heartbeat round has to
        #: write (a version the round's write is compared with). Handler threads write
        #: them, the loop's thread reads them: under ``_report_lock``.
        self._report_lock = threading.Lock()
        self._progress: tuple[float, float | None, str | None] | None = None
        self._progress_at = 0.0
        self._output_json: str | None = None
        self._progress_version = self._progress_written = 0
        self._output_version = self._output_written = 0
        #: time.monotonic() since when a report waits to be written (None: none waits):
        #: the loop runs a heartbeat round once it has waited PROGRESS_WRITE_SECONDS.
        self.report_since: float | None = None
        #: Wakes the worker's loop (None: nothing to wake), so that it sees a report wait.
        self._wake = wake

    @property
    def upstream(self) -> list[Any]:
        """The jobs this one waited for (``depends_on``, a workflow's dependencies), in id
        order, each ``(id, step, status, result)`` (``pgqueue.workflow_store.Upstream``):
        read once, on first use, from the handler's thread. Empty for a job without
        dependencies."""
        if self._upstream is None:
            from django.db import connections

            from ..conf import queue_db
            from ..workflow_store import upstream

            with connections[queue_db(None)].cursor() as cursor:
                self._upstream = upstream(cursor, self.id)
        return self._upstream

    @property
    def upstream_results(self) -> dict[str | int, Any]:
        """The results of the jobs this one waited for, by step name (a workflow's step)
        or, for a job without one, by id. A dependency that ended dead or cancelled (the
        job runs anyway: ``on_upstream_failure="run"``) has None."""
        return {u.id if u.step is None else u.step: u.result for u in self.upstream}

    def mark_started(self) -> None:
        """The executor's, as a thread takes the job: its handler begins now."""
        if self.began is None:
            now = time.monotonic()
            if self.timeout is not None:  # set first: a loop that sees began sees it too
                self.deadline = now + self.timeout
            self.began = now

    @property
    def started(self) -> bool:
        """Its handler has begun (a thread took it): no longer one to give back."""
        return self.began is not None

    @property
    def lost(self) -> bool:
        """True once the worker learnt that this job's lease was lost."""
        return self._lost

    def mark_lost(self) -> None:
        self._lost = True

    @property
    def cancelled(self) -> bool:
        """True once the job was asked to stop, or its attempt timed out: stop, and return."""
        return self._stop is not None

    @property
    def stop_reason(self) -> str | None:
        """Why the handler should stop: "cancelled", "timed_out", or None."""
        return self._stop

    def mark_stopped(self, reason: str, *, force: bool = False) -> None:
        """The loop's: the first reason stays, unless ``force`` (what was recorded)."""
        if self._stop is None or force:
            self._stop = reason

    def heartbeat(self, timeout: float = 10.0) -> bool:
        """Ask the worker to renew its leases now; returns whether this job is still held.

        The worker renews every lease it holds every ``lease / 3`` anyway; calling this
        from a long loop is how a handler finds out promptly that it should stop. Raises
        ``JobCancelled`` when the job was asked to stop, ``JobTimedOut`` when its attempt
        ran past its timeout (the worker learns a request at once through a notification,
        or at the latest at its next round, ``lease / 3``).
        """
        self._raise_if_stopped()
        if not self.lost:
            self._heartbeat(timeout)
        self._raise_if_stopped()
        return not self.lost

    def _raise_if_stopped(self) -> None:
        if self._stop == "timed_out":
            raise JobTimedOut(f"job {self.id} attempt {self.attempt} ran past its timeout")
        if self._stop is not None:
            raise JobCancelled(f"job {self.id} was asked to stop")

    async def aheartbeat(self, timeout: float = 10.0) -> bool:
        """``heartbeat()`` for ``async def`` handlers: the event loop runs on meanwhile.

        ``heartbeat()`` waits for the worker's loop to renew the leases (usually a few
        milliseconds, at most ``timeout``); called from a coroutine it would hold up every
        other async job of the process for that long. This waits on a thread instead.
        """
        return await asyncio.to_thread(self.heartbeat, timeout)

    # -- progress and output ---------------------------------------------------------------

    def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Report how far the job has come: ``done`` of ``total`` (None: unknown), with an
        optional ``note`` (cut to ``PGQUEUE["MAX_PROGRESS_NOTE_CHARS"]``).

        Cheap: it keeps the latest report in memory; the worker's next heartbeat round
        writes it (about a second later at most), one write per round whatever the rate of
        calls. Raises ``InvalidJob`` for a count that is negative, not finite or not a
        number, a ``done`` above ``total``, or a note that is not text.
        """
        done_n = _count("done", done)
        total_n = None if total is None else _count("total", total)
        if total_n is not None and done_n > total_n:
            raise InvalidJob("progress", f"done ({done_n!r}) is more than total ({total_n!r})")
        if note is not None:
            if not isinstance(note, str):
                raise InvalidJob("progress", f"note must be text, not {type(note).__name__}")
            note = note[: int(pgqueue_settings.MAX_PROGRESS_NOTE_CHARS)]
            try:
                note.encode()
            except UnicodeEncodeError:
                raise InvalidJob("progress", "note holds a lone surrogate") from None
            note = note.replace("\x00", "")  # PostgreSQL's jsonb holds no NUL
        with self._report_lock:
            self._progress = (done_n, total_n, note)
            self._progress_at = time.monotonic()
            self._progress_version += 1
            wake = self._reported()
        if wake:
            self._wake()  # type: ignore[misc]

    def output(self, value: Any) -> None:
        """Report the job's output so far: any JSON-serialisable value, which replaces the
        previous one, written by the worker's next heartbeat round like ``progress()``.

        Raises ``InvalidJob`` (the output kept is then the previous one) for a value that
        JSON cannot express or PostgreSQL cannot store, or that is larger than
        ``PGQUEUE["MAX_OUTPUT_BYTES"]`` bytes of JSON.
        """
        try:
            text = "null" if value is None else encode_result(value)
        except ResultNotStorable as exc:
            raise InvalidJob("output", str(exc)) from None
        assert text is not None
        size, limit = len(text.encode()), int(pgqueue_settings.MAX_OUTPUT_BYTES)
        if size > limit:
            raise InvalidJob(
                "output", f"{size} bytes of JSON, more than PGQUEUE['MAX_OUTPUT_BYTES'] ({limit})"
            )
        with self._report_lock:
            self._output_json = text
            self._output_version += 1
            wake = self._reported()
        if wake:
            self._wake()  # type: ignore[misc]

    def _reported(self) -> bool:
        """Under the lock: a report now waits; whether to wake the loop (the first one
        since the last write: the loop then knows when to write it)."""
        if self.report_since is not None:
            return False
        self.report_since = time.monotonic()
        return self._wake is not None

    @property
    def reported(self) -> dict[str, Any]:
        """The latest progress and output reported, as ``{"progress": {...} or None,
        "output": value or None}`` (what the worker writes)."""
        with self._report_lock:
            progress, output = self._progress, self._output_json
        return {
            "progress": None
            if progress is None
            else {"done": progress[0], "total": progress[1], "note": progress[2]},
            "output": None if output is None else json.loads(output),
        }

    def take_report(self) -> Report | None:
        """The loop's: what the next round has to write of this job (None: nothing new)."""
        with self._report_lock:
            fresh_progress = self._progress_version != self._progress_written
            fresh_output = self._output_version != self._output_written
            if not (fresh_progress or fresh_output):
                return None
            return Report(
                self._progress if fresh_progress else None,
                self._progress_at,
                self._output_json if fresh_output else None,
                self._progress_version,
                self._output_version,
            )

    def report_written(self, report: Report) -> None:
        """The loop's, once a round wrote ``report`` (or found the job no longer held):
        a report made meanwhile still waits, counted from now."""
        with self._report_lock:
            self._progress_written = max(self._progress_written, report.progress_version)
            self._output_written = max(self._output_written, report.output_version)
            waiting = (
                self._progress_version != self._progress_written
                or self._output_version != self._output_written
            )
            self.report_since = time.monotonic() if waiting else None

    def __repr__(self) -> str:
        return f"<JobContext id={self.id} task={self.task} attempt={self.attempt}>"


def _count(name: str, value: Any) -> float:
    """A progress count: a finite number >= 0 (an int stays an int)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidJob("progress", f"{name} must be a number, not {type(value).__name__}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite or value < 0:
        raise InvalidJob("progress", f"{name} must be a finite number >= 0, not {value!r}")
    return value
