"""``manage.py pgqueue jobs|show|retry|cancel|run-now|tenants|weight|workers|stats``, and
``apikey`` and ``prune`` under their two names (``pgqueue_apikey``, ``pgqueue_prune``).

Each subcommand through ``call_command`` (its stdout, stderr and exit code), its ``--json``
compared with what the HTTP API shows of the same object, and a few real
``python manage.py pgqueue …`` processes for what only a process shows: the exit codes of
a usage error and of an unreachable database, and one end-to-end ``jobs --json``.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command, load_command_class
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import pgqueue
from pgqueue import cli, services
from pgqueue.cli import base
from pgqueue.cli.apikeys import ApiKeyCommand
from pgqueue.cli.prune import PruneCommand
from pgqueue.management.commands import pgqueue as pgqueue_command
from pgqueue.models import ApiKey, Job, JobAttempt, QueueWeight, Tenant, Worker
from tests.api_fixtures import (
    JOB_FIELDS,
    STATS_FIELDS,
    client,
    fresh_queue,
    make_job,
    new_key,
    status_of,
)
from tests.conftest import claim, fail
from tests.test_checks import manage
from tests.test_layers import pgqueue_imports
from tests.workers import database_url

pytestmark = pytest.mark.django_db

#: The operators' subcommands (``worker`` is tested with runworker).
OPERATOR_COMMANDS = ["jobs", "show", "retry", "cancel", "run-now", "tenants", "weight",
                     "queues", "limits", "pause", "resume", "workers", "stats", "periodic",
                     "periodic-enable", "periodic-disable", "workflows"]  # fmt: skip
#: The subcommands that print text only, and the older command names they also answer to.
ALIASED = {"apikey": "pgqueue_apikey", "prune": "pgqueue_prune"}
#: A database nothing listens on: the connection is refused at once.
UNREACHABLE = "postgres://postgres@127.0.0.1:1/nothing"


def pgq(*args: str) -> tuple[int, str, str]:
    """Run ``manage.py pgqueue *args`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("pgqueue", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def pgq_json(*args: str, code: int = 0) -> Any:
    """``pgq(*args, "--json")``'s stdout, parsed; the exit code must be ``code``."""
    got, out, err = pgq(*args, "--json")
    assert got == code, (got, out, err)
    return json.loads(out)


def api(path: str) -> Any:
    response = client(new_key()).get(path)
    assert response.status_code == 200, response.content
    return response.json()


def columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


# -- the registry, the help, the layers ----------------------------------------------------


def test_every_operator_command_is_a_subcommand_of_pgqueue():
    assert list(cli.SUBCOMMANDS) == OPERATOR_COMMANDS
    assert pgqueue_command.SUBCOMMANDS == {
        "worker": pgqueue_command.runworker.Command,
        **cli.SUBCOMMANDS,
        "healthcheck": cli.PROBES["healthcheck"],  # tests/test_healthcheck.py
        "apikey": ApiKeyCommand,
        "prune": PruneCommand,
    }


@pytest.mark.parametrize("name", OPERATOR_COMMANDS)
def test_each_subcommand_takes_json_and_states_the_exit_codes(name):
    parser = cli.SUBCOMMANDS[name]().create_parser("manage.py pgqueue", name)
    text = " ".join(parser.format_help().split())
    assert "--json" in text
    assert base.EXIT_CODES_HELP in text


def test_the_pgqueue_help_lists_the_subcommands_and_the_exit_codes():
    parser = pgqueue_command.Command().create_parser("manage.py", "pgqueue")
    text = " ".join(parser.format_help().split())
    assert base.EXIT_CODES_HELP in text
    unwrapped = re.sub(r"(\w)- (\w)", r"\1-\2", text)  # argparse wraps lines at hyphens
    for name in [*OPERATOR_COMMANDS, "worker", *ALIASED]:
        assert f"`{name}`" in unwrapped


def test_the_commands_read_through_reads_and_write_through_services():
    """Like the admin, they never write a row themselves: no statement of their own."""
    for module in ["pgqueue.cli", "pgqueue.cli.base", "pgqueue.cli.output", "pgqueue.cli.jobs",
                   "pgqueue.cli.tenants", "pgqueue.cli.limits",
                   "pgqueue.cli.overview", "pgqueue.cli.workflows"]:  # fmt: skip
        imported = pgqueue_imports(module)
        assert not imported & {"pgqueue.sql", "pgqueue.store", "pgqueue.read_sql"}, module


# -- jobs ---------------------------------------------------------------------------------


def test_jobs_lists_newest_first_in_aligned_columns():
    first = make_job("queued", tenant="acme")
    second = make_job("dead", tenant="globex")
    code, out, err = pgq("jobs")
    assert (code, err) == (0, "")
    header, *lines = out.splitlines()
    assert columns(header)[:5] == ["ID", "STATUS", "QUEUE", "TENANT", "TASK"]
    assert [columns(line)[0] for line in lines] == [str(second), str(first)]
    # Aligned: every row's STATUS starts where the header's does.
    at = header.index("STATUS")
    assert all(line[at:].startswith(("dead", "queued")) for line in lines)
    created = Job.objects.get(pk=first).created_at.astimezone(dt.UTC)
    assert created.strftime("%Y-%m-%d %H:%M:%S") in lines[1]  # UTC, to the second
    assert not re.search(r"\d\d:\d\d:\d\d\.\d", out)


def test_jobs_json_is_the_apis_job_list():
    make_job("queued", tenant="acme")
    make_job("done", tenant="acme")
    make_job("scheduled", tenant="globex")
    doc = pgq_json("jobs")
    assert set(doc) == {"results", "limit", "more", "older_unexamined"}
    assert (doc["limit"], doc["more"]) == (50, False)
    assert doc["results"] == api("/jobs")["results"]
    assert all(set(job) == JOB_FIELDS for job in doc["results"])


def test_jobs_on_no_jobs():
    assert pgq("jobs") == (0, "no jobs match\n", "")
    assert pgq_json("jobs") == {
        "results": [],
        "limit": 50,
        "more": False,
        "older_unexamined": False,
    }


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("--status", "dead", {"dead-acme"}),
        ("--tenant", "globex", {"queued-globex", "scheduled-globex"}),
        ("--task", "test.noop", {"noop-task"}),
        ("--queue", "other", {"scheduled-globex"}),
    ],
)
def test_jobs_filters_as_get_jobs_does(option, value, expected):
    ids = {
        "dead-acme": make_job("dead", tenant="acme"),
        "queued-globex": make_job("queued", tenant="globex"),
        "scheduled-globex": make_job("scheduled", tenant="globex", queue="other"),
        "noop-task": services.enqueue("test.noop", {}, tenant="acme")[0].pk,
    }
    doc = pgq_json("jobs", option, value)
    assert {job["id"] for job in doc["results"]} == {ids[name] for name in expected}
    param = option.removeprefix("--")
    assert doc["results"] == api(f"/jobs?{param}={value}")["results"]


def test_jobs_filters_by_creation_time_inclusively_naive_being_utc():
    old, new = make_job("queued"), make_job("queued")
    moment = timezone.now() - dt.timedelta(hours=1)
    Job.objects.filter(pk=old).update(created_at=moment)
    naive = moment.astimezone(dt.UTC).replace(tzinfo=None).isoformat()
    after = [j["id"] for j in pgq_json("jobs", "--created-after", naive)["results"]]
    before = [j["id"] for j in pgq_json("jobs", "--created-before", naive)["results"]]
    assert (after, before) == ([new, old], [old])
    offset = moment.astimezone(dt.timezone(dt.timedelta(hours=5))).isoformat()
    assert [j["id"] for j in pgq_json("jobs", "--created-before", offset)["results"]] == [old]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--status", "lost"], "invalid choice: 'lost'"),
        (["--tenant", "no spaces"], "'no spaces' is not a valid tenant name"),
        (["--created-after", "yesterday"], "'yesterday' is not an ISO-8601 date and time"),
        (["--created-after", "2026-02-30T00:00"], "is not an ISO-8601 date and time"),
        (["--limit", "0"], "0 is not from 1 to 500"),
        (["--limit", "501"], "501 is not from 1 to 500"),
        (["--limit", "ten"], "'ten' is not an integer"),
    ],
)
def test_jobs_refuses_bad_filters_as_a_usage_error(args, message):
    # In a process argparse exits 2 (test_a_usage_error_exits_2); call_command raises.
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("pgqueue", "jobs", *args, stdout=io.StringIO(), stderr=io.StringIO())


def test_jobs_reads_at_most_the_limit_and_says_more_match():
    ids = [make_job("queued") for _ in range(4)]
    with CaptureQueriesContext(connection) as queries:
        doc = pgq_json("jobs", "--limit", "3")
    assert [j["id"] for j in doc["results"]] == ids[::-1][:3]
    assert (doc["limit"], doc["more"]) == (3, True)
    # Two bounded reads of the jobs: the window's edge (the LIST_WINDOW-th newest id), then
    # one row past the limit within it; no count of the matches.
    job_reads = [q["sql"] for q in queries.captured_queries if '"pgqueue_job"' in q["sql"]]
    assert len(job_reads) == 2
    assert job_reads[0].rstrip().endswith("LIMIT 2 OFFSET 9999")
    assert job_reads[1].rstrip().endswith("LIMIT 4")
    assert not any("COUNT(" in sql.upper() for sql in job_reads)
    _, out, _ = pgq("jobs", "--limit", "3")
    assert "more match: narrow the filters or raise --limit" in out.splitlines()[-1]
    assert pgq_json("jobs", "--limit", "4")["more"] is False


def test_jobs_examines_the_newest_list_window_jobs_and_says_so():
    """A filter matching only old jobs reads a window, not the history: past the newest
    LIST_WINDOW jobs (of the tenant, with --tenant), nothing is read, and the output says
    older jobs were not examined."""
    make_job("queued", tenant="other", queue="rare")
    old = make_job("queued", tenant="acme", queue="rare")
    for _ in range(3):
        make_job("queued", tenant="acme")
    with override_settings(PGQUEUE={"LIST_WINDOW": 3}):
        doc = pgq_json("jobs", "--queue", "rare")
        assert (doc["results"], doc["more"], doc["older_unexamined"]) == ([], False, True)
        _, out, _ = pgq("jobs", "--queue", "rare")
        assert out.strip() == "no jobs match among the newest 3 jobs"
        # The window is the tenant's own jobs: the other tenant's newer job is not in it.
        doc = pgq_json("jobs", "--queue", "rare", "--tenant", "other")
        assert (len(doc["results"]), doc["older_unexamined"]) == (1, False)
    with override_settings(PGQUEUE={"LIST_WINDOW": 4}):
        doc = pgq_json("jobs", "--queue", "rare", "--tenant", "acme")
        assert [j["id"] for j in doc["results"]] == [old]
        _, out, _ = pgq("jobs", "--queue", "rare", "--tenant", "acme")
        assert "older jobs were not examined" not in out


def test_jobs_lists_fifty_by_default():
    services.enqueue_many("test.echo", [{"n": n} for n in range(51)], tenant="acme")
    doc = pgq_json("jobs")
    assert (len(doc["results"]), doc["more"]) == (50, True)
    assert len(pgq_json("jobs", "--limit", "500")["results"]) == 51


# -- show ---------------------------------------------------------------------------------


def job_with_attempts(n: int) -> int:
    """A job whose history holds ``n`` failed attempts (by workers w1…wn), scheduled again."""
    job, _ = services.enqueue("test.echo", {}, tenant="acme", queue=fresh_queue(),
                              max_attempts=n + 1)  # fmt: skip
    for attempt in range(1, n + 1):
        services.run_jobs_now([job.pk])
        (claimed,) = claim(f"w{attempt}", queues=(job.queue,))
        assert claimed.attempt == attempt
        assert fail(f"w{attempt}", claimed) == "scheduled"
    return job.pk


def test_show_json_is_the_apis_job_with_its_history():
    job_id = job_with_attempts(2)
    doc = pgq_json("show", str(job_id))
    from_api = api(f"/jobs/{job_id}")
    assert doc == {**from_api, "history_total": 2}
    assert [a["worker"] for a in doc["history"]] == ["w1", "w2"]


def test_show_prints_the_last_attempts_only():
    job_id = job_with_attempts(3)
    doc = pgq_json("show", str(job_id), "--attempts", "2")
    assert [a["attempt"] for a in doc["history"]] == [2, 3]  # the last two, oldest first
    assert doc["history_total"] == 3
    code, out, err = pgq("show", str(job_id), "--attempts", "2")
    assert (code, err) == (0, "")
    assert f"id:              {job_id}" in out
    assert "attempts (the last 2 of 3; times in UTC):" in out
    rows = out.split("attempts (the last 2 of 3; times in UTC):\n")[1].splitlines()
    assert columns(rows[0]) == ["ATTEMPT", "WORKER", "CLAIMED", "STARTED", "FINISHED", "RUN",
                                "OUTCOME", "ERROR"]  # fmt: skip
    assert [columns(r)[:2] for r in rows[1:]] == [["2", "w2"], ["3", "w3"]]
    assert all(columns(r)[6:] == ["failed", "RuntimeError: boom"] for r in rows[1:])


def test_show_bounds_the_attempts():
    with pytest.raises(CommandError, match="101 is not from 1 to 100"):
        call_command("pgqueue", "show", "1", "--attempts", "101", stdout=io.StringIO())


def test_show_of_a_job_without_attempts():
    job_id = make_job("queued")
    code, out, _ = pgq("show", str(job_id))
    assert code == 0
    assert out.rstrip().endswith("no attempts yet")
    assert pgq_json("show", str(job_id))["history"] == []


def test_show_of_a_missing_job_exits_1():
    assert pgq("show", "999999") == (1, "", "pgqueue show: job 999999 does not exist\n")
    assert pgq("show", "999999", "--json")[:2] == (1, "")


# -- retry, cancel, run-now ---------------------------------------------------------------


@pytest.mark.parametrize(
    "command, ok_state, new_status, wrong_state",
    [
        ("retry", "dead", "queued", "queued"),
        ("cancel", "queued", "cancelled", "done"),
        ("run-now", "scheduled", "queued", "done"),
    ],
)
def test_an_action_changes_the_jobs_its_status_allows(command, ok_state, new_status, wrong_state):
    ok = [make_job(ok_state), make_job(ok_state)]
    code, out, err = pgq(command, *map(str, ok))
    assert (code, err) == (0, "")
    assert "2 jobs" in out
    assert out.endswith(f": {ok[0]}, {ok[1]}\n")
    assert [status_of(i) for i in ok] == [new_status, new_status]

    again = make_job(ok_state)
    wrong = make_job(wrong_state)
    doc = pgq_json(command, str(again), str(wrong), "999999", code=1)
    assert doc["changed"] == [again]
    assert doc["missing"] == [999999]
    assert [(s["id"], s["status"]) for s in doc["skipped"]] == [(wrong, wrong_state)]
    assert f"job {wrong} is {wrong_state}; only" in doc["skipped"][0]["reason"]
    assert (status_of(again), status_of(wrong)) == (new_status, wrong_state)


def test_skipped_and_missing_jobs_are_named_on_stderr_and_exit_1():
    dead, queued = make_job("dead"), make_job("queued")
    code, out, err = pgq("retry", str(dead), str(queued), "999999")
    assert code == 1
    assert out == f"retried 1 job: {dead}\n"
    assert err.splitlines() == [
        f"pgqueue retry: skipped: job {queued} is queued; only dead or cancelled jobs can be "
        "retried",
        "pgqueue retry: skipped: job 999999 does not exist",
    ]
    assert pgq("cancel", "999999") == (
        1, "cancelled 0 jobs: -\n", "pgqueue cancel: skipped: job 999999 does not exist\n"
    )  # fmt: skip


def test_an_action_needs_valid_ids():
    with pytest.raises(CommandError, match="the following arguments are required: ID"):
        call_command("pgqueue", "retry", stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(CommandError, match="'abc' is not an integer"):
        call_command("pgqueue", "cancel", "abc", stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(CommandError, match="0 is not from 1 to"):
        call_command("pgqueue", "cancel", "0", stdout=io.StringIO(), stderr=io.StringIO())


def test_retry_keeps_the_history():
    job_id = make_job("dead")
    assert pgq("retry", str(job_id))[0] == 0
    assert JobAttempt.objects.filter(job_id=job_id).count() == 1
    assert pgq_json("show", str(job_id))["attempts"] == 0


# -- tenants, weight ----------------------------------------------------------------------


def test_tenants_shows_backlog_and_running_as_get_tenants_does():
    make_job("queued", tenant="acme")
    make_job("scheduled", tenant="acme")
    make_job("running", tenant="acme")
    make_job("dead", tenant="globex")
    doc = pgq_json("tenants")
    from_api = api("/tenants")
    assert doc == {"count": from_api["count"], "results": from_api["results"]}
    acme = next(t for t in doc["results"] if t["name"] == "acme")
    assert (acme["backlog"], acme["running"], acme["dead"]) == (2, 1, 0)

    code, out, err = pgq("tenants")
    assert (code, err) == (0, "")
    header, *rows = out.splitlines()
    assert columns(header) == ["NAME", "WEIGHT", "QUEUE WEIGHTS", "BACKLOG", "RUNNING",
                               "MAX RUNNING", "RATE LIMIT", "PAUSED", "DONE", "DEAD",
                               "QUEUE LIMITS", "CREATED (UTC)"]  # fmt: skip
    acme_row = next(columns(r) for r in rows if r.startswith("acme "))
    assert acme_row[:11] == ["acme", "1", "-", "2", "1", "-", "-", "no", "0", "0", "-"]
    assert rows[-1] == f"(tenants 1-{from_api['count']} of {from_api['count']})"


def test_tenants_is_a_bounded_page():
    for name in ["t-a", "t-b", "t-c"]:
        Tenant.objects.create(name=name)
    total = Tenant.objects.count()
    names = sorted(Tenant.objects.values_list("name", flat=True))
    doc = pgq_json("tenants", "--limit", "2", "--offset", "1")
    assert doc["count"] == total
    assert [t["name"] for t in doc["results"]] == names[1:3]
    with pytest.raises(CommandError, match="501 is not from 1 to 500"):
        call_command("pgqueue", "tenants", "--limit", "501", stdout=io.StringIO())


def test_weight_sets_it_through_the_service_layer():
    doc = pgq_json("weight", "acme", "3")
    assert (doc["name"], doc["weight"], doc["queue_weights"]) == ("acme", 3.0, {})
    doc = pgq_json("weight", "acme", "0.5", "--queue", "emails")
    assert (doc["weight"], doc["queue_weights"]) == (3.0, {"emails": 0.5})
    assert QueueWeight.objects.get(tenant_id="acme", queue="emails").weight == 0.5
    assert doc == api("/tenants/acme")
    code, out, _ = pgq("weight", "acme", "2")
    assert code == 0
    assert columns(out.splitlines()[1])[:3] == ["acme", "2", "emails=0.5"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["acme", "0"], "weight: must be"),
        (["acme", "-1"], "weight: must be"),
        (["no spaces", "2"], "tenant: "),
        (["acme", "2", "--queue", "bad queue"], "queue: "),
    ],
)
def test_weight_refused_by_the_service_layer_exits_2(args, message):
    code, out, err = pgq("weight", *args)
    assert (code, out) == (2, "")
    assert err.startswith(f"pgqueue weight: {message}")
    assert not Tenant.objects.filter(name__in=["acme", "no spaces"]).exists()


# -- workers, stats -----------------------------------------------------------------------


def test_workers_says_who_is_alive_stale_or_stopped():
    now = timezone.now()
    long_ago = now - dt.timedelta(hours=1)
    Worker.objects.create(id="box:1", host="box", pid=1, queues=["default"], concurrency=4)
    Worker.objects.create(
        id="box:2", host="box", pid=2, queues=["a", "b"], concurrency=1, last_seen_at=long_ago
    )
    Worker.objects.create(id="box:3", host="box", pid=3, queues=[], concurrency=1,
                          last_seen_at=long_ago, stopped_at=long_ago)  # fmt: skip
    doc = pgq_json("workers")
    assert {k: doc[k] for k in ("alive", "stale", "stopped", "total")} == {
        "alive": 1, "stale": 1, "stopped": 1, "total": 3
    }  # fmt: skip
    assert [(w["id"], w["state"]) for w in doc["results"]] == [
        ("box:1", "alive"), ("box:2", "stale"), ("box:3", "stopped")
    ]  # fmt: skip
    code, out, _ = pgq("workers")
    assert code == 0
    lines = out.splitlines()
    assert columns(lines[2])[:6] == ["box:2", "box", "2", "a,b", "1", "stale"]
    assert lines[-1].startswith("1 alive, 1 stale, 1 stopped (alive: seen within 30s)")
    assert len(pgq_json("workers", "--limit", "1")["results"]) == 1
    assert pgq("workers", "--limit", "1")[1].splitlines()[-1].endswith("; 1 of 3 shown")


def test_stats_is_get_stats():
    make_job("queued")
    make_job("dead")
    doc = pgq_json("stats")
    assert set(doc) == STATS_FIELDS
    assert doc == api("/stats")
    code, out, _ = pgq("stats")
    assert code == 0
    header = out.splitlines()[0]
    assert columns(header) == ["QUEUE", "WAITING", "SCHEDULED", "QUEUED", "RUNNING", "DONE",
                               "DEAD", "CANCELLED"]  # fmt: skip
    assert "dead jobs:           1" in out


# -- apikey and prune, and their older names -----------------------------------------------


@pytest.mark.parametrize("name, alias", ALIASED.items())
def test_the_older_names_are_aliases_running_the_subcommands_own_class(name, alias):
    """``pgqueue_apikey`` is ``pgqueue apikey`` (its class, so the same options and the
    same code), and its --help says so."""
    command = load_command_class("pgqueue", alias)
    assert isinstance(command, pgqueue_command.SUBCOMMANDS[name])
    assert command.alias_of == f"pgqueue {name}"
    text = " ".join(command.create_parser("manage.py", alias).format_help().split())
    assert f"An alias of `manage.py pgqueue {name}`." in text


def test_apikey_under_both_names_acts_on_the_same_keys():
    out = io.StringIO()
    call_command("pgqueue_apikey", "create", "--tenant", "acme", "--name", "old", stdout=out)
    old_key = out.getvalue().strip().splitlines()[-1]
    code, out, err = pgq("apikey", "create", "--all-tenants", "--name", "new")
    assert (code, err) == (0, "")
    assert out.splitlines()[0].startswith("Created API key ")
    new_key = out.strip().splitlines()[-1]
    assert [k.split("_")[1] for k in (old_key, new_key)] == list(
        ApiKey.objects.order_by("created_at").values_list("prefix", flat=True)
    )
    _, listing, _ = pgq("apikey", "list")
    assert [line.split()[0] for line in listing.splitlines()] == [
        k.split("_")[1] for k in (old_key, new_key)
    ]
    assert old_key not in listing and new_key not in listing
    prefix = old_key.split("_")[1]
    assert pgq("apikey", "revoke", prefix) == (0, f"revoked {prefix}\n", "")
    with pytest.raises(CommandError, match="no API key with prefix 'nosuch'"):
        pgq("apikey", "revoke", "nosuch")
    with pytest.raises(CommandError, match="one of the arguments --tenant --all-tenants"):
        pgq("apikey", "create")


def test_prune_under_both_names_prints_the_same():
    make_job("done", tenant="acme")
    buf = io.StringIO()
    call_command("pgqueue_prune", "--dry-run", stdout=buf)
    code, out, err = pgq("prune", "--dry-run")
    assert (code, err) == (0, "")
    assert out == buf.getvalue()
    assert out.splitlines()[0] == "would remove 0 done jobs, 0 attempts"  # kept a week


# -- real processes -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["pgqueue apikey", "pgqueue_apikey"])
def test_apikey_in_a_process_prints_the_key_last_and_exits_1_on_an_error(name):
    run = {"settings_module": "tests.worker_settings", "DATABASE_URL": database_url()}
    created = manage(*name.split(), "create", "--all-tenants", **run)
    assert (created.returncode, created.stderr) == (0, ""), created.stderr
    key = created.stdout.strip().splitlines()[-1]
    assert key.startswith("pgq_") and ApiKey.objects.get().prefix == key.split("_")[1]
    missing = manage(*name.split(), "revoke", "nosuch", **run)
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr.strip() == "CommandError: no API key with prefix 'nosuch'"


@pytest.mark.django_db(transaction=True)
def test_jobs_json_end_to_end():
    job_id = make_job("queued", tenant="acme")
    result = manage(
        "pgqueue", "jobs", "--json", "--tenant", "acme",
        settings_module="tests.worker_settings", DATABASE_URL=database_url(),
    )  # fmt: skip
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    doc = json.loads(result.stdout)
    assert [job["id"] for job in doc["results"]] == [job_id]
    assert doc["results"][0]["status"] == "queued"


def test_a_usage_error_exits_2():
    result = manage("pgqueue", "jobs", "--limit", "501", settings_module="tests.settings")
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "argument --limit: 501 is not from 1 to 500" in result.stderr


@pytest.mark.parametrize("args", [["jobs", "--json"], ["retry", "1"], ["stats"]])
def test_an_unreachable_database_exits_3_in_one_line(args):
    result = manage(
        "pgqueue", *args, settings_module="tests.worker_settings", DATABASE_URL=UNREACHABLE
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"pgqueue {args[0]}: cannot reach the database: ")
    assert "Traceback" not in result.stderr


# -- periodic schedules --------------------------------------------------------------------


@pytest.fixture
def schedule_rows() -> Iterator[list[str]]:
    """Two schedules declared in code and synced, as runworker does at start-up."""
    from pgqueue import schedules

    names = ["cli-five", "cli-hourly"]
    pgqueue.periodic("*/5 * * * *", task="test.periodic_tick", name=names[0], tenant="acme")
    pgqueue.periodic("0 * * * *", task="test.periodic_tick", name=names[1])
    schedules.sync_schedules(now=dt.datetime(2026, 1, 1, 10, 1, tzinfo=dt.UTC))
    yield names
    for name in names:
        schedules.undeclare(name)


def test_periodic_lists_the_schedules_by_name(schedule_rows: list[str]) -> None:
    document = pgq_json("periodic")
    assert [r["name"] for r in document["results"]] == schedule_rows
    five = document["results"][0]
    assert (five["cron"], five["tenant"], five["enabled"]) == ("*/5 * * * *", "acme", True)
    assert five["next_run_at"].startswith("2026-01-01T10:05:00")
    code, out, _ = pgq("periodic")
    assert code == 0
    assert columns(out.splitlines()[1])[:7] == [
        "cli-five", "*/5 * * * *", "UTC", "test.periodic_tick", "acme", "periodic", "enabled"
    ]  # fmt: skip


def test_periodic_is_bounded_by_limit(schedule_rows: list[str]) -> None:
    assert [r["name"] for r in pgq_json("periodic", "--limit", "1")["results"]] == ["cli-five"]


def test_periodic_disable_and_enable_go_through_the_schedules_service(
    schedule_rows: list[str],
) -> None:
    from pgqueue.models import PeriodicSchedule

    assert pgq_json("periodic-disable", "cli-five") == {
        "changed": ["cli-five"], "unchanged": [], "missing": []
    }  # fmt: skip
    assert PeriodicSchedule.objects.get(name="cli-five").enabled is False
    again = pgq_json("periodic-disable", "cli-five", "nosuch", code=1)
    assert again == {"changed": [], "unchanged": ["cli-five"], "missing": ["nosuch"]}
    code, _, err = pgq("periodic-enable", "cli-five")
    assert code == 0 and err == ""
    assert PeriodicSchedule.objects.get(name="cli-five").enabled is True


def test_periodic_switches_refuse_a_malformed_name() -> None:
    with pytest.raises(CommandError):
        pgq("periodic-enable", "not a name")
