"""Tasks the tests enqueue. The payload chooses the fate, so one task covers many cases."""

import threading
import time
from pathlib import Path

import pgqueue


@pgqueue.task(name="test.noop")
def noop(payload, job):
    return None


@pgqueue.task(name="test.echo")
def echo(payload, job):
    return payload


@pgqueue.task(name="test.limited", max_attempts=2, queue="limited", priority=7)
def limited(payload, job):
    return None


# -- tasks of the worker runtime tests (tests/test_worker.py) -------------------------------
#
# Workers run in subprocesses, so these tasks talk to the test through files: a task
# touches ``<started>.<attempt>`` when its handler begins, and a blocking task waits for
# the file ``release`` to exist. Every wait has a deadline, so a test that goes wrong
# fails instead of hanging.

#: In-process tests: events that ``test.gate`` jobs wait on, by the payload's "gate" name.
GATES: dict[str, threading.Event] = {}


def _mark_started(payload, job):
    if isinstance(payload, dict) and payload.get("started"):
        Path(f"{payload['started']}.{job.attempt}").touch()


@pgqueue.task(name="test.sleep")
def sleep(payload, job):
    """Sleep ``payload["seconds"]``; returns the attempt that ran."""
    _mark_started(payload, job)
    time.sleep(payload["seconds"])
    return {"attempt": job.attempt}


@pgqueue.task(name="test.block")
def block(payload, job):
    """Run until the file ``payload["release"]`` exists (or fail after ``timeout`` s)."""
    _mark_started(payload, job)
    deadline = time.monotonic() + payload.get("timeout", 30)
    release = Path(payload["release"])
    while not release.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release} did not appear")
        time.sleep(0.02)
    return {"attempt": job.attempt, "worker": job.worker_id}


@pgqueue.task(name="test.fail_until")
def fail_until(payload, job):
    """Fail every attempt before ``payload["succeed_on"]``, then succeed."""
    if job.attempt < payload["succeed_on"]:
        raise RuntimeError(f"failing on purpose on attempt {job.attempt}")
    return {"attempt": job.attempt}


@pgqueue.task(name="test.until_lost")
def until_lost(payload, job):
    """Heartbeat in a loop until the worker says the job was lost (or a deadline)."""
    _mark_started(payload, job)
    deadline = time.monotonic() + payload.get("timeout", 30)
    while time.monotonic() < deadline:
        if not job.heartbeat():
            break
        time.sleep(0.05)
    return {"finished": True}


@pgqueue.task(name="test.gate")
def gate(payload, job):
    """Wait (in-process only) until the test sets ``GATES[payload["gate"]]``."""
    if not GATES[payload["gate"]].wait(payload.get("timeout", 30)):
        raise TimeoutError(f"gate {payload['gate']} was not opened")
    return {"gate": payload["gate"]}


@pgqueue.task(name="test.periodic_tick", queue="periodic")
def periodic_tick(payload, job):
    """The target of the periodic schedules of tests/test_periodic.py: returns its payload.

    Its own queue keeps the schedules' jobs away from the workers of other tests.
    """
    return {"payload": payload, "job": job.id}
