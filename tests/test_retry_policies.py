"""Per-task retry policies, snoozes and the worker's signals, with real worker processes.

The tasks are in tests/taskapp/tasks.py (test.policy, test.backoff_function, test.snooze);
the signal receivers in tests/taskapp/signal_receivers.py write what they hear to a file.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

import pgqueue
from pgqueue.models import Job, JobAttempt
from pgqueue.retry import Backoff, RetryPolicy, policy
from tests.taskapp.tasks import Fatal, Flaky
from tests.workers import STARTUP, StartWorker, history, wait_for

#: Quick promotion of what is due, short backoffs for the tasks without their own.
FAST = {"MAINTENANCE_SECONDS": 0.05, "BACKOFF_BASE": 0.01, "BACKOFF_CAP": 0.01}


def status(job_id: int) -> str:
    return Job.objects.values_list("status", flat=True).get(id=job_id)


def ended(job_id: int, timeout: float = STARTUP + 20) -> Job:
    wait_for(
        lambda: status(job_id) in {"done", "dead", "scheduled"} and len(history(job_id)) > 0,
        timeout,
        f"job {job_id} to be tried",
    )
    return Job.objects.get(id=job_id)


def last_attempt(job_id: int) -> JobAttempt:
    return JobAttempt.objects.filter(job_id=job_id).latest("id")


# -- the policy, without a worker ------------------------------------------------------------


def test_the_policy_decides_which_errors_are_retried():
    p = RetryPolicy(retry_on=(Flaky, Fatal), discard_on=(Fatal,))
    assert not p.permanent(Flaky())
    assert p.permanent(Fatal())  # discard_on wins over retry_on
    assert p.permanent(KeyError())  # not one of retry_on
    assert p.permanent(pgqueue.PermanentError())
    assert not RetryPolicy(discard_on=(Fatal,)).permanent(KeyError())  # no retry_on: all


def test_a_backoff_is_bounded_and_a_bad_one_falls_back_to_the_global_backoff(settings):
    settings.PGQUEUE = {"MAX_RETRY_DELAY_SECONDS": 60}
    assert RetryPolicy(backoff=lambda a, e: 10 * a).delay(2, ValueError()) == 20
    assert RetryPolicy(backoff=lambda a, e: dt.timedelta(hours=1)).delay(1, ValueError()) == 60
    assert RetryPolicy(backoff=lambda a, e: -5).delay(1, ValueError()) == 0
    assert RetryPolicy(backoff=lambda a, e: "soon").delay(1, ValueError()) is None
    assert RetryPolicy(backoff=lambda a, e: 1 / 0).delay(1, ValueError()) is None
    assert RetryPolicy(backoff=lambda a, e: float("nan")).delay(1, ValueError()) is None
    assert Backoff(base=2, cap=5, jitter=False)(1) == 2
    assert Backoff(base=2, cap=5, jitter=False)(3) == 5
    assert Backoff(base=2, cap=5, jitter=False)(10_000) == 5  # no overflow
    assert 0 <= Backoff(base=2, cap=5)(3) <= 5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retry_on": "ValueError"}, "retry_on must be exception classes"),
        ({"discard_on": [ValueError, 3]}, "discard_on must be exception classes"),
        ({"backoff": 5}, "backoff must be a pgqueue.Backoff or a function"),
    ],
)
def test_a_bad_policy_fails_when_the_task_is_declared(options, message):
    with pytest.raises(ValueError, match=message):
        pgqueue.task(name="test.never_registered", **options)
    with pytest.raises(ValueError, match="Backoff base must be"):
        pgqueue.Backoff(base=-1)
    assert policy() is None


def test_retry_needs_a_number_of_seconds():
    assert pgqueue.Retry(in_=dt.timedelta(minutes=1)).seconds == 60
    with pytest.raises(TypeError):
        pgqueue.Retry(in_="30")


# -- with a worker -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_retry_on_discard_on_and_the_tasks_backoff(workers: StartWorker):
    """Flaky is retried after the task's own backoff (100 s without jitter, not the global
    0.01 s); Fatal (discard_on, though retry_on names it too) and KeyError (not in
    retry_on) end dead at their first attempt with their error kept."""
    flaky, _ = pgqueue.enqueue("test.policy", {"raise": "flaky"})
    fatal, _ = pgqueue.enqueue("test.policy", {"raise": "fatal"})
    other, _ = pgqueue.enqueue("test.policy", {"raise": "other"})
    workers("--burst", settings=FAST)

    retried = ended(flaky.id)
    assert retried.status == "scheduled" and retried.attempts == 1
    wait_before = (retried.run_at - last_attempt(flaky.id).finished_at).total_seconds()
    assert wait_before == pytest.approx(100, abs=0.01)
    for job in (fatal, other):
        dead = ended(job.id)
        assert dead.status == "dead", dead.last_error
        assert dead.attempts == 1
    assert "Fatal" in Job.objects.get(id=fatal.id).last_error
    assert "KeyError" in Job.objects.get(id=other.id).last_error


@pytest.mark.django_db(transaction=True)
def test_a_backoff_function_gives_the_wait_and_one_that_fails_falls_back(workers: StartWorker):
    """test.backoff_function waits attempt * 1000 s; when the function itself raises, the
    job is still retried, after the global backoff (at most BACKOFF_CAP = 0.01 s here)."""
    own, _ = pgqueue.enqueue("test.backoff_function", {})
    fallback, _ = pgqueue.enqueue("test.backoff_function", {"lookup": True})
    workers(settings=FAST)

    job = ended(own.id)
    assert job.status == "scheduled"
    assert (job.run_at - last_attempt(own.id).finished_at).total_seconds() == pytest.approx(
        1000, abs=0.01
    )
    wait_for(lambda: len(history(fallback.id)) >= 2, STARTUP, "the fallback retry to run")
    assert [(a, o) for a, o, _ in history(fallback.id)][:2] == [(1, "failed"), (2, "failed")]


@pytest.mark.django_db(transaction=True)
def test_a_snooze_runs_the_job_again_without_spending_an_attempt(workers: StartWorker):
    """Three snoozes, then success: still attempt 1 of 2, three 'snoozed' rows in the
    history, each with the reason, and no failure counted."""
    job, _ = pgqueue.enqueue("test.snooze", {"times": 3})
    workers(settings=FAST)

    wait_for(lambda: status(job.id) == "done", STARTUP + 20, "the job to be done")
    done = Job.objects.get(id=job.id)
    assert done.attempts == 1 and done.snoozes == 3
    assert done.result == {"snoozed": 3, "attempt": 1}
    assert [(a, o) for a, o, _ in history(job.id)] == [
        (1, "snoozed"),
        (1, "snoozed"),
        (1, "snoozed"),
        (1, "done"),
    ]
    errors = JobAttempt.objects.filter(job_id=job.id, outcome="snoozed").values_list(
        "error", flat=True
    )
    assert all("snoozed for 0.05 s: not yet" in e for e in errors)


@pytest.mark.django_db(transaction=True)
def test_snoozes_are_bounded(workers: StartWorker):
    """With MAX_SNOOZES = 2, a job that snoozes for ever takes two snoozes free, then each
    snooze is a failed attempt: dead after max_attempts (2), never snoozing again.
    Protection: the snoozes < MAX_SNOOZES test of JOB_FAIL_MANY; without it the job would
    snooze for ever (the wait below would time out)."""
    job, _ = pgqueue.enqueue("test.snooze", {"times": 1_000_000, "in": 0.01})
    workers(settings={**FAST, "MAX_SNOOZES": 2})

    wait_for(lambda: status(job.id) == "dead", STARTUP + 20, "the job to end dead")
    dead = Job.objects.get(id=job.id)
    assert dead.attempts == 2 and dead.snoozes == 2
    assert [(a, o) for a, o, _ in history(job.id)] == [
        (1, "snoozed"),
        (1, "snoozed"),
        (1, "failed"),
        (2, "failed"),
    ]
    assert "MAX_SNOOZES" in dead.last_error


@pytest.mark.django_db(transaction=True)
def test_the_worker_sends_its_signals_after_the_outcome_is_committed(
    workers: StartWorker, tmp_path: Path
):
    """job_started before the handler (the job is running), job_succeeded with the result
    once the job reads done (a failing receiver beside it changes nothing), job_failed for
    an attempt that will be retried, job_dead for the last one; a snooze sends nothing."""
    heard = tmp_path / "signals.jsonl"
    ok, _ = pgqueue.enqueue("test.echo", {"x": 1})
    retried, _ = pgqueue.enqueue("test.fail_until", {"succeed_on": 99}, max_attempts=2)
    snoozed, _ = pgqueue.enqueue("test.snooze", {"times": 1})
    w = workers(settings=FAST, extra_env={"TESTS_SIGNAL_LOG": str(heard)})

    def lines() -> list[dict]:
        if not heard.exists():
            return []
        return [json.loads(line) for line in heard.read_text().splitlines()]

    wait_for(
        lambda: all(status(j.id) in {"done", "dead"} for j in (ok, retried, snoozed)),
        STARTUP + 20,
        "every job to end",
    )
    wait_for(lambda: any(x["signal"] == "dead" for x in lines()), 10, "job_dead")
    wait_for(lambda: len([x for x in lines() if x["job"] == snoozed.id]) >= 3, 10, "snooze")
    by_job: dict[int, list[tuple[str, int]]] = {}
    for x in lines():
        by_job.setdefault(x["job"], []).append((x["signal"], x["attempt"]))
    assert by_job[ok.id] == [("started", 1), ("succeeded", 1)]
    assert by_job[retried.id] == [("started", 1), ("failed", 1), ("started", 2), ("dead", 2)]
    # Snoozed once (no signal of its outcome), then done.
    assert by_job[snoozed.id] == [("started", 1), ("started", 1), ("succeeded", 1)]
    succeeded = next(x for x in lines() if x["signal"] == "succeeded" and x["job"] == ok.id)
    assert succeeded["result"] == {"x": 1} and succeeded["status"] == "done"
    assert all(x["status"] == "running" for x in lines() if x["signal"] == "started")
    dead = next(x for x in lines() if x["signal"] == "dead")
    assert dead["status"] == "dead" and dead["error"]
    assert "event=signal_receiver_failed signal=job_succeeded" in w.log()
