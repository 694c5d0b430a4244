"""The statements of pgqueue's job paths, named Entity + Verb + Qualifier, each written
whole in a ``.sql`` file of ``pgqueue/queries`` and read at import: enqueue.sql, jobs.sql
(outcomes, leases, cancellation), promotion.sql, fair_clock.sql and maintenance.sql. The
claim is in claim.sql (``pgqueue.claim_store``), the limits wing in limits.sql
(``pgqueue.limits_store``), the periodic schedules in periodic.sql
(``pgqueue.schedule_store``), the read side in ``pgqueue.read_sql``.

Parameters are bound by the driver (``%(name)s``), never formatted in. A header
(``-- name: X``) reads, in this order: what the statement does and why it is shaped so;
``Locks:`` what it locks and until when; ``Index:`` / ``Indexes:`` what serves it;
``Called by:`` the ``pgqueue.store`` function that runs it, and who calls that. A
statement of the fairness policy comes in two: X (jobs charged 1) and X_BY_TIME (jobs
charged their task's run time); ``pgqueue.fairness.statement`` picks one.

Conventions:
- ``%(now)s`` is an optional timestamp that tests inject instead of sleeping; NULL means
  the transaction's ``now()``. Taken by every statement that starts, extends or ends a
  lease (claim, heartbeat, complete, fail, reap) and by promotion.
- Payloads and results travel as JSON text (``::jsonb`` on the way in, ``::text`` on the
  way out), so the same statements work on Django's connection and on a bare psycopg one.
- Every statement that ends a job (done, dead, cancelled) notifies ``pgqueue_finished``
  with the ids it ended, in a CTE named ``notified`` (jobs.sql says how): what wakes the
  callers waiting for a result (``pgqueue.results``).
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

from .queries import load

#: SQL for the transaction's time, or the one a test injects (``%(now)s``).
NOW = "COALESCE(%(now)s::timestamptz, now())"

#: Every statement of this module, by name.
STATEMENTS: dict[str, str] = {
    **load("enqueue.sql"),
    **load("jobs.sql"),
    **load("promotion.sql"),
    **load("fair_clock.sql"),
    **load("maintenance.sql"),
}

# enqueue.sql
JOB_ENQUEUE = STATEMENTS["JOB_ENQUEUE"]
JOB_ENQUEUE_BY_TIME = STATEMENTS["JOB_ENQUEUE_BY_TIME"]
JOB_ENQUEUE_FIRST = STATEMENTS["JOB_ENQUEUE_FIRST"]
JOB_ENQUEUE_FIRST_BY_TIME = STATEMENTS["JOB_ENQUEUE_FIRST_BY_TIME"]
JOB_ENQUEUE_SCHEDULED = STATEMENTS["JOB_ENQUEUE_SCHEDULED"]
JOB_ENQUEUE_SCHEDULED_FIRST = STATEMENTS["JOB_ENQUEUE_SCHEDULED_FIRST"]
TENANT_QUEUE_ADMITTED = STATEMENTS["TENANT_QUEUE_ADMITTED"]
JOB_GET_ID_BY_IDEMPOTENCY_KEY = STATEMENTS["JOB_GET_ID_BY_IDEMPOTENCY_KEY"]
FAIR_CLOCK_REFUND = STATEMENTS["FAIR_CLOCK_REFUND"]
FAIR_CLOCK_REFUND_BY_TIME = STATEMENTS["FAIR_CLOCK_REFUND_BY_TIME"]

# jobs.sql
JOB_COMPLETE_MANY = STATEMENTS["JOB_COMPLETE_MANY"]
JOB_FAIL_MANY = STATEMENTS["JOB_FAIL_MANY"]
JOB_HEARTBEAT_MANY = STATEMENTS["JOB_HEARTBEAT_MANY"]
JOB_RELEASE_MANY = STATEMENTS["JOB_RELEASE_MANY"]
JOB_GIVE_BACK_MANY = STATEMENTS["JOB_GIVE_BACK_MANY"]
JOB_REAP_EXPIRED = STATEMENTS["JOB_REAP_EXPIRED"]
JOB_CANCEL_MANY = STATEMENTS["JOB_CANCEL_MANY"]
JOB_CANCEL_REQUEST_MANY = STATEMENTS["JOB_CANCEL_REQUEST_MANY"]
JOB_CANCEL_CONFIRM_MANY = STATEMENTS["JOB_CANCEL_CONFIRM_MANY"]
JOB_REAP_CANCELLED = STATEMENTS["JOB_REAP_CANCELLED"]
JOB_REAP_TIMED_OUT = STATEMENTS["JOB_REAP_TIMED_OUT"]
JOB_RETRY_MANY = STATEMENTS["JOB_RETRY_MANY"]
JOB_MAKE_DUE_MANY = STATEMENTS["JOB_MAKE_DUE_MANY"]
JOB_GET_STATUS_MANY = STATEMENTS["JOB_GET_STATUS_MANY"]
JOB_GET_OUTCOME = STATEMENTS["JOB_GET_OUTCOME"]

# promotion.sql
JOB_PROMOTE_DUE = STATEMENTS["JOB_PROMOTE_DUE"]
JOB_PROMOTE_MANY = STATEMENTS["JOB_PROMOTE_MANY"]
JOB_PROMOTE_DUE_BY_TIME = STATEMENTS["JOB_PROMOTE_DUE_BY_TIME"]
JOB_PROMOTE_MANY_BY_TIME = STATEMENTS["JOB_PROMOTE_MANY_BY_TIME"]
FAIR_CLOCK_ENSURE_DUE = STATEMENTS["FAIR_CLOCK_ENSURE_DUE"]
FAIR_CLOCK_ENSURE_MANY = STATEMENTS["FAIR_CLOCK_ENSURE_MANY"]

# fair_clock.sql
FAIR_CLOCK_CORRECT = STATEMENTS["FAIR_CLOCK_CORRECT"]
FAIR_CLOCK_LOCK_IDLE = STATEMENTS["FAIR_CLOCK_LOCK_IDLE"]
FAIR_CLOCK_LOCK_IDLE_BY_TIME = STATEMENTS["FAIR_CLOCK_LOCK_IDLE_BY_TIME"]
FAIR_CLOCK_DELETE_IDLE = STATEMENTS["FAIR_CLOCK_DELETE_IDLE"]
FAIR_CLOCK_DELETE_IDLE_BY_TIME = STATEMENTS["FAIR_CLOCK_DELETE_IDLE_BY_TIME"]

# maintenance.sql
TENANT_WEIGHT_SET = STATEMENTS["TENANT_WEIGHT_SET"]
QUEUE_WEIGHT_SET = STATEMENTS["QUEUE_WEIGHT_SET"]
MAINTENANCE_TRY_LOCK = STATEMENTS["MAINTENANCE_TRY_LOCK"]
WORKER_REGISTER = STATEMENTS["WORKER_REGISTER"]
DATABASE_CLOCK_READ = STATEMENTS["DATABASE_CLOCK_READ"]
WORKER_STOP = STATEMENTS["WORKER_STOP"]
WORKER_PRUNE = STATEMENTS["WORKER_PRUNE"]
TASK_STAT_HEAD = STATEMENTS["TASK_STAT_HEAD"]
TASK_STAT_FOLD = STATEMENTS["TASK_STAT_FOLD"]
TENANT_STAT_FOLD = STATEMENTS["TENANT_STAT_FOLD"]
TENANT_STAT_RELEASE_IDLE = STATEMENTS["TENANT_STAT_RELEASE_IDLE"]
JOB_PRUNE_FINISHED = STATEMENTS["JOB_PRUNE_FINISHED"]
JOB_PRUNE_FINISHED_COUNT = STATEMENTS["JOB_PRUNE_FINISHED_COUNT"]
