-- Workflows: jobs that wait for other jobs (pgqueue.workflows).
-- Each statement is written here whole, as PostgreSQL runs it; values are parameters
-- (%(name)s). A header says what a statement does and why, what it locks, which indexes
-- serve it and who calls it; pgqueue/sql.py states the conventions they share.
--
-- A job with dependencies is enqueued 'waiting' (JOB_ENQUEUE_SCHEDULED with that status),
-- outside every claim and promotion index, with one pgqueue_job_dependency row per
-- dependency. JOB_SETTLE_WAITING decides it: runnable (scheduled, then promoted with a
-- fresh fair vtime) once no dependency is unfinished, or cancelled as soon as one ended
-- dead or cancelled (unless it runs anyway, run_on_upstream_failure).
--
-- Why settling happens after commits, and is exact:
-- - It reads the dependencies' statuses in its own snapshot. Whoever ends a dependency
--   settles its dependents after that end has committed, and the enqueue of a dependent
--   settles it after the enqueue has committed; so the settle that follows the last of
--   these commits sees every dependency's end, whichever transaction committed last.
-- - It takes each waiting job's row lock and rechecks status = 'waiting' under it: two
--   settles of one job serialise there and the second finds it settled. A job leaves
--   'waiting' once.
-- - A process that dies between a commit and its settle leaves a job waiting that could
--   run: maintenance re-examines WAITING_SWEEP_BATCH waiting jobs a pass (JOB_WAITING_PAGE),
--   round and round, and settles them the same way.


-- name: WORKFLOW_INSERT
-- A workflow's row, before its jobs (they carry its id).
-- Locks: none on existing rows.
-- Index: pgqueue_workflow_pkey, pgqueue_workflow_tenant_id gain the row.
-- Called by: workflow_store.insert_workflow, from Workflow.enqueue (the Python API, POST
--   /workflows), in the caller's transaction.
INSERT INTO pgqueue_workflow (tenant, name) VALUES (%(tenant)s, %(name)s)
RETURNING id, created_at


-- name: JOB_DEPENDENCY_CHECK
-- The named jobs that exist, with their tenant and status: an enqueue refuses dependencies
-- that name no job, or a job of another tenant (depends_on). Each found row is locked FOR
-- KEY SHARE until the enqueue commits, so retention cannot delete it meanwhile (its
-- prune skips locked rows); the lock does not conflict with a worker's updates of the
-- job (FOR NO KEY UPDATE), so a running dependency is not held up.
-- Locks: the named job rows, FOR KEY SHARE, until the caller's transaction ends.
-- Index: pgqueue_job_pkey (PK lookups).
-- Called by: workflow_store.check_dependencies, from services.enqueue (depends_on).
SELECT id, tenant, status FROM pgqueue_job WHERE id = ANY(%(ids)s::bigint[])
   FOR KEY SHARE


-- name: JOB_DEPENDENCY_INSERT
-- The edges "job waits for upstream", one per pair; upstream < job always (a CHECK: the
-- dependency was enqueued first, so no cycle can form).
-- Locks: none on existing rows; the new rows' foreign keys are checked at commit.
-- Index: pgqueue_job_dep_uniq, pgqueue_job_dep_upstream gain the rows.
-- Called by: workflow_store.insert_dependencies, from services.enqueue and
--   Workflow.enqueue, in the caller's transaction.
INSERT INTO pgqueue_job_dependency (job_id, upstream_id)
SELECT j, u FROM unnest(%(jobs)s::bigint[], %(upstreams)s::bigint[]) AS e(j, u)


-- name: JOB_SETTLE_WAITING
-- Decide waiting jobs: the jobs %(ids)s, and the dependents of the jobs %(upstreams)s that
-- just ended. A job with a dependency that ended dead or cancelled is cancelled (naming
-- the lowest such dependency in failed_upstream_id and last_error), unless it runs anyway
-- (run_on_upstream_failure); one none of whose dependencies is unfinished becomes
-- 'scheduled' at the later of its run_at and now, and the caller promotes those due at
-- once (JOB_PROMOTE_MANY: a fresh fair vtime). The others stay waiting, untouched and
-- unlocked. A dependency row that is gone (pruned: it had ended) counts as ended, not
-- failed. Notifies pgqueue_finished with the ids of the jobs cancelled (see jobs.sql).
-- Returns each settled job's id, new status and whether it is due now.
-- What it reads of each candidate, so that a fan-in of thousands stays cheap when each of
-- its dependencies' ends settles it (each read walks the candidate's own edges, and looks
-- each dependency up by its id: a plan may never scan jobs for their status, which would
-- grow with every finished job; each ORDER BY names job_id first, so that the only index
-- that gives the order is pgqueue_job_dep_uniq, whose range is the candidate's edges —
-- ordered by upstream_id alone, a plan may walk pgqueue_job_dep_upstream, every edge):
-- - open: whether a dependency is unfinished, looked for newest first (dependencies
--   mostly end oldest first, so while any is open the scan stops at once);
-- - failed: among the dependencies whose end triggered this settle (%(upstreams)s, a few
--   index lookups), or among all of them when the job is named in %(ids)s (an enqueue, a
--   retry, maintenance's sweep) or none is open (its last dependency just ended: the
--   final decision reads them all, once).
-- Locks: the rows it settles, FOR NO KEY UPDATE in id order (waiting: two settles of one
--   job serialise, and the second finds status <> 'waiting' on the new row and skips it),
--   until the caller's transaction ends. The verdicts are read without locks, so settles
--   of a job that stays waiting never queue behind one another. Not FOR UPDATE: that
--   would wait for the KEY SHARE an enqueue of a new dependent holds on its dependencies
--   (JOB_DEPENDENCY_CHECK).
-- Indexes: pgqueue_job_dep_upstream (the dependents), pgqueue_job_dep_uniq (a job's
--   dependencies, scanned backwards for open, looked up for failed), pgqueue_job_pkey.
-- Called by: workflow_store.settle, after the commit that ended a dependency (the worker,
--   services' cancel and retry, maintenance) or enqueued a dependent; the cancelled ones'
--   dependents are settled next, in a transaction of their own.
WITH candidate AS MATERIALIZED (
    SELECT j.id, j.run_on_upstream_failure AS run_anyway,
           j.id = ANY(%(ids)s::bigint[]) AS whole
      FROM pgqueue_job j
     WHERE j.id = ANY(ARRAY(
               SELECT unnest(%(ids)s::bigint[])
                UNION
               SELECT d.job_id FROM pgqueue_job_dependency d
                WHERE d.upstream_id = ANY(%(upstreams)s::bigint[])))
       AND j.status = 'waiting'
),
open AS MATERIALIZED (
    SELECT c.*,
           (SELECT 1 FROM pgqueue_job_dependency d
             WHERE d.job_id = c.id
               AND (SELECT u.status FROM pgqueue_job u WHERE u.id = d.upstream_id)
                   NOT IN ('done', 'dead', 'cancelled')
             ORDER BY d.job_id DESC, d.upstream_id DESC LIMIT 1) IS NOT NULL AS open
      FROM candidate c
),
verdict AS MATERIALIZED (
    SELECT o.id, o.run_anyway, o.open,
           CASE WHEN o.whole OR NOT o.open
                THEN (SELECT d.upstream_id FROM pgqueue_job_dependency d
                       WHERE d.job_id = o.id
                         AND (SELECT u.status FROM pgqueue_job u WHERE u.id = d.upstream_id)
                             IN ('dead', 'cancelled')
                       ORDER BY d.job_id, d.upstream_id LIMIT 1)
                ELSE (SELECT d.upstream_id FROM pgqueue_job_dependency d
                       WHERE d.job_id = o.id AND d.upstream_id = ANY(%(upstreams)s::bigint[])
                         AND (SELECT u.status FROM pgqueue_job u WHERE u.id = d.upstream_id)
                             IN ('dead', 'cancelled')
                       ORDER BY d.job_id, d.upstream_id LIMIT 1)
           END AS failed
      FROM open o
),
ruling AS MATERIALIZED (  -- the jobs decided; those to cancel, with their failed dependency
    SELECT array_agg(id ORDER BY id) AS ids,
           array_agg(id ORDER BY id) FILTER (WHERE failed IS NOT NULL AND NOT run_anyway)
             AS cancel_ids,
           array_agg(failed ORDER BY id) FILTER (WHERE failed IS NOT NULL AND NOT run_anyway)
             AS failed
      FROM verdict
     WHERE (failed IS NOT NULL AND NOT run_anyway) OR NOT open
),
decided AS MATERIALIZED (
    SELECT j.id FROM pgqueue_job j
     WHERE j.id = ANY((SELECT ids FROM ruling)::bigint[]) AND j.status = 'waiting'
     ORDER BY j.id
       FOR NO KEY UPDATE OF j
),
-- A job to cancel is found at its id's position in cancel_ids (array_position, in C, once
-- per job), not by joining the jobs to verdict: a plan expecting one row there joins them
-- by a nested loop that compares every job with every verdict (10,000 roots: 10^8).
settled AS (
    UPDATE pgqueue_job j
       SET (status, run_at, finished_at, failed_upstream_id, last_error) = (
           SELECT CASE WHEN x.cancel THEN 'cancelled' ELSE 'scheduled' END,
                  GREATEST(j.run_at, now()),
                  CASE WHEN x.cancel THEN now() END,
                  CASE WHEN x.cancel THEN x.failed END,
                  CASE WHEN x.cancel
                       THEN format('job %%s, a dependency, ended %%s', x.failed,
                                   (SELECT u.status FROM pgqueue_job u WHERE u.id = x.failed))
                  END
             FROM (SELECT p.at IS NOT NULL AS cancel, r.failed[p.at] AS failed
                     FROM ruling r
                    CROSS JOIN LATERAL (SELECT array_position(r.cancel_ids, j.id) AS at) p) x)
     WHERE j.id = ANY(ARRAY(SELECT id FROM decided))  -- by id: pgqueue_job_pkey lookups
    RETURNING j.id, j.status, j.run_at <= now() AS due
),
notified AS MATERIALIZED (
    SELECT count(pg_notify('pgqueue_finished', ids)) AS sent
      FROM (SELECT string_agg(id::text, ',') AS ids
              FROM (SELECT id, (row_number() OVER () - 1) / 400 AS chunk
                      FROM settled WHERE status = 'cancelled') f
             GROUP BY chunk) c
)
SELECT id, status, due FROM settled CROSS JOIN notified ORDER BY id


-- name: JOB_WAITING_PAGE
-- Up to %(limit)s waiting jobs with ids above %(after)s, in id order: maintenance's sweep
-- (the caller starts again from 0 past the last).
-- Locks: none (a plain read; JOB_SETTLE_WAITING locks what it settles).
-- Index: pgqueue_job_waiting (id) WHERE status = 'waiting', a range.
-- Called by: workflow_store.sweep, from maintenance.settle_waiting.
SELECT id FROM pgqueue_job
 WHERE status = 'waiting' AND id > %(after)s
 ORDER BY id LIMIT %(limit)s


-- name: JOB_RESUME_DEPENDENTS
-- Jobs retried (%(ids)s) resume the dependents their end cancelled: every job cancelled
-- because a dependency failed (failed_upstream_id set) that depends on them, directly or
-- through such jobs, waits again. A job an operator cancelled stays cancelled. The caller
-- settles them after its commit (JOB_SETTLE_WAITING): one whose other dependency is still
-- dead is cancelled again.
-- Locks: the resumed rows, until the operator action's transaction ends.
-- Indexes: pgqueue_job_dep_upstream (the dependents, level by level),
--   pgqueue_job_pkey.
-- Called by: workflow_store.resume, from services.retry_jobs.
WITH RECURSIVE resumed(id) AS (
    SELECT d.job_id FROM pgqueue_job_dependency d
      JOIN pgqueue_job w ON w.id = d.job_id
     WHERE d.upstream_id = ANY(%(ids)s::bigint[])
       AND w.status = 'cancelled' AND w.failed_upstream_id IS NOT NULL
    UNION
    SELECT d.job_id FROM resumed r
      JOIN pgqueue_job_dependency d ON d.upstream_id = r.id
      JOIN pgqueue_job w ON w.id = d.job_id
     WHERE w.status = 'cancelled' AND w.failed_upstream_id IS NOT NULL
)
UPDATE pgqueue_job j
   SET status = 'waiting', finished_at = NULL, last_error = NULL, failed_upstream_id = NULL
 WHERE j.id IN (SELECT id FROM resumed)
   AND j.status = 'cancelled' AND j.failed_upstream_id IS NOT NULL
RETURNING j.id


-- name: JOB_WAIT_AGAIN
-- Retried jobs (%(ids)s, just sent back to 'scheduled' by JOB_RETRY_MANY, not yet
-- promoted) that have dependencies wait for them again: a job never runs before its
-- dependencies have ended, a retried one neither. The caller settles them after its commit
-- (JOB_SETTLE_WAITING): one whose dependencies are done runs at once, one whose dependency
-- is still dead is cancelled again (unless it runs anyway).
-- Locks: the matched rows (already locked by JOB_RETRY_MANY in the same transaction).
-- Indexes: pgqueue_job_pkey, pgqueue_job_dep_uniq (one probe per job).
-- Called by: workflow_store.wait_again, from services.retry_jobs.
UPDATE pgqueue_job j
   SET status = 'waiting', failed_upstream_id = NULL
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = 'scheduled'
   AND EXISTS (SELECT 1 FROM pgqueue_job_dependency d WHERE d.job_id = j.id)
RETURNING j.id


-- name: JOB_UPSTREAM_RESULTS
-- A job's dependencies, in id order: id, step name, status, result (JSON text) and the
-- result's size in bytes: what a handler reads as job.upstream / job.upstream_results. At
-- most MAX_DEPENDENCIES rows; the results only while their running total stays within
-- %(max_bytes)s (MAX_UPSTREAM_RESULT_BYTES), so that a fan-in of large results is refused
-- before it is sent, not after it filled the worker's memory.
-- Locks: none (a plain read).
-- Indexes: pgqueue_job_dep_uniq (the job's edges), pgqueue_job_pkey.
-- Called by: workflow_store.upstream, from JobContext.upstream (the handler's thread, on
--   first use).
SELECT id, step, status,
       CASE WHEN sum(size) OVER (ORDER BY id) <= %(max_bytes)s THEN result END, size
  FROM (SELECT u.id, u.step, u.status, u.result::text AS result,
               COALESCE(octet_length(u.result::text), 0) AS size
          FROM pgqueue_job_dependency d JOIN pgqueue_job u ON u.id = d.upstream_id
         WHERE d.job_id = %(id)s) r
 ORDER BY id
