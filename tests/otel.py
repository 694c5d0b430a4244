"""An OpenTelemetry SDK for the tests of ``pgqueue.tracing``.

The API lets a process set its global tracer provider once. ``sdk()`` installs one (an SDK
``TracerProvider`` whose spans go to an in-memory exporter) for one test and takes it away
again afterwards, through the two module attributes that hold it, so that the rest of the
suite runs as a project without the SDK does: nothing recorded, nothing stored.
``pgqueue.tracing`` looks the provider up on every use, so it follows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


@contextlib.contextmanager
def sdk() -> Iterator[InMemorySpanExporter]:
    """The SDK, set up as a project's settings would, for the duration of the block; yields
    the exporter that holds every span finished meanwhile (SimpleSpanProcessor: each is
    there as soon as it ends)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = (trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE)
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    """The finished spans whose name starts with ``prefix``, in the order they ended."""
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def traceparent_of(span: ReadableSpan) -> str:
    """The W3C traceparent of ``span`` (sampled), as a job records it."""
    c = span.get_span_context()
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"
