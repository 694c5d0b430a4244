"""OpenTelemetry tracing (pgqueue.tracing): the context an enqueue records, the producer span
around it, and the span each attempt runs in.

The SDK is installed per test (tests/otel.py: an in-memory exporter), as a project's
settings would install it; outside ``sdk()`` the process is a project with the API and no
SDK. Tests that run jobs use a real ``WorkerLoop`` in this process (its own threads and
connections, so they are transactional: it only sees committed rows), whose spans land in
the same exporter as the test's own.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
import sys
import threading
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags

import pgqueue
from pgqueue import store, tracing
from pgqueue.models import Job
from pgqueue.schedules import Schedule, create_schedule, enqueue_due, run_schedule_now
from pgqueue.testing import run_jobs
from pgqueue.worker import WorkerLoop
from pgqueue.worker.connection import connect, connect_params
from tests.api_fixtures import client, new_key
from tests.otel import named, sdk, traceparent_of
from tests.workers import REPO

#: A valid W3C traceparent from another service (sampled).
REMOTE_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
REMOTE_SPAN = "00f067aa0ba902b7"
REMOTE = f"00-{REMOTE_TRACE}-{REMOTE_SPAN}-01"

# Worker timings for retries in a test's time: a tiny backoff, promoted at once.
FAST = {"BACKOFF_BASE": 0.01, "BACKOFF_CAP": 0.05, "MAINTENANCE_SECONDS": 0.05}


# -- tasks the in-process worker runs -----------------------------------------------------


@pgqueue.task(name="test.tracing.nested")
def nested(payload: Any, job: Any) -> dict[str, Any]:
    """Open a span of the handler's own (a child of the attempt's, if that is current)."""
    with trace.get_tracer("tests.handler").start_as_current_span("handler work") as span:
        c = span.get_span_context()
        return {"trace_id": f"{c.trace_id:032x}", "span_id": f"{c.span_id:016x}"}


@pgqueue.task(name="test.tracing.async_nested")
async def async_nested(payload: Any, job: Any) -> dict[str, Any]:
    """``nested``, awaited on the worker's event loop."""
    await asyncio.sleep(0)
    with trace.get_tracer("tests.handler").start_as_current_span("async handler work") as span:
        return {"span_id": f"{span.get_span_context().span_id:016x}"}


#: Jobs of test.tracing.snooze_once that have snoozed (the worker runs in this process).
SNOOZED: set[int] = set()


@pgqueue.task(name="test.tracing.snooze_once")
def snooze_once(payload: Any, job: Any) -> None:
    """Snooze the first time (pgqueue.Retry: no attempt spent), then succeed."""
    if job.id not in SNOOZED:
        SNOOZED.add(job.id)
        raise pgqueue.Retry(in_=0.01, reason="not yet")


@pgqueue.task(name="test.tracing.fail_until", max_attempts=5)
def fail_until(payload: Any, job: Any) -> dict[str, Any]:
    if job.attempt < payload["succeed_on"]:
        raise RuntimeError(f"failing on purpose on attempt {job.attempt}")
    return {"attempt": job.attempt}


# -- helpers ------------------------------------------------------------------------------


def run_worker(queue: str, *, jobs: int | None = None, timeout: float = 30.0) -> None:
    """Run a WorkerLoop of ``queue`` in this process until it has finished ``jobs`` jobs
    (None: until none is runnable), within ``timeout`` seconds, and its listener's
    connection is closed. Its handlers must not use Django's connections: those of its
    threads would be left open (a worker's process ends with them)."""
    worker = WorkerLoop(queues=[queue], concurrency=2, burst=jobs is None, max_jobs=jobs)
    thread = threading.Thread(target=worker.run, name="test-worker", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        worker.request_stop()
        thread.join(10)
        pytest.fail(f"the worker of {queue!r} did not finish within {timeout}s")
    worker.listener.join(10)  # it looks at its stop every second


def recorded(job_id: int) -> tuple[str | None, str | None]:
    return Job.objects.values_list("traceparent", "tracestate").get(pk=job_id)


def span_id(span: Any) -> int:
    return span.get_span_context().span_id


def trace_id(span: Any) -> int:
    return span.get_span_context().trace_id


@pytest.fixture
def spans() -> Any:
    with sdk() as exporter:
        yield exporter


# -- the W3C values ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, ok",
    [
        (REMOTE, True),
        (f"00-{REMOTE_TRACE}-{REMOTE_SPAN}-00", True),
        (f"00-{REMOTE_TRACE.upper()}-{REMOTE_SPAN}-01", False),  # upper-case hex
        (f"01-{REMOTE_TRACE}-{REMOTE_SPAN}-01", False),  # a version it cannot store
        (f"ff-{REMOTE_TRACE}-{REMOTE_SPAN}-01", False),
        (f"00-{'0' * 32}-{REMOTE_SPAN}-01", False),  # zero trace id
        (f"00-{REMOTE_TRACE}-{'0' * 16}-01", False),  # zero span id
        (f"00-{REMOTE_TRACE}-{REMOTE_SPAN}-01-extra", False),
        (f" {REMOTE}", False),
        ("00-xyz", False),
        ("", False),
        (None, False),
        (12, False),
        (REMOTE + "\n", False),
    ],
)
def test_well_formed(value: Any, ok: bool) -> None:
    assert tracing.well_formed(value) is ok


@pytest.mark.parametrize(
    "value, kept",
    [
        ("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
        (" rojo=1 , congo=2 ", "rojo=1,congo=2"),
        ("tenant@vendor=x", "tenant@vendor=x"),
        ("a=" + "x" * 257, None),  # a value over 256 characters
        (",".join(f"k{i}=v" for i in range(33)), None),  # over 32 members
        ("rojo=1,rojo=2", None),  # a key twice
        ("Rojo=1", None),  # upper case key
        ("rojo=a,b", None),
        ("rojo=x=y", None),
        ("rojo=\u00e9", None),
        ("", None),
        (",".join(f"k{i:02}=" + "v" * 20 for i in range(25)), None),  # over 512 characters
        (None, None),
    ],
)
def test_bounded_tracestate(value: Any, kept: str | None) -> None:
    assert tracing.bounded_tracestate(value) == kept


#: pgqueue's tracing and JSON logs in a process where the API cannot be imported.
WITHOUT_THE_API = """
import json, logging, sys
sys.modules["opentelemetry"] = None  # import opentelemetry raises ImportError
import django
django.setup()
from pgqueue import tracing
from pgqueue.log import JsonFormatter
from pgqueue.worker.context import JobContext
assert tracing.trace is None and not tracing.active()
with tracing.enqueue("t", queue="q", tenant="a") as sending:
    assert sending.context is None and sending.span is None
with tracing.incoming({"HTTP_TRACEPARENT": "00-%s-%s-01" % ("1" * 32, "2" * 16)}):
    pass
job = JobContext(id=1, task="t", payload=None, tenant="a", queue="q", priority=0, attempt=1,
                 max_attempts=1, worker_id="w", heartbeat=lambda t: None,
                 traceparent="00-%s-%s-01" % ("1" * 32, "2" * 16))
tracing.start_attempt(job)
with tracing.current(job):
    assert job.span is None and tracing.current_ids() is None
tracing.end_attempt(job, "done")
record = logging.LogRecord("x", logging.INFO, "f", 1, "m", None, None)
print(json.loads(JsonFormatter().format(record))["message"])
"""


def test_without_the_api_nothing_is_needed() -> None:
    """The core runs without opentelemetry-api: one guarded import, then no-ops."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_API],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "m"


@pytest.mark.django_db
def test_store_keeps_only_a_well_formed_traceparent(cursor: Any) -> None:
    """store.enqueue is the last gate before the columns: a malformed traceparent is not
    stored (nor its tracestate), a bad tracestate is dropped on its own."""

    def enqueue(trace_context: tracing.TraceContext) -> tuple[str | None, str | None]:
        (new,), _ = store.enqueue(
            cursor,
            task="test.echo",
            tenant="acme",
            queue="default",
            priority=0,
            max_attempts=1,
            payloads_json="[null]",
            count=1,
            trace=trace_context,
        )
        return recorded(new.id)

    assert enqueue(tracing.TraceContext(REMOTE, "rojo=1")) == (REMOTE, "rojo=1")
    assert enqueue(tracing.TraceContext(REMOTE, "x" * 600)) == (REMOTE, None)
    assert enqueue(tracing.TraceContext(REMOTE, "not a tracestate")) == (REMOTE, None)
    assert enqueue(tracing.TraceContext("00-" + "x" * 52, "rojo=1")) == (None, None)
    assert enqueue(tracing.TraceContext(REMOTE.upper(), None)) == (None, None)


# -- the producer side ---------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueue_in_a_span_records_its_producer_span(spans: Any) -> None:
    """The enqueue is a PRODUCER span, child of the caller's; the job records that span's
    context, so that its attempts are its children."""
    with trace.get_tracer("tests").start_as_current_span("request") as request:
        job, created = pgqueue.enqueue("test.echo", {"n": 1}, tenant="acme", queue="tq")
    assert created
    (producer,) = named(spans, "pgqueue enqueue")
    assert producer.name == "pgqueue enqueue test.echo"
    assert producer.kind is SpanKind.PRODUCER
    assert producer.parent.span_id == span_id(request)
    assert trace_id(producer) == trace_id(request)
    assert recorded(job.id) == (traceparent_of(producer), None)
    assert job.traceparent == traceparent_of(producer)  # the Job returned says so too
    assert dict(producer.attributes) == {
        "messaging.system": "pgqueue",
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "messaging.destination.name": "tq",
        "pgqueue.task": "test.echo",
        "pgqueue.tenant": "acme",
        "pgqueue.queue": "tq",
        "pgqueue.job.id": job.id,
    }


@pytest.mark.django_db
def test_every_enqueue_path_records_a_context(spans: Any) -> None:
    """enqueue (runnable, scheduled, with an idempotency key, with dependencies),
    enqueue_many and a Task's own methods all go through a producer span."""
    first, _ = pgqueue.enqueue("test.echo", {}, tenant="acme")
    later, _ = pgqueue.enqueue("test.echo", {}, tenant="acme", delay=60)
    keyed, _ = pgqueue.enqueue("test.echo", {}, tenant="acme", idempotency_key="k")
    again, created = pgqueue.enqueue("test.echo", {}, tenant="acme", idempotency_key="k")
    waiting, _ = pgqueue.enqueue("test.echo", {}, tenant="acme", depends_on=[first])
    many = pgqueue.enqueue_many("test.echo", [{}, {}, {}], tenant="acme")
    producers = named(spans, "pgqueue enqueue test.echo")
    assert len(producers) == 6
    by_job: dict[Any, Any] = {}
    for p in producers:  # the key's second enqueue names the first one's job: not kept
        by_job.setdefault(p.attributes.get("pgqueue.job.id"), p)
    for job in (first, later, keyed, waiting):
        assert recorded(job.id) == (traceparent_of(by_job[job.id]), None), job
    assert not created and again.id == keyed.id  # the key's job keeps its first context
    assert recorded(again.id) == (traceparent_of(by_job[keyed.id]), None)
    (batch,) = [p for p in producers if "messaging.batch.message_count" in p.attributes]
    assert batch.attributes["messaging.batch.message_count"] == 3
    assert {recorded(i) for i in many} == {(traceparent_of(batch), None)}
    assert len({trace_id(p) for p in producers}) == 6  # no span was current: each a root


@pytest.mark.django_db
def test_a_django_task_records_its_producer_span(spans: Any) -> None:
    """The Tasks backend enqueues through the service layer: the same producer span."""
    tasks = {"default": {"BACKEND": "pgqueue.backends.PgQueueBackend", "QUEUES": []}}
    with override_settings(TASKS=tasks):
        from tests.taskapp import django_tasks

        with trace.get_tracer("tests").start_as_current_span("request") as request:
            result = django_tasks.noop.enqueue()
    (producer,) = named(spans, "pgqueue enqueue")
    assert producer.name == "pgqueue enqueue django.tasks:tests.taskapp.django_tasks.noop"
    assert producer.parent.span_id == span_id(request)
    assert recorded(int(result.id)) == (traceparent_of(producer), None)


@pytest.mark.django_db
def test_a_periodic_enqueue_is_a_producer_span_of_its_schedule(spans: Any) -> None:
    """A schedule's job (its tick, or "run now") is enqueued in a span of its own, named
    for its task, with the schedule's name."""
    create_schedule(Schedule(name="nightly", task="test.echo", cron="0 3 * * *"))
    job_id = run_schedule_now("nightly")
    (producer,) = named(spans, "pgqueue enqueue")
    assert producer.name == "pgqueue enqueue test.echo"
    assert producer.attributes["pgqueue.schedule"] == "nightly"
    assert producer.attributes["pgqueue.job.id"] == job_id
    assert recorded(job_id) == (traceparent_of(producer), None)


@pytest.mark.django_db(transaction=True)
def test_a_tick_of_maintenance_starts_a_trace(spans: Any) -> None:
    """The maintenance duty fires a due schedule on the worker's own connection: its job
    records a producer span that is the root of a trace."""
    create_schedule(
        Schedule(name="every-minute", task="test.echo", cron="* * * * *"),
        now=timezone.now() - dt.timedelta(minutes=5),
    )
    with (
        connect(connect_params(application_name="pgqueue test tracing")) as conn,
        conn.transaction(),
        conn.cursor() as cur,
    ):
        (fired,) = enqueue_due(cur, now=timezone.now())
    (producer,) = named(spans, "pgqueue enqueue")
    assert producer.parent is None
    assert producer.attributes["pgqueue.schedule"] == "every-minute"
    assert recorded(fired.job_id) == (traceparent_of(producer), None)


@pytest.mark.django_db
def test_a_failed_enqueue_ends_its_span_in_error(spans: Any) -> None:
    with (
        pytest.raises(pgqueue.TooManyQueues),
        override_settings(PGQUEUE={"MAX_QUEUES_PER_TENANT": 1}),
    ):
        pgqueue.enqueue("test.echo", {}, tenant="acme", queue="one")
        pgqueue.enqueue("test.echo", {}, tenant="acme", queue="two")
    ok, refused = named(spans, "pgqueue enqueue")
    assert ok.status.status_code is StatusCode.UNSET
    assert refused.status.status_code is StatusCode.ERROR
    assert [e.name for e in refused.events] == ["exception"]


@pytest.mark.django_db
def test_tracing_off_records_nothing_and_makes_no_span(spans: Any) -> None:
    """PGQUEUE["TRACING"] = False: no producer span, no context stored, even inside a span."""
    with (
        override_settings(PGQUEUE={"TRACING": False}),
        trace.get_tracer("tests").start_as_current_span("request"),
    ):
        job, _ = pgqueue.enqueue("test.echo", {}, tenant="acme")
        ids = pgqueue.enqueue_many("test.echo", [{}, {}], tenant="acme")
    assert [s.name for s in spans.get_finished_spans()] == ["request"]
    assert {recorded(i) for i in [job.id, *ids]} == {(None, None)}


@pytest.mark.django_db
def test_without_the_sdk_nothing_is_recorded() -> None:
    """The API without an SDK: its spans are invalid (non-recording, no ids), so an enqueue
    records nothing, in a span of the API or not, and pgqueue has no tracer to start any."""
    assert tracing._tracer() is None
    job, _ = pgqueue.enqueue("test.echo", {}, tenant="acme")
    with trace.get_tracer("tests").start_as_current_span("request") as span:
        assert not span.get_span_context().is_valid
        inside, _ = pgqueue.enqueue("test.echo", {}, tenant="acme")
    assert recorded(job.id) == recorded(inside.id) == (None, None)


@pytest.mark.django_db
def test_without_the_sdk_a_propagated_context_is_passed_on() -> None:
    """The API alone passes a context it was given on (its no-op spans carry the parent's
    context): a job enqueued in one records it, so a worker with the SDK continues that
    trace."""
    remote = SpanContext(
        int(REMOTE_TRACE, 16), int(REMOTE_SPAN, 16), is_remote=True, trace_flags=TraceFlags(1)
    )
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
    try:
        job, _ = pgqueue.enqueue("test.echo", {}, tenant="acme")
    finally:
        otel_context.detach(token)
    assert recorded(job.id) == (REMOTE, None)


# -- the HTTP API --------------------------------------------------------------------------


@pytest.mark.django_db
def test_http_enqueue_continues_the_trace_of_its_traceparent_header(spans: Any) -> None:
    """POST /jobs and /jobs/batch with W3C headers and no span current: the producer span
    is a child of the header's context (its tracestate kept), and the jobs record it."""
    api = client(new_key())
    headers = {"HTTP_TRACEPARENT": REMOTE, "HTTP_TRACESTATE": "rojo=00f067aa0ba902b7"}
    one = api.post("/jobs", {"task": "test.echo", "tenant": "acme"}, format="json", **headers)
    batch = api.post(
        "/jobs/batch",
        {"task": "test.echo", "tenant": "acme", "payloads": [1, 2]},
        format="json",
        **headers,
    )
    assert (one.status_code, batch.status_code) == (201, 201)
    producers = named(spans, "pgqueue enqueue")
    assert len(producers) == 2
    for producer in producers:
        assert f"{trace_id(producer):032x}" == REMOTE_TRACE
        assert f"{producer.parent.span_id:016x}" == REMOTE_SPAN and producer.parent.is_remote
    ids = [one.json()["id"], *batch.json()["ids"]]
    stored = [recorded(i) for i in ids]
    assert stored[0] == (traceparent_of(producers[0]), "rojo=00f067aa0ba902b7")
    assert stored[1] == stored[2] == (traceparent_of(producers[1]), "rojo=00f067aa0ba902b7")
    # The job's trace is found from its id: GET /jobs/<id> shows its traceparent.
    shown = api.get(f"/jobs/{ids[0]}").json()["traceparent"]
    assert shown == traceparent_of(producers[0])


@pytest.mark.django_db
def test_http_workflow_continues_the_trace_of_its_header(spans: Any) -> None:
    """POST /workflows: one producer span, a child of the header's context, for all its jobs."""
    api = client(new_key())
    body = {
        "name": "etl",
        "tenant": "acme",
        "jobs": [
            {"name": "fetch", "task": "test.echo"},
            {"name": "load", "task": "test.echo", "depends_on": ["fetch"]},
        ],
    }
    response = api.post("/workflows", body, format="json", HTTP_TRACEPARENT=REMOTE)
    assert response.status_code == 201, response.content[:300]
    (producer,) = named(spans, "pgqueue enqueue")
    assert producer.name == "pgqueue enqueue workflow etl"
    assert f"{producer.parent.span_id:016x}" == REMOTE_SPAN
    ids = [job["id"] for job in response.json()["jobs"]]
    assert {recorded(i) for i in ids} == {(traceparent_of(producer), None)}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "header",
    [
        REMOTE + "-" + "x" * 10_000,  # far too long
        "00-" + "f" * 10_000,
        f"00-{REMOTE_TRACE.upper()}-{REMOTE_SPAN}-01",
        f"ff-{REMOTE_TRACE}-{REMOTE_SPAN}-01",
        f"00-{'0' * 32}-{REMOTE_SPAN}-01",
        f"00-{REMOTE_TRACE}-{REMOTE_SPAN}-1",
        f"00-{REMOTE_TRACE}-{REMOTE_SPAN}-01-extra",
        "\u00e9" * 55,
        f"00-{chr(0x661) * 32}-{REMOTE_SPAN}-01",  # Arabic-Indic digits: not [0-9a-f]
        "garbage",
    ],
)
def test_a_hostile_traceparent_header_is_ignored(spans: Any, header: str) -> None:
    """A header that is not a well-formed version-00 traceparent, whatever its size, is
    never a 500 and never the job's context: the enqueue starts a trace of its own."""
    api = client(new_key())
    response = api.post(
        "/jobs",
        {"task": "test.echo", "tenant": "acme"},
        format="json",
        HTTP_TRACEPARENT=header,
        HTTP_TRACESTATE="x" * 100_000,
    )
    assert response.status_code == 201, response.content[:300]
    (producer,) = named(spans, "pgqueue enqueue")
    assert producer.parent is None
    assert f"{trace_id(producer):032x}" != REMOTE_TRACE
    assert recorded(response.json()["id"]) == (traceparent_of(producer), None)


@pytest.mark.django_db
def test_a_hostile_tracestate_is_dropped_and_the_traceparent_kept(spans: Any) -> None:
    api = client(new_key())
    for tracestate in ["x" * 600, "not a tracestate", "a=1,a=2"]:
        response = api.post(
            "/jobs",
            {"task": "test.echo", "tenant": "acme"},
            format="json",
            HTTP_TRACEPARENT=REMOTE,
            HTTP_TRACESTATE=tracestate,
        )
        assert response.status_code == 201
        traceparent, stored_state = recorded(response.json()["id"])
        assert traceparent is not None and traceparent[3:35] == REMOTE_TRACE
        assert stored_state is None


@pytest.mark.django_db
def test_a_current_span_wins_over_the_header(spans: Any) -> None:
    """A server instrumentation's span (current) already continues the caller's trace:
    the header is not read again."""
    api = client(new_key())
    with trace.get_tracer("tests").start_as_current_span("server") as server:
        response = api.post(
            "/jobs", {"task": "test.echo", "tenant": "acme"}, format="json", HTTP_TRACEPARENT=REMOTE
        )
    (producer,) = named(spans, "pgqueue enqueue")
    assert producer.parent.span_id == span_id(server)
    assert recorded(response.json()["id"])[0] == traceparent_of(producer)


# -- the consumer side ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_attempt_runs_in_a_child_span_of_its_enqueue(spans: Any) -> None:
    """The worker's span of the attempt: CONSUMER, a child of the recorded producer span,
    the job's attributes, current while the handler runs (the handler's own span is its
    child), from the handler's start to its end."""
    with trace.get_tracer("tests").start_as_current_span("request"):
        job, _ = pgqueue.enqueue("test.tracing.nested", {}, tenant="acme", queue="tq")
    run_worker("tq")
    row = Job.objects.get(pk=job.id)
    assert row.status == "done"
    (producer,) = named(spans, "pgqueue enqueue")
    (attempt,) = named(spans, "pgqueue run")
    (handler,) = named(spans, "handler work")
    assert attempt.name == "pgqueue run test.tracing.nested"
    assert attempt.kind is SpanKind.CONSUMER
    assert trace_id(attempt) == trace_id(producer)
    assert attempt.parent.span_id == span_id(producer) and attempt.parent.is_remote
    assert handler.parent.span_id == span_id(attempt)
    assert row.result == {
        "trace_id": f"{trace_id(attempt):032x}",
        "span_id": f"{span_id(handler):016x}",
    }
    assert dict(attempt.attributes) == {
        "messaging.system": "pgqueue",
        "messaging.operation.type": "process",
        "messaging.operation.name": "run",
        "messaging.destination.name": "tq",
        "messaging.message.id": str(job.id),
        "pgqueue.job.id": job.id,
        "pgqueue.task": "test.tracing.nested",
        "pgqueue.tenant": "acme",
        "pgqueue.queue": "tq",
        "pgqueue.attempt": 1,
        "pgqueue.outcome": "done",
    }
    assert attempt.status.status_code is StatusCode.UNSET
    assert attempt.instrumentation_scope.name == "pgqueue"
    # The span is the handler's run: it holds the handler's span, and is as long as it.
    assert attempt.start_time <= handler.start_time <= handler.end_time <= attempt.end_time
    run_ns = (row.finished_at - row.started_at).total_seconds() * 1e9
    assert attempt.end_time - attempt.start_time <= run_ns + 50e6  # clocks apart: 50 ms


@pytest.mark.django_db(transaction=True)
def test_an_async_handler_runs_in_its_attempt_span(spans: Any) -> None:
    job, _ = pgqueue.enqueue("test.tracing.async_nested", {}, tenant="acme", queue="tq")
    run_worker("tq")
    (attempt,) = named(spans, "pgqueue run")
    (handler,) = named(spans, "async handler work")
    (producer,) = named(spans, "pgqueue enqueue")
    assert producer.parent is None  # nothing was current at the enqueue: a root
    assert attempt.parent.span_id == span_id(producer)
    assert handler.parent.span_id == span_id(attempt)
    assert Job.objects.get(pk=job.id).result == {"span_id": f"{span_id(handler):016x}"}


@pytest.mark.django_db(transaction=True)
def test_each_attempt_is_a_span_and_failures_are_errors(spans: Any) -> None:
    """Three attempts, three spans, all children of the one enqueue: the two that raised
    hold the exception and status ERROR, outcome "failed"; the last one "done"."""
    with override_settings(PGQUEUE=FAST):
        job, _ = pgqueue.enqueue("test.tracing.fail_until", {"succeed_on": 3}, queue="tq")
        run_worker("tq", jobs=3)
    assert Job.objects.get(pk=job.id).status == "done"
    (producer,) = named(spans, "pgqueue enqueue")
    attempts = sorted(named(spans, "pgqueue run"), key=lambda s: s.attributes["pgqueue.attempt"])
    assert [s.attributes["pgqueue.attempt"] for s in attempts] == [1, 2, 3]
    assert [s.attributes["pgqueue.outcome"] for s in attempts] == ["failed", "failed", "done"]
    assert {s.parent.span_id for s in attempts} == {span_id(producer)}
    assert len({span_id(s) for s in attempts}) == 3
    for failed in attempts[:2]:
        assert failed.status.status_code is StatusCode.ERROR
        assert failed.status.description.startswith("RuntimeError: failing on purpose")
        (event,) = failed.events
        assert event.name == "exception"
        assert event.attributes["exception.type"] == "RuntimeError"
        assert "failing on purpose" in event.attributes["exception.stacktrace"]
    assert attempts[2].status.status_code is StatusCode.UNSET and not attempts[2].events


@pytest.mark.django_db(transaction=True)
def test_a_permanent_error_ends_dead_and_a_snooze_is_no_error(spans: Any) -> None:
    with override_settings(PGQUEUE=FAST):
        dead, _ = pgqueue.enqueue("test.permanent", {"reason": "no"}, queue="tq")
        snoozed, _ = pgqueue.enqueue("test.tracing.snooze_once", {}, queue="tq")
        run_worker("tq", jobs=3)
    by_job: dict[int, list[Any]] = {}
    for s in named(spans, "pgqueue run"):
        by_job.setdefault(s.attributes["pgqueue.job.id"], []).append(s)
    (gone,) = by_job[dead.id]
    assert gone.attributes["pgqueue.outcome"] == "dead"
    assert gone.status.status_code is StatusCode.ERROR
    first, second = by_job[snoozed.id]
    assert first.attributes["pgqueue.outcome"] == "snoozed"
    assert first.status.status_code is StatusCode.UNSET and not first.events
    assert second.attributes["pgqueue.outcome"] == "done"


@pytest.mark.django_db(transaction=True)
def test_a_workflows_jobs_share_its_trace(spans: Any) -> None:
    """A workflow is enqueued under one producer span: every step's attempt is its child,
    in one trace, with the workflow's id and the step's name."""
    wf = pgqueue.Workflow("ingest", tenant="acme", queue="tq")
    fetch = wf.add("test.echo", {"n": 1}, name="fetch")
    parts = [wf.add("test.echo", {"n": i}, name=f"part{i}", depends_on=[fetch]) for i in (1, 2)]
    wf.add("test.echo", {"n": 9}, name="report", depends_on=parts)
    with trace.get_tracer("tests").start_as_current_span("request") as request:
        run = wf.enqueue()
    run_worker("tq", jobs=4)
    (producer,) = named(spans, "pgqueue enqueue")
    assert producer.name == "pgqueue enqueue workflow ingest"
    assert producer.parent.span_id == span_id(request)
    assert producer.attributes["pgqueue.workflow.id"] == run.id
    assert producer.attributes["messaging.batch.message_count"] == 4
    attempts = named(spans, "pgqueue run")
    assert len(attempts) == 4
    assert {trace_id(s) for s in attempts} == {trace_id(request)}
    assert {s.parent.span_id for s in attempts} == {span_id(producer)}
    assert {s.attributes["pgqueue.step"]: s.attributes["pgqueue.job.id"] for s in attempts} == (
        run.jobs
    )
    assert {s.attributes["pgqueue.workflow.id"] for s in attempts} == {run.id}


@pytest.mark.django_db(transaction=True)
def test_tracing_off_makes_no_attempt_span(spans: Any) -> None:
    """A job that recorded a context, run by a worker with TRACING False: no span."""
    with trace.get_tracer("tests").start_as_current_span("request"):
        job, _ = pgqueue.enqueue("test.tracing.nested", {}, queue="tq")
    assert recorded(job.id)[0] is not None
    spans.clear()
    with override_settings(PGQUEUE={"TRACING": False}):
        run_worker("tq")
    assert Job.objects.get(pk=job.id).status == "done"
    assert [s.name for s in spans.get_finished_spans()] == ["handler work"]
    assert named(spans, "handler work")[0].parent is None


@pytest.mark.django_db(transaction=True)
def test_a_worker_without_the_sdk_runs_the_handler_in_the_recorded_context() -> None:
    """No SDK in the worker: no span is made, but the handler runs in the context the job
    recorded (the API passes it on), so what it calls continues the enqueuer's trace."""
    job, _ = pgqueue.enqueue("test.tracing.nested", {}, queue="tq")
    Job.objects.filter(pk=job.id).update(traceparent=REMOTE)
    run_worker("tq")
    result = Job.objects.get(pk=job.id).result
    assert result == {"trace_id": REMOTE_TRACE, "span_id": REMOTE_SPAN}  # the no-op span's


@pytest.mark.django_db
def test_run_jobs_runs_each_attempt_in_its_span(spans: Any) -> None:
    """pgqueue.testing claims with JOB_CLAIM_MATCHING, JOB_CLAIM's twin: the recorded
    context comes back with the job there too."""
    with trace.get_tracer("tests").start_as_current_span("test") as test_span:
        job, _ = pgqueue.enqueue("test.tracing.nested", {}, tenant="acme")
    (report,) = run_jobs().runs
    assert report.outcome == "done"
    (producer,) = named(spans, "pgqueue enqueue")
    (attempt,) = named(spans, "pgqueue run")
    assert trace_id(attempt) == trace_id(test_span)
    assert attempt.parent.span_id == span_id(producer)
    assert attempt.attributes["pgqueue.job.id"] == job.id


@pytest.mark.django_db
def test_the_claim_returns_the_recorded_context(cursor: Any, spans: Any) -> None:
    with trace.get_tracer("tests").start_as_current_span("test"):
        job, _ = pgqueue.enqueue("test.echo", {}, tenant="acme", queue="tq")
    (claimed,) = store.claim(connection.cursor(), worker="w", queues=["tq"], limit=1)
    assert (claimed.id, claimed.traceparent, claimed.tracestate) == (
        job.id,
        traceparent_of(named(spans, "pgqueue enqueue")[0]),
        None,
    )
    assert (claimed.workflow_id, claimed.step) == (None, None)
