"""Outcome counters and run-time histograms by task, folded from the attempt history."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

import pgqueue
from pgqueue import store
from pgqueue.metrics import render
from tests.conftest import claim, complete, fail


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
    assert store.fold_task_stats(cursor, settle=0) > 0
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
    store.fold_task_stats(cursor, settle=0)
    assert store.fold_task_stats(cursor, settle=0) == 0
    _finish(1, 0, cursor)
    store.fold_task_stats(cursor, settle=0)
    labels = tuple(sorted((("task", "test.echo"), ("outcome", "done"))))
    assert _series()[("pgqueue_job_outcomes_total", labels)] == 5


@pytest.mark.django_db
def test_recent_attempts_wait_for_the_next_fold(cursor):
    """Rows younger than the settle delay are left alone, so none is skipped for good."""
    _finish(2, 0, cursor)
    assert store.fold_task_stats(cursor, settle=3600) == 0
    assert not any(k[0] == "pgqueue_job_outcomes_total" for k in _series())
    assert store.fold_task_stats(cursor, settle=0) > 0
