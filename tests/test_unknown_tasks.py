"""A worker never spends an attempt on a job it cannot run.

A worker without a handler for a job's task (a misspelt ``TASK_MODULES``, an older release)
gives the job back uncounted, to wait ``UNKNOWN_TASK_DELAY_SECONDS`` in 'scheduled', and
says so at ERROR once per task; the registry row lists the tasks each worker serves, so the
admin can flag the jobs no live worker can run; and ``manage.py check`` warns about a tasks
module that does not import.
"""

from __future__ import annotations

import datetime as dt
import signal
import sys
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

import pgqueue
from pgqueue import checks, liveness, services, store
from pgqueue.models import Job, JobAttempt, Worker
from tests.api_fixtures import make_job
from tests.workers import STARTUP, StartWorker, wait_for

DELAY = 45.0  # UNKNOWN_TASK_DELAY_SECONDS of the workers without the task


def given_back(ids: list[int]) -> bool:
    return Job.objects.filter(id__in=ids, status="scheduled", lease_owner=None).count() == len(ids)


@pytest.mark.django_db(transaction=True)
def test_a_job_of_an_unknown_task_is_given_back_unspent_and_run_by_a_worker_with_it(
    workers: StartWorker,
) -> None:
    """A worker whose TASK_MODULES is misspelt gives back every job of a task it lacks,
    without counting the attempt: 'scheduled' again, attempts 0, runnable in the delay.
    It logs the ERROR once for the task however many of its jobs it saw, and lists its
    tasks (none) at start-up. The admin's read flags the task while only that worker is
    alive; a worker that has the task then runs the jobs, on their first attempt.
    Before the fix the first worker failed each job (attempts 1, then 2, ... then dead).
    """
    blind = workers(
        settings={
            "TASK_MODULES": ["taks"],
            "UNKNOWN_TASK_DELAY_SECONDS": DELAY,
            "POLL_SECONDS": 0.1,
        },
        name="blind",
    )
    blind_id = blind.registered()
    assert Worker.objects.get(id=blind_id).tasks is not None
    assert "test.noop" not in Worker.objects.get(id=blind_id).tasks
    assert liveness.unserved_tasks(["test.noop"]) == {"test.noop"}

    before = timezone.now()
    ids = pgqueue.enqueue_many("test.noop", [{"n": n} for n in range(4)], tenant="acme")
    wait_for(lambda: given_back(ids), STARTUP, "the blind worker to give the jobs back")
    after = timezone.now()
    for job in Job.objects.filter(id__in=ids):
        assert job.attempts == 0, job
        assert job.status == "scheduled"
        assert job.started_at is None
        low = before + dt.timedelta(seconds=DELAY - 1)
        high = after + dt.timedelta(seconds=DELAY + 1)
        assert low <= job.run_at <= high, (job.run_at, before, after)
    assert not JobAttempt.objects.filter(job_id__in=ids).exists()

    log = blind.log()
    assert log.count("event=unknown_task task=test.noop") == 1, log
    assert "level=ERROR" in next(line for line in log.splitlines() if "event=unknown_task" in line)
    started = [line for line in log.splitlines() if "event=worker_tasks" in line]
    assert len(started) == 1 and "level=INFO" in started[0], log
    assert "pgqueue.W002" in log  # manage.py check's warning about the misspelt entry

    blind.send(signal.SIGTERM)
    assert blind.wait_exit(30) == 0
    services.run_jobs_now(ids)
    able = workers(settings={"POLL_SECONDS": 0.1}, name="able")
    able_id = able.registered()
    assert "test.noop" in Worker.objects.get(id=able_id).tasks
    assert liveness.unserved_tasks(["test.noop"]) == set()
    wait_for(
        lambda: Job.objects.filter(id__in=ids, status="done").count() == len(ids),
        STARTUP,
        "the worker that has the task to run the jobs",
    )
    assert set(Job.objects.filter(id__in=ids).values_list("attempts", flat=True)) == {1}
    assert set(JobAttempt.objects.filter(job_id__in=ids).values_list("worker", "outcome")) == {
        (able_id, "done")
    }


def claimed_by(worker: str, n: int = 1) -> list[store.ClaimedJob]:
    from django.db import connection

    with connection.cursor() as cur:
        return store.claim(cur, worker=worker, queues=["default"], limit=n)


@pytest.mark.django_db
def test_give_back_is_fenced_and_without_delay_is_a_release() -> None:
    """JOB_GIVE_BACK_MANY changes only the jobs the worker holds at the attempt it
    claimed; a delay of 0 queues the job again at once with its vtime (as a release)."""
    from django.db import connection

    job, _ = pgqueue.enqueue("test.noop", {}, tenant="acme")
    vtime = Job.objects.get(pk=job.id).vtime
    assert [c.id for c in claimed_by("w1")] == [job.id]
    with connection.cursor() as cur:
        assert store.give_back_many(cur, worker="w2", held=[(job.id, 1)], delay=0) == set()
        assert store.give_back_many(cur, worker="w1", held=[(job.id, 2)], delay=0) == set()
        assert store.give_back_many(cur, worker="w1", held=[(job.id, 1)], delay=0) == {job.id}
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.attempts, row.vtime, row.lease_owner) == ("queued", 0, vtime, None)


# -- the read and the admin --------------------------------------------------------------


def live_worker(worker_id: str, tasks: Any, **fields: Any) -> Worker:
    return Worker.objects.create(
        id=worker_id, host="h", pid=1, queues=["default"], tasks=tasks, concurrency=1, **fields
    )


@pytest.mark.django_db
def test_unserved_tasks_reads_the_live_workers_tasks() -> None:
    """A task is served when a live worker lists it or its family; a stopped or silent
    worker serves nothing; a worker whose tasks are not recorded (NULL) serves all."""
    asked = ["a", "b", "django.tasks:x.y", "c"]
    assert liveness.unserved_tasks(asked) == set(asked)  # no worker at all
    live_worker("w1", ["a", "django.tasks:*"])
    live_worker("w2", ["b"], stopped_at=timezone.now())
    live_worker("w3", ["c"])
    Worker.objects.filter(id="w3").update(last_seen_at=timezone.now() - dt.timedelta(hours=1))
    assert liveness.unserved_tasks(asked) == {"b", "c"}
    live_worker("w4", None)
    assert liveness.unserved_tasks(asked) == set()
    assert liveness.unserved_tasks([]) == set()


@pytest.mark.django_db
def test_register_records_no_tasks_beyond_the_bound() -> None:
    from django.db import connection

    many = [f"t{i}" for i in range(store.WORKER_TASKS_MAX + 1)]
    with connection.cursor() as cur:
        store.register_worker(
            cur, worker="w", host="h", pid=1, queues=["q"], concurrency=1, tasks=many
        )
    assert Worker.objects.get(id="w").tasks is None
    with connection.cursor() as cur:
        store.register_worker(
            cur, worker="w", host="h", pid=1, queues=["q"], concurrency=1, tasks=many[:3]
        )
    assert Worker.objects.get(id="w").tasks == many[:3]


FLAG = "no worker serves this task"


@pytest.mark.django_db
def test_the_admin_flags_a_waiting_job_whose_task_no_live_worker_serves(admin_client) -> None:
    """The list and the job's page say so for a queued or scheduled job of a task no live
    worker serves; not once a worker lists the task, nor for a finished job."""
    waiting = make_job("queued")  # of the task test.echo
    finished = make_job("done")
    live_worker("w1", ["test.noop"])
    page = admin_client.get(f"/admin/pgqueue/job/{waiting}/change/").content.decode()
    assert FLAG in page
    assert FLAG not in admin_client.get(f"/admin/pgqueue/job/{finished}/change/").content.decode()
    listing = admin_client.get("/admin/pgqueue/job/").content.decode()
    assert listing.count(FLAG) == 1

    Worker.objects.filter(id="w1").update(tasks=["test.echo", "test.noop"])
    assert FLAG not in admin_client.get(f"/admin/pgqueue/job/{waiting}/change/").content.decode()
    assert FLAG not in admin_client.get("/admin/pgqueue/job/").content.decode()


# -- the system check ----------------------------------------------------------------------


def test_check_warns_about_a_tasks_module_that_raises_on_import(tmp_path, monkeypatch) -> None:
    """W001 for a tasks module of an installed app that raises (an error inside it, or a
    missing dependency it imports); nothing for an app that simply has no such module;
    W002 for an entry that is a module of no installed app."""
    import tests.taskapp as taskapp

    (tmp_path / "broken_tasks.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "needs_missing.py").write_text("import pgqueue_no_such_dependency\n")
    monkeypatch.setattr(taskapp, "__path__", [*taskapp.__path__, str(tmp_path)])
    try:
        with override_settings(PGQUEUE={"TASK_MODULES": ["tasks", "broken_tasks"]}):
            warnings = checks.check_task_modules()
        assert [w.id for w in warnings] == ["pgqueue.W001"]
        assert "tests.taskapp.broken_tasks" in warnings[0].msg
        assert "RuntimeError: boom" in warnings[0].msg

        with override_settings(PGQUEUE={"TASK_MODULES": ["needs_missing"]}):
            warnings = checks.check_task_modules()
        assert [w.id for w in warnings] == ["pgqueue.W001"]
        assert "pgqueue_no_such_dependency" in warnings[0].msg

        with override_settings(PGQUEUE={"TASK_MODULES": ["tasks"]}):
            assert checks.check_task_modules() == []
        with override_settings(PGQUEUE={"TASK_MODULES": ["taks"]}):
            assert [w.id for w in checks.check_task_modules()] == ["pgqueue.W002"]
    finally:
        for name in ("tests.taskapp.broken_tasks", "tests.taskapp.needs_missing"):
            sys.modules.pop(name, None)
