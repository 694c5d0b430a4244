"""Receivers of pgqueue's signals in a test worker: each appends a JSON line to the file
TESTS_SIGNAL_LOG names. One receiver of job_succeeded always raises, to show that
a receiver's error costs nothing to the job or the other receivers."""

import json
import os
import threading

from django.dispatch import receiver

from pgqueue import signals

_lock = threading.Lock()


def _write(name, job, **fields):
    line = {"signal": name, "job": job.id, "task": job.task, "attempt": job.attempt, **fields}
    with _lock, open(os.environ["TESTS_SIGNAL_LOG"], "a") as f:
        f.write(json.dumps(line) + "\n")


@receiver(signals.job_started)
def started(sender, job, **kwargs):
    from pgqueue.models import Job

    # The job is running (its start was not recorded yet: the signal comes first).
    _write("started", job, status=Job.objects.get(id=job.id).status)


@receiver(signals.job_succeeded)
def broken(sender, job, result, **kwargs):
    raise RuntimeError("a receiver that fails")


@receiver(signals.job_succeeded)
def succeeded(sender, job, result, **kwargs):
    from pgqueue.models import Job

    # Sent after the commit: the job is done as the receiver reads it.
    _write("succeeded", job, result=result, status=Job.objects.get(id=job.id).status)


@receiver(signals.job_failed)
def failed(sender, job, error, traceback, **kwargs):
    _write("failed", job, error=error, has_traceback=bool(traceback))


@receiver(signals.job_dead)
def dead(sender, job, error, traceback, **kwargs):
    from pgqueue.models import Job

    _write("dead", job, error=error, status=Job.objects.get(id=job.id).status)
