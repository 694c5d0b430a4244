"""pgqueue's tables.

The hot paths never go through the ORM: they use the named statements of
``pgqueue/queries/*.sql``.
The models exist for migrations, the admin and read-only queries, and they carry the
partial indexes and CHECK constraints those statements rely on.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from .key_models import KEY_MAX_LENGTH, KEY_MAX_RUNNING_BOUND, KeyState

NAME_MAX = 64

#: The bounds of a weight (``Tenant.weight``, ``QueueWeight.weight``), inclusive. Every
#: promotion and enqueue divides by the weight: outside them ``1 / weight`` overflows
#: float8 (1e-308) or makes a tenant's vtime stand still (1e300), and a tenant's share
#: over a weight-1 tenant is already a million to one at the bounds.
MIN_WEIGHT = 0.001
MAX_WEIGHT = 1000.0
_WEIGHT_IN_RANGE = Q(weight__gte=MIN_WEIGHT, weight__lte=MAX_WEIGHT)


class BigIntArrayField(models.Field):
    """A ``bigint[]`` column, written and read only by pgqueue's own SQL (``limit_ids``).

    Not ``django.contrib.postgres``'s ArrayField: that one makes every project add
    ``django.contrib.postgres`` to INSTALLED_APPS (postgres.E005 on Django 6), for a column
    no form or lookup ever touches. psycopg reads and writes Python lists as arrays itself.
    """

    def db_type(self, connection: Any) -> str:
        return "bigint[]"


class Status(models.TextChoices):
    WAITING = "waiting"  # for its dependencies to end (pgqueue.workflows)
    SCHEDULED = "scheduled"  # waiting for run_at (a delay or a retry backoff)
    QUEUED = "queued"  # runnable, ordered by priority then fair virtual time
    RUNNING = "running"  # leased to a worker
    DONE = "done"
    DEAD = "dead"  # out of attempts, or a permanent error
    CANCELLED = "cancelled"


class Outcome(models.TextChoices):
    DONE = "done"
    FAILED = "failed"
    LEASE_EXPIRED = "lease_expired"
    CANCELLED = "cancelled"
    SNOOZED = "snoozed"  # pgqueue.Retry: put off, not an attempt spent


class Tenant(models.Model):
    """Whoever a job is done for. Weight is its share of the workers in every queue."""

    name = models.CharField(primary_key=True, max_length=NAME_MAX)
    weight = models.FloatField(default=1.0)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgqueue_tenant"
        constraints = [
            models.CheckConstraint(condition=_WEIGHT_IN_RANGE, name="pgqueue_tenant_weight_range"),
        ]

    def __str__(self) -> str:
        return self.name


class QueueWeight(models.Model):
    """A tenant's weight in one queue, overriding ``Tenant.weight`` there."""

    queue = models.CharField(max_length=NAME_MAX)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, db_column="tenant", related_name="queue_weights"
    )
    weight = models.FloatField()

    class Meta:
        db_table = "pgqueue_queue_weight"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "queue"], name="pgqueue_queue_weight_uniq"),
            models.CheckConstraint(
                condition=_WEIGHT_IN_RANGE, name="pgqueue_queue_weight_weight_range"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} in {self.queue}: {self.weight}"


class FairClock(models.Model):
    """The virtual clock of one tenant in one queue at one priority level.

    Each priority level of a queue is its own fair-queuing system (priority orders strictly
    before fairness), so a tenant's clock is kept per (queue, priority). ``vtime`` is the
    virtual time of the tenant's most recently queued job there. See ``pgqueue.fairness``.
    """

    queue = models.CharField(max_length=NAME_MAX)
    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_column="tenant",
        db_index=False,
        related_name="+",
    )
    priority = models.SmallIntegerField()
    vtime = models.FloatField(default=0.0)

    class Meta:
        db_table = "pgqueue_fair_clock"
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "tenant", "priority"], name="pgqueue_fair_clock_uniq"
            ),
        ]
        indexes = [
            # "Where is this priority level's clock?" when it has no queued job: max(vtime).
            models.Index(fields=["queue", "priority", "vtime"], name="pgqueue_fair_clock_level"),
            # "How many queues does this tenant have clocks in?" (MAX_QUEUES_PER_TENANT),
            # asked only by an enqueue into a queue new to the tenant: an index-only range.
            models.Index(fields=["tenant", "queue"], name="pgqueue_fair_clock_tenant"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} in {self.queue} at priority {self.priority}: {self.vtime}"


#: The statuses of a job that has not ended.
LIVE_STATUSES = ("waiting", "scheduled", "queued", "running")
#: The statuses of a job that has ended.
FINISHED_STATUSES = ("done", "dead", "cancelled")


class Workflow(models.Model):
    """Jobs of one tenant enqueued together, some waiting for others (pgqueue.workflows).

    Its status is read from its jobs' (at most PGQUEUE["MAX_WORKFLOW_JOBS"] of them); it
    is deleted with its last job when retention prunes them.
    """

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_column="tenant",
        db_index=False,
        related_name="workflows",
    )
    name = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgqueue_workflow"
        indexes = [
            # A tenant's workflows newest first (GET /workflows, the admin's list).
            models.Index(fields=["tenant", "id"], name="pgqueue_workflow_tenant_id"),
        ]

    def __str__(self) -> str:
        return f"workflow #{self.id} {self.name}".rstrip()


class Job(models.Model):
    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=NAME_MAX)
    # The enqueue statement creates the tenant row itself; a foreign-key constraint would
    # add a per-row check to every enqueue, so none is declared in the database.
    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_column="tenant",
        db_index=False,
        related_name="jobs",
    )
    task = models.CharField(max_length=200)
    payload = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices)
    priority = models.SmallIntegerField(default=0)
    vtime = models.FloatField(null=True, blank=True)
    charge = models.FloatField(null=True, blank=True, help_text="run time charged, in seconds")
    attempts = models.IntegerField(default=0)
    max_attempts = models.IntegerField(default=5)
    run_at = models.DateTimeField(db_default=Now())
    lease_owner = models.CharField(max_length=NAME_MAX * 2, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    # The latest attempt's times: when a worker claimed it (the database's clock), and when
    # its handler began and ended (taken by the worker, carried with the outcome; a running
    # job's start is written by its worker's heartbeat). See pgqueue.worker.clock.
    claimed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Seconds an attempt may run from its handler's start (NULL: no limit); see
    # pgqueue.timeouts.
    timeout_seconds = models.FloatField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)  # running: asked to stop
    # Queued behind a tenant's limits (pgqueue.limits): out of the claim index. NULL while
    # it waits for its concurrency key (key_state 'new' or 'waiting'): out of both the
    # claim index and pgqueue_job_gated until KEY_SETTLE admits it.
    gated = models.BooleanField(default=False, db_default=False, null=True)
    # At most key_max_running jobs of one concurrency_key hold a slot at once (pgqueue.key_models).
    concurrency_key = models.CharField(max_length=KEY_MAX_LENGTH, null=True, blank=True)
    key_max_running = models.IntegerField(null=True, blank=True)
    key_state = models.CharField(
        max_length=8, choices=KeyState.choices, default="", db_default="", blank=True
    )
    # While running: the pgqueue_limit rows it is counted in (each exit decrements them).
    limit_ids = BigIntArrayField(null=True, blank=True)
    # Leases lost before the handler's start was recorded (its worker crashed or stalled
    # while the job waited, claimed ahead, or within about a second of its start): each
    # gave the job back without spending an attempt, but the PGQUEUE["MAX_LOST_CLAIMS"]-th
    # makes it dead (JOB_REAP_EXPIRED). A retry starts it from 0 again.
    lost_claims = models.IntegerField(
        default=0,
        db_default=0,
        help_text="leases lost before its start was recorded, not counted as attempts",
    )
    # Times its handler snoozed it (pgqueue.Retry), each without spending an attempt; past
    # PGQUEUE["MAX_SNOOZES"] a snooze counts as a failed attempt (JOB_FAIL_MANY). A retry
    # starts it from 0 again.
    snoozes = models.IntegerField(
        default=0, db_default=0, help_text="snoozes taken (pgqueue.Retry), not attempts"
    )
    # Workflows (pgqueue.workflows): the workflow it belongs to and its step's name there;
    # whether it runs when a dependency ends dead or cancelled (else it is cancelled); and
    # the dependency whose end cancelled it (retrying that one makes it wait again).
    # No foreign-key constraint on workflow_id: as for tenant, every enqueue would pay for
    # a per-row check.
    workflow = models.ForeignKey(
        Workflow,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        null=True,
        blank=True,
        related_name="jobs",
    )
    step = models.CharField(max_length=NAME_MAX, null=True, blank=True)
    run_on_upstream_failure = models.BooleanField(default=False, db_default=False)
    failed_upstream_id = models.BigIntegerField(
        null=True, blank=True, help_text="the dependency whose end cancelled this job"
    )
    # The W3C trace context of the code that enqueued it (pgqueue.tracing): the worker runs
    # each attempt in a span linked to it. NULL when OpenTelemetry is absent or no span was
    # current. Both bounded by the W3C Trace Context limits (55 and 512 characters).
    traceparent = models.CharField(
        max_length=55,
        null=True,
        blank=True,
        help_text="the W3C trace context it was enqueued in: its attempts' spans are children",
    )
    tracestate = models.CharField(max_length=512, null=True, blank=True)
    # What its handler reported while it ran (job.progress(), job.output()), written by its
    # worker's heartbeat rounds (JOB_HEARTBEAT_MANY): {"done", "total", "note", "at"}, and
    # the latest output. A new attempt's first report replaces them; an operator's retry
    # clears them (JOB_RETRY_MANY).
    progress = models.JSONField(
        null=True, blank=True, help_text="the latest progress its handler reported"
    )
    output = models.JSONField(
        null=True, blank=True, help_text="the latest output its handler reported"
    )

    class Meta:
        db_table = "pgqueue_job"
        indexes = [
            # JOB_CLAIM: runnable jobs in claim order, and nothing else.
            models.Index(
                fields=["queue", "-priority", "vtime", "id"],
                condition=Q(status="queued", gated=False),
                name="pgqueue_job_claim",
            ),
            # JOB_CLAIM's gated part: each limited (queue, tenant)'s jobs in claim order.
            models.Index(
                fields=["queue", "tenant", "-priority", "vtime", "id"],
                condition=Q(status="queued", gated=True),
                name="pgqueue_job_gated",
            ),
            # KEY_SETTLE: keyed jobs not yet admitted, oldest first; the waiting jobs of
            # one key, oldest first.
            models.Index(
                fields=["id"],
                condition=Q(status="queued", key_state="new"),
                name="pgqueue_job_key_new",
            ),
            models.Index(
                fields=["concurrency_key", "id"],
                condition=Q(status="queued", key_state="waiting"),
                name="pgqueue_job_key_waiting",
            ),
            # JOB_PROMOTE_DUE: scheduled jobs by when they become runnable.
            models.Index(
                fields=["run_at"], condition=Q(status="scheduled"), name="pgqueue_job_scheduled"
            ),
            # JOB_PROMOTE_DUE: the levels (queue, tenant, priority) with scheduled jobs, by a
            # skip scan, and each level's due jobs in run_at order.
            models.Index(
                fields=["queue", "tenant", "priority", "run_at"],
                condition=Q(status="scheduled"),
                name="pgqueue_job_scheduled_level",
            ),
            # Per-tenant counts (the API's /tenants, the admin's tenant list).
            models.Index(fields=["tenant", "status"], name="pgqueue_job_tenant_status"),
            # One tenant's jobs newest first: GET /jobs of a tenant key or ?tenant= examines
            # a window of them (pages.window_edge), however few the tenant's share is.
            models.Index(fields=["tenant", "id"], name="pgqueue_job_tenant_id"),
            # Bounded counts of finished jobs by queue (reads.job_counts: at most
            # FINISHED_COUNT_CAP + 1 entries per queue and status) and the skip scan of the
            # queues that have any. Finished rows only: enqueue and claim never write it.
            models.Index(
                fields=["queue", "status"],
                condition=Q(status__in=["done", "dead", "cancelled"]),
                name="pgqueue_job_finished_queue",
            ),
            # JOB_REAP_EXPIRED: running jobs by lease expiry.
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(status="running"),
                name="pgqueue_job_lease",
            ),
            # JOB_SETTLE_WAITING's sweep: waiting jobs in id order.
            models.Index(fields=["id"], condition=Q(status="waiting"), name="pgqueue_job_waiting"),
            # A workflow's jobs (its page, its cancel), and whether any is still live
            # (JOB_PRUNE_FINISHED keeps a workflow's jobs until none is).
            models.Index(
                fields=["workflow", "id"],
                condition=Q(workflow__isnull=False),
                name="pgqueue_job_workflow",
            ),
            models.Index(
                fields=["workflow"],
                condition=Q(workflow__isnull=False, status__in=LIVE_STATUSES),
                name="pgqueue_job_workflow_live",
            ),
            # JOB_PRUNE_FINISHED: finished jobs of one status, oldest first.
            models.Index(
                fields=["status", "finished_at"],
                condition=Q(status__in=["done", "dead", "cancelled"]),
                name="pgqueue_job_finished",
            ),
        ]
        constraints = [
            # Idempotency keys are unique per tenant; JOB_ENQUEUE's ON CONFLICT names it.
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="pgqueue_job_idempotency",
            ),
            models.CheckConstraint(
                condition=Q(status__in=Status.values), name="pgqueue_job_status_valid"
            ),
            # A step's name is unique in its workflow (upstream results are read by it).
            models.UniqueConstraint(
                fields=["workflow", "step"],
                condition=Q(workflow__isnull=False, step__isnull=False),
                name="pgqueue_job_workflow_step",
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=-100, priority__lte=100),
                name="pgqueue_job_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1, max_attempts__lte=100),
                name="pgqueue_job_max_attempts_range",
            ),
            models.CheckConstraint(
                condition=Q(attempts__gte=0, attempts__lte=models.F("max_attempts")),
                name="pgqueue_job_attempts_range",
            ),
            models.CheckConstraint(
                condition=~Q(status="queued") | Q(vtime__isnull=False),
                name="pgqueue_job_queued_has_vtime",
            ),
            models.CheckConstraint(
                condition=~Q(status="running")
                | Q(lease_owner__isnull=False, lease_expires_at__isnull=False),
                name="pgqueue_job_running_has_lease",
            ),
            # A job with a key has its cap; one without has no key state.
            models.CheckConstraint(
                condition=Q(
                    concurrency_key__isnull=True, key_max_running__isnull=True, key_state=""
                )
                | Q(
                    concurrency_key__isnull=False,
                    key_max_running__gte=1,
                    key_max_running__lte=KEY_MAX_RUNNING_BOUND,
                ),
                name="pgqueue_job_key_valid",
            ),
            models.CheckConstraint(
                condition=Q(key_state__in=KeyState.values), name="pgqueue_job_key_state_valid"
            ),
            # Out of both claim indexes exactly while it waits for its key.
            models.CheckConstraint(
                condition=Q(gated__isnull=True, key_state__in=["new", "waiting"])
                | (Q(gated__isnull=False) & ~Q(key_state__in=["new", "waiting"])),
                name="pgqueue_job_gated_unless_key_waits",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.id} {self.task} ({self.status})"

    def wait(self, timeout: float | dt.timedelta | None = None) -> Any:
        """Wait for this job to end and return its result: ``pgqueue.result(self.id,
        timeout)`` on the database this Job was read from (or enqueued in). Raises
        ``JobFailed`` (dead or cancelled), ``ResultTimeout``, or ``JobNotCommitted`` when
        called inside the transaction that enqueued the job, which no worker can see yet.
        The Job itself is not refreshed (``refresh_from_db()`` reads its final row)."""
        from .results import result

        return result(self.pk, timeout, using=self._state.db)


#: A job's fields as the HTTP API (JobSerializer) and the commands' --json show them, in
#: their order: one list for both.
JOB_FIELDS = (
    "id",
    "task",
    "tenant",
    "queue",
    "status",
    "priority",
    "payload",
    "attempts",
    "max_attempts",
    "lost_claims",
    "run_at",
    "created_at",
    "claimed_at",
    "started_at",
    "finished_at",
    "last_error",
    "result",
    "progress",
    "output",
    "idempotency_key",
    "timeout_seconds",
    "cancel_requested_at",
    "concurrency_key",
    "key_max_running",
    "workflow",
    "step",
    "traceparent",
)


class JobDependency(models.Model):
    """``job`` waits until ``upstream`` has ended (pgqueue.workflows). The upstream was
    enqueued before the job (its id is smaller), so the edges never form a cycle."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+", db_index=False)
    upstream = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+", db_index=False)

    class Meta:
        db_table = "pgqueue_job_dependency"
        constraints = [
            # A job's dependencies (JOB_SETTLE_WAITING's verdict, upstream results).
            models.UniqueConstraint(fields=["job", "upstream"], name="pgqueue_job_dep_uniq"),
            models.CheckConstraint(
                condition=Q(upstream__lt=models.F("job")), name="pgqueue_job_dep_older"
            ),
        ]
        indexes = [
            # A job's dependents (who waits for the job that just ended).
            models.Index(fields=["upstream", "job"], name="pgqueue_job_dep_upstream"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} after job {self.upstream_id}"


class Dashboard(Job):
    """The operations dashboard's entry in the admin (no table of its own)."""

    class Meta:
        proxy = True
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"


class JobAttempt(models.Model):
    """One finished attempt of a job: who ran it, when, and how it ended."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="history")
    attempt = models.IntegerField()
    worker = models.CharField(max_length=NAME_MAX * 2)
    # When the worker claimed the job for this attempt; when its handler began (NULL: it
    # never did, or no worker saw it begin before the lease ran out) and ended (for an
    # attempt the worker or maintenance ended first: when it was ended).
    claimed_at = models.DateTimeField(null=True)
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(db_default=Now())
    # When the job became runnable for this attempt (its run_at then: the enqueue, the
    # scheduled time, the end of a retry's backoff, a workflow step's release): the wait
    # the tenant saw is started_at - due_at. NULL for attempts recorded before it existed.
    due_at = models.DateTimeField(null=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    error = models.TextField(null=True, blank=True)
    traceback = models.TextField(null=True, blank=True)

    class Meta:
        db_table = "pgqueue_job_attempt"
        ordering = ["job_id", "id"]
        indexes = [
            # Stats of the last minute (throughput, error rate, run time) read recent rows.
            models.Index(fields=["finished_at"], name="pgqueue_attempt_finished"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(outcome__in=Outcome.values), name="pgqueue_attempt_outcome_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt}: {self.outcome}"


#: Upper bounds (seconds) of the run-time histogram buckets of ``TaskStat``.
RUN_TIME_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    float("inf"),
)


class TaskStat(models.Model):
    """Running totals of finished attempts by task, outcome and run-time bucket.

    Maintenance folds new attempt rows into it (off the hot path), so /metrics can serve
    monotonic counters and a run-time histogram from a small table, identical in every
    server process.
    """

    task = models.CharField(max_length=200)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    le = models.FloatField(help_text="the bucket's upper bound, in seconds")
    count = models.BigIntegerField(default=0)
    seconds = models.FloatField(default=0.0)

    class Meta:
        db_table = "pgqueue_task_stat"
        constraints = [
            models.UniqueConstraint(fields=["task", "outcome", "le"], name="pgqueue_task_stat_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.task} {self.outcome} ≤{self.le}s: {self.count}"


class TenantStat(models.Model):
    """Running totals of started attempts by queue and tenant: the wait from runnable to the
    handler's start, and the run time, in the buckets of ``RUN_TIME_BUCKETS``.

    Maintenance folds new attempt rows into it with the per-task totals (same mark, same
    transaction). ``tenant`` is a tenant's name while the tenant holds one of its queue's
    ``PGQUEUE["METRICS_TENANT_SERIES"]`` places, else ``""`` ("other"): the rows, and so the
    series /metrics exports, stay bounded however many tenants there are. A tenant takes a
    free place when a fold meets it (the busiest of the fold first) and gives it up when
    idle for ``METRICS_TENANT_IDLE_SECONDS``; "other" only ever grows, so every exported
    series is a true counter.
    """

    queue = models.CharField(max_length=NAME_MAX)
    tenant = models.CharField(max_length=NAME_MAX, blank=True)
    kind = models.CharField(max_length=8, help_text="wait or run")
    le = models.FloatField(help_text="the bucket's upper bound, in seconds")
    count = models.BigIntegerField(default=0)
    seconds = models.FloatField(default=0.0)
    #: The last fold that added to the row: a tenant none of whose rows was added to for
    #: METRICS_TENANT_IDLE_SECONDS gives its series up (TENANT_STAT_RELEASE_IDLE).
    folded_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgqueue_tenant_stat"
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "tenant", "kind", "le"], name="pgqueue_tenant_stat_uniq"
            ),
            models.CheckConstraint(
                condition=Q(kind__in=["wait", "run"]), name="pgqueue_tenant_stat_kind_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.queue}/{self.tenant or '(other)'} {self.kind} ≤{self.le}s: {self.count}"


class StatMark(models.Model):
    """How far maintenance has folded attempt rows into TaskStat, and its next bound
    (pending_*: ids up to pending_attempt_id, once every xid below pending_xid ended)."""

    id = models.SmallIntegerField(primary_key=True, default=1)
    last_attempt_id = models.BigIntegerField(default=0)
    pending_attempt_id = models.BigIntegerField(null=True)
    pending_xid = models.BigIntegerField(null=True)

    class Meta:
        db_table = "pgqueue_stat_mark"

    def __str__(self) -> str:
        return f"attempts folded up to {self.last_attempt_id}"


class Worker(models.Model):
    """A running (or recently stopped) worker process, so operators can see who is alive."""

    id = models.CharField(primary_key=True, max_length=NAME_MAX * 2)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField(default=list)
    #: The task names it can run (a family as ``"<family>:*"``), at most
    #: ``store.WORKER_TASKS_MAX``;
    #: NULL when not recorded (a worker of an older version, or one serving more).
    tasks = models.JSONField(null=True, blank=True, default=None)
    concurrency = models.IntegerField()
    started_at = models.DateTimeField(db_default=Now())
    last_seen_at = models.DateTimeField(db_default=Now())
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pgqueue_worker"

    def __str__(self) -> str:
        return self.id


# The tables kept in modules of their own, exported here with the others.
from .apikey_models import ApiKey  # noqa: E402, F401  (registered with the app)
from .limit_models import Limit  # noqa: E402, F401  (registered with the app)
from .periodic_models import Missed, PeriodicSchedule  # noqa: E402, F401
