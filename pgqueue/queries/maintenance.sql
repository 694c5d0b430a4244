-- Maintenance and operator statements: weights, the maintenance lock, workers, task
-- statistics and the pruning of finished jobs (periodic schedules: periodic.sql).
-- Each statement is written here whole, as PostgreSQL runs it; values are parameters
-- (%(name)s). A header says what a statement does and why, what it locks, which indexes
-- serve it and who calls it; pgqueue/sql.py states the conventions they share.


-- name: TENANT_WEIGHT_SET
-- Create or update a tenant's weight in every queue. Takes effect for jobs that become
-- runnable afterwards.
-- Locks: the tenant row, until the caller's transaction ends.
-- Index: pgqueue_tenant_pkey.
-- Called by: store.set_weight (no queue), from services.set_tenant_weight (admin, HTTP API).
INSERT INTO pgqueue_tenant (name, weight) VALUES (%(tenant)s, %(weight)s)
ON CONFLICT (name) DO UPDATE SET weight = EXCLUDED.weight


-- name: QUEUE_WEIGHT_SET
-- Override a tenant's weight in one queue (creating the tenant if new). Takes effect for
-- jobs that become runnable afterwards.
-- Locks: the (tenant, queue) override row, until the caller's transaction ends; none on
--   the tenant row.
-- Indexes: pgqueue_queue_weight_uniq, pgqueue_tenant_pkey.
-- Called by: store.set_weight with a queue, from services.set_tenant_weight.
WITH tenant_row AS (
    INSERT INTO pgqueue_tenant (name, weight) VALUES (%(tenant)s, 1.0)
    ON CONFLICT (name) DO NOTHING
)
INSERT INTO pgqueue_queue_weight (queue, tenant, weight)
VALUES (%(queue)s, %(tenant)s, %(weight)s)
ON CONFLICT (tenant, queue) DO UPDATE SET weight = EXCLUDED.weight


-- name: MAINTENANCE_TRY_LOCK
-- One worker at a time runs maintenance. Never waits: a worker that does not get the lock
-- skips this round.
-- Locks: a transaction-scoped advisory lock, released by the transaction's end (so a worker
--   that dies mid-run frees it at once).
-- Index: none (no table is read).
-- Called by: store.try_maintenance_lock, at the start of maintenance's transaction.
SELECT pg_try_advisory_xact_lock(%(key)s)


-- name: WORKER_REGISTER
-- A worker process records itself at start (or again, after a restart with the same id or
-- a reconnect): its queues and the tasks it can run (a JSON list, or NULL when it serves
-- more than store.WORKER_TASKS_MAX), which the admin reads to flag jobs nobody can run.
-- Locks: the worker's row (PK upsert), until autocommit ends the statement.
-- Index: pgqueue_worker_pkey.
-- Called by: store.register_worker, from the worker runtime at start.
INSERT INTO pgqueue_worker (id, host, pid, queues, tasks, concurrency)
VALUES (%(worker)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(tasks)s::jsonb, %(concurrency)s)
ON CONFLICT (id) DO UPDATE
   SET last_seen_at = now(), stopped_at = NULL, queues = EXCLUDED.queues,
       tasks = EXCLUDED.tasks, concurrency = EXCLUDED.concurrency


-- name: DATABASE_CLOCK_READ
-- The database server's clock now (clock_timestamp(): not the transaction's start). A worker
-- reads it, timing the round trip on its monotonic clock, to give the handler times it
-- carries in the database's clock (pgqueue.worker.clock).
-- Locks: nothing. Index: none (no table).
-- Called by: store.database_clock, from the worker runtime when it connects and at each
--   heartbeat round.
SELECT clock_timestamp()


-- name: WORKER_STOP
-- A worker marks itself stopped on a clean exit; a killed one just stops being seen.
-- Locks: the worker's row, until autocommit ends the statement.
-- Index: pgqueue_worker_pkey.
-- Called by: store.stop_worker, from the worker runtime as it exits.
UPDATE pgqueue_worker SET stopped_at = now(), last_seen_at = now() WHERE id = %(worker)s


-- name: WORKER_PRUNE
-- Forget workers not seen for a day (the registry is for the living).
-- Locks: the deleted rows, until maintenance's transaction ends.
-- Index: none: a sequential scan of pgqueue_worker, which holds one row per worker
--   process seen in the last day.
-- Called by: store.prune_workers, from maintenance (one worker at a time).
DELETE FROM pgqueue_worker WHERE last_seen_at < now() - interval '1 day'


-- name: TASK_STAT_HEAD
-- The largest attempt id committed so far: the bound the next fold may reach once every
-- transaction that could still hold a smaller id has ended (see TASK_STAT_FOLD); and it
-- draws this transaction's xid, after the snapshot the id was read in. Sound only as the
-- transaction's first xid-drawing statement (maintenance runs it first after its lock);
-- drawing the xid here, not in the fold, lets the fold's snapshot see it, so that a quiet
-- server's attempts are folded in the same pass.
-- Locks: none (the xid is one per maintenance pass).
-- Index: pgqueue_job_attempt_pkey (a backward index-only probe).
-- Called by: store.attempt_head, from maintenance (first statement after its lock).
SELECT COALESCE(max(id), 0), pg_current_xact_id() FROM pgqueue_job_attempt


-- name: TASK_STAT_FOLD
-- Fold attempt rows into pgqueue_task_stat, oldest first, at most %(limit)s per run, past
-- the mark (pgqueue_stat_mark.last_attempt_id) and never past a row whose transaction may
-- still be open. Attempt ids are drawn before their transactions commit, so a row with a
-- smaller id can become visible after a larger one: a watermark over ids is only sound up
-- to a bound below which every inserting transaction has ended. That bound is a pair
-- (head, xid): head, an id read (TASK_STAT_HEAD) before this transaction drew xid. Every
-- statement that inserts attempts writes pgqueue_job first (so it holds its xid before it
-- draws an id), hence a transaction holding an id <= head has an xid < xid; once the
-- oldest running xid of the server (pg_snapshot_xmin of the current snapshot) is >= xid,
-- each of them has committed or rolled back, and the rows up to head are final. The pair
-- of this run is folded at once when nothing older is running (a quiet server), otherwise
-- it is kept as pending_* and folded by a later run (a second later nothing of a worker's
-- is still open); a pending pair is replaced only once folded, so a steady stream of short
-- transactions never starves it. A long transaction holding an xid (anywhere on the
-- server) delays the fold until it ends; it never makes the fold skip a row.
-- Assumes the attempt id sequence hands ids out one at a time (CACHE 1, the default).
-- Locks: the mark row (FOR UPDATE) and the upserted stat rows, until maintenance's
--   transaction ends.
-- Indexes: pgqueue_job_attempt_pkey (mark < id <= bound), pgqueue_job_pkey (the task of
--   each), pgqueue_task_stat_uniq (the upsert), pgqueue_stat_mark_pkey.
-- Returns how many rows it folded and the range of attempt ids they fill, (from, to]: the
-- same rows TENANT_STAT_FOLD folds next, in the same transaction.
-- Called by: store.fold_task_stats, from maintenance (one worker at a time).
WITH mark AS MATERIALIZED (
    SELECT last_attempt_id, pending_attempt_id, pending_xid
      FROM pgqueue_stat_mark WHERE id = 1 FOR UPDATE
),
state AS MATERIALIZED (
    SELECT COALESCE((SELECT last_attempt_id FROM mark), 0) AS mark,
           (SELECT pending_attempt_id FROM mark) AS p_id,
           (SELECT pending_xid FROM mark) AS p_xid,
           pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS horizon,
           pg_current_xact_id()::text::bigint AS xid
),
bound AS MATERIALIZED (
    SELECT mark, p_id, p_xid, xid,
           GREATEST(mark,
                    CASE WHEN horizon >= xid THEN %(head)s::bigint END,
                    CASE WHEN horizon >= p_xid THEN p_id END) AS upto,
           p_xid IS NULL OR horizon >= p_xid AS p_final
      FROM state
),
fresh AS MATERIALIZED (
    SELECT a.id, j.task, a.outcome,
           COALESCE(GREATEST(extract(epoch FROM a.finished_at - a.started_at)::float8, 0), 0)
               AS secs  -- the handler's run time; 0 when it was never seen to start
      FROM pgqueue_job_attempt a
      JOIN pgqueue_job j ON j.id = a.job_id
     WHERE a.id > (SELECT mark FROM bound)
       AND a.id <= (SELECT upto FROM bound)
     ORDER BY a.id
     LIMIT %(limit)s
),
folded AS (
    INSERT INTO pgqueue_task_stat AS s (task, outcome, le, count, seconds)
    SELECT task, outcome,
           (SELECT min(b) FROM unnest(%(buckets)s::float8[]) AS b WHERE b >= secs),
           count(*), sum(secs)
      FROM fresh
     GROUP BY 1, 2, 3
    ON CONFLICT (task, outcome, le) DO UPDATE
       SET count = s.count + EXCLUDED.count, seconds = s.seconds + EXCLUDED.seconds
),
moved AS MATERIALIZED (
    SELECT b.*, CASE WHEN (SELECT count(*) FROM fresh) >= %(limit)s
                     THEN (SELECT max(id) FROM fresh) ELSE b.upto END AS new_mark
      FROM bound b
)
INSERT INTO pgqueue_stat_mark AS m (id, last_attempt_id, pending_attempt_id, pending_xid)
SELECT 1, new_mark,
       CASE WHEN p_final AND new_mark >= COALESCE(p_id, 0) THEN %(head)s::bigint ELSE p_id END,
       CASE WHEN p_final AND new_mark >= COALESCE(p_id, 0) THEN xid ELSE p_xid END
  FROM moved
ON CONFLICT (id) DO UPDATE
   SET last_attempt_id = EXCLUDED.last_attempt_id,
       pending_attempt_id = EXCLUDED.pending_attempt_id,
       pending_xid = EXCLUDED.pending_xid
RETURNING (SELECT count(*) FROM fresh), (SELECT mark FROM bound), last_attempt_id


-- name: TENANT_STAT_FOLD
-- Fold the attempts with ids in (%(after)s, %(upto)s] (the range TASK_STAT_FOLD has just
-- folded, in the same transaction: so each attempt is folded once, or not at all) into
-- pgqueue_tenant_stat: for each attempt whose handler was seen to start, its wait
-- (started_at - due_at: from runnable to the handler's start) and its run time
-- (finished_at - started_at), in the buckets %(buckets)s, by queue and tenant.
-- Bounded cardinality: a queue has at most %(series)s tenants with rows of their own (held:
-- those that already have some); the rest go to the rows of tenant '' (other). A tenant
-- not held takes a free place when this fold meets it, the busiest of the fold first
-- (ties by name); TENANT_STAT_RELEASE_IDLE frees the places of idle tenants. A tenant's
-- attempts folded into '' before it held a place stay there: every row only grows.
-- An attempt recorded before due_at existed (NULL) adds to the run time only.
-- Locks: the upserted stat rows, until maintenance's transaction ends.
-- Indexes: pgqueue_job_attempt_pkey (the id range), pgqueue_job_pkey (each attempt's
--   queue and tenant), pgqueue_tenant_stat_uniq (the held tenants of the fold's queues, at
--   most (series + 1) x 2 x buckets rows a queue, and the upsert).
-- Called by: store.fold_tenant_stats, from maintenance (one worker at a time).
WITH fresh AS MATERIALIZED (
    SELECT j.queue, j.tenant,
           CASE WHEN a.due_at IS NOT NULL
                THEN GREATEST(extract(epoch FROM a.started_at - a.due_at)::float8, 0) END AS wait,
           GREATEST(extract(epoch FROM a.finished_at - a.started_at)::float8, 0) AS run
      FROM pgqueue_job_attempt a
      JOIN pgqueue_job j ON j.id = a.job_id
     WHERE a.id > %(after)s AND a.id <= %(upto)s
       AND a.started_at IS NOT NULL
),
volume AS MATERIALIZED (
    SELECT queue, tenant, count(*) AS n FROM fresh GROUP BY queue, tenant
),
held AS MATERIALIZED (
    SELECT DISTINCT s.queue, s.tenant
      FROM pgqueue_tenant_stat s
     WHERE s.queue = ANY(ARRAY(SELECT DISTINCT queue FROM volume)) AND s.tenant <> ''
),
newcomers AS MATERIALIZED (
    SELECT v.queue, v.tenant,
           row_number() OVER (PARTITION BY v.queue ORDER BY v.n DESC, v.tenant) AS place
      FROM volume v
     WHERE NOT EXISTS (SELECT 1 FROM held h WHERE h.queue = v.queue AND h.tenant = v.tenant)
),
placed AS MATERIALIZED (
    SELECT queue, tenant FROM held
    UNION ALL
    SELECT n.queue, n.tenant FROM newcomers n
     WHERE n.place <= %(series)s::int - (SELECT count(*) FROM held h WHERE h.queue = n.queue)
),
labelled AS MATERIALIZED (
    SELECT f.queue,
           CASE WHEN EXISTS (SELECT 1 FROM placed p WHERE p.queue = f.queue AND p.tenant = f.tenant)
                THEN f.tenant ELSE '' END AS tenant,
           f.wait, f.run
      FROM fresh f
),
observed AS (
    SELECT queue, tenant, 'wait' AS kind, wait AS secs FROM labelled WHERE wait IS NOT NULL
    UNION ALL
    SELECT queue, tenant, 'run', run FROM labelled
)
INSERT INTO pgqueue_tenant_stat AS s (queue, tenant, kind, le, count, seconds, folded_at)
SELECT queue, tenant, kind,
       (SELECT min(b) FROM unnest(%(buckets)s::float8[]) AS b WHERE b >= secs),
       count(*), sum(secs), now()
  FROM observed
 GROUP BY 1, 2, 3, 4
ON CONFLICT (queue, tenant, kind, le) DO UPDATE
   SET count = s.count + EXCLUDED.count, seconds = s.seconds + EXCLUDED.seconds,
       folded_at = EXCLUDED.folded_at


-- name: TENANT_STAT_RELEASE_IDLE
-- Free the places of tenants (not '', other) that ran no job in a queue for %(idle)s
-- seconds: delete their rows, so that their series end and TENANT_STAT_FOLD may give the
-- place to another tenant.
-- Locks: the deleted rows, until maintenance's transaction ends.
-- Index: none: pgqueue_tenant_stat holds at most (METRICS_TENANT_SERIES + 1) x 2 x buckets
--   rows a queue (a scan of a small table).
-- Called by: store.release_idle_tenant_stats, from maintenance (one worker at a time).
DELETE FROM pgqueue_tenant_stat s
 USING (SELECT queue, tenant FROM pgqueue_tenant_stat
         WHERE tenant <> ''
         GROUP BY queue, tenant
        HAVING max(folded_at) < now() - %(idle)s::float8 * interval '1 second') idle
 WHERE s.queue = idle.queue AND s.tenant = idle.tenant


-- name: JOB_PRUNE_FINISHED
-- Delete up to %(limit)s jobs of one finished status whose finished_at is more than
-- %(keep)s seconds ago, oldest first, with their attempt rows, in one statement. Returns
-- (jobs deleted, attempts deleted). Called by maintenance.prune_finished_jobs (a few
-- batches per pass, each its own transaction) and manage.py pgqueue prune.
-- A dead job that holds its concurrency key's slot (DEAD_JOB_HOLDS_KEY) is kept: it
-- holds the key until an operator retries it.
-- Locks: the chosen job rows, FOR UPDATE SKIP LOCKED: a row an operator is retrying or
--   anything else holds is skipped until a later batch, never waited on; claims and
--   enqueues touch other rows (queued, scheduled, new) and never wait on a prune. The
--   attempt rows of the locked jobs, which nothing else writes once a job is finished.
--   The attempt -> job foreign key is deferred: both deletes are checked at commit.
-- A job of a workflow is kept while any job of its workflow is unfinished, and a job is
-- kept while a job that depends on it is unfinished (its handler may read the result);
-- the edges of the jobs deleted go with them, and a workflow with its last job.
-- Index: pgqueue_job_finished (status, finished_at) WHERE status IN finished statuses,
--   a range scan already oldest first; pgqueue_job_attempt's job_id index for the
--   not-yet-folded probe and the delete of the history; pgqueue_stat_mark's pkey;
--   pgqueue_job_workflow_live (one probe per workflow job), pgqueue_job_dep_upstream
--   and pgqueue_job_dep_uniq (the edges), pgqueue_job_workflow (a workflow's last job).
WITH doomed AS MATERIALIZED (
    SELECT j.id FROM pgqueue_job j
     WHERE j.status = %(status)s
       AND j.finished_at < COALESCE(%(now)s::timestamptz, now()) - %(keep)s * interval '1 second'
       AND j.key_state <> 'held'  -- a dead job holding its key's slot (DEAD_JOB_HOLDS_KEY)
       AND NOT EXISTS (
           SELECT 1 FROM pgqueue_job_attempt a
            WHERE a.job_id = j.id
              AND a.id > COALESCE(
                  (SELECT last_attempt_id FROM pgqueue_stat_mark WHERE id = 1), 0))
       AND (j.workflow_id IS NULL OR NOT EXISTS (  -- a workflow's jobs go once all have ended
           SELECT 1 FROM pgqueue_job l
            WHERE l.workflow_id = j.workflow_id
              AND l.status IN ('waiting', 'scheduled', 'queued', 'running')))
       AND NOT EXISTS (  -- kept for its unfinished dependents, which may read its result
           SELECT 1 FROM pgqueue_job_dependency d JOIN pgqueue_job w ON w.id = d.job_id
            WHERE d.upstream_id = j.id
              AND w.status IN ('waiting', 'scheduled', 'queued', 'running'))
     ORDER BY j.finished_at
     LIMIT %(limit)s
       FOR UPDATE OF j SKIP LOCKED
),
history AS (
    DELETE FROM pgqueue_job_attempt a USING doomed d WHERE a.job_id = d.id RETURNING a.id
),
edges AS (
    DELETE FROM pgqueue_job_dependency e
     WHERE e.job_id IN (SELECT id FROM doomed) OR e.upstream_id IN (SELECT id FROM doomed)
),
jobs AS (
    DELETE FROM pgqueue_job j USING doomed d WHERE j.id = d.id RETURNING j.id, j.workflow_id
),
workflows AS (  -- a workflow goes with its last job
    DELETE FROM pgqueue_workflow w
     WHERE w.id IN (SELECT workflow_id FROM jobs WHERE workflow_id IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM pgqueue_job o
                        WHERE o.workflow_id = w.id
                          AND o.id NOT IN (SELECT id FROM jobs))
)
SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM history)


-- name: JOB_PRUNE_FINISHED_COUNT
-- What JOB_PRUNE_FINISHED would delete for one status, counted up to %(limit)s jobs (the
-- caller asks for one more than it shows, to say "N+"): (jobs, their attempt rows). Takes
-- no lock. Called by manage.py pgqueue prune --dry-run. Index: as JOB_PRUNE_FINISHED.
WITH doomed AS MATERIALIZED (
    SELECT j.id FROM pgqueue_job j
     WHERE j.status = %(status)s
       AND j.finished_at < COALESCE(%(now)s::timestamptz, now()) - %(keep)s * interval '1 second'
       AND j.key_state <> 'held'  -- a dead job holding its key's slot (DEAD_JOB_HOLDS_KEY)
       AND NOT EXISTS (
           SELECT 1 FROM pgqueue_job_attempt a
            WHERE a.job_id = j.id
              AND a.id > COALESCE(
                  (SELECT last_attempt_id FROM pgqueue_stat_mark WHERE id = 1), 0))
       AND (j.workflow_id IS NULL OR NOT EXISTS (  -- a workflow's jobs go once all have ended
           SELECT 1 FROM pgqueue_job l
            WHERE l.workflow_id = j.workflow_id
              AND l.status IN ('waiting', 'scheduled', 'queued', 'running')))
       AND NOT EXISTS (  -- kept for its unfinished dependents, which may read its result
           SELECT 1 FROM pgqueue_job_dependency d JOIN pgqueue_job w ON w.id = d.job_id
            WHERE d.upstream_id = j.id
              AND w.status IN ('waiting', 'scheduled', 'queued', 'running'))
     ORDER BY j.finished_at
     LIMIT %(limit)s
)
SELECT (SELECT count(*) FROM doomed),
       (SELECT count(*) FROM pgqueue_job_attempt a JOIN doomed d ON a.job_id = d.id)
