"""pgqueue.backends.PgQueueBackend: Django's Tasks framework on pgqueue.

The backend-relevant cases of Django's own tests of its task backends (enqueue, get_result,
priority, run_after, queues, takes_context, transactions, checks), against pgqueue; the
runs themselves in real ``runworker`` subprocesses (the fixture of tests/workers.py):
results, async tasks, signals, retries, permanent failures and a worker killed mid-task.

The framework's names come from pgqueue.backends, which takes them from Django 6
(``django.tasks``) or from the django-tasks backport on Django 5.2.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core import checks
from django.db import connections, transaction
from django.test import override_settings
from django.utils import timezone

import pgqueue
from pgqueue import backends, store
from pgqueue.backends import (
    InvalidTask,
    InvalidTaskBackend,
    PgQueueBackend,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)
from pgqueue.models import Job, JobAttempt
from tests import api_fixtures
from tests.conftest import claim, complete, fail, timeline
from tests.taskapp import django_tasks as t
from tests.workers import FAST_RECOVERY, STARTUP, StartWorker, history
from tests.workers import wait_for as _wait_for

if backends.django.VERSION >= (6, 0):
    from django.tasks.exceptions import TaskResultMismatch
else:
    from django_tasks.exceptions import TaskResultMismatch

BACKEND = "pgqueue.backends.PgQueueBackend"
TASKS = {
    "default": {
        "BACKEND": BACKEND,
        "QUEUES": ["default", "other"],
        "OPTIONS": {"TENANT": "acme"},
    }
}
PREFIX = "django.tasks:tests.taskapp.django_tasks"


@pytest.fixture(autouse=True)
def tasks_setting() -> Any:
    with override_settings(TASKS=TASKS):
        yield


def backend() -> PgQueueBackend:
    instance = task_backends["default"]
    assert isinstance(instance, PgQueueBackend)
    return instance


def job_of(result: Any) -> Job:
    return Job.objects.get(pk=int(result.id))


# -- enqueue ---------------------------------------------------------------------------------


def test_the_default_backend_is_pgqueue_and_supports_everything() -> None:
    b = backend()
    assert (b.supports_defer, b.supports_priority, b.supports_get_result) == (True, True, True)
    assert b.supports_async_task is True
    assert b.queues == {"default", "other"}


@pytest.mark.django_db
@pytest.mark.parametrize("task", [t.noop, t.async_add], ids=["sync", "async"])
def test_enqueue_writes_one_job_in_one_query(task: Any, django_assert_num_queries: Any) -> None:
    task.enqueue(0)  # the tenant's first job in the queue also creates its fair clock (two)
    with django_assert_num_queries(1):
        result = task.enqueue(1, two=3)

    assert result.status == TaskResultStatus.READY
    assert (result.started_at, result.finished_at, result.last_attempted_at) == (None,) * 3
    assert result.enqueued_at is not None
    assert (result.errors, result.worker_ids, result.attempts) == ([], [], 0)
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert result.task == task
    assert (result.args, result.kwargs, result.backend) == ([1], {"two": 3}, "default")

    job = job_of(result)
    assert job.task == f"{PREFIX}.{task.func.__name__}"
    assert (job.status, job.tenant_id, job.queue, job.priority) == ("queued", "acme", "default", 0)
    assert job.max_attempts == 5  # PGQUEUE["DEFAULT_MAX_ATTEMPTS"]
    assert job.payload == {
        "task": task.module_path,
        "backend": "default",
        "args": [1],
        "kwargs": {"two": 3},
        "enqueued_at": result.enqueued_at.isoformat(),
    }


@pytest.mark.django_db
def test_aenqueue_and_aget_result() -> None:
    result = async_to_sync(t.add.aenqueue)(2, b=3)
    assert job_of(result).payload["kwargs"] == {"b": 3}
    assert async_to_sync(backend().aget_result)(result.id) == result
    assert async_to_sync(t.add.aget_result)(result.id) == result


@pytest.mark.django_db
def test_arguments_are_normalised_to_json_and_others_refused() -> None:
    result = t.echo.enqueue((1, 2), b"bytes", key=("a",))
    assert result.args == [[1, 2], "bytes"]
    assert result.kwargs == {"key": ["a"]}
    assert job_of(result).payload["args"] == [[1, 2], "bytes"]

    with pytest.raises(TypeError):
        t.echo.enqueue(object())
    with pytest.raises(pgqueue.InvalidJob):  # JSON has no NaN, nor has jsonb
        t.echo.enqueue(float("nan"))
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_task_enqueued_is_sent_with_the_result() -> None:
    received: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        received.append((sender, task_result))

    task_enqueued.connect(receiver)
    try:
        result = t.noop.enqueue()
    finally:
        task_enqueued.disconnect(receiver)
    assert received == [(PgQueueBackend, result)]


@pytest.mark.django_db(transaction=True)
def test_enqueue_is_part_of_the_callers_transaction() -> None:
    """Written in the caller's transaction: invisible to others until it commits, and a
    rollback leaves nothing."""

    def jobs_seen_by_another_connection() -> int:
        other = connections.create_connection("default")
        try:
            with other.cursor() as cur:
                cur.execute("SELECT count(*) FROM pgqueue_job")
                return cur.fetchone()[0]
        finally:
            other.close()

    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = t.noop.enqueue()
        assert Job.objects.filter(pk=int(rolled_back.id)).exists()
        raise RuntimeError("roll back")
    assert Job.objects.count() == 0
    with pytest.raises(TaskResultDoesNotExist):
        backend().get_result(rolled_back.id)

    with transaction.atomic():
        committed = t.noop.enqueue()
        assert jobs_seen_by_another_connection() == 0
    assert jobs_seen_by_another_connection() == 1
    assert backend().get_result(committed.id).status == TaskResultStatus.READY


# -- priority, run_after, queues, context --------------------------------------------------


@pytest.mark.django_db
def test_priority_is_passed_through_and_orders_the_claim() -> None:
    low = t.noop.using(priority=-100).enqueue()
    middle = t.noop.enqueue()
    high = t.noop.using(priority=100).enqueue()
    decorated = t.important.enqueue()
    assert [job_of(r).priority for r in (low, middle, high, decorated)] == [-100, 0, 100, 10]
    assert backend().get_result(high.id).task.priority == 100

    claimed = [job.id for job in claim(limit=4)]
    assert claimed == [int(r.id) for r in (high, decorated, middle, low)]

    for invalid in (-101, 101):
        with pytest.raises(InvalidTask, match="priority must be a whole number"):
            t.noop.using(priority=invalid)


@pytest.mark.django_db
def test_run_after_schedules_the_job() -> None:
    later = timezone.now() + dt.timedelta(hours=1)
    result = t.noop.using(run_after=later).enqueue()
    job = job_of(result)
    assert (job.status, job.run_at) == ("scheduled", later)
    got = backend().get_result(result.id)
    assert (got.status, got.task.run_after) == (TaskResultStatus.READY, later)
    assert got == result

    past = t.noop.using(run_after=timezone.now() - dt.timedelta(seconds=5)).enqueue()
    assert job_of(past).status == "queued"  # due already: runnable now

    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        t.noop.using(run_after=dt.datetime.now()).enqueue()


@pytest.mark.django_db
def test_queues_are_validated() -> None:
    other = t.noop.using(queue_name="other").enqueue()
    assert job_of(other).queue == "other"
    assert backend().get_result(other.id).task.queue_name == "other"

    with pytest.raises(InvalidTask, match="Queue 'missing' is not valid for backend"):
        t.noop.using(queue_name="missing").enqueue()

    # QUEUES [] allows any queue, as long as pgqueue can name it.
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": []}}):
        assert job_of(t.noop.using(queue_name="anything").enqueue()).queue == "anything"
        with pytest.raises(InvalidTask, match="not a valid pgqueue queue name"):
            t.noop.using(queue_name="no spaces").enqueue()
    assert Job.objects.count() == 2


def test_takes_context_needs_a_context_argument() -> None:
    with pytest.raises(InvalidTask, match="first argument of 'context'"):
        dataclasses.replace(t.noop, takes_context=True)
    task_class = backend().task_class
    with pytest.raises(InvalidTask, match="first argument of 'context'"):
        task_class(
            func=t.without_context_argument,
            priority=0,
            backend="default",
            queue_name="default",
            run_after=None,
            takes_context=True,
        )

    def local() -> None: ...

    with pytest.raises(InvalidTask, match="module level"):
        task_class(func=local, priority=0, backend="default", queue_name="default", run_after=None)


# -- options ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_tenant_and_max_attempts_options() -> None:
    with override_settings(
        TASKS={
            "default": {
                "BACKEND": BACKEND,
                "OPTIONS": {
                    "TENANT_CALLABLE": "tests.taskapp.django_tasks.tenant_from_kwargs",
                    "MAX_ATTEMPTS": 2,
                },
            }
        }
    ):
        job = job_of(t.echo.enqueue(customer="globex"))
        assert (job.tenant_id, job.max_attempts) == ("globex", 2)
        assert job_of(t.echo.enqueue()).tenant_id == "nobody"

    with override_settings(TASKS={"default": {"BACKEND": BACKEND}}):
        assert job_of(t.noop.enqueue()).tenant_id == "default"  # PGQUEUE["DEFAULT_TENANT"]

    with (
        override_settings(
            TASKS={"default": {"BACKEND": BACKEND, "OPTIONS": {"TENANT": "bad tenant"}}}
        ),
        pytest.raises(InvalidTaskBackend, match="TENANT"),
    ):
        t.noop.enqueue()
    assert Job.objects.count() == 3


def errors_of(tasks: dict[str, Any]) -> list[tuple[str, str]]:
    with override_settings(TASKS=tasks):
        return [(e.id, e.msg) for e in backends.check_tasks_backends()]


@pytest.mark.django_db
def test_system_check_reports_a_misconfigured_backend() -> None:
    assert backends.check_tasks_backends in checks.registry.registry.get_checks()
    assert checks.run_checks() == []  # the tests' own TASKS
    assert errors_of(TASKS) == []
    assert errors_of({"default": {"BACKEND": BACKEND, "QUEUES": []}}) == []

    found = errors_of(
        {
            "default": {
                "BACKEND": BACKEND,
                "QUEUES": ["default", "bad queue", 7],
                "OPTIONS": {
                    "TENANT": "",
                    "TENANT_CALLABLE": "tests.taskapp.django_tasks.missing",
                    "MAX_ATTEMPTS": 0,
                    "BACKOFF_BASE": 2,
                },
            },
            "other": {"BACKEND": BACKEND, "QUEUES": "default", "OPTIONS": []},
            "not_ours": {"BACKEND": "x.y.Z", "QUEUES": ["bad queue"]},
        }
    )
    ids = [check_id for check_id, _ in found]
    assert ids == [
        "pgqueue.E101",
        "pgqueue.E101",
        "pgqueue.E102",
        "pgqueue.E103",
        "pgqueue.E103",
        "pgqueue.E103",
        "pgqueue.E104",
        "pgqueue.E101",
        "pgqueue.E102",
    ], found
    text = "\n".join(message for _, message in found)
    assert "TASKS['default']: QUEUES names 'bad queue'" in text
    assert "unknown OPTIONS BACKOFF_BASE" in text and "PGQUEUE['BACKOFF_BASE']" in text
    assert "not both" in text and "must not be empty" in text
    assert "TASKS['other']: QUEUES must be a list" in text
    assert "not_ours" not in text


# -- get_result ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_get_result_equals_the_enqueued_result(django_assert_num_queries: Any) -> None:
    result = t.add.using(priority=5, queue_name="other").enqueue(1, b=2)
    with django_assert_num_queries(1):
        got = backend().get_result(result.id)
    assert got == result
    assert t.add.get_result(result.id) == result

    before = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == before
    async_to_sync(result.arefresh)()
    assert dataclasses.asdict(result) == before


@pytest.mark.django_db
def test_get_result_of_another_task_is_a_mismatch() -> None:
    result = t.noop.enqueue()
    with pytest.raises(TaskResultMismatch):
        t.add.get_result(result.id)


@pytest.mark.django_db
def test_unknown_ids_do_not_exist() -> None:
    plain, _ = pgqueue.enqueue("test.noop")  # a pgqueue job, not a Django task
    result = t.noop.enqueue()
    for result_id in ["999999999", "abc", "", "-1", "1.5", str(2**64), "\u0661", str(plain.id)]:
        with pytest.raises(TaskResultDoesNotExist):
            backend().get_result(result_id)
        with pytest.raises(TaskResultDoesNotExist):
            async_to_sync(backend().aget_result)(result_id)

    # A job of another backend (alias) is not this one's.
    two = {**TASKS, "second": {"BACKEND": BACKEND, "QUEUES": ["default"]}}
    with override_settings(TASKS=two):
        assert task_backends["default"].get_result(result.id).id == result.id
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["second"].get_result(result.id)


@pytest.mark.django_db
def test_get_result_follows_the_job_and_its_attempts() -> None:
    """Status, timestamps, worker ids and errors from the job and its attempt history."""
    result = t.add.enqueue(2, 3)

    (first,) = claim("w1")
    running = backend().get_result(result.id)
    assert running.status == TaskResultStatus.RUNNING
    assert running.worker_ids == ["w1"] and running.attempts == 1
    assert running.started_at is not None and running.started_at == running.last_attempted_at
    assert running.finished_at is None and running.errors == []

    assert fail("w1", first) == "scheduled"
    waiting = backend().get_result(result.id)
    assert waiting.status == TaskResultStatus.READY  # ready to be executed again
    assert waiting.worker_ids == ["w1"]
    assert [e.exception_class_path for e in waiting.errors] == ["builtins.RuntimeError"]
    assert waiting.errors[0].exception_class is RuntimeError
    assert waiting.errors[0].traceback == "tb"

    assert pgqueue.services.run_jobs_now([first.id]).changed == [first.id]  # skip the backoff
    (second,) = claim("w2")
    assert complete("w2", second, json.dumps(5))
    done = backend().get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.is_finished
    assert done.return_value == 5
    assert done.worker_ids == ["w1", "w2"] and done.attempts == 2
    assert len(done.errors) == 1
    attempts = list(JobAttempt.objects.filter(job_id=first.id).order_by("id"))
    assert done.started_at == attempts[0].started_at  # the first attempt's start
    assert done.last_attempted_at == attempts[1].started_at
    assert done.finished_at == job_of(result).finished_at
    assert done.enqueued_at == result.enqueued_at

    cancelled = t.noop.enqueue()
    pgqueue.services.cancel(int(cancelled.id))
    gone = backend().get_result(cancelled.id)
    assert gone.status == TaskResultStatus.FAILED and gone.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        gone.return_value  # noqa: B018


@pytest.mark.django_db
def test_a_lease_lost_before_the_start_is_no_attempt_of_the_result() -> None:
    """A claim whose lease ran out before its start was recorded was given back without
    spending an attempt: ``worker_ids`` and ``errors`` leave it out (one per attempt, as
    ``TaskContext.attempt`` counts them), though its row is in the job's history."""
    at = timeline()
    result = t.add.enqueue(2, 3)
    (first,) = claim("w1", now=at(0))
    assert fail("w1", first, now=at(1)) == "scheduled"
    assert pgqueue.services.run_jobs_now([first.id]).changed == [first.id]
    (second,) = claim("w2", lease_seconds=30, now=at(2))
    assert second.attempt == 2
    with connections["default"].cursor() as cur:
        assert store.reap_expired(cur, now=at(3600)) == {first.id: "queued"}
    (third,) = claim("w3", now=at(3600))
    assert third.attempt == 2
    assert complete("w3", third, json.dumps(5), now=at(3601))
    done = backend().get_result(result.id)
    assert done.worker_ids == ["w1", "w3"] and done.attempts == 2
    assert [e.exception_class_path for e in done.errors] == ["builtins.RuntimeError"]
    assert history(first.id) == [(1, "failed", "w1"), (2, "lease_expired", "w2"), (2, "done", "w3")]


@pytest.mark.django_db
def test_jobs_show_which_function_they_run_in_the_api_and_the_registry() -> None:
    result = t.add.enqueue(2, 3)
    name = f"{PREFIX}.add"
    response = api_fixtures.client(api_fixtures.new_key()).get(f"/jobs/{result.id}")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["task"], body["tenant"], body["status"]) == (name, "acme", "queued")
    assert body["payload"]["args"] == [2, 3]

    registered = pgqueue.get_task(name)
    assert registered.name == name and registered.func is backends.RUNNER.func
    assert pgqueue.get_task("django.tasks") is backends.RUNNER
    with pytest.raises(pgqueue.UnknownTask):
        pgqueue.get_task("not.a.family:x")


# -- running in workers ----------------------------------------------------------------------


def wait_finished(result: Any, timeout: float = 20) -> Any:
    def finished() -> Any:
        got = backend().get_result(result.id)
        return got if got.is_finished else None

    return _wait_for(finished, timeout, f"task {result.task.name} ({result.id}) to finish")


def signals_of(log: Path, result_id: str) -> list[dict[str, Any]]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [entry for entry in map(json.loads, lines) if entry["id"] == result_id]


@pytest.fixture
def signal_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file the workers' signal receivers write (tests/taskapp/django_tasks.py)."""
    path = tmp_path / "signals.jsonl"
    monkeypatch.setenv("TEST_TASKS_SIGNAL_LOG", str(path))
    return path


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_tasks_and_their_results_are_visible(
    workers: StartWorker,
    signal_log: Path,
) -> None:
    results = {
        "add": t.add.enqueue(2, 3),
        "async": t.async_add.enqueue(1, b=2),
        "echo": t.echo.enqueue("x", n=[1]),
        "context": t.with_context.using(queue_name="other").enqueue(tag="hi"),
        "bad_return": t.bad_return.enqueue(),
    }
    w = workers("--queues", "default,other", settings={"TASKS": TASKS})
    worker_id = w.registered()
    got = {name: wait_finished(result) for name, result in results.items()}

    for name in ("add", "async", "echo", "context"):
        r = got[name]
        assert r.status == TaskResultStatus.SUCCESSFUL, (name, r.errors)
        assert r.worker_ids == [worker_id] and r.errors == []
        assert r.enqueued_at <= r.started_at <= r.finished_at
        assert r.last_attempted_at == r.started_at
    assert got["add"].return_value == 5
    assert got["async"].return_value == {"sum": 3, "orm": True}
    assert got["echo"].return_value == {"args": ["x"], "kwargs": {"n": [1]}}
    assert got["context"].return_value == {
        "tag": "hi",
        "attempt": 1,
        "id": results["context"].id,
        "status": "RUNNING",
        "worker_ids": [worker_id],
        "task": t.with_context.module_path,
        "queue": "other",
    }
    assert job_of(results["add"]).result == 5  # the job's result is the return value

    # A return value that is not JSON fails at once: retrying would return it again.
    bad = got["bad_return"]
    assert bad.status == TaskResultStatus.FAILED and bad.attempts == 1
    assert [e.exception_class_path for e in bad.errors] == ["pgqueue.exceptions.PermanentError"]
    assert "the return value is not JSON" in bad.errors[0].traceback
    assert job_of(results["bad_return"]).max_attempts == 5

    # task_started and task_finished in the worker; task_finished of a failure from inside
    # the exception handler, as Django's receivers expect.
    assert signals_of(signal_log, results["add"].id) == [
        {"signal": s, "id": results["add"].id, "status": status, "attempt": 1, "errors": []}
        | {"in_except": False}
        for s, status in [("task_started", "RUNNING"), ("task_finished", "SUCCESSFUL")]
    ]
    finished = signals_of(signal_log, results["bad_return"].id)[-1]
    assert (finished["signal"], finished["status"], finished["in_except"]) == (
        "task_finished",
        "FAILED",
        True,
    )


@pytest.mark.django_db(transaction=True)
def test_failing_tasks_are_retried_with_the_right_context_attempt(
    workers: StartWorker,
    signal_log: Path,
) -> None:
    """A task failing twice then succeeding sees attempts 1, 2, 3 in its TaskContext; one
    failing every time ends FAILED with an error per attempt (OPTIONS MAX_ATTEMPTS 3)."""
    tasks = {"default": {**TASKS["default"], "OPTIONS": {"TENANT": "acme", "MAX_ATTEMPTS": 3}}}
    with override_settings(TASKS=tasks):
        flaky = t.flaky.enqueue(succeed_on=3)
        failing = t.always_fails.enqueue()
    workers(settings={"TASKS": tasks, "BACKOFF_BASE": 0.05, "MAINTENANCE_SECONDS": 0.1})

    ok = wait_finished(flaky)
    assert ok.status == TaskResultStatus.SUCCESSFUL
    assert ok.return_value == {"attempt": 3, "errors": 2}
    assert ok.attempts == 3 and len(set(ok.worker_ids)) == 1
    assert [e.exception_class_path for e in ok.errors] == ["builtins.ValueError"] * 2
    for attempt, error in enumerate(ok.errors, start=1):
        assert f"ValueError: failing on purpose on attempt {attempt}" in error.traceback
        assert error.exception_class is ValueError

    failed = wait_finished(failing)
    assert failed.status == TaskResultStatus.FAILED and failed.attempts == 3
    assert [e.exception_class_path for e in failed.errors] == ["builtins.ValueError"] * 3
    assert all("ValueError: always fails" in e.traceback for e in failed.errors)
    with pytest.raises(ValueError, match="Task failed"):
        failed.return_value  # noqa: B018
    assert job_of(failing).status == "dead"

    finishes = [s for s in signals_of(signal_log, failing.id) if s["signal"] == "task_finished"]
    assert [(s["attempt"], s["status"], s["in_except"]) for s in finishes] == [
        (1, "FAILED", True),
        (2, "FAILED", True),
        (3, "FAILED", True),
    ]
    assert finishes[-1]["errors"] == ["builtins.ValueError"] * 3


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_task_of_a_killed_worker_is_completed_by_another(
    workers: StartWorker,
    tmp_path: Path,
) -> None:
    """SIGKILL mid-task: the lease expires, another worker runs attempt 2 to the end."""
    started, release = tmp_path / "started", tmp_path / "release"
    result = t.block.enqueue(str(started), str(release))
    settings = {"TASKS": TASKS, **FAST_RECOVERY}
    a = workers("--concurrency", "1", settings=settings, name="A")
    a_id = a.registered()
    _wait_for(lambda: Path(f"{started}.1").exists(), STARTUP, "the task to start under A")
    _wait_for(lambda: job_of(result).started_at is not None, 10, "A to record the start")
    assert backend().get_result(result.id).status == TaskResultStatus.RUNNING

    a.send(signal.SIGKILL)
    assert a.wait_exit(10) == -signal.SIGKILL
    release.touch()
    b = workers("--concurrency", "1", settings=settings, name="B")
    b_id = b.registered()

    done = wait_finished(result)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == {"attempt": 2, "worker": b_id}
    assert done.worker_ids == [a_id, b_id]
    assert [e.exception_class_path for e in done.errors] == ["pgqueue.backends.LeaseExpired"]
    assert done.errors[0].exception_class is backends.LeaseExpired
    assert f"worker {a_id} stopped renewing it" in done.errors[0].traceback
    assert history(int(result.id)) == [(1, "lease_expired", a_id), (2, "done", b_id)]


# -- what the runner resolves ----------------------------------------------------------------


class _Job:
    """What the runner reads of a job before it resolves the task."""

    def __init__(self, path: str) -> None:
        self.id, self.attempt, self.worker_id = 1, 1, "w"
        self.task, self.queue, self.priority = f"django.tasks:{path}", "default", 0


def _payload(path: str) -> dict[str, Any]:
    return {"task": path, "backend": "default", "args": [], "kwargs": {}}


def test_the_runner_never_imports_a_module_for_a_job() -> None:
    import sys

    path = "tests.taskapp.never_imported.anything"
    assert "tests.taskapp.never_imported" not in sys.modules
    with pytest.raises(pgqueue.PermanentError, match="not imported"):
        backends.RUNNER.func(_payload(path), _Job(path))
    assert "tests.taskapp.never_imported" not in sys.modules


@pytest.mark.parametrize("path", ["os.system", "tests.taskapp.django_tasks.Job"])
def test_the_runner_calls_only_a_django_task(path: str) -> None:
    with pytest.raises(pgqueue.PermanentError, match="not a Task"):
        backends.RUNNER.func(_payload(path), _Job(path))


@pytest.mark.django_db
def test_get_result_imports_only_the_path_the_job_was_enqueued_as() -> None:
    import sys

    job, _ = pgqueue.services.enqueue(
        "django.tasks:tests.taskapp.django_tasks.noop",
        {"task": "tests.taskapp.never_imported.anything", "backend": "default"},
    )
    with pytest.raises(TaskResultDoesNotExist):
        backend().get_result(str(job.id))
    assert "tests.taskapp.never_imported" not in sys.modules
