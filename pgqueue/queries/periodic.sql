-- Periodic schedules (pgqueue_periodic): the start-up sync of the code's schedules, the
-- maintenance duty that fires the due ones, and the operator's changes (the admin's add,
-- edit, delete, switch and "run now", through pgqueue.schedules). Run by
-- pgqueue.schedule_store. Each statement is written here whole, as PostgreSQL runs it;
-- values are parameters (%(name)s). A header says what a statement does and why, what it
-- locks, which indexes serve it and who calls it; pgqueue/sql.py states the conventions.
--
-- A schedule has a cron expression (cron, on the wall clock of timezone) or an interval
-- (every), never both (CHECK pgqueue_periodic_cron_or_every). source says who owns its
-- definition: 'code' (@pgqueue.periodic, PGQUEUE["PERIODIC"]; the sync rewrites it) or
-- 'admin' (created by an operator; the sync never touches it unless code declares its
-- name). Ticks are computed in Python (pgqueue.schedules) and stored as instants.


-- name: PERIODIC_SYNC
-- Make the code's rows of pgqueue_periodic match the schedules declared in code (a JSON
-- array of rows, each with its first tick computed in Python): upsert them, mark the
-- code's others removed. Returns ('removed', name) for the rows newly marked removed and
-- ('taken', name) for the rows created in the admin whose name code now declares: code
-- takes such a row over (its definition, next_run_at and source become the code's).
-- Called by schedules.sync_schedules, at runworker start-up, in its own transaction.
-- Locks: the declared rows (upsert, in name order, so concurrent start-ups never deadlock)
--   and the rows newly marked removed. Never writes `enabled`, which the operator owns: a
--   deploy does not re-enable what the admin turned off. next_run_at is kept unless the
--   cadence (cron, interval or time zone) changed, the schedule comes back after a
--   removal, or code takes an admin row over. Rows created in the admin (source 'admin')
--   are never marked removed (and lose a removal an earlier version's sync gave them).
-- Index: pgqueue_periodic_name_key (the upsert); the removal scans the (small) table.
WITH spec AS (
    SELECT * FROM jsonb_to_recordset(%(specs)s::jsonb) AS s(
        name text, cron text, every_seconds bigint, timezone text, task text, tenant text,
        queue text, priority smallint, max_attempts int, payload jsonb, missed text,
        next_run_at timestamptz)
),
taken AS (
    SELECT p.name FROM pgqueue_periodic p JOIN spec s ON s.name = p.name
     WHERE p.source = 'admin'
),
upserted AS (
    INSERT INTO pgqueue_periodic AS p (name, cron, every, timezone, task, tenant, queue,
                                       priority, max_attempts, payload, missed, source,
                                       enabled, next_run_at)
    SELECT name, cron, make_interval(secs => every_seconds), timezone, task, tenant, queue,
           priority, max_attempts, COALESCE(payload, 'null'::jsonb), missed, 'code', TRUE,
           next_run_at
      FROM spec
     ORDER BY name
    ON CONFLICT (name) DO UPDATE
       SET next_run_at = CASE
               WHEN p.cron IS DISTINCT FROM EXCLUDED.cron
                    OR p.every IS DISTINCT FROM EXCLUDED.every
                    OR p.timezone <> EXCLUDED.timezone
                    OR p.removed_at IS NOT NULL OR p.source <> 'code'
               THEN EXCLUDED.next_run_at ELSE p.next_run_at END,
           cron = EXCLUDED.cron, every = EXCLUDED.every, timezone = EXCLUDED.timezone,
           task = EXCLUDED.task, tenant = EXCLUDED.tenant, queue = EXCLUDED.queue,
           priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
           payload = EXCLUDED.payload, missed = EXCLUDED.missed, source = 'code',
           removed_at = NULL, updated_at = now()
    RETURNING p.name
),
removed AS (
    UPDATE pgqueue_periodic
       SET removed_at = now(), updated_at = now()
     WHERE source = 'code' AND removed_at IS NULL
       AND name <> ALL (ARRAY(SELECT name FROM spec))
    RETURNING name
),
restored AS (
    -- A row of the admin is not the code's to remove: one that a worker of an earlier
    -- version (whose sync knew no source) marked removed runs again.
    UPDATE pgqueue_periodic
       SET removed_at = NULL, updated_at = now()
     WHERE source = 'admin' AND removed_at IS NOT NULL
       AND name <> ALL (ARRAY(SELECT name FROM spec))
)
SELECT 'removed', name FROM removed
UNION ALL
SELECT 'taken', name FROM taken
ORDER BY 1, 2


-- name: PERIODIC_LOCK_DUE
-- The live schedules whose next tick has come, locked for this maintenance run.
-- Called by schedules.enqueue_due (the maintenance duty enqueue_due_periodic).
-- Locks: each returned row, FOR UPDATE SKIP LOCKED: a second enqueuer (maintenance runs
--   one at a time, but nothing relies on that alone) skips a row being fired, and after
--   that run's commit finds it no longer due.
-- Index: pgqueue_periodic_due (partial: enabled and not removed, by next_run_at).
SELECT name, cron, every, timezone, task, tenant, queue, priority, max_attempts,
       COALESCE(payload, 'null'::jsonb)::text, missed, next_run_at
  FROM pgqueue_periodic
 WHERE enabled AND removed_at IS NULL AND next_run_at <= COALESCE(%(now)s::timestamptz, now())
 ORDER BY next_run_at, name
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED


-- name: PERIODIC_ADVANCE
-- Move a fired schedule to its next tick: a compare-and-set on the next_run_at it was
-- fired for, so a tick moves the schedule forward once. Records the tick and its job
-- (both kept as they were when the tick was skipped).
-- Called by schedules.enqueue_due, in the savepoint of the tick's enqueue.
-- Locks: the schedule's row (already locked by PERIODIC_LOCK_DUE).
-- Index: pgqueue_periodic_name_key.
UPDATE pgqueue_periodic
   SET next_run_at = %(next_run_at)s::timestamptz,
       last_run_at = COALESCE(%(tick)s::timestamptz, last_run_at),
       last_job_id = COALESCE(%(job_id)s::bigint, last_job_id),
       updated_at = now()
 WHERE name = %(name)s AND next_run_at = %(due)s::timestamptz
RETURNING name


-- name: PERIODIC_GET
-- One schedule as the duty would fire it (the columns of PERIODIC_LOCK_DUE), and whether
-- it was removed from code, for "run now": one job at once, the row left as it is.
-- Called by schedules.run_schedule_now (the admin's action), in its transaction.
-- Locks: nothing (the row is read, not changed; an edit committed meanwhile applies to
--   the schedule's next tick). Index: pgqueue_periodic_name_key.
SELECT name, cron, every, timezone, task, tenant, queue, priority, max_attempts,
       COALESCE(payload, 'null'::jsonb)::text, missed, next_run_at, removed_at
  FROM pgqueue_periodic
 WHERE name = %(name)s


-- name: PERIODIC_LOCK
-- One schedule's cadence, switch, owner and next tick, read to change it.
-- Called by schedules.set_periodic_enabled (the admin's and the CLI's switch) and
--   schedules.update_schedule (the admin's edit), in their transactions.
-- Locks: that row, FOR UPDATE, until the change commits (two operators in turn, not both;
--   a maintenance run firing the row is waited for, and the change sees its next tick).
-- Index: pgqueue_periodic_name_key.
SELECT cron, every, timezone, enabled, source, removed_at, next_run_at
  FROM pgqueue_periodic
 WHERE name = %(name)s
   FOR UPDATE


-- name: PERIODIC_SET_ENABLED
-- Turn a schedule on (from its next tick, computed by the caller) or off.
-- Called by schedules.set_periodic_enabled after PERIODIC_LOCK, in the same transaction.
-- Locks: that row (already held). Index: pgqueue_periodic_name_key.
UPDATE pgqueue_periodic
   SET enabled = %(enabled)s::boolean,
       next_run_at = CASE WHEN %(enabled)s::boolean THEN %(next_run_at)s::timestamptz
                          ELSE next_run_at END,
       updated_at = now()
 WHERE name = %(name)s


-- name: PERIODIC_INSERT
-- Create a schedule an operator defined (source 'admin'), validated and with its first
-- tick computed in Python; nothing when the name is taken (no row returned).
-- Called by schedules.create_schedule (the admin's add), in its own transaction.
-- Locks: the new row (its name's entry in pgqueue_periodic_name_key: a concurrent insert
--   or sync of the same name waits, then conflicts).
-- Index: pgqueue_periodic_name_key.
INSERT INTO pgqueue_periodic (name, cron, every, timezone, task, tenant, queue, priority,
                              max_attempts, payload, missed, source, enabled, next_run_at)
VALUES (%(name)s, %(cron)s, make_interval(secs => %(every_seconds)s::bigint), %(timezone)s,
        %(task)s, %(tenant)s, %(queue)s, %(priority)s, %(max_attempts)s,
        %(payload)s::jsonb, %(missed)s, 'admin', %(enabled)s::boolean,
        %(next_run_at)s::timestamptz)
ON CONFLICT (name) DO NOTHING
RETURNING id


-- name: PERIODIC_UPDATE
-- Replace the definition of a schedule an operator created, with its switch and its next
-- tick (the caller keeps next_run_at unless the cadence changed or the schedule was
-- turned on). Rows of the code are not changed (source 'code': code owns them).
-- Called by schedules.update_schedule after PERIODIC_LOCK, in the same transaction.
-- Locks: that row (already held). Index: pgqueue_periodic_name_key.
UPDATE pgqueue_periodic
   SET cron = %(cron)s, every = make_interval(secs => %(every_seconds)s::bigint),
       timezone = %(timezone)s, task = %(task)s, tenant = %(tenant)s, queue = %(queue)s,
       priority = %(priority)s, max_attempts = %(max_attempts)s,
       payload = %(payload)s::jsonb, missed = %(missed)s, enabled = %(enabled)s::boolean,
       next_run_at = %(next_run_at)s::timestamptz, updated_at = now()
 WHERE name = %(name)s AND source = 'admin'
RETURNING id


-- name: PERIODIC_DELETE
-- Delete a schedule an operator created, or one that code no longer declares (a start-up
-- sync marked it removed); a live schedule of the code stays (it would come back).
-- Called by schedules.delete_schedule (the admin's delete), in its own transaction.
-- Locks: that row (deleted; a maintenance run firing it is waited for). Its jobs are left:
--   last_job_id is no foreign key. Index: pgqueue_periodic_name_key.
DELETE FROM pgqueue_periodic
 WHERE name = %(name)s AND (source = 'admin' OR removed_at IS NOT NULL)
RETURNING name
