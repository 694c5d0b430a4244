-- The limits wing: setting a scope's limits, gating its jobs, waking workers, the next
-- token of a rate limit, and maintenance's safety net over the counters. Each statement is
-- written here whole, as PostgreSQL runs it; values are parameters (%(name)s). A header
-- says what a statement does and why, what it locks, which indexes serve it and who calls
-- it. A row "limits something" when it has a cap, a rate limit or a pause:
-- (max_running IS NOT NULL OR rate_count IS NOT NULL OR paused).


-- name: LIMIT_SET
-- Create or change one scope's limits: only the fields flagged %(set_max)s / %(set_rate)s
-- / a non-NULL %(paused)s change. A new or changed rate starts with a full bucket (the
-- burst). Creates the tenant if new (as a weight does). Returns the row's id and whether
-- it limits anything now.
-- Locks: the scope's row (upsert), until the caller's transaction ends; a claim holding it
--   makes this wait the claim's few milliseconds.
-- Index: pgqueue_limit_scope (tenant, queue).
-- Called by: limits_store.set_limit, from limits.set_limits (Python, HTTP, admin).
WITH tenant_row AS (
    INSERT INTO pgqueue_tenant (name, weight) SELECT %(tenant)s, 1.0 WHERE %(tenant)s <> ''
    ON CONFLICT (name) DO NOTHING
)
INSERT INTO pgqueue_limit AS l (queue, tenant, max_running, rate_count, rate_seconds, paused,
                                tokens, refilled_at, running)
VALUES (%(queue)s, %(tenant)s, %(max_running)s, %(rate_count)s, %(rate_seconds)s,
        COALESCE(%(paused)s::boolean, FALSE),
        GREATEST(1, ceil(COALESCE(%(rate_count)s, 0) / 10.0)), now(), 0)
ON CONFLICT (tenant, queue) DO UPDATE
   SET max_running = CASE WHEN %(set_max)s THEN EXCLUDED.max_running ELSE l.max_running END,
       rate_count = CASE WHEN %(set_rate)s THEN EXCLUDED.rate_count ELSE l.rate_count END,
       rate_seconds = CASE WHEN %(set_rate)s THEN EXCLUDED.rate_seconds
                           ELSE l.rate_seconds END,
       tokens = CASE WHEN %(set_rate)s THEN GREATEST(1, ceil(COALESCE(EXCLUDED.rate_count, 0)
                                                   / 10.0)) ELSE l.tokens END,
       refilled_at = CASE WHEN %(set_rate)s THEN now() ELSE l.refilled_at END,
       paused = COALESCE(%(paused)s::boolean, l.paused),
       updated_at = now()
RETURNING l.id, (l.max_running IS NOT NULL OR l.rate_count IS NOT NULL OR l.paused)


-- name: JOB_GATE_SCOPE
-- Gate up to %(limit)s ungated queued jobs of a tenant (in one queue, or in all with an
-- empty %(queue)s) that a limit now applies to, so that their backlog waits outside the
-- claim index (the claim counts one it meets ungated all the same).
-- Locks: the chosen job rows, FOR UPDATE SKIP LOCKED (a job being claimed is left to the
--   claim), until the caller's transaction ends.
-- Index: pgqueue_job_tenant_status (tenant, status).
-- Called by: limits_store.regate, from limits.set_limits.
WITH chosen AS MATERIALIZED (
    SELECT id FROM pgqueue_job
     WHERE tenant = %(tenant)s AND status = 'queued' AND NOT gated
       AND (%(queue)s = '' OR queue = %(queue)s)
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE pgqueue_job j SET gated = TRUE FROM chosen c WHERE j.id = c.id RETURNING j.id


-- name: JOB_UNGATE_SCOPE
-- Return to the claim index up to %(limit)s gated jobs of a tenant (one queue, or all with
-- an empty %(queue)s) that no limit applies to any more. Those left (a later batch) are
-- still claimed: the claim takes the gated jobs of a row that limits nothing without a cap.
-- Locks: the chosen job rows, FOR UPDATE SKIP LOCKED, until the caller's transaction ends.
-- Index: pgqueue_job_tenant_status (tenant, status); pgqueue_limit_scope per job.
-- Called by: limits_store.regate, from limits.set_limits.
WITH chosen AS MATERIALIZED (
    SELECT id FROM pgqueue_job j
     WHERE j.tenant = %(tenant)s AND j.status = 'queued' AND j.gated
       AND (%(queue)s = '' OR j.queue = %(queue)s)
       AND NOT EXISTS (
        SELECT 1 FROM pgqueue_limit gl
         WHERE gl.tenant = j.tenant AND gl.queue IN ('', j.queue) AND (gl.max_running IS NOT NULL OR gl.rate_count IS NOT NULL OR gl.paused))
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE pgqueue_job j SET gated = FALSE FROM chosen c WHERE j.id = c.id RETURNING j.id


-- name: QUEUE_NOTIFY_SERVED
-- Wake the workers of a queue (%(queue)s), or with an empty one of every queue a live
-- worker serves: a limit was raised or lifted, or a pause ended. Delivered on commit.
-- Locks: nothing. Index: none: pgqueue_worker holds a day of worker rows at most.
-- Called by: limits_store.notify, from limits.set_limits.
SELECT pg_notify(%(channel)s, q) IS NULL FROM (
    SELECT DISTINCT jsonb_array_elements_text(queues) AS q
      FROM pgqueue_worker WHERE stopped_at IS NULL AND %(queue)s = ''
    UNION SELECT %(queue)s WHERE %(queue)s <> '') s


-- name: LIMIT_NEXT_TOKEN
-- Seconds until a rate limit that holds back work of %(queues)s has its next token; NULL
-- when none does. A worker whose claim came up short sleeps no longer than this, so a
-- rate-limited backlog starts when allowed, not at the next poll. A rate-limited row
-- counts only while it holds something back: its scope has jobs queued (a tenant's row:
-- gated jobs of the tenant in these queues, or in its own queue; a queue's row: any job
-- of the queue), and neither it nor a wider row of its tenant ('' : every queue) is paused
-- or at its cap (a token would then start nothing). An idle rate-limited tenant, however
-- full or empty its bucket, wakes nobody. A bucket that holds a token already (refilled
-- since the claim, or the claim lost a race for the row) gives one token's period: a
-- look again soon, never a wait of 0, which would have the worker claim in a loop.
-- Locks: nothing.
-- Index: a scan of pgqueue_limit (one row per limited scope) for its rate-limited rows;
--   per such row, pgqueue_limit_scope (its tenant's wider row) and pgqueue_job_gated (a
--   tenant's queued jobs: one probe) or pgqueue_job_claim and pgqueue_job_gated (a
--   queue's).
-- Called by: limits_store.next_token_in, from the worker runtime after a short claim.
SELECT min(CASE WHEN b.tokens >= 1 THEN 1 ELSE 1 - b.tokens END
           * l.rate_seconds / l.rate_count)
  FROM pgqueue_limit l CROSS JOIN LATERAL (SELECT pgqueue_limit_tokens(l, COALESCE(%(now)s::timestamptz, now())) AS tokens) b
 WHERE l.rate_count IS NOT NULL
   AND (l.queue = '' OR l.queue = ANY(%(queues)s::text[]))
   AND NOT EXISTS (  -- paused or at its cap, or its tenant's row in every queue is
        SELECT 1 FROM pgqueue_limit c
         WHERE c.tenant = l.tenant AND c.queue IN ('', l.queue)
           AND (c.paused OR c.running >= c.max_running))
   AND CASE WHEN l.tenant = '' THEN  -- a queue's own row: any job of the queue queued
            EXISTS (SELECT 1 FROM pgqueue_job j
                     WHERE j.queue = l.queue AND j.status = 'queued' AND NOT j.gated)
            OR EXISTS (SELECT 1 FROM pgqueue_job j
                        WHERE j.queue = l.queue AND j.status = 'queued' AND j.gated)
       ELSE EXISTS (SELECT 1 FROM pgqueue_job j  -- a tenant's: its gated jobs here
                     WHERE j.queue = ANY(CASE WHEN l.queue = '' THEN %(queues)s::text[]
                                              ELSE ARRAY[l.queue] END)
                       AND j.tenant = l.tenant AND j.status = 'queued' AND j.gated)
       END


-- name: LIMIT_DRIFTED
-- The recount's first look: the limit rows whose ``running`` differs from the number of
-- running jobs counted in them (their ``limit_ids``), in this statement's one snapshot. A
-- claim moves a counter in the statement that leases the jobs, and every exit in the
-- statement that ends them, so in any one snapshot the two agree: a row listed here has
-- drifted (something bypassed pgqueue). Only these rows are then locked and recounted
-- (LIMIT_LOCK_MANY, LIMIT_RECOUNT), so that the safety net neither locks nor writes the
-- rows of a service that caps each of its tenants on every pass.
-- Locks: nothing.
-- Index: pgqueue_job_lease (the running jobs); a scan of pgqueue_limit (one row per
--   limited scope), read only.
-- Called by: limits_store.recount, from maintenance every LIMITS_RECOUNT_SECONDS.
WITH counts AS (
    SELECT u.lid, count(*) AS n
      FROM pgqueue_job j CROSS JOIN LATERAL unnest(j.limit_ids) AS u(lid)
     WHERE j.status = 'running'
     GROUP BY u.lid
)
SELECT l.id
  FROM pgqueue_limit l LEFT JOIN counts c ON c.lid = l.id
 WHERE l.running <> COALESCE(c.n, 0)
 ORDER BY l.id


-- name: LIMIT_LOCK_MANY
-- Lock the limit rows %(ids)s, in id order (the claims' and the decrements' order), so
-- that LIMIT_RECOUNT, the next statement of the same transaction, counts with a snapshot
-- taken after every change to them has committed or is waiting on these locks.
-- Locks: those rows until maintenance's transaction ends (claims skip them meanwhile;
--   decrements wait).
-- Index: pgqueue_limit_pkey.
-- Called by: limits_store.recount, when LIMIT_DRIFTED found rows.
SELECT id FROM pgqueue_limit
 WHERE id = ANY(%(ids)s::bigint[])  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
 ORDER BY id FOR UPDATE


-- name: LIMIT_RECOUNT
-- The safety net: set each of the limit rows %(ids)s (locked by LIMIT_LOCK_MANY) to the
-- number of running jobs counted in it, from this statement's fresh snapshot (READ
-- COMMITTED), so a counter can never drift forever. Returns the rows corrected with their
-- old and new counts.
-- Locks: the rows (already held).
-- Index: pgqueue_job_lease (the running jobs), pgqueue_limit_pkey.
-- Called by: limits_store.recount, right after LIMIT_LOCK_MANY.
WITH counts AS (
    SELECT u.lid, count(*) AS n
      FROM pgqueue_job j CROSS JOIN LATERAL unnest(j.limit_ids) AS u(lid)
     WHERE j.status = 'running' AND j.limit_ids && %(ids)s::bigint[]
     GROUP BY u.lid
),
fixed AS (
    SELECT l.id, l.running AS was, COALESCE(c.n, 0) AS now
      FROM pgqueue_limit l LEFT JOIN counts c ON c.lid = l.id
     WHERE l.id = ANY(%(ids)s::bigint[])  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
       AND l.running <> COALESCE(c.n, 0)
)
UPDATE pgqueue_limit l SET running = f.now FROM fixed f WHERE l.id = f.id
RETURNING l.id, f.was, f.now


-- name: LIMIT_DELETE_UNUSED
-- Deletes the limit rows left with nothing to do: no cap, no rate limit, no pause, no
-- running job counted in them, and (a tenant's row) no gated job of their scope left. Once
-- no row applies to a job, the claim counts it in none.
-- Returns the ids deleted.
-- Locks: only the rows it deletes, each re-checked on its newest version once locked
--   (READ COMMITTED): a claim that counted a job in one meanwhile, or a LIMIT_SET that made
--   it limit something again, committed first, leaves it in place; a claim that would
--   count in one it holds skips it (SKIP LOCKED); an exit's decrement waits (and then finds
--   nothing to give back: the row counted none); a LIMIT_SET upsert waits and then inserts
--   the scope's row afresh. No new gated job of a row's scope appears while the row limits
--   nothing (an enqueue gates a job only under a row that limits something).
-- Index: a scan of pgqueue_limit (one row per limited scope); pgqueue_job_gated per row
--   that limits nothing (its queue a range scan; a tenant-wide row reads the index's
--   tenant column across queues).
-- Called by: limits_store.delete_unused, from maintenance right after the recount.
DELETE FROM pgqueue_limit l
 WHERE NOT (l.max_running IS NOT NULL OR l.rate_count IS NOT NULL OR l.paused) AND l.running = 0
   AND (l.tenant = '' OR NOT EXISTS (
        SELECT 1 FROM pgqueue_job g
         WHERE g.tenant = l.tenant AND (l.queue = '' OR g.queue = l.queue)
           AND g.status = 'queued' AND g.gated))
RETURNING l.id
