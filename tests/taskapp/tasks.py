"""Tasks the tests enqueue. The payload chooses the fate, so one task covers many cases."""

import asyncio
import logging
import os
import sys
import threading
import time
from pathlib import Path

import pgqueue
from tests.taskapp import django_tasks  # noqa: F401  (the app's Django Tasks, for the worker)


@pgqueue.task(name="test.noop")
def noop(payload, job):
    return None


@pgqueue.task(name="test.echo")
def echo(payload, job):
    return payload


@pgqueue.task(name="test.per_user", concurrency_key=lambda payload: f"user:{payload['user']}")
def per_user(payload, job):
    return None


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


@pgqueue.task(name="test.exit")
def exit_process(payload, job):
    """End the worker's process at once, as a crash in C would: no cleanup, nothing
    recorded, every job the process holds left to its lease."""
    os._exit(payload.get("code", 3) if isinstance(payload, dict) else 3)


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


# -- outcomes a worker cannot store as they are (tests/test_poison.py) ----------------------


class _UnprintableError(Exception):
    """An exception whose ``str()`` itself raises."""

    def __str__(self) -> str:
        raise ValueError("no text for this exception")


def _poison_outcome(kind):
    if kind == "nul_result":
        return "a\x00b"
    if kind == "nul_error":
        raise RuntimeError("a\x00b")
    if kind == "surrogate_result":
        return {"text": "\ud800"}
    if kind == "surrogate_error":
        raise RuntimeError("bad \udcff text")
    if kind == "set_result":
        return {1, 2}
    if kind == "object_result":
        return object()
    if kind == "nan_result":
        return {"x": float("nan")}
    if kind == "infinity_result":
        return [float("inf")]
    if kind == "big_result":
        return "x" * 5000
    if kind == "deep_result":  # deeper than MAX_JSON_DEPTH (100), shallow for json.dumps
        value: list = []
        for _ in range(150):
            value = [value]
        return value
    if kind == "unprintable_error":
        raise _UnprintableError()
    if kind == "huge_error":
        raise RuntimeError("e" * 100_000)
    raise AssertionError(f"unknown poison {kind!r}")


@pgqueue.task(name="test.poison")
def poison(payload, job):
    """Return or raise an outcome of ``payload["kind"]`` that cannot be stored as it is."""
    return _poison_outcome(payload["kind"])


# -- log records inside a job (tests/test_job_logging.py) ----------------------------------

task_logger = logging.getLogger("tests.taskapp.tasks")


@pgqueue.task(name="test.log")
def log(payload, job):
    """Log ``payload["word"]`` at INFO, as a handler using the logging module does."""
    task_logger.info("handler says %s", payload["word"])
    return None


# -- async def handlers (tests/test_async_handlers.py) -------------------------------------


@pgqueue.task(name="test.async_add")
async def async_add(payload, job):
    """Await something, then return the sum; proves the coroutine is awaited."""
    await asyncio.sleep(0.01)
    alive = await job.aheartbeat()
    return {"sum": payload["a"] + payload["b"], "attempt": job.attempt, "alive": alive}


@pgqueue.task(name="test.async_fail")
async def async_fail(payload, job):
    await asyncio.sleep(0)
    raise ValueError(f"async failure {payload['n']}")


@pgqueue.task(name="test.async_sleep")
async def async_sleep(payload, job):
    """Sleep ``payload["seconds"]`` on the event loop; returns when it began and ended."""
    began = time.time()
    await asyncio.sleep(payload["seconds"])
    task_logger.info("async sleeper %s done", payload["n"])
    return {"n": payload["n"], "began": began, "ended": time.time()}


@pgqueue.task(name="test.periodic_tick", queue="periodic")
def periodic_tick(payload, job):
    """The target of the periodic schedules of tests/test_periodic.py: returns its payload.

    Its own queue keeps the schedules' jobs away from the workers of other tests.
    """
    return {"payload": payload, "job": job.id}


@pgqueue.task(name="test.print")
def print_words(payload, job):
    """Print ``payload["word"]`` in pieces, to stdout and stderr, as a handler using print does."""
    print("printed", payload["word"])
    print("to stderr", payload["word"], file=sys.stderr)
    print("unfinished", payload["word"], end="")
    return None


@pgqueue.task(name="test.nap")
def nap(payload, job):
    """test.sleep under another name: a task of its own run time (tests/test_fairness_time.py)."""
    time.sleep(payload["seconds"])


# -- cancelling a running job, timeouts (tests/test_cancel_timeout.py) ----------------------


def _note(payload, key, text):
    if isinstance(payload, dict) and payload.get(key):
        Path(f"{payload[key]}.{text}").touch()


@pgqueue.task(name="test.until_cancelled")
def until_cancelled(payload, job):
    """Look at ``job.cancelled`` (no heartbeat: no database round) until it turns true,
    touch ``<observed>.<reason>``, then return a value that must be discarded."""
    _mark_started(payload, job)
    deadline = time.monotonic() + payload.get("timeout", 30)
    while not job.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    _note(payload, "observed", job.stop_reason or "never")
    return {"ignored": True}


@pgqueue.task(name="test.heartbeat_until_cancelled")
def heartbeat_until_cancelled(payload, job):
    """Call ``job.heartbeat()`` in a loop; touch ``<observed>.<exception name>`` when it
    raises, then return a value that must be discarded."""
    _mark_started(payload, job)
    deadline = time.monotonic() + payload.get("timeout", 30)
    try:
        while time.monotonic() < deadline:
            job.heartbeat()
            time.sleep(0.05)
    except pgqueue.JobCancelled as exc:
        _note(payload, "observed", type(exc).__name__)
    return {"ignored": True}


@pgqueue.task(name="test.slow_first")
def slow_first(payload, job):
    """Attempt 1 sleeps ``payload["seconds"]`` (past its timeout), ignoring cancellation;
    later attempts return at once. Touches ``<finished>.<attempt>`` as it returns."""
    _mark_started(payload, job)
    if job.attempt == 1:
        time.sleep(payload["seconds"])
    _note(payload, "finished", str(job.attempt))
    return {"attempt": job.attempt}


# -- handlers that try to break their worker (tests/test_async_handlers.py) -----------------


@pgqueue.task(name="test.async_breaker")
async def async_breaker(payload, job):
    """Raise a BaseException that is not an Exception, or stop the event loop under
    the other async jobs, as ``payload["how"]`` says."""
    await asyncio.sleep(0)
    how = payload["how"]
    if how == "system_exit":
        raise SystemExit(5)
    if how == "keyboard_interrupt":
        raise KeyboardInterrupt
    if how == "stop_loop":
        asyncio.get_running_loop().stop()
        await asyncio.sleep(0.05)
        return {"stopped": True}
    if how == "exit_in_callback":  # from a task of its own, after the handler returned
        asyncio.get_running_loop().call_soon(sys.exit, 7)
        return {"scheduled": True}
    raise AssertionError(f"unknown way {how!r}")


@pgqueue.task(name="test.async_until_cancelled")
async def async_until_cancelled(payload, job):
    """Sleep on the event loop without ever looking at ``job.cancelled``; touch
    ``<observed>.CancelledError`` when the worker cancels the coroutine."""
    _mark_started(payload, job)
    try:
        await asyncio.sleep(payload.get("timeout", 30))
    except asyncio.CancelledError:
        _note(payload, "observed", "CancelledError")
        raise
    return {"ignored": True}


# -- what a handler leaves behind (tests/test_worker.py) ------------------------------------


@pgqueue.task(name="test.leave_behind")
def leave_behind(payload, job):
    """Start a non-daemon thread that sleeps a minute, and fork a child that sleeps a
    minute (its pid written to ``payload["pid_file"]``), then return at once."""
    threading.Thread(target=time.sleep, args=(60,), name="left-behind", daemon=False).start()
    pid = os.fork()
    if pid == 0:  # the child: sleep, never return into the worker's code
        try:
            time.sleep(60)
        finally:
            os._exit(0)
    Path(payload["pid_file"]).write_text(str(pid))
    return {"child": pid}


# -- retry policies, snoozes and signals (tests/test_retry_policies.py) ---------------------


class Flaky(Exception):
    """An error worth another attempt (test.policy's retry_on)."""


class Fatal(Exception):
    """An error no attempt will fix (test.policy's discard_on)."""


@pgqueue.task(
    name="test.policy",
    max_attempts=3,
    retry_on=(Flaky, Fatal),
    discard_on=Fatal,
    backoff=pgqueue.Backoff(base=100, cap=150, jitter=False),
)
def policy(payload, job):
    """Raise what ``payload["raise"]`` names: "flaky", "fatal" or "other" (a KeyError)."""
    raise {"flaky": Flaky, "fatal": Fatal, "other": KeyError}[payload["raise"]](payload["raise"])


def _attempt_times_1000(attempt, error):
    if isinstance(error, LookupError):
        raise RuntimeError("a backoff function that fails")
    return attempt * 1000


@pgqueue.task(name="test.backoff_function", max_attempts=3, backoff=_attempt_times_1000)
def backoff_function(payload, job):
    """Fail with a ValueError (backoff: attempt * 1000 s), or a KeyError ("lookup"), for
    which the backoff function itself fails."""
    raise (KeyError if payload.get("lookup") else ValueError)("again")


@pgqueue.task(name="test.snooze", max_attempts=2)
def snooze(payload, job):
    """Snooze (pgqueue.Retry) until ``payload["times"]`` snoozes are in the job's history,
    then return how many there were."""
    from pgqueue.models import JobAttempt

    snoozed = JobAttempt.objects.filter(job_id=job.id, outcome="snoozed").count()
    if snoozed < payload["times"]:
        raise pgqueue.Retry(in_=payload.get("in", 0.05), reason="not yet")
    return {"snoozed": snoozed, "attempt": job.attempt}


# -- waiting for results (tests/test_results.py) --------------------------------------------


@pgqueue.task(name="test.permanent")
def permanent(payload, job):
    """Fail with ``pgqueue.PermanentError(payload["reason"])``: dead at once, no retry."""
    raise pgqueue.PermanentError(payload["reason"])


# -- running jobs in the test's own transaction (tests/test_testing_helpers.py) -------------


@pgqueue.task(name="test.chain")
def chain(payload, job):
    """Enqueue a job of ``payload["next"]`` with ``payload.get("with")`` for the same tenant,
    ``payload.get("delay")`` seconds from now; or, when ``payload["again"]``, one more job
    of this task with this payload (for ever). Returns the new job's id."""
    if payload.get("again"):
        new, _ = pgqueue.enqueue("test.chain", payload, tenant=job.tenant)
    else:
        new, _ = pgqueue.enqueue(
            payload["next"], payload.get("with"), tenant=job.tenant, delay=payload.get("delay")
        )
    return {"enqueued": new.id}


@pgqueue.task(name="test.cancel_self")
def cancel_self(payload, job):
    """Ask for this running job's own cancellation, then (with ``payload["heartbeat"]``)
    call ``job.heartbeat()``, which raises JobCancelled, or return: discarded either way."""
    from pgqueue import services

    services.cancel(job.id)
    if payload and payload.get("heartbeat"):
        job.heartbeat()
    return {"ignored": True}


@pgqueue.task(name="test.db_error", max_attempts=1)
def db_error(payload, job):
    """Create the tenant ``payload["tenant"]``, then run a statement PostgreSQL refuses."""
    from django.db import connection

    from pgqueue.models import Tenant

    Tenant.objects.create(name=payload["tenant"])
    with connection.cursor() as cur:
        cur.execute("SELECT 1 / 0")


# -- workflows (tests/test_workflows.py) ---------------------------------------------------


@pgqueue.task(name="test.wf_step")
def wf_step(payload, job):
    """A workflow's step: fails for good with ``payload["fail"]``, sleeps
    ``payload["sleep"]`` seconds, and returns ``payload["value"]`` (default: the job's id)
    with the values its dependencies returned, by step name or id."""
    payload = payload or {}
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    if payload.get("fail"):
        raise pgqueue.PermanentError("asked to fail")
    seen = {
        str(key): (value or {}).get("value") if isinstance(value, dict) or value is None else value
        for key, value in job.upstream_results.items()
    }
    return {"value": payload.get("value", job.id), "upstream": seen}


# -- workflows under concurrency (tests/test_workflows_concurrency.py) ---------------------


@pgqueue.task(name="test.wf_leaf")
def wf_leaf(payload, job):
    """A step that never touches the database (test.wf_step reads its dependencies, a
    connection per thread): a fan-in's header on 128 threads stays within the server's
    connections. Returns ``payload["value"]``.

    With ``payload["gate"]`` (a path), it first creates ``payload["started"]/<value>``,
    then waits (at most 60 s) for the gate file, which holds a moment (time.time()), and
    returns at that moment: a test opens the gate once all such steps run, and they all
    end together, to the millisecond."""
    if payload.get("gate"):
        Path(payload["started"], str(payload["value"])).touch()
        gate, deadline = Path(payload["gate"]), time.monotonic() + 60
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        if gate.exists():
            time.sleep(max(0.0, float(gate.read_text()) - time.time()))
    return {"value": payload["value"]}


if os.environ.get("TESTS_SIGNAL_LOG"):
    from tests.taskapp import signal_receivers  # noqa: F401  (tests/test_retry_policies.py)


# -- progress and output (tests/test_progress.py) -------------------------------------------


def _wait_file(path, timeout):
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.01)


@pgqueue.task(name="test.progress")
def report_progress(payload, job):
    """Report progress ``calls`` times (done i of calls, note "step i", ``pace`` seconds
    apart), then the output {"calls": calls}; touch ``<reported>`` and, with ``release``,
    wait for that file, then report ``final`` progress and output ({"final": True}).
    ``output_bytes``: then report an output that large (its InvalidJob raised unless
    ``catch``: caught, touch ``<refused>``). ``fail``: raise at the end."""
    calls = payload.get("calls", 1)
    for i in range(1, calls + 1):
        job.progress(i, calls, note=f"step {i}")
        if payload.get("pace"):
            time.sleep(payload["pace"])
    job.output({"calls": calls})
    _note(payload, "reported", "1")
    if payload.get("release"):
        _wait_file(payload["release"], payload.get("timeout", 30))
    if payload.get("final"):
        job.progress(calls, calls, note="final")
        job.output({"final": True})
    if payload.get("output_bytes"):
        try:
            job.output("x" * payload["output_bytes"])
        except pgqueue.InvalidJob:
            if not payload.get("catch"):
                raise
            _note(payload, "refused", "1")
    if payload.get("fail"):
        raise RuntimeError("failed on purpose")
    return {"ok": True}
