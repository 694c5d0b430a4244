"""The ``settings.PGQUEUE`` namespace.

Mirrors DRF's ``api_settings``: one object with documented defaults, read lazily and
reloaded when ``override_settings`` changes ``PGQUEUE`` so tests see the new values.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

#: Every setting and its default; the comments are for pgqueue's engineers. What each means
#: to a user is HELP below, from which the settings reference is generated.
DEFAULTS: dict[str, Any] = {
    # The database alias (a DATABASES key) that holds the queue's tables: every read and
    # write of pgqueue (services, API, admin, CLI, worker, maintenance, metrics) goes there.
    # Another alias than "default" needs pgqueue.router.QueueRouter in DATABASE_ROUTERS
    # (a system check says so), and enqueues are no longer in the app's transactions.
    "DATABASE": "default",
    # Seconds a claimed job's lease lasts. A worker that neither finishes nor heartbeats
    # within it is presumed dead and the job is recovered: counting as an attempt once its
    # start was recorded (within about a second of it), else given back without one.
    "LEASE_SECONDS": 30.0,
    # Leases a job may lose before its start is recorded (its worker crashed or stalled
    # while the job waited for a thread, or within about a second of its start): each such
    # loss gives it back without spending an attempt, so a job that only shared a process
    # with a crashing handler pays nothing, but the MAX_LOST_CLAIMS-th makes it dead, so
    # one whose handler kills its process at once cannot loop for ever. A retry starts the
    # count again.
    "MAX_LOST_CLAIMS": 10,
    # Seconds between heartbeats; None means LEASE_SECONDS / 3.
    "HEARTBEAT_SECONDS": None,
    # Retry backoff: random(0, min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (attempt - 1))) seconds.
    "BACKOFF_BASE": 1.0,
    "BACKOFF_CAP": 300.0,
    # The longest a task's own backoff, or a handler's pgqueue.Retry(in_=...), may put a job off.
    "MAX_RETRY_DELAY_SECONDS": 7 * 86400.0,
    # Snoozes (pgqueue.Retry) one job may take without spending an attempt.
    "MAX_SNOOZES": 100,
    # Workflows (pgqueue.workflows): jobs in one workflow, and dependencies of one job.
    "MAX_WORKFLOW_JOBS": 10_000,
    "MAX_DEPENDENCIES": 1_000,
    # Bytes of its dependencies' results, together, a handler may read (job.upstream).
    "MAX_UPSTREAM_RESULT_BYTES": 16 * 1024 * 1024,
    # Waiting jobs maintenance re-examines a pass, in id order, round and round: the
    # repair for a dependent whose settling a crash interrupted.
    "WAITING_SWEEP_BATCH": 500,
    # Attempts a job gets when neither the task nor the enqueue call says otherwise (1..100).
    "DEFAULT_MAX_ATTEMPTS": 5,
    "DEFAULT_QUEUE": "default",
    "DEFAULT_TENANT": "default",
    # Seconds one attempt of a job may run, counted from its handler's start, when neither
    # the enqueue nor the task says; None: no timeout. Past it the attempt fails ("timed
    # out after N s") and is retried or dead; the handler's thread stays busy until it
    # returns. A job waiting for a thread (claimed ahead) cannot time out.
    "DEFAULT_TIMEOUT_SECONDS": None,
    # The largest timeout an enqueue, a task or the setting above may give, in seconds.
    "MAX_TIMEOUT_SECONDS": 24 * 3600.0,
    # Seconds between fallback polls of an idle worker (LISTEN/NOTIFY wakes it sooner).
    "POLL_SECONDS": 1.0,
    # Most jobs one claim statement takes (a worker never claims more than its free slots).
    "BATCH_SIZE": 50,
    # Seconds between maintenance runs (reaping expired leases, promoting due jobs).
    "MAINTENANCE_SECONDS": 1.0,
    # Most rows one maintenance statement reaps or promotes.
    "MAINTENANCE_BATCH_SIZE": 1000,
    # "fair" (start-time fair queuing across tenants) or "fifo" (arrival order). FIFO
    # exists so benchmarks and tests can show what fairness buys; it applies to jobs
    # that become runnable after the change.
    "ORDERING": "fair",
    # What a tenant's fair share is a share of: "jobs" (starts: each job advances its
    # tenant's virtual clock by 1 / weight) or "time" (worker time: each job advances it by
    # its run time / weight, estimated from its task's mean when it becomes runnable and
    # corrected by maintenance once it has run). Applies to jobs that become runnable
    # after the change. See docs/explanation/fairness.md.
    "FAIRNESS": "jobs",
    # With FAIRNESS = "time": seconds charged for a job of a task with no finished attempt
    # yet, and the least any job is charged (so that no-op jobs are not free).
    "FAIRNESS_DEFAULT_SECONDS": 0.1,
    "FAIRNESS_MIN_SECONDS": 0.001,
    # Largest accepted payload, in bytes of its JSON text.
    "MAX_PAYLOAD_BYTES": 256 * 1024,
    # Deepest nesting of arrays and objects a payload or a handler's result may have: what
    # every page that shows a job can decode (a result deeper fails its attempt).
    "MAX_JSON_DEPTH": 100,
    # Largest result a handler may return, in bytes of its JSON text; a larger one makes
    # the attempt fail with "result not storable: ...".
    "MAX_RESULT_BYTES": 1024 * 1024,
    # Largest output a handler may report while it runs (job.output(value)), in bytes of
    # its JSON text; a larger one raises InvalidJob in the handler and is not kept.
    "MAX_OUTPUT_BYTES": 64 * 1024,
    # Longest note of a progress report (job.progress(..., note=...)), in characters: a
    # longer one is cut to this.
    "MAX_PROGRESS_NOTE_CHARS": 200,
    # Times a worker tries to reach the database at start-up, with backoff (0.1 s doubling
    # to 5 s, jittered: about 20 s in all at the default), before it exits with status 1
    # and the reason on one line of stderr. Once running, it retries for as long as it takes.
    "CONNECT_ATTEMPTS": 10,
    # Seconds a job waits in 'scheduled' after a worker that has no handler for its task
    # claimed it and gave it back (the attempt not counted), so that such workers do not
    # take it again and again while one that has the task can.
    "UNKNOWN_TASK_DELAY_SECONDS": 60.0,
    # The LISTEN/NOTIFY channel workers wake on.
    "NOTIFY_CHANNEL": "pgqueue",
    # Seconds between the safety re-reads of a job that pgqueue.result / Job.wait waits
    # for. A notification on the channel pgqueue_finished (sent by the statement that ends
    # the job, on commit) wakes the wait at once; the re-read only finds an end whose
    # notification was missed, so it can be slow: it is one primary-key read per waiter.
    "RESULT_RECHECK_SECONDS": 5.0,
    # Modules looked up in every installed app for @pgqueue.task definitions.
    "TASK_MODULES": ["tasks"],
    # Serve /metrics and /stats without credentials.
    "METRICS_PUBLIC": False,
    # Per-key rate limit of the HTTP API, e.g. "100/s" or "5000/hour"; None: no limit.
    "API_RATE_LIMIT": None,
    # Failed API-key authentications allowed per client address, in DRF's rate form
    # ("20/min", "100/hour"); past it, every Bearer request from that address is a 429
    # with Retry-After until the window moves on, and no key is looked up. None: no limit.
    "AUTH_FAILURE_RATE": "20/min",
    # How many reverse proxies in front of the API append the client's address to
    # X-Forwarded-For. 0: the client address (of the throttles above) is the connection's
    # (REMOTE_ADDR) and X-Forwarded-For is ignored, since any client can write it. N: the
    # address N entries from the right of X-Forwarded-For, the one the outermost of your
    # proxies saw.
    "API_TRUSTED_PROXIES": 0,
    # Most jobs a worker process claims beyond its idle slots (runworker --prefetch). They
    # wait, leased and heartbeated but not started, for a thread, so that a turn of the
    # loop records and claims for many jobs while the handlers run; a stopping worker
    # gives them back. The worker claims ahead only what its threads start in
    # PREFETCH_SECONDS at the jobs' recent mean run time (none when jobs are longer than
    # that; one per thread until a job has finished), counting only the threads not on a
    # job that has run PREFETCH_HOLD_SECONDS or longer (pgqueue/worker/lookahead.py).
    "PREFETCH": 32,
    "PREFETCH_SECONDS": 0.005,
    # Longest a job claimed ahead waits for a thread: past it, the worker gives back every
    # job it holds unstarted (queued again at its place, the attempt not counted, its limit
    # slots returned, the queue's workers woken) and claims none ahead until a thread is
    # free. So a job never waits longer than this in a busy worker while another could
    # run it.
    "PREFETCH_HOLD_SECONDS": 0.05,
    # Periodic schedules declared in settings, besides those of @pgqueue.periodic: dicts
    # with "task" and either "cron" or "every" (an interval: seconds or a timedelta), and
    # optionally "name" (default: the task's), "tenant", "queue", "priority",
    # "max_attempts", "payload", "missed" ("run_once" or "skip") and "timezone" (cron only;
    # default: TIME_ZONE). Synced to pgqueue_periodic when a worker starts.
    "PERIODIC": [],
    # The shortest interval (every=) a periodic schedule may have, in whole seconds (at
    # least 1): checked when a schedule is declared, synced, created or edited. A schedule
    # fires at most once per maintenance pass (MAINTENANCE_SECONDS), whatever its interval.
    "PERIODIC_MIN_INTERVAL_SECONDS": 1,
    # How long finished jobs are kept, per status: seconds or a datetime.timedelta after
    # finished_at; None keeps that status forever. A dict naming only some statuses
    # overrides those and keeps the defaults of the others. A job's attempt rows and its
    # idempotency key go with it (the key can be used again once its job is pruned).
    "RETENTION": {"done": 7 * 86400, "cancelled": 7 * 86400, "dead": 30 * 86400},
    # Most jobs one prune statement deletes (with their attempt rows).
    "PRUNE_BATCH_SIZE": 1000,
    # Most prune statements per maintenance pass, each its own short transaction.
    "PRUNE_BATCHES_PER_PASS": 4,
    # The task names the HTTP API may enqueue. None: every @pgqueue.task (never the
    # django.tasks family). A list restricts it; an entry ending in "*" is a prefix
    # ("reports.*", or "*" for every @pgqueue.task) that never matches a django.tasks name:
    # a Django Task is opened to the API only by its full name, "django.tasks:<path>".
    "API_TASKS": None,
    # The highest priority a tenant key may set (-100..100) unless its own max_priority
    # says otherwise: priority orders before fairness, so it is an operator's lever.
    "TENANT_MAX_PRIORITY": 0,
    # The most queues one tenant may have jobs in at once (None: no bound). A queue counts
    # from the tenant's first job there until its jobs have finished and maintenance has
    # released the tenant's fair clocks there (pgqueue.fair_store.prune_fair_clocks); an
    # enqueue into one more is refused (TooManyQueues, a 400 naming "queue" over HTTP).
    # Each queue a tenant uses is a series of /metrics and a row of the dashboard, and
    # names are the caller's to choose. A retry over the HTTP API is refused as an enqueue
    # would be; periodic schedules (the project's), operators' retries (admin, CLI,
    # services.retry_jobs) and promotions of jobs already admitted are not bounded.
    "MAX_QUEUES_PER_TENANT": 100,
    # Counts that grow with the history (finished jobs by queue or tenant, a filtered
    # GET /jobs) are exact up to this many; past it they read "N+" (or, for GET /jobs, an
    # estimate flagged count_is_estimate), so no page or scrape reads every job.
    "COUNT_CAP": 1000,
    # Most jobs one page of GET /jobs (or one `manage.py pgqueue jobs`) examines: the
    # newest this many in the key's reach (every job, or one tenant's) past the cursor,
    # filtered. A filter that matches none of them gives a short or empty page whose
    # "next" goes on below them, so no filter makes a request read the whole history.
    "LIST_WINDOW": 10_000,
    # Most bytes of JSON one page of GET /jobs carries; the page ends early (its "next"
    # goes on from there) rather than go past it. One job is always returned.
    "API_PAGE_BYTES": 1024 * 1024,
    # A payload or result larger than this many bytes of JSON is shown in GET /jobs as
    # {"truncated": true, "bytes": N, "url": ...}; GET /jobs/<id> returns it whole.
    "API_FIELD_BYTES": 16 * 1024,
    # Seconds between maintenance's recounts of the limit rows' running counters (a
    # safety net: the claim and every exit from running keep them exact; a recount reads
    # every limit row and locks only those whose counter drifted).
    "LIMITS_RECOUNT_SECONDS": 60.0,
    # Most queued jobs one limit change gates or ungates in one transaction; it goes on in
    # batches of this many until none is left.
    "LIMITS_GATE_BATCH": 10_000,
    # Most limit rows (scopes with a cap, a rate limit or a pause) /metrics exports as
    # pgqueue_limit_* series; past it the queues' rows come first and
    # pgqueue_limit_scopes still counts them all.
    "METRICS_LIMIT_SERIES": 500,
    # Concurrency keys (docs/guide/concurrency-keys.md). Most new keyed jobs one admission (a
    # worker's turn after a keyed enqueue, or a maintenance pass) examines; it goes on in
    # further turns while it finds this many.
    "KEY_ADMIT_BATCH": 100,
    # Whether a dead job keeps its concurrency key's slot (True: the key's later jobs wait
    # until an operator retries or cancels it; a sequence stops at its first dead job) or
    # gives it back (False, the default: the next job of the key runs).
    "DEAD_JOB_HOLDS_KEY": False,
    # The cap per key (1..10,000) of a job with a concurrency key when neither its task nor
    # the enqueue says: 1 makes the key a sequence.
    "DEFAULT_KEY_MAX_RUNNING": 1,
    # Seeing inside: docs/how-to/tracing.md, docs/how-to/health-probes.md, docs/how-to/operate.md.
    # OpenTelemetry (pgqueue.tracing): when opentelemetry-api is installed and this is True,
    # an enqueue runs in a producer span whose context the job records, and the worker runs
    # each attempt in a span that is its child. False turns both off whatever is installed.
    "TRACING": True,
    # The format of runworker's log lines when the project configured no logging handler:
    # "logfmt" (key=value) or "json" (one object a line, with trace and span ids when a
    # span is current).
    "LOG_FORMAT": "logfmt",
    # Where each worker process writes its health file for `manage.py pgqueue healthcheck`
    # (None: a pgqueue-health directory in the system's temporary directory).
    "HEALTH_DIR": None,
    # Seconds a worker's loop may go without a turn (a claim, an idle wait ending, a
    # heartbeat, a reconnection attempt) before the healthcheck's liveness fails: a wedged
    # loop is caught within it. A third of it bounds how long the loop's connection waits
    # on a server gone silent (TCP keepalives, tcp_user_timeout: pgqueue.worker.health).
    # Keep it well above 10 s, the worker's connect timeout.
    "HEALTH_STALL_SECONDS": 60.0,
    # Tenants per queue with series of their own in the pgqueue_tenant_* histograms of
    # /metrics; the others are summed as tenant="(other)".
    "METRICS_TENANT_SERIES": 20,
    # Seconds a tenant may run no job in a queue before it gives its place among the queue's
    # METRICS_TENANT_SERIES up (its series end; another tenant may take the place).
    "METRICS_TENANT_IDLE_SECONDS": 3600.0,
}

#: What each setting means, for the settings reference of the documentation site
#: (docs/reference/settings.md, generated by scripts/gen_reference.py). Markdown; every key
#: of DEFAULTS has one (tests/test_docs.py checks it).
HELP: dict[str, str] = {
    "DATABASE": (
        "The `DATABASES` alias that holds pgqueue's tables; another alias needs "
        '`pgqueue.router.QueueRouter` in `DATABASE_ROUTERS` (see the guide "A database of its '
        'own")'
    ),
    "LEASE_SECONDS": ("How long a claimed job's lease lasts before it is presumed abandoned"),
    "MAX_LOST_CLAIMS": (
        "A job whose lease runs out before its start is recorded is given back without spending "
        "an attempt; the loss that brings such losses to this many makes it dead (a retry "
        'starts the count again). A job\'s `lost_claims` (API, CLI; "+N lost before its start" '
        "beside its attempts in the admin) counts them"
    ),
    "HEARTBEAT_SECONDS": ("Seconds between heartbeats; `None` means `LEASE_SECONDS / 3`"),
    "BACKOFF_BASE": ("Retry backoff base, in seconds"),
    "BACKOFF_CAP": ("Largest retry backoff, in seconds"),
    "MAX_RETRY_DELAY_SECONDS": (
        "Longest delay a task's `backoff` may give a retry, or `pgqueue.Retry(in_=...)` a "
        "snooze; a longer one is cut to it"
    ),
    "MAX_SNOOZES": (
        "Times one job may snooze (`raise pgqueue.Retry(in_=...)`) without spending an "
        "attempt; past it a snooze counts as a failed attempt"
    ),
    "MAX_WORKFLOW_JOBS": (
        "Jobs one workflow may hold (`pgqueue.Workflow`, `POST /workflows`); more is refused "
        "naming `jobs`"
    ),
    "MAX_DEPENDENCIES": (
        "Dependencies one job may have (`depends_on`); more is refused naming `depends_on`"
    ),
    "MAX_UPSTREAM_RESULT_BYTES": (
        "Bytes of its dependencies' results, together, a handler may read as "
        "`job.upstream_results`; more raises `pgqueue.UpstreamTooLarge` (a PermanentError)"
    ),
    "WAITING_SWEEP_BATCH": (
        "Waiting jobs maintenance re-examines per pass (round and round, in id order): it "
        "settles a dependent whose settling a crashed process interrupted"
    ),
    "DEFAULT_MAX_ATTEMPTS": (
        "Attempts a job gets unless its task or the enqueue call says otherwise (1..100)"
    ),
    "DEFAULT_QUEUE": ("Queue of jobs whose task names none"),
    "DEFAULT_TENANT": ("Tenant of jobs enqueued without one"),
    "DEFAULT_TIMEOUT_SECONDS": (
        "Seconds one attempt may run, from its handler's start, when neither the enqueue nor "
        'the task says; `None` is no timeout (see "Cancelling and timeouts")'
    ),
    "MAX_TIMEOUT_SECONDS": ("Largest timeout an enqueue, a task or the setting above may give"),
    "POLL_SECONDS": ("An idle worker's fallback poll interval"),
    "BATCH_SIZE": ("Most jobs one claim takes"),
    "MAINTENANCE_SECONDS": ("Interval of reaping and promotion"),
    "MAINTENANCE_BATCH_SIZE": (
        "Most rows one maintenance statement handles (and levels one prune of idle fair clocks "
        "walks)"
    ),
    "ORDERING": ('`"fair"` or `"fifo"`; applies to jobs that become runnable after a change'),
    "FAIRNESS": (
        'What a fair share is a share of: `"jobs"` (starts) or `"time"` (worker time: run-time '
        "estimates, corrected by maintenance); applies to jobs that become runnable after a "
        "change"
    ),
    "FAIRNESS_DEFAULT_SECONDS": (
        'With `FAIRNESS = "time"`, the charge of a job whose task has no finished attempt '
        "folded yet"
    ),
    "FAIRNESS_MIN_SECONDS": (
        'With `FAIRNESS = "time"`, the least a job is charged (no-op jobs are not free)'
    ),
    "MAX_PAYLOAD_BYTES": ("Largest payload, in bytes of JSON"),
    "MAX_JSON_DEPTH": (
        "Deepest nesting of arrays and objects in a payload (refused at enqueue) or a result "
        "(the attempt fails)"
    ),
    "MAX_RESULT_BYTES": (
        "Largest result a handler may return, in bytes of JSON; a larger one fails the attempt "
        "(`result not storable: …`)"
    ),
    "MAX_OUTPUT_BYTES": (
        "Largest output a handler may report while it runs (`job.output()`), in bytes of JSON; "
        "a larger one raises `InvalidJob` in the handler"
    ),
    "MAX_PROGRESS_NOTE_CHARS": (
        "Longest note of a progress report (`job.progress(..., note=...)`), in characters; a "
        "longer one is cut"
    ),
    "CONNECT_ATTEMPTS": (
        "Tries to reach the database at a worker's start-up (backoff 0.1 s to 5 s, about 20 s) "
        "before it exits 1"
    ),
    "UNKNOWN_TASK_DELAY_SECONDS": (
        "How long a job waits in `scheduled` after a worker without a handler for its task gave "
        "it back (the attempt not counted)"
    ),
    "NOTIFY_CHANNEL": ("LISTEN/NOTIFY channel for wake-ups"),
    "RESULT_RECHECK_SECONDS": (
        "Seconds between the safety re-reads of a job that `pgqueue.result` or `Job.wait` "
        "waits for; a notification wakes the wait as soon as the job ends, the re-read only "
        "finds an end whose notification was missed"
    ),
    "TASK_MODULES": ("Modules imported from every installed app to find tasks"),
    "METRICS_PUBLIC": ("Serve `/metrics` and `/stats` without credentials"),
    "API_RATE_LIMIT": ('Per-key rate limit of the HTTP API, e.g. `"100/s"`; `None` is no limit'),
    "AUTH_FAILURE_RATE": (
        "Failed API-key authentications allowed per client address before a 429; `None` is no limit"
    ),
    "API_TRUSTED_PROXIES": (
        "Reverse proxies in front of the API that append to `X-Forwarded-For`; `0`: the client "
        "address is the connection's and the header is ignored (see the security model)"
    ),
    "PREFETCH": (
        "Most jobs a worker process claims beyond its idle threads (`--prefetch`); they wait, "
        "leased and heartbeated but not started, for a thread, and are given back on stop; "
        "fewer once its jobs have run: as many as its threads start in `PREFETCH_SECONDS`"
    ),
    "PREFETCH_SECONDS": (
        "The time in which the threads not on long jobs must be expected to start the jobs "
        "claimed ahead, at the recent mean run time (none ahead for jobs longer than that)"
    ),
    "PREFETCH_HOLD_SECONDS": (
        "Longest a job claimed ahead waits for a thread: then the worker gives back every job "
        "it holds unstarted (queued at its place, the attempt not counted) and claims none "
        "ahead until a thread is free; a thread whose job has run this long is on a long job "
        "and gets none ahead"
    ),
    "PERIODIC": ('Periodic schedules declared in settings (see "Periodic jobs")'),
    "PERIODIC_MIN_INTERVAL_SECONDS": (
        "Shortest interval (`every=`) of a periodic schedule, in whole seconds (at least 1); "
        "the longest is 365 days. A schedule fires at most once per maintenance pass"
    ),
    "RETENTION": (
        "Seconds (or a `timedelta`) a finished job is kept after `finished_at`, per status; "
        "`None` keeps that status forever; a partial dict keeps the defaults of the statuses it "
        "does not name"
    ),
    "PRUNE_BATCH_SIZE": ("Most jobs one prune statement deletes, with their attempts"),
    "PRUNE_BATCHES_PER_PASS": (
        "Most prune statements (each its own transaction) per maintenance pass"
    ),
    "API_TASKS": (
        "The tasks the HTTP API may enqueue: `None` is every `@pgqueue.task` (no Django Task); "
        'a list of names, `"prefix*"` patterns (never matching `django.tasks:…`) or full '
        "`django.tasks:<path>` names"
    ),
    "TENANT_MAX_PRIORITY": (
        "Highest priority a tenant key may set unless its `max_priority` says otherwise (-100..100)"
    ),
    "MAX_QUEUES_PER_TENANT": (
        "Most queues one tenant may have jobs in; a job in one more is refused "
        "(`TooManyQueues`, a 400 naming `queue`); a queue counts until its jobs have finished "
        "and maintenance has pruned its idle clocks; `None` is no bound (see the security "
        "model)"
    ),
    "COUNT_CAP": (
        "Counts that grow with the history (finished jobs by queue or tenant, a filtered `GET "
        '/jobs`) are exact up to this many, then "N+" or an estimate'
    ),
    "LIST_WINDOW": (
        "Most jobs one page of `GET /jobs`, one `manage.py pgqueue jobs` or the admin's job "
        "list examines: the newest in reach (one tenant's, or all) past the cursor; a filter "
        "matching none of them gives a short page whose `next` goes on"
    ),
    "API_PAGE_BYTES": (
        "Most bytes of JSON in one page of `GET /jobs` (one job is always returned)"
    ),
    "API_FIELD_BYTES": (
        'A larger payload or result is listed by `GET /jobs` as `{"truncated": true, "bytes": '
        'N, "url": …}`'
    ),
    "LIMITS_RECOUNT_SECONDS": (
        "Seconds between maintenance's recounts of the limit counters (a safety net; each reads "
        "every limit row and locks and rewrites only those whose counter drifted)"
    ),
    "LIMITS_GATE_BATCH": (
        "Most queued jobs one limit change gates or ungates in one transaction; it goes on in "
        "batches until none is left (the claim counts a job in its limits, gated yet or not)"
    ),
    "METRICS_LIMIT_SERIES": (
        "Most limit rows (scopes with a cap, a rate limit or a pause) `/metrics` exports as "
        "`pgqueue_limit_*` series, the queues' first; `pgqueue_limit_scopes` counts them all"
    ),
    "KEY_ADMIT_BATCH": (
        "Most new keyed jobs one admission examines (a worker's turn after a keyed enqueue, or "
        "a maintenance pass); a worker goes on while it finds that many"
    ),
    "DEAD_JOB_HOLDS_KEY": (
        "Whether a dead job keeps its concurrency key's slot until an operator retries it "
        "(`True` stops a sequence at its first dead job)"
    ),
    "DEFAULT_KEY_MAX_RUNNING": (
        "Cap of a keyed job when neither its task nor the enqueue says (1..10,000)"
    ),
    "TRACING": (
        "With `opentelemetry-api` installed (the `otel` extra): each enqueue is a producer "
        "span whose trace context the job records, and each attempt runs in a span that is "
        "its child; `False` turns tracing off"
    ),
    "LOG_FORMAT": (
        '`"logfmt"` or `"json"`: runworker\'s log lines when the project configured no '
        "logging handler (JSON carries `trace_id` and `span_id` inside a span)"
    ),
    "HEALTH_DIR": (
        "Directory of the worker processes' health files, read by `manage.py pgqueue "
        "healthcheck`; `None` means `pgqueue-health` in the system's temporary directory"
    ),
    "HEALTH_STALL_SECONDS": (
        "Seconds a worker's loop may make no turn before `healthcheck --liveness` fails; "
        "a third of it bounds the wait of the worker's connection on a silent server (TCP "
        "keepalives), so that a vanished server does not stall the loop. Keep it above 10 s"
    ),
    "METRICS_TENANT_SERIES": (
        "Tenants per queue with series of their own in `/metrics`' per-tenant wait and run "
        'histograms; the rest are summed as `tenant="(other)"`'
    ),
    "METRICS_TENANT_IDLE_SECONDS": (
        "Seconds a tenant may run no job in a queue before it gives its per-tenant series "
        "there up to another tenant"
    ),
}

#: The statuses RETENTION applies to: those a job leaves only by an operator's retry.
FINISHED_STATUSES = ("done", "cancelled", "dead")


class PgQueueSettings:
    """Attribute access to ``settings.PGQUEUE`` with defaults filled in."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] = {}

    @property
    def user_settings(self) -> dict[str, Any]:
        return getattr(settings, "PGQUEUE", None) or {}

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Invalid pgqueue setting: {name!r}")
        if name not in self._cache:
            self._cache[name] = self.user_settings.get(name, DEFAULTS[name])
        return self._cache[name]

    @property
    def heartbeat_seconds(self) -> float:
        hb = self.HEARTBEAT_SECONDS
        return float(hb) if hb is not None else float(self.LEASE_SECONDS) / 3.0

    @property
    def retention_seconds(self) -> dict[str, float | None]:
        """RETENTION over its defaults, in seconds: ``{status: seconds, or None to keep}``.

        Merged rather than replaced so that ``{"dead": None}`` keeps dead jobs forever
        without silently keeping done and cancelled ones forever too.
        """
        merged = {**DEFAULTS["RETENTION"], **(self.RETENTION or {})}
        return {
            status: None if keep is None else _seconds(keep)
            for status, keep in merged.items()
            if status in FINISHED_STATUSES
        }

    def reload(self) -> None:
        self._cache.clear()


def _seconds(value: Any) -> float:
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


pgqueue_settings = PgQueueSettings()


def queue_db(using: str | None = None) -> str:
    """The database alias to use: ``using`` if given, else ``PGQUEUE["DATABASE"]``.

    Every ``using=None`` of pgqueue's functions means the queue's alias, read when called
    (so that ``override_settings`` and a project's settings are both honoured).
    """
    return using or pgqueue_settings.DATABASE


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == "PGQUEUE":
        pgqueue_settings.reload()


setting_changed.connect(_reload)
