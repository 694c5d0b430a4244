"""Every statement of pgqueue's hot paths, named Entity + Verb + Qualifier, in one place.

Each statement says what it locks, which index serves it and who calls it. Parameters are
bound by the driver (``%(name)s``), never formatted in. The fairness policy's fragments
come from ``pgqueue.fairness`` and are fixed SQL built at import time.

A header (``-- name: X``) reads, in this order: what the statement does and why it is
shaped so; ``Locks:`` what it locks and until when; ``Index:`` / ``Indexes:`` what serves
it; ``Called by:`` the ``pgqueue.store`` function that runs it, and who calls that.
Fragments (``_X``) are pieces of those statements, covered by the headers of each.

Conventions:
- ``%(now)s`` is an optional timestamp that tests inject instead of sleeping; NULL means
  the transaction's ``now()``. Taken by every statement that starts, extends or ends a
  lease (claim, heartbeat, complete, fail, reap) and by promotion.
- Payloads and results travel as JSON text (``::jsonb`` on the way in, ``::text`` on the
  way out), so the same statements work on Django's connection and on a bare psycopg one.
- Every write a worker makes to a job it claimed (complete, fail, heartbeat) is fenced:
  ``status = 'running' AND lease_owner = <worker> AND attempts = <the attempt it claimed>``.
- Three times mark an attempt: ``claimed_at`` (the claim's, in the database's clock),
  ``started_at`` and ``finished_at`` (when its handler began and ended). The worker takes
  the last two and carries them with the outcome (``%(started)s``, ``%(finished)s``), in
  the database's clock (``pgqueue.worker.clock``); a statement never writes a start before
  the claim (``GREATEST(j.claimed_at, ...)``, which is also the claim when no start is
  given: a caller that ran no handler).
"""

from __future__ import annotations

from .fairness import (
    charge_units,
    gated_head,
    job_vtime,
    level_head,
    queued_head,
    run_time_charge,
    tenant_weight,
)

NOW = "COALESCE(%(now)s::timestamptz, now())"

#: The comment beside a BY_ID condition: a job matched by id, so that any plan is a
#: primary-key lookup per job.
BY_ID = "by id: a pgqueue_job_pkey lookup in any plan"
#: The same for limit rows: a statement reads the rows it needs, never every row of the table.
LIMIT_BY_ID = "by id: pgqueue_limit_pkey lookups, not a scan of every limit row"


#: Full-jitter exponential backoff, in seconds, for a job's ``attempts`` so far.
BACKOFF = (
    "random() * LEAST(%(backoff_cap)s::float8, "
    "%(backoff_base)s::float8 * power(2.0, GREATEST({attempts} - 1, 0)))"
)


def _retry_or_dead(out: str, ended: str = NOW, back: str | None = None) -> str:
    """The SET clauses of a failed attempt of job ``j``: dead (finished at ``ended``, SQL)
    when ``out`` (SQL: no retry, e.g. out of attempts) holds, else scheduled after a
    full-jitter backoff from now; with ``back`` (SQL), queued again at once with its
    run_at when that holds and ``out`` does not (JOB_REAP_EXPIRED's job given back).
    Shared by JOB_FAIL_MANY, JOB_REAP_EXPIRED and JOB_REAP_TIMED_OUT."""
    queued, kept = (
        ("", out) if back is None else (f" WHEN {back} THEN 'queued'", f"{out} OR {back}")
    )
    return f"""status = CASE WHEN {out} THEN 'dead'{queued} ELSE 'scheduled' END,
           run_at = CASE WHEN {kept} THEN j.run_at
                         ELSE {NOW} + {BACKOFF.format(attempts="j.attempts")}
                              * interval '1 second' END,
           finished_at = CASE WHEN {out} THEN {ended} END"""


def _began(given: str) -> str:
    """SQL: the start of job ``j``'s handler, ``given`` (a timestamptz the worker carried),
    never before the claim; NULL when none was given (the handler has not begun)."""
    return f"CASE WHEN {given} IS NOT NULL THEN GREATEST(j.claimed_at, {given}) END"


# Creates the tenant if new, inside JOB_ENQUEUE, JOB_ENQUEUE_SCHEDULED and QUEUE_WEIGHT_SET.
# DO NOTHING takes no row lock on an existing tenant, so enqueues never queue behind a
# weight change.
_TENANT_ENSURE = """
    INSERT INTO pgqueue_tenant (name, weight) VALUES (%(tenant)s, 1.0)
    ON CONFLICT (name) DO NOTHING
"""


def _limiting(row: str) -> str:
    """SQL: the pgqueue_limit row ``row`` limits something (a cap, a rate or a pause)."""
    return f"({row}.max_running IS NOT NULL OR {row}.rate_count IS NOT NULL OR {row}.paused)"


def _gated(tenant: str, queue: str) -> str:
    """SQL: a job of (``tenant``, ``queue``) is gated: a limit row of the tenant, or of the
    tenant in that queue, limits something. Gated jobs wait outside the claim index (in
    pgqueue_job_gated), so a capped tenant's backlog costs the claim nothing. One probe of
    pgqueue_limit_scope (tenant, queue); next to nothing on an empty table."""
    return f"""EXISTS (
        SELECT 1 FROM pgqueue_limit gl
         WHERE gl.tenant = {tenant} AND gl.queue IN ('', {queue}) AND {_limiting("gl")})"""


def _enqueued(rows: str) -> str:
    """What the enqueue statements return of each new job (before a trailing column): what
    ``pgqueue.enqueue`` needs to return a complete Job without reading it back.

    All but the id come only when one job is enqueued (``%(n)s = 1``): a bulk enqueue needs
    ids alone, and on Django's connection a timestamptz costs the client tens of µs to
    load (a Python loader) against well under 1 µs for an id; 1,000 rows with two
    timestamps each doubled the statement's time. NULLs cost nothing to load.
    """
    one = "CASE WHEN %(n)s = 1 THEN {rows}.{column} END AS {column}"
    return ", ".join(
        [
            f"{rows}.id",
            *(one.format(rows=rows, column=c) for c in ("run_at", "created_at", "vtime")),
        ]
    )


#: A taken idempotency key (committed): SQL, true when %(idempotency_key)s names a job of
#: the tenant. One probe of pgqueue_job_idempotency; folded away without a key.
_KEY_FREE = """%(idempotency_key)s::text IS NULL OR NOT EXISTS (
           SELECT 1 FROM pgqueue_job dup
            WHERE dup.tenant = %(tenant)s AND dup.idempotency_key = %(idempotency_key)s)"""

#: The bound of the enqueue statements: PGQUEUE["MAX_QUEUES_PER_TENANT"], or NULL.
MAX_QUEUES = "%(max_queues)s::int"

#: SQL: tenant %(tenant)s has clocks in fewer than MAX_QUEUES queues (counted up to that
#: many distinct queues of pgqueue_fair_clock_tenant (tenant, queue), an index-only range).
_FEWER_QUEUES = f"""(SELECT count(*) FROM (
                          SELECT DISTINCT b.queue FROM pgqueue_fair_clock b
                           WHERE b.tenant = %(tenant)s
                           LIMIT {MAX_QUEUES}) n) < {MAX_QUEUES}"""


def _admit() -> str:
    """The CTEs ``own`` and ``admit`` of the statements that enqueue into a level new to
    the tenant (the *_FIRST statements), as their snapshot shows them:
    - ``own``: whether the tenant has a fair clock in the queue (``in_queue``) and at the
      level (``at_level``): a range of pgqueue_fair_clock_uniq (queue, tenant), a row per
      priority the tenant uses in the queue.
    - ``admit``: ``fresh``, the idempotency key is not taken (a taken one enqueues nothing
      and is not refused: the caller returns its job); ``admitted``, the queue is one of
      the tenant's, or MAX_QUEUES is NULL, or the tenant has clocks in fewer than
      MAX_QUEUES queues: counted only for a queue new to the tenant, up to MAX_QUEUES
      distinct queues of pgqueue_fair_clock_tenant (tenant, queue), an index-only range.
      Enqueues into new queues that run at once do not see one another's new clocks
      (uncommitted), so together they pass the bound by at most their number.
    """
    return f"""own AS MATERIALIZED (
    SELECT count(*) > 0 AS in_queue,
           COALESCE(bool_or(o.priority = %(priority)s), FALSE) AS at_level
      FROM pgqueue_fair_clock o
     WHERE o.queue = %(queue)s AND o.tenant = %(tenant)s
),
admit AS MATERIALIZED (
    SELECT {_KEY_FREE} AS fresh,
           CASE WHEN (SELECT in_queue FROM own) OR {MAX_QUEUES} IS NULL THEN TRUE
                ELSE {_FEWER_QUEUES}
           END AS admitted
)"""


def _outcome(clock: str | None) -> str:
    """The trailing row of a *_FIRST statement that inserted nothing: its ``state`` says
    why. ``'taken'``: the idempotency key is taken (nothing charged; the caller returns
    its job). ``'refused'``: the queue is new to a tenant at MAX_QUEUES_PER_TENANT. With
    ``clock`` (the CTE of the clock charged, JOB_ENQUEUE_FIRST's), also ``'known'``: the
    snapshot shows the tenant's clock at the level after all (a concurrent enqueue of the
    tenant created it since JOB_ENQUEUE's snapshot), so the caller runs JOB_ENQUEUE again;
    and ``'raced'``: the level's largest clock was deleted by FAIR_CLOCK_DELETE_IDLE while
    this statement waited for it, and the caller runs the statements again, with a
    snapshot that shows the deletion. Columns as _enqueued's, then the wake-up's and the
    state."""
    more = ""
    if clock:
        more = """
                WHEN (SELECT at_level FROM own) THEN 'known'"""
    tail = ""
    if clock:
        tail = f"""
                WHEN NOT EXISTS (SELECT 1 FROM {clock}) THEN 'raced'"""
    return f"""
SELECT NULL::bigint, NULL::timestamptz, NULL::timestamptz, NULL::float8, NULL::boolean, s.state
  FROM (SELECT CASE WHEN NOT a.fresh THEN 'taken'{more}
                WHEN NOT a.admitted THEN 'refused'{tail} END AS state
          FROM admit a) s
 WHERE s.state IS NOT NULL"""


def _insert_jobs(by_time: bool) -> str:
    """The ``inserted`` CTE of the enqueue statements of runnable jobs: the jobs, each with
    its vtime from the ``clock`` CTE's ``start`` and ``w`` and its rank (_enqueued's
    columns returned)."""
    rank = charge_units(by_time, "p.ord", "(SELECT c FROM charge)")
    column, value = (", charge", ", (SELECT c FROM charge)") if by_time else ("", "")
    return f"""inserted AS (
    INSERT INTO pgqueue_job (queue, tenant, task, payload, status, priority, vtime,
                             attempts, max_attempts, run_at, idempotency_key,
                             timeout_seconds, gated{column})
    SELECT %(queue)s, %(tenant)s, %(task)s, p.payload, 'queued', %(priority)s,
           {job_vtime("clock.start", rank, "clock.w")},
           0, %(max_attempts)s, now(), %(idempotency_key)s, %(timeout)s::float8, gate.g{value}
      FROM clock, gate, jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, ord)
     ORDER BY p.ord
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, run_at, created_at, vtime
)"""


def _enqueue_head(by_time: bool, tenant: bool = True) -> str:
    """The first CTEs of the enqueue statements of runnable jobs: the tenant row (unless
    not ``tenant``), the charge (by time), the tenant's weight, the level's head and
    whether a limit gates the jobs."""
    charge = f"charge AS (SELECT {run_time_charge('%(task)s')} AS c),\n" if by_time else ""
    first = f"tenant_row AS ({_TENANT_ENSURE}),\n" if tenant else ""
    return f"""
WITH {first}{charge}weight AS (SELECT {tenant_weight("%(tenant)s", "%(queue)s")} AS w),
head AS (SELECT {level_head("%(queue)s", "%(priority)s")} AS h),
gate AS (SELECT {_gated("%(tenant)s", "%(queue)s")} AS g)"""


# -- name: JOB_ENQUEUE
# A job of a tenant a limit applies to is enqueued gated (out of the claim index; _gated).
# Enqueue 1..1,000 runnable jobs of one task, tenant, queue and priority in one statement,
# the tenant having a fair clock at that level (queue, priority): the common case. Returns
# each new job's columns (_enqueued), then its wake-up and a NULL state.
# An idempotency key already taken (and committed) is seen before the clock is charged, so
# the tenant pays no virtual time for it: one row says 'taken'. Racing duplicates are
# settled by ON CONFLICT; the loser is told (a NULL id) and refunds the clock with
# FAIR_CLOCK_REFUND. pg_notify is delivered only on commit: a rolled-back enqueue leaves no
# job, no charged virtual time and no wake-up.
# No row at all: the tenant has no clock at the level in this statement's snapshot, or
# had one that FAIR_CLOCK_DELETE_IDLE deleted while this statement waited for its lock.
# Nothing was written, and store.enqueue runs JOB_ENQUEUE_FIRST, whose snapshot is newer
# than the deletion. The clock is charged by an UPDATE, not an upsert, for that reason:
# an upsert would create again, from the head of its snapshot, a clock a prune deleted
# (and the level's scale with it, see "Idle fair clocks"). The first job at a level is
# the other statement's so that this one, the common case, plans and starts no more nodes
# than the upsert it replaces (a second data-modifying CTE and a row lock here cost every
# enqueue about 0.5 ms, measured; the first job at a level pays a second round trip).
# The tenant row is ensured only once the clock is charged.
# Locks: the tenant's fair-clock row for (queue, tenant, priority) (the UPDATE), until the
#   caller's transaction ends. Concurrent enqueues of one tenant at one level therefore
#   serialise and get distinct vtimes; other tenants are not blocked.
# Indexes: pgqueue_fair_clock_uniq (the UPDATE), pgqueue_job_claim and
#   pgqueue_fair_clock_level (the level head, one tuple each), pgqueue_job_idempotency.
# Called by: store.enqueue, from services.enqueue / enqueue_many (the Python API, the HTTP
#   API and the Tasks backend) and schedules._fire, inside the caller's transaction.
def _job_enqueue(by_time: bool) -> str:
    """JOB_ENQUEUE charging 1 per job (by jobs) or its task's run-time charge (by time)."""
    units = charge_units(by_time, "%(n)s", "(SELECT c FROM charge)")
    return f"""{_enqueue_head(by_time, tenant=False)},
fresh AS (SELECT {_KEY_FREE} AS ok),
clock AS (
    UPDATE pgqueue_fair_clock c
       SET vtime = GREATEST(c.vtime + {units} / (SELECT w FROM weight),
                            (SELECT h FROM head) + {units} / (SELECT w FROM weight))
     WHERE c.queue = %(queue)s AND c.tenant = %(tenant)s AND c.priority = %(priority)s
       AND (SELECT ok FROM fresh)
    RETURNING c.vtime - {units} / (SELECT w FROM weight) AS start, (SELECT w FROM weight) AS w
),
tenant_row AS (  -- as _TENANT_ENSURE, once there is a clock: a statement that finds none
    INSERT INTO pgqueue_tenant (name, weight) SELECT %(tenant)s, 1.0 FROM clock
    ON CONFLICT (name) DO NOTHING
),
{_insert_jobs(by_time)}
-- One row per inserted job; a single row with a NULL id when the clock was charged but
-- ON CONFLICT inserted nothing (the caller refunds); a single row saying 'taken' when the
-- key was taken before (nothing charged); no row when the tenant has no clock here.
SELECT {_enqueued("inserted")},
       CASE WHEN f.ok THEN (SELECT pg_notify(%(channel)s, %(queue)s)) IS NULL END,
       CASE WHEN NOT f.ok THEN 'taken' END AS state
  FROM fresh f LEFT JOIN clock ON TRUE LEFT JOIN inserted ON TRUE
 WHERE clock.start IS NOT NULL OR NOT f.ok
 ORDER BY inserted.id
"""


JOB_ENQUEUE = _job_enqueue(False)

# -- name: JOB_ENQUEUE_BY_TIME
# JOB_ENQUEUE with FAIRNESS = "time": each job is charged its task's run-time estimate
# (fairness.run_time_charge, bound to %(charge_min)s / %(charge_default)s) instead of 1,
# and the charge is kept on the job for FAIR_CLOCK_CORRECT.
# Locks: as JOB_ENQUEUE.
# Indexes: as JOB_ENQUEUE, and pgqueue_task_stat_uniq (the task's rows, a few dozen at most).
# Called by: store.enqueue when fairness.by_time(), from services.enqueue / enqueue_many.
JOB_ENQUEUE_BY_TIME = _job_enqueue(True)


# -- name: JOB_ENQUEUE_FIRST
# JOB_ENQUEUE for a tenant with no fair clock at the level: run by store.enqueue when
# JOB_ENQUEUE returned no row. A queue new to the tenant is admitted only below
# MAX_QUEUES_PER_TENANT (_admit: the count is made only then); refused, nothing is written
# (but the tenant row) and one row says 'refused'. The clock is created from the level's
# head, by an upsert (a concurrent first enqueue of the same tenant may create it first:
# then it is charged). The level's keeper in the snapshot (its largest clock,
# LEVEL_LARGEST) is first held FOR KEY SHARE: FAIR_CLOCK_DELETE_IDLE deletes a level's
# keeper only with the whole level, holding every clock of it FOR UPDATE, so it leaves
# this level whole while the new clock and jobs are uncommitted
# (their vtimes are of the level's current scale, which that deletion would start again
# from 0); if the prune got there first this waits for it and finds the clock deleted,
# writes nothing and one row says 'raced' (store.enqueue runs the statements again, with
# a snapshot that shows the deletion). Other rows and states as JOB_ENQUEUE's, and
# 'known' (_outcome).
# Locks: the new clock row (the upsert), and the level's keeper FOR KEY SHARE,
#   until the caller's transaction ends. KEY SHARE conflicts with no enqueue, promotion or
#   correction (FOR NO KEY UPDATE), only with the prune's FOR UPDATE.
# Indexes: pgqueue_fair_clock_uniq (the tenant's clocks in the queue, the upsert),
#   pgqueue_fair_clock_tenant (the count, a queue new to the tenant only),
#   pgqueue_fair_clock_level (the largest clock), then as JOB_ENQUEUE.
# Called by: store.enqueue, after JOB_ENQUEUE returned no row.
def _job_enqueue_first(by_time: bool) -> str:
    """JOB_ENQUEUE_FIRST charging 1 per job (by jobs) or its task's run-time charge."""
    units = charge_units(by_time, "%(n)s", "(SELECT c FROM charge)")
    return f"""{_enqueue_head(by_time)},
{_admit()},
level_max AS MATERIALIZED (
    SELECT m.id FROM pgqueue_fair_clock m
     WHERE m.queue = %(queue)s AND m.priority = %(priority)s
     ORDER BY m.vtime DESC, m.id LIMIT 1  -- the level's keeper (LEVEL_LARGEST)
),
level_held AS MATERIALIZED (
    SELECT k.id FROM pgqueue_fair_clock k WHERE k.id = (SELECT id FROM level_max)
       FOR KEY SHARE
),
clock AS (
    INSERT INTO pgqueue_fair_clock AS c (queue, tenant, priority, vtime)
    SELECT %(queue)s, %(tenant)s, %(priority)s, head.h + {units} / weight.w
      FROM head, weight
     WHERE NOT (SELECT at_level FROM own) AND (SELECT fresh AND admitted FROM admit)
       AND (NOT EXISTS (SELECT 1 FROM level_max) OR EXISTS (SELECT 1 FROM level_held))
    ON CONFLICT (queue, tenant, priority) DO UPDATE
       SET vtime = GREATEST(c.vtime + {units} / (SELECT w FROM weight), EXCLUDED.vtime)
    RETURNING c.vtime - {units} / (SELECT w FROM weight) AS start, (SELECT w FROM weight) AS w
),
{_insert_jobs(by_time)}
SELECT {_enqueued("inserted")}, (SELECT pg_notify(%(channel)s, %(queue)s)) IS NULL,
       NULL::text AS state
  FROM clock LEFT JOIN inserted ON TRUE
 UNION ALL{_outcome("clock")}
 ORDER BY id
"""


JOB_ENQUEUE_FIRST = _job_enqueue_first(False)

# -- name: JOB_ENQUEUE_FIRST_BY_TIME
# JOB_ENQUEUE_FIRST with FAIRNESS = "time" (the charge of JOB_ENQUEUE_BY_TIME).
# Locks, Indexes: as JOB_ENQUEUE_FIRST, and pgqueue_task_stat_uniq.
# Called by: store.enqueue when fairness.by_time(), after JOB_ENQUEUE_BY_TIME returned no row.
JOB_ENQUEUE_FIRST_BY_TIME = _job_enqueue_first(True)


def _job_enqueue_scheduled(first: bool) -> str:
    """JOB_ENQUEUE_SCHEDULED (a queue of the tenant's) or JOB_ENQUEUE_SCHEDULED_FIRST."""
    if first:
        ctes, allowed = f",\n{_admit()}", "(SELECT admitted FROM admit)"
        last = f"""SELECT {_enqueued("inserted")}, TRUE, NULL::text AS state FROM inserted
 UNION ALL{_outcome(None)}
 ORDER BY id"""
    else:
        ctes = """,
known AS (
    SELECT EXISTS (SELECT 1 FROM pgqueue_fair_clock o
                    WHERE o.queue = %(queue)s AND o.tenant = %(tenant)s) AS yes
)"""
        allowed = "(SELECT yes FROM known)"
        last = f"""SELECT {_enqueued("inserted")}, TRUE,
       CASE WHEN NOT k.yes THEN 'first' END AS state
  FROM known k LEFT JOIN inserted ON TRUE
 WHERE inserted.id IS NOT NULL OR NOT k.yes
 ORDER BY inserted.id"""
    return f"""
WITH tenant_row AS ({_TENANT_ENSURE}){ctes},
clock AS (
    INSERT INTO pgqueue_fair_clock (queue, tenant, priority, vtime)
    SELECT %(queue)s, %(tenant)s, %(priority)s, 0.0 WHERE {allowed}
    ON CONFLICT (queue, tenant, priority) DO NOTHING
),
inserted AS (
    INSERT INTO pgqueue_job (queue, tenant, task, payload, status, priority, vtime,
                             attempts, max_attempts, run_at, idempotency_key,
                             timeout_seconds)
    SELECT %(queue)s, %(tenant)s, %(task)s, p.payload, 'scheduled', %(priority)s, NULL,
           0, %(max_attempts)s, %(run_at)s, %(idempotency_key)s, %(timeout)s::float8
      FROM jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, ord)
     WHERE {allowed}
     ORDER BY p.ord
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, run_at, created_at, vtime
)
{last}
"""


# -- name: JOB_ENQUEUE_SCHEDULED
# Enqueue 1..1,000 jobs that become runnable later (run_at in the future), returning
# each new job's columns (_enqueued; vtime is NULL), into a queue where the tenant has a
# fair clock. They wait in 'scheduled', outside the claim index, and get their vtime when
# JOB_PROMOTE_DUE makes them runnable. No wake-up: nothing is runnable yet. No row: the
# key was taken. One row saying 'first': the queue is new to the tenant, nothing was
# written (but the tenant row), and store.enqueue runs JOB_ENQUEUE_SCHEDULED_FIRST.
# A clock this creates or finds may be deleted by FAIR_CLOCK_DELETE_IDLE before the jobs
# commit: harmless, they have no vtime yet and FAIR_CLOCK_ENSURE_DUE creates it again (at
# the level's scale then) before their promotion.
# Locks: none held on existing rows. The tenant's clock row is created here (DO NOTHING:
#   no lock on an existing row) so that promotion only ever locks rows that exist.
# Indexes: pgqueue_job_scheduled gains the rows; pgqueue_job_idempotency;
#   pgqueue_fair_clock_uniq.
# Called by: store.enqueue (with a run_at), from services.enqueue / enqueue_many.
JOB_ENQUEUE_SCHEDULED = _job_enqueue_scheduled(False)

# -- name: JOB_ENQUEUE_SCHEDULED_FIRST
# JOB_ENQUEUE_SCHEDULED into a queue new to the tenant, admitted as by JOB_ENQUEUE_FIRST
# (_admit); refused, nothing is written (but the tenant row) and one row says 'refused'.
# Other states as _outcome's ('taken', 'known': back to JOB_ENQUEUE_SCHEDULED).
# Locks: as JOB_ENQUEUE_SCHEDULED.
# Indexes: as JOB_ENQUEUE_SCHEDULED, and pgqueue_fair_clock_tenant (the count).
# Called by: store.enqueue, after JOB_ENQUEUE_SCHEDULED said 'first'.
JOB_ENQUEUE_SCHEDULED_FIRST = _job_enqueue_scheduled(True)

# -- name: TENANT_QUEUE_ADMITTED
# Whether a job of tenant %(tenant)s may become live in queue %(queue)s under
# MAX_QUEUES_PER_TENANT (MAX_QUEUES; NULL: no bound), by _admit's rule: the tenant has a
# clock in the queue, or clocks in fewer queues than the bound. For a retry, which is an
# enqueue of the job again but creates its clock only when it is promoted
# (FAIR_CLOCK_ENSURE_*, which refuses nothing: a job admitted is promoted).
# Locks: nothing.
# Indexes: pgqueue_fair_clock_uniq (queue, tenant), pgqueue_fair_clock_tenant (the count,
#   a queue new to the tenant only).
# Called by: store.queue_admitted, from services.check_queue_bound (the HTTP API's retry).
TENANT_QUEUE_ADMITTED = f"""
SELECT CASE WHEN {MAX_QUEUES} IS NULL
              OR EXISTS (SELECT 1 FROM pgqueue_fair_clock o
                          WHERE o.queue = %(queue)s AND o.tenant = %(tenant)s) THEN TRUE
            ELSE {_FEWER_QUEUES} END
"""

# -- name: JOB_GET_ID_BY_IDEMPOTENCY_KEY
# The id of a tenant's job holding an idempotency key, for an enqueue on a bare connection
# that found the key taken (a periodic tick already enqueued by another worker).
# Locks: nothing.
# Index: pgqueue_job_idempotency (tenant, idempotency_key), one tuple.
# Called by: store.job_id_for_key, from schedules._fire.
JOB_GET_ID_BY_IDEMPOTENCY_KEY = """
SELECT id FROM pgqueue_job WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s
"""

# -- name: FAIR_CLOCK_REFUND
# Gives back the virtual time JOB_ENQUEUE charged for a job that ON CONFLICT did not
# insert (a concurrent duplicate idempotency key).
# Locks: the clock row, which the caller's transaction already holds since JOB_ENQUEUE
#   (so nothing else moved the clock in between).
# Index: pgqueue_fair_clock_uniq.
# Called by: store.refund_clock, from services.enqueue (a duplicate key lost the race).
FAIR_CLOCK_REFUND = f"""
UPDATE pgqueue_fair_clock
   SET vtime = vtime - %(n)s / {tenant_weight("%(tenant)s", "%(queue)s")}
 WHERE queue = %(queue)s AND tenant = %(tenant)s AND priority = %(priority)s
"""

# -- name: FAIR_CLOCK_REFUND_BY_TIME
# FAIR_CLOCK_REFUND after JOB_ENQUEUE_BY_TIME: gives back the task's charge, estimated
# again. A fold of pgqueue_task_stat committed between the two statements (this rare race
# inside a rarer one) makes the refund differ from the charge by the change in the task's
# mean; FAIR_CLOCK_CORRECT does not see the job (there is none), so that difference stays.
# Locks: as FAIR_CLOCK_REFUND.
# Indexes: pgqueue_fair_clock_uniq, pgqueue_task_stat_uniq.
# Called by: store.refund_clock when fairness.by_time(), from services.enqueue.
FAIR_CLOCK_REFUND_BY_TIME = f"""
UPDATE pgqueue_fair_clock
   SET vtime = vtime - %(n)s * {run_time_charge("%(task)s")}
                     / {tenant_weight("%(tenant)s", "%(queue)s")}
 WHERE queue = %(queue)s AND tenant = %(tenant)s AND priority = %(priority)s
"""


def _uncount(rows: str) -> str:
    """CTEs that give back the limit rows the jobs of ``rows`` (a CTE of jobs leaving
    'running', returning their ``limit_ids``) were counted in: ``uncount_lock``, those rows
    with how many of the jobs each counted (``n``), locked in id order, waiting (a
    decrement is never skipped; see claim.sql for the lock order), and ``uncounted``, their
    counters decremented. A batch without a limited job reads nothing."""
    return f"""
uncount_n AS MATERIALIZED (
    SELECT u.lid, count(*) AS n
      FROM {rows} r CROSS JOIN LATERAL unnest(r.limit_ids) AS u(lid)
     WHERE r.limit_ids IS NOT NULL
     GROUP BY u.lid
),
uncount_lock AS MATERIALIZED (
    SELECT l.id, u.n FROM pgqueue_limit l JOIN uncount_n u ON u.lid = l.id
     WHERE l.id = ANY(ARRAY(SELECT lid FROM uncount_n))  -- {LIMIT_BY_ID}
     ORDER BY l.id FOR UPDATE OF l
),
uncounted AS (
    UPDATE pgqueue_limit l SET running = GREATEST(l.running - k.n, 0)
      FROM uncount_lock k
     WHERE l.id = k.id AND l.id = ANY(ARRAY(SELECT id FROM uncount_lock))  -- {LIMIT_BY_ID}
)"""


# Completions, as CTEs that end in ``done`` (the ids recorded); see JOB_COMPLETE_MANY.
def _complete() -> str:
    """The completions' CTEs (see _COMPLETE).

    Each job's attempt and result are read from the input arrays at its id's position
    (``array_position``, in C), not by joining the jobs to the arrays' ``unnest``: a generic
    plan, expecting one job, joins them by a nested loop that compares every job with
    every input (1,600 join-filter rows for 40 completions)."""
    at = "array_position(%(ids)s::bigint[], j.id)"
    return f"""
done AS (
    UPDATE pgqueue_job j
       SET status = 'done', result = (%(results)s::text[])[{at}]::jsonb,
           started_at = GREATEST(j.claimed_at, (%(started)s::timestamptz[])[{at}]),
           finished_at = COALESCE((%(finished)s::timestamptz[])[{at}], {NOW}),
           lease_expires_at = NULL
     WHERE j.id = ANY(%(ids)s::bigint[])  -- {BY_ID}
       AND j.attempts = (%(attempts)s::int[])[{at}]
       AND j.status = 'running' AND j.lease_owner = %(worker)s
       AND j.cancel_requested_at IS NULL  -- a cancel request committed first wins
    RETURNING j.id, j.attempts, j.claimed_at, j.started_at, j.finished_at, j.limit_ids
),
done_history AS (
    INSERT INTO pgqueue_job_attempt
           (job_id, attempt, worker, claimed_at, started_at, finished_at, outcome)
    SELECT id, attempts, %(worker)s, claimed_at, started_at, finished_at, 'done' FROM done
)"""


_COMPLETE = _complete()


# -- name: JOB_COMPLETE_MANY
# Record successes for jobs this worker holds, one attempt row each, all stamped %(now)s.
# Fenced: a job whose lease was lost (reaped, or claimed again by anyone, this worker
# included) does not match and is not returned; nor does one whose cancellation was
# requested (JOB_CANCEL_REQUEST_MANY committed first): the worker then records it
# cancelled (JOB_CANCEL_CONFIRM_MANY).
# Gives back the limit rows the jobs were counted in (_uncount).
# Locks: the matched job rows, then their limit rows in id order (waiting), until the
#   worker's transaction commits, at once.
# Index: pgqueue_job_pkey (PK lookups); the rows leave pgqueue_job_lease;
#   pgqueue_limit_pkey.
# Called by: claim_store.turn, in a worker's turn after LIMIT_LOCK_TURN (which holds the
#   job rows and limit rows already); store.complete_many (the recorder's batches).
JOB_COMPLETE_MANY = f"WITH {_COMPLETE},{_uncount('done')}\nSELECT id FROM done"

# -- name: JOB_FAIL_MANY
# Gives back the jobs' limit rows (_uncount; locked in id order, waiting, after the jobs).
# Record failures for jobs this worker holds. Out of attempts, or a permanent error, means
# dead; otherwise back to scheduled with full-jitter exponential backoff from %(now)s,
# outside the claim index until JOB_PROMOTE_DUE gives it a fresh vtime. Fenced like
# JOB_COMPLETE_MANY (a cancel request committed first wins here too). Writes one attempt
# row per job with the error and traceback. A timeout the worker enforces is recorded
# here too, as a failure whose error says "timed out after N s".
# Locks: the matched job rows, until the worker's transaction commits, at once.
# Index: pgqueue_job_pkey (PK lookups); the rows move from pgqueue_job_lease to
#   pgqueue_job_scheduled.
# Called by: store.fail_many, from the worker runtime (with JOB_COMPLETE_MANY and
#   JOB_CLAIM, in one transaction).
JOB_FAIL_MANY = f"""
WITH input AS (
    SELECT i.*, COALESCE(i.finished, {NOW}) AS ended
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(errors)s::text[],
                  %(tracebacks)s::text[], %(permanent)s::bool[], %(started)s::timestamptz[],
                  %(finished)s::timestamptz[])
        AS i(id, attempt, error, tb, permanent, started, finished)
),
failed AS (
    UPDATE pgqueue_job j
       SET {_retry_or_dead("(i.permanent OR j.attempts >= j.max_attempts)", "i.ended")},
           started_at = GREATEST(j.claimed_at, i.started),
           last_error = i.error,
           lease_expires_at = NULL
      FROM input i
     WHERE j.id = i.id AND j.attempts = i.attempt
       AND j.status = 'running' AND j.lease_owner = %(worker)s
       AND j.cancel_requested_at IS NULL  -- a cancel request committed first wins
    RETURNING j.id, j.attempts, j.claimed_at, j.started_at, i.ended, j.status, j.run_at,
              i.error, i.tb, j.limit_ids
),{_uncount("failed")},
history AS (
    INSERT INTO pgqueue_job_attempt
           (job_id, attempt, worker, claimed_at, started_at, finished_at, outcome, error,
            traceback)
    SELECT id, attempts, %(worker)s, claimed_at, started_at, ended, 'failed', error, tb
      FROM failed
)
SELECT id, status, run_at FROM failed
"""

# -- name: JOB_HEARTBEAT_MANY
# Extend the leases of every job a worker holds to %(now)s + %(lease)s seconds, in one
# statement, and mark the worker seen. Fenced: a job not returned was lost (reaped and
# possibly claimed again) and its handler must not record a result. Each job returned
# says whether its cancellation was requested (JOB_CANCEL_REQUEST_MANY): how the worker
# learns it within a heartbeat when the notification was missed. A job whose handler has
# begun gets its started_at (%(started)s; NULL for one waiting for a thread), so a
# running job shows when it started before its outcome is recorded.
# Locks: the matched job rows and the worker's registry row, until the caller's
#   transaction ends (autocommit: at once).
# Indexes: pgqueue_job_pkey (PK lookups; pgqueue_job_lease is updated), pgqueue_worker_pkey.
# Called by: store.heartbeat_many, from the worker runtime's heartbeat thread every lease/3.
JOB_HEARTBEAT_MANY = f"""
WITH seen AS (UPDATE pgqueue_worker SET last_seen_at = {NOW} WHERE id = %(worker)s)
UPDATE pgqueue_job j
   SET lease_expires_at = {NOW} + %(lease)s * interval '1 second',
       started_at = COALESCE(j.started_at, {_began("i.started")})
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(started)s::timestamptz[])
           AS i(id, attempt, started)
 WHERE j.id = i.id AND j.attempts = i.attempt
   AND j.status = 'running' AND j.lease_owner = %(worker)s
RETURNING j.id, j.cancel_requested_at IS NOT NULL
"""

# -- name: JOB_RELEASE_MANY
# Gives back the jobs' limit rows (_uncount) and gates a job again if a limit applies.
# Give back jobs a stopping worker claimed but never started: queued again with their old
# vtime (they keep their place) and the attempt not counted. Fenced like a completion.
# Notifies their queues so another worker takes them at once.
# Locks: the matched job rows, until the caller's transaction ends (autocommit: at once).
# Index: pgqueue_job_pkey (PK lookups); the rows move from pgqueue_job_lease back to
#   pgqueue_job_claim.
# Called by: store.release_many, from the worker runtime when it stops.
JOB_RELEASE_MANY = f"""
WITH released AS (
    UPDATE pgqueue_job j
       SET status = 'queued', attempts = j.attempts - 1, lease_owner = NULL,
           lease_expires_at = NULL, claimed_at = NULL, started_at = NULL,
           gated = {_gated("j.tenant", "j.queue")}
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS i(id, attempt)
     WHERE j.id = i.id AND j.attempts = i.attempt
       AND j.status = 'running' AND j.lease_owner = %(worker)s
    RETURNING j.id, j.queue, j.limit_ids
),{_uncount("released")}
SELECT id, pg_notify(%(channel)s, queue) IS NULL FROM released
"""

# -- name: JOB_GIVE_BACK_MANY
# Gives back the jobs' limit rows (_uncount) and gates a job again if a limit applies.
# Give back jobs a worker claimed and cannot run (it has no handler for their task): the
# attempt is not counted, as in JOB_RELEASE_MANY, and the job waits %(delay)s seconds in
# 'scheduled' (a fresh fair vtime when promoted, as after a backoff) so that the workers
# without the task do not take it again at once, over and over, while one that has it
# can. With a delay of 0 it is queued again at once with its old vtime, exactly a release.
# Fenced like a completion. Notifies the queues of the jobs queued again.
# Locks: the matched job rows, until the caller's transaction ends (autocommit: at once).
# Index: pgqueue_job_pkey (PK lookups); the rows move from pgqueue_job_lease to
#   pgqueue_job_scheduled (or, with no delay, pgqueue_job_claim).
# Called by: store.give_back_many, from the worker runtime when it claims a job of a task
#   it does not have.
JOB_GIVE_BACK_MANY = f"""
WITH given AS (
    UPDATE pgqueue_job j
       SET status = CASE WHEN %(delay)s::float8 > 0 THEN 'scheduled' ELSE 'queued' END,
           run_at = CASE WHEN %(delay)s::float8 > 0
                         THEN {NOW} + %(delay)s::float8 * interval '1 second'
                         ELSE j.run_at END,
           attempts = j.attempts - 1, lease_owner = NULL, lease_expires_at = NULL,
           claimed_at = NULL, started_at = NULL, gated = {_gated("j.tenant", "j.queue")}
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS i(id, attempt)
     WHERE j.id = i.id AND j.attempts = i.attempt
       AND j.status = 'running' AND j.lease_owner = %(worker)s
    RETURNING j.id, j.queue, j.status, j.limit_ids
),{_uncount("given")}
SELECT id, CASE WHEN status = 'queued' THEN pg_notify(%(channel)s, queue) END IS NULL
  FROM given
"""

# -- name: JOB_REAP_EXPIRED
# Recover jobs whose lease ran out before %(now)s (their worker died or stalled). Whether
# an attempt is spent depends on whether the job's start was recorded: a worker writes
# the start of a running job to its row at its next heartbeat round, within about a
# second of it (JOB_HEARTBEAT_MANY), or with its outcome. So, per job:
# - its start was recorded: the expiry counts as an attempt: back to scheduled with
#   backoff, or dead when none are left, so a job that crashes every worker ends dead;
# - it was not (a job claimed ahead that never started, whose worker a neighbour's
#   handler crashed or stalled, or one that began less than about a second before its
#   worker was lost): the job is given back as JOB_RELEASE_MANY gives one back, queued
#   again at once with its old vtime (its place in line, its tenant's fair clock not
#   charged again), gated again if a limit applies, its queue notified, and the attempt
#   not counted (attempts back to what they were before the claim). Such losses are
#   counted in lost_claims instead; the one that brings it to %(max_lost_claims)s
#   (PGQUEUE["MAX_LOST_CLAIMS"]) makes the job dead, so a handler that ends its process
#   before its start is recorded cannot loop for ever.
# Either way one attempt row, outcome 'lease_expired', numbered as the claim was, with
# the job's started_at: NULL marks a claim given back uncounted, and the attempt that
# follows has the same number.
# Gives back the reaped jobs' limit rows (_uncount): a crashed worker's slots come back.
# Locks: the expired rows, FOR UPDATE SKIP LOCKED (a row a late completion holds is left
#   for the next run), until maintenance's transaction ends; their limit rows, in id order.
# Index: pgqueue_job_lease, in expiry order; for a job given back, pgqueue_limit_scope
#   (_gated).
# Called by: store.reap_expired, from maintenance (one worker at a time).
JOB_REAP_EXPIRED = f"""
WITH expired AS MATERIALIZED (
    SELECT id, lease_owner, attempts, claimed_at, started_at,
           started_at IS NULL AS lost,
           CASE WHEN started_at IS NOT NULL THEN attempts >= max_attempts
                ELSE lost_claims + 1 >= %(max_lost_claims)s::int END AS out
      FROM pgqueue_job
     WHERE status = 'running' AND lease_expires_at < {NOW}
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
reaped AS (
    UPDATE pgqueue_job j
       SET {_retry_or_dead("e.out", back="e.lost")},
           attempts = j.attempts - e.lost::int,
           lost_claims = j.lost_claims + e.lost::int,
           lease_owner = CASE WHEN e.lost THEN NULL ELSE j.lease_owner END,
           claimed_at = CASE WHEN e.lost THEN NULL ELSE j.claimed_at END,
           gated = CASE WHEN e.lost AND NOT e.out THEN {_gated("j.tenant", "j.queue")}
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
),{_uncount("reaped")},
history AS (
    INSERT INTO pgqueue_job_attempt
           (job_id, attempt, worker, claimed_at, started_at, finished_at, outcome, error)
    SELECT r.id, e.attempts, e.lease_owner, e.claimed_at, e.started_at, {NOW},
           'lease_expired', r.last_error
      FROM reaped r JOIN expired e ON e.id = r.id
)
SELECT id, status, CASE WHEN status = 'queued' THEN pg_notify(%(channel)s, queue) END IS NULL
  FROM reaped
"""

# The levels (queue, tenant, priority) that hold a due scheduled job, in sorted order, at
# most %(limit)s: a skip scan of pgqueue_job_scheduled_level (queue, tenant, priority,
# run_at), each step one index probe for the next level after the last, then one probe of
# the same index for the level's earliest run_at. The cost grows with the number of levels
# that hold scheduled jobs, never with the number of jobs. Used by JOB_PROMOTE_DUE and
# FAIR_CLOCK_ENSURE_DUE.
_DUE_LEVELS = f"""
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
                    WHERE j.status = 'scheduled' AND j.run_at <= {NOW}
                      AND (j.queue, j.tenant, j.priority) = (l.queue, l.tenant, l.priority))
     ORDER BY l.queue, l.tenant, l.priority
     LIMIT %(limit)s
)"""

# The levels of the named scheduled jobs (%(ids)s). Used by JOB_PROMOTE_MANY and
# FAIR_CLOCK_ENSURE_MANY.
_NAMED_LEVELS = """
due_levels AS MATERIALIZED (
    SELECT DISTINCT queue, tenant, priority FROM pgqueue_job
     WHERE status = 'scheduled' AND id = ANY(%(ids)s::bigint[])
)"""


# Promotion of the scheduled jobs of ``{levels}`` that ``{due}`` selects; see
# JOB_PROMOTE_DUE. The clocks are locked first, and only the jobs of the clocks locked are
# taken: a clock an open transaction holds delays its own level's jobs, no one else's.
def _promote(by_time: bool) -> str:
    """_PROMOTE charging 1 per job (by jobs) or each job's run-time charge (by time): a
    level's ``rank`` is then the running sum of its jobs' charges, ``n`` their total."""
    task, charge, charged = ("", "", "")
    rank, n = "row_number() OVER (PARTITION BY k.id ORDER BY d.run_at, d.id)", "count(*)"
    if by_time:
        task, charged = ", j.task", ", charge = r.charge"
        charge = f"""
charge AS (
    SELECT t.task, {run_time_charge("t.task")} AS c FROM (SELECT DISTINCT task FROM due) t
),"""
        rank = "sum(e.c) OVER (PARTITION BY k.id ORDER BY d.run_at, d.id)"
        n = "sum(r.charge)"
    return f"""
WITH RECURSIVE {{levels}},
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
            WHERE {{due}}
              AND (j.queue, j.tenant, j.priority) = (k.queue, k.tenant, k.priority)
            ORDER BY run_at, id
            LIMIT %(limit)s) j
     ORDER BY j.run_at, j.id
     LIMIT %(limit)s
),
due AS MATERIALIZED (
    SELECT j.id, j.queue, j.tenant, j.priority, j.run_at{task} FROM pgqueue_job j
     WHERE j.id IN (SELECT id FROM candidate) AND {{due}}
       FOR UPDATE OF j SKIP LOCKED
),{charge}
ranked AS (
    SELECT d.id, k.id AS clock_id,{" e.c AS charge," if by_time else ""}
           {rank} AS rank
      FROM due d
      JOIN clock k ON (k.queue, k.tenant, k.priority) = (d.queue, d.tenant, d.priority){
        chr(10) + "      JOIN charge e ON e.task = d.task" if by_time else ""
    }
),
step AS (
    SELECT k.id, {n} AS n,
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
       SET status = 'queued', vtime = {job_vtime("b.start", "r.rank", "b.w")}{charged},
           gated = {_gated("j.tenant", "j.queue")}
      FROM ranked r JOIN bump b ON b.id = r.clock_id
     WHERE j.id = r.id
    RETURNING j.id, j.queue
)
SELECT id, pg_notify(%(channel)s, queue) IS NULL FROM promoted ORDER BY id
"""


_PROMOTE = _promote(False)

_DUE_NOW = f"j.status = 'scheduled' AND j.run_at <= {NOW}"
_DUE_NAMED = "j.status = 'scheduled' AND j.id = ANY(%(ids)s::bigint[])"

# -- name: JOB_PROMOTE_DUE
# A promoted job of a tenant a limit applies to is gated (_gated).
# Make scheduled jobs due by %(now)s runnable, assigning fresh fair vtimes (a job back
# from a backoff does not jump the line), at most %(limit)s of them, the oldest first among
# the levels promoted. Notifies each queue.
# Shaped clocks first: the levels with due jobs (_DUE_LEVELS), their clock rows locked
# SKIP LOCKED, and then the oldest due jobs of the clocks it got. A clock held by an open
# enqueue transaction delays only its own level until the next run; taking the oldest due
# jobs first and then skipping those of locked clocks (as this statement once did) let a
# batch's worth of one tenant's due jobs behind a held clock stall every tenant's.
# Locks: the fair-clock rows of up to %(limit)s levels with due jobs, in sorted (queue,
#   tenant, priority) order with SKIP LOCKED, then the due jobs (SKIP LOCKED). Neither
#   waits, so two promoters never deadlock, with each other or with an enqueue. Held
#   until maintenance's transaction ends. The clocks are locked FOR NO KEY UPDATE, as an
#   enqueue's UPDATE locks its own: that does not conflict with the KEY SHARE a first
#   enqueue at a level takes on the level's keeper (JOB_ENQUEUE_FIRST). A level whose
#   clock row is missing is not promoted: FAIR_CLOCK_ENSURE_DUE, run just before, creates
#   it (FAIR_CLOCK_DELETE_IDLE may have deleted it).
# Indexes: pgqueue_job_scheduled_level (the levels' skip scan and each level's due jobs
#   in run_at order), pgqueue_fair_clock_uniq, pgqueue_job_pkey, and one tuple of
#   pgqueue_job_claim / pgqueue_fair_clock_level for each level's head.
# Called by: store.promote_due, from maintenance (one worker at a time).
JOB_PROMOTE_DUE = _PROMOTE.format(levels=_DUE_LEVELS, due=_DUE_NOW)

# -- name: JOB_PROMOTE_MANY
# JOB_PROMOTE_DUE for named scheduled jobs, whatever their run_at (retry, "run now").
# Locks: as JOB_PROMOTE_DUE, until the operator action's transaction ends.
# Indexes: pgqueue_job_pkey (the named rows), then as JOB_PROMOTE_DUE.
# Called by: store.promote_ids, from services.retry_jobs / run_jobs_now, after
#   JOB_RETRY_MANY / JOB_MAKE_DUE_MANY and FAIR_CLOCK_ENSURE_MANY in the same transaction.
JOB_PROMOTE_MANY = _PROMOTE.format(levels=_NAMED_LEVELS, due=_DUE_NAMED)

# -- name: JOB_PROMOTE_DUE_BY_TIME
# JOB_PROMOTE_DUE with FAIRNESS = "time": each job is charged its task's run-time estimate
# (one estimate per distinct task of the batch) instead of 1, and keeps the charge for
# FAIR_CLOCK_CORRECT; a level's jobs get the running sum of their charges.
# Locks: as JOB_PROMOTE_DUE.
# Indexes: as JOB_PROMOTE_DUE, and pgqueue_task_stat_uniq (each task's rows).
# Called by: store.promote_due when fairness.by_time(), from maintenance.
JOB_PROMOTE_DUE_BY_TIME = _promote(True).format(levels=_DUE_LEVELS, due=_DUE_NOW)

# -- name: JOB_PROMOTE_MANY_BY_TIME
# JOB_PROMOTE_MANY with FAIRNESS = "time" (the charges of JOB_PROMOTE_DUE_BY_TIME).
# Locks: as JOB_PROMOTE_MANY.
# Indexes: as JOB_PROMOTE_MANY, and pgqueue_task_stat_uniq.
# Called by: store.promote_ids when fairness.by_time(), from services.retry_jobs /
#   run_jobs_now.
JOB_PROMOTE_MANY_BY_TIME = _promote(True).format(levels=_NAMED_LEVELS, due=_DUE_NAMED)

# Creates the missing clock rows of ``{levels}``, holding the keeper (LEVEL_LARGEST) of
# each of their levels FOR KEY SHARE first; see FAIR_CLOCK_ENSURE_DUE.
_CLOCK_ENSURE = """
WITH RECURSIVE {levels},
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
                   ORDER BY c.vtime DESC, c.id LIMIT 1) x))  -- the keeper (LEVEL_LARGEST)
     ORDER BY k.id
       FOR KEY SHARE OF k
)
INSERT INTO pgqueue_fair_clock (queue, tenant, priority, vtime)
SELECT m.queue, m.tenant, m.priority, 0.0 FROM missing m
 WHERE (SELECT count(*) FROM held) >= 0  -- the levels' keepers held first
 ORDER BY m.queue, m.tenant, m.priority
ON CONFLICT (queue, tenant, priority) DO NOTHING
"""

# -- name: FAIR_CLOCK_ENSURE_DUE
# Create the clock row of each level with due jobs that has none (JOB_ENQUEUE_SCHEDULED
# creates it, but a clock may have been deleted since), so that JOB_PROMOTE_DUE, which
# promotes only the jobs of clocks it can lock, does not leave those jobs scheduled for
# ever. A separate statement because a row inserted by one part of a statement is not
# visible to the others: the promotion that follows must see it to lock it. The new
# clock's vtime is 0: the promotion raises it to its level's head. The level's keeper (its
# largest clock) is held FOR KEY SHARE first, as JOB_ENQUEUE_FIRST does: the promotion's
# head is then read from a level FAIR_CLOCK_DELETE_IDLE cannot start again from 0
# meanwhile (it would need the keeper FOR UPDATE), or, when the prune holds it, from a
# snapshot taken once the prune has committed (this waits for it, and the promotion is
# the next statement).
# Locks: the new clock rows, and the keeper of each of their levels FOR KEY SHARE (in id
#   order), until maintenance's transaction ends. DO NOTHING takes no lock on an
#   existing row; it waits only for an uncommitted insert of the same clock (an enqueue
#   creating it), until that transaction ends. KEY SHARE waits only for a prune holding
#   the clock FOR UPDATE (never for an enqueue, a promotion or a correction).
# Indexes: pgqueue_job_scheduled_level (as JOB_PROMOTE_DUE), pgqueue_fair_clock_uniq,
#   pgqueue_fair_clock_level (each level's keeper).
# Called by: store.promote_due, just before JOB_PROMOTE_DUE in maintenance's transaction.
FAIR_CLOCK_ENSURE_DUE = _CLOCK_ENSURE.format(levels=_DUE_LEVELS)

# -- name: FAIR_CLOCK_ENSURE_MANY
# FAIR_CLOCK_ENSURE_DUE for the levels of named scheduled jobs.
# Locks: as FAIR_CLOCK_ENSURE_DUE, until the operator action's transaction ends.
# Indexes: pgqueue_job_pkey (the named rows), pgqueue_fair_clock_uniq.
# Called by: store.promote_ids, just before JOB_PROMOTE_MANY.
FAIR_CLOCK_ENSURE_MANY = _CLOCK_ENSURE.format(levels=_NAMED_LEVELS)

# -- name: JOB_CANCEL_MANY
# Cancel scheduled or queued jobs. A job being claimed at this instant is locked by the
# claim; the UPDATE waits for it, re-checks the status and skips it (it is running now).
# Locks: the matched rows, until the operator action's transaction ends.
# Index: pgqueue_job_pkey (PK lookups); the rows leave pgqueue_job_claim /
#   pgqueue_job_scheduled.
# Called by: store.cancel_many, from services.cancel_jobs (admin, HTTP API, Python API).
JOB_CANCEL_MANY = """
UPDATE pgqueue_job
   SET status = 'cancelled', finished_at = now()
 WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('scheduled', 'queued')
RETURNING id
"""

# -- Cancelling a running job, and timeouts ---------------------------------------------------
# A running job is not cancelled by the operator's statement: it is asked to stop
# (cancel_requested_at), and the worker holding it records the end of the attempt, fenced
# like any outcome. Completions and failures are fenced on cancel_requested_at IS NULL,
# so a request and a completion race on the job's row lock: whichever commits first wins.

# -- name: JOB_CANCEL_REQUEST_MANY
# Ask running jobs to stop: stamp cancel_requested_at (the first request's time is kept,
# so a second request changes nothing) and notify each holding worker on the wake-up
# channel with the payload 'cancel:<worker id>' (a queue name cannot hold ':'), so that it
# learns it at once rather than at its next heartbeat. PostgreSQL folds identical
# notifications of one transaction into one. A job that completed first is no longer
# running and is not matched (the caller reports its status).
# Locks: the matched rows, until the operator action's transaction ends; a row being
#   completed is waited for and re-checked (READ COMMITTED), never both.
# Index: pgqueue_job_pkey (PK lookups).
# Called by: store.request_cancel_many (pgqueue.stop_store), from services.cancel_jobs
#   (admin, HTTP API, Python API, CLI), after JOB_CANCEL_MANY in the same transaction.
JOB_CANCEL_REQUEST_MANY = """
WITH asked AS (
    UPDATE pgqueue_job
       SET cancel_requested_at = COALESCE(cancel_requested_at, now())
     WHERE id = ANY(%(ids)s::bigint[]) AND status = 'running'
    RETURNING id, lease_owner
)
SELECT id, pg_notify(%(channel)s, 'cancel:' || lease_owner) IS NULL FROM asked
"""

# -- name: JOB_CANCEL_CONFIRM_MANY
# The worker holding jobs whose cancellation was requested ends their attempt: status
# 'cancelled', one attempt row each with outcome 'cancelled', all stamped %(now)s (and the
# handler's start, %(started)s, when it had begun). Fenced
# like a completion (owner, attempt, running) and on the request itself: a job not
# returned had been recorded (its completion committed before the request) or lost.
# Whatever the handler returns afterwards is discarded (its completion no longer matches).
# Gives back the jobs' limit rows (_uncount), as every exit from running does.
# Locks: the matched job rows, until the worker's transaction commits, at once.
# Index: pgqueue_job_pkey (PK lookups); the rows leave pgqueue_job_lease.
# Called by: stop_store.confirm_cancel_many, from the worker (worker/stops.py) when a
#   heartbeat or a notification tells it, and for outcomes the cancel fence refused.
JOB_CANCEL_CONFIRM_MANY = f"""
WITH stopped AS (
    UPDATE pgqueue_job j
       SET status = 'cancelled', finished_at = {NOW}, lease_expires_at = NULL,
           started_at = COALESCE({_began("i.started")}, j.started_at)
      FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(started)s::timestamptz[])
           AS i(id, attempt, started)
     WHERE j.id = i.id AND j.attempts = i.attempt
       AND j.status = 'running' AND j.lease_owner = %(worker)s
       AND j.cancel_requested_at IS NOT NULL
    RETURNING j.id, j.attempts, j.claimed_at, j.started_at, j.limit_ids
),{_uncount("stopped")},
history AS (
    INSERT INTO pgqueue_job_attempt
           (job_id, attempt, worker, claimed_at, started_at, finished_at, outcome, error)
    SELECT id, attempts, %(worker)s, claimed_at, started_at, {NOW}, 'cancelled',
           'cancelled on request'
      FROM stopped
)
SELECT id FROM stopped
"""

# -- name: JOB_REAP_CANCELLED
# Maintenance ends the running jobs asked to stop whose lease ran out before %(now)s (the
# worker died, or was of a release that does not know cancel requests): 'cancelled', one
# attempt row each with outcome 'cancelled'. Runs before JOB_REAP_EXPIRED, which would
# otherwise schedule them for another attempt.
# Gives back the jobs' limit rows (_uncount), as every exit from running does.
# Locks: the rows, FOR UPDATE SKIP LOCKED (a row a late outcome holds is left for the next
#   run), until maintenance's transaction ends.
# Index: pgqueue_job_lease (running jobs by lease expiry; as many rows as run at once).
# Called by: stop_store.reap_cancelled, from maintenance (one worker at a time).
JOB_REAP_CANCELLED = f"""
WITH expired AS MATERIALIZED (
    SELECT id, lease_owner FROM pgqueue_job
     WHERE status = 'running' AND lease_expires_at < {NOW}
       AND cancel_requested_at IS NOT NULL
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
stopped AS (
    UPDATE pgqueue_job j
       SET status = 'cancelled', finished_at = {NOW}, lease_expires_at = NULL
      FROM expired e
     WHERE j.id = e.id
    RETURNING j.id, j.attempts, j.claimed_at, j.started_at, e.lease_owner, j.limit_ids
),{_uncount("stopped")},
history AS (
    INSERT INTO pgqueue_job_attempt
           (job_id, attempt, worker, claimed_at, started_at, finished_at, outcome, error)
    SELECT id, attempts, lease_owner, claimed_at, started_at, {NOW}, 'cancelled',
           'cancelled on request (the lease ran out before the worker recorded it)'
      FROM stopped
)
SELECT id FROM stopped
"""

# -- name: JOB_REAP_TIMED_OUT
# The backstop of timeouts: a running job still held %(grace)s seconds past its deadline
# (started_at + timeout_seconds: from its handler's start, which the worker's heartbeat
# writes; a job whose start is not known has no deadline here) was not recorded by its
# worker (one of a release that does not enforce timeouts, or stuck while its heartbeats
# go on). It
# fails as the worker would have failed it: "timed out after N s", scheduled again with
# backoff or dead when out of attempts, one 'failed' attempt row. The worker's late
# outcome is fenced out (the job is no longer running). Jobs asked to stop are left to the
# cancel path.
# Gives back the jobs' limit rows (_uncount), as every exit from running does.
# Locks: the rows, FOR UPDATE SKIP LOCKED, until maintenance's transaction ends.
# Index: pgqueue_job_lease (a scan of the running jobs only: as many as run at once).
# Called by: stop_store.reap_timed_out, from maintenance (one worker at a time).
JOB_REAP_TIMED_OUT = f"""
WITH late AS MATERIALIZED (
    SELECT id, lease_owner,
           'timed out after ' || trim_scale(timeout_seconds::numeric) || ' s' AS error
      FROM pgqueue_job
     WHERE status = 'running' AND timeout_seconds IS NOT NULL
       AND cancel_requested_at IS NULL
       AND started_at IS NOT NULL
       AND started_at + (timeout_seconds + %(grace)s) * interval '1 second' < {NOW}
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
),
failed AS (
    UPDATE pgqueue_job j
       SET {_retry_or_dead("j.attempts >= j.max_attempts")},
           last_error = l.error, lease_expires_at = NULL
      FROM late l
     WHERE j.id = l.id
    RETURNING j.id, j.attempts, j.claimed_at, j.started_at, j.status, l.error,
              l.lease_owner, j.limit_ids
),{_uncount("failed")},
history AS (
    INSERT INTO pgqueue_job_attempt
           (job_id, attempt, worker, claimed_at, started_at, finished_at, outcome, error)
    SELECT id, attempts, lease_owner, claimed_at, started_at, {NOW}, 'failed', error
      FROM failed
)
SELECT id, status FROM failed
"""

# -- name: JOB_RETRY_MANY
# Send dead or cancelled jobs back: attempts, and leases lost before a start was recorded
# (lost_claims, see JOB_REAP_EXPIRED), start again from 0 (history is kept), a cancel
# request is forgotten, and the job waits in scheduled until its run_at; the caller
# then runs JOB_PROMOTE_MANY in the same transaction for those already due (the ``due``
# column), which gives them a fresh fair vtime.
# Locks: the matched rows, until the operator action's transaction ends.
# Index: pgqueue_job_pkey (PK lookups); the rows join pgqueue_job_scheduled.
# Called by: store.retry_many, from services.retry_jobs (admin, HTTP API, Python API).
JOB_RETRY_MANY = """
UPDATE pgqueue_job
   SET status = 'scheduled', attempts = 0, lost_claims = 0, vtime = NULL, result = NULL,
       run_at = GREATEST(run_at, now()), lease_owner = NULL, lease_expires_at = NULL,
       claimed_at = NULL, started_at = NULL, finished_at = NULL, cancel_requested_at = NULL
 WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('dead', 'cancelled')
RETURNING id, run_at <= now() AS due
"""

# -- name: JOB_MAKE_DUE_MANY
# Make scheduled jobs due now ("run now"); the caller runs JOB_PROMOTE_MANY next.
# Locks: the matched rows, until the operator action's transaction ends.
# Index: pgqueue_job_pkey (PK lookups).
# Called by: store.run_now_many, from services.run_jobs_now (the admin's action).
JOB_MAKE_DUE_MANY = """
UPDATE pgqueue_job SET run_at = now()
 WHERE id = ANY(%(ids)s::bigint[]) AND status = 'scheduled'
RETURNING id
"""

# -- name: JOB_GET_STATUS_MANY
# Current status of jobs, to explain why an operation skipped them.
# Locks: none (a plain read).
# Index: pgqueue_job_pkey (PK lookups).
# Called by: store.statuses, from the services' operator actions (cancel, retry, run now).
JOB_GET_STATUS_MANY = """
SELECT id, status FROM pgqueue_job WHERE id = ANY(%(ids)s::bigint[])
"""

# -- name: TENANT_WEIGHT_SET
# Create or update a tenant's weight in every queue. Takes effect for jobs that become
# runnable afterwards.
# Locks: the tenant row, until the caller's transaction ends.
# Index: pgqueue_tenant_pkey.
# Called by: store.set_weight (no queue), from services.set_tenant_weight (admin, HTTP API).
TENANT_WEIGHT_SET = """
INSERT INTO pgqueue_tenant (name, weight) VALUES (%(tenant)s, %(weight)s)
ON CONFLICT (name) DO UPDATE SET weight = EXCLUDED.weight
"""

# -- name: QUEUE_WEIGHT_SET
# Override a tenant's weight in one queue (creating the tenant if new). Takes effect for
# jobs that become runnable afterwards.
# Locks: the (tenant, queue) override row, until the caller's transaction ends; none on
#   the tenant row (_TENANT_ENSURE).
# Indexes: pgqueue_queue_weight_uniq, pgqueue_tenant_pkey.
# Called by: store.set_weight with a queue, from services.set_tenant_weight.
QUEUE_WEIGHT_SET = f"""
WITH tenant_row AS ({_TENANT_ENSURE})
INSERT INTO pgqueue_queue_weight (queue, tenant, weight)
VALUES (%(queue)s, %(tenant)s, %(weight)s)
ON CONFLICT (tenant, queue) DO UPDATE SET weight = EXCLUDED.weight
"""

# -- name: MAINTENANCE_TRY_LOCK
# One worker at a time runs maintenance. Never waits: a worker that does not get the lock
# skips this round.
# Locks: a transaction-scoped advisory lock, released by the transaction's end (so a worker
#   that dies mid-run frees it at once).
# Index: none (no table is read).
# Called by: store.try_maintenance_lock, at the start of maintenance's transaction.
MAINTENANCE_TRY_LOCK = """
SELECT pg_try_advisory_xact_lock(%(key)s)
"""

# -- name: WORKER_REGISTER
# A worker process records itself at start (or again, after a restart with the same id or
# a reconnect): its queues and the tasks it can run (a JSON list, or NULL when it serves
# more than store.WORKER_TASKS_MAX), which the admin reads to flag jobs nobody can run.
# Locks: the worker's row (PK upsert), until autocommit ends the statement.
# Index: pgqueue_worker_pkey.
# Called by: store.register_worker, from the worker runtime at start.
WORKER_REGISTER = """
INSERT INTO pgqueue_worker (id, host, pid, queues, tasks, concurrency)
VALUES (%(worker)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(tasks)s::jsonb, %(concurrency)s)
ON CONFLICT (id) DO UPDATE
   SET last_seen_at = now(), stopped_at = NULL, queues = EXCLUDED.queues,
       tasks = EXCLUDED.tasks, concurrency = EXCLUDED.concurrency
"""

# -- name: DATABASE_CLOCK_READ
# The database server's clock now (clock_timestamp(): not the transaction's start). A worker
# reads it, timing the round trip on its monotonic clock, to give the handler times it
# carries in the database's clock (pgqueue.worker.clock).
# Locks: nothing. Index: none (no table).
# Called by: store.database_clock, from the worker runtime when it connects and at each
#   heartbeat round.
DATABASE_CLOCK_READ = "SELECT clock_timestamp()"

# -- name: WORKER_STOP
# A worker marks itself stopped on a clean exit; a killed one just stops being seen.
# Locks: the worker's row, until autocommit ends the statement.
# Index: pgqueue_worker_pkey.
# Called by: store.stop_worker, from the worker runtime as it exits.
WORKER_STOP = """
UPDATE pgqueue_worker SET stopped_at = now(), last_seen_at = now() WHERE id = %(worker)s
"""

# -- name: WORKER_PRUNE
# Forget workers not seen for a day (the registry is for the living).
# Locks: the deleted rows, until maintenance's transaction ends.
# Index: none: a sequential scan of pgqueue_worker, which holds one row per worker
#   process seen in the last day.
# Called by: store.prune_workers, from maintenance (one worker at a time).
WORKER_PRUNE = """
DELETE FROM pgqueue_worker WHERE last_seen_at < now() - interval '1 day'
"""

# -- name: TASK_STAT_HEAD
# The largest attempt id committed so far: the bound the next fold may reach once every
# transaction that could still hold a smaller id has ended (see TASK_STAT_FOLD); and it
# draws this transaction's xid, after the snapshot the id was read in. Sound only as the
# transaction's first xid-drawing statement (maintenance runs it first after its lock);
# drawing the xid here, not in the fold, lets the fold's snapshot see it, so that a quiet
# server's attempts are folded in the same pass.
# Locks: none (the xid is one per maintenance pass).
# Index: pgqueue_job_attempt_pkey (a backward index-only probe).
# Called by: store.attempt_head, from maintenance (first statement after its lock).
TASK_STAT_HEAD = "SELECT COALESCE(max(id), 0), pg_current_xact_id() FROM pgqueue_job_attempt"

# -- name: TASK_STAT_FOLD
# Fold attempt rows into pgqueue_task_stat, oldest first, at most %(limit)s per run, past
# the mark (pgqueue_stat_mark.last_attempt_id) and never past a row whose transaction may
# still be open. Attempt ids are drawn before their transactions commit, so a row with a
# smaller id can become visible after a larger one: a watermark over ids is only sound up
# to a bound below which every inserting transaction has ended. That bound is a pair
# (head, xid): head, an id read (TASK_STAT_HEAD) before this transaction drew xid. Every
# statement that inserts attempts writes pgqueue_job first (so it holds its xid before it
# draws an id), hence a transaction holding an id <= head has an xid < xid; once the
# oldest running xid of the server (pg_snapshot_xmin of the current snapshot) is >= xid,
# each of them has committed or rolled back, and the rows up to head are final. The pair
# of this run is folded at once when nothing older is running (a quiet server), otherwise
# it is kept as pending_* and folded by a later run (a second later nothing of a worker's
# is still open); a pending pair is replaced only once folded, so a steady stream of short
# transactions never starves it. A long transaction holding an xid (anywhere on the
# server) delays the fold until it ends; it never makes the fold skip a row.
# Assumes the attempt id sequence hands ids out one at a time (CACHE 1, the default).
# Locks: the mark row (FOR UPDATE) and the upserted stat rows, until maintenance's
#   transaction ends.
# Indexes: pgqueue_job_attempt_pkey (mark < id <= bound), pgqueue_job_pkey (the task of
#   each), pgqueue_task_stat_uniq (the upsert), pgqueue_stat_mark_pkey.
# Called by: store.fold_task_stats, from maintenance (one worker at a time).
TASK_STAT_FOLD = """
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
RETURNING (SELECT count(*) FROM fresh)
"""

# -- name: FAIR_CLOCK_CORRECT
# With FAIRNESS = "time": move each tenant's clock by the error of the run-time charges of
# its settled attempts, sum((actual - charge) / weight) (actual: the handler's run time; an
# attempt whose handler was never seen to start is passed over), so that its later jobs pay for
# what its earlier ones cost beyond (or below) their estimate. Attempts are read like
# TASK_STAT_FOLD's (settled, id order, at most %(limit)s) from a mark of their own
# (pgqueue_stat_mark row 2); jobs without a charge (made runnable by jobs) are passed over.
# A credit moves a clock back at most to its level's head (and never a clock already
# below it): an idle tenant banks nothing, as at a charge.
# Locks: the mark row (FOR UPDATE) and the clock rows of the attempts read (FOR NO KEY
#   UPDATE, as JOB_PROMOTE_DUE's), in sorted order with SKIP LOCKED, until maintenance's
#   transaction ends. A clock held by an open enqueue is not waited for: the mark stops
#   before the first attempt of a held clock, and that attempt and those after it are read
#   again by the next run, so none is counted twice or lost (a held clock delays
#   corrections only, never a job).
# Indexes: pgqueue_job_attempt_pkey (id > mark), pgqueue_job_pkey (each attempt's job),
#   pgqueue_fair_clock_uniq, one tuple of pgqueue_job_claim / pgqueue_fair_clock_level for
#   each level's head, pgqueue_stat_mark_pkey.
# Called by: store.correct_fair_clocks, from maintenance (one worker at a time) when
#   fairness.by_time().
FAIR_CLOCK_CORRECT = f"""
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
       AND a.finished_at <= now() - %(settle)s * interval '1 second'
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
      FROM (SELECT k.id, sum(a.error) / {tenant_weight("k.tenant", "k.queue")} AS d,
                   {level_head("k.queue", "k.priority")} AS h
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
"""

# -- Idle fair clocks ------------------------------------------------------------------------
# A tenant's clock at a level (queue, priority) is a row of pgqueue_fair_clock for as long as
# nothing deletes it, whatever the tenant does later: without a prune, a tenant that names a
# queue per request leaves a row per name for ever. The prune deletes the rows whose absence
# changes no vtime that will ever be assigned. What reads a clock (pgqueue.fairness): a
# tenant's next start at a level is max(own clock, head), the head being the level's lowest
# queued ungated vtime, else the lowest gated one of the limited tenants, else the level's
# largest clock, else 0; FAIR_CLOCK_CORRECT (FAIRNESS = "time") moves a tenant's clock by its
# settled attempts' errors; FAIR_CLOCK_REFUND and JOB_PROMOTE_* lock and move clocks that
# exist (FAIR_CLOCK_ENSURE_* and JOB_ENQUEUE_SCHEDULED create them first, at 0: a promotion
# raises a clock to the head anyway). A tenant is *live* at a level while it has a job there
# that is queued (gated or not), scheduled or running, or, by time, an attempt there that
# FAIR_CLOCK_CORRECT has not passed yet (past pgqueue_stat_mark row 2). Two rules:
# (a) A level with nothing live (no tenant live there) loses every clock: every tenant then
#     starts at 0 + its charge, where it would have started at the largest clock + its charge
#     (the head, which no tenant's clock exceeds). Only differences of vtimes order jobs, and
#     the level holds no job with a vtime to compare them with: the same order.
# (b) In any level, a clock of a tenant not live there whose vtime is at or below the
#     level's *floor* goes, but for the level's *keeper* (its largest clock, the oldest of
#     equals: LEVEL_LARGEST). The floor is the least of the vtimes of the level's queued
#     (ungated or gated) and running jobs and of its largest clock. Every head from now on
#     is at least the floor: it is one of those vtimes (a running job given back is queued
#     again with its vtime), or a vtime assigned later (above the head of then), or the
#     largest clock (the keeper stays; a clock never moves below the head of its time, a
#     refund only gives back what its own transaction charged). So the tenant's next start,
#     max(clock, head), is the head with or without its clock. With nothing queued the
#     largest clock is the head, kept by the keeper (so clocks tied with it may go). A
#     tenant not live has nothing for FAIR_CLOCK_CORRECT to move, and its scheduled jobs,
#     if any appeared, would take their vtime from the head at promotion.
# What is checked, and how: a tenant's scheduled and gated jobs at the level, one probe each
# (pgqueue_job_scheduled_level, pgqueue_job_gated); its running jobs, read with every
# running job (pgqueue_job_lease: a few per worker thread); its attempts the correction has
# not passed (by time: those past the mark, at most PENDING_CORRECTIONS_READ of them, else
# nothing is deleted). Its queued ungated jobs have no index by tenant, so rule (b) needs
# either a level with none queued, or fair ordering by jobs (%(by_vtime)s) and a clock
# strictly below the floor: a tenant's clock is then at least the vtime of each of its
# queued and running jobs (each was assigned at most the clock it left), so such a clock
# has none. With FIFO (vtimes are timestamps) or by time (a credit may take a clock below
# its own backlog) rule (b) waits for a level with nothing queued. Rule (a) needs every row
# of the level locked at once (so at most %(limit)s of them); a larger level first loses
# its rows by rule (b), a limit's worth a pass, down to its keeper.
# Concurrency. FAIR_CLOCK_LOCK_IDLE chooses in its snapshot and locks the chosen rows FOR
# UPDATE SKIP LOCKED; FAIR_CLOCK_DELETE_IDLE, the next statement of the same transaction,
# decides again with a new snapshot (READ COMMITTED), which shows every job committed
# before the locks were granted, and deletes. A row an enqueue of its tenant has charged is
# held by it (its UPDATE or upsert) until that enqueue commits or rolls back, so it is
# skipped: never deleted under an uncommitted job; a job committed before the lock is seen
# by the second snapshot. An enqueue that reaches a row once it is locked waits, finds it
# deleted, and store.enqueue goes on with JOB_ENQUEUE_FIRST, which takes the head afresh.
# Rule (a) deletes a level only when every row its second snapshot shows is among the rows
# locked, so a level where an enqueue or a promotion holds a clock is left whole; a first
# enqueue at a level (JOB_ENQUEUE_FIRST) and FAIR_CLOCK_ENSURE_* hold the level's keeper FOR
# KEY SHARE before writing a vtime of the level's scale (which rule (a) would start again
# from 0), so the keeper is skipped here, or they wait and see it deleted (and run again).
# What is left: an enqueue whose statement read an older head (its snapshot predates
# claims that moved the head on) and commits after the prune puts jobs below the floor this
# prune saw; a tenant pruned then starts at that older head on its next job, as the
# enqueue's own jobs did, rather than at its clock. A mode changed meanwhile (ORDERING,
# FAIRNESS) is outside all this: it applies to jobs that become runnable afterwards.


#: The order in which a level's clocks give its *keeper* first: the largest, the oldest
#: (lowest id) of equals. The prune deletes a level's keeper only with the whole level
#: (rule a), and a first enqueue at a level (JOB_ENQUEUE_FIRST, FAIR_CLOCK_ENSURE_*) holds
#: that one FOR KEY SHARE. ``{c}``: the clock rows' alias.
LEVEL_LARGEST = "{c}.vtime DESC, {c}.id"

#: With FAIRNESS = "time", the most attempts past FAIR_CLOCK_CORRECT's mark the prune reads
#: to know which tenants a correction will still move (about ten passes of the correction);
#: with more pending it deletes nothing until the correction has caught up.
PENDING_CORRECTIONS_READ = 100_000


def _idle_facts(levels: str, by_time: bool) -> str:
    """The prune's CTEs for the levels of ``levels`` (a CTE of (queue, priority)):
    - ``running``: every running job's (queue, tenant, priority) and least vtime;
    - ``pending`` and ``unknown`` (by time only; empty and FALSE by jobs): the (queue,
      tenant, priority) of the charged jobs with an attempt past FAIR_CLOCK_CORRECT's mark,
      and whether more were pending than PENDING_CORRECTIONS_READ (then none is deleted);
    - ``facts``: per level, its lowest queued ungated vtime (``qmin``), its ``floor`` (rule
      b) and whether it is ``quiet``: nothing queued, running or pending there (rule a,
      with no scheduled or gated job of a tenant with a clock there, checked by row).
    """
    if by_time:
        pending = f"""
recent AS MATERIALIZED (
    SELECT a.job_id FROM pgqueue_job_attempt a
     WHERE a.id > COALESCE((SELECT last_attempt_id FROM pgqueue_stat_mark WHERE id = 2), 0)
     ORDER BY a.id
     LIMIT {PENDING_CORRECTIONS_READ + 1}
),
pending AS MATERIALIZED (
    SELECT DISTINCT j.queue, j.tenant, j.priority
      FROM recent a JOIN pgqueue_job j ON j.id = a.job_id
     WHERE j.charge IS NOT NULL
),
unknown AS MATERIALIZED (SELECT count(*) > {PENDING_CORRECTIONS_READ} AS yes FROM recent),"""
    else:
        pending = """
pending AS MATERIALIZED (
    SELECT NULL::varchar AS queue, NULL::varchar AS tenant, NULL::smallint AS priority
     WHERE FALSE
),
unknown AS MATERIALIZED (SELECT FALSE AS yes),"""
    return f"""
running AS MATERIALIZED (
    SELECT queue, tenant, priority, min(vtime) AS vtime FROM pgqueue_job
     WHERE status = 'running'
     GROUP BY queue, tenant, priority
),{pending}
facts AS MATERIALIZED (
    SELECT l.queue, l.priority, x.qmin, k.id AS keeper,
           LEAST(x.qmin, x.gmin, r.vtime, k.vtime) AS floor,
           x.qmin IS NULL AND x.gmin IS NULL AND r.queue IS NULL
           AND NOT EXISTS (SELECT 1 FROM pending p
                            WHERE p.queue = l.queue AND p.priority = l.priority)
           AND NOT (SELECT yes FROM unknown) AS quiet
      FROM {levels} l
      LEFT JOIN (SELECT queue, priority, min(vtime) AS vtime FROM running
                  GROUP BY queue, priority) r
        ON r.queue = l.queue AND r.priority = l.priority
     CROSS JOIN LATERAL (
           SELECT {queued_head("l.queue", "l.priority")} AS qmin,
                  {gated_head("l.queue", "l.priority")} AS gmin) x
     CROSS JOIN LATERAL (
           SELECT m.id, m.vtime FROM pgqueue_fair_clock m
            WHERE m.queue = l.queue AND m.priority = l.priority
            ORDER BY {LEVEL_LARGEST.format(c="m")} LIMIT 1) k
),"""


def _not_live(c: str) -> str:
    """SQL: the tenant of clock row ``c`` is not live at its level, but for queued ungated
    jobs (see above): no scheduled or gated job there (one probe each), none running, no
    correction pending."""
    return f"""NOT EXISTS (SELECT 1 FROM pgqueue_job s
                    WHERE s.queue = {c}.queue AND s.tenant = {c}.tenant
                      AND s.priority = {c}.priority AND s.status = 'scheduled')
           AND NOT EXISTS (SELECT 1 FROM pgqueue_job g
                    WHERE g.queue = {c}.queue AND g.tenant = {c}.tenant
                      AND g.priority = {c}.priority AND g.status = 'queued' AND g.gated)
           AND NOT EXISTS (SELECT 1 FROM running r
                    WHERE (r.queue, r.tenant, r.priority) = ({c}.queue, {c}.tenant, {c}.priority))
           AND NOT EXISTS (SELECT 1 FROM pending p
                    WHERE (p.queue, p.tenant, p.priority) = ({c}.queue, {c}.tenant, {c}.priority))
           AND NOT (SELECT yes FROM unknown)"""


def _below_floor(c: str) -> str:
    """SQL: rule (b) for clock row ``c`` of level ``f`` (a row of ``facts``): at or below
    the floor with nothing queued ungated at the level, below it by vtimes; never the
    level's keeper (its largest clock); its tenant not live."""
    return f"""CASE WHEN f.qmin IS NULL THEN {c}.vtime <= f.floor
                ELSE %(by_vtime)s AND {c}.vtime < f.floor END
           AND {c}.id <> f.keeper AND {_not_live(c)}"""


def _clock_lock_idle(by_time: bool) -> str:
    return f"""
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
{_idle_facts("levels", by_time)}
idle_levels AS MATERIALIZED (
    SELECT f.queue, f.priority FROM facts f
     WHERE f.quiet
       AND NOT EXISTS (SELECT 1 FROM pgqueue_fair_clock o
                        WHERE o.queue = f.queue AND o.priority = f.priority
                          AND NOT ({_not_live("o")}))
),
chosen AS MATERIALIZED (
    SELECT id, queue, priority FROM (
        SELECT c.id, c.queue, c.priority, c.vtime FROM idle_levels i
          JOIN pgqueue_fair_clock c ON c.queue = i.queue AND c.priority = i.priority
        UNION
        SELECT c.id, c.queue, c.priority, c.vtime FROM facts f
          JOIN pgqueue_fair_clock c  -- a range of the level's index: the rows below the floor
            ON c.queue = f.queue AND c.priority = f.priority AND c.vtime <= f.floor
         WHERE {_below_floor("c")}) x
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
"""


# -- name: FAIR_CLOCK_LOCK_IDLE
# The prune's first statement (see "Idle fair clocks" above): walk up to %(levels)s levels
# after (%(after_queue)s, %(after_priority)s), in (queue, priority) order, and lock up to
# %(limit)s of their clock rows that rule (a) or (b) would delete in this snapshot: every
# row of a quiet level whose tenants are all not live, and the rows at or below the floor
# of tenants not live (but the keeper), in (level, vtime) order. Returns the ids locked,
# the number of levels walked, whether the chosen rows filled %(limit)s, and where the
# next prune goes on after: the last level walked, or when the limit cut a level short,
# the one before it (none: where this one started); fewer than %(levels)s walked and the
# limit not reached: from the first again.
# Locks: the chosen rows, FOR UPDATE SKIP LOCKED (a row an enqueue, a promotion or a
#   correction holds is left for a later pass; never waits), until the prune's
#   transaction ends (FAIR_CLOCK_DELETE_IDLE is the only other statement in it).
# Indexes: pgqueue_fair_clock_level (the walk, one descent per level; each level's largest
#   clock and its rows), pgqueue_job_claim and pgqueue_job_gated (each level's lowest
#   queued vtimes, as the head's), pgqueue_job_lease (the running jobs),
#   pgqueue_job_scheduled_level and pgqueue_job_gated (a probe per row considered),
#   pgqueue_fair_clock_pkey; by time, pgqueue_job_attempt_pkey and pgqueue_job_pkey (the
#   attempts past the correction's mark).
# Called by: fair_store.prune_fair_clocks, from maintenance.prune_idle_clocks, in a
#   transaction of its own after a maintenance pass (so not under MAINTENANCE_TRY_LOCK:
#   two prunes lock disjoint rows, and each deletes a level whole only when it holds all
#   of it).
FAIR_CLOCK_LOCK_IDLE = _clock_lock_idle(False)

# -- name: FAIR_CLOCK_LOCK_IDLE_BY_TIME
# FAIR_CLOCK_LOCK_IDLE with FAIRNESS = "time": a tenant with an attempt FAIR_CLOCK_CORRECT
# has not passed yet is live where that attempt's job is.
# Locks, Indexes, Called by: as FAIR_CLOCK_LOCK_IDLE.
FAIR_CLOCK_LOCK_IDLE_BY_TIME = _clock_lock_idle(True)


def _clock_delete_idle(by_time: bool) -> str:
    return f"""
WITH mine AS MATERIALIZED (
    SELECT c.id, c.queue, c.tenant, c.priority, c.vtime FROM pgqueue_fair_clock c
     WHERE c.id = ANY(%(ids)s::bigint[])
),
levels AS MATERIALIZED (SELECT queue, priority, count(*) AS n FROM mine GROUP BY queue, priority),
{_idle_facts("levels", by_time)}
whole AS MATERIALIZED (  -- rule (a): quiet, every row locked here, no tenant live
    SELECT f.queue, f.priority FROM facts f JOIN levels l USING (queue, priority)
     WHERE f.quiet
       AND (SELECT count(*) FROM (SELECT 1 FROM pgqueue_fair_clock o
                                   WHERE o.queue = f.queue AND o.priority = f.priority
                                   LIMIT l.n + 1) a) = l.n
       AND NOT EXISTS (SELECT 1 FROM mine m
                        WHERE m.queue = f.queue AND m.priority = f.priority
                          AND NOT ({_not_live("m")}))
),
doomed AS MATERIALIZED (
    SELECT m.id FROM mine m JOIN facts f ON f.queue = m.queue AND f.priority = m.priority
     WHERE (m.queue, m.priority) IN (SELECT queue, priority FROM whole)
        OR {_below_floor("m")}
)
DELETE FROM pgqueue_fair_clock c USING doomed d WHERE c.id = d.id
RETURNING c.queue, c.tenant, c.priority, c.vtime
"""


# -- name: FAIR_CLOCK_DELETE_IDLE
# The prune's second statement (see "Idle fair clocks" above): of the rows %(ids)s that
# FAIR_CLOCK_LOCK_IDLE locked, delete those rule (a) or (b) deletes in this statement's own
# snapshot, taken after the locks: a job of their tenant committed meanwhile keeps a row;
# rule (a) needs every row of the level among %(ids)s. Returns the rows deleted.
# Locks: the rows (already held).
# Indexes: pgqueue_fair_clock_pkey, then as FAIR_CLOCK_LOCK_IDLE for the levels of the rows.
# Called by: fair_store.prune_fair_clocks, right after FAIR_CLOCK_LOCK_IDLE when it locked
#   any row.
FAIR_CLOCK_DELETE_IDLE = _clock_delete_idle(False)

# -- name: FAIR_CLOCK_DELETE_IDLE_BY_TIME
# FAIR_CLOCK_DELETE_IDLE with FAIRNESS = "time" (see FAIR_CLOCK_LOCK_IDLE_BY_TIME).
# Locks, Indexes, Called by: as FAIR_CLOCK_DELETE_IDLE.
FAIR_CLOCK_DELETE_IDLE_BY_TIME = _clock_delete_idle(True)


# -- periodic schedules (pgqueue_periodic; see pgqueue/schedules.py) -------------------------

# -- name: PERIODIC_SYNC
# Make pgqueue_periodic match the schedules declared in code (a JSON array of rows, each
# with its first tick computed in Python): upsert them, mark the others removed.
# Called by schedules.sync_schedules, at runworker start-up, in its own transaction.
# Locks: the declared rows (upsert, in name order, so concurrent start-ups never deadlock)
#   and the rows newly marked removed. Never writes `enabled`, which the operator owns: a
#   deploy does not re-enable what the admin turned off. next_run_at is kept unless the
#   cron or the time zone changed, or the schedule comes back after a removal.
# Index: pgqueue_periodic_name_key (the upsert); the removal scans the (small) table.
PERIODIC_SYNC = """
WITH spec AS (
    SELECT * FROM jsonb_to_recordset(%(specs)s::jsonb) AS s(
        name text, cron text, timezone text, task text, tenant text, queue text,
        priority smallint, max_attempts int, payload jsonb, missed text, next_run_at timestamptz)
),
upserted AS (
    INSERT INTO pgqueue_periodic AS p (name, cron, timezone, task, tenant, queue, priority,
                                       max_attempts, payload, missed, enabled, next_run_at)
    SELECT name, cron, timezone, task, tenant, queue, priority, max_attempts,
           COALESCE(payload, 'null'::jsonb), missed, TRUE, next_run_at
      FROM spec
     ORDER BY name
    ON CONFLICT (name) DO UPDATE
       SET next_run_at = CASE
               WHEN p.cron <> EXCLUDED.cron OR p.timezone <> EXCLUDED.timezone
                    OR p.removed_at IS NOT NULL
               THEN EXCLUDED.next_run_at ELSE p.next_run_at END,
           cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, task = EXCLUDED.task,
           tenant = EXCLUDED.tenant, queue = EXCLUDED.queue, priority = EXCLUDED.priority,
           max_attempts = EXCLUDED.max_attempts, payload = EXCLUDED.payload,
           missed = EXCLUDED.missed, removed_at = NULL, updated_at = now()
    RETURNING p.name
),
removed AS (
    UPDATE pgqueue_periodic
       SET removed_at = now(), updated_at = now()
     WHERE removed_at IS NULL AND name <> ALL (ARRAY(SELECT name FROM spec))
    RETURNING name
)
SELECT name FROM removed ORDER BY name
"""

# -- name: PERIODIC_LOCK_DUE
# The live schedules whose next tick has come, locked for this maintenance run.
# Called by schedules.enqueue_due (the maintenance duty enqueue_due_periodic).
# Locks: each returned row, FOR UPDATE SKIP LOCKED: a second enqueuer (maintenance runs
#   one at a time, but nothing relies on that alone) skips a row being fired, and after
#   that run's commit finds it no longer due.
# Index: pgqueue_periodic_due (partial: enabled and not removed, by next_run_at).
PERIODIC_LOCK_DUE = f"""
SELECT name, cron, timezone, task, tenant, queue, priority, max_attempts,
       COALESCE(payload, 'null'::jsonb)::text, missed, next_run_at
  FROM pgqueue_periodic
 WHERE enabled AND removed_at IS NULL AND next_run_at <= {NOW}
 ORDER BY next_run_at, name
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED
"""

# -- name: PERIODIC_ADVANCE
# Move a fired schedule to its next tick: a compare-and-set on the next_run_at it was
# fired for, so a tick moves the schedule forward once. Records the tick and its job
# (both kept as they were when the tick was skipped).
# Called by schedules.enqueue_due, in the savepoint of the tick's enqueue.
# Locks: the schedule's row (already locked by PERIODIC_LOCK_DUE).
# Index: pgqueue_periodic_name_key.
PERIODIC_ADVANCE = """
UPDATE pgqueue_periodic
   SET next_run_at = %(next_run_at)s::timestamptz,
       last_run_at = COALESCE(%(tick)s::timestamptz, last_run_at),
       last_job_id = COALESCE(%(job_id)s::bigint, last_job_id),
       updated_at = now()
 WHERE name = %(name)s AND next_run_at = %(due)s::timestamptz
RETURNING name
"""

# -- name: PERIODIC_LOCK
# One schedule's cron, time zone and switch, read to turn the switch.
# Called by schedules.set_periodic_enabled (the admin's actions), in its transaction.
# Locks: that row, FOR UPDATE, until the switch is turned (two operators in turn, not both).
# Index: pgqueue_periodic_name_key.
PERIODIC_LOCK = """
SELECT cron, timezone, enabled FROM pgqueue_periodic WHERE name = %(name)s FOR UPDATE
"""

# -- name: PERIODIC_SET_ENABLED
# Turn a schedule on (from its next tick, computed by the caller) or off.
# Called by schedules.set_periodic_enabled after PERIODIC_LOCK, in the same transaction.
# Locks: that row (already held). Index: pgqueue_periodic_name_key.
PERIODIC_SET_ENABLED = """
UPDATE pgqueue_periodic
   SET enabled = %(enabled)s::boolean,
       next_run_at = CASE WHEN %(enabled)s::boolean THEN %(next_run_at)s::timestamptz
                          ELSE next_run_at END,
       updated_at = now()
 WHERE name = %(name)s
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


# -- Limits (pgqueue_limit; see pgqueue/limits.py) -------------------------------------------

# The limits wing's statements (LIMIT_SET, JOB_GATE_SCOPE, ..., LIMIT_DELETE_UNUSED) are
# written whole in queries/limits.sql.
