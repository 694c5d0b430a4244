"""The operations dashboard: its numbers, its chart, who may see it and what it costs."""

from __future__ import annotations

import datetime as dt
import itertools
import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, RequestFactory
from django.urls import resolve, reverse
from django.utils import timezone

import pgqueue
from pgqueue import limits, liveness, services, store
from pgqueue.chart import CHART_WIDTH, X_LABEL_GAP, X_LABEL_WIDTH, throughput_chart_svg
from pgqueue.dashboard import dashboard_data, dashboard_view
from pgqueue.durations import format_seconds
from pgqueue.models import Job, JobAttempt, Worker
from pgqueue.reads import Bucket
from tests.conftest import claim, complete, fail, record_start

DASHBOARD_URL = "/admin/pgqueue/dashboard/"
SVG = "{http://www.w3.org/2000/svg}"


# -- helpers ------------------------------------------------------------------------------


def finish_at(job_id: int, finished: dt.datetime, run_seconds: float = 1.0) -> None:
    """Move a job's attempts to ``finished`` (each ran ``run_seconds``).

    Inside a test's transaction every statement's now() is the same instant, so attempts
    are placed in the minutes a test needs by rewriting their times.
    """
    JobAttempt.objects.filter(job_id=job_id).update(
        finished_at=finished, started_at=finished - dt.timedelta(seconds=run_seconds)
    )


def run(task: str, *, tenant: str = "acme", outcome: str = "done") -> int:
    """Enqueue one job and take it through one attempt ending in ``outcome``.

    It runs in the queue "work", where no other job is ever runnable, so the claim takes it.
    """
    job, _ = pgqueue.enqueue(task, tenant=tenant, queue="work")
    (claimed,) = claim("w-test", limit=1, queues=("work",))
    assert claimed.id == job.id
    if outcome == "done":
        assert complete("w-test", claimed)
    elif outcome == "failed":
        assert fail("w-test", claimed) == "scheduled"  # a retry, backing off
    elif outcome == "dead":
        assert fail("w-test", claimed, permanent=True) == "dead"
    elif outcome == "lease_expired":  # after its start was recorded: an attempt spent
        assert record_start("w-test", claimed)
        with connection.cursor() as cur:
            later = timezone.now() + dt.timedelta(hours=1)
            assert claimed.id in store.reap_expired(cur, now=later)
    return job.id


def add_worker(
    wid: str, *, seen: dt.datetime, stopped: dt.datetime | None = None, **fields: Any
) -> Worker:
    defaults = {"host": "host-" + wid, "pid": 100, "queues": ["default"], "concurrency": 4}
    return Worker.objects.create(
        id=wid, last_seen_at=seen, stopped_at=stopped, **{**defaults, **fields}
    )


def bucket_index(now: dt.datetime, moment: dt.datetime) -> int:
    """Which of the 60 buckets (oldest first, the current minute last) holds ``moment``."""
    minute = dt.timedelta(minutes=1)
    current = now.replace(second=0, microsecond=0)
    return 59 - int((current - moment.replace(second=0, microsecond=0)) / minute)


@pytest.fixture
def now() -> dt.datetime:
    """A fixed moment in the middle of a minute, so "N minutes ago" is unambiguous."""
    return timezone.now().replace(second=30, microsecond=0)


@pytest.fixture
def staff(db: Any) -> User:
    """A staff user who may view jobs: what the dashboard asks (as GET /stats does)."""
    user = User.objects.create_user("op", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    return user


@pytest.fixture
def staff_client(staff: User) -> Client:
    client = Client()
    client.force_login(staff)
    return client


# -- the numbers --------------------------------------------------------------------------


@pytest.mark.django_db
class TestData:
    def test_counts_jobs_by_status_overall_and_by_queue(self):
        queued = pgqueue.enqueue_many("test.noop", [{}] * 3, tenant="acme")  # queued
        pgqueue.enqueue_many("test.noop", [{}] * 2, tenant="acme", delay=3600)  # scheduled
        pgqueue.enqueue("test.noop", tenant="acme", depends_on=queued[:1])  # waiting
        run("test.noop")  # done
        run("test.noop", outcome="dead")
        cancelled, _ = pgqueue.enqueue("test.noop", tenant="acme")
        services.cancel(cancelled.id)
        pgqueue.enqueue("test.limited", tenant="acme")  # queue "limited"
        claim("w-running", limit=1, queues=("limited",))  # running

        d = dashboard_data()

        assert d["statuses"] == {
            "waiting": 1,
            "scheduled": 2,
            "queued": 3,
            "running": 1,
            "done": 1,
            "dead": 1,
            "cancelled": 1,
        }
        assert d["total_jobs"] == 10
        queues = {q["queue"]: q["counts"] for q in d["queues"]}
        assert set(queues) == {"default", "limited", "work"}
        assert queues["limited"]["running"] == 1
        assert queues["default"]["queued"] == 3 and queues["default"]["running"] == 0

    def test_top_ten_tenants_by_backlog_with_weights_and_done_share(self, now):
        # Twelve tenants with 1..12 runnable or scheduled jobs: the ten largest are shown.
        for i in range(1, 13):
            name = f"t{i:02d}"
            pgqueue.enqueue_many("test.noop", [{}] * (i - 1), tenant=name, queue="bulk")
            pgqueue.enqueue("test.noop", tenant=name, queue="bulk", delay=600)  # scheduled
        services.set_tenant_weight("t12", 3.0)
        services.set_tenant_weight("t12", 0.5, queue="bulk")
        services.set_tenant_weight("t11", 2.0, queue="other")
        # Jobs done in the last hour: three for t12, one for t11; one older for t11 is not.
        for _ in range(3):
            finish_at(run("test.noop", tenant="t12"), now - dt.timedelta(minutes=10))
        finish_at(run("test.noop", tenant="t11"), now - dt.timedelta(minutes=20))
        finish_at(run("test.noop", tenant="t11"), now - dt.timedelta(minutes=90))

        d = dashboard_data(now)

        tenants = d["tenants"]
        assert [t["name"] for t in tenants] == [f"t{i:02d}" for i in range(12, 2, -1)]
        top = tenants[0]
        assert (top["queued"], top["scheduled"], top["backlog"]) == (11, 1, 12)
        assert top["weight"] == 3.0 and top["queue_weights"] == {"bulk": 0.5}
        assert tenants[1]["weight"] == 1.0 and tenants[1]["queue_weights"] == {"other": 2.0}
        assert tenants[2]["queue_weights"] == {}
        assert d["done_last_hour"] == 4
        assert (top["done_last_hour"], top["done_share"]) == (3, 0.75)
        assert (tenants[1]["done_last_hour"], tenants[1]["done_share"]) == (1, 0.25)
        assert tenants[2]["done_share"] == 0.0

    def test_no_backlog_no_tenants_and_no_share(self):
        d = dashboard_data()
        assert d["tenants"] == [] and d["done_last_hour"] == 0
        assert d["queues"] == [] and d["total_jobs"] == 0

    def test_age_of_the_oldest_runnable_job_per_queue(self, now):
        old, _ = pgqueue.enqueue("test.noop", tenant="acme")
        pgqueue.enqueue("test.noop", tenant="other")
        Job.objects.filter(pk=old.id).update(run_at=now - dt.timedelta(seconds=300))
        Job.objects.exclude(pk=old.id).update(run_at=now - dt.timedelta(seconds=5))
        # A queue whose jobs are all scheduled has no runnable job, hence no age.
        pgqueue.enqueue("test.noop", queue="later", delay=600)

        d = dashboard_data(now)

        queues = {q["queue"]: q for q in d["queues"]}
        assert queues["default"]["oldest_age_seconds"] == 300.0
        assert queues["default"]["oldest_age"] == "5 min 0 s"
        assert queues["later"]["oldest_age_seconds"] is None

    def test_a_queue_no_live_worker_serves_is_flagged(self, now):
        pgqueue.enqueue("test.noop", queue="served")
        pgqueue.enqueue("test.noop", queue="orphan")
        pgqueue.enqueue("test.noop", queue="by-the-dead")
        pgqueue.enqueue("test.noop", queue="later", delay=600)  # nothing runnable yet
        add_worker("w-live", seen=now, queues=["served", "other"])
        add_worker("w-stale", seen=now - dt.timedelta(hours=1), queues=["by-the-dead"])
        add_worker("w-stopped", seen=now, stopped=now, queues=["orphan", "by-the-dead"])

        queues = {q["queue"]: q for q in dashboard_data(now)["queues"]}

        flagged = {name for name, q in queues.items() if q["unserved"]}
        assert flagged == {"orphan", "by-the-dead"}
        assert liveness.unserved_queues(now) == ["by-the-dead", "orphan"]
        # Served once a live worker lists it.
        add_worker("w-new", seen=now, queues=["orphan"])
        assert liveness.unserved_queues(now) == ["by-the-dead"]

    def test_a_queue_whose_queued_jobs_are_all_gated_is_flagged_when_unserved(self, now):
        """A limited tenant's jobs wait outside the claim index (gated); with no live worker
        of their queue they wait for ever all the same, so the queue is flagged too."""
        limits.set_tenant_limits("capped", max_running=1)
        pgqueue.enqueue("test.noop", queue="gated-only", tenant="capped")
        assert Job.objects.get(queue="gated-only").gated
        assert liveness.unserved_queues(now) == ["gated-only"]
        assert {q["queue"]: q for q in dashboard_data(now)["queues"]}["gated-only"]["unserved"]
        add_worker("w-live", seen=now, queues=["gated-only"])
        assert liveness.unserved_queues(now) == []

    def test_throughput_and_failures_per_minute_over_the_last_hour(self, now):
        five_ago = now - dt.timedelta(minutes=5)
        half_hour_ago = now - dt.timedelta(minutes=30)
        for _ in range(3):
            finish_at(run("test.noop"), five_ago)
        finish_at(run("test.noop", outcome="failed"), five_ago)
        finish_at(run("test.noop", outcome="failed"), half_hour_ago)
        finish_at(run("test.noop", outcome="lease_expired"), half_hour_ago)
        finish_at(run("test.noop"), now)  # the current minute
        finish_at(run("test.noop"), now - dt.timedelta(minutes=61))  # out of the window
        finish_at(run("test.noop", outcome="dead"), now - dt.timedelta(minutes=59))

        buckets = dashboard_data(now)["buckets"]

        assert len(buckets) == 60
        assert [b.minute for b in buckets] == sorted(b.minute for b in buckets)
        assert buckets[-1].minute == now.replace(second=0)
        assert buckets[bucket_index(now, five_ago)] == Bucket(five_ago.replace(second=0), 3, 1)
        assert buckets[bucket_index(now, half_hour_ago)].failed == 2
        assert buckets[-1].done == 1
        assert buckets[0].failed == 1  # the permanent failure, 59 minutes ago
        assert sum(b.done for b in buckets) == 4
        assert sum(b.failed for b in buckets) == 4

    def test_slowest_tasks_by_mean_run_time_of_done_attempts(self, now):
        finish_at(run("test.noop"), now, run_seconds=1)
        finish_at(run("test.noop"), now, run_seconds=3)
        finish_at(run("test.echo"), now, run_seconds=10)
        finish_at(run("test.sleep"), now, run_seconds=0.5)
        # Failures and attempts older than an hour do not count, however long they ran.
        finish_at(run("test.sleep", outcome="failed"), now, run_seconds=500)
        finish_at(run("test.sleep"), now - dt.timedelta(hours=2), run_seconds=900)

        slowest = dashboard_data(now)["slowest"]

        assert [(s["task"], s["count"]) for s in slowest] == [
            ("test.echo", 1),
            ("test.noop", 2),
            ("test.sleep", 1),
        ]
        assert [(s["mean_seconds"], s["max_seconds"]) for s in slowest] == [
            (10.0, 10.0),
            (2.0, 3.0),
            (0.5, 0.5),
        ]
        assert slowest[1]["mean"] == "2.00 s" and slowest[2]["mean"] == "500 ms"

    def test_slowest_tasks_are_at_most_ten(self, now):
        for seconds in range(1, 13):
            task_name = f"test.dash{seconds}"
            pgqueue.task(name=task_name)(lambda payload, job: None)
            try:
                finish_at(run(task_name), now, run_seconds=seconds)
            finally:
                pgqueue.registry.unregister(task_name)
        slowest = dashboard_data(now)["slowest"]
        assert [s["task"] for s in slowest] == [f"test.dash{s}" for s in range(12, 2, -1)]

    def test_workers_alive_stale_and_stopped(self, now, settings):
        settings.PGQUEUE = {"LEASE_SECONDS": 30}
        add_worker("w-alive", seen=now - dt.timedelta(seconds=5), host="b", queues=["a", "b"])
        add_worker("w-stale", seen=now - dt.timedelta(seconds=120), host="a")
        add_worker("w-stopped", seen=now, stopped=now, host="a")

        w = dashboard_data(now)["workers"]

        assert (w["alive"], w["stale"], w["stopped"], w["total"]) == (1, 1, 1, 3)
        assert w["lease_seconds"] == 30.0
        assert [(r["id"], r["state"]) for r in w["rows"]] == [
            ("w-alive", "alive"),
            ("w-stale", "stale"),
            ("w-stopped", "stopped"),
        ]
        alive = w["rows"][0]
        assert (alive["host"], alive["pid"], alive["queues"], alive["concurrency"]) == (
            "b",
            100,
            "a, b",
            4,
        )
        assert alive["last_seen"] == "5.00 s ago"


# -- the chart ----------------------------------------------------------------------------


def buckets_with(values: dict[int, tuple[int, int]]) -> list[Bucket]:
    start = dt.datetime(2025, 1, 2, 10, 0, tzinfo=dt.UTC)
    return [Bucket(start + dt.timedelta(minutes=i), *values.get(i, (0, 0))) for i in range(60)]


class TestChart:
    def test_draws_both_series_with_axes_and_labels(self):
        svg = throughput_chart_svg(buckets_with({3: (40, 2), 59: (7, 0), 30: (0, 5)}))
        root = ET.fromstring(svg)  # well-formed XML
        assert root.tag == f"{SVG}svg"
        rects = root.findall(f"{SVG}rect")
        bars = [r for r in rects if r.get("class") == "pgq-done"]
        hits = [r for r in rects if r.get("class") == "pgq-hit"]
        assert len(bars) == 2 and len(hits) == 60
        assert len(root.findall(f"{SVG}polyline")) == 1
        points = root.find(f"{SVG}polyline").get("points").split()
        assert len(points) == 60
        texts = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]
        # x labels every ten minutes and at the end; y labels from 0 to a round top.
        assert {"10:00", "10:10", "10:50", "10:59"} <= set(texts)
        assert "0" in texts and "40" in texts
        assert "minute (UTC)" in texts and "attempts / min" in texts
        assert "done (47)" in texts and "failed + lease expired (7)" in texts
        # The tallest bar reaches the top grid line; the hover titles hold exact numbers.
        titles = [h.find(f"{SVG}title").text for h in hits]
        assert titles[3] == "10:03 UTC: 40 done, 2 failed"

    def test_an_empty_hour_says_so(self):
        svg = throughput_chart_svg(buckets_with({}))
        root = ET.fromstring(svg)
        texts = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]
        assert "No attempts finished in the last hour" in texts

    def test_text_is_escaped(self):
        svg = throughput_chart_svg(buckets_with({}), title='<script>alert("x")</script> & co')
        assert "<script>" not in svg
        assert "&lt;script&gt;" in svg and "&amp; co" in svg
        ET.fromstring(svg)

    @pytest.mark.parametrize("start_minute", range(10))
    def test_x_labels_never_overlap_and_the_current_minute_is_labelled(self, start_minute):
        """Whatever minute the window starts at, no two x labels sit closer than a label's
        width (the current minute's used to land on the last ten-minute label when they
        were four minutes apart), and the last label is the current minute."""
        start = dt.datetime(2025, 1, 2, 10, start_minute, tzinfo=dt.UTC)
        buckets = [Bucket(start + dt.timedelta(minutes=i), 1, 0) for i in range(60)]
        root = ET.fromstring(throughput_chart_svg(buckets))
        labels = [
            (float(t.get("x")), t.text)
            for t in root.iter(f"{SVG}text")
            if "pgq-x-label" in (t.get("class") or "").split()
        ]
        xs = [x for x, _ in labels]
        assert xs == sorted(xs) and len(xs) >= 6
        gaps = [b - a for a, b in itertools.pairwise(xs)]
        assert min(gaps) >= X_LABEL_WIDTH + X_LABEL_GAP, labels
        assert labels[-1][1] == f"{buckets[-1].minute:%H:%M}"
        assert xs[0] - X_LABEL_WIDTH / 2 >= 0 and xs[-1] + X_LABEL_WIDTH / 2 <= CHART_WIDTH
        # Every whole ten minutes is labelled but the one the current minute crowds out.
        tens = {f"{b.minute:%H:%M}" for b in buckets[:-1] if b.minute.minute % 10 == 0}
        shown = {text for _, text in labels[:-1]}
        assert shown <= tens and len(tens - shown) <= 1

    def test_y_axis_is_round(self):
        svg = throughput_chart_svg(buckets_with({0: (93, 0)}))
        labels = re.findall(r'text-anchor="end"[^>]*>(\d+)</text>', svg)
        assert labels == ["0", "25", "50", "75", "100"]


def test_format_seconds():
    f = format_seconds
    assert [f(None), f(0.25), f(4.5), f(42), f(185), f(7440), f(90000)] == [
        "—",
        "250 ms",
        "4.50 s",
        "42 s",
        "3 min 5 s",
        "2 h 4 min",
        "1 d 1 h",
    ]


# -- the page -----------------------------------------------------------------------------


def populate(tag: str, jobs: int, tenants: int) -> None:
    """``jobs`` jobs spread over ``tenants`` tenants, some done, failed and running, and
    workers and per-queue weights: every section of the page has rows."""
    per = jobs // tenants
    for i in range(tenants):
        pgqueue.enqueue_many("test.noop", [{}] * per, tenant=f"{tag}{i:03d}")
    with connection.cursor() as cur:
        claimed = store.claim(cur, worker="w-pop", queues=["default"], limit=min(jobs, 40))
        store.complete_many(
            cur, worker="w-pop", results=[(j.id, j.attempt, None) for j in claimed[:30]]
        )
        store.fail_many(
            cur,
            worker="w-pop",
            failures=[store.Failure(j.id, j.attempt, "boom") for j in claimed[30:35]],
        )
    for i in range(min(tenants, 20)):
        add_worker(f"{tag}-w{i}", seen=timezone.now())
    services.set_tenant_weight(f"{tag}000", 2.0, queue="default")


@pytest.mark.django_db
class TestPage:
    def test_the_url_is_the_admins(self):
        assert reverse("admin:pgqueue_dashboard") == DASHBOARD_URL
        assert resolve(DASHBOARD_URL).url_name == "pgqueue_dashboard"

    def test_renders_for_staff_inside_the_admin(self, staff_client, now):
        pgqueue.enqueue_many("test.noop", [{}] * 1233, tenant="big-tenant")
        pgqueue.enqueue("test.noop", tenant="big-tenant", queue="orphan")  # 1,234 queued
        finish_at(run("test.echo", tenant="busy"), now - dt.timedelta(minutes=2), 7)
        add_worker("w-1", seen=timezone.now(), host="worker-host-1")

        response = staff_client.get(DASHBOARD_URL)

        assert response.status_code == 200
        assert response.templates[0].name == "admin/pgqueue/dashboard.html"
        assert "admin/base_site.html" in [t.name for t in response.templates]
        html = response.content.decode()
        assert '<meta http-equiv="refresh" content="10">' in html
        assert 'id="site-name"' in html and 'class="breadcrumbs"' in html
        assert "<svg" in html and "done (1)" in html
        assert re.search(r'data-status="queued">\s*<span class="pgq-num">1,234<', html)
        assert re.search(r'data-status="done">\s*<span class="pgq-num">1<', html)
        assert 'data-tenant="big-tenant"' in html
        assert "big-tenant" in html and "worker-host-1" in html
        assert "test.echo" in html and "7.00 s" in html
        # No live worker takes from "orphan": the queue table says so, and only there.
        assert re.search(
            r'<tr data-queue="orphan" data-unserved="true">\s*<td class="pgq-name">orphan '
            r'<span class="pgq-unserved"[^>]*>no live worker serves this queue</span>',
            html,
        )
        assert html.count("no live worker serves this queue") == 1
        assert '<tr data-queue="default">' in html
        assert re.search(r'data-status="workers-alive">\s*<span class="pgq-num">1<', html)
        # Nothing on the page points outside this server.
        assert not re.search(r'(src|href)="(https?:)?//', html)

    def test_the_view_contract_with_the_admin_context(self, staff):
        request = RequestFactory().get(DASHBOARD_URL)
        request.user = staff
        response = dashboard_view(request, admin.site.each_context(request))
        assert response.status_code == 200
        assert b"<svg" in response.content and b"Django administration" in response.content

    def test_the_view_refuses_non_staff_even_when_mounted_bare(self, db):
        from django.core.exceptions import PermissionDenied

        request = RequestFactory().get(DASHBOARD_URL)
        request.user = User.objects.create_user("visitor", password="pw")
        with pytest.raises(PermissionDenied):
            dashboard_view(request, {})

    def test_staff_without_view_job_get_403_and_no_index_entry(self, client):
        """A staff user with no pgqueue permission sees neither the page nor its entry on
        the admin index, as GET /stats is 403 for them. Protection: the dashboard asks
        for pgqueue.view_job (``dashboard_view``, ``DashboardAdmin.has_view_permission``);
        without it every staff user reads every tenant's backlog."""
        client.force_login(User.objects.create_user("clerk", password="pw", is_staff=True))
        assert client.get(DASHBOARD_URL).status_code == 403
        assert DASHBOARD_URL not in client.get("/admin/").content.decode()

    def test_anonymous_is_sent_to_the_admin_login(self, client):
        response = client.get(DASHBOARD_URL)
        assert response.status_code == 302
        assert response["Location"] == f"/admin/login/?next={DASHBOARD_URL}"

    def test_a_logged_in_non_staff_user_is_sent_to_the_admin_login(self, client):
        client.force_login(User.objects.create_user("visitor", password="pw"))
        response = client.get(DASHBOARD_URL)
        assert response.status_code == 302
        assert response["Location"] == f"/admin/login/?next={DASHBOARD_URL}"

    def test_query_count_is_small_and_does_not_grow(
        self, staff_client, django_assert_max_num_queries
    ):
        populate("small", jobs=10, tenants=2)
        with django_assert_max_num_queries(16) as small:
            assert staff_client.get(DASHBOARD_URL).status_code == 200

        populate("large", jobs=2000, tenants=200)
        assert Job.objects.count() == 2010
        with django_assert_max_num_queries(16) as large:
            response = staff_client.get(DASHBOARD_URL)
        assert response.status_code == 200
        assert len(small.captured_queries) == len(large.captured_queries)
        # Ten tenant rows whatever the number of tenants.
        assert response.content.decode().count("data-tenant=") == 10
