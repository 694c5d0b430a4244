"""Reads that stay bounded however long pgqueue has run: counts from the partial indexes
(live jobs) or up to COUNT_CAP (finished ones), GET /jobs by cursor within a byte budget.

``test_no_request_scans_the_job_tables`` is the proof on a million finished jobs. On the
code before this change it fails: /stats, /metrics and the dashboard grouped every row of
pgqueue_job (``Seq Scan on pgqueue_job`` under a HashAggregate), /tenants counted every job
of its tenants, and GET /jobs ran ``SELECT COUNT(*) FROM pgqueue_job`` on every page.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from pgqueue import reads, services
from pgqueue.api.params import _encode_cursor
from pgqueue.dashboard import dashboard_data
from pgqueue.models import Job
from tests.api_fixtures import client, make_job, new_key


@pytest.fixture
def api(db: Any) -> APIClient:
    return client(new_key())


def ids(page: dict[str, Any]) -> list[int]:
    return [j["id"] for j in page["results"]]


# -- GET /jobs ---------------------------------------------------------------------------


class TestCursorPages:
    def test_pages_stay_put_while_jobs_are_added(self, api):
        first = sorted(services.enqueue_many("test.noop", [{}] * 7), reverse=True)
        page = api.get("/jobs", {"limit": 3}).json()
        assert ids(page) == first[:3]
        services.enqueue_many("test.noop", [{}] * 5)  # newer: ahead of the first page
        second = api.get(page["next"]).json()
        assert ids(second) == first[3:6]  # an offset would have repeated three of page one
        third = api.get(second["next"]).json()
        assert ids(third) == first[6:] and third["next"] is None
        back = api.get(third["previous"]).json()
        assert ids(back) == first[3:6]
        assert ids(api.get(back["previous"]).json()) == first[:3]

    def test_previous_of_the_newest_page_is_none_and_offset_still_works(self, api):
        jobs = sorted(services.enqueue_many("test.noop", [{}] * 4), reverse=True)
        page = api.get("/jobs", {"limit": 2, "offset": 1}).json()
        assert ids(page) == jobs[1:3] and page["previous"] and "offset" not in page["next"]
        newest = api.get(page["previous"]).json()
        assert ids(newest) == jobs[:1] and newest["previous"] is None

    def test_a_cursor_keeps_the_filters(self, api):
        services.enqueue_many("test.noop", [{}] * 3, tenant="a")
        wanted = sorted(services.enqueue_many("test.noop", [{}] * 3, tenant="b"), reverse=True)
        page = api.get("/jobs", {"tenant": "b", "limit": 2}).json()
        assert "tenant=b" in page["next"]
        assert ids(page) + ids(api.get(page["next"]).json()) == wanted

    def test_count_is_exact_up_to_the_cap_then_an_estimate(self, api):
        services.enqueue_many("test.noop", [{}] * 8)
        with override_settings(PGQUEUE={"COUNT_CAP": 10}):
            exact = api.get("/jobs").json()
            assert (exact["count"], exact["count_is_estimate"]) == (8, False)
            services.enqueue_many("test.noop", [{}] * 8, tenant="t")
            with connection.cursor() as cur:
                cur.execute("ANALYZE pgqueue_job")
            try:
                for params in ({}, {"status": "queued"}):
                    page = api.get("/jobs", params).json()
                    assert page["count_is_estimate"] is True, params
                    assert page["count"] >= 11  # never less than the rows counted
            finally:
                with connection.cursor() as cur:  # ANALYZE outlives the rollback
                    cur.execute("DELETE FROM pgqueue_job")
                    cur.execute("ANALYZE pgqueue_job")


def walk(api: APIClient, url: str, link: str = "next") -> list[dict[str, Any]]:
    """Every page from ``url`` on, following ``link`` (at most 50 pages)."""
    pages = [api.get(url).json()]
    while pages[-1][link] is not None:
        assert len(pages) < 50, "the links go round"
        pages.append(api.get(pages[-1][link]).json())
    return pages


class TestListWindow:
    """A page examines at most LIST_WINDOW jobs in reach past its cursor: a filter that
    matches few of them gives short or empty pages whose links go on past the window."""

    def test_a_rare_match_is_reached_through_empty_pages_and_back(self, api):
        rare = services.enqueue("test.noop", {}, queue="rare").job.pk
        common = services.enqueue_many("test.noop", [{}] * 7)
        with override_settings(PGQUEUE={"LIST_WINDOW": 3}):
            pages = walk(api, "/jobs?queue=rare&limit=2")
            # Seven jobs above it: the windows [common 7..5], [4..2], [1, rare].
            assert [ids(p) for p in pages] == [[], [], [rare]]
            assert all("queue=rare" in p["next"] for p in pages[:-1])
            # Back up: the windows above it are [1..3], [4..6], [7], none rare.
            back = walk(api, pages[-1]["previous"], "previous")
            assert [ids(p) for p in back] == [[], [], []]
            # Unfiltered, windows never cut a page short of jobs that exist.
            everything = walk(api, "/jobs?limit=2")
            assert [j for p in everything for j in ids(p)] == sorted([rare, *common], reverse=True)

    def test_a_previous_page_is_windowed_too(self, api):
        jobs = sorted(services.enqueue_many("test.noop", [{}] * 6), reverse=True)
        rare = services.enqueue("test.noop", {}, queue="rare").job.pk
        services.enqueue_many("test.noop", [{}] * 5)
        with override_settings(PGQUEUE={"LIST_WINDOW": 3}):
            # Newer than the sixth job: the window [rare, 1, 2], then [3, 4, 5].
            cursor = _encode_cursor("p", jobs[0])
            page = api.get(f"/jobs?queue=rare&cursor={cursor}").json()
            assert ids(page) == [rare] and page["previous"] is not None
            newer = walk(api, page["previous"], "previous")
            assert [ids(p) for p in newer] == [[]]
            # The next of an empty backward page starts at its cursor's own page.
            older = api.get(newer[0]["next"]).json()
            assert ids(older) == [rare]

    def test_a_tenants_window_holds_only_its_jobs(self, api):
        """However many jobs other tenants enqueued since, a tenant key's first page
        finds its tenant's newest jobs (pgqueue_job_tenant_id)."""
        mine = services.enqueue_many("test.echo", [{}] * 2, tenant="small")
        services.enqueue_many("test.echo", [{}] * 20, tenant="big")
        with override_settings(PGQUEUE={"LIST_WINDOW": 3}):
            page = client(new_key(tenant="small")).get("/jobs").json()
            assert ids(page) == mine[::-1] and page["next"] is None
            assert (page["count"], page["count_is_estimate"]) == (2, False)
            page = client(new_key()).get("/jobs?tenant=small&limit=1").json()
            assert (
                ids(page) == mine[1:]
                and ids(client(new_key()).get(page["next"]).json()) == mine[:1]
            )

    def test_the_count_is_exact_only_when_the_window_holds_every_job_in_reach(self, api):
        services.enqueue_many("test.noop", [{}] * 3, queue="rare")
        services.enqueue_many("test.noop", [{}] * 3)
        with override_settings(PGQUEUE={"LIST_WINDOW": 6}):
            page = api.get("/jobs?queue=rare").json()
            assert (page["count"], page["count_is_estimate"]) == (3, False)
        with override_settings(PGQUEUE={"LIST_WINDOW": 4}):
            page = api.get("/jobs?queue=rare").json()
            # One rare job in the newest four; the planner's figure, never below it.
            assert page["count_is_estimate"] is True and page["count"] >= 1
            assert ids(page) == [] or len(ids(page)) == 1


class TestPageSize:
    def test_large_payloads_are_replaced_by_a_marker_and_whole_by_id(self, api):
        big = {"text": "x" * 20_000}
        job_id = services.enqueue("test.echo", big).job.pk
        small_id = services.enqueue("test.echo", {"n": 1}).job.pk
        listed = {j["id"]: j for j in api.get("/jobs").json()["results"]}
        marker = listed[job_id]["payload"]
        assert marker["truncated"] is True
        assert marker["bytes"] == len(json.dumps(big))  # jsonb's text: ", " and ": "
        assert marker["url"].endswith(f"/jobs/{job_id}")
        assert listed[small_id]["payload"] == {"n": 1}
        assert api.get(f"/jobs/{job_id}").json()["payload"] == big

    def test_a_page_ends_at_the_byte_budget_and_next_goes_on(self, api):
        made = sorted(services.enqueue_many("test.echo", [{"text": "y" * 1500}] * 6), reverse=True)
        with override_settings(PGQUEUE={"API_PAGE_BYTES": 4096}):
            page = api.get("/jobs", {"limit": 500}).json()
            assert 1 <= len(page["results"]) < 6
            assert len(json.dumps(page["results"])) <= 4096
            seen = ids(page)
            while page["next"]:
                page = api.get(page["next"]).json()
                seen += ids(page)
        assert seen == made

    def test_one_job_larger_than_the_budget_is_still_returned(self, api):
        job_id = services.enqueue("test.echo", {"text": "z" * 10_000}).job.pk
        with override_settings(PGQUEUE={"API_PAGE_BYTES": 1024, "API_FIELD_BYTES": 64 * 1024}):
            page = api.get("/jobs").json()
        assert ids(page) == [job_id] and page["next"] is None


# -- counts ------------------------------------------------------------------------------


class TestBoundedCounts:
    def test_live_counts_exact_finished_capped(self, api):
        for _ in range(4):
            make_job("done", queue="q")
        make_job("dead", queue="q")
        services.enqueue_many("test.noop", [{}] * 6, queue="q")
        services.enqueue("test.noop", {}, queue="q", delay=600)
        with override_settings(PGQUEUE={"COUNT_CAP": 3}):
            counts = reads.job_counts()["q"]
            assert counts == {"queued": 6, "scheduled": 1, "done": 4, "dead": 1}
            assert str(counts["done"]) == "3+" and str(counts["queued"]) == "6"
            stats = api.get("/stats").json()
            assert stats["queues"]["q"]["queued"] == 6
            assert stats["capped"] == {"q": ["done"]} and stats["count_cap"] == 3
            assert stats["dead"] == 1 and stats["dead_capped"] is False
            metrics = api.get("/metrics").content.decode()
            assert 'pgqueue_jobs{queue="q",status="queued"} 6.0' in metrics
            assert 'pgqueue_jobs{queue="q",status="done"} 4.0' in metrics
            data = dashboard_data()
            (row,) = [q for q in data["queues"] if q["queue"] == "q"]
            assert row["labels"]["done"] == "3+" and row["labels"]["queued"] == "6"
            assert str(data["statuses"]["done"]) == "3+"

    def test_tenant_counts_cap_done_and_dead(self, api):
        for _ in range(3):
            make_job("done", tenant="acme")
        make_job("queued", tenant="acme")
        with override_settings(PGQUEUE={"COUNT_CAP": 2}):
            (acme,) = api.get("/tenants").json()["results"]
        assert (acme["backlog"], acme["done"], acme["dead"]) == (1, 3, 0)
        assert acme["capped"] == ["done"]


# -- a million finished jobs -------------------------------------------------------------

FILL_JOBS = """
INSERT INTO pgqueue_job (queue, tenant, task, payload, status, priority, attempts,
                         max_attempts, run_at, created_at, started_at, finished_at)
SELECT CASE WHEN g %% 10 = 0 THEN 'other' ELSE 'bulk' END,
       CASE WHEN g %% 2 = 0 THEN 'tenant-big' ELSE 'tenant-' || (g %% 40) END, 'test.echo',
       '{}'::jsonb, CASE WHEN g %% 50 = 0 THEN 'dead' WHEN g %% 77 = 0 THEN 'cancelled'
       ELSE 'done' END, 0, 1, 5, now() - interval '3 days', now() - interval '3 days',
       now() - interval '3 days', now() - interval '3 days'
  FROM generate_series(1, %(n)s) g
"""
FILL_ATTEMPTS = """
INSERT INTO pgqueue_job_attempt (job_id, attempt, worker, started_at, finished_at, outcome)
SELECT id, 1, 'w', finished_at, finished_at, 'done' FROM pgqueue_job WHERE id % 10 = 0
"""
FILL_TENANTS = """
INSERT INTO pgqueue_tenant (name, weight, created_at)
SELECT 'tenant-' || g, 1, now() FROM generate_series(0, 39) g
 UNION ALL SELECT 'tenant-big', 1, now() ON CONFLICT DO NOTHING
"""
SCANNED = {"pgqueue_job", "pgqueue_job_attempt"}


def seq_scans(plan: dict[str, Any]) -> list[str]:
    """The relations of SCANNED that ``plan`` (a node of EXPLAIN's JSON) reads sequentially."""
    found = []
    if plan.get("Node Type") == "Seq Scan" and plan.get("Relation Name") in SCANNED:
        found.append(plan["Relation Name"])
    for child in plan.get("Plans", []):
        found += seq_scans(child)
    return found


#: More rows than this read by one scan of a job table is a read that grows with the
#: history: above every bound a read is allowed (COUNT_CAP, the finished counts' bound).
MAX_ROWS_READ = 50_000


def large_reads(plan: dict[str, Any]) -> list[str]:
    """The scans of SCANNED in ``plan`` (EXPLAIN ANALYZE's JSON) that read more than
    MAX_ROWS_READ rows or index entries: an index scan of every finished job is no better
    than a sequential one."""
    found = []
    if plan.get("Relation Name") in SCANNED or plan.get("Index Name", "").startswith("pgqueue_"):
        read = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * plan.get(
            "Actual Loops", 1
        )
        if read > MAX_ROWS_READ:
            found.append(f"{plan.get('Node Type')} {plan.get('Index Name', '')}: {read:,.0f}")
    for child in plan.get("Plans", []):
        found += large_reads(child)
    return found


def explain(sql: str, analyze: bool = False, settings: str = "") -> dict[str, Any]:
    with transaction.atomic(), connection.cursor() as cur:
        if settings:
            cur.execute(settings)
        cur.execute(
            ("EXPLAIN (ANALYZE, FORMAT JSON) " if analyze else "EXPLAIN (FORMAT JSON) ") + sql
        )
        (plan,) = cur.fetchone()
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


@pytest.mark.slow
def test_no_request_scans_the_job_tables(api, admin_client):
    """Every query of /stats, /metrics, GET /jobs (first and a deep cursor page, filters
    that match nothing or a few jobs, a tenant key of a tenant with half the history),
    /tenants, the dashboard and the admin's job list, EXPLAINed on a million finished jobs
    and a few live ones: none reads pgqueue_job or pgqueue_job_attempt sequentially, nor
    reads more than MAX_ROWS_READ rows of them through an index (EXPLAIN ANALYZE).

    Before GET /jobs examined a bounded window of the jobs in reach, ``?queue=unknown``,
    ``?created_before=2000-…`` and ``?task=<rare>`` walked the whole primary key (or the
    whole table) looking for a page, and so did their count; a tenant key sorted every job
    of its tenant."""
    with connection.cursor() as cur:
        # Checked row by row, not queued until a commit that never comes (a deferred check
        # per attempt row would be held in memory and forbid the TRUNCATE below).
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cur.execute(FILL_JOBS, {"n": 1_000_000})
        # Before the attempts: their foreign-key checks are planned on pgqueue_job's figures,
        # and an earlier run's ANALYZE of the empty table would have them scan it per row.
        cur.execute("ANALYZE pgqueue_job")
        cur.execute(FILL_ATTEMPTS)
        cur.execute(FILL_TENANTS)
    for state in ("queued", "queued", "scheduled", "running"):
        make_job(state, tenant="tenant-1")
    with connection.cursor() as cur:
        cur.execute("ANALYZE pgqueue_job")
        cur.execute("ANALYZE pgqueue_job_attempt")
        cur.execute("ANALYZE pgqueue_tenant")
    try:
        low = Job.objects.order_by("id").values_list("id", flat=True)[0]
        deep = _encode_cursor("n", low + 400_000)
        big = client(new_key(tenant="tenant-big"))
        requests = [
            (api, "/stats"),
            (api, "/metrics"),
            (api, "/jobs"),
            (api, f"/jobs?cursor={deep}"),
            (api, "/jobs?queue=unknown"),
            (api, "/jobs?created_before=2000-01-01T00:00:00Z"),
            (api, "/jobs?task=test.rare"),
            (api, "/jobs?task=test.rare&status=dead&queue=other"),
            (api, f"/jobs?task=test.rare&cursor={_encode_cursor('p', low + 400_000)}"),
            (big, "/jobs"),
            (big, "/jobs?task=test.rare"),
            (big, f"/jobs?status=dead&cursor={deep}"),
            (api, "/jobs?tenant=tenant-big&task=test.rare"),
            (api, "/tenants"),
            (admin_client, "/admin/pgqueue/dashboard/"),
            (admin_client, "/admin/pgqueue/job/"),
            (admin_client, "/admin/pgqueue/job/?task=test.rare"),
            (admin_client, "/admin/pgqueue/job/?q=test.rare"),
            (admin_client, "/admin/pgqueue/job/?q=unknown-key&o=3"),
            (admin_client, "/admin/pgqueue/job/?tenant=tenant-big&status__exact=dead&p=3"),
            (admin_client, f"/admin/pgqueue/job/?q={low + 10}"),
            (admin_client, "/admin/pgqueue/job/?_facets=1&status__exact=dead"),
        ]
        scans: dict[str, list[str]] = {}
        for who, url in requests:
            with CaptureQueriesContext(connection) as ctx:
                response = who.get(url)
            assert response.status_code == 200, (url, response.content[:300])
            # Each SELECT with the planner settings its transaction ran it under (the
            # SET LOCAL of BOUNDED_COUNT_PLANS, until that transaction's COMMIT).
            selects, settings = [], ""
            for q in ctx.captured_queries:
                text = q["sql"].lstrip()
                if text.upper().startswith("SET LOCAL"):
                    settings = text
                elif text.upper().startswith(("COMMIT", "ROLLBACK")):
                    settings = ""
                elif text.upper().startswith(("SELECT", "WITH", "(")):
                    selects.append((settings, q["sql"]))
            assert selects, url
            for settings, sql in selects:
                found = seq_scans(explain(sql, settings=settings)) + large_reads(
                    explain(sql, analyze=True, settings=settings)
                )
                if found:
                    scans[f"{url}: {sql[:160]}"] = found
        assert not scans, scans
        page = api.get(f"/jobs?cursor={deep}").json()
        assert ids(page) == list(range(low + 399_999, low + 399_949, -1))
        assert page["count_is_estimate"] is True and page["count"] > 900_000
    finally:
        with connection.cursor() as cur:  # ANALYZE's figures outlive the test's rollback
            cur.execute("TRUNCATE pgqueue_job_attempt, pgqueue_job_dependency, pgqueue_job")
            cur.execute("ANALYZE pgqueue_job")
            cur.execute("ANALYZE pgqueue_job_attempt")
