"""Django signals a worker sends about the jobs it runs.

Connect receivers in your app's ``ready()`` (or a module it imports), as with any Django
signal; the worker process imports your apps, so they are connected there too::

    from django.dispatch import receiver
    from pgqueue.signals import job_dead

    @receiver(job_dead)
    def page_someone(sender, job, error, **kwargs):
        ...

``sender`` is the task's name, so ``@receiver(job_dead, sender="shop.charge")`` hears one
task only. ``job`` is what the handler saw (``id``, ``task``, ``tenant``, ``queue``,
``attempt``, ``max_attempts``, ``payload``).

When they are sent, and where:

- ``job_started(sender, job)``: in the worker process, on the thread that runs the handler,
  just before the handler is called (for an ``async def`` handler, on the worker's event
  loop). Its start is not recorded yet when the signal is sent.
- ``job_succeeded(sender, job, result)``, ``job_failed(sender, job, error, traceback)``,
  ``job_dead(sender, job, error, traceback)``: in the worker process, on the
  worker's main loop, after the outcome has been recorded and committed, so a receiver that
  reads the job sees it. ``job_failed`` means another attempt will come (after its backoff);
  ``job_dead`` that none will. A snooze (``pgqueue.Retry``) sends neither, nor does an
  outcome the worker discarded (the job was cancelled or its lease was lost meanwhile).
  They follow what the handler returned or raised: an attempt the worker ends itself (a
  timeout, a cancellation) or that maintenance ends (its lease ran out) sends none.

Receivers are plain functions (an ``async def`` receiver is not awaited on the worker's
loop). Delivery is at-least-once like the jobs themselves: a worker that dies after recording an
outcome and before sending its signal sends nothing, and a job run twice (its lease lost)
may send ``job_started`` twice. Receivers must be quick: they run on the worker's threads
(a slow one holds up recording the next outcomes); enqueue a job for slow work. An
exception a receiver raises is logged (logger ``pgqueue.signals``) and never reaches the
worker, the job, or the other receivers.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("pgqueue.signals")

job_started = Signal()
job_succeeded = Signal()
job_failed = Signal()
job_dead = Signal()


def send(signal: Signal, task: str, **kwargs: Any) -> None:
    """Send ``signal`` from the worker: every receiver runs, none can break the worker."""
    if not signal.receivers or not signal.has_listeners(task):  # the first test is free
        return
    for receiver, answer in signal.send_robust(task, **kwargs):
        if isinstance(answer, Exception):
            logger.error(
                "event=signal_receiver_failed signal=%s task=%s receiver=%s error=%r",
                _name(signal),
                task,
                getattr(receiver, "__qualname__", repr(receiver)),
                answer,
                exc_info=answer,
            )


def _name(signal: Signal) -> str:
    for name in ("job_started", "job_succeeded", "job_failed", "job_dead"):
        if globals()[name] is signal:
            return name
    return repr(signal)
