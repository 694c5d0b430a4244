"""Progress and output a handler reports while it runs (``job.progress()``, ``job.output()``).

Real workers and real PostgreSQL: the worker keeps the latest report in memory and its
heartbeat rounds write it (JOB_HEARTBEAT_MANY, fenced like the lease), at most once per job
per round, and before the job's outcome is recorded. Each write sends the job's id on
pgqueue_progress, which is also how these tests count the writes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

import pgqueue
from pgqueue import store
from pgqueue.models import Job
from pgqueue.progress import progress_text
from pgqueue.testing import run_jobs
from pgqueue.worker.connection import connect_params
from pgqueue.worker.context import JobContext
from tests.api_fixtures import client, new_key
from tests.conftest import claim
from tests.workers import StartWorker, history, wait_for

#: A heartbeat every second, maintenance often.
SHORT = {"LEASE_SECONDS": 3, "MAINTENANCE_SECONDS": 0.2, "BACKOFF_BASE": 0.05}


def row(job_id: int) -> Job:
    return Job.objects.get(pk=job_id)


@pytest.fixture
def progress_listener(transactional_db: None) -> Iterator[psycopg.Connection]:
    """A connection listening on pgqueue_progress (autocommit)."""
    conn = psycopg.connect(**connect_params(None), autocommit=True)
    conn.execute("LISTEN pgqueue_progress")
    try:
        yield conn
    finally:
        conn.close()


def writes_of(conn: psycopg.Connection, job_id: int, seconds: float = 0.3) -> int:
    """How many pgqueue_progress notifications named ``job_id`` (drained for ``seconds``)."""
    count = 0
    for note in conn.notifies(timeout=seconds):
        count += str(job_id) in note.payload.split(",")
    return count


def context(**kwargs: Any) -> JobContext:
    return JobContext(
        id=1,
        task="test.progress",
        payload={},
        tenant="acme",
        queue="default",
        priority=0,
        attempt=1,
        max_attempts=1,
        worker_id="w",
        heartbeat=lambda timeout: None,
        **kwargs,
    )


# -- real workers ---------------------------------------------------------------------------


def test_progress_shows_while_the_job_runs_and_the_final_report_survives(
    workers: StartWorker, tmp_path: Path, progress_listener: psycopg.Connection
) -> None:
    """A report is written within about a second while the handler still runs, and the
    last one, made just before the handler returns, is written before the outcome (it
    would be lost otherwise: no round runs for a job once recorded)."""
    release = tmp_path / "release"
    job, _ = pgqueue.enqueue(
        "test.progress",
        {"calls": 3, "release": str(release), "final": True, "reported": str(tmp_path / "r")},
        tenant="acme",
    )
    w = workers("--concurrency", "1", settings=SHORT)
    w.registered()
    running = wait_for(
        lambda: (j := row(job.id)).progress is not None and j.status == "running" and j,
        15,
        "the progress of the running job",
    )
    assert running.progress["done"] == 3 and running.progress["total"] == 3
    assert running.progress["note"] == "step 3"
    assert running.progress["at"]  # the report's time, in the database's clock
    assert running.output == {"calls": 3}
    assert progress_text(running.progress) == "3 / 3 (100 %) — step 3"

    release.touch()
    done = wait_for(lambda: (j := row(job.id)).status == "done" and j, 15, "the job's end")
    assert done.progress["note"] == "final"
    assert done.output == {"final": True}
    assert done.result == {"ok": True}
    assert writes_of(progress_listener, job.id) >= 2  # while it ran, and its last report

    # GET /jobs/<id> shows them, and so does the list.
    api = client(new_key("acme"))
    body = api.get(f"/jobs/{job.id}").json()
    assert body["progress"]["note"] == "final" and body["progress"]["done"] == 3
    assert body["output"] == {"final": True}
    listed = api.get("/jobs").json()["results"]
    assert [j["output"] for j in listed if j["id"] == job.id] == [{"final": True}]


def test_many_reports_make_few_writes(
    workers: StartWorker, tmp_path: Path, progress_listener: psycopg.Connection
) -> None:
    """1,000 reports over a second or more make at most one write per heartbeat round
    (about one a second), counted by the notifications each write sends."""
    job, _ = pgqueue.enqueue("test.progress", {"calls": 1000, "pace": 0.002}, tenant="acme")
    w = workers("--concurrency", "1", settings=SHORT)
    w.registered()
    wait_for(lambda: row(job.id).status == "done", 30, "the job's end")
    writes = writes_of(progress_listener, job.id)
    assert 1 <= writes <= 20, writes  # far fewer than the 1,000 calls
    final = row(job.id)
    assert final.progress["done"] == 1000 and final.output == {"calls": 1000}


def test_a_worker_that_lost_its_lease_writes_no_progress(
    workers: StartWorker, tmp_path: Path, progress_listener: psycopg.Connection
) -> None:
    """Protection: the lease fence (lease owner and attempt) of JOB_HEARTBEAT_MANY. Once
    the job is no longer the worker's (here taken over, as a reap and a claim elsewhere
    would), neither its rounds nor the write before its outcome change the job's progress
    or output, and its outcome is discarded."""
    release = tmp_path / "release"
    reported = tmp_path / "reported"
    job, _ = pgqueue.enqueue(
        "test.progress",
        {"calls": 2, "release": str(release), "final": True, "reported": str(reported)},
        tenant="acme",
    )
    w = workers("--concurrency", "1", settings=SHORT)
    w.registered()
    wait_for(lambda: row(job.id).progress is not None, 15, "the first report written")
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE pgqueue_job SET lease_owner = 'another worker', progress = NULL, "
            "output = NULL WHERE id = %s",
            [job.id],
        )
    writes_of(progress_listener, job.id, seconds=0.1)  # those before the takeover
    release.touch()  # its final report, then its return
    wait_for(lambda: "outcome=discarded" in w.log(), 15, "the outcome discarded")
    taken = row(job.id)
    assert taken.progress is None and taken.output is None
    assert taken.status == "running" and taken.lease_owner == "another worker"
    assert writes_of(progress_listener, job.id) == 0
    assert history(job.id) == []


def test_output_too_large_raises_in_the_handler(workers: StartWorker, tmp_path: Path) -> None:
    """An output over MAX_OUTPUT_BYTES raises InvalidJob in the handler: caught, the job
    completes with the output it had; not caught, the attempt fails with that error. The
    worker goes on either way, and the last report made before it is kept."""
    caught, _ = pgqueue.enqueue(
        "test.progress",
        {"calls": 2, "output_bytes": 5000, "catch": True, "refused": str(tmp_path / "x")},
        tenant="acme",
    )
    raised, _ = pgqueue.enqueue(
        "test.progress", {"calls": 2, "output_bytes": 5000}, tenant="acme", max_attempts=1
    )
    w = workers("--concurrency", "2", settings={**SHORT, "MAX_OUTPUT_BYTES": 1000})
    w.registered()
    wait_for(
        lambda: (
            {row(caught.id).status, row(raised.id).status} == {"done", "dead"}
            and row(caught.id).status == "done"
        ),
        20,
        "both jobs ended",
    )
    assert Path(f"{tmp_path / 'x'}.1").exists()
    ok = row(caught.id)
    assert ok.output == {"calls": 2} and ok.progress["done"] == 2
    dead = row(raised.id)
    assert "MAX_OUTPUT_BYTES" in dead.last_error and "5002 bytes" in dead.last_error
    assert dead.output == {"calls": 2} and dead.progress["done"] == 2


# -- in process: pgqueue.testing and the bounds ---------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run_jobs_records_progress_and_output() -> None:
    """pgqueue.testing.run_jobs takes the calls and writes the last report of each job."""
    job, _ = pgqueue.enqueue("test.progress", {"calls": 4}, tenant="acme")
    run_jobs().raise_failures()
    done = row(job.id)
    assert done.status == "done"
    assert done.progress["done"] == 4 and done.progress["note"] == "step 4"
    assert done.output == {"calls": 4}


@pytest.mark.django_db
def test_run_jobs_in_a_test_transaction() -> None:
    """In a TestCase's transaction too (the write is in the test's transaction)."""
    job, _ = pgqueue.enqueue("test.progress", {"calls": 1}, tenant="acme")
    run_jobs().raise_failures()
    assert row(job.id).output == {"calls": 1}


@pytest.mark.django_db(transaction=True)
def test_retry_clears_progress_and_output() -> None:
    """An operator's retry starts the job afresh: its old progress and output go."""
    job, _ = pgqueue.enqueue("test.progress", {"calls": 2, "fail": True}, tenant="acme")
    Job.objects.filter(pk=job.id).update(max_attempts=1)
    run_jobs()
    assert row(job.id).status == "dead" and row(job.id).output == {"calls": 2}
    pgqueue.services.retry_jobs([job.id])
    again = row(job.id)
    assert again.progress is None and again.output is None


@pytest.mark.parametrize(
    ("done", "total"),
    [
        (math.nan, None),
        (math.inf, None),
        (-1, None),
        (1, -1),
        (5, 4),
        (True, None),
        ("3", None),
        (10**400, None),
        (1, math.nan),
    ],
)
def test_hostile_counts_are_refused(done: Any, total: Any) -> None:
    ctx = context()
    with pytest.raises(pgqueue.InvalidJob) as refused:
        ctx.progress(done, total)
    assert refused.value.field == "progress"
    assert ctx.take_report() is None  # nothing kept


@pytest.mark.parametrize("value", [math.nan, {"a": math.inf}, "\ud800", "a\x00b", {1, 2}, object()])
def test_hostile_outputs_are_refused(value: Any) -> None:
    ctx = context()
    with pytest.raises(pgqueue.InvalidJob) as refused:
        ctx.output(value)
    assert refused.value.field == "output"
    assert ctx.take_report() is None


def test_a_long_note_is_cut_and_a_nul_dropped(settings: Any) -> None:
    settings.PGQUEUE = {**getattr(settings, "PGQUEUE", {}), "MAX_PROGRESS_NOTE_CHARS": 10}
    ctx = context()
    ctx.progress(1, 2, note="é" * 1_000_000)
    assert ctx.reported["progress"]["note"] == "é" * 10
    ctx.progress(1, 2, note="a\x00b")
    assert ctx.reported["progress"]["note"] == "ab"
    with pytest.raises(pgqueue.InvalidJob):
        ctx.progress(1, 2, note=b"bytes")  # type: ignore[arg-type]


def test_reports_wake_the_loop_once_per_write() -> None:
    """The first report since the last write wakes the worker's loop; the next ones only
    replace the values (the loop writes them at its round, once)."""
    woken: list[int] = []
    ctx = context(wake=lambda: woken.append(1))
    for i in range(100):
        ctx.progress(i, 100)
    ctx.output([1, 2])
    assert len(woken) == 1
    report = ctx.take_report()
    assert report is not None and report.progress == (99, 100, None)
    assert report.output_json == "[1,2]"
    ctx.progress(100, 100)  # made while the round writes the report above
    ctx.report_written(report)
    later = ctx.take_report()
    assert later is not None and later.progress == (100, 100, None) and later.output_json is None
    ctx.report_written(later)
    assert ctx.take_report() is None and ctx.report_since is None
    ctx.progress(100, 100)
    assert len(woken) == 2


def test_progress_text() -> None:
    assert progress_text({"done": 3, "total": 10, "note": "copying"}) == "3 / 10 (30 %) — copying"
    assert progress_text({"done": 42, "total": None, "note": None}) == "42"
    assert progress_text({"done": 0.5, "total": 0, "note": ""}) == "0.5 / 0"
    assert progress_text(None) == "" and progress_text({"done": "x"}) == ""


def test_heartbeat_writes_reports_fenced_and_notifies(
    progress_listener: psycopg.Connection,
) -> None:
    """Protection: JOB_HEARTBEAT_MANY's fence. A round without reports writes neither
    column and sends no notification (arrays of NULLs, as before); a report is written for
    the lease holder's attempt only, and its id sent on pgqueue_progress."""
    job, _ = pgqueue.enqueue("test.noop", {}, tenant="acme")
    (claimed,) = claim()
    held = [(claimed.id, claimed.attempt)]
    with connection.cursor() as cur:
        assert store.heartbeat_many(cur, worker="w1", held=held) == {job.id}
    assert writes_of(progress_listener, job.id, seconds=0.1) == 0
    assert row(job.id).progress is None
    report = {claimed.id: '{"done": 1, "total": 2, "note": null, "at": null}'}
    with connection.cursor() as cur:
        stale = [(claimed.id, claimed.attempt + 1)]
        assert store.heartbeat_flags(cur, worker="w1", held=stale, progress=report) == {}
        assert store.heartbeat_flags(cur, worker="w2", held=held, output={job.id: "1"}) == {}
    assert writes_of(progress_listener, job.id, seconds=0.1) == 0
    assert row(job.id).progress is None and row(job.id).output is None
    with connection.cursor() as cur:
        assert store.heartbeat_flags(cur, worker="w1", held=held, progress=report) == {
            job.id: False
        }
    assert writes_of(progress_listener, job.id, seconds=0.5) == 1
    assert row(job.id).progress["total"] == 2 and row(job.id).output is None


# -- where it shows -------------------------------------------------------------------------


def _reported_job(note: str = "copying <b>") -> int:
    job, _ = pgqueue.enqueue("test.noop", {}, tenant="acme")
    Job.objects.filter(pk=job.id).update(
        progress={"done": 3, "total": 10, "note": note, "at": "2030-01-01T00:00:00+00:00"},
        output={"rows": "x" * 3000},
    )
    return job.id


@pytest.mark.django_db
def test_show_prints_progress_and_output() -> None:
    from tests.test_cli import pgq, pgq_json

    job_id = _reported_job()
    code, out, _ = pgq("show", str(job_id))
    assert code == 0
    assert "progress:" in out and "3 / 10 (30 %) — copying <b>" in out
    assert '{"rows":"xxx' in out
    doc = pgq_json("show", str(job_id))
    assert doc["progress"]["done"] == 3 and doc["output"]["rows"] == "x" * 3000


@pytest.mark.django_db
def test_admin_page_shows_progress_and_output(admin_client: Any) -> None:
    job_id = _reported_job()
    page = admin_client.get(f"/admin/pgqueue/job/{job_id}/change/").content.decode()
    assert "3 / 10 (30 %) — copying &lt;b&gt;" in page  # escaped
    assert "&quot;rows&quot;" in page or '"rows"' in page


@pytest.mark.django_db
def test_a_large_output_is_cut_in_the_list_only(settings: Any) -> None:
    settings.PGQUEUE = {**getattr(settings, "PGQUEUE", {}), "API_FIELD_BYTES": 1024}
    job_id = _reported_job()
    api = client(new_key("acme"))
    (listed,) = [j for j in api.get("/jobs").json()["results"] if j["id"] == job_id]
    assert listed["output"]["truncated"] is True and listed["output"]["bytes"] > 3000
    assert listed["progress"]["total"] == 10
    assert api.get(f"/jobs/{job_id}").json()["output"] == {"rows": "x" * 3000}
