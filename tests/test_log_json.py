"""JSON log lines (pgqueue.log.JsonFormatter): runworker's ``--log-format json`` and
``PGQUEUE["LOG_FORMAT"] = "json"``, one object a line with the job's fields and the ids of
the OpenTelemetry span current where the record was logged."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

import pgqueue
from pgqueue.log import JobContextFilter, JsonFormatter, job_context
from pgqueue.models import Job
from pgqueue.worker.context import JobContext
from tests.otel import named, sdk, traceparent_of
from tests.workers import REPO, STARTUP, StartWorker


def context(**fields: Any) -> JobContext:
    values = {
        "id": 41,
        "task": "test.log",
        "payload": None,
        "tenant": "acme",
        "queue": "default",
        "priority": 0,
        "attempt": 2,
        "max_attempts": 5,
        "worker_id": "w",
        "heartbeat": lambda timeout: None,
    }
    return JobContext(**{**values, **fields})


def line(level: int, msg: str, *args: Any, **kwargs: Any) -> str:
    """What a handler with a JsonFormatter writes for one record."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tests.log_json")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        logger.log(level, msg, *args, **kwargs)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)
    return stream.getvalue()


def test_a_record_is_one_json_object_on_one_line() -> None:
    text = line(logging.WARNING, "two\nlines: %s", "é")
    assert text.count("\n") == 1
    entry = json.loads(text)
    assert set(entry) == {"time", "level", "logger", "message"}
    assert (entry["level"], entry["logger"], entry["message"]) == (
        "WARNING",
        "tests.log_json",
        "two\nlines: é",
    )
    assert entry["time"].endswith("+00:00") and "T" in entry["time"]
    # ASCII, whatever the message holds: a lone surrogate (a handler's error text) too.
    surrogate = line(logging.WARNING, "bad %s", "\udcff text")
    assert text.isascii() and surrogate.isascii()
    assert json.loads(surrogate)["message"] == "bad \udcff text"


def test_in_a_job_and_a_span_a_line_has_their_fields() -> None:
    with sdk() as spans, job_context(context()):
        with trace.get_tracer("tests").start_as_current_span("work") as span:
            entry = json.loads(line(logging.INFO, "inside"))
        outside_span = json.loads(line(logging.INFO, "no span"))
    (work,) = named(spans, "work")
    c = span.get_span_context()
    assert {k: entry[k] for k in ("job_id", "task", "tenant", "queue", "attempt")} == {
        "job_id": 41,
        "task": "test.log",
        "tenant": "acme",
        "queue": "default",
        "attempt": 2,
    }
    assert (entry["trace_id"], entry["span_id"]) == (f"{c.trace_id:032x}", f"{c.span_id:016x}")
    assert traceparent_of(work)[3:35] == entry["trace_id"]
    assert "trace_id" not in outside_span and outside_span["job_id"] == 41
    outside = json.loads(line(logging.INFO, "no job"))
    assert not {"job_id", "trace_id", "span_id"} & set(outside)


def test_the_fields_job_context_filter_put_on_the_record_are_used() -> None:
    """Behind a QueueHandler the record is formatted elsewhere: the filter's fields, taken
    where it was logged, carry the job over."""
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    with job_context(context(id=7, attempt=1)):
        JobContextFilter().filter(record)
    entry = json.loads(JsonFormatter().format(record))
    assert (entry["job_id"], entry["attempt"], entry["task"]) == (7, 1, "test.log")
    assert not any(key.startswith("pgqueue_") for key in entry)


def test_an_exception_is_text() -> None:
    try:
        raise ValueError("bad value")
    except ValueError:
        text = line(logging.ERROR, "failed", exc_info=True)
    entry = json.loads(text)
    assert entry["exc_info"].startswith("Traceback (most recent call last):")
    assert entry["exc_info"].rstrip().endswith("ValueError: bad value")


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_no_extra_can_break_the_line() -> None:
    """``extra`` values come out as JSON when they are, else as their str(): an object, a
    dict with tuple keys, a cycle, one whose str() raises; never an error."""
    cycle: list[Any] = []
    cycle.append(cycle)
    extra = {
        "tenant_count": 3,
        "tags": ["a", "b"],
        "thing": object(),
        "by_pair": {(1, 2): "x"},
        "cycle": cycle,
        "odd": Unprintable(),
        "message": "an extra cannot replace a field",
    }
    with pytest.raises(KeyError):  # logging itself refuses "message" in extra
        line(logging.INFO, "m", extra=extra)
    del extra["message"]
    entry = json.loads(line(logging.INFO, "m", extra=extra))
    assert entry["tenant_count"] == 3 and entry["tags"] == ["a", "b"]
    assert entry["thing"].startswith("<object object at")
    assert entry["by_pair"] == "{(1, 2): 'x'}"
    assert entry["cycle"] == "[[...]]"
    assert entry["odd"] == "<Unprintable>"
    assert entry["message"] == "m"


# -- runworker ----------------------------------------------------------------------------


def configured_line(args: list[str], log_format: str | None) -> str:
    """The line runworker's logging writes for a record, with ``args`` and the setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env.update(DJANGO_SETTINGS_MODULE="tests.worker_settings")
    if log_format is not None:
        env["PGQUEUE_LOG_FORMAT"] = log_format
    code = (
        "import sys, logging, django\n"
        "django.setup()\n"
        "from pgqueue.conf import pgqueue_settings\n"
        "from pgqueue.management.commands import runworker\n"
        "parser = runworker.Command().create_parser('manage.py', 'runworker')\n"
        "options = vars(parser.parse_args(sys.argv[1:]))\n"
        "runworker._configure_logging(\n"
        "    options['verbosity'], options['log_format'] or pgqueue_settings.LOG_FORMAT)\n"
        "logging.getLogger('pgqueue.worker').info('event=hello')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    (hello,) = [x for x in done.stderr.splitlines() if "event=hello" in x]
    return hello


@pytest.mark.parametrize(
    "args, setting, is_json",
    [
        ([], None, False),
        ([], "json", True),
        (["--log-format", "json"], None, True),
        (["--log-format", "json"], "logfmt", True),
        (["--log-format", "logfmt"], "json", False),
    ],
)
def test_the_flag_overrides_the_setting(
    args: list[str], setting: str | None, is_json: bool
) -> None:
    hello = configured_line(args, setting)
    if is_json:
        entry = json.loads(hello)
        assert (entry["logger"], entry["message"]) == ("pgqueue.worker", "event=hello")
    else:
        assert hello.startswith("time=") and " logger=pgqueue.worker event=hello" in hello


def test_the_flag_refuses_another_format() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env.update(DJANGO_SETTINGS_MODULE="tests.worker_settings")
    done = subprocess.run(
        [sys.executable, "manage.py", "runworker", "--log-format", "xml"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "invalid choice: 'xml'" in done.stderr


@pytest.mark.django_db(transaction=True)
def test_a_worker_writes_json_lines_with_its_jobs_and_their_trace(
    workers: StartWorker, tmp_path: Path
) -> None:
    """A real runworker with the SDK set up in its settings (tests/otel_worker_settings.py)
    and --log-format json: every line it writes parses; the handler's line carries its
    job's fields and the ids of the attempt's span, which is a child of the enqueue's span
    in this process."""
    spans_file = tmp_path / "spans.jsonl"
    with sdk() as exported:
        with trace.get_tracer("tests").start_as_current_span("request"):
            job, _ = pgqueue.enqueue("test.log", {"word": "traced-word"}, tenant="acme")
        (producer,) = named(exported, "pgqueue enqueue")
    w = workers(
        "--burst",
        "--log-format",
        "json",
        extra_env={
            "DJANGO_SETTINGS_MODULE": "tests.otel_worker_settings",
            "TEST_SPANS_FILE": str(spans_file),
        },
    )
    assert w.wait_exit(STARTUP) == 0, w.log()
    assert Job.objects.get(pk=job.id).status == "done"
    entries = [json.loads(text) for text in w.log().splitlines() if text.strip()]
    assert {"time", "level", "logger", "message"} <= set(entries[0])
    (said,) = [e for e in entries if e["message"] == "handler says traced-word"]
    assert (said["job_id"], said["task"], said["tenant"], said["queue"], said["attempt"]) == (
        job.id,
        "test.log",
        "acme",
        "default",
        1,
    )
    (attempt,) = [
        s
        for s in map(json.loads, spans_file.read_text().splitlines())
        if s["name"] == "pgqueue run test.log"
    ]
    assert said["trace_id"] == f"{producer.get_span_context().trace_id:032x}"
    assert said["span_id"] == attempt["context"]["span_id"].removeprefix("0x")
    assert attempt["context"]["trace_id"].removeprefix("0x") == said["trace_id"]
    assert attempt["parent_id"] == f"0x{producer.get_span_context().span_id:016x}"
    assert attempt["attributes"]["pgqueue.outcome"] == "done"
    worker_lines = [e for e in entries if e["logger"] == "pgqueue.worker"]
    assert worker_lines and not any("job_id" in e for e in worker_lines)  # the loop's own


@pytest.mark.django_db(transaction=True)
def test_the_setting_gives_json_lines_without_the_sdk(workers: StartWorker) -> None:
    """PGQUEUE["LOG_FORMAT"] = "json" with no SDK in the worker: JSON lines with the job's
    fields; no trace ids for a job enqueued with none."""
    job, _ = pgqueue.enqueue("test.log", {"word": "plain-word"}, tenant="acme")
    w = workers("--burst", settings={"LOG_FORMAT": "json"})
    assert w.wait_exit(STARTUP) == 0, w.log()
    entries = [json.loads(text) for text in w.log().splitlines() if text.strip()]
    (said,) = [e for e in entries if e["message"] == "handler says plain-word"]
    assert said["job_id"] == job.id and "trace_id" not in said
