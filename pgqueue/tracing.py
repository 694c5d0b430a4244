"""OpenTelemetry tracing: the trace context an enqueue records with its jobs, the producer
span around the enqueue, and the span each attempt of a job runs in.

pgqueue uses the OpenTelemetry API only (its ``otel`` extra installs it) and the tracer
provider the project configured globally (``trace.get_tracer("pgqueue", version)``), as
the API asks of libraries: a project that sets up the SDK gets pgqueue's spans with
nothing else to configure. Everything here is a no-op when the API is not installed (the
import below is tried once) or ``PGQUEUE["TRACING"]`` is False.

What is recorded:

- ``enqueue``: a span ``pgqueue enqueue <task>`` (kind PRODUCER, a child of whatever span
  is current) wraps an enqueue; the jobs keep that span's W3C context in their
  ``traceparent`` / ``tracestate`` columns. ``enqueue_workflow`` does the same for a whole
  workflow (``pgqueue enqueue workflow <name>``), so all its jobs share one trace.
- ``start_attempt``: the worker runs each attempt of a job in a span ``pgqueue run
  <task>`` (kind CONSUMER), a child of the recorded context, current on the thread (or in
  the asyncio task) that runs the handler, so the handler's own spans and log lines nest
  under it; ``end_attempt`` ends it as the handler returns, with the attempt's outcome.

Parent, not link: OpenTelemetry's messaging conventions make the consumer span a child
of the producer's when one message is processed, and link it when a batch is. A pgqueue
attempt runs one job, whichever way it was enqueued, so it is a child of the context
recorded with that job; each attempt is a sibling of the others under the enqueue, and a
job enqueued by ``enqueue_many`` shares its producer span with the rest of the batch.

With the API but no SDK (no tracer provider set), no span is made and nothing is spent on
one: an enqueue records a context only when one is current already (a context propagated
from elsewhere, which the API passes on, as its no-op spans do), and an attempt of a job
without a recorded context costs two checks.

The stored values are bounded as W3C Trace Context bounds them: a ``traceparent`` of
version 00 (55 characters) that parses, else nothing; a ``tracestate`` of at most 512
characters, else none. ``incoming`` reads a request's ``traceparent`` header under the
same rules: clients may send anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, NamedTuple

from .conf import pgqueue_settings

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import (
        NonRecordingSpan,
        NoOpTracerProvider,
        ProxyTracerProvider,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
        TraceState,
    )
except ImportError:  # the otel extra is not installed: every function here does nothing
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from .worker.context import JobContext

#: The instrumentation scope's name: what a project filters pgqueue's spans by.
TRACER_NAME = "pgqueue"

# -- attribute names -----------------------------------------------------------------------

JOB_ID = "pgqueue.job.id"
TASK = "pgqueue.task"
TENANT = "pgqueue.tenant"
QUEUE = "pgqueue.queue"
ATTEMPT = "pgqueue.attempt"
#: How the attempt ended, as the handler's end showed it: done, failed (to be retried),
#: dead, snoozed, cancelled, timed_out, or lost (the worker no longer held the job).
OUTCOME = "pgqueue.outcome"
WORKFLOW_ID = "pgqueue.workflow.id"
WORKFLOW_NAME = "pgqueue.workflow.name"
STEP = "pgqueue.step"
SCHEDULE = "pgqueue.schedule"
#: OpenTelemetry's messaging conventions.
MESSAGING_SYSTEM = "messaging.system"
DESTINATION = "messaging.destination.name"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
MESSAGE_ID = "messaging.message.id"
BATCH_COUNT = "messaging.batch.message_count"

SYSTEM = "pgqueue"

#: The outcomes an attempt span ends with status ERROR.
ERROR_OUTCOMES = frozenset({"failed", "dead", "timed_out"})

# -- W3C Trace Context ---------------------------------------------------------------------

#: The lengths the job's columns hold (version 00 of traceparent is exactly 55).
TRACEPARENT_LENGTH = 55
TRACESTATE_MAX = 512
#: Most members of a tracestate (W3C Trace Context).
TRACESTATE_MEMBERS = 32

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
_MEMBER = re.compile(
    r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)


class TraceContext(NamedTuple):
    """What a job records of the context it was enqueued in (Job.traceparent/tracestate)."""

    traceparent: str
    tracestate: str | None = None


def well_formed(traceparent: Any) -> bool:
    """Whether ``traceparent`` is a W3C traceparent of version 00 with non-zero ids: the only
    kind a job stores (``store.enqueue`` drops any other)."""
    if not isinstance(traceparent, str) or len(traceparent) != TRACEPARENT_LENGTH:
        return False
    match = _TRACEPARENT.fullmatch(traceparent)
    return match is not None and match[1] != _ZERO_TRACE and match[2] != _ZERO_SPAN


def bounded_tracestate(tracestate: Any) -> str | None:
    """``tracestate`` if it is a W3C tracestate of at most TRACESTATE_MAX characters and
    TRACESTATE_MEMBERS members without a repeated key, its members trimmed; else None."""
    if not isinstance(tracestate, str) or len(tracestate) > TRACESTATE_MAX:
        return None
    members = [m.strip(" \t") for m in tracestate.split(",")]
    members = [m for m in members if m]
    if not members or len(members) > TRACESTATE_MEMBERS:
        return None
    if not all(_MEMBER.fullmatch(m) for m in members):
        return None
    if len({m.partition("=")[0] for m in members}) < len(members):
        return None
    return ",".join(members)


def _recorded(span_context: Any) -> TraceContext | None:
    """The W3C form of a span context, as a job records it; None for an invalid one."""
    if not span_context.is_valid:
        return None
    traceparent = (
        f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
        f"{int(span_context.trace_flags):02x}"
    )
    state = span_context.trace_state
    tracestate = state.to_header() if state else None
    if tracestate is not None and len(tracestate) > TRACESTATE_MAX:
        tracestate = None
    return TraceContext(traceparent, tracestate)


def _span_context(traceparent: Any, tracestate: Any = None) -> Any:
    """The remote SpanContext a recorded or received traceparent names, or None when it is
    not one a job may store."""
    if not well_formed(traceparent):
        return None
    _, trace_id, span_id, flags = traceparent.split("-")
    state = bounded_tracestate(tracestate)
    return SpanContext(
        trace_id=int(trace_id, 16),
        span_id=int(span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(flags, 16)),
        trace_state=(
            TraceState([tuple(m.split("=", 1)) for m in state.split(",")]) if state else None
        ),
    )


# -- the tracer ----------------------------------------------------------------------------

#: (the global tracer provider last seen, pgqueue's tracer from it or None): looked up
#: again when the provider changes (set once in a process, but a test may reset it).
_tracer_of: tuple[Any, Any] = (None, None)


def _version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("django-pgqueue-fair")
    except metadata.PackageNotFoundError:
        return None


def _tracer() -> Any:
    """pgqueue's tracer from the global provider; None while no provider is set (the API
    alone, whose spans record nothing)."""
    global _tracer_of
    provider = trace.get_tracer_provider()
    seen, tracer = _tracer_of
    if provider is not seen:
        no_sdk = isinstance(provider, ProxyTracerProvider | NoOpTracerProvider)
        tracer = None if no_sdk else provider.get_tracer(TRACER_NAME, _version())
        _tracer_of = (provider, tracer)
    return tracer


def active() -> bool:
    """The API is installed and PGQUEUE["TRACING"] is on."""
    return trace is not None and bool(pgqueue_settings.TRACING)


# -- the producer side ---------------------------------------------------------------------


class Sending:
    """An enqueue's side of tracing: the context its jobs record (None: none), and its
    producer span for attributes known only after the insert (None: no span)."""

    __slots__ = ("context", "span")

    def __init__(self, context: TraceContext | None = None, span: Any = None) -> None:
        self.context = context
        self.span = span

    def set(self, key: str, value: Any) -> None:
        if self.span is not None and value is not None:
            self.span.set_attribute(key, value)


#: What an enqueue gets when tracing is off: nothing recorded, no span.
UNTRACED = Sending()
_UNTRACED = nullcontext(UNTRACED)


def enqueue(
    task: str, *, queue: str, tenant: str, count: int = 1, schedule: str | None = None
) -> AbstractContextManager[Sending]:
    """Around an enqueue of ``count`` jobs of ``task``: the producer span, and the context
    its jobs record (``Sending.context``, for ``store.enqueue``)."""
    if not active():
        return _UNTRACED
    attributes: dict[str, Any] = {
        MESSAGING_SYSTEM: SYSTEM,
        OPERATION_TYPE: "send",
        OPERATION_NAME: "enqueue",
        DESTINATION: queue,
        TASK: task,
        TENANT: tenant,
        QUEUE: queue,
    }
    if count != 1:
        attributes[BATCH_COUNT] = count
    if schedule is not None:
        attributes[SCHEDULE] = schedule
    return _producer(f"pgqueue enqueue {task}", attributes)


def enqueue_workflow(name: str, *, tenant: str, count: int) -> AbstractContextManager[Sending]:
    """Around a workflow's enqueue: one producer span for all its jobs, which record its
    context, so that their attempts are of one trace."""
    if not active():
        return _UNTRACED
    attributes: dict[str, Any] = {
        MESSAGING_SYSTEM: SYSTEM,
        OPERATION_TYPE: "send",
        OPERATION_NAME: "enqueue",
        TENANT: tenant,
        WORKFLOW_NAME: name,
        BATCH_COUNT: count,
    }
    title = f"pgqueue enqueue workflow {name}" if name else "pgqueue enqueue workflow"
    return _producer(title, attributes)


@contextmanager
def _producer(name: str, attributes: dict[str, Any]) -> Iterator[Sending]:
    tracer = _tracer()
    if tracer is None:  # the API alone: no span; a current context is passed on as it is
        yield Sending(_recorded(trace.get_current_span().get_span_context()))
        return
    with tracer.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes) as span:
        yield Sending(_recorded(span.get_span_context()), span)


def incoming(headers: Mapping[str, Any]) -> AbstractContextManager[Any]:
    """Make the W3C context of a request's ``traceparent`` (and ``tracestate``) header
    current for the block, when no span is current already (a server instrumentation's
    span wins): the enqueue's producer span is then its child. ``headers`` is a WSGI
    environ (``request.META``). A header that is too long or not a well-formed version-00
    traceparent is ignored, as is a tracestate that is not valid (the traceparent stays)."""
    if not active():
        return nullcontext()
    traceparent = headers.get("HTTP_TRACEPARENT")
    if not traceparent or trace.get_current_span().get_span_context().is_valid:
        return nullcontext()
    if not isinstance(traceparent, str) or len(traceparent) > TRACEPARENT_LENGTH + 8:
        return nullcontext()  # bounded before any parsing (blanks around it are allowed)
    remote = _span_context(traceparent.strip(" \t"), headers.get("HTTP_TRACESTATE"))
    if remote is None:
        return nullcontext()
    return _attached(trace.set_span_in_context(NonRecordingSpan(remote)))


@contextmanager
def _attached(ctx: Any) -> Iterator[None]:
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)


# -- the consumer side ---------------------------------------------------------------------


def start_attempt(job: JobContext) -> None:
    """Start the span of ``job``'s attempt (``job.span``), now, as its handler begins: a
    child of the context recorded with the job, or a root when it has none. Nothing when
    tracing is off, or with no SDK and no recorded context; with no SDK and one, the
    handler runs in that context (a non-recording span), so that what it calls passes it
    on."""
    if not active():
        return
    tracer = _tracer()
    if tracer is None and job.traceparent is None:
        return
    remote = _span_context(job.traceparent, job.tracestate)
    if tracer is None:
        if remote is not None:
            job.span = NonRecordingSpan(remote)
        return
    parent = otel_context.Context()  # a root, whatever is current on this thread
    if remote is not None:
        parent = trace.set_span_in_context(NonRecordingSpan(remote), parent)
    attributes: dict[str, Any] = {
        MESSAGING_SYSTEM: SYSTEM,
        OPERATION_TYPE: "process",
        OPERATION_NAME: "run",
        DESTINATION: job.queue,
        MESSAGE_ID: str(job.id),
        JOB_ID: job.id,
        TASK: job.task,
        TENANT: job.tenant,
        QUEUE: job.queue,
        ATTEMPT: job.attempt,
    }
    if job.workflow_id is not None:
        attributes[WORKFLOW_ID] = job.workflow_id
    if job.step is not None:
        attributes[STEP] = job.step
    job.span = tracer.start_span(
        f"pgqueue run {job.task}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    )


def current(job: JobContext) -> AbstractContextManager[Any]:
    """Make ``job``'s attempt span current for the block (nothing without one). What the
    handler raises goes through untouched: ``end_attempt`` records it, once."""
    if job.span is None:
        return _NOTHING
    return _Current(job.span)


_NOTHING = nullcontext()


class _Current:
    """``trace.use_span(span, end_on_exit=False)`` without its exception handling (the
    attempt's end records what the handler raised) nor a generator's cost."""

    __slots__ = ("span", "token")

    def __init__(self, span: Any) -> None:
        self.span = span

    def __enter__(self) -> None:
        self.token = otel_context.attach(trace.set_span_in_context(self.span))

    def __exit__(self, *exc: object) -> None:
        otel_context.detach(self.token)


def end_attempt(
    job: JobContext,
    outcome: str,
    *,
    error: BaseException | None = None,
    description: str | None = None,
) -> None:
    """End ``job``'s attempt span now, as its handler returned or raised: ``outcome`` as
    an attribute, ``error`` (what the handler raised) recorded as an exception event, and
    status ERROR for a failure (``description``: the error text the job records)."""
    span, job.span = job.span, None
    if span is None or not span.is_recording():
        return
    span.set_attribute(OUTCOME, outcome)
    if error is not None:
        try:
            span.record_exception(error, escaped=True)
        except Exception:  # an exception whose str() raises: its type is what is left
            span.add_event("exception", {"exception.type": type(error).__qualname__})
    if outcome in ERROR_OUTCOMES:
        span.set_status(Status(StatusCode.ERROR, description or outcome))
    span.end()


# -- log lines -----------------------------------------------------------------------------


def current_ids() -> tuple[str, str] | None:
    """The trace and span ids (hex) of the span current here, or None (no API, no span)."""
    if trace is None:
        return None
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None
    return f"{span_context.trace_id:032x}", f"{span_context.span_id:016x}"
