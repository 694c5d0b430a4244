"""Shared fixtures. Every test runs against a real PostgreSQL (DATABASE_URL)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.test import override_settings
from django.utils import timezone

from pgqueue import store
from pgqueue.models import Job
from tests.workers import workers  # noqa: F401  (the fixture, for every test module)


@pytest.fixture
def cursor(db: Any) -> Iterator[Any]:
    """A cursor on Django's connection (inside the test's transaction unless transactional)."""
    with connection.cursor() as cur:
        yield cur


@pytest.fixture
def fifo() -> Iterator[None]:
    """Switch the scheduling policy to FIFO for the duration of a test."""
    with override_settings(PGQUEUE={"ORDERING": "fifo"}):
        yield


def later(seconds: float) -> dt.datetime:
    """A moment ``seconds`` from now, for statements that accept an injected ``now``."""
    return timezone.now() + dt.timedelta(seconds=seconds)


def timeline() -> Callable[[float], dt.datetime]:
    """``at(seconds)``: moments after one fixed start, to inject as ``now``.

    A test that claims, heartbeats, completes and reaps at ``at(...)`` decides when each
    lease runs out, whatever the wall clock did in between.
    """
    start = timezone.now()
    return lambda seconds: start + dt.timedelta(seconds=seconds)


def claim(
    worker: str = "w1",
    limit: int = 1,
    queues: tuple[str, ...] = ("default",),
    lease_seconds: float | None = None,
    now: dt.datetime | None = None,
) -> list[store.ClaimedJob]:
    with connection.cursor() as cur:
        return store.claim(
            cur,
            worker=worker,
            queues=list(queues),
            limit=limit,
            lease_seconds=lease_seconds,
            now=now,
        )


def complete(
    worker: str, job: store.ClaimedJob, result: str | None = None, now: dt.datetime | None = None
) -> bool:
    with connection.cursor() as cur:
        return job.id in store.complete_many(
            cur, worker=worker, results=[(job.id, job.attempt, result)], now=now
        )


def fail(
    worker: str,
    job: store.ClaimedJob,
    *,
    permanent: bool = False,
    now: dt.datetime | None = None,
) -> str | None:
    """Record a failure; returns the job's new status, or None when fenced out."""
    with connection.cursor() as cur:
        return store.fail_many(
            cur,
            worker=worker,
            failures=[store.Failure(job.id, job.attempt, "RuntimeError: boom", "tb", permanent)],
            now=now,
        ).get(job.id)


def record_start(
    worker: str,
    job: store.ClaimedJob,
    now: dt.datetime | None = None,
    lease_seconds: float | None = None,
) -> bool:
    """Write a claimed job's start to its row, as the worker's heartbeat round does within
    about a second of its handler's start (JOB_HEARTBEAT_MANY), which also renews the lease
    from ``now``. Returns whether the job is still held."""
    with connection.cursor() as cur:
        return job.id in store.heartbeat_flags(
            cur,
            worker=worker,
            held=[(job.id, job.attempt)],
            lease_seconds=lease_seconds,
            now=now,
            started={job.id: now or timezone.now()},
        )


def drain(queues: tuple[str, ...] = ("default",), batch: int = 1) -> list[store.ClaimedJob]:
    """Claim and complete everything runnable, returning the jobs in claim order."""
    order: list[store.ClaimedJob] = []
    while True:
        jobs = claim("drainer", limit=batch, queues=queues)
        if not jobs:
            return order
        with connection.cursor() as cur:
            store.complete_many(
                cur, worker="drainer", results=[(j.id, j.attempt, None) for j in jobs]
            )
        order.extend(jobs)


def fold_all(cursor: Any, timeout: float = 30.0) -> int:
    """Fold every attempt committed so far into the metrics; returns how many were folded.

    The fold waits for every older transaction of the server to end (TASK_STAT_FOLD), and
    the server is shared with other sessions: polled, bounded by ``timeout``.
    """
    from pgqueue.models import StatMark

    head = store.attempt_head(cursor)
    folded = 0
    deadline = time.monotonic() + timeout
    while True:
        folded += store.fold_task_stats(cursor, head=head)
        mark = StatMark.objects.filter(pk=1).values_list("last_attempt_id", flat=True).first()
        if (mark or 0) >= head:
            return folded
        if time.monotonic() > deadline:
            pytest.fail(f"the fold did not reach attempt {head} in {timeout}s", pytrace=False)
        time.sleep(0.02)


def job(job_id: int) -> Job:
    return Job.objects.get(pk=job_id)


def run_threads(n: int, target: Callable[[int], Any], timeout: float = 120) -> list[Any]:
    """Run ``target(i)`` on ``n`` threads that start together; re-raise the first error.

    Each thread uses its own Django connection, closed when it ends.
    """
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = target(i)
        except Exception as exc:  # reported to the test below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a thread did not finish in time"
    if errors:
        raise errors[0]
    return results


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    """Throttle histories (Django's cache) start empty in every test: the failed-auth
    throttle counts per address, and every test client calls from 127.0.0.1."""
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()
