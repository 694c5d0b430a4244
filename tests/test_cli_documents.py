"""The core does without the ``api`` extra: the operator commands' ``--json`` documents
(pgqueue.cli.documents) are built without DRF, yet equal what the HTTP API's serializers
write for the same job, attempt, tenant and queue; and no module of the core imports DRF,
drf-spectacular or the API.

tests/test_wheel.py checks the same for real: the wheel installed without the extra runs a
worker, the admin and ``manage.py check``.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone
from rest_framework.fields import DateTimeField

from pgqueue import limits, reads, services
from pgqueue.api.serializers import (
    AttemptSerializer,
    JobSerializer,
    QueueSerializer,
    TenantSerializer,
)
from pgqueue.cli import documents
from pgqueue.limit_reads import queue_summaries
from pgqueue.models import Job, JobAttempt
from tests.api_fixtures import fail_once_then_complete, make_job

pytestmark = pytest.mark.django_db

PACKAGE = Path(__file__).resolve().parent.parent / "pgqueue"
#: What needs the ``api`` extra: the HTTP API's own modules, and the URLconf that mounts them.
API_MODULES = {PACKAGE / "urls.py", *(PACKAGE / "api").rglob("*.py")}
EXTRA_PACKAGES = {"rest_framework", "drf_spectacular", "drf_spectacular_sidecar"}


def imported_names(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (inside functions too), absolute."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_no_core_module_imports_drf_or_the_api():
    """models, admin, services, worker, commands, metrics, backends: none needs the extra."""
    core = sorted(p for p in PACKAGE.rglob("*.py") if p not in API_MODULES)
    assert len(core) > 50
    offending = {}
    for path in core:
        names = imported_names(path)
        bad = {
            n
            for n in names
            if n.split(".")[0] in EXTRA_PACKAGES
            or n == "pgqueue.api"
            or n.startswith("pgqueue.api.")
        }
        if bad:
            offending[path.relative_to(PACKAGE).as_posix()] = sorted(bad)
    assert offending == {}


def test_the_import_scan_sees_relative_and_lazy_imports():
    """Guards the guard: the API's modules are found importing DRF and each other."""
    assert "rest_framework.serializers" in imported_names(PACKAGE / "api" / "serializers.py")
    assert "pgqueue.api.views" in imported_names(PACKAGE / "urls.py")
    assert "pgqueue.limit_reads.waiting_for" in imported_names(PACKAGE / "api" / "serializers.py")


def assert_same(document: dict[str, Any], data: Any) -> None:
    """The same JSON text, field order included: ``==`` alone would take 1 for True and
    1.0 for 1, which a script reading the JSON would not."""
    assert json.dumps(document) == json.dumps(data)


def a_job_with_every_field() -> Job:
    """A done job with every optional field set: a key, a timeout, a result, an error (its
    first attempt failed), and a concurrency key (written to the finished row: a keyed job
    waits for maintenance to free its key's slot, which is not what is tested here)."""
    job, _ = services.enqueue(
        "test.echo",
        {"nested": {"list": [1, 2.5, None, "x"]}, "unicode": "é"},
        tenant="acme",
        queue="documents",
        priority=7,
        idempotency_key="doc-1",
        timeout=12.5,
        max_attempts=4,
    )
    fail_once_then_complete(job.pk, '{"ok": true, "n": 1.5}')
    Job.objects.filter(pk=job.pk).update(concurrency_key="invoice-9", key_max_running=2)
    return Job.objects.get(pk=job.pk)


def test_a_job_and_its_attempts_are_the_serializers():
    job = a_job_with_every_field()
    assert job.idempotency_key and job.timeout_seconds and job.concurrency_key and job.result
    assert_same(documents.job(job), JobSerializer(job).data)
    assert list(documents.job(job)) == list(JobSerializer.Meta.fields)
    attempts = list(JobAttempt.objects.filter(job=job).order_by("id"))
    assert len(attempts) == 2
    assert attempts[0].error and attempts[0].traceback
    for attempt in attempts:
        assert_same(documents.attempt(attempt), AttemptSerializer(attempt).data)


@pytest.mark.parametrize("state", ["queued", "scheduled", "running", "done", "dead", "cancelled"])
def test_a_job_in_each_status_is_the_serializers(state):
    job = Job.objects.get(pk=make_job(state, tenant="acme"))
    assert_same(documents.job(job), JobSerializer(job).data)


def test_a_running_job_asked_to_stop_is_cancelling_in_both():
    job_id = make_job("running", tenant="acme")
    _, asked = services.cancel_or_ask(job_id)
    assert asked
    job = Job.objects.get(pk=job_id)
    assert documents.job(job)["status"] == "cancelling"
    assert_same(documents.job(job), JobSerializer(job).data)


def test_times_are_in_the_current_time_zone_as_the_api_writes_them():
    job = a_job_with_every_field()
    with timezone.override("America/St_Johns"):  # a half-hour offset
        document = documents.job(job)
        assert_same(document, JobSerializer(job).data)
    assert document["created_at"].endswith(("-03:30", "-02:30"))
    assert documents.job(job)["created_at"].endswith("Z")


def test_tenants_with_limits_weights_and_capped_counts_are_the_serializers():
    for _ in range(3):
        make_job("done", tenant="acme")
    make_job("queued", tenant="globex")
    services.set_tenant_weight("acme", 2.5)
    services.set_tenant_weight("acme", 0.5, queue="bulk")
    limits.set_tenant_limits("acme", max_running=3, rate_limit="10/m")
    limits.set_tenant_limits("acme", queue="bulk", max_running=1)
    limits.pause_tenant("acme", queue="bulk")
    with override_settings(PGQUEUE={"COUNT_CAP": 2}):
        summaries = reads.tenant_summaries(["acme", "globex"])
    acme = next(s for s in summaries if s["name"] == "acme")
    assert acme["capped"] == ["done"] and acme["queue_limits"]
    for summary in summaries:
        assert_same(documents.tenant(summary), TenantSerializer(summary).data)


def test_queues_with_and_without_limits_are_the_serializers():
    limits.set_queue_limits("capped", max_running=5, rate_limit="2/s")
    limits.pause_queue("capped")
    services.enqueue("test.echo", {}, queue="plain", tenant="acme")
    rows = queue_summaries(["capped", "plain"])
    assert {r["name"] for r in rows} == {"capped", "plain"}
    for row in rows:
        assert_same(documents.queue(row), QueueSerializer(row).data)


@pytest.mark.parametrize(
    "value",
    [
        None,
        dt.datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC),
        dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=45))),
    ],
)
def test_a_time_is_written_as_drfs_datetime_field_writes_it(value):
    assert documents.moment(value) == DateTimeField().to_representation(value)
