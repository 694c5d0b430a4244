-- The fair clocks' upkeep: corrections of run-time charges, and idle clocks locked and
-- deleted.
-- Each statement is written here whole, as PostgreSQL runs it; values are parameters
-- (%(name)s). A header says what a statement does and why, what it locks, which indexes
-- serve it and who calls it; pgqueue/sql.py states the conventions they share.
--
-- Idle fair clocks (FAIR_CLOCK_LOCK_IDLE, FAIR_CLOCK_DELETE_IDLE).
-- A tenant's clock at a level (queue, priority) is a row of pgqueue_fair_clock for as long as
-- nothing deletes it, whatever the tenant does later: without a prune, a tenant that names a
-- queue per request leaves a row per name for ever. The prune deletes the rows whose absence
-- changes no vtime that will ever be assigned. What reads a clock (pgqueue.fairness): a
-- tenant's next start at a level is max(own clock, head), the head being the level's lowest
-- queued ungated vtime, else the lowest gated one of the limited tenants, else the level's
-- largest clock, else 0; FAIR_CLOCK_CORRECT (FAIRNESS = "time") moves a tenant's clock by its
-- settled attempts' errors; FAIR_CLOCK_REFUND and JOB_PROMOTE_* lock and move clocks that
-- exist (FAIR_CLOCK_ENSURE_* and JOB_ENQUEUE_SCHEDULED create them first, at 0: a promotion
-- raises a clock to the head anyway). A tenant is *live* at a level while it has a job there
-- that is queued (gated or not), scheduled or running, or, by time, an attempt there that
-- FAIR_CLOCK_CORRECT has not passed yet (past pgqueue_stat_mark row 2). Two rules:
-- (a) A level with nothing live (no tenant live there) loses every clock: every tenant then
--     starts at 0 + its charge, where it would have started at the largest clock + its charge
--     (the head, which no tenant's clock exceeds). Only differences of vtimes order jobs, and
--     the level holds no job with a vtime to compare them with: the same order.
-- (b) In any level, a clock of a tenant not live there whose vtime is at or below the
--     level's *floor* goes, but for the level's *keeper* (its largest clock, the oldest of
--     equals). The floor is the least of the vtimes of the level's queued
--     (ungated or gated) and running jobs and of its largest clock. Every head from now on
--     is at least the floor: it is one of those vtimes (a running job given back is queued
--     again with its vtime), or a vtime assigned later (above the head of then), or the
--     largest clock (the keeper stays; a clock never moves below the head of its time, a
--     refund only gives back what its own transaction charged). So the tenant's next start,
--     max(clock, head), is the head with or without its clock. With nothing queued the
--     largest clock is the head, kept by the keeper (so clocks tied with it may go). A
--     tenant not live has nothing for FAIR_CLOCK_CORRECT to move, and its scheduled jobs,
--     if any appeared, would take their vtime from the head at promotion.
-- What is checked, and how: a tenant's scheduled and gated jobs at the level, one probe each
-- (pgqueue_job_scheduled_level, pgqueue_job_gated); its running jobs, read with every
-- running job (pgqueue_job_lease: a few per worker thread); its attempts the correction has
-- not passed (by time: those past the mark, at most 100,000 of them, else
-- nothing is deleted). Its queued ungated jobs have no index by tenant, so rule (b) needs
-- either a level with none queued, or fair ordering by jobs (%(by_vtime)s) and a clock
-- strictly below the floor: a tenant's clock is then at least the vtime of each of its
-- queued and running jobs (each was assigned at most the clock it left), so such a clock
-- has none. With FIFO (vtimes are timestamps) or by time (a credit may take a clock below
-- its own backlog) rule (b) waits for a level with nothing queued. Rule (a) needs every row
-- of the level locked at once (so at most %(limit)s of them); a larger level first loses
-- its rows by rule (b), a limit's worth a pass, down to its keeper.
-- Concurrency. FAIR_CLOCK_LOCK_IDLE chooses in its snapshot and locks the chosen rows FOR
-- UPDATE SKIP LOCKED; FAIR_CLOCK_DELETE_IDLE, the next statement of the same transaction,
-- decides again with a new snapshot (READ COMMITTED), which shows every job committed
-- before the locks were granted, and deletes. A row an enqueue of its tenant has charged is
-- held by it (its UPDATE or upsert) until that enqueue commits or rolls back, so it is
-- skipped: never deleted under an uncommitted job; a job committed before the lock is seen
-- by the second snapshot. An enqueue that reaches a row once it is locked waits, finds it
-- deleted, and store.enqueue goes on with JOB_ENQUEUE_FIRST, which takes the head afresh.
-- Rule (a) deletes a level only when every row its second snapshot shows is among the rows
-- locked, so a level where an enqueue or a promotion holds a clock is left whole; a first
-- enqueue at a level (JOB_ENQUEUE_FIRST) and FAIR_CLOCK_ENSURE_* hold the level's keeper FOR
-- KEY SHARE before writing a vtime of the level's scale (which rule (a) would start again
-- from 0), so the keeper is skipped here, or they wait and see it deleted (and run again).
-- What is left: an enqueue whose statement read an older head (its snapshot predates
-- claims that moved the head on) and commits after the prune puts jobs below the floor this
-- prune saw; a tenant pruned then starts at that older head on its next job, as the
-- enqueue's own jobs did, rather than at its clock. A mode changed meanwhile (ORDERING,
-- FAIRNESS) is outside all this: it applies to jobs that become runnable afterwards.


-- name: FAIR_CLOCK_CORRECT
-- With FAIRNESS = "time": move each tenant's clock by the error of the run-time charges of
-- its settled attempts, sum((actual - charge) / weight) (actual: the handler's run time; an
-- attempt whose handler was never seen to start is passed over), so that its later jobs pay for
-- what its earlier ones cost beyond (or below) their estimate. Attempts are read like
-- TASK_STAT_FOLD's (settled, id order, at most %(limit)s) from a mark of their own
-- (pgqueue_stat_mark row 2); jobs without a charge (made runnable by jobs) are passed over.
-- Settled: finished %(settle)s seconds before this statement (clock_timestamp(), the clock
-- the attempts' ends are bounded by when they are recorded).
-- A credit moves a clock back at most to its level's head (and never a clock already
-- below it): an idle tenant banks nothing, as at a charge.
-- Locks: the mark row (FOR UPDATE) and the clock rows of the attempts read (FOR NO KEY
--   UPDATE, as JOB_PROMOTE_DUE's), in sorted order with SKIP LOCKED, until maintenance's
--   transaction ends. A clock held by an open enqueue is not waited for: the mark stops
--   before the first attempt of a held clock, and that attempt and those after it are read
--   again by the next run, so none is counted twice or lost (a held clock delays
--   corrections only, never a job).
-- Indexes: pgqueue_job_attempt_pkey (id > mark), pgqueue_job_pkey (each attempt's job),
--   pgqueue_fair_clock_uniq, one tuple of pgqueue_job_claim / pgqueue_fair_clock_level for
--   each level's head, pgqueue_stat_mark_pkey.
-- Called by: store.correct_fair_clocks, from maintenance (one worker at a time) when
--   fairness.by_time().
WITH mark AS (
    SELECT COALESCE(
        (SELECT last_attempt_id FROM pgqueue_stat_mark WHERE id = 2 FOR UPDATE), 0
    ) AS last_attempt_id
),
fresh AS MATERIALIZED (
    SELECT a.id, j.queue, j.tenant, j.priority,
           GREATEST(extract(epoch FROM a.finished_at - a.started_at)::float8, 0)
           - j.charge AS error
      FROM pgqueue_job_attempt a
      JOIN pgqueue_job j ON j.id = a.job_id
     WHERE a.id > (SELECT last_attempt_id FROM mark)
       AND a.finished_at <= clock_timestamp() - %(settle)s * interval '1 second'
     ORDER BY a.id
     LIMIT %(limit)s
),
clock AS MATERIALIZED (
    SELECT c.id, c.queue, c.tenant, c.priority FROM pgqueue_fair_clock c
     WHERE (c.queue, c.tenant, c.priority) IN
           (SELECT queue, tenant, priority FROM fresh WHERE error IS NOT NULL)
     ORDER BY c.queue, c.tenant, c.priority
       FOR NO KEY UPDATE OF c SKIP LOCKED
),
held AS (
    SELECT min(f.id) AS id FROM fresh f
     WHERE f.error IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM clock k
                        WHERE (k.queue, k.tenant, k.priority) = (f.queue, f.tenant, f.priority))
       AND EXISTS (SELECT 1 FROM pgqueue_fair_clock c
                    WHERE (c.queue, c.tenant, c.priority) = (f.queue, f.tenant, f.priority))
),
applied AS (
    SELECT * FROM fresh WHERE id < COALESCE((SELECT id FROM held), 9223372036854775807)
),
corrected AS (
    UPDATE pgqueue_fair_clock c
       SET vtime = GREATEST(c.vtime + x.d, LEAST(c.vtime, x.h))
      FROM (SELECT k.id, sum(a.error) / COALESCE(
        (SELECT qw.weight FROM pgqueue_queue_weight qw
          WHERE qw.tenant = k.tenant AND qw.queue = k.queue),
        (SELECT t.weight FROM pgqueue_tenant t WHERE t.name = k.tenant),
        1.0) AS d,
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
              FROM applied a
              JOIN clock k ON (k.queue, k.tenant, k.priority) = (a.queue, a.tenant, a.priority)
             WHERE a.error IS NOT NULL
             GROUP BY k.id, k.queue, k.tenant, k.priority) x
     WHERE c.id = x.id
)
INSERT INTO pgqueue_stat_mark (id, last_attempt_id)
SELECT 2, max(id) FROM applied HAVING count(*) > 0
ON CONFLICT (id) DO UPDATE SET last_attempt_id = EXCLUDED.last_attempt_id
RETURNING last_attempt_id


-- name: FAIR_CLOCK_LOCK_IDLE
-- The prune's first statement (see "Idle fair clocks" above): walk up to %(levels)s levels
-- after (%(after_queue)s, %(after_priority)s), in (queue, priority) order, and lock up to
-- %(limit)s of their clock rows that rule (a) or (b) would delete in this snapshot: every
-- row of a quiet level whose tenants are all not live, and the rows at or below the floor
-- of tenants not live (but the keeper), in (level, vtime) order. Returns the ids locked,
-- the number of levels walked, whether the chosen rows filled %(limit)s, and where the
-- next prune goes on after: the last level walked, or when the limit cut a level short,
-- the one before it (none: where this one started); fewer than %(levels)s walked and the
-- limit not reached: from the first again.
-- Locks: the chosen rows, FOR UPDATE SKIP LOCKED (a row an enqueue, a promotion or a
--   correction holds is left for a later pass; never waits), until the prune's
--   transaction ends (FAIR_CLOCK_DELETE_IDLE is the only other statement in it).
-- Indexes: pgqueue_fair_clock_level (the walk, one descent per level; each level's largest
--   clock and its rows), pgqueue_job_claim and pgqueue_job_gated (each level's lowest
--   queued vtimes, as the head's), pgqueue_job_lease (the running jobs),
--   pgqueue_job_scheduled_level and pgqueue_job_gated (a probe per row considered),
--   pgqueue_fair_clock_pkey; by time, pgqueue_job_attempt_pkey and pgqueue_job_pkey (the
--   attempts past the correction's mark).
-- Called by: fair_store.prune_fair_clocks, from maintenance.prune_idle_clocks, in a
--   transaction of its own after a maintenance pass (so not under MAINTENANCE_TRY_LOCK:
--   two prunes lock disjoint rows, and each deletes a level whole only when it holds all
--   of it).
WITH RECURSIVE walk(queue, priority) AS (
    (SELECT queue, priority FROM pgqueue_fair_clock
      WHERE (queue, priority) > (%(after_queue)s, (%(after_priority)s)::smallint)
      ORDER BY queue, priority LIMIT 1)
    UNION ALL
    SELECT n.queue, n.priority FROM walk w
     CROSS JOIN LATERAL (
           SELECT c.queue, c.priority FROM pgqueue_fair_clock c
            WHERE (c.queue, c.priority) > (w.queue, w.priority)
            ORDER BY c.queue, c.priority LIMIT 1) n
),
levels AS MATERIALIZED (SELECT queue, priority FROM walk LIMIT %(levels)s),

running AS MATERIALIZED (
    SELECT queue, tenant, priority, min(vtime) AS vtime FROM pgqueue_job
     WHERE status = 'running'
     GROUP BY queue, tenant, priority
),
pending AS MATERIALIZED (
    SELECT NULL::varchar AS queue, NULL::varchar AS tenant, NULL::smallint AS priority
     WHERE FALSE
),
unknown AS MATERIALIZED (SELECT FALSE AS yes),
facts AS MATERIALIZED (
    SELECT l.queue, l.priority, x.qmin, k.id AS keeper,
           LEAST(x.qmin, x.gmin, r.vtime, k.vtime) AS floor,
           x.qmin IS NULL AND x.gmin IS NULL AND r.queue IS NULL
           AND NOT EXISTS (SELECT 1 FROM pending p
                            WHERE p.queue = l.queue AND p.priority = l.priority)
           AND NOT (SELECT yes FROM unknown) AS quiet
      FROM levels l
      LEFT JOIN (SELECT queue, priority, min(vtime) AS vtime FROM running
                  GROUP BY queue, priority) r
        ON r.queue = l.queue AND r.priority = l.priority
     CROSS JOIN LATERAL (
           SELECT (SELECT hj.vtime FROM pgqueue_job hj
          WHERE hj.queue = l.queue AND hj.priority = l.priority AND hj.status = 'queued'
            AND NOT hj.gated
          ORDER BY hj.vtime LIMIT 1) AS qmin,
                  (SELECT min(hg.vtime)
           FROM (SELECT DISTINCT hl.tenant FROM pgqueue_limit hl WHERE hl.tenant <> '') ht
          CROSS JOIN LATERAL (
                SELECT g.vtime FROM pgqueue_job g
                 WHERE g.queue = l.queue AND g.tenant = ht.tenant
                   AND g.priority = l.priority AND g.status = 'queued' AND g.gated
                 ORDER BY g.priority DESC, g.vtime LIMIT 1) hg) AS gmin) x
     CROSS JOIN LATERAL (
           SELECT m.id, m.vtime FROM pgqueue_fair_clock m
            WHERE m.queue = l.queue AND m.priority = l.priority
            ORDER BY m.vtime DESC, m.id LIMIT 1) k
),
idle_levels AS MATERIALIZED (
    SELECT f.queue, f.priority FROM facts f
     WHERE f.quiet
       AND NOT EXISTS (SELECT 1 FROM pgqueue_fair_clock o
                        WHERE o.queue = f.queue AND o.priority = f.priority
                          AND NOT (NOT EXISTS (SELECT 1 FROM pgqueue_job s
                    WHERE s.queue = o.queue AND s.tenant = o.tenant
                      AND s.priority = o.priority AND s.status = 'scheduled')
           AND NOT EXISTS (SELECT 1 FROM pgqueue_job g
                    WHERE g.queue = o.queue AND g.tenant = o.tenant
                      AND g.priority = o.priority AND g.status = 'queued' AND g.gated)
           AND NOT EXISTS (SELECT 1 FROM running r
                    WHERE (r.queue, r.tenant, r.priority) = (o.queue, o.tenant, o.priority))
           AND NOT EXISTS (SELECT 1 FROM pending p
                    WHERE (p.queue, p.tenant, p.priority) = (o.queue, o.tenant, o.priority))
           AND NOT (SELECT yes FROM unknown)))
),
chosen AS MATERIALIZED (
    SELECT id, queue, priority FROM (
        SELECT c.id, c.queue, c.priority, c.vtime FROM idle_levels i
          JOIN pgqueue_fair_clock c ON c.queue = i.queue AND c.priority = i.priority
        UNION
        SELECT c.id, c.queue, c.priority, c.vtime FROM facts f
          JOIN pgqueue_fair_clock c  -- a range of the level's index: the rows below the floor
            ON c.queue = f.queue AND c.priority = f.priority AND c.vtime <= f.floor
         WHERE CASE WHEN f.qmin IS NULL THEN c.vtime <= f.floor
                ELSE %(by_vtime)s AND c.vtime < f.floor END
           AND c.id <> f.keeper AND NOT EXISTS (SELECT 1 FROM pgqueue_job s
                    WHERE s.queue = c.queue AND s.tenant = c.tenant
                      AND s.priority = c.priority AND s.status = 'scheduled')
           AND NOT EXISTS (SELECT 1 FROM pgqueue_job g
                    WHERE g.queue = c.queue AND g.tenant = c.tenant
                      AND g.priority = c.priority AND g.status = 'queued' AND g.gated)
           AND NOT EXISTS (SELECT 1 FROM running r
                    WHERE (r.queue, r.tenant, r.priority) = (c.queue, c.tenant, c.priority))
           AND NOT EXISTS (SELECT 1 FROM pending p
                    WHERE (p.queue, p.tenant, p.priority) = (c.queue, c.tenant, c.priority))
           AND NOT (SELECT yes FROM unknown)) x
     ORDER BY queue, priority, vtime, id
     LIMIT %(limit)s
),
locked AS MATERIALIZED (
    SELECT c.id FROM pgqueue_fair_clock c
     WHERE c.id = ANY(ARRAY(SELECT id FROM chosen))
     ORDER BY c.id
       FOR UPDATE SKIP LOCKED
),
cut AS MATERIALIZED (  -- the rows chosen filled the limit: the last level may have more
    SELECT queue, priority FROM chosen
     WHERE (SELECT count(*) FROM chosen) >= %(limit)s
     ORDER BY queue DESC, priority DESC LIMIT 1
),
last AS (  -- the next prune goes on after this level: before the one the limit cut short
    SELECT queue, priority FROM levels
     WHERE NOT EXISTS (SELECT 1 FROM cut)
        OR (queue, priority) < (SELECT c.queue, c.priority FROM cut c)
     ORDER BY queue DESC, priority DESC LIMIT 1
)
SELECT ARRAY(SELECT id FROM locked), (SELECT count(*) FROM levels), EXISTS (SELECT 1 FROM cut),
       (SELECT queue FROM last), (SELECT priority FROM last)


-- name: FAIR_CLOCK_LOCK_IDLE_BY_TIME
-- FAIR_CLOCK_LOCK_IDLE with FAIRNESS = "time": a tenant with an attempt FAIR_CLOCK_CORRECT
-- has not passed yet is live where that attempt's job is.
-- Locks, Indexes, Called by: as FAIR_CLOCK_LOCK_IDLE.
WITH RECURSIVE walk(queue, priority) AS (
    (SELECT queue, priority FROM pgqueue_fair_clock
      WHERE (queue, priority) > (%(after_queue)s, (%(after_priority)s)::smallint)
      ORDER BY queue, priority LIMIT 1)
    UNION ALL
    SELECT n.queue, n.priority FROM walk w
     CROSS JOIN LATERAL (
           SELECT c.queue, c.priority FROM pgqueue_fair_clock c
            WHERE (c.queue, c.priority) > (w.queue, w.priority)
            ORDER BY c.queue, c.priority LIMIT 1) n
),
levels AS MATERIALIZED (SELECT queue, priority FROM walk LIMIT %(levels)s),

running AS MATERIALIZED (
    SELECT queue, tenant, priority, min(vtime) AS vtime FROM pgqueue_job
     WHERE status = 'running'
     GROUP BY queue, tenant, priority
),
recent AS MATERIALIZED (
    SELECT a.job_id FROM pgqueue_job_attempt a
     WHERE a.id > COALESCE((SELECT last_attempt_id FROM pgqueue_stat_mark WHERE id = 2), 0)
     ORDER BY a.id
     LIMIT 100001
),
pending AS MATERIALIZED (
    SELECT DISTINCT j.queue, j.tenant, j.priority
      FROM recent a JOIN pgqueue_job j ON j.id = a.job_id
     WHERE j.charge IS NOT NULL
),
unknown AS MATERIALIZED (SELECT count(*) > 100000 AS yes FROM recent),
facts AS MATERIALIZED (
    SELECT l.queue, l.priority, x.qmin, k.id AS keeper,
           LEAST(x.qmin, x.gmin, r.vtime, k.vtime) AS floor,
           x.qmin IS NULL AND x.gmin IS NULL AND r.queue IS NULL
           AND NOT EXISTS (SELECT 1 FROM pending p
                            WHERE p.queue = l.queue AND p.priority = l.priority)
           AND NOT (SELECT yes FROM unknown) AS quiet
      FROM levels l
      LEFT JOIN (SELECT queue, priority, min(vtime) AS vtime FROM running
                  GROUP BY queue, priority) r
        ON r.queue = l.queue AND r.priority = l.priority
     CROSS JOIN LATERAL (
           SELECT (SELECT hj.vtime FROM pgqueue_job hj
          WHERE hj.queue = l.queue AND hj.priority = l.priority AND hj.status = 'queued'
            AND NOT hj.gated
          ORDER BY hj.vtime LIMIT 1) AS qmin,
                  (SELECT min(hg.vtime)
           FROM (SELECT DISTINCT hl.tenant FROM pgqueue_limit hl WHERE hl.tenant <> '') ht
          CROSS JOIN LATERAL (
                SELECT g.vtime FROM pgqueue_job g
                 WHERE g.queue = l.queue AND g.tenant = ht.tenant
                   AND g.priority = l.priority AND g.status = 'queued' AND g.gated
                 ORDER BY g.priority DESC, g.vtime LIMIT 1) hg) AS gmin) x
     CROSS JOIN LATERAL (
           SELECT m.id, m.vtime FROM pgqueue_fair_clock m
            WHERE m.queue = l.queue AND m.priority = l.priority
            ORDER BY m.vtime DESC, m.id LIMIT 1) k
),
idle_levels AS MATERIALIZED (
    SELECT f.queue, f.priority FROM facts f
     WHERE f.quiet
       AND NOT EXISTS (SELECT 1 FROM pgqueue_fair_clock o
                        WHERE o.queue = f.queue AND o.priority = f.priority
                          AND NOT (NOT EXISTS (SELECT 1 FROM pgqueue_job s
                    WHERE s.queue = o.queue AND s.tenant = o.tenant
                      AND s.priority = o.priority AND s.status = 'scheduled')
           AND NOT EXISTS (SELECT 1 FROM pgqueue_job g
                    WHERE g.queue = o.queue AND g.tenant = o.tenant
                      AND g.priority = o.priority AND g.status = 'queued' AND g.gated)
           AND NOT EXISTS (SELECT 1 FROM running r
                    WHERE (r.queue, r.tenant, r.priority) = (o.queue, o.tenant, o.priority))
           AND NOT EXISTS (SELECT 1 FROM pending p
                    WHERE (p.queue, p.tenant, p.priority) = (o.queue, o.tenant, o.priority))
           AND NOT (SELECT yes FROM unknown)))
),
chosen AS MATERIALIZED (
    SELECT id, queue, priority FROM (
        SELECT c.id, c.queue, c.priority, c.vtime FROM idle_levels i
          JOIN pgqueue_fair_clock c ON c.queue = i.queue AND c.priority = i.priority
        UNION
        SELECT c.id, c.queue, c.priority, c.vtime FROM facts f
          JOIN pgqueue_fair_clock c  -- a range of the level's index: the rows below the floor
            ON c.queue = f.queue AND c.priority = f.priority AND c.vtime <= f.floor
         WHERE CASE WHEN f.qmin IS NULL THEN c.vtime <= f.floor
                ELSE %(by_vtime)s AND c.vtime < f.floor END
           AND c.id <> f.keeper AND NOT EXISTS (SELECT 1 FROM pgqueue_job s
                    WHERE s.queue = c.queue AND s.tenant = c.tenant
                      AND s.priority = c.priority AND s.status = 'scheduled')
           AND NOT EXISTS (SELECT 1 FROM pgqueue_job g
                    WHERE g.queue = c.queue AND g.tenant = c.tenant
                      AND g.priority = c.priority AND g.status = 'queued' AND g.gated)
           AND NOT EXISTS (SELECT 1 FROM running r
                    WHERE (r.queue, r.tenant, r.priority) = (c.queue, c.tenant, c.priority))
           AND NOT EXISTS (SELECT 1 FROM pending p
                    WHERE (p.queue, p.tenant, p.priority) = (c.queue, c.tenant, c.priority))
           AND NOT (SELECT yes FROM unknown)) x
     ORDER BY queue, priority, vtime, id
     LIMIT %(limit)s
),
locked AS MATERIALIZED (
    SELECT c.id FROM pgqueue_fair_clock c
     WHERE c.id = ANY(ARRAY(SELECT id FROM chosen))
     ORDER BY c.id
       FOR UPDATE SKIP LOCKED
),
cut AS MATERIALIZED (  -- the rows chosen filled the limit: the last level may have more
    SELECT queue, priority FROM chosen
     WHERE (SELECT count(*) FROM chosen) >= %(limit)s
     ORDER BY queue DESC, priority DESC LIMIT 1
),
last AS (  -- the next prune goes on after this level: before the one the limit cut short
    SELECT queue, priority FROM levels
     WHERE NOT EXISTS (SELECT 1 FROM cut)
        OR (queue, priority) < (SELECT c.queue, c.priority FROM cut c)
     ORDER BY queue DESC, priority DESC LIMIT 1
)
SELECT ARRAY(SELECT id FROM locked), (SELECT count(*) FROM levels), EXISTS (SELECT 1 FROM cut),
       (SELECT queue FROM last), (SELECT priority FROM last)


-- name: FAIR_CLOCK_DELETE_IDLE
-- The prune's second statement (see "Idle fair clocks" above): of the rows %(ids)s that
-- FAIR_CLOCK_LOCK_IDLE locked, delete those rule (a) or (b) deletes in this statement's own
-- snapshot, taken after the locks: a job of their tenant committed meanwhile keeps a row;
-- rule (a) needs every row of the level among %(ids)s. Returns the rows deleted.
-- Locks: the rows (already held).
-- Indexes: pgqueue_fair_clock_pkey, then as FAIR_CLOCK_LOCK_IDLE for the levels of the rows.
-- Called by: fair_store.prune_fair_clocks, right after FAIR_CLOCK_LOCK_IDLE when it locked
--   any row.
WITH mine AS MATERIALIZED (
    SELECT c.id, c.queue, c.tenant, c.priority, c.vtime FROM pgqueue_fair_clock c
     WHERE c.id = ANY(%(ids)s::bigint[])
),
levels AS MATERIALIZED (SELECT queue, priority, count(*) AS n FROM mine GROUP BY queue, priority),

running AS MATERIALIZED (
    SELECT queue, tenant, priority, min(vtime) AS vtime FROM pgqueue_job
     WHERE status = 'running'
     GROUP BY queue, tenant, priority
),
pending AS MATERIALIZED (
    SELECT NULL::varchar AS queue, NULL::varchar AS tenant, NULL::smallint AS priority
     WHERE FALSE
),
unknown AS MATERIALIZED (SELECT FALSE AS yes),
facts AS MATERIALIZED (
    SELECT l.queue, l.priority, x.qmin, k.id AS keeper,
           LEAST(x.qmin, x.gmin, r.vtime, k.vtime) AS floor,
           x.qmin IS NULL AND x.gmin IS NULL AND r.queue IS NULL
           AND NOT EXISTS (SELECT 1 FROM pending p
                            WHERE p.queue = l.queue AND p.priority = l.priority)
           AND NOT (SELECT yes FROM unknown) AS quiet
      FROM levels l
      LEFT JOIN (SELECT queue, priority, min(vtime) AS vtime FROM running
                  GROUP BY queue, priority) r
        ON r.queue = l.queue AND r.priority = l.priority
     CROSS JOIN LATERAL (
           SELECT (SELECT hj.vtime FROM pgqueue_job hj
          WHERE hj.queue = l.queue AND hj.priority = l.priority AND hj.status = 'queued'
            AND NOT hj.gated
          ORDER BY hj.vtime LIMIT 1) AS qmin,
                  (SELECT min(hg.vtime)
           FROM (SELECT DISTINCT hl.tenant FROM pgqueue_limit hl WHERE hl.tenant <> '') ht
          CROSS JOIN LATERAL (
                SELECT g.vtime FROM pgqueue_job g
                 WHERE g.queue = l.queue AND g.tenant = ht.tenant
                   AND g.priority = l.priority AND g.status = 'queued' AND g.gated
                 ORDER BY g.priority DESC, g.vtime LIMIT 1) hg) AS gmin) x
     CROSS JOIN LATERAL (
           SELECT m.id, m.vtime FROM pgqueue_fair_clock m
            WHERE m.queue = l.queue AND m.priority = l.priority
            ORDER BY m.vtime DESC, m.id LIMIT 1) k
),
whole AS MATERIALIZED (  -- rule (a): quiet, every row locked here, no tenant live
    SELECT f.queue, f.priority FROM facts f JOIN levels l USING (queue, priority)
     WHERE f.quiet
       AND (SELECT count(*) FROM (SELECT 1 FROM pgqueue_fair_clock o
                                   WHERE o.queue = f.queue AND o.priority = f.priority
                                   LIMIT l.n + 1) a) = l.n
       AND NOT EXISTS (SELECT 1 FROM mine m
                        WHERE m.queue = f.queue AND m.priority = f.priority
                          AND NOT (NOT EXISTS (SELECT 1 FROM pgqueue_job s
                    WHERE s.queue = m.queue AND s.tenant = m.tenant
                      AND s.priority = m.priority AND s.status = 'scheduled')
           AND NOT EXISTS (SELECT 1 FROM pgqueue_job g
                    WHERE g.queue = m.queue AND g.tenant = m.tenant
                      AND g.priority = m.priority AND g.status = 'queued' AND g.gated)
           AND NOT EXISTS (SELECT 1 FROM running r
                    WHERE (r.queue, r.tenant, r.priority) = (m.queue, m.tenant, m.priority))
           AND NOT EXISTS (SELECT 1 FROM pending p
                    WHERE (p.queue, p.tenant, p.priority) = (m.queue, m.tenant, m.priority))
           AND NOT (SELECT yes FROM unknown)))
),
doomed AS MATERIALIZED (
    SELECT m.id FROM mine m JOIN facts f ON f.queue = m.queue AND f.priority = m.priority
     WHERE (m.queue, m.priority) IN (SELECT queue, priority FROM whole)
        OR CASE WHEN f.qmin IS NULL THEN m.vtime <= f.floor
                ELSE %(by_vtime)s AND m.vtime < f.floor END
           AND m.id <> f.keeper AND NOT EXISTS (SELECT 1 FROM pgqueue_job s
                    WHERE s.queue = m.queue AND s.tenant = m.tenant
                      AND s.priority = m.priority AND s.status = 'scheduled')
           AND NOT EXISTS (SELECT 1 FROM pgqueue_job g
                    WHERE g.queue = m.queue AND g.tenant = m.tenant
                      AND g.priority = m.priority AND g.status = 'queued' AND g.gated)
           AND NOT EXISTS (SELECT 1 FROM running r
                    WHERE (r.queue, r.tenant, r.priority) = (m.queue, m.tenant, m.priority))
           AND NOT EXISTS (SELECT 1 FROM pending p
                    WHERE (p.queue, p.tenant, p.priority) = (m.queue, m.tenant, m.priority))
           AND NOT (SELECT yes FROM unknown)
)
DELETE FROM pgqueue_fair_clock c USING doomed d WHERE c.id = d.id
RETURNING c.queue, c.tenant, c.priority, c.vtime


-- name: FAIR_CLOCK_DELETE_IDLE_BY_TIME
-- FAIR_CLOCK_DELETE_IDLE with FAIRNESS = "time" (see FAIR_CLOCK_LOCK_IDLE_BY_TIME).
-- Locks, Indexes, Called by: as FAIR_CLOCK_DELETE_IDLE.
WITH mine AS MATERIALIZED (
    SELECT c.id, c.queue, c.tenant, c.priority, c.vtime FROM pgqueue_fair_clock c
     WHERE c.id = ANY(%(ids)s::bigint[])
),
levels AS MATERIALIZED (SELECT queue, priority, count(*) AS n FROM mine GROUP BY queue, priority),

running AS MATERIALIZED (
    SELECT queue, tenant, priority, min(vtime) AS vtime FROM pgqueue_job
     WHERE status = 'running'
     GROUP BY queue, tenant, priority
),
recent AS MATERIALIZED (
    SELECT a.job_id FROM pgqueue_job_attempt a
     WHERE a.id > COALESCE((SELECT last_attempt_id FROM pgqueue_stat_mark WHERE id = 2), 0)
     ORDER BY a.id
     LIMIT 100001
),
pending AS MATERIALIZED (
    SELECT DISTINCT j.queue, j.tenant, j.priority
      FROM recent a JOIN pgqueue_job j ON j.id = a.job_id
     WHERE j.charge IS NOT NULL
),
unknown AS MATERIALIZED (SELECT count(*) > 100000 AS yes FROM recent),
facts AS MATERIALIZED (
    SELECT l.queue, l.priority, x.qmin, k.id AS keeper,
           LEAST(x.qmin, x.gmin, r.vtime, k.vtime) AS floor,
           x.qmin IS NULL AND x.gmin IS NULL AND r.queue IS NULL
           AND NOT EXISTS (SELECT 1 FROM pending p
                            WHERE p.queue = l.queue AND p.priority = l.priority)
           AND NOT (SELECT yes FROM unknown) AS quiet
      FROM levels l
      LEFT JOIN (SELECT queue, priority, min(vtime) AS vtime FROM running
                  GROUP BY queue, priority) r
        ON r.queue = l.queue AND r.priority = l.priority
     CROSS JOIN LATERAL (
           SELECT (SELECT hj.vtime FROM pgqueue_job hj
          WHERE hj.queue = l.queue AND hj.priority = l.priority AND hj.status = 'queued'
            AND NOT hj.gated
          ORDER BY hj.vtime LIMIT 1) AS qmin,
                  (SELECT min(hg.vtime)
           FROM (SELECT DISTINCT hl.tenant FROM pgqueue_limit hl WHERE hl.tenant <> '') ht
          CROSS JOIN LATERAL (
                SELECT g.vtime FROM pgqueue_job g
                 WHERE g.queue = l.queue AND g.tenant = ht.tenant
                   AND g.priority = l.priority AND g.status = 'queued' AND g.gated
                 ORDER BY g.priority DESC, g.vtime LIMIT 1) hg) AS gmin) x
     CROSS JOIN LATERAL (
           SELECT m.id, m.vtime FROM pgqueue_fair_clock m
            WHERE m.queue = l.queue AND m.priority = l.priority
            ORDER BY m.vtime DESC, m.id LIMIT 1) k
),
whole AS MATERIALIZED (  -- rule (a): quiet, every row locked here, no tenant live
    SELECT f.queue, f.priority FROM facts f JOIN levels l USING (queue, priority)
     WHERE f.quiet
       AND (SELECT count(*) FROM (SELECT 1 FROM pgqueue_fair_clock o
                                   WHERE o.queue = f.queue AND o.priority = f.priority
                                   LIMIT l.n + 1) a) = l.n
       AND NOT EXISTS (SELECT 1 FROM mine m
                        WHERE m.queue = f.queue AND m.priority = f.priority
                          AND NOT (NOT EXISTS (SELECT 1 FROM pgqueue_job s
                    WHERE s.queue = m.queue AND s.tenant = m.tenant
                      AND s.priority = m.priority AND s.status = 'scheduled')
           AND NOT EXISTS (SELECT 1 FROM pgqueue_job g
                    WHERE g.queue = m.queue AND g.tenant = m.tenant
                      AND g.priority = m.priority AND g.status = 'queued' AND g.gated)
           AND NOT EXISTS (SELECT 1 FROM running r
                    WHERE (r.queue, r.tenant, r.priority) = (m.queue, m.tenant, m.priority))
           AND NOT EXISTS (SELECT 1 FROM pending p
                    WHERE (p.queue, p.tenant, p.priority) = (m.queue, m.tenant, m.priority))
           AND NOT (SELECT yes FROM unknown)))
),
doomed AS MATERIALIZED (
    SELECT m.id FROM mine m JOIN facts f ON f.queue = m.queue AND f.priority = m.priority
     WHERE (m.queue, m.priority) IN (SELECT queue, priority FROM whole)
        OR CASE WHEN f.qmin IS NULL THEN m.vtime <= f.floor
                ELSE %(by_vtime)s AND m.vtime < f.floor END
           AND m.id <> f.keeper AND NOT EXISTS (SELECT 1 FROM pgqueue_job s
                    WHERE s.queue = m.queue AND s.tenant = m.tenant
                      AND s.priority = m.priority AND s.status = 'scheduled')
           AND NOT EXISTS (SELECT 1 FROM pgqueue_job g
                    WHERE g.queue = m.queue AND g.tenant = m.tenant
                      AND g.priority = m.priority AND g.status = 'queued' AND g.gated)
           AND NOT EXISTS (SELECT 1 FROM running r
                    WHERE (r.queue, r.tenant, r.priority) = (m.queue, m.tenant, m.priority))
           AND NOT EXISTS (SELECT 1 FROM pending p
                    WHERE (p.queue, p.tenant, p.priority) = (m.queue, m.tenant, m.priority))
           AND NOT (SELECT yes FROM unknown)
)
DELETE FROM pgqueue_fair_clock c USING doomed d WHERE c.id = d.id
RETURNING c.queue, c.tenant, c.priority, c.vtime
