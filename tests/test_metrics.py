"""Outcome counters and run-time histograms by task, folded from the attempt history."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

import pgqueue
from pgqueue import store
from pgqueue.metrics import render
from pgqueue.models import JobAttempt, StatMark
from pgqueue.worker.connection import connect, connect_params
from pgqueue.worker.maintenance import run_maintenance
from tests.conftest import claim, complete, fail, fold_all


def _series() -> dict[tuple[str, tuple], float]:
    body, _ = render()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name.startswith("pgqueue_job_")
    }


def _finish(n_done: int, n_failed: int, cursor) -> None:
    pgqueue.enqueue_many("test.echo", list(range(n_done + n_failed)), tenant="acme")
    for job in claim("w1", limit=n_done + n_failed):
        if n_done:
            assert complete("w1", job)
            n_done -= 1
        else:
            assert fail("w1", job) == "scheduled"


@pytest.mark.django_db
def test_counters_and_histogram_by_task(cursor):
    _finish(3, 2, cursor)
    assert fold_all(cursor) == 5
    series = _series()
    done = ("task", "test.echo"), ("outcome", "done")
    failed = ("outcome", "failed"), ("task", "test.echo")
    assert series[("pgqueue_job_outcomes_total", tuple(sorted(done)))] == 3
    assert series[("pgqueue_job_outcomes_total", failed)] == 2
    count = series[("pgqueue_job_run_seconds_count", tuple(sorted(done)))]
    inf_bucket = series[("pgqueue_job_run_seconds_bucket", tuple(sorted((*done, ("le", "+Inf")))))]
    assert count == inf_bucket == 3


@pytest.mark.django_db
def test_folding_twice_counts_each_attempt_once(cursor):
    """The mark advances with each fold: a second fold adds nothing, new attempts add once."""
    _finish(4, 0, cursor)
    assert fold_all(cursor) == 4
    assert fold_all(cursor) == 0
    _finish(1, 0, cursor)
    assert fold_all(cursor) == 1
    labels = tuple(sorted((("task", "test.echo"), ("outcome", "done"))))
    assert _series()[("pgqueue_job_outcomes_total", labels)] == 5


@pytest.mark.django_db
def test_an_attempt_finished_later_than_a_larger_id_is_still_counted(cursor):
    """The cause of the misses: ids and finished_at are not in the same order.

    finished_at is its transaction's start (or the caller's clock), so an attempt with a
    larger id can carry an older finished_at. A fold that took rows "older than a settle
    window" took that one and moved the mark past the smaller, younger one: lost.
    """
    pgqueue.enqueue_many("test.echo", [1, 2], tenant="acme")
    first, second = claim("w1", limit=2)
    assert complete("w1", first)  # the smaller id, finished now
    assert complete("w1", second, now=timezone.now() - dt.timedelta(hours=1))
    assert fold_all(cursor) == 2
    labels = tuple(sorted((("task", "test.echo"), ("outcome", "done"))))
    assert _series()[("pgqueue_job_outcomes_total", labels)] == 2


@pytest.mark.django_db(transaction=True)
def test_an_attempt_committed_after_a_larger_one_is_folded_later_not_skipped():
    """Protection: the fold's horizon (TASK_STAT_FOLD never passes an id whose transaction
    may still be open). An attempt is written in a transaction held open while a later
    attempt commits and maintenance runs: the fold must stop short of it, and count it
    once it commits. Without the horizon check the mark passes it and it is never counted.
    """
    pgqueue.enqueue_many("test.echo", [1, 2], tenant="acme")
    held, later = claim("w1", limit=2)
    slow = connect(connect_params(application_name="pgqueue test held attempt"), autocommit=False)
    maint = connect(connect_params(application_name="pgqueue test maintenance"))
    try:
        with slow.cursor() as cur:  # its attempt id is drawn now, its commit comes last
            assert store.complete_many(cur, worker="w1", results=[(held.id, held.attempt, None)])
        assert complete("w1", later)
        ids = dict(JobAttempt.objects.values_list("job_id", "id"))
        assert later.id in ids and held.id not in ids  # the held one is not visible yet
        for _ in range(3):  # several passes, as maintenance makes them
            assert run_maintenance(maint).ran
        mark = StatMark.objects.get(pk=1).last_attempt_id
        assert mark < ids[later.id]
        slow.commit()
        with connection.cursor() as cur:
            assert fold_all(cur) == 2
    finally:
        slow.close()
        maint.close()
    labels = tuple(sorted((("task", "test.echo"), ("outcome", "done"))))
    assert _series()[("pgqueue_job_outcomes_total", labels)] == 2
