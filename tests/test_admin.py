"""The Django admin: jobs, tenants, workers and API keys (the dashboard has its own tests).

Every page is requested through Django's test client against the real PostgreSQL, as a
logged-in superuser (pytest-django's ``admin_client``) unless a test is about who may see
what. State changes are checked both in the messages the operator reads and in the rows.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.html import escape

import pgqueue
from pgqueue import keys, services, store
from pgqueue.admin import common as admin_common
from pgqueue.admin import jobs as admin_jobs
from pgqueue.models import ApiKey, Job, JobAttempt, Status, Tenant, Worker
from tests.api_fixtures import fresh_queue, make_job, status_of
from tests.conftest import claim, complete, fail

pytestmark = pytest.mark.django_db

JOBS = "/admin/pgqueue/job/"
TENANTS = "/admin/pgqueue/tenant/"
WORKERS = "/admin/pgqueue/worker/"
KEYS = "/admin/pgqueue/apikey/"

#: What ``format_seconds`` prints: "12 ms", "3.40 s", "42 s", "5 min 3 s", "2 h 4 min", "3 d 1 h".
DURATION = re.compile(r"^(\d+ ms|\d\.\d\d s|\d+ s|\d+ min \d+ s|\d+ h \d+ min|\d+ d \d+ h)$")


# -- helpers ------------------------------------------------------------------------------


def change_url(job_id: int) -> str:
    return f"{JOBS}{job_id}/change/"


def listed_ids(response: Any) -> set[int]:
    """The ids of the jobs on the changelist page (from its context)."""
    assert response.status_code == 200, response.status_code
    return {obj.pk for obj in response.context["cl"].result_list}


def table_rows(html: str) -> list[dict[str, str]]:
    """The changelist's rows: each a dict of its cells' HTML by column name."""
    body = html.split('id="result_list"', 1)[1].split("</table>", 1)[0]
    rows = []
    for chunk in body.split("<tr")[1:]:
        cells = re.findall(r'<t[dh] class="field-(\w+)[^"]*">(.*?)</t[dh]>', chunk, re.S)
        if cells:
            rows.append({name: content.strip() for name, content in cells})
    return rows


def row_cells(html: str, value: Any, column: str | None = None) -> dict[str, str]:
    """The one row whose ``column`` (the first column by default) reads ``value``."""
    found = []
    for row in table_rows(html):
        key = column or next(iter(row))
        if text(row[key]) == str(value):
            found.append(row)
    assert len(found) == 1, f"{len(found)} rows for {value!r} on the page"
    return found[0]


def headers(html: str) -> list[str]:
    """The changelist's column headers, as the page prints them (before CSS upper-cases)."""
    head = html.split('id="result_list"', 1)[1].split("</thead>", 1)[0]
    cells = re.findall(r'<th scope="col"[^>]*>(.*?)</th>', head, re.S)
    return [t for t in (text(c) for c in cells) if t]


#: How the admin prints a moment: to the second, with the time zone's name.
MOMENT = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [A-Z]+")


def text(cell: str) -> str:
    """A cell's text without its tags."""
    return re.sub(r"<[^>]+>", "", cell).strip()


def messages_of(response: Any) -> list[tuple[str, str]]:
    """(level tag, text) of the messages the response carries or shows."""
    return [(m.level_tag, str(m)) for m in get_messages(response.wsgi_request)]


def act(client: Client, action: str, ids: list[int], url: str = JOBS, **extra: Any) -> Any:
    """Run a changelist action on ``ids`` as the admin's action form does."""
    data = {"action": action, "_selected_action": [str(i) for i in ids], "index": "0"}
    data.update(extra)
    return client.post(url, data, follow=True)


def statuses(ids: list[int]) -> list[str]:
    return [status_of(i) for i in ids]


def staff_user(username: str, *perms: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def failed_twice(tenant: str = "default") -> int:
    """A job whose first attempt failed through the conftest ``fail`` helper and whose
    second failed with a real multi-line traceback (with HTML-special characters)."""
    queue = fresh_queue()
    job, _ = services.enqueue(
        "test.echo", {"b": [1, 2], "a": {"x": "<y>"}}, tenant=tenant, queue=queue
    )
    (first,) = claim("w1", queues=(queue,))
    assert fail("w1", first) == "scheduled"
    services.run_jobs_now([job.pk])
    (second,) = claim("w2", queues=(queue,))
    with connection.cursor() as cur:
        new = store.fail_many(
            cur,
            worker="w2",
            failures=[store.Failure(second.id, second.attempt, "KeyError: 'x'", TRACEBACK, True)],
        )
    assert new == {job.pk: "dead"}
    return job.pk


TRACEBACK = """Traceback (most recent call last):
  File "tasks.py", line 3, in handler
    if payload["a"] < limit:
KeyError: 'x'"""


# -- job changelist -----------------------------------------------------------------------


class TestJobChangelist:
    def test_renders_badge_tenant_task_attempts_age_and_run_time(self, admin_client):
        queued = make_job("queued", tenant="acme")
        done = make_job("done", tenant="beta")
        # A live worker serving the task: the task cell is the task alone (no flag).
        Worker.objects.create(
            id="w", host="h", pid=1, queues=["default"], tasks=["test.echo"], concurrency=1
        )
        response = admin_client.get(JOBS)
        assert response.status_code == 200
        html = response.content.decode()

        cells = row_cells(html, queued)
        assert set(cells) >= {"id", "status_badge", "tenant_name", "task_served", "tries", "age"}
        assert "<span" in cells["status_badge"]
        assert admin_jobs.STATUS_COLOURS[Status.QUEUED] in cells["status_badge"]
        assert text(cells["status_badge"]) == "queued"
        assert text(cells["tenant_name"]) == "acme"
        assert text(cells["task_served"]) == "test.echo"
        assert text(cells["tries"]) == "0/5"
        assert DURATION.match(text(cells["age"])), cells["age"]
        assert text(cells["run_time"]) == "—"
        assert f'href="{change_url(queued)}' in cells["id"]

        cells = row_cells(html, done)
        assert admin_jobs.STATUS_COLOURS[Status.DONE] in cells["status_badge"]
        assert text(cells["status_badge"]) == "done"
        assert text(cells["tenant_name"]) == "beta"
        assert text(cells["tries"]) == "1/5"
        assert DURATION.match(text(cells["run_time"])), cells["run_time"]

    def test_tries_say_the_leases_lost_before_a_start(self, admin_client):
        """Claims given back uncounted (JOB_REAP_EXPIRED) are shown beside the attempts."""
        job_id = make_job("queued")
        Job.objects.filter(pk=job_id).update(lost_claims=2)
        cells = row_cells(admin_client.get(JOBS).content.decode(), job_id)
        assert text(cells["tries"]) == "0/5 (+2 lost before its start)"

    def test_the_status_filter_narrows_the_list(self, admin_client):
        ids = {state: make_job(state) for state in ("queued", "scheduled", "dead", "done")}
        for state, job_id in ids.items():
            assert listed_ids(admin_client.get(JOBS, {"status__exact": state})) == {job_id}
        assert listed_ids(admin_client.get(JOBS)) == set(ids.values())

    def test_the_queue_filter_narrows_the_list_and_lists_known_queues(self, admin_client):
        a = services.enqueue("test.echo", {}, queue="alpha").job.pk
        b = services.enqueue("test.echo", {}, queue="bravo").job.pk
        response = admin_client.get(JOBS)
        assert b'?queue=alpha"' in response.content
        assert b'?queue=bravo"' in response.content
        assert listed_ids(admin_client.get(JOBS, {"queue": "alpha"})) == {a}
        assert listed_ids(admin_client.get(JOBS, {"queue": "bravo"})) == {b}

    def test_the_tenant_filter_narrows_the_list(self, admin_client):
        acme = make_job("queued", tenant="acme")
        beta = make_job("dead", tenant="beta")
        assert b'?tenant=acme"' in admin_client.get(JOBS).content
        assert listed_ids(admin_client.get(JOBS, {"tenant": "acme"})) == {acme}
        assert listed_ids(admin_client.get(JOBS, {"tenant": "beta"})) == {beta}

    def test_the_task_filter_narrows_the_list(self, admin_client):
        echo = services.enqueue("test.echo", {}).job.pk
        limited = services.enqueue("test.limited", {}).job.pk
        assert b'?task=test.limited"' in admin_client.get(JOBS).content
        assert listed_ids(admin_client.get(JOBS, {"task": "test.echo"})) == {echo}
        assert listed_ids(admin_client.get(JOBS, {"task": "test.limited"})) == {limited}

    def test_the_created_date_filter_narrows_the_list(self, admin_client):
        new = services.enqueue("test.echo", {}).job.pk
        old = services.enqueue("test.echo", {}).job.pk
        Job.objects.filter(pk=old).update(created_at=timezone.now() - dt.timedelta(days=40))
        response = admin_client.get(JOBS)
        (spec,) = [s for s in response.context["cl"].filter_specs if s.title == "created at"]
        links = {c["display"]: c["query_string"] for c in spec.choices(response.context["cl"])}
        assert listed_ids(admin_client.get(JOBS + links["Today"])) == {new}
        assert listed_ids(admin_client.get(JOBS + links["Past 7 days"])) == {new}
        assert listed_ids(admin_client.get(JOBS + links["Any date"])) == {new, old}

    def test_search_by_id(self, admin_client):
        wanted = make_job("queued")
        make_job("queued")
        assert listed_ids(admin_client.get(JOBS, {"q": str(wanted)})) == {wanted}
        assert listed_ids(admin_client.get(JOBS, {"q": f"  {wanted} "})) == {wanted}

    def test_search_by_idempotency_key(self, admin_client):
        wanted = services.enqueue("test.echo", {}, idempotency_key="order-42").job.pk
        numeric = services.enqueue("test.echo", {}, idempotency_key="777777").job.pk
        make_job("queued")
        assert listed_ids(admin_client.get(JOBS, {"q": "order-42"})) == {wanted}
        assert listed_ids(admin_client.get(JOBS, {"q": "777777"})) == {numeric}

    def test_search_by_task_name(self, admin_client):
        wanted = services.enqueue("test.limited", {}).job.pk
        make_job("queued")
        assert listed_ids(admin_client.get(JOBS, {"q": "test.limited"})) == {wanted}

    def test_the_list_holds_the_newest_list_window_jobs_and_an_id_finds_any(self, admin_client):
        """No filter, search, sort or page reads the whole history: the list is the newest
        LIST_WINDOW jobs (of the tenant filtered on); a job's id still finds an old one."""
        old = services.enqueue("test.limited", {}, tenant="small").job.pk
        newer = services.enqueue_many("test.echo", [{}] * 3, tenant="big")
        with override_settings(PGQUEUE={"LIST_WINDOW": 3}):
            assert listed_ids(admin_client.get(JOBS)) == set(newer)
            assert listed_ids(admin_client.get(JOBS, {"q": "test.limited"})) == set()
            assert listed_ids(admin_client.get(JOBS, {"q": str(old)})) == {old}
            # The tenant's own window: other tenants' newer jobs do not push it out.
            assert listed_ids(admin_client.get(JOBS, {"tenant": "small"})) == {old}
            response = admin_client.get(JOBS)
            assert "holds the newest 3 jobs" in response.content.decode()

    def test_search_for_nothing_or_an_enormous_number_is_an_empty_page(self, admin_client):
        make_job("queued")
        assert listed_ids(admin_client.get(JOBS, {"q": "no-such-key"})) == set()
        assert listed_ids(admin_client.get(JOBS, {"q": "9" * 30})) == set()


# -- job change page ----------------------------------------------------------------------


class TestJobChangePage:
    def test_is_read_only_without_save_or_delete(self, admin_client):
        job_id = make_job("queued")
        response = admin_client.get(change_url(job_id))
        assert response.status_code == 200
        html = response.content.decode()
        for button in ('name="_save"', 'name="_continue"', 'name="_addanother"'):
            assert button not in html
        assert f"{JOBS}{job_id}/delete/" not in html
        for field in ("status", "priority", "payload", "task", "queue", "max_attempts"):
            assert f'name="{field}"' not in html
        assert "<textarea" not in html
        assert '<div class="readonly">' in html

    def test_a_post_is_refused_and_changes_nothing(self, admin_client):
        job_id = make_job("queued")
        before = Job.objects.values().get(pk=job_id)
        response = admin_client.post(
            change_url(job_id),
            {"status": "done", "priority": "99", "payload": "{}", "_save": "Save"},
        )
        assert response.status_code == 403
        assert Job.objects.values().get(pk=job_id) == before

    def test_shows_the_payload_and_result_pretty_printed(self, admin_client):
        payload = {"text": "héllo <b>", "nested": {"list": [1, 2], "flag": True}}
        job, _ = services.enqueue("test.echo", payload, queue=(queue := fresh_queue()))
        (claimed,) = claim("w1", queues=(queue,))
        result = {"words": 2, "seen": ["héllo", "<b>"]}
        assert complete("w1", claimed, json.dumps(result))
        html = admin_client.get(change_url(job.pk)).content.decode()
        for value in (payload, result):
            pretty = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
            assert "\n" in pretty
            assert escape(pretty) in html
        assert escape("héllo <b>") in html
        assert "héllo <b>" not in html  # user data is escaped

    def test_a_payload_nested_past_the_bound_is_refused_and_one_at_it_is_shown(self, admin_client):
        """A payload nested 900 levels deep was accepted and then ended the admin's job
        page in a RecursionError (decoding it, deep in the admin's stack). Protection:
        PGQUEUE["MAX_JSON_DEPTH"] (100) bounds it at enqueue, in Python and over HTTP
        alike; a payload at the bound is shown."""
        from tests.api_fixtures import assert_error, client, new_key

        def nested(depth: int) -> Any:
            value: Any = "bottom"
            for _ in range(depth):
                value = [value]
            return value

        with pytest.raises(pgqueue.InvalidJob) as exc:
            services.enqueue("test.echo", nested(900))
        assert exc.value.field == "payload" and "MAX_JSON_DEPTH" in exc.value.reason
        body = {"task": "test.echo", "payload": nested(101)}
        assert_error(client(new_key()).post("/jobs", body, format="json"), 400, field="payload")
        assert not Job.objects.exists()
        job, _ = services.enqueue("test.echo", nested(100))
        response = admin_client.get(change_url(job.pk))
        assert response.status_code == 200
        assert "bottom" in response.content.decode()

    def test_a_job_without_result_shows_a_dash(self, admin_client):
        job_id = make_job("queued")
        response = admin_client.get(change_url(job_id))
        assert response.status_code == 200
        html = response.content.decode()
        assert re.search(r'field-result_pretty.*?<div class="readonly">—</div>', html, re.S)

    def test_shows_the_attempt_history_with_readable_tracebacks(self, admin_client):
        job_id = failed_twice()
        response = admin_client.get(change_url(job_id))
        assert response.status_code == 200
        html = response.content.decode()
        attempts = JobAttempt.objects.filter(job_id=job_id).order_by("id")
        assert [(a.attempt, a.outcome) for a in attempts] == [(1, "failed"), (2, "failed")]
        # The inline lists both attempts, with worker, error and traceback.
        assert "RuntimeError: boom" in html
        assert escape("KeyError: 'x'") in html
        assert "w1" in html and "w2" in html
        # The conftest helper's traceback ("tb") and the real one, each in a <pre>.
        assert re.search(r"<summary>show</summary><pre[^>]*>tb</pre>", html)
        assert f">{escape(TRACEBACK)}</pre>" in html
        assert "\n    if payload" in html  # the lines stay lines
        assert 'if payload["a"] <' not in html  # and the text is escaped
        # The inline is read-only too: no inputs for attempts, no delete boxes.
        assert 'name="history-0-error"' not in html
        assert 'name="history-0-DELETE"' not in html

    def test_no_add_page_and_no_delete(self, admin_client):
        job_id = make_job("dead")
        assert admin_client.get(f"{JOBS}add/").status_code == 403
        assert admin_client.post(f"{JOBS}add/", {"task": "test.echo"}).status_code == 403
        assert admin_client.get(f"{JOBS}{job_id}/delete/").status_code == 403
        assert admin_client.post(f"{JOBS}{job_id}/delete/", {"post": "yes"}).status_code == 403
        html = admin_client.get(JOBS).content.decode()
        assert f'href="{JOBS}add/"' not in html
        assert 'value="delete_selected"' not in html
        response = act(admin_client, "delete_selected", [job_id], post="yes")
        assert response.status_code == 200
        assert Job.objects.filter(pk=job_id).exists()
        assert ("warning", "No action selected.") in messages_of(response)


# -- actions ------------------------------------------------------------------------------


class TestActions:
    def test_the_changelist_offers_the_three_actions(self, admin_client):
        html = admin_client.get(JOBS).content.decode()
        for action in ("retry_jobs", "cancel_jobs", "run_now"):
            assert f'value="{action}"' in html

    def test_retry_changes_only_dead_and_cancelled_jobs(self, admin_client):
        dead, cancelled = make_job("dead"), make_job("cancelled")
        others = [make_job("queued"), make_job("running"), make_job("done")]
        response = act(admin_client, "retry_jobs", [dead, cancelled, *others])
        assert response.status_code == 200
        msgs = messages_of(response)
        assert ("success", "Retried 2 job(s).") in msgs
        (warning,) = [m for level, m in msgs if level == "warning"]
        assert warning.startswith("Skipped 3 job(s) (1 done, 1 queued, 1 running), e.g. job ")
        assert warning.endswith("only dead or cancelled jobs can be retried.")
        assert statuses([dead, cancelled]) == ["queued", "queued"]
        assert statuses(others) == ["queued", "running", "done"]
        assert Job.objects.get(pk=dead).attempts == 0

    def test_cancel_changes_only_scheduled_and_queued_jobs(self, admin_client):
        scheduled, queued = make_job("scheduled"), make_job("queued")
        others = [make_job("running"), make_job("done"), make_job("dead")]
        response = act(admin_client, "cancel_jobs", [scheduled, queued, *others])
        msgs = messages_of(response)
        assert ("success", "Cancelled 2 job(s).") in msgs
        assert any(m.startswith("Asked 1 running job(s) to stop") for _, m in msgs)
        (warning,) = [m for level, m in msgs if level == "warning"]
        assert warning.startswith("Skipped 2 job(s) (1 dead, 1 done), e.g. job ")
        assert warning.endswith("only waiting, scheduled, queued or running jobs can be cancelled.")
        assert statuses([scheduled, queued]) == ["cancelled", "cancelled"]
        assert statuses(others) == ["running", "done", "dead"]  # running: asked to stop

    def test_run_now_changes_only_scheduled_jobs(self, admin_client):
        first, second = make_job("scheduled"), make_job("scheduled")
        others = [make_job("queued"), make_job("cancelled")]
        response = act(admin_client, "run_now", [first, second, *others])
        msgs = messages_of(response)
        assert ("success", "Made runnable 2 job(s).") in msgs
        (warning,) = [m for level, m in msgs if level == "warning"]
        assert warning.startswith("Skipped 2 job(s) (1 cancelled, 1 queued), e.g. job ")
        assert warning.endswith("only scheduled jobs can be run now.")
        assert statuses([first, second]) == ["queued", "queued"]
        assert statuses(others) == ["queued", "cancelled"]
        assert all(j.run_at <= timezone.now() for j in Job.objects.filter(pk__in=[first, second]))

    def test_when_all_change_there_is_no_warning(self, admin_client):
        ids = [make_job("queued"), make_job("queued")]
        msgs = messages_of(act(admin_client, "cancel_jobs", ids))
        assert msgs == [("success", "Cancelled 2 job(s).")]
        assert statuses(ids) == ["cancelled", "cancelled"]

    def test_when_none_change_the_count_is_zero_and_the_reason_given(self, admin_client):
        running = make_job("running")
        msgs = messages_of(act(admin_client, "retry_jobs", [running]))
        assert ("success", "Retried 0 job(s).") in msgs
        assert (
            "warning",
            f"Skipped 1 job(s) (1 running), e.g. job {running} is running; "
            "only dead or cancelled jobs can be retried.",
        ) in msgs
        assert status_of(running) == "running"

    def test_select_across_acts_on_the_filtered_list_only(self, admin_client):
        acme = [make_job("queued", tenant="acme"), make_job("scheduled", tenant="acme")]
        beta = make_job("queued", tenant="beta")
        response = act(
            admin_client, "cancel_jobs", [acme[0]], url=f"{JOBS}?tenant=acme", select_across="1"
        )
        assert ("success", "Cancelled 2 job(s).") in messages_of(response)
        assert statuses(acme) == ["cancelled", "cancelled"]
        assert status_of(beta) == "queued"

    def test_without_a_selection_nothing_changes(self, admin_client):
        queued = make_job("queued")
        response = admin_client.post(JOBS, {"action": "cancel_jobs", "index": "0"}, follow=True)
        assert response.status_code == 200
        assert any("Items must be selected" in m for _, m in messages_of(response))
        assert status_of(queued) == "queued"


# -- a job page's buttons -----------------------------------------------------------------


def buttons(html: str) -> list[tuple[str, str]]:
    """(action, form URL) of each button on a job's page, each its own POST form with a
    CSRF token."""
    found = re.findall(
        r'<form method="post" action="([^"]+)" class="pgq-job-action" data-action="([\w-]+)">'
        r"\s*<input type=\"hidden\" name=\"csrfmiddlewaretoken\" value=\"[^\"]+\">",
        html,
    )
    return [(action, url) for url, action in found]


def button_url(job_id: int, action: str) -> str:
    return f"{JOBS}{job_id}/{action}/"


class TestJobButtons:
    @pytest.mark.parametrize(
        ("state", "offered"),
        [
            ("dead", ["retry"]),
            ("cancelled", ["retry"]),
            ("scheduled", ["cancel", "run-now"]),
            ("queued", ["cancel"]),
            ("running", ["cancel"]),
            ("done", []),
        ],
    )
    def test_a_job_page_offers_the_actions_its_status_allows(self, admin_client, state, offered):
        job_id = make_job(state)
        html = admin_client.get(change_url(job_id)).content.decode()
        assert buttons(html) == [(a, button_url(job_id, a)) for a in offered]
        labels = {"retry": "Retry", "cancel": "Cancel", "run-now": "Run now"}
        for action in offered:
            assert f'class="pgq-job-action">{labels[action]}</button>' in html

    @pytest.mark.parametrize(
        ("state", "action", "message", "after"),
        [
            ("dead", "retry", "Retried 1 job(s).", "queued"),
            ("cancelled", "retry", "Retried 1 job(s).", "queued"),
            ("scheduled", "cancel", "Cancelled 1 job(s).", "cancelled"),
            ("queued", "cancel", "Cancelled 1 job(s).", "cancelled"),
            ("scheduled", "run-now", "Made runnable 1 job(s).", "queued"),
        ],
    )
    def test_a_button_calls_the_service_and_says_so(
        self, admin_client, state, action, message, after
    ):
        job_id = make_job(state)
        other = make_job(state)
        response = admin_client.post(button_url(job_id, action))
        assert response.status_code == 302
        assert response["Location"] == change_url(job_id)
        page = admin_client.get(response["Location"])
        assert ("success", message) in messages_of(page)
        assert message in page.content.decode()
        assert status_of(job_id) == after
        assert status_of(other) == state  # that job only
        if action == "retry":
            assert Job.objects.get(pk=job_id).attempts == 0

    def test_a_job_that_moved_on_is_skipped_with_the_reason(self, admin_client):
        job_id = make_job("dead")
        html = admin_client.get(change_url(job_id)).content.decode()
        assert [a for a, _ in buttons(html)] == ["retry"]
        services.retry_jobs([job_id])  # someone else was quicker
        (claimed,) = claim("w9", queues=(Job.objects.get(pk=job_id).queue,))
        response = admin_client.post(button_url(job_id, "retry"), follow=True)
        msgs = messages_of(response)
        assert ("success", "Retried 0 job(s).") in msgs
        assert (
            "warning",
            f"Skipped 1 job(s) (1 running), e.g. job {job_id} is running; "
            "only dead or cancelled jobs can be retried.",
        ) in msgs
        assert status_of(claimed.id) == "running"

    def test_get_is_refused_and_changes_nothing(self, admin_client):
        job_id = make_job("dead")
        assert admin_client.get(button_url(job_id, "retry")).status_code == 405
        assert status_of(job_id) == "dead"

    def test_a_post_without_the_csrf_token_is_refused(self, admin_user):
        client = Client(enforce_csrf_checks=True)
        client.force_login(admin_user)
        job_id = make_job("dead")
        assert client.post(button_url(job_id, "retry")).status_code == 403
        assert status_of(job_id) == "dead"
        # The page's own form carries the token, and then it works.
        page = client.get(change_url(job_id)).content.decode()
        token = re.search(
            r'data-action="retry">\s*<input type="hidden" name="csrfmiddlewaretoken" '
            r'value="([^"]+)"',
            page,
        ).group(1)
        response = client.post(button_url(job_id, "retry"), {"csrfmiddlewaretoken": token})
        assert response.status_code == 302
        assert status_of(job_id) == "queued"

    def test_without_change_job_there_are_no_buttons_and_a_post_is_403(self, db):
        client = logged_in(staff_user("viewer", "view_job"))
        job_id = make_job("dead")
        response = client.get(change_url(job_id))
        assert response.status_code == 200
        assert buttons(response.content.decode()) == []
        assert client.post(button_url(job_id, "retry")).status_code == 403
        assert status_of(job_id) == "dead"
        # With change_job, the same user gets them.
        user = User.objects.get(username="viewer")
        user.user_permissions.add(Permission.objects.get(codename="change_job"))
        client = logged_in(user)
        assert [a for a, _ in buttons(client.get(change_url(job_id)).content.decode())] == ["retry"]
        assert client.post(button_url(job_id, "retry")).status_code == 302
        assert status_of(job_id) == "queued"

    def test_anonymous_users_are_sent_to_the_login_page(self, client):
        job_id = make_job("scheduled")
        for action in ("cancel", "run-now"):
            response = client.post(button_url(job_id, action))
            assert response.status_code == 302
            assert response["Location"].startswith("/admin/login/")
        assert status_of(job_id) == "scheduled"

    def test_an_unknown_job_is_reported_missing(self, admin_client):
        response = admin_client.post(button_url(999_999_999, "cancel"), follow=True)
        assert any("job 999999999 does not exist" in m for _, m in messages_of(response))


# -- times to the second, durations in ms, column headers ------------------------------------


class TestTimesAndHeaders:
    def test_a_job_page_shows_every_moment_to_the_second_and_the_run_time_in_ms(self, admin_client):
        job_id = failed_twice()
        started = timezone.now().replace(microsecond=0) - dt.timedelta(seconds=7)
        JobAttempt.objects.filter(job_id=job_id).update(
            started_at=started, finished_at=started + dt.timedelta(milliseconds=250)
        )
        Job.objects.filter(pk=job_id).update(
            started_at=started, finished_at=started + dt.timedelta(milliseconds=850)
        )
        job = Job.objects.get(pk=job_id)
        html = admin_client.get(change_url(job_id)).content.decode()
        for field, value in (
            ("runs_at", job.run_at),
            ("created", job.created_at),
            ("started", job.started_at),
            ("finished", job.finished_at),
        ):
            shown = re.search(
                rf'field-{field}">.*?<div class="readonly">(.*?)</div>', html, re.S
            ).group(1)
            assert MOMENT.fullmatch(shown), (field, shown)
            assert shown == admin_common.format_timestamp(value)
            assert shown.startswith(timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S"))
        assert re.search(r'field-run_time">.*?<div class="readonly">850 ms</div>', html, re.S)
        # The attempts: each start and end to the second, and each run time.
        inline = html.split('id="history-group"', 1)[1]
        assert len(re.findall(r'field-started">\s*<p>' + MOMENT.pattern, inline)) == 2
        assert len(re.findall(r'field-finished">\s*<p>' + MOMENT.pattern, inline)) == 2
        assert len(re.findall(r'field-run_time">\s*<p>250 ms</p>', inline)) == 2
        assert not re.search(r"\b[ap]\.m\.", html)  # not the locale's minute-only format

    def test_the_job_list_prints_short_run_times_in_ms(self, admin_client):
        job_id = make_job("done")
        start = timezone.now() - dt.timedelta(minutes=1)
        Job.objects.filter(pk=job_id).update(
            started_at=start, finished_at=start + dt.timedelta(milliseconds=420)
        )
        cells = row_cells(admin_client.get(JOBS).content.decode(), job_id)
        assert text(cells["run_time"]) == "420 ms"

    def test_the_worker_and_key_lists_show_moments_to_the_second(self, admin_client):
        now = timezone.now()
        Worker.objects.create(
            id="box:1", host="box", pid=1, queues=["default"], concurrency=2, stopped_at=now
        )
        row, _ = keys.create_api_key(name="ci")
        ApiKey.objects.filter(pk=row.pk).update(last_used_at=now, revoked_at=now)
        html = admin_client.get(WORKERS).content.decode()
        cells = row_cells(html, "box")
        for column in ("started", "last_seen"):
            assert MOMENT.fullmatch(text(cells[column])), cells[column]
        page = admin_client.get(f"{WORKERS}box:1/change/").content.decode()
        assert len(re.findall(r'<div class="readonly">' + MOMENT.pattern, page)) == 3
        cells = row_cells(admin_client.get(KEYS).content.decode(), row.prefix)
        for column in ("created", "last_used", "revoked"):
            assert MOMENT.fullmatch(text(cells[column])), cells[column]
        assert text(cells["revoked"]) == admin_common.format_timestamp(now)

    def test_no_column_header_reads_like_a_foreign_key_column(self, admin_client):
        make_job("queued", tenant="acme")
        keys.create_api_key(name="ci")
        Worker.objects.create(id="box:1", host="box", pid=1, queues=[], concurrency=1)
        job_headers = headers(admin_client.get(JOBS).content.decode())
        assert "Tenant" in job_headers
        for url in (JOBS, TENANTS, WORKERS, KEYS):
            found = headers(admin_client.get(url).content.decode())
            assert found, url
            assert not [h for h in found if re.search(r"\bid$", h, re.I) and h != "Id"], found
        page = admin_client.get(change_url(Job.objects.get().pk)).content.decode()
        assert re.search(r'field-tenant_name">.*?<label>Tenant:</label>', page, re.S)
        assert "Tenant id" not in page


# -- queues no live worker serves ------------------------------------------------------------


class TestUnservedQueues:
    def test_the_job_filter_and_the_worker_list_flag_them(self, admin_client):
        services.enqueue("test.echo", {}, queue="served")
        services.enqueue("test.echo", {}, queue="orphan")
        Worker.objects.create(id="w:1", host="w", pid=1, queues=["served"], concurrency=1)
        html = admin_client.get(JOBS).content.decode()
        assert "orphan (no live worker serves this queue)" in html
        assert "served (no live worker" not in html
        response = admin_client.get(WORKERS)
        assert (
            "warning",
            "Queue 'orphan' has runnable jobs and no live worker serves this queue.",
        ) in messages_of(response)
        assert "no live worker serves this queue" in response.content.decode()
        assert not [m for _, m in messages_of(response) if "'served'" in m]


# -- who may see and do what --------------------------------------------------------------


class TestAccess:
    def test_anonymous_users_are_sent_to_the_login_page(self, client):
        job_id = make_job("dead")
        for url in (JOBS, change_url(job_id), TENANTS, WORKERS, KEYS):
            response = client.get(url)
            assert response.status_code == 302, url
            assert response["Location"].startswith("/admin/login/"), url
        response = client.post(
            JOBS, {"action": "retry_jobs", "_selected_action": [str(job_id)], "index": "0"}
        )
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")
        assert status_of(job_id) == "dead"

    def test_non_staff_users_are_sent_to_the_login_page(self, db):
        user = User.objects.create_user("mallory", password="pw", is_staff=False)
        for perm in ("view_job", "change_job"):
            user.user_permissions.add(Permission.objects.get(codename=perm))
        client = logged_in(user)
        job_id = make_job("dead")
        for url in (JOBS, change_url(job_id), TENANTS):
            response = client.get(url)
            assert response.status_code == 302, url
            assert response["Location"].startswith("/admin/login/"), url
        response = client.post(
            JOBS, {"action": "retry_jobs", "_selected_action": [str(job_id)], "index": "0"}
        )
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")
        assert status_of(job_id) == "dead"

    def test_staff_without_permissions_get_403(self, db):
        client = logged_in(staff_user("intern"))
        job_id = make_job("dead")
        assert client.get(JOBS).status_code == 403
        assert client.get(change_url(job_id)).status_code == 403
        assert client.get(TENANTS).status_code == 403
        response = client.post(
            JOBS, {"action": "retry_jobs", "_selected_action": [str(job_id)], "index": "0"}
        )
        assert response.status_code == 403
        assert status_of(job_id) == "dead"

    def test_staff_with_view_permission_only_see_jobs_but_cannot_act(self, db):
        client = logged_in(staff_user("viewer", "view_job"))
        job_id = make_job("dead")
        response = client.get(JOBS)
        assert response.status_code == 200
        assert job_id in listed_ids(response)
        assert 'value="retry_jobs"' not in response.content.decode()
        assert client.get(change_url(job_id)).status_code == 200
        response = act(client, "retry_jobs", [job_id])
        assert response.status_code in (200, 403)
        assert not [m for level, m in messages_of(response) if m.startswith("Retried")]
        assert status_of(job_id) == "dead"


# -- tenants ------------------------------------------------------------------------------


def weight_form(tenants: list[Tenant], **weights: Any) -> dict[str, Any]:
    """The changelist's list-editable form for ``tenants`` (in page order), with the
    weights of ``weights`` changed."""
    data: dict[str, Any] = {
        "form-TOTAL_FORMS": str(len(tenants)),
        "form-INITIAL_FORMS": str(len(tenants)),
        "form-MIN_NUM_FORMS": "0",
        "form-MAX_NUM_FORMS": "1000",
        "_save": "Save",
    }
    for i, tenant in enumerate(tenants):
        data[f"form-{i}-name"] = tenant.name
        data[f"form-{i}-weight"] = str(weights.get(tenant.name, tenant.weight))
    return data


class TestTenants:
    def test_the_list_shows_counts_and_share_of_the_last_hour(self, admin_client):
        for state, n in (("queued", 2), ("scheduled", 1), ("running", 1), ("done", 3)):
            for _ in range(n):
                make_job(state, tenant="acme")
        make_job("dead", tenant="acme")
        make_job("cancelled", tenant="acme")
        make_job("done", tenant="beta")
        make_job("queued", tenant="idle")
        response = admin_client.get(TENANTS)
        assert response.status_code == 200
        html = response.content.decode()

        columns = ("backlog", "running", "done", "dead", "share_last_hour")

        def shown(tenant: str) -> dict[str, str]:
            cells = row_cells(html, tenant)
            return {column: text(cells[column]) for column in columns}

        assert shown("acme") == dict(zip(columns, ["3", "1", "3", "1", "75%"], strict=True))
        assert shown("beta") == dict(zip(columns, ["0", "0", "1", "0", "25%"], strict=True))
        assert shown("idle") == dict(zip(columns, ["1", "0", "0", "0", "0%"], strict=True))

    def test_the_count_columns_sort(self, admin_client):
        for tenant, n in (("acme", 1), ("beta", 3), ("corp", 2)):
            for _ in range(n):
                make_job("queued", tenant=tenant)
        response = admin_client.get(TENANTS)
        columns = response.context["cl"].list_display
        for column in ("backlog", "running", "done", "dead", "share_last_hour"):
            index = columns.index(column)
            response = admin_client.get(TENANTS, {"o": f"-{index}"})
            assert response.status_code == 200, column
        response = admin_client.get(TENANTS, {"o": f"-{columns.index('backlog')}"})
        assert [t.name for t in response.context["cl"].result_list] == ["beta", "corp", "acme"]

    def test_share_is_a_dash_when_nothing_was_done_in_the_last_hour(self, admin_client):
        make_job("queued", tenant="acme")
        done = make_job("done", tenant="acme")
        JobAttempt.objects.filter(job_id=done).update(
            finished_at=timezone.now() - dt.timedelta(hours=2)
        )
        cells = row_cells(admin_client.get(TENANTS).content.decode(), "acme")
        assert text(cells["share_last_hour"]) == "—"
        assert text(cells["done"]) == "1"

    def test_the_weight_is_editable_in_the_list(self, admin_client, monkeypatch):
        make_job("queued", tenant="acme")
        make_job("queued", tenant="beta")
        response = admin_client.get(TENANTS)
        assert 'name="form-0-weight"' in response.content.decode()
        tenants = list(Tenant.objects.order_by("name"))
        calls: list[tuple[str, float]] = []
        real = services.set_tenant_weight

        def spy(tenant: str, weight: float, **kwargs: Any) -> None:
            calls.append((tenant, weight))
            real(tenant, weight, **kwargs)

        monkeypatch.setattr(services, "set_tenant_weight", spy)
        response = admin_client.post(TENANTS, weight_form(tenants, acme=2.5), follow=True)
        assert response.status_code == 200
        assert any("changed successfully" in m for _, m in messages_of(response))
        assert calls == [("acme", 2.5)]
        assert Tenant.objects.get(name="acme").weight == 2.5
        assert Tenant.objects.get(name="beta").weight == 1.0

    @pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "abc", ""])
    def test_a_weight_that_is_not_positive_is_refused_in_the_list(self, admin_client, bad):
        make_job("queued", tenant="acme")
        Tenant.objects.filter(name="acme").update(weight=3.0)
        tenants = list(Tenant.objects.order_by("name"))
        response = admin_client.post(TENANTS, weight_form(tenants, acme=bad))
        assert response.status_code == 200  # the list again, with the error
        formset = response.context["cl"].formset
        assert not formset.is_valid()
        (errors,) = [f.errors for f in formset.forms if f.instance.name == "acme"]
        assert errors, errors
        assert "errorlist" in response.content.decode()
        assert Tenant.objects.get(name="acme").weight == 3.0

    @pytest.mark.parametrize("bad", ["0", "-1"])
    def test_the_list_refuses_a_weight_with_the_admins_own_message(self, admin_client, bad):
        make_job("queued", tenant="acme")
        tenants = list(Tenant.objects.order_by("name"))
        response = admin_client.post(TENANTS, weight_form(tenants, acme=bad))
        assert response.status_code == 200
        assert "The weight must be greater than 0." in response.content.decode()
        assert Tenant.objects.get(name="acme").weight == 1.0

    @pytest.mark.parametrize("bad", ["0", "-1"])
    def test_the_change_page_refuses_a_weight_that_is_not_positive(self, admin_client, bad):
        make_job("queued", tenant="acme")
        response = admin_client.post(f"{TENANTS}acme/change/", {"weight": bad, "_save": "Save"})
        assert response.status_code == 200
        assert "The weight must be greater than 0." in response.content.decode()
        assert Tenant.objects.get(name="acme").weight == 1.0

    def test_the_change_page_saves_through_the_service(self, admin_client):
        make_job("queued", tenant="acme")
        response = admin_client.post(f"{TENANTS}acme/change/", {"weight": "4", "_save": "Save"})
        assert response.status_code == 302
        assert Tenant.objects.get(name="acme").weight == 4.0

    def test_adding_a_tenant_with_an_invalid_name_is_a_form_error(self, admin_client):
        admin_client.raise_request_exception = False
        response = admin_client.post(f"{TENANTS}add/", {"name": "not a name!", "weight": "1"})
        assert response.status_code == 200, f"got {response.status_code}, not a form error"
        assert "errorlist" in response.content.decode()
        assert not Tenant.objects.filter(name="not a name!").exists()

    def test_adding_a_tenant(self, admin_client):
        response = admin_client.post(f"{TENANTS}add/", {"name": "newco", "weight": "2"})
        assert response.status_code == 302
        assert Tenant.objects.get(name="newco").weight == 2.0

    def test_tenants_cannot_be_deleted(self, admin_client):
        make_job("queued", tenant="acme")
        assert admin_client.get(f"{TENANTS}acme/delete/").status_code == 403
        assert 'value="delete_selected"' not in admin_client.get(TENANTS).content.decode()


# -- workers ------------------------------------------------------------------------------


class TestWorkers:
    def test_the_list_shows_alive_stale_and_stopped(self, admin_client):
        now = timezone.now()
        for host, last_seen, stopped in (
            ("alive-host", now, None),
            ("stale-host", now - dt.timedelta(hours=1), None),
            ("stopped-host", now - dt.timedelta(seconds=5), now),
        ):
            Worker.objects.create(
                id=f"{host}:1",
                host=host,
                pid=1,
                queues=["default", "mail"],
                concurrency=4,
                started_at=now - dt.timedelta(hours=2),
                last_seen_at=last_seen,
                stopped_at=stopped,
            )
        response = admin_client.get(WORKERS)
        assert response.status_code == 200
        html = response.content.decode()
        states = {
            h: text(row_cells(html, f"{h}-host")["state"]) for h in ("alive", "stale", "stopped")
        }
        assert states == {"alive": "alive", "stale": "stale", "stopped": "stopped"}
        cells = row_cells(html, "alive-host")
        assert text(cells["queue_list"]) == "default, mail"
        assert text(cells["concurrency"]) == "4"
        assert "#198754" in cells["state"] and "#dc3545" in row_cells(html, "stale-host")["state"]

    def test_workers_are_read_only(self, admin_client):
        Worker.objects.create(id="w1", host="box", pid=1, concurrency=1, queues=[])
        assert admin_client.get(f"{WORKERS}add/").status_code == 403
        assert admin_client.get(f"{WORKERS}w1/delete/").status_code == 403
        response = admin_client.get(f"{WORKERS}w1/change/")
        assert response.status_code == 200
        assert 'name="_save"' not in response.content.decode()
        response = admin_client.post(f"{WORKERS}w1/change/", {"host": "evil", "pid": "2"})
        assert response.status_code == 403
        assert Worker.objects.get(pk="w1").host == "box"


# -- API keys -----------------------------------------------------------------------------


class TestApiKeys:
    @pytest.mark.parametrize("tenant", ["acme", ""])
    def test_adding_a_key_shows_it_once_and_stores_only_its_hash(self, admin_client, tenant):
        Tenant.objects.create(name="acme")
        response = admin_client.post(
            f"{KEYS}add/", {"tenant": tenant, "name": "ci", "_save": "Save"}
        )
        assert response.status_code == 200
        assert response.templates[0].name == "admin/pgqueue/apikey/created.html"
        html = response.content.decode()
        found = re.findall(r"pgq_[A-Za-z0-9_\-]{20,}", html)
        assert len(found) == 1, found
        key = found[0]
        assert html.count(key) == 1
        assert "Copy it now; it is not shown again." in html
        assert "no-store" in response["Cache-Control"]
        row = ApiKey.objects.get()
        assert (row.tenant_id, row.name) == (tenant or None, "ci")
        assert key.startswith(f"pgq_{row.prefix}_") and row.prefix in html
        assert key not in row.key_hash and len(row.key_hash) == 64
        for value in ApiKey.objects.values().get().values():
            assert key not in str(value)
        assert keys.authenticate_api_key(key).pk == row.pk
        # Not shown again: neither on the list nor on the key's page.
        assert key not in admin_client.get(KEYS).content.decode()
        assert key not in admin_client.get(f"{KEYS}{row.pk}/change/").content.decode()
        assert_nowhere_but_that_page(admin_client, response, key)

    def test_save_and_continue_or_add_another_show_the_key_the_same_way(self, admin_client):
        for button in ("_continue", "_addanother"):
            response = admin_client.post(f"{KEYS}add/", {"name": button, button: "1"})
            assert response.status_code == 200
            (key,) = re.findall(r"pgq_[A-Za-z0-9_\-]{20,}", response.content.decode())
            assert keys.authenticate_api_key(key).name == button
            assert_nowhere_but_that_page(admin_client, response, key)

    def test_the_revoke_action_sets_revoked_at(self, admin_client):
        first, key = keys.create_api_key(name="one")
        second, other = keys.create_api_key(name="two")
        html = admin_client.get(KEYS).content.decode()
        assert 'value="revoke"' in html
        assert text(row_cells(html, first.prefix)["scope"]) == "all tenants"
        response = act(admin_client, "revoke", [first.pk], url=KEYS)
        assert ("info", "Revoked 1 key(s).") in messages_of(response)
        first.refresh_from_db()
        second.refresh_from_db()
        assert first.revoked_at is not None
        assert second.revoked_at is None
        assert keys.authenticate_api_key(key) is None
        assert keys.authenticate_api_key(other) is not None

    def test_only_a_keys_scope_can_be_edited_and_keys_cannot_be_deleted(self, admin_client):
        row, _ = keys.create_api_key(name="one")
        response = admin_client.post(
            f"{KEYS}{row.pk}/change/", {"name": "renamed", "tenant": "acme", "tasks": ""}
        )
        assert response.status_code == 302
        assert admin_client.get(f"{KEYS}{row.pk}/delete/").status_code == 403
        row.refresh_from_db()
        assert (row.name, row.tenant_id) == ("one", None)


class TestWhoMayCreateWhichKey:
    """A staff user never hands out a key that can do more than they may themselves.

    Protection: ``admin.keys.key_refusal`` in the key form's clean(). Without it a staff
    user holding only add_apikey mints an all-tenants key by leaving the tenant blank, and
    with it pauses queues and sets weights their own session may not."""

    KEY_PERMS = ("add_apikey", "change_apikey", "view_apikey")
    JOB_PERMS = ("add_job", "view_job", "change_job")

    def login(self, client: Client, *perms: str) -> Client:
        name = f"keymaker{User.objects.count()}"
        client.force_login(staff_user(name, *perms))
        return client

    def test_an_all_tenants_key_needs_its_permission(self, client):
        self.login(client, *self.KEY_PERMS, *self.JOB_PERMS)
        response = client.post(f"{KEYS}add/", {"tenant": "", "name": "all", "_save": "Save"})
        assert response.status_code == 200
        assert "only a superuser" in response.content.decode()
        assert not re.findall(r"pgq_[A-Za-z0-9_\-]{20,}", response.content.decode())
        assert not ApiKey.objects.exists()

    def test_with_the_permission_it_is_created(self, client):
        self.login(client, *self.KEY_PERMS, *self.JOB_PERMS, "add_all_tenants_apikey")
        response = client.post(f"{KEYS}add/", {"tenant": "", "name": "all", "_save": "Save"})
        assert response.templates[0].name == "admin/pgqueue/apikey/created.html"
        assert ApiKey.objects.get().tenant_id is None

    def test_a_tenant_key_needs_the_job_permissions_it_hands_out(self, client):
        Tenant.objects.create(name="acme")
        self.login(client, *self.KEY_PERMS, "view_job")
        response = client.post(f"{KEYS}add/", {"tenant": "acme", "name": "t", "_save": "Save"})
        assert response.status_code == 200
        assert "pgqueue.add_job, pgqueue.change_job" in response.content.decode()
        assert not ApiKey.objects.exists()
        self.login(client, *self.KEY_PERMS, *self.JOB_PERMS)
        response = client.post(f"{KEYS}add/", {"tenant": "acme", "name": "t", "_save": "Save"})
        assert response.templates[0].name == "admin/pgqueue/apikey/created.html"
        assert ApiKey.objects.get().tenant_id == "acme"

    def test_an_all_tenants_keys_scope_is_not_changed_without_the_permission(self, client):
        row, _ = keys.create_api_key(name="all", queues=["emails"])
        self.login(client, *self.KEY_PERMS, *self.JOB_PERMS)
        response = client.post(f"{KEYS}{row.pk}/change/", {"tasks": "", "queues": ""})
        assert response.status_code == 200
        row.refresh_from_db()
        assert row.queues == ["emails"]


def assert_nowhere_but_that_page(client: Client, response: Any, key: str) -> None:
    """The new key is in no cookie (the messages cookie is signed, not encrypted), no
    message, no session, no log entry, and on no later page."""
    from django.contrib.admin.models import LogEntry
    from django.contrib.sessions.models import Session

    for cookie in response.cookies.values():
        assert key not in cookie.OutputString()
    assert key not in str(response.headers)
    assert not [m for _, m in messages_of(response) if key in m]
    for session in Session.objects.all():
        assert key not in json.dumps(session.get_decoded())
    for entry in LogEntry.objects.all():
        assert key not in f"{entry.object_repr} {entry.change_message}"
    for url in (KEYS, f"{KEYS}{ApiKey.objects.order_by('-pk').first().pk}/change/", "/admin/"):
        later = client.get(url)
        assert key not in later.content.decode()
        for cookie in later.cookies.values():
            assert key not in cookie.OutputString()
    assert key not in str(client.cookies)


# -- large tables -------------------------------------------------------------------------


def count_queries(queries: list[dict[str, str]]) -> list[str]:
    return [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]


def unbounded_job_counts(queries: list[dict[str, str]]) -> list[str]:
    """COUNTs over pgqueue_job (not pgqueue_job_attempt) without a LIMIT."""
    return [
        sql
        for sql in count_queries(queries)
        if re.search(r'FROM "pgqueue_job"(?!_)', sql) and "LIMIT" not in sql.upper()
    ]


def load(admin_client: Client, url: str, params: dict[str, str] | None = None) -> Any:
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(url, params or {})
    assert response.status_code == 200
    return response, ctx.captured_queries


def fill(n: int, **options: Any) -> None:
    pgqueue.enqueue_many("test.echo", [{"i": i} for i in range(n)], **options)
    with connection.cursor() as cur:
        cur.execute("ANALYZE pgqueue_job")


#: Most queries one page of the job list may take, whatever the table's size.
QUERY_BUDGET = 10


class TestLargeTables:
    @pytest.fixture(autouse=True)
    def low_bound(self, db, monkeypatch):
        monkeypatch.setattr(admin_common, "COUNT_BOUND", 100)
        yield
        # ANALYZE writes pg_class in place, past the test's rollback: leave the estimate of
        # an empty table behind (rows deleted by this transaction count as dead).
        with connection.cursor() as cur:
            cur.execute("DELETE FROM pgqueue_job_attempt")
            cur.execute("DELETE FROM pgqueue_job")
            cur.execute("ANALYZE pgqueue_job")

    def test_same_queries_for_20_and_5000_jobs_and_no_full_count(self, admin_client):
        fill(20)
        small_response, small = load(admin_client, JOBS)
        assert small_response.context["cl"].result_count == 20
        fill(4980, tenant="bulk")
        large_response, large = load(admin_client, JOBS)

        assert len(small) <= QUERY_BUDGET, [q["sql"] for q in small]
        assert len(large) <= QUERY_BUDGET, [q["sql"] for q in large]
        assert len(large) <= len(small)
        for queries in (small, large):
            assert not unbounded_job_counts(queries), count_queries(queries)
        # Unfiltered and past the bound, the planner's estimate is the count.
        assert any("reltuples" in q["sql"] for q in large)
        assert not [
            q
            for q in large
            if re.search(r'FROM "pgqueue_job"(?!_)', q["sql"]) and "COUNT(" in q["sql"].upper()
        ]
        assert large_response.context["cl"].result_count == 5000
        assert len(large_response.context["cl"].result_list) == 50

    def test_filtered_and_searched_lists_count_with_a_limit(self, admin_client):
        fill(20)
        small = {
            name: load(admin_client, JOBS, params)[1]
            for name, params in (("status", {"status__exact": "queued"}), ("q", {"q": "test.echo"}))
        }
        fill(4980, tenant="bulk")
        for name, params in (
            ("status", {"status__exact": "queued"}),
            ("q", {"q": "test.echo"}),
        ):
            response, queries = load(admin_client, JOBS, params)
            assert len(queries) <= QUERY_BUDGET, [q["sql"] for q in queries]
            assert len(queries) == len(small[name]), name
            assert not unbounded_job_counts(queries), count_queries(queries)
            counts = [
                sql for sql in count_queries(queries) if re.search(r'"pgqueue_job"(?!_)', sql)
            ]
            assert counts and all("LIMIT 101" in sql for sql in counts), counts
            assert len(response.context["cl"].result_list) == 50

        response, queries = load(admin_client, JOBS, {"tenant": "default"})
        assert response.context["cl"].result_count == 20
        assert not unbounded_job_counts(queries)

    def test_a_count_past_the_bound_is_not_shown_as_exact(self, admin_client):
        fill(500, tenant="bulk")
        response, _ = load(admin_client, JOBS, {"status__exact": "queued"})
        html = response.content.decode()
        # 500 jobs match; the bounded count stops at COUNT_BOUND + 1 = 101. The page must
        # not claim that exactly 101 jobs match (admin/common.py: "pagination shows 'N+' past it").
        claims = re.findall(r"\b101 (?:jobs?|results?|selected)\b", html)
        assert not claims, claims
