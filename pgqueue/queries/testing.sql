-- The statements of pgqueue.testing: running a test's jobs in the test's own process and
-- transaction (``run_jobs``), on Django's connection. They serve tests only, on a test
-- database's few rows; no worker, admin page or API request runs them. Each is written
-- whole, as PostgreSQL runs it; values are parameters (%(name)s). Outcomes are recorded by
-- the worker's own statements (the recorder's JOB_COMPLETE_MANY, JOB_FAIL_MANY, KEY_SETTLE)
-- and scheduled jobs made runnable by JOB_PROMOTE_MANY, as maintenance and "run now" do.
--
-- Filters: %(tasks)s, %(tenants)s and %(queues)s are arrays of names, NULL for "any".


-- name: JOB_QUEUES_MATCHING
-- The queues that hold runnable jobs of the tasks and tenants asked for (among %(queues)s),
-- by name: the queues JOB_CLAIM_MATCHING claims from, as a worker's --queues, at equal
-- priority in this order.
-- Locks: nothing (a plain read).
-- Index: none fits every queued job (the claim indexes split them by gate and key state):
--   a scan of the test database's table.
-- Called by: pgqueue.testing.JobRunner (run_jobs), before each claim.
SELECT DISTINCT queue FROM pgqueue_job
 WHERE status = 'queued'
   AND (%(tasks)s::text[] IS NULL OR task = ANY(%(tasks)s::text[]))
   AND (%(tenants)s::text[] IS NULL OR tenant = ANY(%(tenants)s::text[]))
   AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
 ORDER BY queue


-- name: JOB_SCHEDULED_MATCHING
-- The scheduled jobs of the tasks, tenants and queues asked for whose run_at is at or before
-- %(until)s (NULL: all of them), but those of %(skip)s (given back for want of a handler),
-- soonest first, at most %(limit)s; ``due``: whether run_at has come by the database's
-- clock (%(clock)s). run_jobs makes the due ones runnable as maintenance does
-- (JOB_PROMOTE_MANY, run_at kept) and the others as the admin's "run now" does
-- (JOB_MAKE_DUE_MANY first): the test moved time for them (include_scheduled, now).
-- Locks: nothing (a plain read; the promotion locks and re-checks each row).
-- Index: pgqueue_job_scheduled (run_at, scheduled jobs only).
-- Called by: pgqueue.testing.JobRunner (run_jobs), before each claim.
SELECT id, run_at <= %(clock)s::timestamptz AS due FROM pgqueue_job
 WHERE status = 'scheduled'
   AND (%(until)s::timestamptz IS NULL OR run_at <= %(until)s::timestamptz)
   AND (%(tasks)s::text[] IS NULL OR task = ANY(%(tasks)s::text[]))
   AND (%(tenants)s::text[] IS NULL OR tenant = ANY(%(tenants)s::text[]))
   AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
   AND id <> ALL(%(skip)s::bigint[])
 ORDER BY run_at, id
 LIMIT %(limit)s


-- name: JOB_CLAIM_MATCHING
-- JOB_CLAIM of claim.sql (whose header says what it does, locks and uses), but only for
-- jobs of the tasks %(tasks)s and tenants %(tenants)s (NULL: any): the four lines marked
-- "-- matching", in the open jobs and in the next jobs of each gated pair. Every other line
-- is JOB_CLAIM's, so a test's jobs are claimed in the order, and under the limits,
-- concurrency keys and leases, that a worker's claim would give them;
-- tests/test_testing_helpers.py fails when the two differ by anything else (change both).
-- Locks: as JOB_CLAIM.
-- Indexes: as JOB_CLAIM; the filters are checked on the rows its range scans read.
-- Called by: pgqueue.testing.JobRunner (run_jobs), one job at a time (%(limit)s = 1).
WITH RECURSIVE at AS (SELECT COALESCE(%(now)s::timestamptz, clock_timestamp()) AS at),
queues AS (SELECT name, ord FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS q(name, ord)),
open AS MATERIALIZED (
    SELECT j.id, j.priority, j.vtime, q.ord, CASE WHEN (SELECT EXISTS (SELECT FROM pgqueue_limit))
               THEN ARRAY(SELECT id FROM pgqueue_limit WHERE tenant IN (j.tenant, '')
                             AND queue IN (j.queue, '') AND (num_nonnulls(max_running, rate_count) > 0
                                 OR paused)) ELSE '{}' END AS ids
      FROM queues q CROSS JOIN LATERAL (
           SELECT id, queue, tenant, priority, vtime FROM pgqueue_job
            WHERE queue = q.name AND status = 'queued' AND NOT gated
              AND (%(tasks)s::text[] IS NULL OR task = ANY(%(tasks)s::text[]))  -- matching
              AND (%(tenants)s::text[] IS NULL OR tenant = ANY(%(tenants)s::text[]))  -- matching
            ORDER BY priority DESC, vtime, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) j
),
w(queue, ord, tenant) AS (
    SELECT q.name, q.ord, (SELECT tenant FROM pgqueue_job WHERE queue = q.name
                              AND status = 'queued' AND gated ORDER BY tenant LIMIT 1)
      FROM queues q
    UNION ALL
    SELECT w.queue, w.ord, (SELECT tenant FROM pgqueue_job WHERE queue = w.queue
                               AND status = 'queued' AND gated AND tenant > w.tenant
                             ORDER BY tenant LIMIT 1)
      FROM w WHERE w.tenant IS NOT NULL
),
pairs AS MATERIALIZED (
    SELECT w.queue, w.ord, w.tenant, ARRAY(
               SELECT id FROM pgqueue_limit WHERE tenant IN (w.tenant, '') AND queue IN (w.queue, '')
                  AND (num_nonnulls(max_running, rate_count) > 0 OR paused)) AS ids
      FROM w WHERE w.tenant IS NOT NULL
),
locked AS MATERIALIZED (
    SELECT l.id, pgqueue_limit_tokens(l, a.at) AS tokens,
           pgqueue_limit_room(l, a.at, %(limit)s) AS free
      FROM pgqueue_limit l, at a
     WHERE l.id = ANY(ARRAY(SELECT unnest(ids) FROM open UNION SELECT unnest(ids) FROM pairs))
     ORDER BY l.id FOR UPDATE OF l SKIP LOCKED
),
candidates AS MATERIALIZED (
    SELECT id, priority, vtime, ord, ids FROM open WHERE ids <@ ARRAY(SELECT id FROM locked)
    UNION ALL
    SELECT j.id, j.priority, j.vtime, p.ord, p.ids FROM pairs p CROSS JOIN LATERAL (
           SELECT id, priority, vtime FROM pgqueue_job
            WHERE queue = p.queue AND tenant = p.tenant AND status = 'queued' AND gated
              AND (%(tasks)s::text[] IS NULL OR task = ANY(%(tasks)s::text[]))  -- matching
              AND (%(tenants)s::text[] IS NULL OR tenant = ANY(%(tenants)s::text[]))  -- matching
            ORDER BY priority DESC, vtime, id
            LIMIT COALESCE((SELECT min(free) FROM locked WHERE id = ANY(p.ids)), %(limit)s)
              FOR UPDATE SKIP LOCKED) j
     WHERE p.ids <@ ARRAY(SELECT id FROM locked)
),
ranked AS MATERIALIZED (
    SELECT c.id, k.free, row_number() OVER (PARTITION BY k.id ORDER BY c.priority DESC, c.vtime, c.id) AS rank
      FROM candidates c CROSS JOIN LATERAL unnest(c.ids) AS r(lid) JOIN locked k ON k.id = r.lid
     WHERE c.ids <> '{}'
),
picked AS MATERIALIZED (
    SELECT id, ids FROM (
        SELECT *, row_number() OVER (PARTITION BY ord ORDER BY priority DESC, vtime, id) AS n
          FROM candidates
         WHERE id <> ALL(ARRAY(SELECT id FROM ranked WHERE rank > free))) c
     ORDER BY priority DESC, n, ord
     LIMIT %(limit)s
),
leased AS (
    UPDATE pgqueue_job j
       SET status = 'running', attempts = j.attempts + 1, lease_owner = %(worker)s,
           claimed_at = a.at, lease_expires_at = a.at + %(lease)s * interval '1 second',
           started_at = NULL, limit_ids = NULLIF(p.ids, '{}')
      FROM picked p, at a
     WHERE j.id = p.id
    RETURNING j.id, task, payload::text, tenant, queue, priority, attempts, max_attempts,
              lease_expires_at, vtime, timeout_seconds, limit_ids, lost_claims, concurrency_key, workflow_id, step, traceparent, tracestate
),
counted AS (
    UPDATE pgqueue_limit l
       SET running = l.running + c.n, tokens = COALESCE(k.tokens - c.n, l.tokens),
           refilled_at = CASE WHEN k.tokens IS NULL THEN l.refilled_at ELSE a.at END
      FROM (SELECT lid, count(*) AS n FROM leased, unnest(limit_ids) AS lid GROUP BY lid) c
      JOIN locked k ON k.id = c.lid CROSS JOIN at a
     WHERE l.id = c.lid AND l.id = ANY(ARRAY(SELECT id FROM locked))
)
SELECT * FROM leased
