-- Enqueueing: jobs into a tenant's fair clock at their level (queue, priority), runnable
-- or scheduled, with the first job at a level, the queue bound and idempotency keys.
-- Each statement is written here whole, as PostgreSQL runs it; values are parameters
-- (%(name)s). A header says what a statement does and why, what it locks, which indexes
-- serve it and who calls it; pgqueue/sql.py states the conventions they share.
--
-- What the statements share:
-- - Each new job's id comes back; its run_at, created_at and vtime only when one job is
--   enqueued (%(n)s = 1): a bulk enqueue needs ids alone, and on Django's connection a
--   timestamptz costs the client tens of µs to load against well under 1 µs for an id
--   (1,000 rows with two timestamps each doubled the statement's time); NULLs cost nothing.
-- - The *_FIRST statements (a level new to the tenant) read ``own``: whether the tenant
--   has a fair clock in the queue and at the level (a range of pgqueue_fair_clock_uniq),
--   and ``admit``: the idempotency key is free (a taken one enqueues nothing and is not
--   refused: the caller returns its job) and the queue is one of the tenant's, or
--   %(max_queues)s is NULL, or the tenant has clocks in fewer than %(max_queues)s queues
--   (counted only for a queue new to the tenant, an index-only range of
--   pgqueue_fair_clock_tenant). Enqueues into new queues at once do not see one another's
--   new clocks (uncommitted), so together they pass the bound by at most their number.
-- - A *_FIRST statement that inserted nothing returns one row whose ``state`` says why:
--   'taken' (the idempotency key is taken: nothing charged), 'refused' (a queue new to a
--   tenant at MAX_QUEUES_PER_TENANT), 'known' (the snapshot shows the tenant's clock at
--   the level after all: the caller runs JOB_ENQUEUE again) and 'raced' (the level's
--   largest clock was deleted by FAIR_CLOCK_DELETE_IDLE while the statement waited for
--   it: the caller runs the statements again, with a snapshot that shows the deletion).
-- - The tenant row is created with DO NOTHING, which takes no row lock on an existing
--   tenant, so enqueues never queue behind a weight change.
-- - Every job of a statement records the same W3C trace context, %(traceparent)s and
--   %(tracestate)s (NULL: none; pgqueue.tracing, checked by store.enqueue): the enqueue's
--   producer span, which its attempts' spans are children of.


-- name: JOB_ENQUEUE
-- A job of a tenant a limit applies to is enqueued gated (out of the claim index: its gate CTE).
-- Enqueue 1..1,000 runnable jobs of one task, tenant, queue and priority in one statement,
-- the tenant having a fair clock at that level (queue, priority): the common case. Returns
-- each new job's id, run_at, created_at and vtime, then its wake-up and a NULL state.
-- An idempotency key already taken (and committed) is seen before the clock is charged, so
-- the tenant pays no virtual time for it: one row says 'taken'. Racing duplicates are
-- settled by ON CONFLICT; the loser is told (a NULL id) and refunds the clock with
-- FAIR_CLOCK_REFUND. pg_notify is delivered only on commit: a rolled-back enqueue leaves no
-- job, no charged virtual time and no wake-up.
-- No row at all: the tenant has no clock at the level in this statement's snapshot, or
-- had one that FAIR_CLOCK_DELETE_IDLE deleted while this statement waited for its lock.
-- Nothing was written, and store.enqueue runs JOB_ENQUEUE_FIRST, whose snapshot is newer
-- than the deletion. The clock is charged by an UPDATE, not an upsert, for that reason:
-- an upsert would create again, from the head of its snapshot, a clock a prune deleted
-- (and the level's scale with it, see "Idle fair clocks"). The first job at a level is
-- the other statement's so that this one, the common case, plans and starts no more nodes
-- than the upsert it replaces (a second data-modifying CTE and a row lock here cost every
-- enqueue about 0.5 ms, measured; the first job at a level pays a second round trip).
-- The tenant row is ensured only once the clock is charged.
-- Locks: the tenant's fair-clock row for (queue, tenant, priority) (the UPDATE), until the
--   caller's transaction ends. Concurrent enqueues of one tenant at one level therefore
--   serialise and get distinct vtimes; other tenants are not blocked.
-- Indexes: pgqueue_fair_clock_uniq (the UPDATE), pgqueue_job_claim and
--   pgqueue_fair_clock_level (the level head, one tuple each), pgqueue_job_idempotency.
-- Called by: store.enqueue, from services.enqueue / enqueue_many (the Python API, the HTTP
--   API and the Tasks backend) and schedules._fire, inside the caller's transaction.
WITH weight AS (SELECT COALESCE(
        (SELECT qw.weight FROM pgqueue_queue_weight qw
          WHERE qw.tenant = %(tenant)s AND qw.queue = %(queue)s),
        (SELECT t.weight FROM pgqueue_tenant t WHERE t.name = %(tenant)s),
        1.0) AS w),
head AS (SELECT COALESCE(
        (SELECT hj.vtime FROM pgqueue_job hj
          WHERE hj.queue = %(queue)s AND hj.priority = %(priority)s AND hj.status = 'queued'
            AND NOT hj.gated
          ORDER BY hj.vtime LIMIT 1),
        (SELECT min(hg.vtime)
           FROM (SELECT DISTINCT hl.tenant FROM pgqueue_limit hl WHERE hl.tenant <> '') ht
          CROSS JOIN LATERAL (
                SELECT g.vtime FROM pgqueue_job g
                 WHERE g.queue = %(queue)s AND g.tenant = ht.tenant
                   AND g.priority = %(priority)s AND g.status = 'queued' AND g.gated
                 ORDER BY g.priority DESC, g.vtime LIMIT 1) hg),
        (SELECT max(hc.vtime) FROM pgqueue_fair_clock hc
          WHERE hc.queue = %(queue)s AND hc.priority = %(priority)s),
        0.0) AS h),
gate AS (SELECT EXISTS (
        SELECT 1 FROM pgqueue_limit gl
         WHERE gl.tenant = %(tenant)s AND gl.queue IN ('', %(queue)s) AND (gl.max_running IS NOT NULL OR gl.rate_count IS NOT NULL OR gl.paused)) AS g),
fresh AS (SELECT %(idempotency_key)s::text IS NULL OR NOT EXISTS (
           SELECT 1 FROM pgqueue_job dup
            WHERE dup.tenant = %(tenant)s AND dup.idempotency_key = %(idempotency_key)s) AS ok),
clock AS (
    UPDATE pgqueue_fair_clock c
       SET vtime = GREATEST(c.vtime + %(n)s / (SELECT w FROM weight),
                            (SELECT h FROM head) + %(n)s / (SELECT w FROM weight))
     WHERE c.queue = %(queue)s AND c.tenant = %(tenant)s AND c.priority = %(priority)s
       AND (SELECT ok FROM fresh)
    RETURNING c.vtime - %(n)s / (SELECT w FROM weight) AS start, (SELECT w FROM weight) AS w
),
tenant_row AS (  -- the tenant row, once there is a clock: a statement that finds none
    INSERT INTO pgqueue_tenant (name, weight) SELECT %(tenant)s, 1.0 FROM clock
    ON CONFLICT (name) DO NOTHING
),
inserted AS (
    INSERT INTO pgqueue_job (queue, tenant, task, payload, status, priority, vtime,
                             attempts, max_attempts, run_at, idempotency_key,
                             timeout_seconds, gated, concurrency_key, key_max_running,
                             key_state, traceparent, tracestate)
    SELECT %(queue)s, %(tenant)s, %(task)s, p.payload, 'queued', %(priority)s,
           CASE WHEN %(fifo)s THEN extract(epoch FROM now())::float8 ELSE clock.start + p.ord / clock.w END,
           0, %(max_attempts)s, now(), %(idempotency_key)s, %(timeout)s::float8,
           CASE WHEN k.key IS NULL THEN gate.g END,
           k.key, CASE WHEN k.key IS NOT NULL THEN %(key_max)s::int END,
           CASE WHEN k.key IS NULL THEN '' ELSE 'new' END,
           %(traceparent)s::text, %(tracestate)s::text
      FROM clock, gate, jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, ord)
           CROSS JOIN LATERAL (SELECT (%(keys)s::text[])[p.ord] AS key) k
     ORDER BY p.ord
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, run_at, created_at, vtime
)
-- One row per inserted job; a single row with a NULL id when the clock was charged but
-- ON CONFLICT inserted nothing (the caller refunds); a single row saying 'taken' when the
-- key was taken before (nothing charged); no row when the tenant has no clock here.
SELECT inserted.id, CASE WHEN %(n)s = 1 THEN inserted.run_at END AS run_at, CASE WHEN %(n)s = 1 THEN inserted.created_at END AS created_at, CASE WHEN %(n)s = 1 THEN inserted.vtime END AS vtime,
       CASE WHEN f.ok THEN (SELECT pg_notify(%(channel)s, CASE WHEN %(keys)s::text[] IS NULL THEN %(queue)s
                                           ELSE 'key:' || %(queue)s END)) IS NULL END,
       CASE WHEN NOT f.ok THEN 'taken' END AS state
  FROM fresh f LEFT JOIN clock ON TRUE LEFT JOIN inserted ON TRUE
 WHERE clock.start IS NOT NULL OR NOT f.ok
 ORDER BY inserted.id


-- name: JOB_ENQUEUE_BY_TIME
-- JOB_ENQUEUE with FAIRNESS = "time": each job is charged its task's run-time estimate
-- (fairness.run_time_charge, bound to %(charge_min)s / %(charge_default)s) instead of 1,
-- and the charge is kept on the job for FAIR_CLOCK_CORRECT.
-- Locks: as JOB_ENQUEUE.
-- Indexes: as JOB_ENQUEUE, and pgqueue_task_stat_uniq (the task's rows, a few dozen at most).
-- Called by: store.enqueue when fairness.by_time(), from services.enqueue / enqueue_many.
WITH charge AS (SELECT GREATEST(%(charge_min)s::float8, COALESCE(
        (SELECT sum(ts.seconds) / NULLIF(sum(ts.count), 0) FROM pgqueue_task_stat ts
          WHERE ts.task = %(task)s),
        %(charge_default)s::float8)) AS c),
weight AS (SELECT COALESCE(
        (SELECT qw.weight FROM pgqueue_queue_weight qw
          WHERE qw.tenant = %(tenant)s AND qw.queue = %(queue)s),
        (SELECT t.weight FROM pgqueue_tenant t WHERE t.name = %(tenant)s),
        1.0) AS w),
head AS (SELECT COALESCE(
        (SELECT hj.vtime FROM pgqueue_job hj
          WHERE hj.queue = %(queue)s AND hj.priority = %(priority)s AND hj.status = 'queued'
            AND NOT hj.gated
          ORDER BY hj.vtime LIMIT 1),
        (SELECT min(hg.vtime)
           FROM (SELECT DISTINCT hl.tenant FROM pgqueue_limit hl WHERE hl.tenant <> '') ht
          CROSS JOIN LATERAL (
                SELECT g.vtime FROM pgqueue_job g
                 WHERE g.queue = %(queue)s AND g.tenant = ht.tenant
                   AND g.priority = %(priority)s AND g.status = 'queued' AND g.gated
                 ORDER BY g.priority DESC, g.vtime LIMIT 1) hg),
        (SELECT max(hc.vtime) FROM pgqueue_fair_clock hc
          WHERE hc.queue = %(queue)s AND hc.priority = %(priority)s),
        0.0) AS h),
gate AS (SELECT EXISTS (
        SELECT 1 FROM pgqueue_limit gl
         WHERE gl.tenant = %(tenant)s AND gl.queue IN ('', %(queue)s) AND (gl.max_running IS NOT NULL OR gl.rate_count IS NOT NULL OR gl.paused)) AS g),
fresh AS (SELECT %(idempotency_key)s::text IS NULL OR NOT EXISTS (
           SELECT 1 FROM pgqueue_job dup
            WHERE dup.tenant = %(tenant)s AND dup.idempotency_key = %(idempotency_key)s) AS ok),
clock AS (
    UPDATE pgqueue_fair_clock c
       SET vtime = GREATEST(c.vtime + (%(n)s * (SELECT c FROM charge)) / (SELECT w FROM weight),
                            (SELECT h FROM head) + (%(n)s * (SELECT c FROM charge)) / (SELECT w FROM weight))
     WHERE c.queue = %(queue)s AND c.tenant = %(tenant)s AND c.priority = %(priority)s
       AND (SELECT ok FROM fresh)
    RETURNING c.vtime - (%(n)s * (SELECT c FROM charge)) / (SELECT w FROM weight) AS start, (SELECT w FROM weight) AS w
),
tenant_row AS (  -- the tenant row, once there is a clock: a statement that finds none
    INSERT INTO pgqueue_tenant (name, weight) SELECT %(tenant)s, 1.0 FROM clock
    ON CONFLICT (name) DO NOTHING
),
inserted AS (
    INSERT INTO pgqueue_job (queue, tenant, task, payload, status, priority, vtime,
                             attempts, max_attempts, run_at, idempotency_key,
                             timeout_seconds, gated, charge, concurrency_key,
                             key_max_running, key_state, traceparent, tracestate)
    SELECT %(queue)s, %(tenant)s, %(task)s, p.payload, 'queued', %(priority)s,
           CASE WHEN %(fifo)s THEN extract(epoch FROM now())::float8 ELSE clock.start + (p.ord * (SELECT c FROM charge)) / clock.w END,
           0, %(max_attempts)s, now(), %(idempotency_key)s, %(timeout)s::float8,
           CASE WHEN k.key IS NULL THEN gate.g END, (SELECT c FROM charge),
           k.key, CASE WHEN k.key IS NOT NULL THEN %(key_max)s::int END,
           CASE WHEN k.key IS NULL THEN '' ELSE 'new' END,
           %(traceparent)s::text, %(tracestate)s::text
      FROM clock, gate, jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, ord)
           CROSS JOIN LATERAL (SELECT (%(keys)s::text[])[p.ord] AS key) k
     ORDER BY p.ord
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, run_at, created_at, vtime
)
-- One row per inserted job; a single row with a NULL id when the clock was charged but
-- ON CONFLICT inserted nothing (the caller refunds); a single row saying 'taken' when the
-- key was taken before (nothing charged); no row when the tenant has no clock here.
SELECT inserted.id, CASE WHEN %(n)s = 1 THEN inserted.run_at END AS run_at, CASE WHEN %(n)s = 1 THEN inserted.created_at END AS created_at, CASE WHEN %(n)s = 1 THEN inserted.vtime END AS vtime,
       CASE WHEN f.ok THEN (SELECT pg_notify(%(channel)s, CASE WHEN %(keys)s::text[] IS NULL THEN %(queue)s
                                           ELSE 'key:' || %(queue)s END)) IS NULL END,
       CASE WHEN NOT f.ok THEN 'taken' END AS state
  FROM fresh f LEFT JOIN clock ON TRUE LEFT JOIN inserted ON TRUE
 WHERE clock.start IS NOT NULL OR NOT f.ok
 ORDER BY inserted.id


-- name: JOB_ENQUEUE_FIRST
-- JOB_ENQUEUE for a tenant with no fair clock at the level: run by store.enqueue when
-- JOB_ENQUEUE returned no row. A queue new to the tenant is admitted only below
-- MAX_QUEUES_PER_TENANT (the count is made only then); refused, nothing is written
-- (but the tenant row) and one row says 'refused'. The clock is created from the level's
-- head, by an upsert (a concurrent first enqueue of the same tenant may create it first:
-- then it is charged). The level's keeper in the snapshot (its largest clock:
-- largest vtime, then id) is first held FOR KEY SHARE: FAIR_CLOCK_DELETE_IDLE deletes a level's
-- keeper only with the whole level, holding every clock of it FOR UPDATE, so it leaves
-- this level whole while the new clock and jobs are uncommitted
-- (their vtimes are of the level's current scale, which that deletion would start again
-- from 0); if the prune got there first this waits for it and finds the clock deleted,
-- writes nothing and one row says 'raced' (store.enqueue runs the statements again, with
-- a snapshot that shows the deletion). Other rows and states as JOB_ENQUEUE's, and
-- 'known'.
-- Locks: the new clock row (the upsert), and the level's keeper FOR KEY SHARE,
--   until the caller's transaction ends. KEY SHARE conflicts with no enqueue, promotion or
--   correction (FOR NO KEY UPDATE), only with the prune's FOR UPDATE.
-- Indexes: pgqueue_fair_clock_uniq (the tenant's clocks in the queue, the upsert),
--   pgqueue_fair_clock_tenant (the count, a queue new to the tenant only),
--   pgqueue_fair_clock_level (the largest clock), then as JOB_ENQUEUE.
-- Called by: store.enqueue, after JOB_ENQUEUE returned no row.
WITH tenant_row AS (
    INSERT INTO pgqueue_tenant (name, weight) VALUES (%(tenant)s, 1.0)
    ON CONFLICT (name) DO NOTHING
),
weight AS (SELECT COALESCE(
        (SELECT qw.weight FROM pgqueue_queue_weight qw
          WHERE qw.tenant = %(tenant)s AND qw.queue = %(queue)s),
        (SELECT t.weight FROM pgqueue_tenant t WHERE t.name = %(tenant)s),
        1.0) AS w),
head AS (SELECT COALESCE(
        (SELECT hj.vtime FROM pgqueue_job hj
          WHERE hj.queue = %(queue)s AND hj.priority = %(priority)s AND hj.status = 'queued'
            AND NOT hj.gated
          ORDER BY hj.vtime LIMIT 1),
        (SELECT min(hg.vtime)
           FROM (SELECT DISTINCT hl.tenant FROM pgqueue_limit hl WHERE hl.tenant <> '') ht
          CROSS JOIN LATERAL (
                SELECT g.vtime FROM pgqueue_job g
                 WHERE g.queue = %(queue)s AND g.tenant = ht.tenant
                   AND g.priority = %(priority)s AND g.status = 'queued' AND g.gated
                 ORDER BY g.priority DESC, g.vtime LIMIT 1) hg),
        (SELECT max(hc.vtime) FROM pgqueue_fair_clock hc
          WHERE hc.queue = %(queue)s AND hc.priority = %(priority)s),
        0.0) AS h),
gate AS (SELECT EXISTS (
        SELECT 1 FROM pgqueue_limit gl
         WHERE gl.tenant = %(tenant)s AND gl.queue IN ('', %(queue)s) AND (gl.max_running IS NOT NULL OR gl.rate_count IS NOT NULL OR gl.paused)) AS g),
own AS MATERIALIZED (
    SELECT count(*) > 0 AS in_queue,
           COALESCE(bool_or(o.priority = %(priority)s), FALSE) AS at_level
      FROM pgqueue_fair_clock o
     WHERE o.queue = %(queue)s AND o.tenant = %(tenant)s
),
admit AS MATERIALIZED (
    SELECT %(idempotency_key)s::text IS NULL OR NOT EXISTS (
           SELECT 1 FROM pgqueue_job dup
            WHERE dup.tenant = %(tenant)s AND dup.idempotency_key = %(idempotency_key)s) AS fresh,
           CASE WHEN (SELECT in_queue FROM own) OR %(max_queues)s::int IS NULL THEN TRUE
                ELSE (SELECT count(*) FROM (
                          SELECT DISTINCT b.queue FROM pgqueue_fair_clock b
                           WHERE b.tenant = %(tenant)s
                           LIMIT %(max_queues)s::int) n) < %(max_queues)s::int
           END AS admitted
),
level_max AS MATERIALIZED (
    SELECT m.id FROM pgqueue_fair_clock m
     WHERE m.queue = %(queue)s AND m.priority = %(priority)s
     ORDER BY m.vtime DESC, m.id LIMIT 1  -- the level's keeper
),
level_held AS MATERIALIZED (
    SELECT k.id FROM pgqueue_fair_clock k WHERE k.id = (SELECT id FROM level_max)
       FOR KEY SHARE
),
clock AS (
    INSERT INTO pgqueue_fair_clock AS c (queue, tenant, priority, vtime)
    SELECT %(queue)s, %(tenant)s, %(priority)s, head.h + %(n)s / weight.w
      FROM head, weight
     WHERE NOT (SELECT at_level FROM own) AND (SELECT fresh AND admitted FROM admit)
       AND (NOT EXISTS (SELECT 1 FROM level_max) OR EXISTS (SELECT 1 FROM level_held))
    ON CONFLICT (queue, tenant, priority) DO UPDATE
       SET vtime = GREATEST(c.vtime + %(n)s / (SELECT w FROM weight), EXCLUDED.vtime)
    RETURNING c.vtime - %(n)s / (SELECT w FROM weight) AS start, (SELECT w FROM weight) AS w
),
inserted AS (
    INSERT INTO pgqueue_job (queue, tenant, task, payload, status, priority, vtime,
                             attempts, max_attempts, run_at, idempotency_key,
                             timeout_seconds, gated, concurrency_key, key_max_running,
                             key_state, traceparent, tracestate)
    SELECT %(queue)s, %(tenant)s, %(task)s, p.payload, 'queued', %(priority)s,
           CASE WHEN %(fifo)s THEN extract(epoch FROM now())::float8 ELSE clock.start + p.ord / clock.w END,
           0, %(max_attempts)s, now(), %(idempotency_key)s, %(timeout)s::float8,
           CASE WHEN k.key IS NULL THEN gate.g END,
           k.key, CASE WHEN k.key IS NOT NULL THEN %(key_max)s::int END,
           CASE WHEN k.key IS NULL THEN '' ELSE 'new' END,
           %(traceparent)s::text, %(tracestate)s::text
      FROM clock, gate, jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, ord)
           CROSS JOIN LATERAL (SELECT (%(keys)s::text[])[p.ord] AS key) k
     ORDER BY p.ord
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, run_at, created_at, vtime
)
SELECT inserted.id, CASE WHEN %(n)s = 1 THEN inserted.run_at END AS run_at, CASE WHEN %(n)s = 1 THEN inserted.created_at END AS created_at, CASE WHEN %(n)s = 1 THEN inserted.vtime END AS vtime, (SELECT pg_notify(%(channel)s, CASE WHEN %(keys)s::text[] IS NULL THEN %(queue)s
                                           ELSE 'key:' || %(queue)s END)) IS NULL,
       NULL::text AS state
  FROM clock LEFT JOIN inserted ON TRUE
 UNION ALL
SELECT NULL::bigint, NULL::timestamptz, NULL::timestamptz, NULL::float8, NULL::boolean, s.state
  FROM (SELECT CASE WHEN NOT a.fresh THEN 'taken'
                WHEN (SELECT at_level FROM own) THEN 'known'
                WHEN NOT a.admitted THEN 'refused'
                WHEN NOT EXISTS (SELECT 1 FROM clock) THEN 'raced' END AS state
          FROM admit a) s
 WHERE s.state IS NOT NULL
 ORDER BY id


-- name: JOB_ENQUEUE_FIRST_BY_TIME
-- JOB_ENQUEUE_FIRST with FAIRNESS = "time" (the charge of JOB_ENQUEUE_BY_TIME).
-- Locks, Indexes: as JOB_ENQUEUE_FIRST, and pgqueue_task_stat_uniq.
-- Called by: store.enqueue when fairness.by_time(), after JOB_ENQUEUE_BY_TIME returned no row.
WITH tenant_row AS (
    INSERT INTO pgqueue_tenant (name, weight) VALUES (%(tenant)s, 1.0)
    ON CONFLICT (name) DO NOTHING
),
charge AS (SELECT GREATEST(%(charge_min)s::float8, COALESCE(
        (SELECT sum(ts.seconds) / NULLIF(sum(ts.count), 0) FROM pgqueue_task_stat ts
          WHERE ts.task = %(task)s),
        %(charge_default)s::float8)) AS c),
weight AS (SELECT COALESCE(
        (SELECT qw.weight FROM pgqueue_queue_weight qw
          WHERE qw.tenant = %(tenant)s AND qw.queue = %(queue)s),
        (SELECT t.weight FROM pgqueue_tenant t WHERE t.name = %(tenant)s),
        1.0) AS w),
head AS (SELECT COALESCE(
        (SELECT hj.vtime FROM pgqueue_job hj
          WHERE hj.queue = %(queue)s AND hj.priority = %(priority)s AND hj.status = 'queued'
            AND NOT hj.gated
          ORDER BY hj.vtime LIMIT 1),
        (SELECT min(hg.vtime)
           FROM (SELECT DISTINCT hl.tenant FROM pgqueue_limit hl WHERE hl.tenant <> '') ht
          CROSS JOIN LATERAL (
                SELECT g.vtime FROM pgqueue_job g
                 WHERE g.queue = %(queue)s AND g.tenant = ht.tenant
                   AND g.priority = %(priority)s AND g.status = 'queued' AND g.gated
                 ORDER BY g.priority DESC, g.vtime LIMIT 1) hg),
        (SELECT max(hc.vtime) FROM pgqueue_fair_clock hc
          WHERE hc.queue = %(queue)s AND hc.priority = %(priority)s),
        0.0) AS h),
gate AS (SELECT EXISTS (
        SELECT 1 FROM pgqueue_limit gl
         WHERE gl.tenant = %(tenant)s AND gl.queue IN ('', %(queue)s) AND (gl.max_running IS NOT NULL OR gl.rate_count IS NOT NULL OR gl.paused)) AS g),
own AS MATERIALIZED (
    SELECT count(*) > 0 AS in_queue,
           COALESCE(bool_or(o.priority = %(priority)s), FALSE) AS at_level
      FROM pgqueue_fair_clock o
     WHERE o.queue = %(queue)s AND o.tenant = %(tenant)s
),
admit AS MATERIALIZED (
    SELECT %(idempotency_key)s::text IS NULL OR NOT EXISTS (
           SELECT 1 FROM pgqueue_job dup
            WHERE dup.tenant = %(tenant)s AND dup.idempotency_key = %(idempotency_key)s) AS fresh,
           CASE WHEN (SELECT in_queue FROM own) OR %(max_queues)s::int IS NULL THEN TRUE
                ELSE (SELECT count(*) FROM (
                          SELECT DISTINCT b.queue FROM pgqueue_fair_clock b
                           WHERE b.tenant = %(tenant)s
                           LIMIT %(max_queues)s::int) n) < %(max_queues)s::int
           END AS admitted
),
level_max AS MATERIALIZED (
    SELECT m.id FROM pgqueue_fair_clock m
     WHERE m.queue = %(queue)s AND m.priority = %(priority)s
     ORDER BY m.vtime DESC, m.id LIMIT 1  -- the level's keeper
),
level_held AS MATERIALIZED (
    SELECT k.id FROM pgqueue_fair_clock k WHERE k.id = (SELECT id FROM level_max)
       FOR KEY SHARE
),
clock AS (
    INSERT INTO pgqueue_fair_clock AS c (queue, tenant, priority, vtime)
    SELECT %(queue)s, %(tenant)s, %(priority)s, head.h + (%(n)s * (SELECT c FROM charge)) / weight.w
      FROM head, weight
     WHERE NOT (SELECT at_level FROM own) AND (SELECT fresh AND admitted FROM admit)
       AND (NOT EXISTS (SELECT 1 FROM level_max) OR EXISTS (SELECT 1 FROM level_held))
    ON CONFLICT (queue, tenant, priority) DO UPDATE
       SET vtime = GREATEST(c.vtime + (%(n)s * (SELECT c FROM charge)) / (SELECT w FROM weight), EXCLUDED.vtime)
    RETURNING c.vtime - (%(n)s * (SELECT c FROM charge)) / (SELECT w FROM weight) AS start, (SELECT w FROM weight) AS w
),
inserted AS (
    INSERT INTO pgqueue_job (queue, tenant, task, payload, status, priority, vtime,
                             attempts, max_attempts, run_at, idempotency_key,
                             timeout_seconds, gated, charge, concurrency_key,
                             key_max_running, key_state, traceparent, tracestate)
    SELECT %(queue)s, %(tenant)s, %(task)s, p.payload, 'queued', %(priority)s,
           CASE WHEN %(fifo)s THEN extract(epoch FROM now())::float8 ELSE clock.start + (p.ord * (SELECT c FROM charge)) / clock.w END,
           0, %(max_attempts)s, now(), %(idempotency_key)s, %(timeout)s::float8,
           CASE WHEN k.key IS NULL THEN gate.g END, (SELECT c FROM charge),
           k.key, CASE WHEN k.key IS NOT NULL THEN %(key_max)s::int END,
           CASE WHEN k.key IS NULL THEN '' ELSE 'new' END,
           %(traceparent)s::text, %(tracestate)s::text
      FROM clock, gate, jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, ord)
           CROSS JOIN LATERAL (SELECT (%(keys)s::text[])[p.ord] AS key) k
     ORDER BY p.ord
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, run_at, created_at, vtime
)
SELECT inserted.id, CASE WHEN %(n)s = 1 THEN inserted.run_at END AS run_at, CASE WHEN %(n)s = 1 THEN inserted.created_at END AS created_at, CASE WHEN %(n)s = 1 THEN inserted.vtime END AS vtime, (SELECT pg_notify(%(channel)s, CASE WHEN %(keys)s::text[] IS NULL THEN %(queue)s
                                           ELSE 'key:' || %(queue)s END)) IS NULL,
       NULL::text AS state
  FROM clock LEFT JOIN inserted ON TRUE
 UNION ALL
SELECT NULL::bigint, NULL::timestamptz, NULL::timestamptz, NULL::float8, NULL::boolean, s.state
  FROM (SELECT CASE WHEN NOT a.fresh THEN 'taken'
                WHEN (SELECT at_level FROM own) THEN 'known'
                WHEN NOT a.admitted THEN 'refused'
                WHEN NOT EXISTS (SELECT 1 FROM clock) THEN 'raced' END AS state
          FROM admit a) s
 WHERE s.state IS NOT NULL
 ORDER BY id


-- name: JOB_ENQUEUE_SCHEDULED
-- Enqueue 1..1,000 jobs that become runnable later (run_at in the future), returning
-- each new job's columns (vtime NULL), into a queue where the tenant has a
-- fair clock. They wait in 'scheduled', outside the claim index, and get their vtime when
-- JOB_PROMOTE_DUE makes them runnable. With %(status)s 'waiting' they wait for their
-- dependencies instead (workflows.sql), outside the promotion index too, in workflow
-- %(workflow)s (or none) under the step names %(steps)s (one per payload, or NULL). No wake-up: nothing is runnable yet. No row: the
-- key was taken. One row saying 'first': the queue is new to the tenant, nothing was
-- written (but the tenant row), and store.enqueue runs JOB_ENQUEUE_SCHEDULED_FIRST.
-- A clock this creates or finds may be deleted by FAIR_CLOCK_DELETE_IDLE before the jobs
-- commit: harmless, they have no vtime yet and FAIR_CLOCK_ENSURE_DUE creates it again (at
-- the level's scale then) before their promotion.
-- Locks: none held on existing rows. The tenant's clock row is created here (DO NOTHING:
--   no lock on an existing row) so that promotion only ever locks rows that exist.
-- Indexes: pgqueue_job_scheduled gains the rows (pgqueue_job_waiting: waiting ones);
--   pgqueue_job_idempotency; pgqueue_fair_clock_uniq.
-- Called by: store.enqueue (with a run_at, or waiting), from services.enqueue /
--   enqueue_many and Workflow.enqueue.
WITH tenant_row AS (
    INSERT INTO pgqueue_tenant (name, weight) VALUES (%(tenant)s, 1.0)
    ON CONFLICT (name) DO NOTHING
),
known AS (
    SELECT EXISTS (SELECT 1 FROM pgqueue_fair_clock o
                    WHERE o.queue = %(queue)s AND o.tenant = %(tenant)s) AS yes
),
clock AS (
    INSERT INTO pgqueue_fair_clock (queue, tenant, priority, vtime)
    SELECT %(queue)s, %(tenant)s, %(priority)s, 0.0 WHERE (SELECT yes FROM known)
    ON CONFLICT (queue, tenant, priority) DO NOTHING
),
inserted AS (
    INSERT INTO pgqueue_job (queue, tenant, task, payload, status, priority, vtime,
                             attempts, max_attempts, run_at, idempotency_key,
                             timeout_seconds, gated, concurrency_key, key_max_running, key_state,
                             workflow_id, step, run_on_upstream_failure,
                             traceparent, tracestate)
    SELECT %(queue)s, %(tenant)s, %(task)s, p.payload, %(status)s, %(priority)s, NULL,
           0, %(max_attempts)s, COALESCE(%(run_at)s::timestamptz, now()), %(idempotency_key)s, %(timeout)s::float8,
           CASE WHEN k.key IS NULL THEN FALSE END,
           k.key, CASE WHEN k.key IS NOT NULL THEN %(key_max)s::int END,
           CASE WHEN k.key IS NULL THEN '' ELSE 'new' END,
           %(workflow)s::bigint, (%(steps)s::text[])[p.ord], %(run_anyway)s::boolean,
           %(traceparent)s::text, %(tracestate)s::text
      FROM jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, ord)
           CROSS JOIN LATERAL (SELECT (%(keys)s::text[])[p.ord] AS key) k
     WHERE (SELECT yes FROM known)
     ORDER BY p.ord
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, run_at, created_at, vtime
)
SELECT inserted.id, CASE WHEN %(n)s = 1 THEN inserted.run_at END AS run_at, CASE WHEN %(n)s = 1 THEN inserted.created_at END AS created_at, CASE WHEN %(n)s = 1 THEN inserted.vtime END AS vtime, TRUE,
       CASE WHEN NOT k.yes THEN 'first' END AS state
  FROM known k LEFT JOIN inserted ON TRUE
 WHERE inserted.id IS NOT NULL OR NOT k.yes
 ORDER BY inserted.id


-- name: JOB_ENQUEUE_SCHEDULED_FIRST
-- JOB_ENQUEUE_SCHEDULED into a queue new to the tenant, admitted as by JOB_ENQUEUE_FIRST; refused, nothing is written (but the tenant row) and one row says 'refused'.
-- Other states as JOB_ENQUEUE_FIRST's ('taken', 'known': back to JOB_ENQUEUE_SCHEDULED).
-- Locks: as JOB_ENQUEUE_SCHEDULED.
-- Indexes: as JOB_ENQUEUE_SCHEDULED, and pgqueue_fair_clock_tenant (the count).
-- Called by: store.enqueue, after JOB_ENQUEUE_SCHEDULED said 'first'.
WITH tenant_row AS (
    INSERT INTO pgqueue_tenant (name, weight) VALUES (%(tenant)s, 1.0)
    ON CONFLICT (name) DO NOTHING
),
own AS MATERIALIZED (
    SELECT count(*) > 0 AS in_queue,
           COALESCE(bool_or(o.priority = %(priority)s), FALSE) AS at_level
      FROM pgqueue_fair_clock o
     WHERE o.queue = %(queue)s AND o.tenant = %(tenant)s
),
admit AS MATERIALIZED (
    SELECT %(idempotency_key)s::text IS NULL OR NOT EXISTS (
           SELECT 1 FROM pgqueue_job dup
            WHERE dup.tenant = %(tenant)s AND dup.idempotency_key = %(idempotency_key)s) AS fresh,
           CASE WHEN (SELECT in_queue FROM own) OR %(max_queues)s::int IS NULL THEN TRUE
                ELSE (SELECT count(*) FROM (
                          SELECT DISTINCT b.queue FROM pgqueue_fair_clock b
                           WHERE b.tenant = %(tenant)s
                           LIMIT %(max_queues)s::int) n) < %(max_queues)s::int
           END AS admitted
),
clock AS (
    INSERT INTO pgqueue_fair_clock (queue, tenant, priority, vtime)
    SELECT %(queue)s, %(tenant)s, %(priority)s, 0.0 WHERE (SELECT admitted FROM admit)
    ON CONFLICT (queue, tenant, priority) DO NOTHING
),
inserted AS (
    INSERT INTO pgqueue_job (queue, tenant, task, payload, status, priority, vtime,
                             attempts, max_attempts, run_at, idempotency_key,
                             timeout_seconds, gated, concurrency_key, key_max_running, key_state,
                             workflow_id, step, run_on_upstream_failure,
                             traceparent, tracestate)
    SELECT %(queue)s, %(tenant)s, %(task)s, p.payload, %(status)s, %(priority)s, NULL,
           0, %(max_attempts)s, COALESCE(%(run_at)s::timestamptz, now()), %(idempotency_key)s, %(timeout)s::float8,
           CASE WHEN k.key IS NULL THEN FALSE END,
           k.key, CASE WHEN k.key IS NOT NULL THEN %(key_max)s::int END,
           CASE WHEN k.key IS NULL THEN '' ELSE 'new' END,
           %(workflow)s::bigint, (%(steps)s::text[])[p.ord], %(run_anyway)s::boolean,
           %(traceparent)s::text, %(tracestate)s::text
      FROM jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, ord)
           CROSS JOIN LATERAL (SELECT (%(keys)s::text[])[p.ord] AS key) k
     WHERE (SELECT admitted FROM admit)
     ORDER BY p.ord
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, run_at, created_at, vtime
)
SELECT inserted.id, CASE WHEN %(n)s = 1 THEN inserted.run_at END AS run_at, CASE WHEN %(n)s = 1 THEN inserted.created_at END AS created_at, CASE WHEN %(n)s = 1 THEN inserted.vtime END AS vtime, TRUE, NULL::text AS state FROM inserted
 UNION ALL
SELECT NULL::bigint, NULL::timestamptz, NULL::timestamptz, NULL::float8, NULL::boolean, s.state
  FROM (SELECT CASE WHEN NOT a.fresh THEN 'taken'
                WHEN NOT a.admitted THEN 'refused' END AS state
          FROM admit a) s
 WHERE s.state IS NOT NULL
 ORDER BY id


-- name: TENANT_QUEUE_ADMITTED
-- Whether a job of tenant %(tenant)s may become live in queue %(queue)s under
-- MAX_QUEUES_PER_TENANT (MAX_QUEUES; NULL: no bound), by JOB_ENQUEUE_FIRST's rule: the tenant has a
-- clock in the queue, or clocks in fewer queues than the bound. For a retry, which is an
-- enqueue of the job again but creates its clock only when it is promoted
-- (FAIR_CLOCK_ENSURE_*, which refuses nothing: a job admitted is promoted).
-- Locks: nothing.
-- Indexes: pgqueue_fair_clock_uniq (queue, tenant), pgqueue_fair_clock_tenant (the count,
--   a queue new to the tenant only).
-- Called by: store.queue_admitted, from services.check_queue_bound (the HTTP API's retry).
SELECT CASE WHEN %(max_queues)s::int IS NULL
              OR EXISTS (SELECT 1 FROM pgqueue_fair_clock o
                          WHERE o.queue = %(queue)s AND o.tenant = %(tenant)s) THEN TRUE
            ELSE (SELECT count(*) FROM (
                          SELECT DISTINCT b.queue FROM pgqueue_fair_clock b
                           WHERE b.tenant = %(tenant)s
                           LIMIT %(max_queues)s::int) n) < %(max_queues)s::int END


-- name: JOB_GET_ID_BY_IDEMPOTENCY_KEY
-- The id of a tenant's job holding an idempotency key, for an enqueue on a bare connection
-- that found the key taken (a periodic tick already enqueued by another worker).
-- Locks: nothing.
-- Index: pgqueue_job_idempotency (tenant, idempotency_key), one tuple.
-- Called by: store.job_id_for_key, from schedules._fire.
SELECT id FROM pgqueue_job WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s


-- name: FAIR_CLOCK_REFUND
-- Gives back the virtual time JOB_ENQUEUE charged for a job that ON CONFLICT did not
-- insert (a concurrent duplicate idempotency key).
-- Locks: the clock row, which the caller's transaction already holds since JOB_ENQUEUE
--   (so nothing else moved the clock in between).
-- Index: pgqueue_fair_clock_uniq.
-- Called by: store.refund_clock, from services.enqueue (a duplicate key lost the race).
UPDATE pgqueue_fair_clock
   SET vtime = vtime - %(n)s / COALESCE(
        (SELECT qw.weight FROM pgqueue_queue_weight qw
          WHERE qw.tenant = %(tenant)s AND qw.queue = %(queue)s),
        (SELECT t.weight FROM pgqueue_tenant t WHERE t.name = %(tenant)s),
        1.0)
 WHERE queue = %(queue)s AND tenant = %(tenant)s AND priority = %(priority)s


-- name: FAIR_CLOCK_REFUND_BY_TIME
-- FAIR_CLOCK_REFUND after JOB_ENQUEUE_BY_TIME: gives back the task's charge, estimated
-- again. A fold of pgqueue_task_stat committed between the two statements (this rare race
-- inside a rarer one) makes the refund differ from the charge by the change in the task's
-- mean; FAIR_CLOCK_CORRECT does not see the job (there is none), so that difference stays.
-- Locks: as FAIR_CLOCK_REFUND.
-- Indexes: pgqueue_fair_clock_uniq, pgqueue_task_stat_uniq.
-- Called by: store.refund_clock when fairness.by_time(), from services.enqueue.
UPDATE pgqueue_fair_clock
   SET vtime = vtime - %(n)s * GREATEST(%(charge_min)s::float8, COALESCE(
        (SELECT sum(ts.seconds) / NULLIF(sum(ts.count), 0) FROM pgqueue_task_stat ts
          WHERE ts.task = %(task)s),
        %(charge_default)s::float8))
                     / COALESCE(
        (SELECT qw.weight FROM pgqueue_queue_weight qw
          WHERE qw.tenant = %(tenant)s AND qw.queue = %(queue)s),
        (SELECT t.weight FROM pgqueue_tenant t WHERE t.name = %(tenant)s),
        1.0)
 WHERE queue = %(queue)s AND tenant = %(tenant)s AND priority = %(priority)s
