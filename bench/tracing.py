"""Tracing's cost: the worker's no-op throughput with tracing off, with the OpenTelemetry
API alone, and with the SDK recording every span, in one run.

Three set-ups, alternated round by round, each over the same number of pre-enqueued no-op
jobs (4 tenants, fair), run by one ``manage.py runworker --burst --concurrency 4``:

- off: PGQUEUE["TRACING"] = False in the enqueuing process and in the worker: no context
  recorded, no span.
- API only: tracing on (the default), the API installed, no SDK configured (a project
  that installed ``pgqueue[otel]`` and set nothing up): nothing to record, nothing made.
- on: the SDK set up in both processes (bench/tracing_settings.py: a TracerProvider with a
  BatchSpanProcessor into an exporter that counts the spans and drops them). Each
  enqueue_many is a producer span whose context every job records; each attempt runs in a
  consumer span, its child, with the job's attributes.

jobs/s = jobs / (last finish - first start), from the jobs' own database timestamps (as
bench.throughput), median of the rounds; the ratio is on ÷ off. Beside it, single
``pgqueue.enqueue`` calls in a loop in this process (a producer span each when on), for the
cost on the enqueue side.

    python scripts/with_db.py -- python -m bench.tracing [--quick]
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from bench.common import ROOT, median, reset_tables, table
from bench.harness import WorkerProcess, stop_workers
from bench.throughput import _fill, _rate

CONCURRENCY = 4
SETUPS = ("off", "API only", "on")


class CountingExporter(SpanExporter):
    """Counts the spans it is given and keeps none; writes the count to the file
    BENCH_SPANS_FILE names at its shutdown (the provider's, as the process exits)."""

    def __init__(self) -> None:
        self.count = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.count += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        path = os.environ.get("BENCH_SPANS_FILE")
        if path:
            Path(path).write_text(str(self.count))


@contextlib.contextmanager
def _sdk() -> Iterator[None]:
    """This process with the SDK set up (spans batched into an exporter that drops them),
    for the block. The API lets a process set its provider once: the two attributes that
    hold it are put back afterwards, so that the benchmarks run after this one see a
    process without the SDK again."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.util._once import Once

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(CountingExporter()))
    saved = (trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE)
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(provider)
    try:
        yield
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved


@contextlib.contextmanager
def _setup(name: str) -> Iterator[None]:
    """The enqueuing side of set-up ``name``."""
    from django.conf import settings
    from django.test import override_settings

    if name == "off":
        with override_settings(PGQUEUE={**settings.PGQUEUE, "TRACING": False}):
            yield
    elif name == "on":
        with _sdk():
            yield
    else:
        yield


def _burst(name: str, spans_file: Path) -> None:
    """runworker --burst with set-up ``name``; an error if it fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env["DJANGO_SETTINGS_MODULE"] = "bench.tracing_settings" if name == "on" else "bench.settings"
    env["BENCH_SPANS_FILE"] = str(spans_file)
    if name == "off":
        env["PGQUEUE_TRACING"] = "false"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runworker", "-v", "0", "--burst",
         "--concurrency", str(CONCURRENCY)],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    worker = WorkerProcess(proc)
    try:
        code = proc.wait()
    finally:
        stop_workers([worker])  # only does anything if this process was interrupted
    if code != 0:
        raise subprocess.CalledProcessError(code, proc.args)


def _traced_share() -> float:
    """The share of the jobs that recorded a trace context."""
    from bench.common import scalar

    return float(scalar("SELECT avg((traceparent IS NOT NULL)::int) FROM pgqueue_job") or 0)


def _enqueue_rate(name: str, count: int) -> float:
    """Single pgqueue.enqueue calls per second with set-up ``name``."""
    import pgqueue

    reset_tables()
    with _setup(name):
        pgqueue.enqueue("bench.noop", None, tenant="acme")  # the tenant's clock, first
        t0 = time.perf_counter()
        for _ in range(count):
            pgqueue.enqueue("bench.noop", None, tenant="acme")
        return count / (time.perf_counter() - t0)


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    from pgqueue import tracing

    if tracing._tracer() is not None:
        raise SystemExit("a tracer provider is set in this process: 'API only' needs none")
    jobs = 4_000 if quick else 20_000
    rounds = 1 if quick else 3
    singles = 300 if quick else 2_000
    rates: dict[str, list[float]] = {s: [] for s in SETUPS}
    spans: list[int] = []
    traced: dict[str, float] = {}
    for r in range(rounds):
        for name in SETUPS if r % 2 == 0 else SETUPS[::-1]:
            with _setup(name):
                _fill(jobs)
            traced[name] = _traced_share()
            with tempfile.TemporaryDirectory() as scratch:
                spans_file = Path(scratch) / "spans"
                _burst(name, spans_file)
                if name == "on":
                    spans.append(int(spans_file.read_text()))
            rates[name].append(_rate(jobs))
            print(f"   {name:9} {rates[name][-1]:8,.0f} jobs/s", flush=True)
    enqueue: dict[str, list[float]] = {s: [] for s in ("off", "on")}
    for _ in range(rounds):
        for name in enqueue:
            enqueue[name].append(_enqueue_rate(name, singles))
    med = {s: median(v) for s, v in rates.items()}
    enq = {s: median(v) for s, v in enqueue.items()}
    ratio = med["on"] / med["off"]
    rows = [[s, med[s], f"{med[s] / med['off']:.3f}", f"{traced[s]:.0%}"] for s in SETUPS]
    report = table(["set-up", "jobs/s", "÷ off", "jobs with a context"], rows)
    report += (
        f"\n\ntracing on ÷ off, no-op throughput: {ratio:.3f} "
        f"({(1 - ratio) * 100:.1f} % fewer jobs/s)"
        f"\nspans the worker exported with tracing on: {', '.join(f'{n:,}' for n in spans)} "
        f"(one per job, for {jobs:,} jobs a round)"
        f"\nsingle pgqueue.enqueue calls: {enq['off']:,.0f}/s off, {enq['on']:,.0f}/s on "
        f"(÷ {enq['on'] / enq['off']:.3f})"
        f"\n{rounds} round(s), set-ups alternated; one runworker --burst "
        f"--concurrency {CONCURRENCY}."
    )
    method = (
        f"{jobs:,} no-op jobs pre-enqueued per run (4 tenants, fair), one runworker --burst "
        f"--concurrency {CONCURRENCY}; jobs/s = jobs / (last finish - first start) from the "
        f"jobs' timestamps; median of {rounds}. off: TRACING False; API only: no SDK; on: "
        "the SDK with a BatchSpanProcessor into an exporter that drops the spans. Single "
        f"enqueues: {singles:,} pgqueue.enqueue calls in this process."
    )
    return {
        "title": "Tracing",
        "method": method,
        "report": report,
        "figures": {
            "jobs": jobs,
            "jobs_per_s": rates,
            "ratio_on_to_off": round(ratio, 3),
            "spans_exported": spans,
            "enqueue_per_s": enqueue,
        },
    }


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
