"""Caps, rate limits and pause from a shell (``manage.py pgqueue queues|limits|pause|resume``
and the limit columns of ``tenants``) and in /metrics (the pgqueue_limit_* gauges)."""

from __future__ import annotations

import pytest
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

import pgqueue
from pgqueue import limits
from pgqueue.limit_models import Limit
from pgqueue.metrics import render
from tests.conftest import claim, complete
from tests.test_cli import api, columns, pgq, pgq_json

pytestmark = pytest.mark.django_db


def enqueue(n: int, tenant: str, queue: str) -> list[int]:
    return pgqueue.enqueue_many(
        "test.noop", [{"i": i} for i in range(n)], tenant=tenant, queue=queue
    )


# -- the CLI ------------------------------------------------------------------------------


def test_limits_sets_a_queues_cap_and_rate_as_put_queues_does():
    doc = pgq_json("limits", "--queue", "emails", "--max-running", "20", "--rate-limit", "50/s")
    assert doc == {
        "name": "emails", "max_running": 20, "rate_limit": "50/s", "paused": False, "running": 0
    }  # fmt: skip
    assert doc == api("/queues/emails")
    # An option left out keeps its limit; "none" removes one.
    doc = pgq_json("limits", "--queue", "emails", "--max-running", "none")
    assert (doc["max_running"], doc["rate_limit"]) == (None, "50/s")


def test_limits_of_a_tenant_and_of_a_tenant_in_one_queue():
    doc = pgq_json("limits", "--tenant", "acme", "--max-running", "3")
    assert (doc["name"], doc["max_running"], doc["queue_limits"]) == ("acme", 3, {})
    doc = pgq_json("limits", "--tenant", "acme", "--queue", "reports", "--rate-limit", "10/m")
    assert doc["max_running"] == 3
    assert doc["queue_limits"] == {
        "reports": {"max_running": None, "rate_limit": "10/m", "paused": False, "running": 0}
    }
    assert doc == api("/tenants/acme")

    code, out, err = pgq("tenants")
    assert (code, err) == (0, "")
    header, *rows = out.splitlines()
    acme = dict(zip(columns(header), columns(next(r for r in rows if r.startswith("acme "))),
                    strict=True))  # fmt: skip
    assert (acme["MAX RUNNING"], acme["RATE LIMIT"], acme["PAUSED"]) == ("3", "-", "no")
    assert acme["QUEUE LIMITS"] == "reports=[10/m; running 0]"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--queue", "q", "--max-running", "0"], "max_running: must be from 1 to 100,000"),
        (["--queue", "q", "--max-running", "100001"], "max_running: must be from 1"),
        (["--queue", "q", "--rate-limit", "10/week"], 'rate_limit: must be "N/s"'),
        (["--queue", "q", "--rate-limit", "0/s"], 'rate_limit: must be "N/s"'),
        (["--tenant", "t", "--rate-limit", "2000000/s"], 'rate_limit: must be "N/s"'),
        (["--queue", "q"], "give --max-running, --rate-limit or both"),
        (["--max-running", "3"], "give --queue Q, --tenant T, or both"),
    ],
)
def test_limits_refuses_bad_values_as_a_usage_error(args, message):
    code, out, err = pgq("limits", *args)
    assert (code, out) == (2, "")
    assert err.startswith(f"pgqueue limits: {message}"), err
    assert not Limit.objects.exists()


@pytest.mark.parametrize(
    "args", [["--max-running", "many"], ["--queue", "bad queue", "--max-running", "1"]]
)
def test_limits_refuses_malformed_arguments_before_reaching_the_service(args):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="is not"):
        pgq("limits", "--queue", "q", *args)
    assert not Limit.objects.exists()


def test_pause_and_resume_a_queue_a_tenant_and_a_tenant_in_a_queue():
    enqueue(2, "acme", "emails")
    assert pgq_json("pause", "--queue", "emails")["paused"] is True
    assert claim(limit=5, queues=("emails",)) == []
    assert pgq_json("resume", "--queue", "emails")["paused"] is False

    assert pgq_json("pause", "--tenant", "acme")["paused"] is True
    assert claim(limit=5, queues=("emails",)) == []
    assert pgq_json("resume", "--tenant", "acme")["paused"] is False

    doc = pgq_json("pause", "--tenant", "acme", "--queue", "emails")
    assert (doc["paused"], doc["queue_limits"]["emails"]["paused"]) == (False, True)
    assert claim(limit=5, queues=("emails",)) == []
    pgq_json("resume", "--tenant", "acme", "--queue", "emails")
    assert len(claim(limit=5, queues=("emails",))) == 2


def test_pause_needs_a_scope():
    code, out, err = pgq("pause")
    assert (code, out) == (2, "")
    assert err.startswith("pgqueue pause: give --queue Q, --tenant T, or both")


@pytest.mark.parametrize(
    "args",
    [
        ["pause", "--queue", "emails"],
        ["resume", "--queue", "emails"],
        ["limits", "--queue", "emails", "--max-running", "5"],
    ],
)
def test_a_queues_table_after_a_change_shows_its_jobs_as_counted(args):
    """The table pause, resume and limits print for a queue has the columns of ``queues``,
    each read: they printed 0 scheduled, queued, done and dead whatever the queue held
    (the counts were never passed to the table)."""
    limits.set_queue_limits("emails", max_running=9)  # running: the cap's counter, from now
    enqueue(3, "acme", "emails")
    pgqueue.enqueue("test.noop", {}, tenant="acme", queue="emails", delay=3600)
    first, _second = claim(limit=2, queues=("emails",))
    assert complete("w1", first)
    enqueue(1, "acme", "reports")  # another queue's jobs are not this one's

    code, out, err = pgq(*args)
    assert (code, err) == (0, "")
    header, row = out.splitlines()
    shown = dict(zip(columns(header), columns(row), strict=True))
    assert shown["QUEUE"] == "emails"
    counts = {k: shown[k] for k in ("SCHEDULED", "QUEUED", "RUNNING", "DONE", "DEAD")}
    assert counts == {"SCHEDULED": "1", "QUEUED": "1", "RUNNING": "1", "DONE": "1", "DEAD": "0"}
    _, listing, _ = pgq("queues")
    assert columns(row) in [columns(line) for line in listing.splitlines()]  # as listed
    # --json stays the HTTP API's answer to the same change.
    assert pgq_json(*args) == api("/queues/emails")


def test_queues_lists_counts_running_and_limits():
    enqueue(3, "acme", "emails")
    enqueue(1, "acme", "reports")
    limits.set_queue_limits("emails", max_running=2)
    limits.pause_queue("idle")  # limits only, no job yet
    assert len(claim(limit=5, queues=("emails",))) == 2

    doc = pgq_json("queues")
    by_name = {q["name"]: q for q in doc["results"]}
    assert {"emails", "reports", "idle"} <= set(by_name)
    assert by_name["emails"] == {
        "name": "emails", "max_running": 2, "rate_limit": None, "paused": False,
        "running": 2, "jobs": {"queued": 1, "running": 2},
    }  # fmt: skip
    assert by_name["idle"]["paused"] is True
    from_api = {q["name"]: q for q in api("/queues")["results"]}
    assert {k: v for k, v in by_name["emails"].items() if k != "jobs"} == from_api["emails"]

    code, out, _ = pgq("queues")
    assert code == 0
    header, *rows = out.splitlines()
    assert columns(header) == ["QUEUE", "SCHEDULED", "QUEUED", "RUNNING", "MAX RUNNING",
                               "RATE LIMIT", "PAUSED", "DONE", "DEAD"]  # fmt: skip
    emails = columns(next(r for r in rows if r.startswith("emails ")))
    assert emails == ["emails", "0", "1", "2", "2", "-", "no", "0", "0"]
    assert columns(next(r for r in rows if r.startswith("idle ")))[6] == "paused"


# -- /metrics -----------------------------------------------------------------------------


def limit_series() -> dict[tuple[str, tuple], float]:
    body, _ = render()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name.startswith(("pgqueue_limit", "pgqueue_queue_paused"))
    }


def labels(scope: str, queue: str = "", tenant: str = "") -> tuple:
    return tuple(sorted({"scope": scope, "queue": queue, "tenant": tenant}.items()))


def test_the_limit_gauges_per_scope():
    limits.set_queue_limits("emails", max_running=20, rate_limit="50/s")
    limits.set_tenant_limits("acme", max_running=2)
    limits.pause_tenant("acme", queue="reports")
    enqueue(3, "acme", "emails")
    assert len(claim(limit=5, queues=("emails",))) == 2

    series = limit_series()
    assert series[("pgqueue_limit_running", labels("queue", "emails"))] == 2
    assert series[("pgqueue_limit_max_running", labels("queue", "emails"))] == 20
    assert series[("pgqueue_limit_rate_per_second", labels("queue", "emails"))] == 50
    assert series[("pgqueue_limit_running", labels("tenant", tenant="acme"))] == 2
    assert series[("pgqueue_limit_max_running", labels("tenant", tenant="acme"))] == 2
    assert series[("pgqueue_limit_paused", labels("tenant", tenant="acme"))] == 0
    assert series[("pgqueue_limit_paused", labels("queue_tenant", "reports", "acme"))] == 1
    # No cap, no series of it.
    assert ("pgqueue_limit_max_running", labels("queue_tenant", "reports", "acme")) not in series
    assert series[("pgqueue_limit_scopes", ())] == 3
    assert series[("pgqueue_queue_paused", (("queue", "emails"),))] == 0

    limits.pause_queue("emails")
    assert limit_series()[("pgqueue_queue_paused", (("queue", "emails"),))] == 1


def test_a_scope_with_no_limit_left_is_not_exported():
    limits.set_tenant_limits("acme", max_running=2)
    limits.set_tenant_limits("acme", max_running=None)
    series = limit_series()
    assert series[("pgqueue_limit_scopes", ())] == 0
    assert not any(name == "pgqueue_limit_running" for name, _ in series)


def test_the_exported_scopes_are_bounded_by_a_setting_the_queues_first():
    for i in range(5):
        limits.set_tenant_limits(f"t{i}", max_running=1)
    limits.set_queue_limits("emails", max_running=9)
    with override_settings(PGQUEUE={"METRICS_LIMIT_SERIES": 3}):
        series = limit_series()
    running = sorted(lab for name, lab in series if name == "pgqueue_limit_running")
    assert len(running) == 3
    assert labels("queue", "emails") in running
    assert series[("pgqueue_limit_scopes", ())] == 6  # all of them counted
