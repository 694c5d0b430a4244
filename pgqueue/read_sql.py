"""The raw SQL of pgqueue's read side, named Entity + Verb like ``pgqueue.sql``.

``pgqueue.reads`` runs these and the plain ORM reads; nothing else reads figures from the
job tables. Each statement says what it reads, which index serves it and who calls it. None
takes a row lock. Parameters are bound by the driver (``%(name)s``), never formatted in.

What every read of ``pgqueue.reads`` costs today, raw or ORM, so that bounding the ones that
grow with the history is a change to this list:

=============================  =====================================================  ======
read (reads.py)                what it reads                                          scans
=============================  =====================================================  ======
job_counts                     every row of pgqueue_job (GROUP BY queue, status)      yes
oldest_runnable                queued rows, through pgqueue_job_claim                 no
tenant_counts (annotation)     every job of the tenants asked for (LEFT JOIN, by      yes*
                               tenant; pgqueue_job_tenant_status when few tenants)
tenant_summaries               tenant_counts for the tenants named (or all)           yes*
tenant_page                    pgqueue_tenant's count and one page of names, then     yes*
                               tenant_summaries for that page (GET /tenants)
tenant_done_share (annot.)     the last hour's done attempts (pgqueue_attempt_        no
                               finished), joined to their jobs by primary key
top_backlogs                   TENANT_BACKLOG_TOP                                     no
top_backlogs_with_share        TENANT_BACKLOG_TOP_WITH_SHARE                          no
recent_attempts, throughput_   a window of pgqueue_job_attempt through pgqueue_       no
buckets, slowest_tasks         attempt_finished (slowest: joined to jobs by pk)
workers_alive, workers_        pgqueue_worker, pruned by maintenance to a day         no
overview
row_estimate                   TABLE_ROW_ESTIMATE (one pg_class row)                  no
unserved_queues                QUEUE_UNSERVED: one probe of pgqueue_job_claim per     no
                               queue with runnable jobs, and pgqueue_worker
unserved_tasks                 TASK_UNSERVED: pgqueue_worker, for the task names      no
                               asked for (a page of the admin's job list)
=============================  =====================================================  ======

``*``: all jobs of the tenants asked for, finished ones included: for a page of /tenants,
the jobs of at most ``limit`` tenants.
"""

from __future__ import annotations

# -- name: TABLE_ROW_ESTIMATE
# The planner's row estimate of one table (pg_class.reltuples, kept by ANALYZE and
# autovacuum): one catalogue row, whatever the table's size. -1 or 0 before the first
# ANALYZE. Called by reads.row_estimate for the admin's job list (EstimatedCountPaginator),
# which shows it instead of a COUNT(*) over every job.
TABLE_ROW_ESTIMATE = """
SELECT reltuples::bigint FROM pg_class WHERE oid = %(table)s::regclass
"""

# The tenants with the largest runnable backlog (queued + scheduled), at most %(limit)s,
# largest first, then by name. Used by both TENANT_BACKLOG_TOP statements.
# Reads the queued and scheduled rows only, through a BitmapOr of the partial indexes
# pgqueue_job_claim and pgqueue_job_scheduled. Written as OR on purpose: the planner matches
# partial indexes to the arms of an OR, not to an IN list, which would scan the whole table.
_TENANT_BACKLOG = """
backlog AS (
    SELECT tenant,
           count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status = 'scheduled') AS scheduled,
           count(*) AS backlog
      FROM pgqueue_job
     WHERE status = 'queued' OR status = 'scheduled'
     GROUP BY tenant
     ORDER BY backlog DESC, tenant
     LIMIT %(limit)s
)"""

# -- name: TENANT_BACKLOG_TOP
# The %(limit)s tenants with the largest backlog: (tenant, queued, scheduled, backlog).
# Reads: see _TENANT_BACKLOG (the live rows only, through the partial indexes).
# Called by reads.top_backlogs for the Prometheus gauge pgqueue_tenant_backlog.
TENANT_BACKLOG_TOP = f"""
WITH {_TENANT_BACKLOG}
SELECT tenant, queued, scheduled, backlog FROM backlog ORDER BY backlog DESC, tenant
"""

# -- name: TENANT_BACKLOG_TOP_WITH_SHARE
# The %(limit)s tenants with the largest backlog, with their weight, their per-queue weights,
# the jobs each had done in [%(since)s, %(until)s) and the jobs all tenants had done then
# (the same on every row), in one statement.
# Reads: the backlog as in _TENANT_BACKLOG; the window's done attempts through
#   pgqueue_attempt_finished, joined to their jobs (by primary key, or by one hashed scan
#   when the planner reckons the window a large part of the table); the (at most %(limit)s)
#   tenants' rows by primary key and their per-queue weights through
#   pgqueue_queue_weight_uniq.
# Called by reads.top_backlogs_with_share for the dashboard's backlog-by-tenant table.
TENANT_BACKLOG_TOP_WITH_SHARE = f"""
WITH {_TENANT_BACKLOG}, done AS (
    SELECT j.tenant, count(*) AS n
      FROM pgqueue_job_attempt a
      JOIN pgqueue_job j ON j.id = a.job_id
     WHERE a.outcome = 'done' AND a.finished_at >= %(since)s AND a.finished_at < %(until)s
     GROUP BY j.tenant
)
SELECT b.tenant, b.queued, b.scheduled, b.backlog, t.weight,
       ARRAY(SELECT qw.queue FROM pgqueue_queue_weight qw
              WHERE qw.tenant = b.tenant ORDER BY qw.queue),
       ARRAY(SELECT qw.weight FROM pgqueue_queue_weight qw
              WHERE qw.tenant = b.tenant ORDER BY qw.queue),
       COALESCE(d.n, 0),
       (SELECT COALESCE(sum(n), 0) FROM done)
  FROM backlog b
  LEFT JOIN pgqueue_tenant t ON t.name = b.tenant
  LEFT JOIN done d ON d.tenant = b.tenant
 ORDER BY b.backlog DESC, b.tenant
"""

# -- name: QUEUE_UNSERVED
# The queues that have runnable (queued) jobs and no live worker taking from them: not
# stopped, seen at or after %(alive_since)s, its ``queues`` (a JSON list) naming the queue.
# Reads: the distinct queues of the queued rows by a skip scan of the partial index
#   pgqueue_job_claim (queue, -priority, vtime, id): each step of the recursive CTE is one
#   index probe for the next queue name after the last, so the cost grows with the number
#   of queues, not of jobs; then pgqueue_worker (pruned by maintenance to a day of rows)
#   for each of them.
# Called by reads.unserved_queues for the dashboard's queue table and the admin's queue
# filter and worker list.
QUEUE_UNSERVED = """
WITH RECURSIVE runnable(queue) AS (
    (SELECT queue FROM pgqueue_job WHERE status = 'queued' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM pgqueue_job j
             WHERE j.status = 'queued' AND j.queue > r.queue
             ORDER BY j.queue LIMIT 1)
      FROM runnable r
     WHERE r.queue IS NOT NULL
)
SELECT r.queue
  FROM runnable r
 WHERE r.queue IS NOT NULL
   AND NOT EXISTS (
       SELECT 1 FROM pgqueue_worker w
        WHERE w.stopped_at IS NULL
          AND w.last_seen_at >= %(alive_since)s
          AND w.queues @> jsonb_build_array(r.queue))
 ORDER BY r.queue
"""

# -- name: TASK_UNSERVED
# Of the task names %(tasks)s, those no live worker can run: none not stopped and seen at
# or after %(alive_since)s lists the name, or its family ("<family>:*"), in its ``tasks``
# (a JSON list). A worker whose ``tasks`` is NULL (not recorded: an older release, or more
# names than it records) counts as serving every task, so that nothing is flagged wrongly.
# Reads: pgqueue_worker only (pruned by maintenance to a day of rows), once per name
#   asked for; no job row.
# Called by reads.unserved_tasks for the admin's job list and job page.
TASK_UNSERVED = """
SELECT t.task
  FROM unnest(%(tasks)s::text[]) AS t(task)
 WHERE NOT EXISTS (
       SELECT 1 FROM pgqueue_worker w
        WHERE w.stopped_at IS NULL
          AND w.last_seen_at >= %(alive_since)s
          AND (w.tasks IS NULL
               OR w.tasks @> jsonb_build_array(t.task)
               OR w.tasks @> jsonb_build_array(split_part(t.task, ':', 1) || ':*')))
 ORDER BY t.task
"""
