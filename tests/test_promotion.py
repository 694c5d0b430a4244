"""Promotion cannot be stalled: a held clock delays its own level's jobs only, and a due job
whose clock row is missing is promoted (its clock created).

Each test also runs the statement promotion used before (``OLD_JOB_PROMOTE_DUE``: the oldest
due jobs first, LIMIT batch, then skipping those whose clock is locked or missing) on the
same data and shows that it promotes nothing there: the tests catch the stall they guard
against.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection, transaction

import pgqueue
from pgqueue import sql, store
from pgqueue.conf import pgqueue_settings
from pgqueue.fairness import fifo_param
from pgqueue.models import FairClock, Job
from pgqueue.worker.connection import connect, connect_params
from tests.conftest import later

BATCH = 5

# JOB_PROMOTE_DUE as it was: due jobs first (LIMIT batch, by run_at), their clocks second.
OLD_JOB_PROMOTE_DUE = f"""
WITH due AS MATERIALIZED (
    SELECT id, queue, tenant, priority, run_at FROM pgqueue_job
     WHERE status = 'scheduled' AND run_at <= {sql.NOW}
     ORDER BY run_at, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
clock AS MATERIALIZED (
    SELECT c.id, c.queue, c.tenant, c.priority FROM pgqueue_fair_clock c
     WHERE (c.queue, c.tenant, c.priority) IN (SELECT queue, tenant, priority FROM due)
     ORDER BY c.queue, c.tenant, c.priority
       FOR UPDATE OF c SKIP LOCKED
),
ranked AS (
    SELECT d.id, k.id AS clock_id,
           row_number() OVER (PARTITION BY k.id ORDER BY d.run_at, d.id) AS rank
      FROM due d
      JOIN clock k ON (k.queue, k.tenant, k.priority) = (d.queue, d.tenant, d.priority)
),
step AS (
    SELECT k.id, count(*) AS n,
           COALESCE((SELECT qw.weight FROM pgqueue_queue_weight qw
                      WHERE qw.tenant = k.tenant AND qw.queue = k.queue),
                    (SELECT t.weight FROM pgqueue_tenant t WHERE t.name = k.tenant),
                    1.0) AS w,
           COALESCE((SELECT hj.vtime FROM pgqueue_job hj
                      WHERE hj.queue = k.queue AND hj.priority = k.priority
                        AND hj.status = 'queued' AND NOT hj.gated
                      ORDER BY hj.vtime LIMIT 1),
                    (SELECT min(hg.vtime)
                       FROM (SELECT DISTINCT hl.tenant FROM pgqueue_limit hl
                              WHERE hl.tenant <> '') ht
                      CROSS JOIN LATERAL (
                            SELECT g.vtime FROM pgqueue_job g
                             WHERE g.queue = k.queue AND g.tenant = ht.tenant
                               AND g.priority = k.priority AND g.status = 'queued' AND g.gated
                             ORDER BY g.priority DESC, g.vtime LIMIT 1) hg),
                    (SELECT max(hc.vtime) FROM pgqueue_fair_clock hc
                      WHERE hc.queue = k.queue AND hc.priority = k.priority),
                    0.0) AS h
      FROM clock k JOIN ranked r ON r.clock_id = k.id
     GROUP BY k.id, k.queue, k.tenant, k.priority
),
bump AS (
    UPDATE pgqueue_fair_clock c
       SET vtime = GREATEST(c.vtime, s.h) + s.n / s.w
      FROM step s
     WHERE c.id = s.id
    RETURNING c.id, c.vtime - s.n / s.w AS start, s.w
),
promoted AS (
    UPDATE pgqueue_job j
       SET status = 'queued',
           vtime = CASE WHEN %(fifo)s THEN extract(epoch FROM now())::float8
                        ELSE b.start + r.rank / b.w END
      FROM ranked r JOIN bump b ON b.id = r.clock_id
     WHERE j.id = r.id
    RETURNING j.id, j.queue
)
SELECT id, pg_notify(%(channel)s, queue) IS NULL FROM promoted ORDER BY id
"""


def promote_old(now: object) -> list[int]:
    """The old statement, in a transaction rolled back afterwards (it must change nothing
    the new one is then tested on)."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            OLD_JOB_PROMOTE_DUE,
            {
                "limit": BATCH,
                "now": now,
                "fifo": fifo_param(),
                "channel": pgqueue_settings.NOTIFY_CHANNEL,
            },
        )
        promoted = [row[0] for row in cur.fetchall()]
        transaction.set_rollback(True)
    return promoted


def promote(now: object) -> list[int]:
    """One maintenance pass's promotion (store.promote_due), committed."""
    with transaction.atomic(), connection.cursor() as cur:
        return store.promote_due(cur, limit=BATCH, now=now)


@pytest.fixture
def other_connection() -> Iterator[psycopg.Connection]:
    conn = connect(connect_params(), autocommit=False)
    try:
        yield conn
    finally:
        conn.rollback()
        conn.close()


@pytest.mark.django_db(transaction=True)
def test_a_held_clock_delays_only_its_own_tenants_jobs(
    other_connection: psycopg.Connection,
) -> None:
    """Tenant A's clock row is locked by an open transaction (as an enqueue of A holds it),
    with more than a batch of A's due jobs at the front of the due order; B's due job, due
    after all of them, is still promoted by one pass, and A's wait for the next.

    This proves the clocks-first shape of JOB_PROMOTE_DUE (lock the clocks SKIP LOCKED,
    then take due jobs of the clocks it got). The old statement, taking the oldest BATCH
    due jobs and then skipping those of locked clocks, promotes nothing here.
    """
    a_ids = pgqueue.enqueue_many(
        "test.noop", [{"n": n} for n in range(BATCH + 2)], tenant="a", delay=10
    )
    (b_id,) = pgqueue.enqueue_many("test.noop", [{}], tenant="b", delay=20)
    now = later(3600)
    with other_connection.cursor() as cur:
        cur.execute("SELECT id FROM pgqueue_fair_clock WHERE tenant = 'a' FOR UPDATE")
        assert cur.fetchall()

    assert promote_old(now) == []

    assert promote(now) == [b_id]
    assert Job.objects.get(pk=b_id).status == "queued"
    assert set(Job.objects.filter(id__in=a_ids).values_list("status", flat=True)) == {"scheduled"}

    other_connection.rollback()  # the enqueue of A ends: its jobs are promoted next pass
    assert sorted(promote(now)) == sorted(a_ids)[:BATCH]


@pytest.mark.django_db(transaction=True)
def test_a_due_job_whose_clock_row_is_missing_is_promoted_and_its_clock_created() -> None:
    """A due job whose (queue, tenant, priority) clock row was deleted is promoted with a
    vtime, and the clock is there again, charged for it.

    This proves FAIR_CLOCK_ENSURE_DUE (run by store.promote_due before JOB_PROMOTE_DUE).
    The old statement, which promoted only the jobs whose clock it could lock, leaves the
    job scheduled for ever.
    """
    (job_id,) = pgqueue.enqueue_many("test.noop", [{}], tenant="c", delay=10)
    FairClock.objects.filter(tenant_id="c").delete()
    now = later(3600)

    assert promote_old(now) == []
    assert not FairClock.objects.filter(tenant_id="c").exists()

    assert promote(now) == [job_id]
    job = Job.objects.get(pk=job_id)
    assert job.status == "queued" and job.vtime is not None
    clock = FairClock.objects.get(tenant_id="c", queue=job.queue, priority=job.priority)
    assert clock.vtime >= job.vtime


@pytest.mark.django_db(transaction=True)
def test_the_statement_promotes_at_most_a_batch_oldest_first_across_tenants() -> None:
    """Bounded: one pass promotes at most ``limit`` jobs, the oldest due first, across the
    levels it locked."""
    first = pgqueue.enqueue_many("test.noop", [{}] * 3, tenant="x", delay=10)
    second = pgqueue.enqueue_many("test.noop", [{}] * 3, tenant="y", delay=20)
    third = pgqueue.enqueue_many("test.noop", [{}] * 3, tenant="x", delay=30)
    now = later(3600)
    assert sorted(promote(now)) == sorted(first + second[:2])
    assert sorted(promote(now)) == sorted(second[2:] + third)
    assert promote(now) == []
