"""Cancelling a running job, and timeouts: real workers, real PostgreSQL.

A running job is asked to stop (DELETE /jobs/<id>, services.cancel); the worker holding it
learns it from a notification or at its next heartbeat, records the attempt cancelled and
tells the handler (``job.cancelled``, ``job.heartbeat()`` raising), whose return is
discarded. A timeout fails the attempt ("timed out after N s"), retried or dead, and the
handler's late return lands nowhere.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

import pgqueue
from pgqueue import services, stop_store, store
from pgqueue.models import Job
from pgqueue.worker.connection import connect_params
from tests.api_fixtures import client, new_key
from tests.conftest import fold_all
from tests.workers import STARTUP, StartWorker, history, wait_for, waiting_on_a_lock

#: A short lease: a heartbeat every second, maintenance often, a tiny backoff.
SHORT = {"LEASE_SECONDS": 3, "MAINTENANCE_SECONDS": 0.2, "BACKOFF_BASE": 0.05}


def status(job_id: int) -> str:
    return Job.objects.get(pk=job_id).status


def started(path: Path, attempt: int = 1) -> bool:
    return Path(f"{path}.{attempt}").exists()


def batch_lines(log: str, job_id: int) -> list[dict[str, str]]:
    """The counts of each batch INFO line (event=recorded) that names ``job_id`` alone."""
    return [
        dict(field.split("=", 1) for field in line.split("event=recorded ", 1)[1].split())
        for line in log.splitlines()
        if "event=recorded " in line and line.endswith(f" ids={job_id}")
    ]


def counted(line: dict[str, str]) -> dict[str, str]:
    return {k: line[k] for k in ("jobs", "done", "failed", "dead", "cancelled", "discarded")}


# -- cancelling a running job ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_delete_on_a_running_job_ends_it_cancelled_and_discards_its_return(
    workers: StartWorker, tmp_path: Path
) -> None:
    """DELETE /jobs/<id> on a running job: 202 "cancelling"; the worker ends the attempt
    cancelled (an attempt row 'cancelled'), the handler sees job.heartbeat() raise
    JobCancelled, and the value it returns afterwards is not recorded."""
    begun, observed = tmp_path / "started", tmp_path / "observed"
    job, _ = pgqueue.enqueue(
        "test.heartbeat_until_cancelled",
        {"started": str(begun), "observed": str(observed)},
        tenant="acme",
    )
    w = workers("--concurrency", "1", settings=SHORT)
    worker_id = w.registered()
    wait_for(lambda: started(begun), STARTUP, "the handler to start")

    response = client(new_key()).delete(f"/jobs/{job.id}")
    assert response.status_code == 202, response.content
    # The body is the job as read after the request: its worker, told at once by NOTIFY,
    # may already have ended it.
    assert response.json()["status"] in ("cancelling", "cancelled")

    wait_for(lambda: status(job.id) == "cancelled", 3 / 3 + 5, "the job to end cancelled")
    wait_for(lambda: Path(f"{observed}.JobCancelled").exists(), 5, "the handler to see it")
    # The handler's return is dropped; the batch line counts the job cancelled, as it was
    # recorded (it said discarded=1: a discard is an outcome lost with the lease).
    (line,) = wait_for(lambda: batch_lines(w.log(), job.id), 5, "the return to be logged")
    assert counted(line) == {
        "jobs": "1", "done": "0", "failed": "0", "dead": "0", "cancelled": "1", "discarded": "0"
    }  # fmt: skip
    assert "outcome=discarded" not in w.log()
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.result, row.finished_at is not None) == ("cancelled", None, True)
    assert history(job.id) == [(1, "cancelled", worker_id)]


@pytest.mark.django_db(transaction=True)
def test_a_missed_notification_is_made_up_for_by_the_next_heartbeat(
    workers: StartWorker, tmp_path: Path
) -> None:
    """A cancel request whose notification never came (set here without one) reaches the
    worker at its next heartbeat round (lease / 3 = 1 s): JOB_HEARTBEAT_MANY returns the
    request. The handler only reads job.cancelled, so no round of its own explains it."""
    begun, observed = tmp_path / "started", tmp_path / "observed"
    job, _ = pgqueue.enqueue(
        "test.until_cancelled", {"started": str(begun), "observed": str(observed)}, tenant="acme"
    )
    w = workers("--concurrency", "1", settings=SHORT)
    worker_id = w.registered()
    wait_for(lambda: started(begun), STARTUP, "the handler to start")

    with connection.cursor() as cur:  # as JOB_CANCEL_REQUEST_MANY does, without pg_notify
        cur.execute("UPDATE pgqueue_job SET cancel_requested_at = now() WHERE id = %s", [job.id])

    wait_for(lambda: status(job.id) == "cancelled", 5, "the next heartbeat to end it")
    wait_for(lambda: Path(f"{observed}.cancelled").exists(), 5, "the handler to see it")
    assert "event=cancel_requested via=heartbeat outcome=cancelled" in w.log()
    assert history(job.id) == [(1, "cancelled", worker_id)]
    assert Job.objects.get(pk=job.id).result is None


@pytest.mark.django_db(transaction=True)
def test_the_notification_brings_a_cancel_request_before_any_heartbeat(
    workers: StartWorker, tmp_path: Path
) -> None:
    """With a 120 s lease the next heartbeat is 40 s away, and the handler does not call
    heartbeat(): only the 'cancel:<worker>' notification can end the job within the 15 s
    waited, and the worker's log says that is how it learnt it."""
    begun, observed = tmp_path / "started", tmp_path / "observed"
    job, _ = pgqueue.enqueue(
        "test.until_cancelled", {"started": str(begun), "observed": str(observed)}, tenant="acme"
    )
    w = workers("--concurrency", "1", settings={"LEASE_SECONDS": 120})
    w.registered()
    wait_for(lambda: started(begun), STARTUP, "the handler to start")
    wait_for(lambda: "event=cancel_requested" not in w.log(), 1, "a quiet log")

    asked = services.cancel(job.id)
    assert (asked.status, asked.cancel_requested_at is not None) == ("running", True)

    wait_for(lambda: status(job.id) == "cancelled", 15, "the notification to end it")
    wait_for(lambda: Path(f"{observed}.cancelled").exists(), 5, "the handler to see it")
    assert "event=cancel_requested via=notify outcome=cancelled" in w.log()


# -- cancel racing completion ---------------------------------------------------------------


def _claim_one(worker: str) -> store.ClaimedJob:
    with connection.cursor() as cur:
        (held,) = store.claim(cur, worker=worker, queues=["default"], limit=1, lease_seconds=30)
    return held


@pytest.mark.django_db(transaction=True)
def test_a_cancel_request_committed_first_wins_over_the_completion() -> None:
    """The completion's fence (cancel_requested_at IS NULL): a completion that waited on the
    row lock of a cancel request's open transaction is refused once the request commits,
    and the worker records the attempt cancelled; one attempt row, no result.

    Without that fence the completion would land after the request: done, and a 202
    "cancelling" answer that turned out false."""
    job, _ = pgqueue.enqueue("test.noop", {}, tenant="acme")
    held = _claim_one("w1")
    params = connect_params("default")
    with psycopg.connect(**params) as asker, psycopg.connect(**params, autocommit=True) as w1:
        with asker.cursor() as cur:  # the request's transaction stays open
            assert stop_store.request_cancel_many(cur, [job.id]) == [job.id]
        result: dict[str, Any] = {}

        def complete() -> None:
            with w1.cursor() as cur:
                result["done"] = store.complete_many(
                    cur, worker="w1", results=[(held.id, held.attempt, '{"x": 1}')]
                )

        t = threading.Thread(target=complete)
        t.start()
        wait_for(lambda: waiting_on_a_lock(w1.info.backend_pid), 10, "the completion to wait")
        asker.commit()
        t.join(10)
        assert result["done"] == set()  # refused: the request committed first
        with w1.cursor() as cur:
            assert stop_store.confirm_cancel_many(
                cur, worker="w1", held=[(held.id, held.attempt)]
            ) == {job.id}
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.result) == ("cancelled", None)
    assert history(job.id) == [(1, "cancelled", "w1")]


@pytest.mark.django_db(transaction=True)
def test_a_completion_committed_first_wins_over_the_cancel_request() -> None:
    """The request's own fence (status = 'running', re-checked after the row lock): a
    request that waited on an open completion finds the job done once it commits and is a
    conflict (HTTP 409); nothing is cancelled, one attempt row."""
    job, _ = pgqueue.enqueue("test.noop", {}, tenant="acme")
    held = _claim_one("w1")
    params = connect_params("default")
    with psycopg.connect(**params) as w1:
        with w1.cursor() as cur:  # the completion's transaction stays open
            assert store.complete_many(
                cur, worker="w1", results=[(held.id, held.attempt, '{"x": 1}')]
            ) == {job.id}
        errors: list[BaseException] = []
        pids: list[int] = []

        def cancel() -> None:
            try:
                with connection.cursor() as cur:
                    cur.execute("SELECT pg_backend_pid()")
                    pids.append(cur.fetchone()[0])
                services.cancel(job.id)
            except BaseException as exc:
                errors.append(exc)
            finally:
                connection.close()

        t = threading.Thread(target=cancel)
        t.start()
        wait_for(lambda: pids and waiting_on_a_lock(pids[0]), 10, "the request to wait")
        w1.commit()
        t.join(10)
    assert len(errors) == 1 and isinstance(errors[0], pgqueue.InvalidTransition), errors
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.result, row.cancel_requested_at) == ("done", {"x": 1}, None)
    assert history(job.id) == [(1, "done", "w1")]


# -- timeouts ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_attempt_past_its_timeout_fails_is_retried_and_its_late_result_is_fenced_out(
    workers: StartWorker, tmp_path: Path
) -> None:
    """Attempt 1 sleeps 4 s with a 1 s timeout: the worker records it failed "timed out
    after 1 s" while the handler still sleeps, the job is retried (attempt 2 runs on the
    second slot and is done), and attempt 1's eventual return changes nothing."""
    begun, finished = tmp_path / "started", tmp_path / "finished"
    job, _ = pgqueue.enqueue(
        "test.slow_first",
        {"seconds": 4, "started": str(begun), "finished": str(finished)},
        tenant="acme",
        timeout=1,
        max_attempts=3,
    )
    assert job.timeout_seconds == 1.0
    w = workers("--concurrency", "2", settings=SHORT)
    worker_id = w.registered()

    wait_for(lambda: status(job.id) == "done", STARTUP, "attempt 2 to run and finish")
    assert not Path(f"{finished}.1").exists()  # attempt 1's handler was still sleeping
    wait_for(lambda: Path(f"{finished}.1").exists(), 10, "attempt 1's handler to return")

    # Attempt 2's batch, then attempt 1's late return, counted as the failure it was
    # recorded as when it timed out (not as an outcome lost with the lease).
    def both() -> list[dict[str, str]] | None:
        lines = batch_lines(w.log(), job.id)
        return lines if len(lines) == 2 else None

    done, late = wait_for(both, 5, "its return dropped")
    assert (counted(done)["done"], counted(done)["jobs"]) == ("1", "1")
    assert counted(late) == {
        "jobs": "1", "done": "0", "failed": "1", "dead": "0", "cancelled": "0", "discarded": "0"
    }  # fmt: skip
    assert "outcome=discarded" not in w.log()
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.attempts, row.result) == ("done", 2, {"attempt": 2})
    assert history(job.id) == [(1, "failed", worker_id), (2, "done", worker_id)]
    first = row.history.order_by("id").first()
    assert first.error == "timed out after 1 s"


@pytest.mark.django_db(transaction=True)
def test_a_timeout_on_the_last_attempt_is_dead_and_the_handler_is_told(
    workers: StartWorker, tmp_path: Path
) -> None:
    """With max_attempts=1 the timed-out attempt makes the job dead; a handler watching
    job.cancelled sees it turn true with the reason "timed_out"."""
    begun, observed = tmp_path / "started", tmp_path / "observed"
    job, _ = pgqueue.enqueue(
        "test.until_cancelled",
        {"started": str(begun), "observed": str(observed)},
        tenant="acme",
        timeout=0.5,
        max_attempts=1,
    )
    w = workers("--concurrency", "1", settings=SHORT)
    worker_id = w.registered()
    wait_for(lambda: status(job.id) == "dead", STARTUP, "the job to time out, dead")
    wait_for(lambda: Path(f"{observed}.timed_out").exists(), 5, "the handler to be told")
    (line,) = wait_for(lambda: batch_lines(w.log(), job.id), 5, "the return to be logged")
    assert (counted(line)["dead"], counted(line)["discarded"]) == ("1", "0")
    row = Job.objects.get(pk=job.id)
    assert (row.last_error, row.result) == ("timed out after 0.5 s", None)
    assert history(job.id) == [(1, "failed", worker_id)]


@pytest.mark.django_db(transaction=True)
def test_maintenance_fails_a_job_its_worker_left_past_its_deadline() -> None:
    """The backstop (JOB_REAP_TIMED_OUT): a job still running a grace past its deadline,
    its lease alive (a worker that does not enforce timeouts), is failed as its worker
    would have failed it; the late completion is fenced out."""
    job, _ = pgqueue.enqueue("test.noop", {}, tenant="acme", timeout=2, max_attempts=1)
    held = _claim_one("old-worker")
    with connection.cursor() as cur:
        assert stop_store.reap_timed_out(cur, grace=1) == {}  # not yet
        cur.execute(
            "UPDATE pgqueue_job SET started_at = now() - interval '10 seconds' WHERE id = %s",
            [job.id],
        )
        assert stop_store.reap_timed_out(cur, grace=1) == {job.id: "dead"}
        late = store.complete_many(cur, worker="old-worker", results=[(held.id, 1, None)])
    assert late == set()
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.last_error) == ("dead", "timed out after 2 s")
    assert history(job.id) == [(1, "failed", "old-worker")]


@pytest.mark.django_db(transaction=True)
def test_maintenance_cancels_a_job_asked_to_stop_whose_lease_ran_out() -> None:
    """JOB_REAP_CANCELLED: the worker of a job asked to stop died; once the lease is out
    the job ends cancelled (not retried, as the lease reaper would do)."""
    job, _ = pgqueue.enqueue("test.noop", {}, tenant="acme", max_attempts=5)
    _claim_one("gone")
    with connection.cursor() as cur:
        stop_store.request_cancel_many(cur, [job.id])
        cur.execute(
            "UPDATE pgqueue_job SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
            [job.id],
        )
        assert stop_store.reap_cancelled(cur) == [job.id]
        assert store.reap_expired(cur) == {}
    assert status(job.id) == "cancelled"
    assert history(job.id) == [(1, "cancelled", "gone")]


# -- validation -------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "value, reason",
    [
        (0, "above 0"),
        (-1, "above 0"),
        ("10", "number of seconds"),
        (True, "number of seconds"),
        (10**9, "at most"),
        ([1], "number of seconds"),
    ],
)
def test_a_bad_timeout_over_http_is_a_400_naming_the_field(value: Any, reason: str) -> None:
    api = client(new_key())
    for path, body in (
        ("/jobs", {"task": "test.noop", "timeout_seconds": value}),
        ("/jobs/batch", {"task": "test.noop", "payloads": [{}], "timeout_seconds": value}),
    ):
        response = api.post(path, body, format="json")
        assert response.status_code == 400, response.content
        doc = response.json()
        assert "timeout_seconds" in doc["fields"], doc
        assert reason in doc["fields"]["timeout_seconds"], doc
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_timeouts_resolve_from_the_enqueue_then_the_task_then_the_setting(settings: Any) -> None:
    task = pgqueue.task(name="test.timed_task", timeout=7)(lambda payload, job: None)
    assert pgqueue.enqueue(task, {}).job.timeout_seconds == 7
    assert pgqueue.enqueue(task, {}, timeout=3).job.timeout_seconds == 3
    assert Job.objects.get(pk=pgqueue.enqueue("test.noop", {}).job.id).timeout_seconds is None
    settings.PGQUEUE = {"DEFAULT_TIMEOUT_SECONDS": 60}
    job = pgqueue.enqueue("test.noop", {}).job
    assert Job.objects.get(pk=job.id).timeout_seconds == 60
    with pytest.raises(pgqueue.InvalidJob) as exc:
        pgqueue.task(name="test.bad_timeout", timeout=float("nan"))
    assert exc.value.field == "timeout"
    body = {"task": "test.noop", "timeout_seconds": 2.5}
    created = client(new_key()).post("/jobs", body, format="json").json()
    assert created["timeout_seconds"] == 2.5


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_attempt_is_folded_into_the_task_stats() -> None:
    """pgqueue_task_stat folds every outcome: a cancelled attempt is counted under its own
    outcome (pgqueue_job_outcomes{outcome="cancelled"})."""
    from pgqueue.models import TaskStat

    job, _ = pgqueue.enqueue("test.noop", {}, tenant="acme")
    held = _claim_one("w1")
    with connection.cursor() as cur:
        stop_store.request_cancel_many(cur, [job.id])
        assert stop_store.confirm_cancel_many(cur, worker="w1", held=[(held.id, held.attempt)]) == {
            job.id
        }
        fold_all(cur)
    counts = TaskStat.objects.filter(task="test.noop").values_list("outcome", "count")
    assert sorted(counts) == [("cancelled", 1)]
