"""Every statement of pgqueue's hot paths, named Entity + Verb, in one place.

Each statement says what it locks, which index serves it and who calls it. Parameters are
bound by the driver (``%(name)s``), never formatted in. The fairness policy's fragments
come from ``pgqueue.fairness`` and are fixed SQL built at import time.

Conventions:
- ``%(now)s`` is an optional timestamp that tests inject instead of sleeping; NULL means
  the transaction's ``now()``.
- Payloads and results travel as JSON text (``::jsonb`` on the way in, ``::text`` on the
  way out), so the same statements work on Django's connection and on a bare psycopg one.
- Every write a worker makes to a job it claimed (complete, fail, heartbeat) is fenced:
  ``status = 'running' AND lease_owner = <worker> AND attempts = <the attempt it claimed>``.
"""

from __future__ import annotations

from .fairness import job_vtime, level_head, tenant_weight

NOW = "COALESCE(%(now)s::timestamptz, now())"

#: Full-jitter exponential backoff, in seconds, for a job's ``attempts`` so far.
BACKOFF = (
    "random() * LEAST(%(backoff_cap)s::float8, "
    "%(backoff_base)s::float8 * power(2.0, GREATEST({attempts} - 1, 0)))"
)

# -- name: TENANT_ENSURE
# Used inside the enqueue statements: creates the tenant if new. DO NOTHING takes no row
# lock on an existing tenant, so enqueues never queue behind a weight change.
_TENANT_ENSURE = """
    INSERT INTO pgqueue_tenant (name, weight) VALUES (%(tenant)s, 1.0)
    ON CONFLICT (name) DO NOTHING
"""

# -- name: JOB_ENQUEUE
# Enqueue 1..1,000 runnable jobs of one task, tenant, queue and priority in one statement.
# Called by services.enqueue / enqueue_many, inside the caller's transaction.
# Locks: the tenant's fair-clock row for (queue, tenant, priority), by INSERT .. ON CONFLICT
#   DO UPDATE, until the caller's transaction ends. Concurrent enqueues of one tenant at one
#   level therefore serialise and get distinct vtimes; other tenants are not blocked.
# Indexes: pgqueue_fair_clock_uniq (the upsert), pgqueue_job_claim and
#   pgqueue_fair_clock_level (the level head, one tuple each), pgqueue_job_idempotency.
# An idempotency key already taken (and committed) is seen before the clock is charged, so
# the tenant pays no virtual time for it. Racing duplicates are settled by ON CONFLICT; the
# loser is told (a NULL id) and refunds the clock with FAIR_CLOCK_REFUND. pg_notify is
# delivered only on commit: a rolled-back enqueue leaves no job, no charged virtual time
# and no wake-up.
JOB_ENQUEUE = f"""
WITH tenant_row AS ({_TENANT_ENSURE}),
weight AS (SELECT {tenant_weight("%(tenant)s", "%(queue)s")} AS w),
head AS (SELECT {level_head("%(queue)s", "%(priority)s")} AS h),
clock AS (
    INSERT INTO pgqueue_fair_clock AS c (queue, tenant, priority, vtime)
    SELECT %(queue)s, %(tenant)s, %(priority)s, head.h + %(n)s / weight.w
      FROM head, weight
     WHERE %(idempotency_key)s::text IS NULL OR NOT EXISTS (
           SELECT 1 FROM pgqueue_job dup
            WHERE dup.tenant = %(tenant)s AND dup.idempotency_key = %(idempotency_key)s)
    ON CONFLICT (queue, tenant, priority) DO UPDATE
       SET vtime = GREATEST(c.vtime + %(n)s / (SELECT w FROM weight), EXCLUDED.vtime)
    RETURNING c.vtime - %(n)s / (SELECT w FROM weight) AS start, (SELECT w FROM weight) AS w
),
inserted AS (
    INSERT INTO pgqueue_job (queue, tenant, task, payload, status, priority, vtime,
                             attempts, max_attempts, run_at, idempotency_key)
    SELECT %(queue)s, %(tenant)s, %(task)s, p.payload, 'queued', %(priority)s,
           {job_vtime("clock.start", "p.ord", "clock.w")},
           0, %(max_attempts)s, now(), %(idempotency_key)s
      FROM clock, jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, ord)
     ORDER BY p.ord
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
)
-- One row per inserted job; a single row with a NULL id when the clock was charged but
-- ON CONFLICT inserted nothing (the caller refunds); no row when nothing was charged.
SELECT inserted.id, (SELECT pg_notify(%(channel)s, %(queue)s)) IS NULL
  FROM clock LEFT JOIN inserted ON TRUE
 ORDER BY inserted.id
"""

# -- name: JOB_ENQUEUE_SCHEDULED
# Enqueue 1..1,000 jobs that become runnable later (run_at in the future). They wait in
# 'scheduled', outside the claim index, and get their vtime when JOB_PROMOTE makes them
# runnable. The tenant's clock row is created here (DO NOTHING: no lock on an existing
# row) so that promotion only ever locks rows that exist.
# Indexes: pgqueue_job_scheduled gains the rows; pgqueue_job_idempotency.
JOB_ENQUEUE_SCHEDULED = f"""
WITH tenant_row AS ({_TENANT_ENSURE}),
clock AS (
    INSERT INTO pgqueue_fair_clock (queue, tenant, priority, vtime)
    VALUES (%(queue)s, %(tenant)s, %(priority)s, 0.0)
    ON CONFLICT (queue, tenant, priority) DO NOTHING
),
inserted AS (
    INSERT INTO pgqueue_job (queue, tenant, task, payload, status, priority, vtime,
                             attempts, max_attempts, run_at, idempotency_key)
    SELECT %(queue)s, %(tenant)s, %(task)s, p.payload, 'scheduled', %(priority)s, NULL,
           0, %(max_attempts)s, %(run_at)s, %(idempotency_key)s
      FROM jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, ord)
     ORDER BY p.ord
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT id, TRUE FROM inserted ORDER BY id
"""

# -- name: FAIR_CLOCK_REFUND
# Gives back the virtual time JOB_ENQUEUE charged for a job that ON CONFLICT did not
# insert (a concurrent duplicate idempotency key). The caller's transaction still holds
# the row lock JOB_ENQUEUE took, so nothing else moved the clock in between.
FAIR_CLOCK_REFUND = f"""
UPDATE pgqueue_fair_clock
   SET vtime = vtime - %(n)s / {tenant_weight("%(tenant)s", "%(queue)s")}
 WHERE queue = %(queue)s AND tenant = %(tenant)s AND priority = %(priority)s
"""

# -- name: JOB_GET_BY_IDEMPOTENCY_KEY
# The job an idempotency key already names (index pgqueue_job_idempotency).
JOB_GET_BY_IDEMPOTENCY_KEY = """
SELECT id FROM pgqueue_job WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s
"""

# The claim, as CTEs that end in ``claimed`` (the rows now leased to %(worker)s). Used by
# JOB_CLAIM and JOB_COMPLETE_AND_CLAIM.
# Locks: the chosen rows, FOR UPDATE SKIP LOCKED: rows another claimer holds are skipped,
#   never waited on, so N workers take N different jobs and none is handed out twice.
#   The transaction commits at once; nothing stays locked while the job runs (the lease
#   takes over).
# Index: pgqueue_job_claim, one range scan per queue, already in claim order.
# The CTE that locks is MATERIALIZED so that locking happens once, before the UPDATE.
_CLAIM_ONE_QUEUE = """
picked AS MATERIALIZED (
    SELECT id FROM pgqueue_job
     WHERE queue = (%(queues)s::text[])[1] AND status = 'queued'
     ORDER BY priority DESC, vtime, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),"""
# With several queues, each queue offers its own best jobs and they are interleaved rank by
# rank (priority first): vtimes of different queues are not comparable.
_CLAIM_MANY_QUEUES = """
candidates AS MATERIALIZED (
    SELECT j.id, j.priority, j.vtime, q.ord
      FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS q(name, ord)
      CROSS JOIN LATERAL (
            SELECT id, priority, vtime FROM pgqueue_job
             WHERE queue = q.name AND status = 'queued'
             ORDER BY priority DESC, vtime, id
             LIMIT %(limit)s
               FOR UPDATE SKIP LOCKED
      ) j
),
picked AS (
    SELECT id FROM (
        SELECT id, priority, ord,
               row_number() OVER (PARTITION BY ord ORDER BY priority DESC, vtime, id) AS rank
          FROM candidates) c
     ORDER BY priority DESC, rank, ord
     LIMIT %(limit)s
),"""
_CLAIM_UPDATE = """
claimed AS (
    UPDATE pgqueue_job j
       SET status = 'running',
           attempts = j.attempts + 1,
           lease_owner = %(worker)s,
           lease_expires_at = now() + %(lease)s * interval '1 second',
           started_at = now()
      FROM picked
     WHERE j.id = picked.id
    RETURNING j.id, j.task, j.payload::text AS payload, j.tenant, j.queue, j.priority,
              j.attempts, j.max_attempts, j.lease_expires_at, j.vtime
)"""
_CLAIMED_COLUMNS = (
    "id, task, payload, tenant, queue, priority, attempts, max_attempts, lease_expires_at, vtime"
)

# Completions, as CTEs that end in ``done`` (the ids recorded). Fenced: a job whose lease
# was lost (reaped, or claimed again by anyone, this worker included) does not match and
# is not returned. Locks the matched job rows (PK lookups); one attempt row each.
_COMPLETE = """
done_input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(results)s::text[])
        AS i(id, attempt, result)
),
done AS (
    UPDATE pgqueue_job j
       SET status = 'done', result = i.result::jsonb, finished_at = now(),
           lease_expires_at = NULL
      FROM done_input i
     WHERE j.id = i.id AND j.attempts = i.attempt
       AND j.status = 'running' AND j.lease_owner = %(worker)s
    RETURNING j.id, j.attempts, j.started_at
),
done_history AS (
    INSERT INTO pgqueue_job_attempt (job_id, attempt, worker, started_at, finished_at, outcome)
    SELECT id, attempts, %(worker)s, started_at, now(), 'done' FROM done
)"""

# -- name: JOB_CLAIM / JOB_CLAIM_MANY_QUEUES
# Claim up to %(limit)s runnable jobs for one worker (see _CLAIM_* above). Called by workers
# when they have idle slots and nothing to record.
JOB_CLAIM = f"WITH {_CLAIM_ONE_QUEUE}{_CLAIM_UPDATE}\nSELECT {_CLAIMED_COLUMNS} FROM claimed"
JOB_CLAIM_MANY_QUEUES = (
    f"WITH {_CLAIM_MANY_QUEUES}{_CLAIM_UPDATE}\nSELECT {_CLAIMED_COLUMNS} FROM claimed"
)

# -- name: JOB_COMPLETE_MANY
# Record successes for jobs this worker holds (see _COMPLETE above).
JOB_COMPLETE_MANY = f"WITH {_COMPLETE}\nSELECT id FROM done"

# -- name: JOB_COMPLETE_AND_CLAIM / JOB_COMPLETE_AND_CLAIM_MANY_QUEUES
# A worker's steady state in one statement, one round trip and one commit: record the
# successes of the jobs that finished and claim as many new ones as that freed. The two
# parts touch disjoint rows (running ones are recorded, queued ones claimed). Returns the
# claimed jobs (is_claim true) and the recorded ids (is_claim false).
_COMPLETE_AND_CLAIM = """
SELECT TRUE AS is_claim, {columns} FROM claimed
UNION ALL
SELECT FALSE, id, NULL::text, NULL::text, NULL::text, NULL::varchar, NULL::smallint, NULL::int,
       NULL::int, NULL::timestamptz, NULL::float8
  FROM done"""
JOB_COMPLETE_AND_CLAIM = (
    f"WITH {_COMPLETE},{_CLAIM_ONE_QUEUE}{_CLAIM_UPDATE}"
    + _COMPLETE_AND_CLAIM.format(columns=_CLAIMED_COLUMNS)
)
JOB_COMPLETE_AND_CLAIM_MANY_QUEUES = (
    f"WITH {_COMPLETE},{_CLAIM_MANY_QUEUES}{_CLAIM_UPDATE}"
    + _COMPLETE_AND_CLAIM.format(columns=_CLAIMED_COLUMNS)
)

# -- name: JOB_FAIL_MANY
# Record failures for jobs this worker holds. Out of attempts, or a permanent error, means
# dead; otherwise back to scheduled with full-jitter exponential backoff, outside the claim
# index until JOB_PROMOTE gives it a fresh vtime. Fenced like JOB_COMPLETE_MANY. Writes one
# attempt row per job with the error and traceback.
JOB_FAIL_MANY = f"""
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(errors)s::text[],
                         %(tracebacks)s::text[], %(permanent)s::bool[])
        AS i(id, attempt, error, tb, permanent)
),
failed AS (
    UPDATE pgqueue_job j
       SET status = CASE WHEN i.permanent OR j.attempts >= j.max_attempts
                         THEN 'dead' ELSE 'scheduled' END,
           run_at = CASE WHEN i.permanent OR j.attempts >= j.max_attempts THEN j.run_at
                         ELSE now() + {BACKOFF.format(attempts="j.attempts")}
                              * interval '1 second' END,
           finished_at = CASE WHEN i.permanent OR j.attempts >= j.max_attempts
                              THEN now() END,
           last_error = i.error,
           lease_expires_at = NULL
      FROM input i
     WHERE j.id = i.id AND j.attempts = i.attempt
       AND j.status = 'running' AND j.lease_owner = %(worker)s
    RETURNING j.id, j.attempts, j.started_at, j.status, j.run_at, i.error, i.tb
),
history AS (
    INSERT INTO pgqueue_job_attempt
           (job_id, attempt, worker, started_at, finished_at, outcome, error, traceback)
    SELECT id, attempts, %(worker)s, started_at, now(), 'failed', error, tb FROM failed
)
SELECT id, status, run_at FROM failed
"""

# -- name: JOB_HEARTBEAT_MANY
# Extend the leases of every job a worker holds, in one statement, every lease/3, and mark
# the worker seen. Fenced: a job not returned was lost (reaped and possibly claimed again)
# and its handler must not record a result. Locks the matched rows (PK lookups) and the
# worker's registry row; pgqueue_job_lease is updated.
JOB_HEARTBEAT_MANY = """
WITH seen AS (UPDATE pgqueue_worker SET last_seen_at = now() WHERE id = %(worker)s)
UPDATE pgqueue_job j
   SET lease_expires_at = now() + %(lease)s * interval '1 second'
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS i(id, attempt)
 WHERE j.id = i.id AND j.attempts = i.attempt
   AND j.status = 'running' AND j.lease_owner = %(worker)s
RETURNING j.id
"""

# -- name: JOB_RELEASE_MANY
# Give back jobs a stopping worker claimed but never started: queued again with their old
# vtime (they keep their place) and the attempt not counted. Fenced like a completion.
# Notifies their queues so another worker takes them at once.
JOB_RELEASE_MANY = """
WITH released AS (
    UPDATE pgqueue_job j
       SET status = 'queued', attempts = j.attempts - 1, lease_owner = NULL,
           lease_expires_at = NULL, started_at = NULL
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS i(id, attempt)
     WHERE j.id = i.id AND j.attempts = i.attempt
       AND j.status = 'running' AND j.lease_owner = %(worker)s
    RETURNING j.id, j.queue
)
SELECT id, pg_notify(%(channel)s, queue) IS NULL FROM released
"""

# -- name: JOB_REAP_EXPIRED
# Recover jobs whose lease ran out (their worker died or stalled). Each expiry counts as an
# attempt: back to scheduled with backoff, or dead when none are left, so a job that
# crashes every worker ends dead instead of looping. Called by maintenance (one worker at
# a time). Locks: the expired rows, SKIP LOCKED. Index: pgqueue_job_lease.
JOB_REAP_EXPIRED = f"""
WITH expired AS MATERIALIZED (
    SELECT id, lease_owner FROM pgqueue_job
     WHERE status = 'running' AND lease_expires_at < {NOW}
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
reaped AS (
    UPDATE pgqueue_job j
       SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'scheduled' END,
           run_at = CASE WHEN j.attempts >= j.max_attempts THEN j.run_at
                         ELSE {NOW} + {BACKOFF.format(attempts="j.attempts")}
                              * interval '1 second' END,
           finished_at = CASE WHEN j.attempts >= j.max_attempts THEN {NOW} END,
           last_error = 'lease expired: worker ' || e.lease_owner
                        || ' stopped renewing it (attempt ' || j.attempts || ')',
           lease_expires_at = NULL
      FROM expired e
     WHERE j.id = e.id
    RETURNING j.id, j.attempts, j.started_at, j.status, j.last_error, e.lease_owner
),
history AS (
    INSERT INTO pgqueue_job_attempt
           (job_id, attempt, worker, started_at, finished_at, outcome, error)
    SELECT id, attempts, lease_owner, started_at, {NOW}, 'lease_expired', last_error
      FROM reaped
)
SELECT id, status FROM reaped
"""

_PROMOTE = f"""
WITH due AS MATERIALIZED (
    SELECT id, queue, tenant, priority, run_at FROM pgqueue_job
     WHERE {{due}}
     ORDER BY run_at, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
clock AS MATERIALIZED (
    SELECT c.id, c.queue, c.tenant, c.priority FROM pgqueue_fair_clock c
     WHERE (c.queue, c.tenant, c.priority) IN (SELECT queue, tenant, priority FROM due)
     ORDER BY c.queue, c.tenant, c.priority
       FOR UPDATE OF c SKIP LOCKED
),
ranked AS (
    SELECT d.id, k.id AS clock_id,
           row_number() OVER (PARTITION BY k.id ORDER BY d.run_at, d.id) AS rank
      FROM due d
      JOIN clock k ON (k.queue, k.tenant, k.priority) = (d.queue, d.tenant, d.priority)
),
step AS (
    SELECT k.id, count(*) AS n,
           {tenant_weight("k.tenant", "k.queue")} AS w,
           {level_head("k.queue", "k.priority")} AS h
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
       SET status = 'queued', vtime = {job_vtime("b.start", "r.rank", "b.w")}
      FROM ranked r JOIN bump b ON b.id = r.clock_id
     WHERE j.id = r.id
    RETURNING j.id, j.queue
)
SELECT id, pg_notify(%(channel)s, queue) IS NULL FROM promoted ORDER BY id
"""

# -- name: JOB_PROMOTE_DUE
# Make due scheduled jobs runnable, assigning fresh fair vtimes (a job back from a backoff
# does not jump the line). Called by maintenance. Locks: the due jobs (SKIP LOCKED, index
# pgqueue_job_scheduled), then their tenants' clock rows in sorted (queue, tenant,
# priority) order with SKIP LOCKED: a clock held by an open enqueue transaction is skipped
# until the next run instead of waited on, and the fixed order means two promoters can
# never deadlock. Each level's head is one tuple of pgqueue_job_claim. Notifies each queue.
JOB_PROMOTE_DUE = _PROMOTE.format(due=f"status = 'scheduled' AND run_at <= {NOW}")

# -- name: JOB_PROMOTE_IDS
# The same for named scheduled jobs, whatever their run_at (retry, "run now"). Locks as
# JOB_PROMOTE_DUE; the rows are found by primary key.
JOB_PROMOTE_IDS = _PROMOTE.format(due="status = 'scheduled' AND id = ANY(%(ids)s::bigint[])")

# -- name: JOB_CANCEL_MANY
# Cancel scheduled or queued jobs. A job being claimed at this instant is locked by the
# claim; the UPDATE waits for it, re-checks the status and skips it (it is running now).
# PK lookups; the rows leave pgqueue_job_claim / pgqueue_job_scheduled.
JOB_CANCEL_MANY = """
UPDATE pgqueue_job
   SET status = 'cancelled', finished_at = now()
 WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('scheduled', 'queued')
RETURNING id
"""

# -- name: JOB_RETRY_MANY
# Send dead or cancelled jobs back: attempts start again from 0 (history is kept) and the
# job waits in scheduled until its run_at; the caller then runs JOB_PROMOTE_IDS in the same
# transaction for those already due (the ``due`` column), which gives them a fresh fair
# vtime. PK lookups.
JOB_RETRY_MANY = """
UPDATE pgqueue_job
   SET status = 'scheduled', attempts = 0, vtime = NULL, result = NULL,
       run_at = GREATEST(run_at, now()), lease_owner = NULL, lease_expires_at = NULL,
       finished_at = NULL
 WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('dead', 'cancelled')
RETURNING id, run_at <= now() AS due
"""

# -- name: JOB_RUN_NOW_MANY
# Make scheduled jobs due now; the caller runs JOB_PROMOTE_IDS next. PK lookups.
JOB_RUN_NOW_MANY = """
UPDATE pgqueue_job SET run_at = now()
 WHERE id = ANY(%(ids)s::bigint[]) AND status = 'scheduled'
RETURNING id
"""

# -- name: JOB_STATUS_MANY
# Current status of jobs, to explain why an operation skipped them. PK lookups.
JOB_STATUS_MANY = """
SELECT id, status FROM pgqueue_job WHERE id = ANY(%(ids)s::bigint[])
"""

# -- name: TENANT_SET_WEIGHT
# Create or update a tenant's weight in every queue. Locks the tenant row. Takes effect
# for jobs that become runnable afterwards.
TENANT_SET_WEIGHT = """
INSERT INTO pgqueue_tenant (name, weight) VALUES (%(tenant)s, %(weight)s)
ON CONFLICT (name) DO UPDATE SET weight = EXCLUDED.weight
"""

# -- name: QUEUE_WEIGHT_SET
# Override a tenant's weight in one queue (creating the tenant if new).
QUEUE_WEIGHT_SET = f"""
WITH tenant_row AS ({_TENANT_ENSURE})
INSERT INTO pgqueue_queue_weight (queue, tenant, weight)
VALUES (%(queue)s, %(tenant)s, %(weight)s)
ON CONFLICT (tenant, queue) DO UPDATE SET weight = EXCLUDED.weight
"""

# -- name: MAINTENANCE_TRY_LOCK
# One worker at a time runs maintenance: a transaction-scoped advisory lock, released by
# the transaction's end (so a worker that dies mid-run frees it at once). Never waits.
MAINTENANCE_TRY_LOCK = """
SELECT pg_try_advisory_xact_lock(%(key)s)
"""

# -- name: WORKER_REGISTER
# A worker process records itself at start (PK upsert on its id).
WORKER_REGISTER = """
INSERT INTO pgqueue_worker (id, host, pid, queues, concurrency)
VALUES (%(worker)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s)
ON CONFLICT (id) DO UPDATE
   SET last_seen_at = now(), stopped_at = NULL, queues = EXCLUDED.queues,
       concurrency = EXCLUDED.concurrency
"""

# -- name: WORKER_STOP
# A worker marks itself stopped on a clean exit; a killed one just stops being seen.
WORKER_STOP = """
UPDATE pgqueue_worker SET stopped_at = now(), last_seen_at = now() WHERE id = %(worker)s
"""

# -- name: WORKER_PRUNE
# Maintenance forgets workers not seen for a day (the registry is for the living).
WORKER_PRUNE = """
DELETE FROM pgqueue_worker WHERE last_seen_at < now() - interval '1 day'
"""

# -- name: TASK_STAT_FOLD
# Fold attempt rows finished more than %(settle)s seconds ago into pgqueue_task_stat,
# oldest first, at most %(limit)s per run. Called by maintenance (one worker at a time;
# the mark row is locked too). Attempt ids are given out before their transactions commit,
# so a row could become visible after a larger id was folded: the settle delay (far longer
# than a worker's one-statement commit) keeps rows whose transaction may still be open out.
# Index: pgqueue_job_attempt_pkey (id > mark), pgqueue_job_pkey (the task of each).
TASK_STAT_FOLD = """
WITH mark AS (
    SELECT COALESCE(
        (SELECT last_attempt_id FROM pgqueue_stat_mark WHERE id = 1 FOR UPDATE), 0
    ) AS last_attempt_id
),
fresh AS MATERIALIZED (
    SELECT a.id, j.task, a.outcome,
           GREATEST(extract(epoch FROM a.finished_at - a.started_at)::float8, 0) AS secs
      FROM pgqueue_job_attempt a
      JOIN pgqueue_job j ON j.id = a.job_id
     WHERE a.id > (SELECT last_attempt_id FROM mark)
       AND a.finished_at <= now() - %(settle)s * interval '1 second'
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
)
INSERT INTO pgqueue_stat_mark (id, last_attempt_id)
SELECT 1, max(id) FROM fresh HAVING count(*) > 0
ON CONFLICT (id) DO UPDATE SET last_attempt_id = EXCLUDED.last_attempt_id
RETURNING last_attempt_id
"""

# -- Retention ------------------------------------------------------------------------------
# Finished jobs older than their status's retention leave the table with their attempt rows
# (and so with their idempotency keys). Never an attempt the metrics have not folded yet:
# a job having an attempt with id > pgqueue_stat_mark.last_attempt_id stays until the fold
# has passed it, so the counters of pgqueue_task_stat never lose history.
_PRUNABLE = f"""
    SELECT j.id FROM pgqueue_job j
     WHERE j.status = %(status)s
       AND j.finished_at < {NOW} - %(keep)s * interval '1 second'
       AND NOT EXISTS (
           SELECT 1 FROM pgqueue_job_attempt a
            WHERE a.job_id = j.id
              AND a.id > COALESCE(
                  (SELECT last_attempt_id FROM pgqueue_stat_mark WHERE id = 1), 0))
     ORDER BY j.finished_at
     LIMIT %(limit)s"""

# -- name: JOB_PRUNE_FINISHED
# Delete up to %(limit)s jobs of one finished status whose finished_at is more than
# %(keep)s seconds ago, oldest first, with their attempt rows, in one statement. Returns
# (jobs deleted, attempts deleted). Called by maintenance.prune_finished_jobs (a few
# batches per pass, each its own transaction) and manage.py pgqueue_prune.
# Locks: the chosen job rows, FOR UPDATE SKIP LOCKED: a row an operator is retrying or
#   anything else holds is skipped until a later batch, never waited on; claims and
#   enqueues touch other rows (queued, scheduled, new) and never wait on a prune. The
#   attempt rows of the locked jobs, which nothing else writes once a job is finished.
#   The attempt -> job foreign key is deferred: both deletes are checked at commit.
# Index: pgqueue_job_finished (status, finished_at) WHERE status IN finished statuses,
#   a range scan already oldest first; pgqueue_job_attempt's job_id index for the
#   not-yet-folded probe and the delete of the history; pgqueue_stat_mark's pkey.
JOB_PRUNE_FINISHED = f"""
WITH doomed AS MATERIALIZED ({_PRUNABLE}
       FOR UPDATE OF j SKIP LOCKED
),
history AS (
    DELETE FROM pgqueue_job_attempt a USING doomed d WHERE a.job_id = d.id RETURNING a.id
),
jobs AS (
    DELETE FROM pgqueue_job j USING doomed d WHERE j.id = d.id RETURNING j.id
)
SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM history)
"""

# -- name: JOB_PRUNE_FINISHED_COUNT
# What JOB_PRUNE_FINISHED would delete for one status, counted up to %(limit)s jobs (the
# caller asks for one more than it shows, to say "N+"): (jobs, their attempt rows). Takes
# no lock. Called by manage.py pgqueue_prune --dry-run. Index: as JOB_PRUNE_FINISHED.
JOB_PRUNE_FINISHED_COUNT = f"""
WITH doomed AS MATERIALIZED ({_PRUNABLE}
)
SELECT (SELECT count(*) FROM doomed),
       (SELECT count(*) FROM pgqueue_job_attempt a JOIN doomed d ON a.job_id = d.id)
"""
