-- Promotion: scheduled jobs made runnable when due (or named), with fresh fair vtimes,
-- and the fair clocks they need ensured first.
-- Each statement is written here whole, as PostgreSQL runs it; values are parameters
-- (%(name)s). A header says what a statement does and why, what it locks, which indexes
-- serve it and who calls it; pgqueue/sql.py states the conventions they share.


-- name: JOB_PROMOTE_DUE
-- A promoted job of a tenant a limit applies to is gated (as enqueue does).
-- A keyed job not yet admitted ('new') stays out of both claim indexes (gated NULL) for
-- KEY_SETTLE; its wake-up says 'key:<queue>'. One holding its key's slot (a retry) is
-- gated as any other.
-- Make scheduled jobs due by %(now)s runnable, assigning fresh fair vtimes (a job back
-- from a backoff does not jump the line), at most %(limit)s of them, the oldest first among
-- the levels promoted. Notifies each queue.
-- Shaped clocks first: the levels with due jobs (levels), their clock rows locked
-- SKIP LOCKED, and then the oldest due jobs of the clocks it got. A clock held by an open
-- enqueue transaction delays only its own level until the next run; taking the oldest due
-- jobs first and then skipping those of locked clocks (as this statement once did) let a
-- batch's worth of one tenant's due jobs behind a held clock stall every tenant's.
-- Locks: the fair-clock rows of up to %(limit)s levels with due jobs, in sorted (queue,
--   tenant, priority) order with SKIP LOCKED, then the due jobs (SKIP LOCKED). Neither
--   waits, so two promoters never deadlock, with each other or with an enqueue. Held
--   until maintenance's transaction ends. The clocks are locked FOR NO KEY UPDATE, as an
--   enqueue's UPDATE locks its own: that does not conflict with the KEY SHARE a first
--   enqueue at a level takes on the level's keeper (JOB_ENQUEUE_FIRST). A level whose
--   clock row is missing is not promoted: FAIR_CLOCK_ENSURE_DUE, run just before, creates
--   it (FAIR_CLOCK_DELETE_IDLE may have deleted it).
-- Indexes: pgqueue_job_scheduled_level (the levels' skip scan and each level's due jobs
--   in run_at order), pgqueue_fair_clock_uniq, pgqueue_job_pkey, and one tuple of
--   pgqueue_job_claim / pgqueue_fair_clock_level for each level's head.
-- Called by: store.promote_due, from maintenance (one worker at a time).
WITH RECURSIVE
levels(queue, tenant, priority) AS (
    (SELECT queue, tenant, priority FROM pgqueue_job
      WHERE status = 'scheduled'
      ORDER BY queue, tenant, priority LIMIT 1)
    UNION ALL
    SELECT n.queue, n.tenant, n.priority
      FROM levels l
     CROSS JOIN LATERAL (
           SELECT j.queue, j.tenant, j.priority FROM pgqueue_job j
            WHERE j.status = 'scheduled'
              AND (j.queue, j.tenant, j.priority) > (l.queue, l.tenant, l.priority)
            ORDER BY j.queue, j.tenant, j.priority LIMIT 1) n
),
due_levels AS MATERIALIZED (
    SELECT l.queue, l.tenant, l.priority FROM levels l
     WHERE EXISTS (SELECT 1 FROM pgqueue_job j
                    WHERE j.status = 'scheduled' AND j.run_at <= COALESCE(%(now)s::timestamptz, now())
                      AND (j.queue, j.tenant, j.priority) = (l.queue, l.tenant, l.priority))
     ORDER BY l.queue, l.tenant, l.priority
     LIMIT %(limit)s
),
clock AS MATERIALIZED (
    SELECT c.id, c.queue, c.tenant, c.priority FROM pgqueue_fair_clock c
     WHERE (c.queue, c.tenant, c.priority) IN (SELECT queue, tenant, priority FROM due_levels)
     ORDER BY c.queue, c.tenant, c.priority
       FOR NO KEY UPDATE OF c SKIP LOCKED
),
candidate AS MATERIALIZED (
    SELECT j.id, j.run_at FROM clock k
     CROSS JOIN LATERAL (
           SELECT id, run_at FROM pgqueue_job j
            WHERE j.status = 'scheduled' AND j.run_at <= COALESCE(%(now)s::timestamptz, now())
              AND (j.queue, j.tenant, j.priority) = (k.queue, k.tenant, k.priority)
            ORDER BY run_at, id
            LIMIT %(limit)s) j
     ORDER BY j.run_at, j.id
     LIMIT %(limit)s
),
due AS MATERIALIZED (
    SELECT j.id, j.queue, j.tenant, j.priority, j.run_at FROM pgqueue_job j
     WHERE j.id IN (SELECT id FROM candidate) AND j.status = 'scheduled' AND j.run_at <= COALESCE(%(now)s::timestamptz, now())
       FOR UPDATE OF j SKIP LOCKED
),
ranked AS (
    SELECT d.id, k.id AS clock_id,
           row_number() OVER (PARTITION BY k.id ORDER BY d.run_at, d.id) AS rank
      FROM due d
      JOIN clock k ON (k.queue, k.tenant, k.priority) = (d.queue, d.tenant, d.priority)
),
step AS (
    SELECT k.id, count(*) AS n,
           COALESCE(
        (SELECT qw.weight FROM pgqueue_queue_weight qw
          WHERE qw.tenant = k.tenant AND qw.queue = k.queue),
        (SELECT t.weight FROM pgqueue_tenant t WHERE t.name = k.tenant),
        1.0) AS w,
           COALESCE(
        (SELECT hj.vtime FROM pgqueue_job hj
          WHERE hj.queue = k.queue AND hj.priority = k.priority AND hj.status = 'queued'
            AND NOT hj.gated
          ORDER BY hj.vtime LIMIT 1),
        (SELECT min(hg.vtime)
           FROM (SELECT DISTINCT hl.tenant FROM pgqueue_limit hl WHERE hl.tenant <> '') ht
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
       SET status = 'queued', vtime = CASE WHEN %(fifo)s THEN extract(epoch FROM now())::float8 ELSE b.start + r.rank / b.w END,
           gated = CASE WHEN j.key_state <> 'new' THEN EXISTS (
        SELECT 1 FROM pgqueue_limit gl
         WHERE gl.tenant = j.tenant AND gl.queue IN ('', j.queue) AND (gl.max_running IS NOT NULL OR gl.rate_count IS NOT NULL OR gl.paused)) END
      FROM ranked r JOIN bump b ON b.id = r.clock_id
     WHERE j.id = r.id
    RETURNING j.id, j.queue, j.key_state
)
SELECT id, pg_notify(%(channel)s, CASE key_state WHEN 'new' THEN 'key:' || queue ELSE queue END) IS NULL
  FROM promoted ORDER BY id


-- name: JOB_PROMOTE_MANY
-- JOB_PROMOTE_DUE for named scheduled jobs, whatever their run_at (retry, "run now").
-- Locks: as JOB_PROMOTE_DUE, until the operator action's transaction ends.
-- Indexes: pgqueue_job_pkey (the named rows), then as JOB_PROMOTE_DUE.
-- Called by: store.promote_ids, from services.retry_jobs / run_jobs_now, after
--   JOB_RETRY_MANY / JOB_MAKE_DUE_MANY and FAIR_CLOCK_ENSURE_MANY in the same transaction.
WITH RECURSIVE
due_levels AS MATERIALIZED (
    SELECT DISTINCT queue, tenant, priority FROM pgqueue_job
     WHERE status = 'scheduled' AND id = ANY(%(ids)s::bigint[])
),
clock AS MATERIALIZED (
    SELECT c.id, c.queue, c.tenant, c.priority FROM pgqueue_fair_clock c
     WHERE (c.queue, c.tenant, c.priority) IN (SELECT queue, tenant, priority FROM due_levels)
     ORDER BY c.queue, c.tenant, c.priority
       FOR NO KEY UPDATE OF c SKIP LOCKED
),
candidate AS MATERIALIZED (
    SELECT j.id, j.run_at FROM clock k
     CROSS JOIN LATERAL (
           SELECT id, run_at FROM pgqueue_job j
            WHERE j.status = 'scheduled' AND j.id = ANY(%(ids)s::bigint[])
              AND (j.queue, j.tenant, j.priority) = (k.queue, k.tenant, k.priority)
            ORDER BY run_at, id
            LIMIT %(limit)s) j
     ORDER BY j.run_at, j.id
     LIMIT %(limit)s
),
due AS MATERIALIZED (
    SELECT j.id, j.queue, j.tenant, j.priority, j.run_at FROM pgqueue_job j
     WHERE j.id = ANY(ARRAY(SELECT id FROM candidate))  -- by id: pkey lookups, not a semi-join
       AND j.status = 'scheduled' AND j.id = ANY(%(ids)s::bigint[])
       FOR UPDATE OF j SKIP LOCKED
),
ranked AS (
    SELECT d.id, k.id AS clock_id,
           row_number() OVER (PARTITION BY k.id ORDER BY d.run_at, d.id) AS rank
      FROM due d
      JOIN clock k ON (k.queue, k.tenant, k.priority) = (d.queue, d.tenant, d.priority)
),
step AS (
    SELECT k.id, count(*) AS n,
           COALESCE(
        (SELECT qw.weight FROM pgqueue_queue_weight qw
          WHERE qw.tenant = k.tenant AND qw.queue = k.queue),
        (SELECT t.weight FROM pgqueue_tenant t WHERE t.name = k.tenant),
        1.0) AS w,
           COALESCE(
        (SELECT hj.vtime FROM pgqueue_job hj
          WHERE hj.queue = k.queue AND hj.priority = k.priority AND hj.status = 'queued'
            AND NOT hj.gated
          ORDER BY hj.vtime LIMIT 1),
        (SELECT min(hg.vtime)
           FROM (SELECT DISTINCT hl.tenant FROM pgqueue_limit hl WHERE hl.tenant <> '') ht
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
       SET status = 'queued', vtime = CASE WHEN %(fifo)s THEN extract(epoch FROM now())::float8 ELSE b.start + r.rank / b.w END,
           gated = CASE WHEN j.key_state <> 'new' THEN EXISTS (
        SELECT 1 FROM pgqueue_limit gl
         WHERE gl.tenant = j.tenant AND gl.queue IN ('', j.queue) AND (gl.max_running IS NOT NULL OR gl.rate_count IS NOT NULL OR gl.paused)) END
      FROM ranked r JOIN bump b ON b.id = r.clock_id
     WHERE j.id = r.id
    RETURNING j.id, j.queue, j.key_state
)
SELECT id, pg_notify(%(channel)s, CASE key_state WHEN 'new' THEN 'key:' || queue ELSE queue END) IS NULL
  FROM promoted ORDER BY id


-- name: JOB_PROMOTE_DUE_BY_TIME
-- JOB_PROMOTE_DUE with FAIRNESS = "time": each job is charged its task's run-time estimate
-- (one estimate per distinct task of the batch) instead of 1, and keeps the charge for
-- FAIR_CLOCK_CORRECT; a level's jobs get the running sum of their charges.
-- Locks: as JOB_PROMOTE_DUE.
-- Indexes: as JOB_PROMOTE_DUE, and pgqueue_task_stat_uniq (each task's rows).
-- Called by: store.promote_due when fairness.by_time(), from maintenance.
WITH RECURSIVE
levels(queue, tenant, priority) AS (
    (SELECT queue, tenant, priority FROM pgqueue_job
      WHERE status = 'scheduled'
      ORDER BY queue, tenant, priority LIMIT 1)
    UNION ALL
    SELECT n.queue, n.tenant, n.priority
      FROM levels l
     CROSS JOIN LATERAL (
           SELECT j.queue, j.tenant, j.priority FROM pgqueue_job j
            WHERE j.status = 'scheduled'
              AND (j.queue, j.tenant, j.priority) > (l.queue, l.tenant, l.priority)
            ORDER BY j.queue, j.tenant, j.priority LIMIT 1) n
),
due_levels AS MATERIALIZED (
    SELECT l.queue, l.tenant, l.priority FROM levels l
     WHERE EXISTS (SELECT 1 FROM pgqueue_job j
                    WHERE j.status = 'scheduled' AND j.run_at <= COALESCE(%(now)s::timestamptz, now())
                      AND (j.queue, j.tenant, j.priority) = (l.queue, l.tenant, l.priority))
     ORDER BY l.queue, l.tenant, l.priority
     LIMIT %(limit)s
),
clock AS MATERIALIZED (
    SELECT c.id, c.queue, c.tenant, c.priority FROM pgqueue_fair_clock c
     WHERE (c.queue, c.tenant, c.priority) IN (SELECT queue, tenant, priority FROM due_levels)
     ORDER BY c.queue, c.tenant, c.priority
       FOR NO KEY UPDATE OF c SKIP LOCKED
),
candidate AS MATERIALIZED (
    SELECT j.id, j.run_at FROM clock k
     CROSS JOIN LATERAL (
           SELECT id, run_at FROM pgqueue_job j
            WHERE j.status = 'scheduled' AND j.run_at <= COALESCE(%(now)s::timestamptz, now())
              AND (j.queue, j.tenant, j.priority) = (k.queue, k.tenant, k.priority)
            ORDER BY run_at, id
            LIMIT %(limit)s) j
     ORDER BY j.run_at, j.id
     LIMIT %(limit)s
),
due AS MATERIALIZED (
    SELECT j.id, j.queue, j.tenant, j.priority, j.run_at, j.task FROM pgqueue_job j
     WHERE j.id IN (SELECT id FROM candidate) AND j.status = 'scheduled' AND j.run_at <= COALESCE(%(now)s::timestamptz, now())
       FOR UPDATE OF j SKIP LOCKED
),
charge AS (
    SELECT t.task, GREATEST(%(charge_min)s::float8, COALESCE(
        (SELECT sum(ts.seconds) / NULLIF(sum(ts.count), 0) FROM pgqueue_task_stat ts
          WHERE ts.task = t.task),
        %(charge_default)s::float8)) AS c FROM (SELECT DISTINCT task FROM due) t
),
ranked AS (
    SELECT d.id, k.id AS clock_id, e.c AS charge,
           sum(e.c) OVER (PARTITION BY k.id ORDER BY d.run_at, d.id) AS rank
      FROM due d
      JOIN clock k ON (k.queue, k.tenant, k.priority) = (d.queue, d.tenant, d.priority)
      JOIN charge e ON e.task = d.task
),
step AS (
    SELECT k.id, sum(r.charge) AS n,
           COALESCE(
        (SELECT qw.weight FROM pgqueue_queue_weight qw
          WHERE qw.tenant = k.tenant AND qw.queue = k.queue),
        (SELECT t.weight FROM pgqueue_tenant t WHERE t.name = k.tenant),
        1.0) AS w,
           COALESCE(
        (SELECT hj.vtime FROM pgqueue_job hj
          WHERE hj.queue = k.queue AND hj.priority = k.priority AND hj.status = 'queued'
            AND NOT hj.gated
          ORDER BY hj.vtime LIMIT 1),
        (SELECT min(hg.vtime)
           FROM (SELECT DISTINCT hl.tenant FROM pgqueue_limit hl WHERE hl.tenant <> '') ht
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
       SET status = 'queued', vtime = CASE WHEN %(fifo)s THEN extract(epoch FROM now())::float8 ELSE b.start + r.rank / b.w END, charge = r.charge,
           gated = CASE WHEN j.key_state <> 'new' THEN EXISTS (
        SELECT 1 FROM pgqueue_limit gl
         WHERE gl.tenant = j.tenant AND gl.queue IN ('', j.queue) AND (gl.max_running IS NOT NULL OR gl.rate_count IS NOT NULL OR gl.paused)) END
      FROM ranked r JOIN bump b ON b.id = r.clock_id
     WHERE j.id = r.id
    RETURNING j.id, j.queue, j.key_state
)
SELECT id, pg_notify(%(channel)s, CASE key_state WHEN 'new' THEN 'key:' || queue ELSE queue END) IS NULL
  FROM promoted ORDER BY id


-- name: JOB_PROMOTE_MANY_BY_TIME
-- JOB_PROMOTE_MANY with FAIRNESS = "time" (the charges of JOB_PROMOTE_DUE_BY_TIME).
-- Locks: as JOB_PROMOTE_MANY.
-- Indexes: as JOB_PROMOTE_MANY, and pgqueue_task_stat_uniq.
-- Called by: store.promote_ids when fairness.by_time(), from services.retry_jobs /
--   run_jobs_now.
WITH RECURSIVE
due_levels AS MATERIALIZED (
    SELECT DISTINCT queue, tenant, priority FROM pgqueue_job
     WHERE status = 'scheduled' AND id = ANY(%(ids)s::bigint[])
),
clock AS MATERIALIZED (
    SELECT c.id, c.queue, c.tenant, c.priority FROM pgqueue_fair_clock c
     WHERE (c.queue, c.tenant, c.priority) IN (SELECT queue, tenant, priority FROM due_levels)
     ORDER BY c.queue, c.tenant, c.priority
       FOR NO KEY UPDATE OF c SKIP LOCKED
),
candidate AS MATERIALIZED (
    SELECT j.id, j.run_at FROM clock k
     CROSS JOIN LATERAL (
           SELECT id, run_at FROM pgqueue_job j
            WHERE j.status = 'scheduled' AND j.id = ANY(%(ids)s::bigint[])
              AND (j.queue, j.tenant, j.priority) = (k.queue, k.tenant, k.priority)
            ORDER BY run_at, id
            LIMIT %(limit)s) j
     ORDER BY j.run_at, j.id
     LIMIT %(limit)s
),
due AS MATERIALIZED (
    SELECT j.id, j.queue, j.tenant, j.priority, j.run_at, j.task FROM pgqueue_job j
     WHERE j.id = ANY(ARRAY(SELECT id FROM candidate))  -- by id: pkey lookups, not a semi-join
       AND j.status = 'scheduled' AND j.id = ANY(%(ids)s::bigint[])
       FOR UPDATE OF j SKIP LOCKED
),
charge AS (
    SELECT t.task, GREATEST(%(charge_min)s::float8, COALESCE(
        (SELECT sum(ts.seconds) / NULLIF(sum(ts.count), 0) FROM pgqueue_task_stat ts
          WHERE ts.task = t.task),
        %(charge_default)s::float8)) AS c FROM (SELECT DISTINCT task FROM due) t
),
ranked AS (
    SELECT d.id, k.id AS clock_id, e.c AS charge,
           sum(e.c) OVER (PARTITION BY k.id ORDER BY d.run_at, d.id) AS rank
      FROM due d
      JOIN clock k ON (k.queue, k.tenant, k.priority) = (d.queue, d.tenant, d.priority)
      JOIN charge e ON e.task = d.task
),
step AS (
    SELECT k.id, sum(r.charge) AS n,
           COALESCE(
        (SELECT qw.weight FROM pgqueue_queue_weight qw
          WHERE qw.tenant = k.tenant AND qw.queue = k.queue),
        (SELECT t.weight FROM pgqueue_tenant t WHERE t.name = k.tenant),
        1.0) AS w,
           COALESCE(
        (SELECT hj.vtime FROM pgqueue_job hj
          WHERE hj.queue = k.queue AND hj.priority = k.priority AND hj.status = 'queued'
            AND NOT hj.gated
          ORDER BY hj.vtime LIMIT 1),
        (SELECT min(hg.vtime)
           FROM (SELECT DISTINCT hl.tenant FROM pgqueue_limit hl WHERE hl.tenant <> '') ht
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
       SET status = 'queued', vtime = CASE WHEN %(fifo)s THEN extract(epoch FROM now())::float8 ELSE b.start + r.rank / b.w END, charge = r.charge,
           gated = CASE WHEN j.key_state <> 'new' THEN EXISTS (
        SELECT 1 FROM pgqueue_limit gl
         WHERE gl.tenant = j.tenant AND gl.queue IN ('', j.queue) AND (gl.max_running IS NOT NULL OR gl.rate_count IS NOT NULL OR gl.paused)) END
      FROM ranked r JOIN bump b ON b.id = r.clock_id
     WHERE j.id = r.id
    RETURNING j.id, j.queue, j.key_state
)
SELECT id, pg_notify(%(channel)s, CASE key_state WHEN 'new' THEN 'key:' || queue ELSE queue END) IS NULL
  FROM promoted ORDER BY id


-- name: FAIR_CLOCK_ENSURE_DUE
-- Create the clock row of each level with due jobs that has none (JOB_ENQUEUE_SCHEDULED
-- creates it, but a clock may have been deleted since), so that JOB_PROMOTE_DUE, which
-- promotes only the jobs of clocks it can lock, does not leave those jobs scheduled for
-- ever. A separate statement because a row inserted by one part of a statement is not
-- visible to the others: the promotion that follows must see it to lock it. The new
-- clock's vtime is 0: the promotion raises it to its level's head. The level's keeper (its
-- largest clock) is held FOR KEY SHARE first, as JOB_ENQUEUE_FIRST does: the promotion's
-- head is then read from a level FAIR_CLOCK_DELETE_IDLE cannot start again from 0
-- meanwhile (it would need the keeper FOR UPDATE), or, when the prune holds it, from a
-- snapshot taken once the prune has committed (this waits for it, and the promotion is
-- the next statement).
-- Locks: the new clock rows, and the keeper of each of their levels FOR KEY SHARE (in id
--   order), until maintenance's transaction ends. DO NOTHING takes no lock on an
--   existing row; it waits only for an uncommitted insert of the same clock (an enqueue
--   creating it), until that transaction ends. KEY SHARE waits only for a prune holding
--   the clock FOR UPDATE (never for an enqueue, a promotion or a correction).
-- Indexes: pgqueue_job_scheduled_level (as JOB_PROMOTE_DUE), pgqueue_fair_clock_uniq,
--   pgqueue_fair_clock_level (each level's keeper).
-- Called by: store.promote_due, just before JOB_PROMOTE_DUE in maintenance's transaction.
WITH RECURSIVE
levels(queue, tenant, priority) AS (
    (SELECT queue, tenant, priority FROM pgqueue_job
      WHERE status = 'scheduled'
      ORDER BY queue, tenant, priority LIMIT 1)
    UNION ALL
    SELECT n.queue, n.tenant, n.priority
      FROM levels l
     CROSS JOIN LATERAL (
           SELECT j.queue, j.tenant, j.priority FROM pgqueue_job j
            WHERE j.status = 'scheduled'
              AND (j.queue, j.tenant, j.priority) > (l.queue, l.tenant, l.priority)
            ORDER BY j.queue, j.tenant, j.priority LIMIT 1) n
),
due_levels AS MATERIALIZED (
    SELECT l.queue, l.tenant, l.priority FROM levels l
     WHERE EXISTS (SELECT 1 FROM pgqueue_job j
                    WHERE j.status = 'scheduled' AND j.run_at <= COALESCE(%(now)s::timestamptz, now())
                      AND (j.queue, j.tenant, j.priority) = (l.queue, l.tenant, l.priority))
     ORDER BY l.queue, l.tenant, l.priority
     LIMIT %(limit)s
),
missing AS MATERIALIZED (
    SELECT l.queue, l.tenant, l.priority FROM due_levels l
     WHERE NOT EXISTS (SELECT 1 FROM pgqueue_fair_clock c
                        WHERE (c.queue, c.tenant, c.priority) = (l.queue, l.tenant, l.priority))
),
held AS MATERIALIZED (
    SELECT k.id FROM pgqueue_fair_clock k
     WHERE k.id = ANY(ARRAY(
           SELECT x.id FROM (SELECT DISTINCT queue, priority FROM missing) m
            CROSS JOIN LATERAL (
                  SELECT c.id FROM pgqueue_fair_clock c
                   WHERE c.queue = m.queue AND c.priority = m.priority
                   ORDER BY c.vtime DESC, c.id LIMIT 1) x))  -- the keeper
     ORDER BY k.id
       FOR KEY SHARE OF k
)
INSERT INTO pgqueue_fair_clock (queue, tenant, priority, vtime)
SELECT m.queue, m.tenant, m.priority, 0.0 FROM missing m
 WHERE (SELECT count(*) FROM held) >= 0  -- the levels' keepers held first
 ORDER BY m.queue, m.tenant, m.priority
ON CONFLICT (queue, tenant, priority) DO NOTHING


-- name: FAIR_CLOCK_ENSURE_MANY
-- FAIR_CLOCK_ENSURE_DUE for the levels of named scheduled jobs.
-- Locks: as FAIR_CLOCK_ENSURE_DUE, until the operator action's transaction ends.
-- Indexes: pgqueue_job_pkey (the named rows), pgqueue_fair_clock_uniq.
-- Called by: store.promote_ids, just before JOB_PROMOTE_MANY.
WITH RECURSIVE
due_levels AS MATERIALIZED (
    SELECT DISTINCT queue, tenant, priority FROM pgqueue_job
     WHERE status = 'scheduled' AND id = ANY(%(ids)s::bigint[])
),
missing AS MATERIALIZED (
    SELECT l.queue, l.tenant, l.priority FROM due_levels l
     WHERE NOT EXISTS (SELECT 1 FROM pgqueue_fair_clock c
                        WHERE (c.queue, c.tenant, c.priority) = (l.queue, l.tenant, l.priority))
),
held AS MATERIALIZED (
    SELECT k.id FROM pgqueue_fair_clock k
     WHERE k.id = ANY(ARRAY(
           SELECT x.id FROM (SELECT DISTINCT queue, priority FROM missing) m
            CROSS JOIN LATERAL (
                  SELECT c.id FROM pgqueue_fair_clock c
                   WHERE c.queue = m.queue AND c.priority = m.priority
                   ORDER BY c.vtime DESC, c.id LIMIT 1) x))  -- the keeper
     ORDER BY k.id
       FOR KEY SHARE OF k
)
INSERT INTO pgqueue_fair_clock (queue, tenant, priority, vtime)
SELECT m.queue, m.tenant, m.priority, 0.0 FROM missing m
 WHERE (SELECT count(*) FROM held) >= 0  -- the levels' keepers held first
 ORDER BY m.queue, m.tenant, m.priority
ON CONFLICT (queue, tenant, priority) DO NOTHING
