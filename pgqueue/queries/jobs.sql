-- A job's life after its claim: outcomes, heartbeats, leases given back or reaped,
-- cancellation, retry, and the reads of its status.
-- Each statement is written here whole, as PostgreSQL runs it; values are parameters
-- (%(name)s). A header says what a statement does and why, what it locks, which indexes
-- serve it and who calls it; pgqueue/sql.py states the conventions they share.
--
-- Every statement that ends a job (done, dead, cancelled; not a failure that will be
-- retried) tells the callers waiting for it (pgqueue.results) in a CTE named notified:
-- pg_notify('pgqueue_finished', ids) with the ids of the jobs it ended joined by commas,
-- one notification per 400 of them (a bigint is at most 19 digits and a comma: 400 ids
-- stay under PostgreSQL's 8,000-byte limit on a payload). PostgreSQL delivers them when
-- the transaction commits, and drops them when it rolls back. The statement's own rows
-- come out joined to notified (one row, the count sent), which makes PostgreSQL run it.
--
-- Every attempt row carries due_at, the job's run_at as the attempt found it: when the job
-- became runnable for it (enqueue, scheduled time, end of a backoff, release from waiting).
-- started_at - due_at is the wait its tenant saw (folded by TENANT_STAT_FOLD).


-- name: JOB_COMPLETE_MANY
-- Record successes for jobs this worker holds, one attempt row each, with the handlers'
-- start and end (%(started)s, %(finished)s: the worker's clock stated in the database's).
-- Both are kept within what the database saw: a start no earlier than the claim, an end no
-- later than this statement (LEAST ignores a NULL: no end reported means now). The
-- worker's estimate of the database's clock can be off by part of a round trip; a handler
-- cannot have begun before its claim nor ended after its outcome was recorded.
-- Fenced: a job whose lease was lost (reaped, or claimed again by anyone, this worker
-- included) does not match and is not returned; nor does one whose cancellation was
-- requested (JOB_CANCEL_REQUEST_MANY committed first): the worker then records it
-- cancelled (JOB_CANCEL_CONFIRM_MANY).
-- Gives back the limit rows the jobs were counted in (the uncount CTEs). Notifies
-- pgqueue_finished with the ids of the jobs done (notified; see the top of this file).
-- Each job's attempt and result are read from the input arrays at its id's position
-- (array_position, in C), not by joining the jobs to the arrays' unnest: a generic plan,
-- expecting one job, joins those by a nested loop that compares every job with every
-- input (1,600 join-filter rows for 40 completions).
-- Returns each job recorded, and whether a job waits for it (awaited: the worker settles
-- its dependents after the commit, workflows.sql). A dependent whose enqueue commits while
-- this statement runs is not seen here; its enqueue's own settle, or maintenance's sweep,
-- decides it.
-- Locks: the matched job rows, then their limit rows in id order (waiting), until the
--   worker's transaction commits, at once.
-- Index: pgqueue_job_pkey (PK lookups); the rows leave pgqueue_job_lease;
--   pgqueue_limit_pkey; pgqueue_job_dep_upstream (one probe per job, awaited).
-- Called by: claim_store.turn, in a worker's turn after LIMIT_LOCK_TURN (which holds the
--   job rows and limit rows already); store.complete_many (the recorder's batches).
WITH
at AS (SELECT COALESCE(%(now)s::timestamptz, clock_timestamp()) AS at),
done AS (
    UPDATE pgqueue_job j
       SET status = 'done', result = (%(results)s::text[])[array_position(%(ids)s::bigint[], j.id)]::jsonb,
           started_at = LEAST(GREATEST(j.claimed_at, (%(started)s::timestamptz[])[array_position(%(ids)s::bigint[], j.id)]),
                              (%(finished)s::timestamptz[])[array_position(%(ids)s::bigint[], j.id)], a.at),
           finished_at = LEAST((%(finished)s::timestamptz[])[array_position(%(ids)s::bigint[], j.id)], a.at),
           lease_expires_at = NULL
      FROM at a
     WHERE j.id = ANY(%(ids)s::bigint[])  -- by id: a pgqueue_job_pkey lookup in any plan
       AND j.attempts = (%(attempts)s::int[])[array_position(%(ids)s::bigint[], j.id)]
       AND j.status = 'running' AND j.lease_owner = %(worker)s
       AND j.cancel_requested_at IS NULL  -- a cancel request committed first wins
    RETURNING j.id, j.attempts, j.claimed_at, j.started_at, j.finished_at, j.limit_ids, j.run_at
),
done_history AS (
    INSERT INTO pgqueue_job_attempt
           (job_id, attempt, worker, claimed_at, started_at, finished_at, outcome, due_at)
    SELECT id, attempts, %(worker)s, claimed_at, started_at, finished_at, 'done', run_at FROM done
),
uncount_n AS MATERIALIZED (
    SELECT u.lid, count(*) AS n
      FROM done r CROSS JOIN LATERAL unnest(r.limit_ids) AS u(lid)
     WHERE r.limit_ids IS NOT NULL
     GROUP BY u.lid
),
uncount_lock AS MATERIALIZED (
    SELECT l.id, u.n FROM pgqueue_limit l JOIN uncount_n u ON u.lid = l.id
     WHERE l.id = ANY(ARRAY(SELECT lid FROM uncount_n))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
     ORDER BY l.id FOR UPDATE OF l
),
uncounted AS (
    UPDATE pgqueue_limit l SET running = GREATEST(l.running - k.n, 0)
      FROM uncount_lock k
     WHERE l.id = k.id AND l.id = ANY(ARRAY(SELECT id FROM uncount_lock))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
),
notified AS MATERIALIZED (
    SELECT count(pg_notify('pgqueue_finished', ids)) AS sent
      FROM (SELECT string_agg(id::text, ',') AS ids
              FROM (SELECT id, (row_number() OVER () - 1) / 400 AS chunk FROM done) f
             GROUP BY chunk) c
)
SELECT id, EXISTS (SELECT 1 FROM pgqueue_job_dependency w WHERE w.upstream_id = done.id) AS awaited
  FROM done CROSS JOIN notified


-- name: JOB_FAIL_MANY
-- Gives back the jobs' limit rows (uncount_lock; locked in id order, waiting, after the jobs).
-- Record failures for jobs this worker holds. Out of attempts, or a permanent error, means
-- dead; otherwise back to scheduled after a backoff from its end: %(retry_in)s seconds when
-- the task's own backoff gave them (pgqueue.retry), else the global full-jitter exponential
-- one; outside the claim index until JOB_PROMOTE_DUE gives it a fresh vtime. A snooze
-- (%(snooze)s seconds, pgqueue.Retry) is not a failure: the job is scheduled that much
-- later with its attempt given back (attempts - 1, as JOB_RELEASE_MANY does) and counted
-- in snoozes, until it has taken %(max_snoozes)s of them: a snooze past that is a failed
-- attempt like any other. Fenced like JOB_COMPLETE_MANY (a cancel request committed first
-- wins here too). Writes one attempt row per job ('failed', or 'snoozed') with the error
-- and traceback. A timeout the worker enforces is recorded here too, as a failure whose
-- error says "timed out after N s". The handler's start and end are kept within what the
-- database saw, as in JOB_COMPLETE_MANY, and its end is never before its claim (a worker's
-- clock estimate may lag a little: a retry's backoff then counts from the claim at least).
-- Notifies pgqueue_finished with the ids of the jobs it made dead (notified; see the top
-- of this file), not of those to be retried.
-- Locks: the matched job rows, until the worker's transaction commits, at once.
-- Index: pgqueue_job_pkey (PK lookups); the rows move from pgqueue_job_lease to
--   pgqueue_job_scheduled.
-- Returns each recorded job's new status ('scheduled', 'dead', or 'snoozed' for one
-- scheduled by a snooze) and run_at.
-- Called by: store.fail_many, from the worker runtime (with JOB_COMPLETE_MANY and
--   JOB_CLAIM, in one transaction).
WITH input AS (
    SELECT i.*, LEAST(i.finished, COALESCE(%(now)s::timestamptz, clock_timestamp())) AS ended
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(errors)s::text[],
                  %(tracebacks)s::text[], %(permanent)s::bool[], %(started)s::timestamptz[],
                  %(finished)s::timestamptz[], %(retry_in)s::float8[], %(snooze)s::float8[])
        AS i(id, attempt, error, tb, permanent, started, finished, retry_in, snooze)
),
-- How each one ends: snoozed, dead or retried. Only the lease holder changes attempts and
-- snoozes, so reading them unlocked here agrees with the row the UPDATE below fences.
decided AS (
    SELECT i.*, j.attempts, j.snoozes, j.run_at AS due_at,  -- runnable since: kept in its attempt row
           GREATEST(i.ended, j.claimed_at) AS end_at,  -- never before its claim
           (i.snooze IS NOT NULL AND j.snoozes < %(max_snoozes)s) AS snoozed,
           (i.snooze IS NULL OR j.snoozes >= %(max_snoozes)s)
             AND (i.permanent OR j.attempts >= j.max_attempts) AS dead
      FROM input i JOIN pgqueue_job j ON j.id = i.id
),
failed AS (
    UPDATE pgqueue_job j
       SET status = CASE WHEN d.dead THEN 'dead' ELSE 'scheduled' END,
           run_at = CASE WHEN d.dead THEN j.run_at
                         WHEN d.snoozed THEN d.end_at + d.snooze * interval '1 second'
                         ELSE d.end_at + COALESCE(d.retry_in, random() * LEAST(%(backoff_cap)s::float8, %(backoff_base)s::float8 * power(2.0, GREATEST(j.attempts - 1, 0))))
                              * interval '1 second' END,
           attempts = CASE WHEN d.snoozed THEN j.attempts - 1 ELSE j.attempts END,
           snoozes = CASE WHEN d.snoozed THEN j.snoozes + 1 ELSE j.snoozes END,
           finished_at = CASE WHEN d.dead THEN d.end_at END,
           started_at = LEAST(GREATEST(j.claimed_at, d.started), d.end_at),
           last_error = CASE WHEN d.snooze IS NOT NULL AND NOT d.snoozed
                             THEN format('snoozed %%s times, the most PGQUEUE[''MAX_SNOOZES''] allows: a failed attempt (%%s)', j.snoozes, d.error)
                             ELSE d.error END,
           lease_expires_at = NULL
      FROM decided d
     WHERE j.id = d.id AND j.attempts = d.attempt
       AND j.status = 'running' AND j.lease_owner = %(worker)s
       AND j.cancel_requested_at IS NULL  -- a cancel request committed first wins
    RETURNING j.id, d.attempt, j.claimed_at, j.started_at, d.end_at AS ended, j.status, j.run_at,
              j.last_error, d.tb, j.limit_ids, d.snoozed, d.due_at
),
uncount_n AS MATERIALIZED (
    SELECT u.lid, count(*) AS n
      FROM failed r CROSS JOIN LATERAL unnest(r.limit_ids) AS u(lid)
     WHERE r.limit_ids IS NOT NULL
     GROUP BY u.lid
),
uncount_lock AS MATERIALIZED (
    SELECT l.id, u.n FROM pgqueue_limit l JOIN uncount_n u ON u.lid = l.id
     WHERE l.id = ANY(ARRAY(SELECT lid FROM uncount_n))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
     ORDER BY l.id FOR UPDATE OF l
),
uncounted AS (
    UPDATE pgqueue_limit l SET running = GREATEST(l.running - k.n, 0)
      FROM uncount_lock k
     WHERE l.id = k.id AND l.id = ANY(ARRAY(SELECT id FROM uncount_lock))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
),
history AS (
    INSERT INTO pgqueue_job_attempt
           (job_id, attempt, worker, claimed_at, started_at, finished_at, outcome, error,
            traceback, due_at)
    SELECT id, attempt, %(worker)s, claimed_at, started_at, ended,
           CASE WHEN snoozed THEN 'snoozed' ELSE 'failed' END, last_error, tb, due_at
      FROM failed
),
notified AS MATERIALIZED (
    SELECT count(pg_notify('pgqueue_finished', ids)) AS sent
      FROM (SELECT string_agg(id::text, ',') AS ids
              FROM (SELECT id, (row_number() OVER () - 1) / 400 AS chunk
                      FROM failed WHERE status = 'dead') f
             GROUP BY chunk) c
)
SELECT id, CASE WHEN snoozed THEN 'snoozed' ELSE status END, run_at
  FROM failed CROSS JOIN notified


-- name: JOB_HEARTBEAT_MANY
-- Extend the leases of every job a worker holds to %(now)s + %(lease)s seconds, in one
-- statement, and mark the worker seen. Fenced: a job not returned was lost (reaped and
-- possibly claimed again) and its handler must not record a result. Each job returned
-- says whether its cancellation was requested (JOB_CANCEL_REQUEST_MANY): how the worker
-- learns it within a heartbeat when the notification was missed. A job whose handler has
-- begun gets its started_at (%(started)s; NULL for one waiting for a thread), so a
-- running job shows when it started before its outcome is recorded.
-- What the handlers reported since the last round (job.progress(), job.output()) is
-- written here too, fenced like the lease: %(progress)s and %(output)s, JSON text per job,
-- NULL for unchanged (a round without reports passes arrays of NULLs and writes the row as
-- before). Progress is {"done", "total", "note", "at"}; output is the handler's value.
-- The ids of the jobs whose progress or output it wrote go to pg_notify('pgqueue_progress',
-- ids) (notified), batched 400 a payload as pgqueue_finished (see the top of this file):
-- what a caller following a job wakes on. None is sent by a round without reports.
-- Locks: the matched job rows and the worker's registry row, until the caller's
--   transaction ends (autocommit: at once).
-- Indexes: pgqueue_job_pkey (PK lookups; pgqueue_job_lease is updated), pgqueue_worker_pkey.
-- Called by: store.heartbeat_flags, from the worker runtime's heartbeat rounds (every
--   lease/3, about a second after a handler's start or report, and before the outcome of
--   a job with a report not yet written is recorded) and pgqueue.testing's runner.
WITH
seen AS (UPDATE pgqueue_worker SET last_seen_at = COALESCE(%(now)s::timestamptz, now()) WHERE id = %(worker)s),
beat AS (
    UPDATE pgqueue_job j
       SET lease_expires_at = COALESCE(%(now)s::timestamptz, now()) + %(lease)s * interval '1 second',
           started_at = COALESCE(j.started_at, CASE WHEN i.started IS NOT NULL THEN GREATEST(j.claimed_at, i.started) END),
           progress = COALESCE(i.progress::jsonb, j.progress),
           output = COALESCE(i.output::jsonb, j.output)
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(started)s::timestamptz[],
                  %(progress)s::text[], %(output)s::text[])
               AS i(id, attempt, started, progress, output)
     WHERE j.id = i.id AND j.attempts = i.attempt
       AND j.status = 'running' AND j.lease_owner = %(worker)s
    RETURNING j.id, j.cancel_requested_at IS NOT NULL AS asked,
              i.progress IS NOT NULL OR i.output IS NOT NULL AS reported
),
notified AS MATERIALIZED (
    SELECT count(pg_notify('pgqueue_progress', ids)) AS sent
      FROM (SELECT string_agg(id::text, ',') AS ids
              FROM (SELECT id, (row_number() OVER () - 1) / 400 AS chunk
                      FROM beat WHERE reported) f
             GROUP BY chunk) c
)
SELECT id, asked FROM beat CROSS JOIN notified


-- name: JOB_RELEASE_MANY
-- Gives back the jobs' limit rows (the uncount CTEs) and gates a job again if a limit applies.
-- Give back jobs a stopping worker claimed but never started: queued again with their old
-- vtime (they keep their place) and the attempt not counted. Fenced like a completion.
-- Notifies their queues so another worker takes them at once.
-- Locks: the matched job rows, until the caller's transaction ends (autocommit: at once).
-- Index: pgqueue_job_pkey (PK lookups); the rows move from pgqueue_job_lease back to
--   pgqueue_job_claim.
-- Called by: store.release_many, from the worker runtime when it stops.
WITH released AS (
    UPDATE pgqueue_job j
       SET status = 'queued', attempts = j.attempts - 1, lease_owner = NULL,
           lease_expires_at = NULL, claimed_at = NULL, started_at = NULL,
           gated = EXISTS (
        SELECT 1 FROM pgqueue_limit gl
         WHERE gl.tenant = j.tenant AND gl.queue IN ('', j.queue) AND (gl.max_running IS NOT NULL OR gl.rate_count IS NOT NULL OR gl.paused))
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS i(id, attempt)
     WHERE j.id = i.id AND j.attempts = i.attempt
       AND j.status = 'running' AND j.lease_owner = %(worker)s
    RETURNING j.id, j.queue, j.limit_ids
),
uncount_n AS MATERIALIZED (
    SELECT u.lid, count(*) AS n
      FROM released r CROSS JOIN LATERAL unnest(r.limit_ids) AS u(lid)
     WHERE r.limit_ids IS NOT NULL
     GROUP BY u.lid
),
uncount_lock AS MATERIALIZED (
    SELECT l.id, u.n FROM pgqueue_limit l JOIN uncount_n u ON u.lid = l.id
     WHERE l.id = ANY(ARRAY(SELECT lid FROM uncount_n))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
     ORDER BY l.id FOR UPDATE OF l
),
uncounted AS (
    UPDATE pgqueue_limit l SET running = GREATEST(l.running - k.n, 0)
      FROM uncount_lock k
     WHERE l.id = k.id AND l.id = ANY(ARRAY(SELECT id FROM uncount_lock))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
)
SELECT id, pg_notify(%(channel)s, queue) IS NULL FROM released


-- name: JOB_GIVE_BACK_MANY
-- Gives back the jobs' limit rows (the uncount CTEs) and gates a job again if a limit applies.
-- Give back jobs a worker claimed and cannot run (it has no handler for their task): the
-- attempt is not counted, as in JOB_RELEASE_MANY, and the job waits %(delay)s seconds in
-- 'scheduled' (a fresh fair vtime when promoted, as after a backoff) so that the workers
-- without the task do not take it again at once, over and over, while one that has it
-- can. With a delay of 0 it is queued again at once with its old vtime, exactly a release.
-- Fenced like a completion. Notifies the queues of the jobs queued again.
-- Locks: the matched job rows, until the caller's transaction ends (autocommit: at once).
-- Index: pgqueue_job_pkey (PK lookups); the rows move from pgqueue_job_lease to
--   pgqueue_job_scheduled (or, with no delay, pgqueue_job_claim).
-- Called by: store.give_back_many, from the worker runtime when it claims a job of a task
--   it does not have.
WITH given AS (
    UPDATE pgqueue_job j
       SET status = CASE WHEN %(delay)s::float8 > 0 THEN 'scheduled' ELSE 'queued' END,
           run_at = CASE WHEN %(delay)s::float8 > 0
                         THEN COALESCE(%(now)s::timestamptz, now()) + %(delay)s::float8 * interval '1 second'
                         ELSE j.run_at END,
           attempts = j.attempts - 1, lease_owner = NULL, lease_expires_at = NULL,
           claimed_at = NULL, started_at = NULL, gated = EXISTS (
        SELECT 1 FROM pgqueue_limit gl
         WHERE gl.tenant = j.tenant AND gl.queue IN ('', j.queue) AND (gl.max_running IS NOT NULL OR gl.rate_count IS NOT NULL OR gl.paused))
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS i(id, attempt)
     WHERE j.id = i.id AND j.attempts = i.attempt
       AND j.status = 'running' AND j.lease_owner = %(worker)s
    RETURNING j.id, j.queue, j.status, j.limit_ids
),
uncount_n AS MATERIALIZED (
    SELECT u.lid, count(*) AS n
      FROM given r CROSS JOIN LATERAL unnest(r.limit_ids) AS u(lid)
     WHERE r.limit_ids IS NOT NULL
     GROUP BY u.lid
),
uncount_lock AS MATERIALIZED (
    SELECT l.id, u.n FROM pgqueue_limit l JOIN uncount_n u ON u.lid = l.id
     WHERE l.id = ANY(ARRAY(SELECT lid FROM uncount_n))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
     ORDER BY l.id FOR UPDATE OF l
),
uncounted AS (
    UPDATE pgqueue_limit l SET running = GREATEST(l.running - k.n, 0)
      FROM uncount_lock k
     WHERE l.id = k.id AND l.id = ANY(ARRAY(SELECT id FROM uncount_lock))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
)
SELECT id, CASE WHEN status = 'queued' THEN pg_notify(%(channel)s, queue) END IS NULL
  FROM given


-- name: JOB_REAP_EXPIRED
-- Recover jobs whose lease ran out before %(now)s (their worker died or stalled). Whether
-- an attempt is spent depends on whether the job's start was recorded: a worker writes
-- the start of a running job to its row at its next heartbeat round, within about a
-- second of it (JOB_HEARTBEAT_MANY), or with its outcome. So, per job:
-- - its start was recorded: the expiry counts as an attempt: back to scheduled with
--   backoff, or dead when none are left, so a job that crashes every worker ends dead;
-- - it was not (a job claimed ahead that never started, whose worker a neighbour's
--   handler crashed or stalled, or one that began less than about a second before its
--   worker was lost): the job is given back as JOB_RELEASE_MANY gives one back, queued
--   again at once with its old vtime (its place in line, its tenant's fair clock not
--   charged again), gated again if a limit applies, its queue notified, and the attempt
--   not counted (attempts back to what they were before the claim). Such losses are
--   counted in lost_claims instead; the one that brings it to %(max_lost_claims)s
--   (PGQUEUE["MAX_LOST_CLAIMS"]) makes the job dead, so a handler that ends its process
--   before its start is recorded cannot loop for ever.
-- Either way one attempt row, outcome 'lease_expired', numbered as the claim was, with
-- the job's started_at: NULL marks a claim given back uncounted, and the attempt that
-- follows has the same number.
-- Gives back the reaped jobs' limit rows (the uncount CTEs): a crashed worker's slots come back.
-- Notifies pgqueue_finished with the ids of the jobs it made dead (notified; see the top
-- of this file).
-- Locks: the expired rows, FOR UPDATE SKIP LOCKED (a row a late completion holds is left
--   for the next run), until maintenance's transaction ends; their limit rows, in id order.
-- Index: pgqueue_job_lease, in expiry order; for a job given back, pgqueue_limit_scope
--   (as enqueue does).
-- Called by: store.reap_expired, from maintenance (one worker at a time).
WITH expired AS MATERIALIZED (
    SELECT id, lease_owner, attempts, claimed_at, started_at, run_at AS due_at,
           started_at IS NULL AS lost,
           CASE WHEN started_at IS NOT NULL THEN attempts >= max_attempts
                ELSE lost_claims + 1 >= %(max_lost_claims)s::int END AS out
      FROM pgqueue_job
     WHERE status = 'running' AND lease_expires_at < COALESCE(%(now)s::timestamptz, now())
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
reaped AS (
    UPDATE pgqueue_job j
       SET status = CASE WHEN e.out THEN 'dead' WHEN e.lost THEN 'queued' ELSE 'scheduled' END,
           run_at = CASE WHEN e.out OR e.lost THEN j.run_at
                         ELSE COALESCE(%(now)s::timestamptz, now()) + random() * LEAST(%(backoff_cap)s::float8, %(backoff_base)s::float8 * power(2.0, GREATEST(j.attempts - 1, 0)))
                              * interval '1 second' END,
           finished_at = CASE WHEN e.out THEN COALESCE(%(now)s::timestamptz, now()) END,
           attempts = j.attempts - e.lost::int,
           lost_claims = j.lost_claims + e.lost::int,
           lease_owner = CASE WHEN e.lost THEN NULL ELSE j.lease_owner END,
           claimed_at = CASE WHEN e.lost THEN NULL ELSE j.claimed_at END,
           gated = CASE WHEN e.lost AND NOT e.out THEN EXISTS (
        SELECT 1 FROM pgqueue_limit gl
         WHERE gl.tenant = j.tenant AND gl.queue IN ('', j.queue) AND (gl.max_running IS NOT NULL OR gl.rate_count IS NOT NULL OR gl.paused))
                        ELSE j.gated END,
           last_error = CASE
               WHEN NOT e.lost THEN
                    'lease expired: worker ' || e.lease_owner
                    || ' stopped renewing it (attempt ' || j.attempts || ')'
               WHEN e.out THEN
                    'lease expired: its worker was lost ' || j.lost_claims + 1
                    || ' times before its start was recorded (MAX_LOST_CLAIMS = '
                    || %(max_lost_claims)s::int || '); the last, ' || e.lease_owner
                    || ', stopped renewing it'
               ELSE 'lease expired: worker ' || e.lease_owner
                    || ' stopped renewing it before its start was recorded; given back'
                    || ' without spending an attempt (lost claim ' || j.lost_claims + 1
                    || ' of MAX_LOST_CLAIMS = ' || %(max_lost_claims)s::int || ')' END,
           lease_expires_at = NULL
      FROM expired e
     WHERE j.id = e.id
    RETURNING j.id, j.queue, j.status, j.last_error, j.limit_ids
),
uncount_n AS MATERIALIZED (
    SELECT u.lid, count(*) AS n
      FROM reaped r CROSS JOIN LATERAL unnest(r.limit_ids) AS u(lid)
     WHERE r.limit_ids IS NOT NULL
     GROUP BY u.lid
),
uncount_lock AS MATERIALIZED (
    SELECT l.id, u.n FROM pgqueue_limit l JOIN uncount_n u ON u.lid = l.id
     WHERE l.id = ANY(ARRAY(SELECT lid FROM uncount_n))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
     ORDER BY l.id FOR UPDATE OF l
),
uncounted AS (
    UPDATE pgqueue_limit l SET running = GREATEST(l.running - k.n, 0)
      FROM uncount_lock k
     WHERE l.id = k.id AND l.id = ANY(ARRAY(SELECT id FROM uncount_lock))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
),
history AS (
    INSERT INTO pgqueue_job_attempt
           (job_id, attempt, worker, claimed_at, started_at, finished_at, outcome, error, due_at)
    SELECT r.id, e.attempts, e.lease_owner, e.claimed_at, e.started_at, COALESCE(%(now)s::timestamptz, now()),
           'lease_expired', r.last_error, e.due_at
      FROM reaped r JOIN expired e ON e.id = r.id
),
notified AS MATERIALIZED (
    SELECT count(pg_notify('pgqueue_finished', ids)) AS sent
      FROM (SELECT string_agg(id::text, ',') AS ids
              FROM (SELECT id, (row_number() OVER () - 1) / 400 AS chunk
                      FROM reaped WHERE status = 'dead') f
             GROUP BY chunk) c
)
SELECT id, status, CASE WHEN status = 'queued' THEN pg_notify(%(channel)s, queue) END IS NULL
  FROM reaped CROSS JOIN notified


-- name: JOB_CANCEL_MANY
-- Cancel waiting, scheduled or queued jobs (the caller settles their dependents after
-- its commit, workflows.sql). A job being claimed at this instant is locked by the
-- claim; the UPDATE waits for it, re-checks the status and skips it (it is running now).
-- Notifies pgqueue_finished with the ids of the jobs cancelled (notified; see the top of
-- this file), delivered when the operator action commits.
-- Locks: the matched rows, in id order (as JOB_SETTLE_WAITING takes waiting rows: the two
--   never deadlock), until the operator action's transaction ends.
-- Index: pgqueue_job_pkey (PK lookups); the rows leave pgqueue_job_claim /
--   pgqueue_job_scheduled / pgqueue_job_waiting.
-- Called by: store.cancel_many, from services.cancel_jobs (admin, HTTP API, Python API).
WITH locked AS MATERIALIZED (
    SELECT id FROM pgqueue_job
     WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('waiting', 'scheduled', 'queued')
     ORDER BY id
       FOR NO KEY UPDATE
),
cancelled AS (
    UPDATE pgqueue_job
       SET status = 'cancelled', finished_at = now()
     WHERE id IN (SELECT id FROM locked) AND status IN ('waiting', 'scheduled', 'queued')
    RETURNING id
),
notified AS MATERIALIZED (
    SELECT count(pg_notify('pgqueue_finished', ids)) AS sent
      FROM (SELECT string_agg(id::text, ',') AS ids
              FROM (SELECT id, (row_number() OVER () - 1) / 400 AS chunk FROM cancelled) f
             GROUP BY chunk) c
)
SELECT id FROM cancelled CROSS JOIN notified


-- name: JOB_CANCEL_REQUEST_MANY
-- Ask running jobs to stop: stamp cancel_requested_at (the first request's time is kept,
-- so a second request changes nothing) and notify each holding worker on the wake-up
-- channel with the payload 'cancel:<worker id>' (a queue name cannot hold ':'), so that it
-- learns it at once rather than at its next heartbeat. PostgreSQL folds identical
-- notifications of one transaction into one. A job that completed first is no longer
-- running and is not matched (the caller reports its status).
-- Locks: the matched rows, until the operator action's transaction ends; a row being
--   completed is waited for and re-checked (READ COMMITTED), never both.
-- Index: pgqueue_job_pkey (PK lookups).
-- Called by: store.request_cancel_many (pgqueue.stop_store), from services.cancel_jobs
--   (admin, HTTP API, Python API, CLI), after JOB_CANCEL_MANY in the same transaction.
WITH asked AS (
    UPDATE pgqueue_job
       SET cancel_requested_at = COALESCE(cancel_requested_at, now())
     WHERE id = ANY(%(ids)s::bigint[]) AND status = 'running'
    RETURNING id, lease_owner
)
SELECT id, pg_notify(%(channel)s, 'cancel:' || lease_owner) IS NULL FROM asked


-- name: JOB_CANCEL_CONFIRM_MANY
-- The worker holding jobs whose cancellation was requested ends their attempt: status
-- 'cancelled', one attempt row each with outcome 'cancelled', all stamped %(now)s (and the
-- handler's start, %(started)s, when it had begun). Fenced
-- like a completion (owner, attempt, running) and on the request itself: a job not
-- returned had been recorded (its completion committed before the request) or lost.
-- Whatever the handler returns afterwards is discarded (its completion no longer matches).
-- Gives back the jobs' limit rows (the uncount CTEs), as every exit from running does.
-- Notifies pgqueue_finished with their ids (notified; see the top of this file).
-- Locks: the matched job rows, until the worker's transaction commits, at once.
-- Index: pgqueue_job_pkey (PK lookups); the rows leave pgqueue_job_lease.
-- Called by: stop_store.confirm_cancel_many, from the worker (worker/stops.py) when a
--   heartbeat or a notification tells it, and for outcomes the cancel fence refused.
WITH stopped AS (
    UPDATE pgqueue_job j
       SET status = 'cancelled', finished_at = COALESCE(%(now)s::timestamptz, now()), lease_expires_at = NULL,
           started_at = COALESCE(CASE WHEN i.started IS NOT NULL THEN GREATEST(j.claimed_at, i.started) END, j.started_at)
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(started)s::timestamptz[])
           AS i(id, attempt, started)
     WHERE j.id = i.id AND j.attempts = i.attempt
       AND j.status = 'running' AND j.lease_owner = %(worker)s
       AND j.cancel_requested_at IS NOT NULL
    RETURNING j.id, j.attempts, j.claimed_at, j.started_at, j.limit_ids, j.run_at
),
uncount_n AS MATERIALIZED (
    SELECT u.lid, count(*) AS n
      FROM stopped r CROSS JOIN LATERAL unnest(r.limit_ids) AS u(lid)
     WHERE r.limit_ids IS NOT NULL
     GROUP BY u.lid
),
uncount_lock AS MATERIALIZED (
    SELECT l.id, u.n FROM pgqueue_limit l JOIN uncount_n u ON u.lid = l.id
     WHERE l.id = ANY(ARRAY(SELECT lid FROM uncount_n))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
     ORDER BY l.id FOR UPDATE OF l
),
uncounted AS (
    UPDATE pgqueue_limit l SET running = GREATEST(l.running - k.n, 0)
      FROM uncount_lock k
     WHERE l.id = k.id AND l.id = ANY(ARRAY(SELECT id FROM uncount_lock))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
),
history AS (
    INSERT INTO pgqueue_job_attempt
           (job_id, attempt, worker, claimed_at, started_at, finished_at, outcome, error, due_at)
    SELECT id, attempts, %(worker)s, claimed_at, started_at, COALESCE(%(now)s::timestamptz, now()), 'cancelled',
           'cancelled on request', run_at
      FROM stopped
),
notified AS MATERIALIZED (
    SELECT count(pg_notify('pgqueue_finished', ids)) AS sent
      FROM (SELECT string_agg(id::text, ',') AS ids
              FROM (SELECT id, (row_number() OVER () - 1) / 400 AS chunk FROM stopped) f
             GROUP BY chunk) c
)
SELECT id FROM stopped CROSS JOIN notified


-- name: JOB_REAP_CANCELLED
-- Maintenance ends the running jobs asked to stop whose lease ran out before %(now)s (the
-- worker died, or was of a release that does not know cancel requests): 'cancelled', one
-- attempt row each with outcome 'cancelled'. Runs before JOB_REAP_EXPIRED, which would
-- otherwise schedule them for another attempt.
-- Gives back the jobs' limit rows (the uncount CTEs), as every exit from running does.
-- Notifies pgqueue_finished with their ids (notified; see the top of this file).
-- Locks: the rows, FOR UPDATE SKIP LOCKED (a row a late outcome holds is left for the next
--   run), until maintenance's transaction ends.
-- Index: pgqueue_job_lease (running jobs by lease expiry; as many rows as run at once).
-- Called by: stop_store.reap_cancelled, from maintenance (one worker at a time).
WITH expired AS MATERIALIZED (
    SELECT id, lease_owner FROM pgqueue_job
     WHERE status = 'running' AND lease_expires_at < COALESCE(%(now)s::timestamptz, now())
       AND cancel_requested_at IS NOT NULL
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
stopped AS (
    UPDATE pgqueue_job j
       SET status = 'cancelled', finished_at = COALESCE(%(now)s::timestamptz, now()), lease_expires_at = NULL
      FROM expired e
     WHERE j.id = e.id
    RETURNING j.id, j.attempts, j.claimed_at, j.started_at, e.lease_owner, j.limit_ids, j.run_at
),
uncount_n AS MATERIALIZED (
    SELECT u.lid, count(*) AS n
      FROM stopped r CROSS JOIN LATERAL unnest(r.limit_ids) AS u(lid)
     WHERE r.limit_ids IS NOT NULL
     GROUP BY u.lid
),
uncount_lock AS MATERIALIZED (
    SELECT l.id, u.n FROM pgqueue_limit l JOIN uncount_n u ON u.lid = l.id
     WHERE l.id = ANY(ARRAY(SELECT lid FROM uncount_n))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
     ORDER BY l.id FOR UPDATE OF l
),
uncounted AS (
    UPDATE pgqueue_limit l SET running = GREATEST(l.running - k.n, 0)
      FROM uncount_lock k
     WHERE l.id = k.id AND l.id = ANY(ARRAY(SELECT id FROM uncount_lock))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
),
history AS (
    INSERT INTO pgqueue_job_attempt
           (job_id, attempt, worker, claimed_at, started_at, finished_at, outcome, error, due_at)
    SELECT id, attempts, lease_owner, claimed_at, started_at, COALESCE(%(now)s::timestamptz, now()), 'cancelled',
           'cancelled on request (the lease ran out before the worker recorded it)', run_at
      FROM stopped
),
notified AS MATERIALIZED (
    SELECT count(pg_notify('pgqueue_finished', ids)) AS sent
      FROM (SELECT string_agg(id::text, ',') AS ids
              FROM (SELECT id, (row_number() OVER () - 1) / 400 AS chunk FROM stopped) f
             GROUP BY chunk) c
)
SELECT id FROM stopped CROSS JOIN notified


-- name: JOB_REAP_TIMED_OUT
-- The backstop of timeouts: a running job still held %(grace)s seconds past its deadline
-- (started_at + timeout_seconds: from its handler's start, which the worker's heartbeat
-- writes; a job whose start is not known has no deadline here) was not recorded by its
-- worker (one of a release that does not enforce timeouts, or stuck while its heartbeats
-- go on). It
-- fails as the worker would have failed it: "timed out after N s", scheduled again with
-- backoff or dead when out of attempts, one 'failed' attempt row. The worker's late
-- outcome is fenced out (the job is no longer running). Jobs asked to stop are left to the
-- cancel path.
-- Gives back the jobs' limit rows (the uncount CTEs), as every exit from running does.
-- Notifies pgqueue_finished with the ids of the jobs it made dead (notified; see the top
-- of this file).
-- Locks: the rows, FOR UPDATE SKIP LOCKED, until maintenance's transaction ends.
-- Index: pgqueue_job_lease (a scan of the running jobs only: as many as run at once).
-- Called by: stop_store.reap_timed_out, from maintenance (one worker at a time).
WITH late AS MATERIALIZED (
    SELECT id, lease_owner, run_at AS due_at,
           'timed out after ' || trim_scale(timeout_seconds::numeric) || ' s' AS error
      FROM pgqueue_job
     WHERE status = 'running' AND timeout_seconds IS NOT NULL
       AND cancel_requested_at IS NULL
       AND started_at IS NOT NULL
       AND started_at + (timeout_seconds + %(grace)s) * interval '1 second' < COALESCE(%(now)s::timestamptz, now())
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
failed AS (
    UPDATE pgqueue_job j
       SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'scheduled' END,
           run_at = CASE WHEN j.attempts >= j.max_attempts THEN j.run_at
                         ELSE COALESCE(%(now)s::timestamptz, now()) + random() * LEAST(%(backoff_cap)s::float8, %(backoff_base)s::float8 * power(2.0, GREATEST(j.attempts - 1, 0)))
                              * interval '1 second' END,
           finished_at = CASE WHEN j.attempts >= j.max_attempts THEN COALESCE(%(now)s::timestamptz, now()) END,
           last_error = l.error, lease_expires_at = NULL
      FROM late l
     WHERE j.id = l.id
    RETURNING j.id, j.attempts, j.claimed_at, j.started_at, j.status, l.error,
              l.lease_owner, j.limit_ids, l.due_at
),
uncount_n AS MATERIALIZED (
    SELECT u.lid, count(*) AS n
      FROM failed r CROSS JOIN LATERAL unnest(r.limit_ids) AS u(lid)
     WHERE r.limit_ids IS NOT NULL
     GROUP BY u.lid
),
uncount_lock AS MATERIALIZED (
    SELECT l.id, u.n FROM pgqueue_limit l JOIN uncount_n u ON u.lid = l.id
     WHERE l.id = ANY(ARRAY(SELECT lid FROM uncount_n))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
     ORDER BY l.id FOR UPDATE OF l
),
uncounted AS (
    UPDATE pgqueue_limit l SET running = GREATEST(l.running - k.n, 0)
      FROM uncount_lock k
     WHERE l.id = k.id AND l.id = ANY(ARRAY(SELECT id FROM uncount_lock))  -- by id: pgqueue_limit_pkey lookups, not a scan of every limit row
),
history AS (
    INSERT INTO pgqueue_job_attempt
           (job_id, attempt, worker, claimed_at, started_at, finished_at, outcome, error, due_at)
    SELECT id, attempts, lease_owner, claimed_at, started_at, COALESCE(%(now)s::timestamptz, now()), 'failed', error, due_at
      FROM failed
),
notified AS MATERIALIZED (
    SELECT count(pg_notify('pgqueue_finished', ids)) AS sent
      FROM (SELECT string_agg(id::text, ',') AS ids
              FROM (SELECT id, (row_number() OVER () - 1) / 400 AS chunk
                      FROM failed WHERE status = 'dead') f
             GROUP BY chunk) c
)
SELECT id, status FROM failed CROSS JOIN notified


-- name: JOB_RETRY_MANY
-- Send dead or cancelled jobs back: attempts, and leases lost before a start was recorded
-- (lost_claims, see JOB_REAP_EXPIRED), start again from 0 (history is kept), a cancel
-- request is forgotten, the progress and output its handler reported are cleared, and
-- the job waits in scheduled until its run_at; the caller then runs JOB_PROMOTE_MANY in
-- the same transaction for those already due (the ``due`` column), which gives them a
-- fresh fair vtime.
-- A keyed job that gave its key's slot back is admitted again ('new', KEY_SETTLE after
-- its promotion); a dead one that kept it (DEAD_JOB_HOLDS_KEY) runs again in that slot.
-- Locks: the matched rows, until the operator action's transaction ends.
-- Index: pgqueue_job_pkey (PK lookups); the rows join pgqueue_job_scheduled.
-- Called by: store.retry_many, from services.retry_jobs (admin, HTTP API, Python API).
UPDATE pgqueue_job
   SET status = 'scheduled', attempts = 0, lost_claims = 0, snoozes = 0, vtime = NULL, result = NULL,
       progress = NULL, output = NULL,
       run_at = GREATEST(run_at, now()), lease_owner = NULL, lease_expires_at = NULL,
       claimed_at = NULL, started_at = NULL, finished_at = NULL, cancel_requested_at = NULL,
       key_state = CASE WHEN concurrency_key IS NULL OR key_state = 'held' THEN key_state
                        ELSE 'new' END,
       gated = CASE WHEN concurrency_key IS NULL OR key_state = 'held' THEN gated END
 WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('dead', 'cancelled')
RETURNING id, run_at <= now() AS due


-- name: JOB_MAKE_DUE_MANY
-- Make scheduled jobs due now ("run now"); the caller runs JOB_PROMOTE_MANY next.
-- Locks: the matched rows, until the operator action's transaction ends.
-- Index: pgqueue_job_pkey (PK lookups).
-- Called by: store.run_now_many, from services.run_jobs_now (the admin's action).
UPDATE pgqueue_job SET run_at = now()
 WHERE id = ANY(%(ids)s::bigint[]) AND status = 'scheduled'
RETURNING id


-- name: JOB_GET_STATUS_MANY
-- Current status of jobs, to explain why an operation skipped them.
-- Locks: none (a plain read).
-- Index: pgqueue_job_pkey (PK lookups).
-- Called by: store.statuses, from the services' operator actions (cancel, retry, run now).
SELECT id, status FROM pgqueue_job WHERE id = ANY(%(ids)s::bigint[])


-- name: JOB_GET_OUTCOME
-- One job's status, result (JSON text) and last error: what a caller waiting for the job
-- reads (pgqueue.results), once it listens on pgqueue_finished, then again when a
-- notification names the job and every PGQUEUE["RESULT_RECHECK_SECONDS"] in case one was
-- missed. No row: the job does not exist, or its enqueue has not committed.
-- Locks: none (a plain read).
-- Index: pgqueue_job_pkey (one PK lookup).
-- Called by: results.Waiter, from pgqueue.result and Job.wait.
SELECT status, result::text, last_error FROM pgqueue_job WHERE id = %(id)s
