"""``print`` output a job can be traced to: ``job=<id> `` in front of each line it writes.

A log record carries the running job (``pgqueue.log``), but ``print`` writes bare text to
``sys.stdout``, and with several executor threads the lines of different jobs interleave.
runworker therefore replaces ``sys.stdout`` and ``sys.stderr`` with a ``JobLines`` around
each, which reads the job from the same context variable as the logging filter:

- text written outside a job (the worker's own threads, the project's code at start-up)
  passes through unchanged;
- text written by a job is held until its line is complete, then written whole, with
  ``job=<id> `` in front, under a lock: two jobs' lines never mix, even when ``print``'s
  arguments, separators and newline arrive as separate writes. A job's last line without a
  newline is written when the job's handler ends. The pieces of an unfinished line are
  kept as a list (joined once, when the line ends: a progress bar redrawn with ``\r``
  thousands of times costs each write its own length, not the line's so far), and a line
  longer than ``MAX_LINE`` characters is written out as it reaches that length, so a job
  that never writes a newline holds no more than that.

runworker leaves the streams alone when the project has replaced them already (they are not
``sys.__stdout__`` / ``sys.__stderr__``). Logging handlers created before the wrap (runworker's
own, or those of the project's ``LOGGING``) keep the original stream, so a log line is not
prefixed twice.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

from .log import current_job, on_job_end

if TYPE_CHECKING:
    from .worker.context import JobContext


class JobLines:
    """A text stream around ``stream`` that prefixes each line a running job writes."""

    #: Longest unfinished line a job's writes are held for, in characters: past it, what
    #: is held is written out as a line of its own.
    MAX_LINE = 64 * 1024

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.RLock()  # reentrant: a signal handler may print mid-write
        #: job id -> the pieces of its unfinished line, and their length
        self._pending: dict[int, tuple[list[str], int]] = {}

    def write(self, text: str) -> int:
        job = current_job()
        with self._lock:
            if job is None:
                self._stream.write(text)
                return len(text)
            pieces, size = self._pending.pop(job.id, ([], 0))
            if "\n" not in text and size + len(text) <= self.MAX_LINE:
                pieces.append(text)
                self._pending[job.id] = (pieces, size + len(text))
                return len(text)
            lines, newline, rest = ("".join(pieces) + text).rpartition("\n")
            prefix = f"job={job.id} "
            if newline:
                self._stream.write("".join(f"{prefix}{line}\n" for line in lines.split("\n")))
            while len(rest) > self.MAX_LINE:
                self._stream.write(f"{prefix}{rest[: self.MAX_LINE]}\n")
                rest = rest[self.MAX_LINE :]
            if rest:
                self._pending[job.id] = ([rest], len(rest))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def end_job(self, job: JobContext) -> None:
        """Write out the job's unfinished line, if it left one (called as its handler ends)."""
        with self._lock:
            held = self._pending.pop(job.id, None)
            if held is not None:
                # A closed or broken stream must not turn the job's outcome into a failure.
                with contextlib.suppress(OSError, ValueError):
                    self._stream.write(f"job={job.id} {''.join(held[0])}\n")

    def flush(self) -> None:
        with self._lock:
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        """Everything else (encoding, fileno, isatty, buffer…) is the wrapped stream's."""
        return getattr(self._stream, name)


def install() -> bool:
    """Wrap ``sys.stdout`` and ``sys.stderr`` in ``JobLines``; False if either was replaced
    by the project (or is missing), in which case neither is touched."""
    if sys.stdout is None or sys.stderr is None:
        return False
    if sys.stdout is not sys.__stdout__ or sys.stderr is not sys.__stderr__:
        return False
    wrapped = JobLines(sys.stdout), JobLines(sys.stderr)
    sys.stdout, sys.stderr = wrapped
    for stream in wrapped:
        on_job_end(stream.end_job)
    return True
