"""Benchmark settings with the OpenTelemetry SDK set up, as a project's would be:
bench.settings, plus a global tracer provider whose spans go through a BatchSpanProcessor
to an exporter that counts them and drops them (bench/tracing.py measures what recording
costs the worker, not what an exporter does with the spans). The count is written to the
file BENCH_SPANS_FILE names when the process exits (the provider's shutdown)."""

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from bench.settings import *  # noqa: F403
from bench.tracing import CountingExporter

_provider = TracerProvider()
_provider.add_span_processor(BatchSpanProcessor(CountingExporter()))
trace.set_tracer_provider(_provider)
