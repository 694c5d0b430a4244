"""The raw SQL of pgqueue's read side, named Entity + Verb like ``pgqueue.sql``.

``pgqueue.reads``, ``pgqueue.liveness`` and ``pgqueue.pages`` run these and the plain ORM
reads; nothing else reads figures from the job tables. Each statement says what it reads,
which index serves it and who calls it. None takes a row lock. Parameters are bound by the
driver (``%(name)s``), never formatted in.

What every read of ``pgqueue.reads`` costs, raw or ORM. None reads every job: the live
rows come from the partial indexes that hold only them, finished rows are counted up to
``PGQUEUE["COUNT_CAP"]`` (a BoundedCount, "N+", past it), and a page of GET /jobs is one
keyset page of the primary key within a window of ``PGQUEUE["LIST_WINDOW"]`` jobs.

=============================  =====================================================  ======
read (reads.py)                what it reads                                          scans
=============================  =====================================================  ======
job_counts                     JOB_COUNTS_BOUNDED: claim, scheduled, lease and        no
                               waiting indexes (live rows only);
                               pgqueue_job_finished_queue (≤ COUNT_CAP
                               + 1 entries per queue and finished status)
oldest_runnable                queued rows, through pgqueue_job_claim                 no
tenant_counts (annotation)     TENANT_JOBS_BACKLOG / _IN_STATUS per tenant asked for  no*
                               (pgqueue_job_tenant_status): live exact, done and
                               dead ≤ COUNT_CAP + 1 entries
tenant_summaries               tenant_counts for the tenants named (or all), under    no*
                               BOUNDED_COUNT_PLANS
tenant_page                    pgqueue_tenant's count and one page of names, then     no*
                               tenant_summaries for that page (GET /tenants)
tenant_done_share (annot.)     the last hour's done attempts (pgqueue_attempt_        no
                               finished), joined to their jobs by primary key
top_backlogs                   TENANT_BACKLOG_TOP                                     no
top_backlogs_with_share        TENANT_BACKLOG_TOP_WITH_SHARE                          no
recent_attempts, throughput_   a window of pgqueue_job_attempt through pgqueue_       no
buckets, slowest_tasks,        attempt_finished (slowest, tenant_waits: joined to
tenant_waits                   jobs by pk; TENANT_WAIT_TOP)
tenant_stats                   pgqueue_tenant_stat: at most (METRICS_TENANT_SERIES    no
                               + 1) x 2 x buckets rows a queue
workers_alive, workers_        pgqueue_worker, pruned by maintenance to a day         no
overview
row_estimate                   TABLE_ROW_ESTIMATE (one pg_class row)                  no
unserved_queues                QUEUE_UNSERVED: one probe of pgqueue_job_claim and of  no
                               pgqueue_job_gated per queue with queued jobs, and
                               pgqueue_worker
unserved_tasks                 TASK_UNSERVED: pgqueue_worker, for the task names      no
                               asked for (a page of the admin's job list)
window_edge (GET /jobs, the    the LIST_WINDOW-th id past the cursor: an index-only   no
CLI, the admin's job list)     scan of the pk or of pgqueue_job_tenant_id
bounded_count (GET /jobs)      the matches between the newest window's edge and the   no
                               newest job, up to COUNT_CAP + 1; past it (or past the
                               window) TABLE_ROW_ESTIMATE or QUERY_PLAN_ROWS
job_list_page (GET /jobs)      ``id < cursor AND id >= edge ORDER BY id DESC LIMIT    no
                               n``: at most LIST_WINDOW jobs examined; payload/result
                               sizes, loaded only when small
exported_limits (limit_reads)  LIMIT_ROWS_EXPORTED: pgqueue_limit (a row per limited    no
                               scope), at most METRICS_LIMIT_SERIES rows
key_counts                     KEY_COUNTS: pgqueue_key (a row per key with a slot     no
                               held), the jobs waiting for their key (live rows)
live_workflows                 DISTINCT workflow_id of pgqueue_job_workflow_live (live  no
                               jobs of a workflow only)
=============================  =====================================================  ======

``*``: per tenant asked for (at most ``limit`` for a page of /tenants), its live jobs and
at most COUNT_CAP + 1 finished ones of each status. The admin's tenant list sorts on these
annotations across all tenants.
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
# Reads the queued and scheduled rows only: one arm per partial index (pgqueue_job_claim:
# queued, not gated; pgqueue_job_gated; pgqueue_job_key_new and pgqueue_job_key_waiting:
# queued, waiting for their concurrency key; pgqueue_job_scheduled). One filter over them
# (an IN list, or an OR grouped by tenant) lets the planner walk pgqueue_job_tenant_status,
# an index of every job, for its tenant order: a million finished jobs read for a handful
# of live ones (tests/test_bounded_reads.py catches it).
_TENANT_BACKLOG = """
backlog AS (
    SELECT tenant,
           count(*) FILTER (WHERE live.status = 'queued') AS queued,
           count(*) FILTER (WHERE live.status = 'scheduled') AS scheduled,
           count(*) AS backlog
      FROM (SELECT tenant, status FROM pgqueue_job WHERE status = 'queued' AND NOT gated
            UNION ALL
            SELECT tenant, status FROM pgqueue_job WHERE status = 'queued' AND gated
            UNION ALL
            SELECT tenant, status FROM pgqueue_job WHERE status = 'queued' AND key_state = 'new'
            UNION ALL
            SELECT tenant, status FROM pgqueue_job
             WHERE status = 'queued' AND key_state = 'waiting'
            UNION ALL
            SELECT tenant, status FROM pgqueue_job WHERE status = 'scheduled') live
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


def _queues_of(cte: str, rows: str) -> str:
    """A recursive CTE ``cte(queue)``: the distinct queues of the job rows matching ``rows``
    (the predicate of a partial index that leads with queue), by a skip scan: each step is
    one index probe for the next queue name after the last, so it costs one probe per
    queue, not per job. Its last row is NULL."""
    return f"""{cte}(queue) AS (
    (SELECT queue FROM pgqueue_job WHERE {rows} ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM pgqueue_job j
             WHERE {rows} AND j.queue > s.queue
             ORDER BY j.queue LIMIT 1)
      FROM {cte} s
     WHERE s.queue IS NOT NULL
)"""


# -- name: QUEUE_UNSERVED
# The queues that have queued jobs, runnable or gated (a limited tenant's, waiting for a
# slot only a worker of the queue can give them), and no live worker taking from them: not
# stopped, seen at or after %(alive_since)s, its ``queues`` (a JSON list) naming the queue.
# Reads: the distinct queues of the queued rows by a skip scan (_queues_of) of each partial
#   index that holds them, pgqueue_job_claim (queue, -priority, vtime, id) and
#   pgqueue_job_gated (queue, tenant, ...): one probe of each per queue, whatever the
#   number of jobs; the queues of the jobs waiting for their concurrency key, from
#   pgqueue_job_key_new and pgqueue_job_key_waiting (every such job: live rows only);
#   then pgqueue_worker (pruned by maintenance to a day of rows) for each.
# Called by liveness.unserved_queues for the dashboard's queue table and the admin's queue
# filter and worker list.
QUEUE_UNSERVED = f"""
WITH RECURSIVE {_queues_of("runnable", "status = 'queued' AND NOT gated")},
{_queues_of("gated", "status = 'queued' AND gated")}
SELECT q.queue
  FROM (SELECT queue FROM runnable UNION SELECT queue FROM gated
        UNION SELECT queue FROM pgqueue_job WHERE status = 'queued' AND key_state = 'new'
        UNION SELECT queue FROM pgqueue_job WHERE status = 'queued' AND key_state = 'waiting') q
 WHERE q.queue IS NOT NULL
   AND NOT EXISTS (
       SELECT 1 FROM pgqueue_worker w
        WHERE w.stopped_at IS NULL
          AND w.last_seen_at >= %(alive_since)s
          AND w.queues @> jsonb_build_array(q.queue))
 ORDER BY q.queue
"""

# -- name: TASK_UNSERVED
# Of the task names %(tasks)s, those no live worker can run: none not stopped and seen at
# or after %(alive_since)s lists the name, or its family ("<family>:*"), in its ``tasks``
# (a JSON list). A worker whose ``tasks`` is NULL (not recorded: an older release, or more
# names than it records) counts as serving every task, so that nothing is flagged wrongly.
# Reads: pgqueue_worker only (pruned by maintenance to a day of rows), once per name
#   asked for; no job row.
# Called by liveness.unserved_tasks for the admin's job list and job page.
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

# -- name: JOB_COUNTS_BOUNDED
# Jobs by queue and status, (queue, status, n): the live statuses exact, the finished ones
# counted up to %(bound)s rows and no further (n = %(bound)s means "at least that many").
# Reads, under BOUNDED_COUNT_PLANS:
#   - live rows only, one arm per status so that each matches its partial index:
#     queued ones through pgqueue_job_claim (not gated), pgqueue_job_gated (gated) and
#     pgqueue_job_key_new and _waiting (waiting for their concurrency key), an
#     arm each (the claim index holds only ungated jobs, so a bare ``status = 'queued'``
#     matches neither and reads an index of every job; an OR of the two would need a
#     bitmap scan, which BOUNDED_COUNT_PLANS turns off);
#     pgqueue_job_scheduled, pgqueue_job_lease and pgqueue_job_waiting (the jobs waiting
#     for their dependencies: pgqueue.workflows) (their rows, for the queue). A single
#     ``status IN (…)`` would match none of them and scan the table;
#   - finished rows through the partial index pgqueue_job_finished_queue (queue, status): the
#     distinct queues by a skip scan (_queues_of: one probe per queue; its
#     ``status IN (…)`` is the index's own predicate), then per queue and status an
#     index-only scan that stops after %(bound)s entries. Cost: at most %(bound)s entries
#     per queue and finished status, whatever the history.
# Called by reads.job_counts for /stats, /metrics (pgqueue_jobs) and the dashboard.
JOB_COUNTS_BOUNDED = f"""
WITH RECURSIVE {_queues_of("finished", "status IN ('done', 'dead', 'cancelled')")}
SELECT queue, 'queued', count(*)
  FROM (SELECT queue FROM pgqueue_job WHERE status = 'queued' AND NOT gated
        UNION ALL
        SELECT queue FROM pgqueue_job WHERE status = 'queued' AND gated
        UNION ALL
        SELECT queue FROM pgqueue_job WHERE status = 'queued' AND key_state = 'new'
        UNION ALL
        SELECT queue FROM pgqueue_job WHERE status = 'queued' AND key_state = 'waiting') queued
 GROUP BY queue
UNION ALL
SELECT queue, 'waiting', count(*) FROM pgqueue_job WHERE status = 'waiting' GROUP BY queue
UNION ALL
SELECT queue, 'scheduled', count(*) FROM pgqueue_job WHERE status = 'scheduled' GROUP BY queue
UNION ALL
SELECT queue, 'running', count(*) FROM pgqueue_job WHERE status = 'running' GROUP BY queue
UNION ALL
SELECT f.queue, 'done', (SELECT count(*) FROM (SELECT 1 FROM pgqueue_job j
                                                WHERE j.queue = f.queue AND j.status = 'done'
                                                LIMIT %(bound)s) n)
  FROM finished f WHERE f.queue IS NOT NULL
UNION ALL
SELECT f.queue, 'dead', (SELECT count(*) FROM (SELECT 1 FROM pgqueue_job j
                                                WHERE j.queue = f.queue AND j.status = 'dead'
                                                LIMIT %(bound)s) n)
  FROM finished f WHERE f.queue IS NOT NULL
UNION ALL
SELECT f.queue, 'cancelled', (SELECT count(*) FROM (SELECT 1 FROM pgqueue_job j
                                                     WHERE j.queue = f.queue
                                                       AND j.status = 'cancelled'
                                                     LIMIT %(bound)s) n)
  FROM finished f WHERE f.queue IS NOT NULL
"""

# -- name: TENANT_JOBS_BACKLOG (a correlated fragment of reads.tenant_counts)
# The queued + scheduled jobs of the outer query's tenant (pgqueue_tenant.name): exact,
# through pgqueue_job_tenant_status (tenant, status), the live rows of that tenant only.
TENANT_JOBS_BACKLOG = """
SELECT count(*) FROM pgqueue_job j
 WHERE j.tenant = pgqueue_tenant.name AND j.status IN ('queued', 'scheduled')
"""

# -- name: TENANT_JOBS_RUNNING (a correlated fragment of reads.tenant_counts)
# The running jobs of the outer query's tenant: exact, live rows only (through
# pgqueue_job_tenant_status or pgqueue_job_lease, both bounded by what runs).
TENANT_JOBS_RUNNING = """
SELECT count(*) FROM pgqueue_job j
 WHERE j.tenant = pgqueue_tenant.name AND j.status = 'running'
"""

# -- name: TENANT_JOBS_IN_STATUS (a correlated fragment of reads.tenant_counts)
# The jobs of the outer query's tenant in finished status %s, counted up to %s rows: an
# index-only scan of pgqueue_job_tenant_status (tenant, status) that stops there.
# The status comes through a subquery so that the plan cannot know it: were it a constant,
# the partial index pgqueue_job_finished (status, finished_at), or the primary key, would
# serve "status = 'done' LIMIT n" with a filter on the tenant, which the planner costs as
# stopping soon, and which for a tenant with no such job reads every finished row.
TENANT_JOBS_IN_STATUS = """
SELECT count(*) FROM (SELECT 1 FROM pgqueue_job j
                       WHERE j.tenant = pgqueue_tenant.name AND j.status = (SELECT %s::text)
                       LIMIT %s) n
"""

# -- name: QUERY_PLAN_ROWS
# The planner's row estimate of a filtered job list (EXPLAIN without ANALYZE: nothing is
# read but the statistics). Prefixes the list's own SELECT; called by pages.estimate_rows
# for GET /jobs when more rows match than COUNT_CAP.
QUERY_PLAN_ROWS = "EXPLAIN (FORMAT JSON) "

# -- name: BOUNDED_COUNT_PLANS
# For the rest of the transaction, no sequential and no bitmap scans: the counts up to a
# cap (JOB_COUNTS_BOUNDED, TENANT_JOBS_IN_STATUS) and the live counts beside them
# then read their index in order and stop at the LIMIT, whatever the planner's estimate of
# the value's share. SET LOCAL ends with the transaction; it takes no lock. Called by
# reads._stopping_scans (job_counts, tenant_summaries).
BOUNDED_COUNT_PLANS = "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off"

# -- name: LIMIT_ROWS_EXPORTED
# The limit rows that limit anything now (a cap, a rate limit or a pause), at most
# %(limit)s of them: the queue-wide ones first, then the tenants', then the (queue, tenant)
# pairs, each by name; with every such row's count (the same on every row) so that a scrape
# says how many were left out. (queue, tenant, max_running, rate_count, rate_seconds,
# paused, running, total).
# Reads: pgqueue_limit whole (one row per scope an operator limited: a small table whose
#   size does not grow with the jobs). Locks: nothing (a plain snapshot read; the claim's
#   FOR UPDATE on these rows does not block it).
# Called by limit_reads.exported_limits for the Prometheus gauges pgqueue_limit_*.
LIMIT_ROWS_EXPORTED = """
SELECT queue, tenant, max_running, rate_count, rate_seconds, paused, running,
       count(*) OVER () AS total
  FROM pgqueue_limit
 WHERE max_running IS NOT NULL OR rate_count IS NOT NULL OR paused
 ORDER BY tenant <> '', queue <> '', queue, tenant
 LIMIT %(limit)s
"""


# -- name: KEY_COUNTS
# The concurrency keys with slots held (rows of pgqueue_key, which exist only while one
# is), the slots held, and the queued jobs waiting for their key (not yet examined, or
# waiting for a slot). Reads: pgqueue_key (one row per key in use), and
# pgqueue_job_key_new and pgqueue_job_key_waiting (live rows only); no job history.
# Called by reads.key_counts for /metrics (pgqueue_keys_held, pgqueue_key_slots_held,
# pgqueue_jobs_waiting_for_key).
KEY_COUNTS = """
SELECT (SELECT count(*) FROM pgqueue_key),
       (SELECT COALESCE(sum(running), 0) FROM pgqueue_key),
       (SELECT count(*) FROM pgqueue_job WHERE status = 'queued' AND key_state = 'new')
       + (SELECT count(*) FROM pgqueue_job WHERE status = 'queued' AND key_state = 'waiting')
"""


# -- name: WORKFLOW_JOBS
# A workflow's jobs in id order (dependencies before their dependents), at most %(limit)s
# of them (PGQUEUE["MAX_WORKFLOW_JOBS"]: no workflow has more when it is enqueued).
# Reads: pgqueue_job_workflow (workflow_id, id) and the job rows. Locks: nothing.
# Called by workflow_reads.describe (GET /workflows/<id>, the admin's workflow page, the CLI).
WORKFLOW_JOBS = """
SELECT id, step, task, status, queue, priority, attempts, max_attempts, created_at,
       started_at, finished_at, last_error, run_on_upstream_failure, failed_upstream_id
  FROM pgqueue_job
 WHERE workflow_id = %(id)s
 ORDER BY id
 LIMIT %(limit)s
"""


# -- name: WORKFLOW_EDGES
# The dependencies of a workflow's jobs (job, upstream), at most %(limit)s of them.
# Reads: pgqueue_job_workflow (the jobs), pgqueue_job_dep_uniq (their edges). Locks:
# nothing. Called by workflow_reads.describe.
WORKFLOW_EDGES = """
SELECT d.job_id, d.upstream_id
  FROM pgqueue_job j JOIN pgqueue_job_dependency d ON d.job_id = j.id
 WHERE j.workflow_id = %(id)s
 ORDER BY d.job_id, d.upstream_id
 LIMIT %(limit)s
"""


# -- name: WORKFLOW_PAGE
# One page of workflows, newest first, below the id %(before)s (NULL: from the newest),
# of the tenant %(tenant)s (NULL: every tenant), each with whether any of its jobs is
# unfinished. (id, tenant, name, created_at, live).
# Reads: pgqueue_workflow_tenant_id or the pkey (a keyset page), and one probe of
# pgqueue_job_workflow_live per workflow shown. Locks: nothing.
# Called by workflow_reads.page (GET /workflows, the CLI).
WORKFLOW_PAGE = """
SELECT w.id, w.tenant, w.name, w.created_at,
       EXISTS (SELECT 1 FROM pgqueue_job l
                WHERE l.workflow_id = w.id
                  AND l.status IN ('waiting', 'scheduled', 'queued', 'running')) AS live
  FROM pgqueue_workflow w
 WHERE (%(tenant)s::text IS NULL OR w.tenant = %(tenant)s)
   AND (%(before)s::bigint IS NULL OR w.id < %(before)s)
 ORDER BY w.id DESC
 LIMIT %(limit)s
"""


# -- name: JOB_DEPENDENCY_IDS
# The dependencies and the dependents of one job (ids), at most %(limit)s of each.
# Reads: pgqueue_job_dep_uniq and pgqueue_job_dep_upstream (index-only). Locks: nothing.
# Called by workflow_reads.neighbours (GET /jobs/<id>, the admin's job page).
JOB_DEPENDENCY_IDS = """
SELECT 'upstream' AS side, upstream_id AS id FROM (
    SELECT upstream_id FROM pgqueue_job_dependency WHERE job_id = %(id)s
     ORDER BY upstream_id LIMIT %(limit)s) u
UNION ALL
SELECT 'dependent', job_id FROM (
    SELECT job_id FROM pgqueue_job_dependency WHERE upstream_id = %(id)s
     ORDER BY job_id LIMIT %(limit)s) d
"""

# -- name: TENANT_WAIT_TOP
# The wait from runnable to the handler's start (started_at - due_at) and the run time of
# the attempts that finished in [%(since)s, %(until)s) having started, for the %(limit)s
# tenants with the most of them (ties by name), and for all the others together (tenant
# NULL, "other"): (tenant, attempts, wait p50, wait p95, wait max, run p95), in seconds,
# busiest first, "other" last. Attempts recorded before due_at existed are left out.
# Reads: the window's attempts through pgqueue_attempt_finished, joined to their jobs by
#   primary key (or one hashed scan when the planner reckons the window a large part of
#   the table), as TENANT_BACKLOG_TOP_WITH_SHARE does.
# Called by reads.tenant_waits for the dashboard's wait-by-tenant table and chart.
TENANT_WAIT_TOP = """
WITH started AS MATERIALIZED (
    SELECT j.tenant,
           GREATEST(extract(epoch FROM a.started_at - a.due_at)::float8, 0) AS wait,
           GREATEST(extract(epoch FROM a.finished_at - a.started_at)::float8, 0) AS run
      FROM pgqueue_job_attempt a
      JOIN pgqueue_job j ON j.id = a.job_id
     WHERE a.finished_at >= %(since)s AND a.finished_at < %(until)s
       AND a.started_at IS NOT NULL AND a.due_at IS NOT NULL
),
top AS MATERIALIZED (
    SELECT tenant FROM started GROUP BY tenant ORDER BY count(*) DESC, tenant LIMIT %(limit)s
)
SELECT t.tenant, count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY s.wait),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY s.wait),
       max(s.wait),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY s.run)
  FROM started s
  LEFT JOIN top t ON t.tenant = s.tenant
 GROUP BY t.tenant
 ORDER BY t.tenant IS NULL, count(*) DESC, t.tenant
"""
