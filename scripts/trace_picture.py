"""Draw a real pgqueue trace for the tracing guide: docs/images/tracing/trace.png, the same
waterfall as text (trace.txt beside it, and on standard output), and a handler's log line
as pgqueue.log.JsonFormatter writes it (log-line.json).

A web request (a server span of this script's, as a project's instrumentation would make
it) enqueues a workflow: a ``charge`` step that fails its first attempt, then ``email`` and
``ship`` side by side, each opening a span of its own inside its handler. A real worker
(``WorkerLoop``, in this process) runs them with the OpenTelemetry SDK set up, and every
span comes from the SDK's in-memory exporter: nothing in the picture is drawn by hand.

    python scripts/with_db.py -- python scripts/trace_picture.py

It works in a database of its own next to DATABASE_URL's (``pgqueue_trace_picture``,
made afresh and dropped again), never in the project's.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "images" / "tracing" / "trace.png"
LOG_LINE = OUT.with_name("log-line.json")
sys.path.insert(0, str(ROOT))
os.environ.setdefault("BENCH_DB", "pgqueue_trace_picture")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

EXPORTER = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(_provider)  # as a project's settings would, before anything runs
tracer = trace.get_tracer("shop")
#: The handlers' log lines, as runworker --log-format json writes them.
LOG = io.StringIO()
log = logging.getLogger("shop.payments")


def define_tasks() -> None:
    import pgqueue
    from pgqueue.log import JsonFormatter

    handler = logging.StreamHandler(LOG)
    handler.setFormatter(JsonFormatter())
    log.addHandler(handler)
    log.setLevel(logging.INFO)

    @pgqueue.task(name="charge_card", max_attempts=3)
    def charge_card(payload: Any, job: Any) -> dict[str, Any]:
        with tracer.start_as_current_span("payment provider: POST /charges"):
            time.sleep(0.012)
            if job.attempt == 1:
                raise ConnectionError("payment provider timed out")
        log.info("charged %d cents", payload["amount"], extra={"provider": "acme-pay"})
        return {"charged": payload["amount"]}

    @pgqueue.task(name="send_email")
    def send_email(payload: Any, job: Any) -> None:
        with tracer.start_as_current_span("render template"):
            time.sleep(0.004)
        with tracer.start_as_current_span("smtp: send"):
            time.sleep(0.008)

    @pgqueue.task(name="ship_order")
    def ship_order(payload: Any, job: Any) -> None:
        with tracer.start_as_current_span("warehouse: reserve stock"):
            time.sleep(0.015)


def produce() -> None:
    """A request that enqueues the checkout workflow, then a worker that runs it."""
    import threading

    from django.test import override_settings

    import pgqueue
    from pgqueue.worker import WorkerLoop

    with tracer.start_as_current_span("POST /orders", kind=SpanKind.SERVER):
        time.sleep(0.003)  # the view's own work
        wf = pgqueue.Workflow("checkout", tenant="acme")
        charge = wf.add("charge_card", {"amount": 4200}, name="charge")
        wf.add("send_email", {"to": "a@example.com"}, name="email", depends_on=[charge])
        wf.add("ship_order", {"sku": "X-1"}, name="ship", depends_on=[charge])
        wf.enqueue()
    fast = {"BACKOFF_BASE": 0.02, "BACKOFF_CAP": 0.02, "MAINTENANCE_SECONDS": 0.02}
    with override_settings(PGQUEUE=fast):
        worker = WorkerLoop(queues=["default"], concurrency=2, max_jobs=4)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        thread.join(60)
        if thread.is_alive():
            worker.request_stop()
            raise SystemExit("the worker did not run the workflow within 60 s")
        worker.listener.join(10)


def ordered(spans: list[ReadableSpan]) -> list[tuple[int, ReadableSpan]]:
    """The spans of one trace as a tree, depth first, children by start: (depth, span)."""
    ids = {s.context.span_id for s in spans}
    children: dict[int | None, list[ReadableSpan]] = {}
    for s in spans:
        parent = s.parent.span_id if s.parent and s.parent.span_id in ids else None
        children.setdefault(parent, []).append(s)
    out: list[tuple[int, ReadableSpan]] = []

    def walk(parent: int | None, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda x: x.start_time):
            out.append((depth, s))
            walk(s.context.span_id, depth + 1)

    walk(None, 0)
    return out


def label(span: ReadableSpan) -> str:
    a = span.attributes or {}
    extra = []
    if "pgqueue.step" in a:
        extra.append(f"step={a['pgqueue.step']}")
    if "pgqueue.attempt" in a:
        extra.append(f"attempt={a['pgqueue.attempt']}")
    if "pgqueue.outcome" in a:
        extra.append(f"outcome={a['pgqueue.outcome']}")
    return span.name + (f"  ({', '.join(extra)})" if extra else "")


def text(rows: list[tuple[int, ReadableSpan]], t0: int) -> str:
    lines = []
    for depth, s in rows:
        start, end = (s.start_time - t0) / 1e6, (s.end_time - t0) / 1e6
        kind = s.kind.name.lower()
        status = " ERROR" if s.status.status_code is StatusCode.ERROR else ""
        lines.append(
            f"{start:8.1f} ms {end - start:7.1f} ms  {'  ' * depth}{label(s)} [{kind}]{status}"
        )
    return "\n".join(lines)


def draw(rows: list[tuple[int, ReadableSpan]], t0: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {
        SpanKind.SERVER: ("#4c72b0", "server (the web request)"),
        SpanKind.PRODUCER: ("#8172b2", "producer (pgqueue enqueue)"),
        SpanKind.CONSUMER: ("#55a868", "consumer (pgqueue run: an attempt)"),
        SpanKind.INTERNAL: ("#9fa8b3", "the handler's own spans"),
    }
    error_colour = "#c44e52"
    height = 0.42 * len(rows) + 1.6
    fig, (names, ax) = plt.subplots(
        1, 2, figsize=(12, height), sharey=True, gridspec_kw={"width_ratios": [1.1, 1.6]}
    )
    end = (max(s.end_time for _, s in rows) - t0) / 1e6
    for y, (depth, s) in enumerate(rows):
        start, width = (s.start_time - t0) / 1e6, (s.end_time - s.start_time) / 1e6
        error = s.status.status_code is StatusCode.ERROR
        colour = error_colour if error else colours[s.kind][0]
        ax.barh(y, max(width, end / 400), left=start, color=colour, height=0.62)
        ax.text(start + max(width, end / 400) + end / 150, y, f"{width:.1f} ms", va="center",
                fontsize=7.5, color="#555")  # fmt: skip
        names.text(0.02 + 0.05 * depth, y, label(s), va="center", fontsize=8.5)
    names.set_xlim(0, 1)
    names.axis("off")
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, end * 1.12)
    ax.set_yticks([])
    ax.set_xlabel("milliseconds from the request's start")
    ax.grid(axis="x", alpha=0.3)
    trace_id = f"{rows[0][1].context.trace_id:032x}"
    fig.suptitle(
        f"One trace of pgqueue, captured by the SDK's in-memory exporter (trace {trace_id})",
        fontsize=10,
    )
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c, _ in colours.values()]
    handles.append(plt.Rectangle((0, 0), 1, 1, color=error_colour))
    fig.legend(
        handles,
        [name for _, name in colours.values()] + ["status ERROR"],
        loc="lower center", ncol=5, fontsize=8, frameon=False,
    )  # fmt: skip
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=110)


def main() -> int:
    import psycopg
    from psycopg import sql

    from bench.common import BENCH_DB, setup_database

    setup_database()
    try:
        define_tasks()
        produce()
        spans = list(EXPORTER.get_finished_spans())
        request = next(s for s in spans if s.name == "POST /orders")
        one = [s for s in spans if s.context.trace_id == request.context.trace_id]
        rows = ordered(one)
        t0 = request.start_time
        waterfall = text(rows, t0)
        print(waterfall)
        OUT.with_suffix(".txt").write_text(waterfall + "\n")
        LOG_LINE.write_text(LOG.getvalue().splitlines()[0] + "\n")
        draw(rows, t0)
        print(f"\n{LOG.getvalue()}\nwrote {OUT.relative_to(ROOT)}, trace.txt and log-line.json")
    finally:
        from django.db import connections

        connections.close_all()
        base = os.environ["DATABASE_URL"].rsplit("/", 1)[0] + "/postgres"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB))
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
