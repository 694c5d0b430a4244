"""pgqueue.testing: a test's jobs run in the test, through the worker's own machinery.

``run_jobs`` claims with the worker's claim (JOB_CLAIM, restricted by task and tenant),
runs handlers through the worker's ``run_handler`` and records with its ``OutcomeRecorder``,
on Django's connection. These tests run it in every kind of test a project writes: inside
the test's transaction (pytest-django's plain ``django_db``, Django's ``TestCase``) and
committed (``transaction=True``, ``TransactionTestCase``), and check that jobs end as a
worker ends them: results, retries after a backoff, dead jobs, PermanentError, retry
policies, signals, concurrency keys, limits, fair order, cancellation, timeouts.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.test import TestCase, TransactionTestCase, override_settings
from django.utils import timezone

import pgqueue
from pgqueue import limits, registry, signals, testing
from pgqueue.claim_store import STATEMENTS as CLAIM
from pgqueue.models import Job, JobAttempt, Tenant
from pgqueue.testing import JobsFailed, assert_enqueued, assert_not_enqueued, enqueued, run_jobs
from tests.taskapp import tasks

REPO = Path(__file__).resolve().parent.parent

#: Every test of this module that takes ``mode`` runs twice: in the test's transaction
#: (rolled back at its end, as in a TestCase) and committed (transaction=True).
IN_TRANSACTION = pytest.param("in_transaction", marks=pytest.mark.django_db)
COMMITTED = pytest.param("committed", marks=pytest.mark.django_db(transaction=True))


@pytest.fixture(params=[IN_TRANSACTION, COMMITTED])
def mode(request: pytest.FixtureRequest) -> str:
    assert connection.in_atomic_block == (request.param == "in_transaction")
    return request.param


def job(pk: int) -> Job:
    return Job.objects.get(pk=pk)


# -- the claim is the worker's ---------------------------------------------------------------


def test_the_matching_claim_is_the_workers_claim_with_the_filters_only() -> None:
    """JOB_CLAIM_MATCHING (queries/testing.sql) must claim as JOB_CLAIM does: with its four
    lines marked "-- matching" taken out, it is JOB_CLAIM, character for character. Fails
    when JOB_CLAIM changes and its twin does not (change both)."""
    twin = testing.STATEMENTS["JOB_CLAIM_MATCHING"]
    marked = [line for line in twin.splitlines() if line.endswith("-- matching")]
    assert len(marked) == 4
    assert all("%(tasks)s" in line or "%(tenants)s" in line for line in marked)
    unmarked = "\n".join(line for line in twin.splitlines() if not line.endswith("-- matching"))
    assert unmarked == CLAIM["JOB_CLAIM"]


# -- success, results, retries ---------------------------------------------------------------


@pytest.mark.usefixtures("mode")
def test_a_job_runs_and_its_result_is_stored() -> None:
    created, _ = pgqueue.enqueue("test.echo", {"word": "hi"}, tenant="acme")

    report = run_jobs()

    assert [(r.id, r.outcome, r.result) for r in report] == [(created.id, "done", {"word": "hi"})]
    assert report.outcome(created) == "done" and not report.failures
    done = job(created.id)
    assert (done.status, done.result, done.attempts, done.lease_owner) == (
        "done",
        {"word": "hi"},
        1,
        "test-runner",
    )
    assert done.claimed_at <= done.started_at <= done.finished_at
    attempt = JobAttempt.objects.get(job_id=created.id)
    assert (attempt.outcome, attempt.worker) == ("done", "test-runner")
    assert run_jobs().runs == []  # nothing is due any more


@pytest.mark.usefixtures("mode")
def test_a_failure_waits_for_its_retry_unless_time_is_moved() -> None:
    created, _ = pgqueue.enqueue(
        "test.fail_until", {"succeed_on": 99}, tenant="acme", max_attempts=3
    )

    first = run_jobs()

    assert [r.outcome for r in first] == ["failed"]  # not run again: its backoff is ahead
    assert first.runs[0].error == "RuntimeError: failing on purpose on attempt 1"
    assert "Traceback" in (first.runs[0].traceback or "")
    waiting = job(created.id)
    assert (waiting.status, waiting.attempts) == ("scheduled", 1)
    assert run_jobs().runs == []  # the retry is not due yet

    rest = run_jobs(include_scheduled=True)

    assert [(r.attempt, r.outcome) for r in rest] == [(2, "failed"), (3, "dead")]
    dead = job(created.id)
    assert (dead.status, dead.attempts) == ("dead", 3)
    assert dead.last_error == "RuntimeError: failing on purpose on attempt 3"
    outcomes = JobAttempt.objects.filter(job_id=created.id).order_by("attempt")
    assert [a.outcome for a in outcomes] == ["failed"] * 3  # each attempt's own outcome


@pytest.mark.usefixtures("mode")
@override_settings(PGQUEUE={"BACKOFF_BASE": 60, "BACKOFF_CAP": 60})
def test_now_runs_the_jobs_due_by_then() -> None:
    """``now`` moves time for scheduled jobs: a delay that ends by then, a retry whose
    backoff (at most 60 s here) ends by then; not a delay that ends later."""
    soon, _ = pgqueue.enqueue("test.echo", {"n": 1}, tenant="acme", delay=3600)
    later, _ = pgqueue.enqueue("test.echo", {"n": 2}, tenant="acme", delay=3 * 3600)
    flaky, _ = pgqueue.enqueue("test.fail_until", {"succeed_on": 2}, tenant="acme")

    assert [(r.id, r.outcome) for r in run_jobs()] == [(flaky.id, "failed")]
    moved = run_jobs(now=dt.timedelta(hours=2))

    assert sorted((r.id, r.outcome) for r in moved) == [(soon.id, "done"), (flaky.id, "done")]
    assert job(later.id).status == "scheduled"
    assert job(flaky.id).result == {"attempt": 2}
    assert [r.id for r in run_jobs(now=timezone.now() + dt.timedelta(hours=4))] == [later.id]


@pytest.mark.usefixtures("mode")
def test_a_permanent_error_is_dead_at_once_and_fails_the_test_when_asked() -> None:
    created, _ = pgqueue.enqueue("test.permanent", {"reason": "bad card"}, tenant="acme")

    report = run_jobs(include_scheduled=True)

    assert [(r.outcome, r.attempt) for r in report] == [("dead", 1)]
    assert job(created.id).status == "dead"
    with pytest.raises(JobsFailed) as failed:
        report.raise_failures()
    message = str(failed.value)
    assert message.startswith("1 job run(s) failed:\n")
    assert f"job {created.id} (test.permanent, tenant=acme, queue=default) attempt 1: dead" in (
        message
    )
    assert "pgqueue.exceptions.PermanentError: bad card" in message
    assert "Traceback (most recent call last)" in message
    assert isinstance(failed.value, AssertionError)
    assert failed.value.failures == report.failures


@pytest.mark.usefixtures("mode")
def test_raise_on_failure_raises_after_every_due_job_ran() -> None:
    ok, _ = pgqueue.enqueue("test.noop", None, tenant="acme")
    bad, _ = pgqueue.enqueue("test.permanent", {"reason": "no"}, tenant="acme")

    with pytest.raises(JobsFailed, match=f"job {bad.id} "):
        run_jobs(raise_on_failure=True)

    assert (job(ok.id).status, job(bad.id).status) == ("done", "dead")
    assert run_jobs(raise_on_failure=True).runs == []  # nothing failed: no raise


@pytest.mark.usefixtures("mode")
def test_the_tasks_retry_policy_applies() -> None:
    """test.policy: Flaky is retried after its task's own backoff (100 s, no jitter), Fatal
    is discarded (dead at once): the worker's executor decides, not run_jobs."""
    flaky, _ = pgqueue.enqueue("test.policy", {"raise": "flaky"}, tenant="acme")
    fatal, _ = pgqueue.enqueue("test.policy", {"raise": "fatal"}, tenant="acme")
    before = timezone.now()

    report = run_jobs()

    assert report.outcomes == {flaky.id: "failed", fatal.id: "dead"}
    retry_at = job(flaky.id).run_at
    assert before + dt.timedelta(seconds=99) < retry_at < timezone.now() + dt.timedelta(seconds=101)


@pytest.mark.usefixtures("mode")
def test_signals_are_sent_as_a_worker_sends_them() -> None:
    seen: list[tuple[str, int, Any]] = []

    def succeeded(sender: Any, job: Any, result: Any, **kwargs: Any) -> None:
        seen.append(("succeeded", job.id, result))

    def dead(sender: Any, job: Any, error: Any, **kwargs: Any) -> None:
        seen.append(("dead", job.id, error))

    signals.job_succeeded.connect(succeeded)
    signals.job_dead.connect(dead)
    try:
        ok, _ = pgqueue.enqueue("test.echo", {"a": 1}, tenant="acme")
        bad, _ = pgqueue.enqueue("test.permanent", {"reason": "r"}, tenant="acme")
        run_jobs()
    finally:
        signals.job_succeeded.disconnect(succeeded)
        signals.job_dead.disconnect(dead)

    assert seen == [
        ("succeeded", ok.id, {"a": 1}),
        ("dead", bad.id, "pgqueue.exceptions.PermanentError: r"),
    ]


@pytest.mark.usefixtures("mode")
def test_an_async_handler_is_awaited() -> None:
    created, _ = pgqueue.enqueue("test.async_add", {"a": 2, "b": 3}, tenant="acme")

    report = run_jobs()

    assert report.runs[0].result == {"sum": 5, "attempt": 1, "alive": True}
    assert job(created.id).status == "done"


@pytest.mark.usefixtures("mode")
def test_an_attempt_past_its_timeout_fails_as_a_workers_does() -> None:
    created, _ = pgqueue.enqueue(
        "test.sleep", {"seconds": 0.3}, tenant="acme", timeout=0.1, max_attempts=2
    )

    report = run_jobs()

    assert [(r.outcome, r.error) for r in report] == [("failed", "timed out after 0.1 s")]
    timed_out = job(created.id)
    assert (timed_out.status, timed_out.last_error, timed_out.result) == (
        "scheduled",
        "timed out after 0.1 s",
        None,
    )


@pytest.mark.usefixtures("mode")
def test_a_job_cancelled_while_it_runs_is_recorded_cancelled() -> None:
    created, _ = pgqueue.enqueue("test.cancel_self", None, tenant="acme")

    report = run_jobs()

    assert report.outcomes == {created.id: "cancelled"} and not report.failures
    assert (job(created.id).status, job(created.id).result) == ("cancelled", None)


@pytest.mark.usefixtures("mode")
def test_a_handlers_heartbeat_learns_of_its_cancellation() -> None:
    """job.heartbeat() runs the worker's heartbeat round on the test's connection: it finds
    the cancellation request and raises JobCancelled in the handler."""
    created, _ = pgqueue.enqueue("test.cancel_self", {"heartbeat": True}, tenant="acme")

    (run,) = run_jobs()

    assert run.outcome == "cancelled"
    assert run.error == f"pgqueue.exceptions.JobCancelled: job {created.id} was asked to stop"
    assert job(created.id).status == "cancelled"


@pytest.mark.usefixtures("mode")
def test_a_snooze_waits_unless_scheduled_jobs_are_included() -> None:
    created, _ = pgqueue.enqueue("test.snooze", {"times": 2}, tenant="acme")

    assert [r.outcome for r in run_jobs()] == ["snoozed"]
    rest = run_jobs(include_scheduled=True)

    assert [(r.attempt, r.outcome) for r in rest] == [(1, "snoozed"), (1, "done")]
    assert rest.runs[-1].result == {"snoozed": 2, "attempt": 1}
    assert not rest.failures and job(created.id).attempts == 1  # snoozes spend no attempt


@pytest.mark.usefixtures("mode")
def test_a_handlers_database_error_leaves_the_tests_connection_usable(mode: str) -> None:
    """In the test's transaction the handler runs in a savepoint, rolled back when one of its
    statements failed (a worker's handler, in autocommit, would keep what it wrote before);
    the failure is recorded and the next job runs."""
    broken, _ = pgqueue.enqueue("test.db_error", {"tenant": "made-by-handler"}, tenant="acme")
    after, _ = pgqueue.enqueue("test.noop", None, tenant="acme")

    report = run_jobs()

    assert report.outcomes == {broken.id: "dead", after.id: "done"}
    assert report.runs[0].error.startswith("django.db.utils.DataError: division by zero")
    kept = Tenant.objects.filter(name="made-by-handler").exists()
    assert kept == (mode == "committed")


# -- jobs that enqueue jobs, filters, the limit ------------------------------------------------


@pytest.mark.usefixtures("mode")
def test_a_job_enqueued_by_a_handler_runs_too() -> None:
    first, _ = pgqueue.enqueue(
        "test.chain", {"next": "test.echo", "with": {"step": 2}}, tenant="acme"
    )

    report = run_jobs()

    second = report.runs[0].result["enqueued"]
    assert [(r.id, r.outcome) for r in report] == [(first.id, "done"), (second, "done")]
    assert (job(second).tenant_id, job(second).result) == ("acme", {"step": 2})


@pytest.mark.usefixtures("mode")
def test_a_job_a_handler_delays_waits_unless_scheduled_jobs_are_included() -> None:
    pgqueue.enqueue("test.chain", {"next": "test.noop", "delay": 600}, tenant="acme")

    report = run_jobs()
    delayed = report.runs[0].result["enqueued"]

    assert len(report) == 1 and job(delayed).status == "scheduled"
    assert [(r.id, r.outcome) for r in run_jobs(include_scheduled=True)] == [(delayed, "done")]


@pytest.mark.usefixtures("mode")
def test_the_limit_bounds_a_job_that_enqueues_itself_for_ever() -> None:
    pgqueue.enqueue("test.chain", {"again": True}, tenant="acme")

    report = run_jobs(limit=5)

    assert len(report) == 5 and report.limit_reached
    assert [r.outcome for r in report] == ["done"] * 5
    assert Job.objects.filter(status="queued").count() == 1  # the sixth, not run
    assert not run_jobs(task="test.noop").limit_reached


@pytest.mark.usefixtures("mode")
def test_filters_run_only_the_jobs_asked_for() -> None:
    a1, _ = pgqueue.enqueue("test.echo", {"n": 1}, tenant="a")
    b1, _ = pgqueue.enqueue("test.echo", {"n": 2}, tenant="b")
    noop_a, _ = pgqueue.enqueue("test.noop", None, tenant="a")
    other_queue, _ = pgqueue.enqueue("test.echo", {"n": 3}, tenant="a", queue="other")

    assert run_jobs(task="test.echo", tenant="a", queue="default").ids == [a1.id]
    assert run_jobs(queue="other").ids == [other_queue.id]
    assert run_jobs(task=tasks.noop).ids == [noop_a.id]  # a Task object names its task
    assert job(b1.id).status == "queued"
    assert run_jobs(tenant=["b", "c"]).ids == [b1.id]


@pytest.mark.usefixtures("mode")
def test_tenants_are_served_in_fair_order() -> None:
    """The claim is the worker's: a tenant that queued five jobs first does not make a
    later tenant's job wait behind all five."""
    flood = [pgqueue.enqueue("test.noop", None, tenant="flood")[0].id for _ in range(5)]
    late, _ = pgqueue.enqueue("test.noop", None, tenant="late")

    ran = run_jobs().ids

    assert [i for i in ran if i != late.id] == flood  # a tenant's own jobs keep their order
    assert ran.index(late.id) <= 2  # not behind the whole flood (FIFO would run it last)


@pytest.mark.usefixtures("mode")
def test_priority_comes_first() -> None:
    low, _ = pgqueue.enqueue("test.noop", None, tenant="acme", priority=-5)
    high, _ = pgqueue.enqueue("test.noop", None, tenant="acme", priority=5)

    assert run_jobs().ids == [high.id, low.id]


@pytest.mark.usefixtures("mode")
def test_jobs_with_a_concurrency_key_are_admitted_and_run_one_after_another() -> None:
    """Keyed jobs wait for KEY_SETTLE to admit them; run_jobs admits them as a worker's turn
    does, and the second job of the key gets its slot when the first is done."""
    first, _ = pgqueue.enqueue("test.per_user", {"user": 7}, tenant="acme")
    second, _ = pgqueue.enqueue("test.per_user", {"user": 7}, tenant="acme")

    assert run_jobs().outcomes == {first.id: "done", second.id: "done"}


@pytest.mark.usefixtures("mode")
def test_a_paused_tenants_jobs_do_not_run() -> None:
    limits.pause_tenant("acme")
    held, _ = pgqueue.enqueue("test.noop", None, tenant="acme")
    free, _ = pgqueue.enqueue("test.noop", None, tenant="other")

    assert run_jobs().ids == [free.id]
    limits.resume_tenant("acme")
    assert run_jobs().ids == [held.id]


@pytest.mark.usefixtures("mode")
def test_a_job_without_a_handler_is_given_back_not_run() -> None:
    """As a worker gives back a job of a task it has no handler for (a wrong TASK_MODULES):
    no attempt spent, scheduled UNKNOWN_TASK_DELAY_SECONDS later, and not made runnable
    again by the same call, even with every scheduled job included."""
    gone = pgqueue.task(name="test.gone")(lambda payload, job: None)
    try:
        created, _ = gone.enqueue({"x": 1}, tenant="acme")
    finally:
        registry.unregister("test.gone")

    report = run_jobs(include_scheduled=True)

    assert [(r.id, r.outcome) for r in report] == [(created.id, "no_handler")]
    assert report.failures == report.runs
    given_back = job(created.id)
    assert (given_back.status, given_back.attempts) == ("scheduled", 0)


@pytest.mark.usefixtures("mode")
def test_a_django_tasks_task_runs_and_is_found_by_its_task_object() -> None:
    from tests.taskapp import django_tasks as t

    with override_settings(TASKS={"default": {"BACKEND": "pgqueue.backends.PgQueueBackend"}}):
        result = t.add.enqueue(2, 3)

        assert_enqueued(t.add, count=1)
        report = run_jobs(task=t.add)

        assert report.outcomes == {int(result.id): "done"}
        result.refresh()
        assert result.return_value == 5


@pytest.mark.django_db
def test_bad_arguments_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match=r"^limit: "):
        run_jobs(limit=0)
    with pytest.raises(ValueError, match=r"^now: "):
        run_jobs(now=dt.datetime(2030, 1, 1))
    with pytest.raises(ValueError, match=r"^now: "):
        run_jobs(now=dt.timedelta(1), include_scheduled=True)
    with pytest.raises(TypeError, match=r"^now: "):
        run_jobs(now="tomorrow")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^task: "):
        run_jobs(task=[3])
    with pytest.raises(TypeError, match=r"^tenant: "):
        enqueued(tenant=[None])


# -- what was enqueued ---------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueued_filters_by_task_tenant_queue_status_payload_and_lookups() -> None:
    a, _ = pgqueue.enqueue("test.echo", {"order": 1, "email": "a@x"}, tenant="acme")
    b, _ = pgqueue.enqueue("test.echo", {"order": 2, "email": "b@x"}, tenant="globex")
    c, _ = pgqueue.enqueue("test.noop", {"order": 1}, tenant="acme", queue="q2", priority=5)
    d, _ = pgqueue.enqueue("test.echo", {"order": 3}, tenant="acme", delay=60)

    def ids(*args: Any, **kwargs: Any) -> list[int]:
        return [j.id for j in enqueued(*args, **kwargs)]

    assert ids() == [a.id, b.id, c.id, d.id]
    assert ids("test.echo") == [a.id, b.id, d.id]
    assert ids(tasks.noop) == [c.id]
    assert ids(["test.noop", tasks.echo], tenant="globex") == [b.id]
    assert ids(tenant=["acme"], queue="q2") == [c.id]
    assert ids(status="scheduled") == [d.id]
    assert ids("test.echo", status=["queued", "done"]) == [a.id, b.id]
    assert ids(payload={"order": 1}) == [a.id, c.id]  # a subset of the payload
    assert ids(payload__exact={"order": 1}) == [c.id]  # the whole payload
    assert ids(priority=5) == [c.id]
    assert enqueued("test.echo").count() == 3


@pytest.mark.django_db
def test_assert_enqueued_returns_the_jobs_or_lists_what_was_enqueued() -> None:
    a, _ = pgqueue.enqueue("test.echo", {"order": 1}, tenant="acme")
    b, _ = pgqueue.enqueue("test.noop", None, tenant="globex", queue="q2")

    assert assert_enqueued("test.echo") == [a]
    assert assert_enqueued(tenant="globex", count=1) == [b]
    with pytest.raises(AssertionError) as wrong_count:
        assert_enqueued("test.echo", count=2, tenant="acme")
    assert str(wrong_count.value) == (
        "expected 2 job(s) of task 'test.echo' with tenant='acme', found 1.\n"
        "The 2 job(s) enqueued:\n"
        f"  #{a.id} test.echo tenant=acme queue=default status=queued payload={{'order': 1}}\n"
        f"  #{b.id} test.noop tenant=globex queue=q2 status=queued payload=None"
    )
    with pytest.raises(AssertionError, match=r"^expected at least 1 job of task 'test\.gate'"):
        assert_enqueued("test.gate")


@pytest.mark.django_db
def test_assert_enqueued_says_when_nothing_was_enqueued() -> None:
    with pytest.raises(AssertionError) as nothing:
        assert_enqueued(payload={"order": 1})
    assert str(nothing.value) == (
        "expected at least 1 job of any task with payload={'order': 1}, found 0.\n"
        "No job was enqueued."
    )


@pytest.mark.django_db
def test_assert_not_enqueued_lists_the_jobs_that_match() -> None:
    a, _ = pgqueue.enqueue("test.echo", {"order": 1}, tenant="acme")
    pgqueue.enqueue("test.echo", {"order": 2}, tenant="globex")

    assert_not_enqueued("test.noop")
    assert_not_enqueued("test.echo", tenant="initech")
    with pytest.raises(AssertionError) as found:
        assert_not_enqueued("test.echo", tenant="acme")
    assert str(found.value) == (
        "expected no job of task 'test.echo' with tenant='acme', found:\n"
        f"  #{a.id} test.echo tenant=acme queue=default status=queued payload={{'order': 1}}"
    )


# -- the pytest plugin ---------------------------------------------------------------------


def test_the_plugin_is_registered_as_pytest_loads_plugins(pytestconfig: pytest.Config) -> None:
    (entry,) = [e for e in entry_points(group="pytest11") if e.name == "pgqueue"]
    assert entry.value == "pgqueue.testing_plugin"
    assert pytestconfig.pluginmanager.get_plugin("pgqueue") is entry.load()


@pytest.mark.usefixtures("mode")
def test_the_fixture_runs_and_reads_the_tests_jobs(pgqueue_jobs: testing.PgQueueJobs) -> None:
    first, _ = pgqueue.enqueue("test.chain", {"next": "test.echo", "with": {"n": 1}}, tenant="t")

    pgqueue_jobs.assert_enqueued("test.chain", count=1, status="queued")
    pgqueue_jobs.assert_not_enqueued("test.echo")
    report = pgqueue_jobs.run(task=["test.chain", "test.echo"])

    assert report.outcomes[first.id] == "done" and len(report) == 2
    (second,) = pgqueue_jobs.assert_enqueued("test.echo", status="done", payload={"n": 1})
    assert list(pgqueue_jobs.enqueued(status="done")) == [job(first.id), second]


def test_the_fixture_gives_database_access_without_a_mark(pgqueue_jobs: Any) -> None:
    pgqueue.enqueue("test.noop", None, tenant="acme")

    assert [r.outcome for r in pgqueue_jobs.run()] == ["done"]
    assert connection.in_atomic_block  # the test's transaction, rolled back at its end


def run_pytest(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_it.py").write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "test_it.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_pytest_django_the_plugin_loads_and_the_fixture_says_what_it_needs(
    tmp_path: Path,
) -> None:
    """A project without pytest-django (here: ``-p no:django``) and without Django settings
    still loads pgqueue's plugin (pytest would stop at start-up if its import failed); only
    a test asking for the fixture fails, naming pytest-django."""
    done = run_pytest(
        tmp_path,
        """
        def test_plain(pytestconfig):
            assert pytestconfig.pluginmanager.get_plugin("pgqueue") is not None

        def test_fixture(pgqueue_jobs):
            pass
        """,
        "-p",
        "no:django",
    )
    output = done.stdout + done.stderr
    assert "1 passed, 1 error" in output, output
    assert "the pgqueue_jobs fixture needs pytest-django (its db fixture)" in output
    assert "FixtureLookupError" not in output and "During handling" not in output


def test_the_plugin_can_be_turned_off(tmp_path: Path) -> None:
    done = run_pytest(
        tmp_path,
        "def test_fixture(pgqueue_jobs):\n    pass\n",
        "-p",
        "no:pgqueue",
        "-p",
        "no:django",
    )
    assert "fixture 'pgqueue_jobs' not found" in done.stdout, done.stdout


# -- Django's own test cases ---------------------------------------------------------------


class RunJobsInATestCase(TestCase):
    """The jobs live in the TestCase's transaction, which no worker could see."""

    def test_a_job_runs_and_its_result_is_stored(self) -> None:
        created, _ = pgqueue.enqueue("test.echo", {"word": "hi"}, tenant="acme")

        report = run_jobs()

        self.assertEqual(report.outcomes, {created.id: "done"})
        self.assertEqual(job(created.id).result, {"word": "hi"})

    def test_a_failing_job_is_retried_then_dead(self) -> None:
        created, _ = pgqueue.enqueue("test.fail_until", {"succeed_on": 9}, max_attempts=2)

        self.assertEqual([r.outcome for r in run_jobs()], ["failed"])
        self.assertEqual([r.outcome for r in run_jobs(include_scheduled=True)], ["dead"])
        self.assertEqual((job(created.id).status, job(created.id).attempts), ("dead", 2))

    def test_a_permanent_error_fails_the_test_when_asked(self) -> None:
        pgqueue.enqueue("test.permanent", {"reason": "no"})

        with self.assertRaisesMessage(JobsFailed, "PermanentError: no"):
            run_jobs(raise_on_failure=True)

    def test_a_chain_runs_and_the_assertions_see_it(self) -> None:
        pgqueue.enqueue("test.chain", {"next": "test.echo", "with": {"n": 1}}, tenant="acme")

        run_jobs().raise_failures()

        assert_enqueued("test.echo", count=1, status="done", tenant="acme")
        assert_not_enqueued(status=["queued", "scheduled"])
        with self.assertRaisesMessage(AssertionError, "found 0.\nThe 2 job(s) enqueued:"):
            assert_enqueued("test.echo", status="queued")


class RunJobsInATransactionTestCase(TransactionTestCase):
    """Committed as it goes: another connection sees each outcome."""

    def test_outcomes_are_committed(self) -> None:
        first, _ = pgqueue.enqueue(
            "test.chain", {"next": "test.permanent", "with": {"reason": "x"}}
        )

        report = run_jobs()

        second = report.runs[1].id
        self.assertEqual(report.outcomes, {first.id: "done", second: "dead"})
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        with psycopg.connect(**params) as other:
            rows = other.execute("SELECT id, status FROM pgqueue_job ORDER BY id").fetchall()
        self.assertEqual(rows, [(first.id, "done"), (second, "dead")])
