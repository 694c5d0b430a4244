"""Settings of a worker subprocess with the OpenTelemetry SDK set up, as a project's would
be: ``tests.worker_settings``, plus a tracer provider whose spans are written, one JSON
object a line, to the file named by TEST_SPANS_FILE (read back by the test that started
the worker: tests/test_log_json.py). Start the worker with
``extra_env={"DJANGO_SETTINGS_MODULE": "tests.otel_worker_settings", "TEST_SPANS_FILE": ...}``.
"""

import json
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from tests.worker_settings import *  # noqa: F403

_provider = TracerProvider()
_provider.add_span_processor(
    SimpleSpanProcessor(
        ConsoleSpanExporter(
            out=open(os.environ["TEST_SPANS_FILE"], "a", buffering=1),  # noqa: SIM115
            formatter=lambda span: json.dumps(json.loads(span.to_json())) + "\n",
        )
    )
)
trace.set_tracer_provider(_provider)
