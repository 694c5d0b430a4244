"""Retention: finished jobs leave the table after their status's retention, with their
attempt rows and idempotency keys, in bounded batches that skip locked rows, never before
the metrics have folded their attempts.

Time is moved by writing finished_at (and the attempts' finished_at) into the past, never
by sleeping. Pruning runs in transactions of its own, so these tests are transactional.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

import pgqueue
from pgqueue import prune_store
from pgqueue.checks import check_settings
from pgqueue.cli import prune as prune_command
from pgqueue.models import Job, JobAttempt, TaskStat
from pgqueue.worker.maintenance import prune_finished_jobs, run_maintenance
from tests.conftest import claim, drain, fail, fold_all
from tests.test_checks import manage
from tests.workers import database_url

DAY = 86400

pytestmark = pytest.mark.django_db(transaction=True)


def finished(status: str, days_ago: float, n: int = 1, key: str | None = None) -> list[int]:
    """``n`` jobs of ``status`` (through the real paths: complete, fail, cancel) whose
    finish, and their attempts', is moved ``days_ago`` into the past."""
    if key is not None:
        ids = [pgqueue.enqueue("test.noop", {}, tenant="acme", idempotency_key=key)[0].id]
    else:
        ids = pgqueue.enqueue_many("test.noop", [{}] * n, tenant="acme")
    if status == "done":
        drain()
    elif status == "dead":
        for job in claim("w1", limit=n):
            assert fail("w1", job, permanent=True) == "dead"
    else:
        assert pgqueue.services.cancel_jobs(ids).changed == ids
    age = dt.timedelta(days=days_ago)
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE pgqueue_job SET finished_at = finished_at - %s WHERE id = ANY(%s)", [age, ids]
        )
        cur.execute(
            "UPDATE pgqueue_job_attempt SET finished_at = finished_at - %s, "
            "started_at = started_at - %s WHERE job_id = ANY(%s)",
            [age, age, ids],
        )
    return ids


def fold() -> None:
    with connection.cursor() as cur:
        fold_all(cur)


def prune(**kwargs: Any) -> dict[str, prune_store.Pruned]:
    connection.ensure_connection()
    return prune_finished_jobs(connection.connection, **kwargs)


def left(ids: list[int]) -> set[int]:
    return set(Job.objects.filter(id__in=ids).values_list("id", flat=True))


def counters() -> list[tuple]:
    return sorted(TaskStat.objects.values_list("task", "outcome", "le", "count"))


def test_each_status_is_kept_for_its_own_retention():
    """Defaults: done and cancelled 7 days, dead 30 days; finished_at decides."""
    done_old, done_new = finished("done", 8), finished("done", 6)
    dead_old, dead_mid = finished("dead", 31), finished("dead", 8)
    cancelled_old, cancelled_new = finished("cancelled", 8), finished("cancelled", 6)
    fold()
    removed = prune()
    assert removed == {
        "done": prune_store.Pruned(1, 1),
        "cancelled": prune_store.Pruned(1, 0),
        "dead": prune_store.Pruned(1, 1),
    }
    gone = done_old + dead_old + cancelled_old
    kept = done_new + dead_mid + cancelled_new
    assert left(gone + kept) == set(kept)
    assert not JobAttempt.objects.filter(job_id__in=gone).exists()
    assert JobAttempt.objects.filter(job_id__in=kept).count() == 2  # done_new, dead_mid


def test_unfinished_jobs_are_never_pruned_whatever_their_age():
    queued = pgqueue.enqueue_many("test.noop", [{}] * 2, tenant="acme")
    scheduled = pgqueue.enqueue("test.noop", {}, tenant="acme", delay=3600)[0].id
    with connection.cursor() as cur:
        cur.execute("UPDATE pgqueue_job SET created_at = now() - interval '400 days'")
    fold()
    with override_settings(PGQUEUE={"RETENTION": {"done": 0, "cancelled": 0, "dead": 0}}):
        prune()
    assert left([*queued, scheduled]) == {*queued, scheduled}


def test_none_keeps_a_status_forever_and_a_partial_dict_keeps_the_other_defaults():
    ancient_done = finished("done", 1000)
    old_cancelled = finished("cancelled", 8)
    fold()
    with override_settings(PGQUEUE={"RETENTION": {"done": None}}):
        removed = prune()
    assert "done" not in removed
    assert left(ancient_done + old_cancelled) == set(ancient_done)


def test_retention_accepts_a_timedelta():
    one_hour_old = finished("done", 1 / 24)
    fold()
    with override_settings(PGQUEUE={"RETENTION": {"done": dt.timedelta(minutes=30)}}):
        prune()
    assert left(one_hour_old) == set()


def test_batches_are_bounded_oldest_first_and_so_is_a_pass():
    """A pass runs at most PRUNE_BATCHES_PER_PASS statements of PRUNE_BATCH_SIZE jobs (the
    statuses take turns; only done is pruned here, so both go to it)."""
    ids = [finished("done", 8 + i)[0] for i in range(10)]  # ids[9] is the oldest
    fold()
    only_done = {"done": 7 * DAY, "cancelled": None, "dead": None}
    with override_settings(
        PGQUEUE={"PRUNE_BATCH_SIZE": 3, "PRUNE_BATCHES_PER_PASS": 2, "RETENTION": only_done}
    ):
        with connection.cursor() as cur:
            one = prune_store.prune_finished(cur, status="done", keep_seconds=7 * DAY)
        assert one == prune_store.Pruned(3, 3)
        assert left(ids) == set(ids[:7])
        assert prune() == {"done": prune_store.Pruned(6, 6)}
        assert left(ids) == {ids[0]}  # the youngest, left for the next pass
        assert prune()["done"] == prune_store.Pruned(1, 1)
    assert left(ids) == set()


@pytest.fixture
def other_connection() -> Iterator[psycopg.Connection]:
    with psycopg.connect(database_url()) as conn:
        yield conn


def test_a_locked_row_is_skipped_not_waited_on(other_connection):
    """Another transaction holds the oldest prunable job's row lock (as an operator's
    retry would): the prune skips that row, removes the others and returns at once.

    Without SKIP LOCKED in JOB_PRUNE_FINISHED the prune waits for that lock: lock_timeout
    (2 s) then ends it with LockNotAvailable and this test fails.
    """
    held, *others = [finished("done", 10 - i)[0] for i in range(3)]
    fold()
    other_connection.execute("SELECT 1 FROM pgqueue_job WHERE id = %s FOR UPDATE", [held])
    with connection.cursor() as cur:
        cur.execute("SET lock_timeout = '2s'")
    try:
        removed = prune()
    finally:
        with connection.cursor() as cur:
            cur.execute("RESET lock_timeout")
    assert removed["done"] == prune_store.Pruned(2, 2)
    assert left([held, *others]) == {held}
    other_connection.rollback()
    prune()
    assert left([held]) == set()


def test_an_idempotency_key_is_reusable_once_its_job_is_pruned():
    [first] = finished("done", 8, key="invoice-42")
    again, created = pgqueue.enqueue("test.noop", {}, tenant="acme", idempotency_key="invoice-42")
    assert (again.id, created) == (first, False)  # still there: the key still dedupes
    fold()
    prune()
    assert left([first]) == set()
    new, created = pgqueue.enqueue("test.noop", {}, tenant="acme", idempotency_key="invoice-42")
    assert created and new.id != first


def test_attempts_not_folded_yet_keep_their_job_until_the_fold():
    """The prune never deletes history the counters have not counted: a job with an
    attempt past the fold mark stays, however old; once folded it goes, and the counters
    are the same after the prune as before it."""
    folded = finished("done", 9)
    fold()
    unfolded = finished("done", 8)  # its attempt id is past the mark
    before = counters()
    assert prune()["done"] == prune_store.Pruned(1, 1)
    assert left(folded + unfolded) == set(unfolded)
    assert counters() == before
    fold()
    after_fold = counters()
    assert after_fold != before
    assert prune()["done"] == prune_store.Pruned(1, 1)
    assert left(unfolded) == set()
    assert counters() == after_fold
    assert sum(c for *_, c in after_fold) == 2  # both attempts counted once, none lost


def test_one_maintenance_pass_folds_then_prunes():
    """run_maintenance folds settled attempts and then prunes, in that order, in one pass."""
    ids = finished("done", 8, n=3)
    with psycopg.connect(database_url(), autocommit=True) as conn:
        assert run_maintenance(conn).ran
    assert left(ids) == set()
    assert sum(c for *_, c in counters()) == 3


def test_a_retried_dead_job_is_not_pruned():
    [job_id] = finished("dead", 40)
    pgqueue.services.retry_jobs([job_id])
    fold()
    prune()
    assert left([job_id]) == {job_id}


def out(*args: str) -> str:
    buf = io.StringIO()
    call_command("pgqueue", "prune", *args, stdout=buf)
    return buf.getvalue()


def test_the_command_dry_run_counts_and_removes_nothing():
    ids = finished("done", 8, n=2) + finished("dead", 31)
    fold()
    assert out("--dry-run").splitlines() == [
        "would remove 2 done jobs, 2 attempts",
        "would remove 0 cancelled jobs, 0 attempts",
        "would remove 1 dead jobs, 1 attempts",
    ]
    assert left(ids) == set(ids)


def test_the_command_dry_run_stops_counting_at_its_cap(monkeypatch):
    finished("done", 8, n=3)
    fold()
    monkeypatch.setattr(prune_command, "DRY_RUN_CAP", 2)
    assert out("--dry-run").splitlines()[0] == "would remove 2+ done jobs, 3+ attempts"


def test_the_command_removes_everything_due_in_batches():
    ids = finished("done", 8, n=7)
    keep = finished("done", 1)
    fold()
    with override_settings(PGQUEUE={"PRUNE_BATCH_SIZE": 2, "RETENTION": {"dead": None}}):
        lines = out().splitlines()
    assert lines == [
        "removed 7 done jobs, 7 attempts",
        "removed 0 cancelled jobs, 0 attempts",
        "kept all dead jobs (RETENTION 'dead' is None)",
    ]
    assert left(ids + keep) == set(keep)


def test_the_command_exits_0():
    ids = finished("done", 8, n=2)
    fold()
    run = {"settings_module": "tests.worker_settings", "DATABASE_URL": database_url()}
    dry = manage("pgqueue", "prune", "--dry-run", **run)
    assert (dry.returncode, dry.stderr) == (0, ""), dry.stdout + dry.stderr
    assert "would remove 2 done jobs, 2 attempts" in dry.stdout.splitlines()
    assert left(ids) == set(ids)
    real = manage("pgqueue", "prune", **run)
    assert (real.returncode, real.stderr) == (0, ""), real.stdout + real.stderr
    assert "removed 2 done jobs, 2 attempts" in real.stdout.splitlines()
    assert left(ids) == set()


# -- the settings ---------------------------------------------------------------------------


def errors(**pgqueue_settings: Any) -> list[str]:
    with override_settings(PGQUEUE=pgqueue_settings):
        return [e.msg for e in check_settings() if e.id == "pgqueue.E003"]


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize(
    "retention",
    [
        {"done": 60, "dead": None},
        {"cancelled": dt.timedelta(days=1)},
        {"done": 0.5},
        {},
    ],
)
def test_valid_retention_passes_the_check(retention):
    assert errors(RETENTION=retention) == []


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize(
    ("retention", "says"),
    [
        ({"done": -1}, "PGQUEUE['RETENTION']['done'] must be seconds >= 0"),
        ({"dead": "30d"}, "PGQUEUE['RETENTION']['dead'] must be seconds >= 0"),
        ({"done": True}, "PGQUEUE['RETENTION']['done'] must be seconds >= 0"),
        ({"done": float("inf")}, "PGQUEUE['RETENTION']['done'] must be seconds >= 0"),
        ({"done": dt.timedelta(seconds=-5)}, "PGQUEUE['RETENTION']['done'] must be seconds"),
        ({"finished": 60}, "PGQUEUE['RETENTION'] names unknown status(es) finished"),
        ({"queued": 60}, "PGQUEUE['RETENTION'] names unknown status(es) queued"),
        (7 * DAY, "PGQUEUE['RETENTION'] must be a dict"),
    ],
)
def test_invalid_retention_is_reported(retention, says):
    [message] = errors(RETENTION=retention)
    assert message.startswith(says), message


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize("name", ["PRUNE_BATCH_SIZE", "PRUNE_BATCHES_PER_PASS"])
@pytest.mark.parametrize("value", [0, 2.5, "10"])
def test_prune_batch_settings_are_positive_integers(name, value):
    assert errors(**{name: value}) == [f"PGQUEUE[{name!r}] must be an integer >= 1, got {value!r}."]
