"""Wait per tenant: each attempt keeps when its job became runnable (due_at), maintenance
folds the wait to the handler's start and the run time by queue and tenant, /metrics
exports them as histograms with bounded cardinality, and the dashboard shows each busy
tenant's p95.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

import pgqueue
from pgqueue import store
from pgqueue.chart import wait_chart_svg
from pgqueue.dashboard import OTHER_TENANTS, dashboard_data
from pgqueue.metrics import OTHER_TENANTS as OTHER_LABEL
from pgqueue.metrics import render
from pgqueue.models import Job, JobAttempt, TenantStat
from pgqueue.store import Failure, Success
from tests.conftest import claim, fold_all
from tests.workers import StartWorker, wait_for


def _due(job_id: int, seconds_ago: float) -> dt.datetime:
    """Make a queued job runnable since ``seconds_ago`` (its run_at), as if it had waited."""
    at = timezone.now() - dt.timedelta(seconds=seconds_ago)
    Job.objects.filter(pk=job_id).update(run_at=at)
    return at


def _run(tenant: str, n: int, *, waited: float = 0.0, queue: str = "default") -> list[int]:
    """Enqueue ``n`` jobs of ``tenant``, runnable since ``waited`` seconds, and run them to
    done at once (claimed, started and finished now)."""
    ids = pgqueue.enqueue_many("test.noop", [{}] * n, tenant=tenant, queue=queue)
    for job_id in ids:
        _due(job_id, waited)
    jobs = claim("w1", limit=n, queues=(queue,))
    assert sorted(j.id for j in jobs) == sorted(ids)
    now = timezone.now()
    with connection.cursor() as cur:
        done = store.complete_many(
            cur, worker="w1", results=[Success(j.id, j.attempt, None, now, now) for j in jobs]
        )
    assert done == set(ids)
    return ids


def _stat(kind: str, tenant: str, queue: str = "default") -> dict[float, int]:
    return dict(
        TenantStat.objects.filter(queue=queue, tenant=tenant, kind=kind).values_list("le", "count")
    )


def _families() -> dict[str, list]:
    body, _ = render()
    return {
        f.name: f.samples
        for f in text_string_to_metric_families(body.decode())
        if f.name.startswith("pgqueue_tenant_")
    }


def _counts(samples: list, metric: str) -> dict[tuple[str, str], float]:
    return {
        (s.labels["queue"], s.labels["tenant"]): s.value
        for s in samples
        if s.name == f"{metric}_count"
    }


# -- due_at: when each attempt became runnable ----------------------------------------------


@pytest.mark.django_db
def test_each_attempt_keeps_when_it_became_runnable_not_the_retry_it_set():
    """The failure that schedules a retry moves run_at; the attempt row it writes keeps
    the run_at the attempt found, and the retry's attempt starts from the end of the
    backoff."""
    (job_id,) = pgqueue.enqueue_many("test.noop", [{}], tenant="acme")
    first_due = _due(job_id, 20)
    (claimed,) = claim("w1")
    with connection.cursor() as cur:
        assert store.fail_many(cur, worker="w1", failures=[Failure(claimed.id, 1, "boom")]) == {
            job_id: "scheduled"
        }
    second_due = _due(job_id, 5)  # the backoff ended five seconds ago
    Job.objects.filter(pk=job_id).update(status="queued")
    (again,) = claim("w1")
    with connection.cursor() as cur:
        assert store.complete_many(cur, worker="w1", results=[(again.id, again.attempt, None)])
    rows = list(
        JobAttempt.objects.filter(job_id=job_id)
        .order_by("attempt")
        .values_list("attempt", "outcome", "due_at")
    )
    assert rows == [(1, "failed", first_due), (2, "done", second_due)]


@pytest.mark.django_db
def test_a_reaped_attempt_keeps_its_due_time_too():
    (job_id,) = pgqueue.enqueue_many("test.noop", [{}], tenant="acme")
    due = _due(job_id, 3)
    (claimed,) = claim("w1")
    with connection.cursor() as cur:
        store.heartbeat_flags(
            cur, worker="w1", held=[(claimed.id, 1)], started={claimed.id: timezone.now()}
        )
        reaped = store.reap_expired(cur, now=timezone.now() + dt.timedelta(hours=1))
    assert reaped == {job_id: "scheduled"}
    assert JobAttempt.objects.get(job_id=job_id).due_at == due


# -- the fold ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_waits_and_run_times_are_folded_by_queue_and_tenant_once(cursor):
    """A tenant that waited 20 s lands in the 30 s bucket, one served at once in a bucket of
    a second or less; folding again adds nothing (the fold shares the per-task mark)."""
    _run("slow", 2, waited=20)
    _run("quick", 3, waited=0)
    assert fold_all(cursor) == 5
    assert _stat("wait", "slow") == {30.0: 2}
    quick = _stat("wait", "quick")
    assert sum(quick.values()) == 3 and max(quick) <= 1.0
    assert sum(_stat("run", "slow").values()) == 2
    before = list(TenantStat.objects.order_by("id").values_list("id", "count"))
    assert fold_all(cursor) == 0
    assert list(TenantStat.objects.order_by("id").values_list("id", "count")) == before


@pytest.mark.django_db
def test_an_attempt_that_never_started_adds_no_wait(cursor):
    """A claim given back by a lease expiry before its start was recorded has no start: it
    waited, but the wait has not ended, so it is not observed (its next attempt is)."""
    (job_id,) = pgqueue.enqueue_many("test.noop", [{}], tenant="acme")
    claim("w1")
    with connection.cursor() as cur:
        assert store.reap_expired(cur, now=timezone.now() + dt.timedelta(hours=1)) == {
            job_id: "queued"
        }
    assert fold_all(cursor) == 1
    assert not TenantStat.objects.exists()


@pytest.mark.django_db
def test_an_attempt_recorded_before_due_at_existed_adds_run_time_only(cursor):
    (job_id,) = _run("acme", 1)
    JobAttempt.objects.filter(job_id=job_id).update(due_at=None)
    assert fold_all(cursor) == 1
    assert _stat("wait", "acme") == {}
    assert sum(_stat("run", "acme").values()) == 1


@pytest.mark.django_db
@override_settings(PGQUEUE={"METRICS_TENANT_SERIES": 2})
def test_the_busiest_tenants_take_the_places_the_rest_are_other(cursor):
    """Cardinality is bounded: two places, four tenants in one fold; the two busiest get
    series of their own, the others are summed under "(other)" in /metrics."""
    for tenant, n in (("big", 5), ("mid", 3), ("small", 2), ("tiny", 1)):
        _run(tenant, n)
    fold_all(cursor)
    assert set(TenantStat.objects.values_list("tenant", flat=True)) == {"big", "mid", ""}
    waits = _counts(_families()["pgqueue_tenant_wait_seconds"], "pgqueue_tenant_wait_seconds")
    assert waits == {("default", "big"): 5, ("default", "mid"): 3, ("default", OTHER_LABEL): 3}


@pytest.mark.django_db
@override_settings(PGQUEUE={"METRICS_TENANT_SERIES": 2, "METRICS_TENANT_IDLE_SECONDS": 60})
def test_places_are_kept_until_idle_and_other_only_grows(cursor):
    """A newcomer finds the places taken and goes to "(other)"; once a holder has been
    idle for METRICS_TENANT_IDLE_SECONDS its series ends and the next fold gives its place
    to the newcomer. "(other)" never shrinks: every exported series is a true counter."""
    _run("a", 2)
    _run("b", 2)
    fold_all(cursor)
    _run("newcomer", 4)
    fold_all(cursor)
    assert sum(_stat("wait", "").values()) == 4
    assert _stat("wait", "newcomer") == {}

    with connection.cursor() as cur:
        store.release_idle_tenant_stats(cur)  # nobody idle yet
    assert set(TenantStat.objects.values_list("tenant", flat=True)) == {"a", "b", ""}
    TenantStat.objects.filter(tenant="b").update(
        folded_at=timezone.now() - dt.timedelta(seconds=61)
    )
    with connection.cursor() as cur:
        store.release_idle_tenant_stats(cur)
    assert set(TenantStat.objects.values_list("tenant", flat=True)) == {"a", ""}

    _run("newcomer", 1)
    fold_all(cursor)
    assert sum(_stat("wait", "newcomer").values()) == 1
    assert sum(_stat("wait", "").values()) == 4  # what it had folded there stays


@pytest.mark.django_db
@override_settings(PGQUEUE={"METRICS_TENANT_SERIES": 1})
def test_places_are_counted_per_queue(cursor):
    _run("a", 1, queue="q1")
    _run("b", 2, queue="q2")
    _run("c", 1, queue="q2")
    fold_all(cursor)
    rows = set(TenantStat.objects.values_list("queue", "tenant"))
    assert rows == {("q1", "a"), ("q2", "b"), ("q2", "")}


@pytest.mark.django_db
def test_histograms_are_cumulative_with_sums(cursor):
    _run("acme", 2, waited=20)
    fold_all(cursor)
    samples = _families()["pgqueue_tenant_wait_seconds"]
    buckets = {
        s.labels["le"]: s.value
        for s in samples
        if s.name == "pgqueue_tenant_wait_seconds_bucket" and s.labels["tenant"] == "acme"
    }
    assert buckets["10.0"] == 0 and buckets["30.0"] == 2 and buckets["+Inf"] == 2
    (total,) = [
        s.value
        for s in samples
        if s.name == "pgqueue_tenant_wait_seconds_sum" and s.labels["tenant"] == "acme"
    ]
    assert 40 <= total < 45


# -- the dashboard -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_dashboard_lists_the_busiest_tenants_waits_and_the_others_together(cursor):
    _run("starved", 3, waited=20)
    _run("served", 4, waited=0)
    for i in range(12):
        _run(f"t{i:02d}", 1)
    waits = dashboard_data()["waits"]
    assert [w["tenant"] for w in waits[:2]] == ["served", "starved"]
    assert len(waits) == 11 and waits[-1]["label"] == OTHER_TENANTS
    assert waits[-1]["tenant"] is None and waits[-1]["attempts"] == 12 - 8
    starved = waits[1]
    assert 20 <= starved["wait_p95_seconds"] < 25 and starved["wait_max_seconds"] >= 20
    assert waits[0]["wait_p95_seconds"] < 5
    svg = wait_chart_svg(
        [(w["label"], w["wait_p50_seconds"], w["wait_p95_seconds"], 1) for w in waits]
    )
    assert svg.count('class="pgq-wait-p95"') == 11 and "starved" in svg


def test_the_wait_chart_escapes_names_and_draws_an_empty_state():
    svg = wait_chart_svg([("<b>x</b>", 0.01, 0.02, 3)])
    assert "<b>" not in svg and "&lt;b&gt;" in svg
    assert "No attempt started" in wait_chart_svg([])


# -- with a real worker ----------------------------------------------------------------------


def test_a_real_worker_shows_a_small_tenant_served_within_a_flood(workers: StartWorker):
    """Fairness, seen: a tenant's flood is enqueued first, a small tenant's few jobs after
    it; one worker runs them all. The small tenant's p95 wait, on the dashboard and in
    /metrics, is below the flooding tenant's. Under ORDERING "fifo" the small tenant waits
    behind the whole flood and this fails (its p95 is then the longest of all)."""
    pgqueue.enqueue_many("test.sleep", [{"seconds": 0.01}] * 150, tenant="flood")
    small = pgqueue.enqueue_many("test.noop", [{}] * 5, tenant="small")
    workers("--concurrency", "1", settings={"MAINTENANCE_SECONDS": 0.2})
    wait_for(
        lambda: Job.objects.filter(status="done").count() == 155, 60, "the 155 jobs to be done"
    )
    assert Job.objects.filter(pk__in=small, status="done").count() == 5
    waits = {w["tenant"]: w for w in dashboard_data()["waits"]}
    assert waits["small"]["wait_p95_seconds"] < waits["flood"]["wait_p95_seconds"]

    def folded() -> dict[tuple[str, str], float]:
        families = _families()
        if "pgqueue_tenant_wait_seconds" not in families:
            return {}
        counts = _counts(families["pgqueue_tenant_wait_seconds"], "pgqueue_tenant_wait_seconds")
        return counts if sum(counts.values()) == 155 else {}

    counts = wait_for(folded, 30, "maintenance to fold the 155 attempts")
    assert counts == {("default", "flood"): 150, ("default", "small"): 5}
