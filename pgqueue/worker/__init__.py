"""The worker runtime behind ``manage.py runworker``.

One module per duty:

- ``runtime``: ``WorkerLoop``, the loop of one process (claim for free slots and a bounded
  look-ahead, hand jobs to the executor, shutdown);
- ``executor``: running one job's handler on a thread and turning its return or raise into
  a ``HandlerOutcome``;
- ``recorder``: ``OutcomeRecorder``, writing a batch of outcomes, fenced, one by one when
  the database refuses the batch, and logging them;
- ``heartbeat``: rounds of lease renewal;
- ``listener``: LISTEN/NOTIFY wake-ups;
- ``maintenance``: rescuing expired leases, promoting due jobs, pruning dead worker rows and
  finished jobs, folding task stats, enqueueing periodic ticks;
- ``supervisor``: several processes under one parent;
- ``context``: what a handler sees;
- ``connection``: the worker's own connections, the reconnect policy, ``DatabaseUnreachable``.
"""

from .connection import DatabaseUnreachable
from .context import JobContext
from .runtime import WorkerLoop

__all__ = ["DatabaseUnreachable", "JobContext", "WorkerLoop"]
