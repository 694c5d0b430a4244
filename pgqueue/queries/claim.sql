-- The claim: what a worker's turn runs, in one transaction and one round trip
-- (claim_store.turn): TURN_PLAN, LIMIT_LOCK_TURN, then the outcomes (JOB_COMPLETE_MANY,
-- JOB_FAIL_MANY of pgqueue.sql), then JOB_CLAIM. Each statement is written here whole, as
-- PostgreSQL runs it; values are parameters (%(name)s). A header says what a statement
-- does and why it is shaped so, what it locks, which indexes serve it and who calls it.
--
-- Lock order, which keeps turns, exits and maintenance free of deadlocks: job rows before
-- limit rows; limit rows in id order. Only LIMIT_LOCK_TURN, the first statement of a turn,
-- waits for limit rows; JOB_CLAIM takes any other limit row SKIP LOCKED (a row another
-- turn holds is passed over this once: the claim starts fewer, never more).


-- name: TURN_PLAN
-- For the rest of the turn's transaction: run its statements' generic plans (psycopg
-- prepares them) and compile none. JOB_CLAIM's generic plan is the right one (one range
-- scan of the claim index per queue, in order), but PostgreSQL prices it as though 10% of
-- each queue were read, since LIMIT's value is a parameter; left to choose, it would plan
-- every claim afresh (about 3 ms, longer than running it) and, at that price, compile it
-- with JIT on each run (about 2 s).
-- Locks: nothing. Index: none.
-- Called by: claim_store.turn, first in every turn.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('jit', 'off', true)


-- name: LIMIT_LOCK_TURN
-- Lock, waiting, what a turn will change: the rows of the jobs whose outcomes it records
-- (%(ids)s: this worker's running jobs), then, in id order, the limit rows they were
-- counted in and the own rows (tenant '') of the worker's queues (%(queues)s). The
-- outcomes then give their slots back and the claim reads the queues' rows at their true
-- values, under the turn's own locks: a queue's cap, pause and rate limit are a budget
-- that one turn at a time reads and takes. Returns the limit rows locked.
-- Locks: those job rows and limit rows until the turn commits. Workers of a queue with its
--   own row take their turns one after another; others wait for nothing here.
-- Index: pgqueue_job_pkey; pgqueue_limit_scope (the queues' rows) and pgqueue_limit_pkey.
-- Called by: claim_store.turn, after TURN_PLAN; claim_store.complete_and_claim and
--   claim_store.lock_turn (a recorder's batch of successes and failures), first.
WITH exits AS MATERIALIZED (
    SELECT limit_ids FROM pgqueue_job
     WHERE id = ANY(%(ids)s::bigint[]) AND status = 'running' AND lease_owner = %(worker)s
     ORDER BY id
       FOR UPDATE
)
SELECT id FROM pgqueue_limit
 WHERE id = ANY(ARRAY(SELECT unnest(limit_ids) FROM exits
                      UNION ALL
                      SELECT id FROM pgqueue_limit
                       WHERE tenant = '' AND queue = ANY(%(queues)s::text[])))
 ORDER BY id
   FOR UPDATE


-- name: JOB_CLAIM
-- Claim up to %(limit)s jobs of the queues %(queues)s for one worker: a lease of %(lease)s
-- seconds, attempts + 1, each job recording the limit rows it is counted in (limit_ids)
-- and each of those rows counting it (running + 1, a token spent). Returns them, with
-- what running them needs: the workflow step a job is, and the W3C trace context it
-- recorded at its enqueue (its attempt's span is a child of it: pgqueue.tracing).
-- Candidates, in claim order (priority DESC, vtime, id):
-- - open: each queue's best %(limit)s jobs of the claim index (ungated: no tenant limit
--   applies to them), locked as read; w, pairs: the (queue, tenant) pairs with gated
--   jobs, by a skip scan of pgqueue_job_gated (one descent per pair: a limited tenant
--   with nothing queued costs nothing). Each with ``ids``, the limit rows that apply to
--   it in the statement's snapshot and limit something (a cap, a rate, a pause): a
--   tenant's in every queue (''), the tenant's in this queue, the queue's own; none read
--   for the open jobs while pgqueue_limit is empty (one probe, not one per job).
-- - locked: those rows, locked in id order, SKIP LOCKED, with their true room (free) and
--   tokens.
-- - candidates: the open jobs whose rows are all locked, and the next jobs of each pair
--   whose rows are all locked, at most its true room, locked as read.
-- - ranked, picked: each candidate's rank among those counting in the same row (none read
--   for a job counted in no row: no function scan); the best
--   %(limit)s whose rows are all locked and whose rank in each is within its room, queue
--   by queue rank by rank (vtimes of different queues are not comparable). Ranks are the
--   candidates', which a pick's rank among the picks never exceeds: no row starts more
--   than its room. An ungated job of a tenant limited since it was queued (an enqueue
--   whose transaction was open as the limit was set) is counted like a gated one.
-- Locks: the candidates, FOR UPDATE SKIP LOCKED (N workers take N different jobs; those
--   not picked stay locked, unclaimed, until the turn commits); limit rows as above.
-- Indexes: pgqueue_job_claim (one range scan per queue, in order), pgqueue_job_gated (the
--   skip scan and one range scan per pair with room), pgqueue_limit_scope and
--   pgqueue_limit_pkey, pgqueue_job_pkey (the lease, by id).
-- Time: ``at``, the claim's moment (claimed_at, the lease's start, the tokens' refill), is
--   clock_timestamp() as the statement runs, not now(): the turn's transaction may have
--   waited for limit rows in LIMIT_LOCK_TURN since it began, and a slot or a token taken
--   after that wait must not be dated before it (an attempt would seem to overlap the one
--   whose slot it took, and a refill dated back would credit that time twice).
-- Called by: claim_store.turn, after LIMIT_LOCK_TURN and the outcomes; claim_store.claim.
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
