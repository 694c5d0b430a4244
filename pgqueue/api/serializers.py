"""What the API returns (and, for the OpenAPI schema, what it accepts)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..models import JOB_FIELDS, Job, Status
from ..services import MAX_BATCH, MAX_DELAY_SECONDS, MAX_WEIGHT, MIN_WEIGHT
from ..workflow_reads import MAX_NEIGHBOURS_SHOWN, neighbours
from ..workflows import ON_UPSTREAM_FAILURE

#: The one rule for run_at, in Python (services._run_at) and over HTTP.
RUN_AT_HELP = (
    "ISO-8601 with a UTC offset (2030-01-01T09:00:00Z, 2030-01-01T10:00:00+01:00); one "
    "without an offset is a 400, as a naive datetime is refused by pgqueue.enqueue; a "
    "moment in the past means now; not with delay_seconds"
)


#: The one rule for a job's timeout, in Python (pgqueue.timeouts) and over HTTP.
TIMEOUT_HELP = (
    "seconds one attempt may run, counted from its claim: above 0, at most "
    "PGQUEUE['MAX_TIMEOUT_SECONDS']; default the task's, then DEFAULT_TIMEOUT_SECONDS"
)

#: The one rule for a job's dependencies, in Python (pgqueue.enqueue) and over HTTP.
DEPENDS_ON_HELP = (
    "ids of jobs of the same tenant (that this API key could read) to wait for: the job "
    "stays waiting until every one has ended, then runs; at most "
    "PGQUEUE['MAX_DEPENDENCIES'] (1,000)"
)
ON_UPSTREAM_FAILURE_HELP = (
    "when a dependency ends dead or cancelled: cancel (default) this job too, or run it anyway"
)


class ErrorSerializer(serializers.Serializer):
    error = serializers.CharField(help_text="a short code, e.g. invalid, not_found, conflict")
    detail = serializers.CharField(help_text="what went wrong, for a person")
    fields = serializers.DictField(
        child=serializers.CharField(), required=False, help_text="field → reason"
    )


class ProgressSerializer(serializers.Serializer):
    """A running job's progress, as its handler last reported it (``job.progress()``)."""

    done = serializers.FloatField(help_text="how much is done (a number >= 0)")
    total = serializers.FloatField(
        allow_null=True, help_text="how much there is to do, or null when unknown"
    )
    note = serializers.CharField(
        allow_null=True, help_text="what the handler said of it, at most MAX_PROGRESS_NOTE_CHARS"
    )
    at = serializers.DateTimeField(help_text="when the handler reported it")


@extend_schema_field(ProgressSerializer)
class ProgressField(serializers.JSONField):
    """The progress column as stored (its numbers as the handler gave them: 3, not 3.0),
    described in the schema by ``ProgressSerializer``."""


class JobSerializer(serializers.ModelSerializer):
    """A job. A running job whose cancellation was requested shows the status "cancelling"
    (and its ``cancel_requested_at``) until its worker ends it: the table keeps it
    'running', which is what ``?status=running`` filters on."""

    tenant = serializers.CharField(source="tenant_id")
    status = serializers.ChoiceField(
        [*Status.values, "cancelling"],
        help_text="cancelling: running, asked to stop; waiting: for its dependencies to end",
    )
    # The column, never the row: a list of jobs reads no workflow.
    workflow = serializers.IntegerField(
        source="workflow_id",
        allow_null=True,
        read_only=True,
        help_text="the workflow it belongs to (GET /workflows/<id>), or null",
    )
    step = serializers.CharField(
        allow_null=True, read_only=True, help_text="its step's name in its workflow, or null"
    )
    progress = ProgressField(
        allow_null=True,
        read_only=True,
        help_text="the progress its handler last reported (written about once a second while "
        "it runs, and with its outcome), or null; a new attempt's first report replaces it, a "
        "retry clears it",
    )
    output = serializers.JSONField(
        allow_null=True,
        read_only=True,
        help_text="the output its handler last reported (job.output()), any JSON, at most "
        "PGQUEUE['MAX_OUTPUT_BYTES']; null when none",
    )

    def to_representation(self, instance: Any) -> Any:
        data = super().to_representation(instance)
        if data.get("status") == Status.RUNNING and instance.cancel_requested_at is not None:
            data["status"] = "cancelling"
        return data

    class Meta:
        model = Job
        fields = list(JOB_FIELDS)
        read_only_fields = fields


class AttemptSerializer(serializers.Serializer):
    attempt = serializers.IntegerField()
    worker = serializers.CharField()
    claimed_at = serializers.DateTimeField(
        allow_null=True, help_text="when the worker claimed the job for this attempt"
    )
    started_at = serializers.DateTimeField(
        allow_null=True,
        help_text="when the handler began; null if no worker recorded its start: with "
        "lease_expired, a claim given back without spending an attempt (the next entry has "
        "the same attempt number)",
    )
    finished_at = serializers.DateTimeField(
        help_text="when the handler ended, or when the worker or maintenance ended the attempt"
    )
    outcome = serializers.ChoiceField(["done", "failed", "lease_expired", "cancelled"])
    error = serializers.CharField(allow_null=True)
    traceback = serializers.CharField(allow_null=True)


class JobDetailSerializer(JobSerializer):
    history = AttemptSerializer(
        many=True,
        read_only=True,
        help_text="one entry per attempt, and per claim given back uncounted (lease_expired, "
        "started_at null)",
    )
    waiting_for = serializers.SerializerMethodField(
        help_text="why a queued or scheduled job waits: backoff, run_at, paused, tenant_cap, "
        "queue_cap, rate_limit or turn; null otherwise"
    )
    position = serializers.SerializerMethodField(
        help_text='with "turn": the jobs ahead of it, counted up to COUNT_CAP ("1000+"); '
        "null for a tenant key (they are every tenant's jobs)"
    )

    depends_on = serializers.SerializerMethodField(
        help_text=f"ids of the jobs it waits for (or waited for), at most {MAX_NEIGHBOURS_SHOWN}"
    )
    dependents = serializers.SerializerMethodField(
        help_text=f"ids of the jobs that wait for it, at most {MAX_NEIGHBOURS_SHOWN}"
    )

    class Meta(JobSerializer.Meta):
        fields = [
            *JobSerializer.Meta.fields,
            "history",
            "waiting_for",
            "position",
            "depends_on",
            "dependents",
        ]
        read_only_fields = fields

    def _neighbours(self, job: Job) -> dict[str, list[int]]:
        if not hasattr(job, "_neighbours"):  # one read for both fields
            job._neighbours = neighbours(job.id, using=job._state.db)
        return job._neighbours

    @extend_schema_field(serializers.ListField(child=serializers.IntegerField()))
    def get_depends_on(self, job: Job) -> list[int]:
        return self._neighbours(job)["depends_on"]

    @extend_schema_field(serializers.ListField(child=serializers.IntegerField()))
    def get_dependents(self, job: Job) -> list[int]:
        return self._neighbours(job)["dependents"]

    def _waiting(self, job: Job) -> dict:
        if not hasattr(job, "_waiting"):
            from ..limit_reads import waiting_for

            job._waiting = waiting_for(job, position=self.context.get("position", True))
        return job._waiting

    def get_waiting_for(self, job: Job) -> str | None:
        return self._waiting(job)["waiting_for"]

    def get_position(self, job: Job) -> str | None:
        return self._waiting(job)["position"]


class JobListItemSerializer(JobSerializer):
    """A job in GET /jobs: a payload, result or output larger than
    PGQUEUE["API_FIELD_BYTES"] is replaced by ``{"truncated": true, "bytes": N, "url": <the
    job>}``."""

    payload = serializers.JSONField(help_text="the payload, or the truncated marker")
    result = serializers.JSONField(allow_null=True, help_text="the result, or the truncated marker")
    output = serializers.JSONField(
        allow_null=True,
        read_only=True,
        help_text="the output its handler last reported, or the truncated marker; null when none",
    )

    class Meta(JobSerializer.Meta):
        pass


class JobListSerializer(serializers.Serializer):
    count = serializers.IntegerField(
        help_text="jobs matching: exact when the newest PGQUEUE['LIST_WINDOW'] jobs in reach "
        "are all of them and at most PGQUEUE['COUNT_CAP'] match, else an estimate"
    )
    count_is_estimate = serializers.BooleanField(
        help_text="count is the planner's estimate (more jobs match than COUNT_CAP, or more "
        "are in reach than LIST_WINDOW)"
    )
    next = serializers.URLField(allow_null=True, help_text="older jobs (a cursor link)")
    previous = serializers.URLField(allow_null=True, help_text="newer jobs (a cursor link)")
    results = JobListItemSerializer(
        many=True,
        help_text="newest first, at most limit, within PGQUEUE['API_PAGE_BYTES']; fewer, "
        "even none, while next is set when the page's window of PGQUEUE['LIST_WINDOW'] jobs "
        "held fewer matches",
    )


class EnqueueRequest(serializers.Serializer):
    """Documents POST /jobs; the view validates through the service layer."""

    FIELDS = {
        "task",
        "payload",
        "tenant",
        "queue",
        "priority",
        "idempotency_key",
        "max_attempts",
        "delay_seconds",
        "run_at",
        "timeout_seconds",
        "concurrency_key",
        "key_max_running",
        "depends_on",
        "on_upstream_failure",
    }
    task = serializers.CharField()
    payload = serializers.JSONField(required=False, help_text="any JSON; default {}")
    tenant = serializers.CharField(required=False, help_text="[A-Za-z0-9_.-]{1,64}")
    queue = serializers.CharField(required=False)
    priority = serializers.IntegerField(required=False, min_value=-100, max_value=100)
    idempotency_key = serializers.CharField(required=False, max_length=255)
    max_attempts = serializers.IntegerField(required=False, min_value=1, max_value=100)
    delay_seconds = serializers.FloatField(required=False, min_value=0, max_value=MAX_DELAY_SECONDS)
    run_at = serializers.DateTimeField(required=False, help_text=RUN_AT_HELP)
    timeout_seconds = serializers.FloatField(required=False, help_text=TIMEOUT_HELP)
    concurrency_key = serializers.CharField(
        required=False,
        max_length=128,
        help_text="at most key_max_running jobs of this key run at once, across every "
        "worker; with a cap of 1 they run one at a time in enqueue order",
    )
    key_max_running = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=10_000,
        help_text="the key's cap; default the task's, then DEFAULT_KEY_MAX_RUNNING (1)",
    )
    depends_on = serializers.ListField(
        child=serializers.IntegerField(min_value=1), required=False, help_text=DEPENDS_ON_HELP
    )
    on_upstream_failure = serializers.ChoiceField(
        list(ON_UPSTREAM_FAILURE), required=False, help_text=ON_UPSTREAM_FAILURE_HELP
    )


class BatchRequest(serializers.Serializer):
    FIELDS = {
        "task",
        "payloads",
        "tenant",
        "queue",
        "priority",
        "max_attempts",
        "delay_seconds",
        "run_at",
        "timeout_seconds",
        "concurrency_key",
        "concurrency_keys",
        "key_max_running",
        "depends_on",
        "on_upstream_failure",
    }
    task = serializers.CharField()
    payloads = serializers.ListField(
        child=serializers.JSONField(),
        max_length=MAX_BATCH,
        help_text=f"0 to {MAX_BATCH:,} payloads, one job each; an empty list enqueues nothing "
        "and answers 201 with no ids, as pgqueue.enqueue_many([]) returns []",
    )
    tenant = serializers.CharField(required=False)
    queue = serializers.CharField(required=False)
    priority = serializers.IntegerField(required=False, min_value=-100, max_value=100)
    max_attempts = serializers.IntegerField(required=False, min_value=1, max_value=100)
    delay_seconds = serializers.FloatField(required=False, min_value=0, max_value=MAX_DELAY_SECONDS)
    run_at = serializers.DateTimeField(required=False, help_text=RUN_AT_HELP)
    timeout_seconds = serializers.FloatField(required=False, help_text=TIMEOUT_HELP)
    concurrency_key = serializers.CharField(
        required=False,
        max_length=128,
        help_text="at most key_max_running jobs of this key run at once, across every "
        "worker; with a cap of 1 they run one at a time in enqueue order",
    )
    key_max_running = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=10_000,
        help_text="the key's cap; default the task's, then DEFAULT_KEY_MAX_RUNNING (1)",
    )
    concurrency_keys = serializers.ListField(
        child=serializers.CharField(allow_null=True, max_length=128),
        required=False,
        help_text="one key (or null: none) per payload, instead of concurrency_key",
    )
    depends_on = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        required=False,
        help_text=DEPENDS_ON_HELP + "; every job of the batch waits for them",
    )
    on_upstream_failure = serializers.ChoiceField(
        list(ON_UPSTREAM_FAILURE), required=False, help_text=ON_UPSTREAM_FAILURE_HELP
    )


class BatchResponse(serializers.Serializer):
    ids = serializers.ListField(child=serializers.IntegerField())
    count = serializers.IntegerField()


class TenantSerializer(serializers.Serializer):
    name = serializers.CharField()
    weight = serializers.FloatField()
    queue_weights = serializers.DictField(child=serializers.FloatField())
    backlog = serializers.IntegerField(help_text="queued + scheduled jobs")
    running = serializers.IntegerField()
    done = serializers.IntegerField(help_text="counted up to COUNT_CAP + 1 (see capped)")
    dead = serializers.IntegerField(help_text="counted up to COUNT_CAP + 1 (see capped)")
    capped = serializers.ListField(
        child=serializers.CharField(),
        help_text="the counts that stopped at COUNT_CAP: a lower bound, shown as N+",
    )
    created_at = serializers.DateTimeField()
    max_running = serializers.IntegerField(
        allow_null=True, help_text="most of its jobs running at once, in every queue"
    )
    rate_limit = serializers.CharField(allow_null=True, help_text='starts allowed, "N/s|m|h"')
    paused = serializers.BooleanField()
    queue_limits = serializers.DictField(
        child=serializers.DictField(), help_text="per-queue limits, on top of the tenant's"
    )


class QueueSerializer(serializers.Serializer):
    name = serializers.CharField()
    max_running = serializers.IntegerField(allow_null=True)
    rate_limit = serializers.CharField(allow_null=True)
    paused = serializers.BooleanField()
    running = serializers.IntegerField()


class QueueLimitsRequest(serializers.Serializer):
    max_running = serializers.IntegerField(
        required=False, allow_null=True, help_text="1..100000, or null for no cap"
    )
    rate_limit = serializers.CharField(
        required=False, allow_null=True, help_text='"N/s", "N/m" or "N/h", or null'
    )


class TenantListSerializer(serializers.Serializer):
    """GET /tenants: the same list shape as GET /jobs (its count always exact: tenants are a
    small table, so the list keeps limit and offset)."""

    count = serializers.IntegerField()
    count_is_estimate = serializers.BooleanField(help_text="always false here")
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = TenantSerializer(many=True)


class WeightRequest(QueueLimitsRequest):
    weight = serializers.FloatField(
        required=False,
        min_value=MIN_WEIGHT,
        max_value=MAX_WEIGHT,
        help_text=f"{MIN_WEIGHT:g} to {MAX_WEIGHT:g}",
    )
    queue = serializers.CharField(required=False, help_text="override in this queue only")


class StatsSerializer(serializers.Serializer):
    queues = serializers.DictField(
        child=serializers.DictField(child=serializers.IntegerField()),
        help_text=f"queue → status ({', '.join(Status.values)}) → count; the live statuses "
        "exact, done, dead and cancelled counted up to count_cap + 1",
    )
    capped = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        help_text="queue → the statuses whose count stopped at count_cap (a lower bound)",
    )
    count_cap = serializers.IntegerField(help_text="PGQUEUE['COUNT_CAP']")
    throughput_per_s_60s = serializers.FloatField()
    error_rate_60s = serializers.FloatField()
    mean_run_seconds_60s = serializers.FloatField(allow_null=True)
    workers_alive = serializers.IntegerField()
    dead = serializers.IntegerField()
    dead_capped = serializers.BooleanField(help_text="dead is a lower bound")


# -- workflows ----------------------------------------------------------------------------


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "description": "the name of a step of this workflow"},
            {"type": "integer", "minimum": 1, "description": "the id of a job of the tenant"},
        ]
    }
)
class StepRefField(serializers.JSONField):
    """A dependency of a workflow's step: a step's name (text) or a job's id (a number)."""


class WorkflowStepRequest(serializers.Serializer):
    """One job of POST /workflows: POST /jobs' fields (no tenant, no idempotency_key), a
    name, and what it waits for."""

    FIELDS = {
        "name",
        "task",
        "payload",
        "depends_on",
        "on_upstream_failure",
        "queue",
        "priority",
        "max_attempts",
        "delay_seconds",
        "run_at",
        "timeout_seconds",
        "concurrency_key",
        "key_max_running",
    }
    name = serializers.CharField(
        required=False,
        help_text="[A-Za-z0-9_.-]{1,64}, unique in the workflow; default its position "
        '("0", "1", ...)',
    )
    task = serializers.CharField()
    payload = serializers.JSONField(required=False, help_text="any JSON; default {}")
    depends_on = serializers.ListField(
        child=StepRefField(),
        required=False,
        help_text="what it waits for: names of steps of this workflow (strings) and ids of "
        "jobs of the tenant (integers), at most PGQUEUE['MAX_DEPENDENCIES'] (1,000)",
    )
    on_upstream_failure = serializers.ChoiceField(
        list(ON_UPSTREAM_FAILURE), required=False, help_text=ON_UPSTREAM_FAILURE_HELP
    )
    queue = serializers.CharField(required=False, help_text="default the workflow's queue")
    priority = serializers.IntegerField(
        required=False, min_value=-100, max_value=100, help_text="default the workflow's"
    )
    max_attempts = serializers.IntegerField(required=False, min_value=1, max_value=100)
    delay_seconds = serializers.FloatField(
        required=False,
        min_value=0,
        max_value=MAX_DELAY_SECONDS,
        help_text=(
            "counted from the enqueue: the step runs at the later of that and its "
            "dependencies' end; not with run_at"
        ),
    )
    run_at = serializers.DateTimeField(required=False, help_text=RUN_AT_HELP)
    timeout_seconds = serializers.FloatField(required=False, help_text=TIMEOUT_HELP)
    concurrency_key = serializers.CharField(required=False, max_length=128)
    key_max_running = serializers.IntegerField(required=False, min_value=1, max_value=10_000)


class WorkflowCreate(serializers.Serializer):
    """POST /workflows; the view checks each job as POST /jobs does, then the graph is
    checked and enqueued by pgqueue.Workflow, in one transaction."""

    FIELDS = {"name", "tenant", "queue", "priority", "jobs"}
    name = serializers.CharField(
        required=False, allow_blank=True, max_length=200, help_text="default empty"
    )
    tenant = serializers.CharField(
        required=False, help_text="as in POST /jobs: a tenant key's own tenant by default"
    )
    queue = serializers.CharField(required=False, help_text="every job's default queue")
    priority = serializers.IntegerField(
        required=False, min_value=-100, max_value=100, help_text="every job's default priority"
    )
    jobs = WorkflowStepRequest(
        many=True,
        min_length=1,
        help_text="1 to PGQUEUE['MAX_WORKFLOW_JOBS'] (10,000) jobs, in any order: a "
        "dependency may come after its dependent",
    )


class WorkflowJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    step = serializers.CharField(allow_null=True)
    task = serializers.CharField()
    # Text, not an enum: the schema's one "status" enum is a job's (JobSerializer's).
    status = serializers.CharField(help_text=", ".join(Status.values))
    queue = serializers.CharField()
    priority = serializers.IntegerField()
    attempts = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField(allow_null=True)
    on_upstream_failure = serializers.ChoiceField(list(ON_UPSTREAM_FAILURE))
    failed_upstream_id = serializers.IntegerField(
        allow_null=True, help_text="the dependency whose end cancelled it"
    )
    depends_on = serializers.ListField(
        child=serializers.IntegerField(), help_text="ids of the jobs it waits (or waited) for"
    )


class WorkflowSerializer(serializers.Serializer):
    """A workflow with its jobs (dependencies first) and their dependencies."""

    id = serializers.IntegerField()
    tenant = serializers.CharField()
    name = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    status = serializers.CharField(
        help_text="running, done, failed or cancelled: "
        "running while any job is unfinished; then done when all are done, failed "
        "when any ended dead, else cancelled",
    )
    counts = serializers.DictField(
        child=serializers.IntegerField(), help_text="status → how many of its jobs"
    )
    edges_truncated = serializers.BooleanField(
        help_text="the jobs' depends_on lists stop short (a graph of more than 50,000 edges)"
    )
    jobs = WorkflowJobSerializer(many=True)


class WorkflowSummarySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    tenant = serializers.CharField()
    name = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    live = serializers.BooleanField(help_text="a job of it is still unfinished")


class WorkflowListSerializer(serializers.Serializer):
    next = serializers.URLField(allow_null=True, help_text="older workflows (a cursor link)")
    results = WorkflowSummarySerializer(many=True, help_text="newest first, at most limit")


class WorkflowCancelSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    cancelled = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="jobs cancelled now (waiting, scheduled, queued)",
    )
    cancelling = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="running jobs asked to stop: their workers end them cancelled",
    )
