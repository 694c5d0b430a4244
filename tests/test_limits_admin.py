"""Caps, rate limits and pause in the admin (tenants' list and page, the queues' page, a job's
"waiting for") and on the dashboard, through Django's test client as staff."""

from __future__ import annotations

import pytest

import pgqueue
from pgqueue import limits
from pgqueue.limit_models import Limit
from pgqueue.models import Tenant
from tests.conftest import claim
from tests.test_admin import (
    TENANTS,
    act,
    headers,
    logged_in,
    messages_of,
    row_cells,
    staff_user,
    text,
)

pytestmark = pytest.mark.django_db

QUEUES = "/admin/pgqueue/limit/"
DASHBOARD = "/admin/pgqueue/dashboard/"


def enqueue(n: int, tenant: str, queue: str = "default") -> list[int]:
    return pgqueue.enqueue_many(
        "test.noop", [{"i": i} for i in range(n)], tenant=tenant, queue=queue
    )


def own(tenant: str = "", queue: str = "") -> Limit:
    return Limit.objects.get(tenant=tenant, queue=queue)


# -- tenants ------------------------------------------------------------------------------


def test_the_tenant_list_shows_limits_and_per_queue_overrides(admin_client):
    enqueue(3, "acme")
    limits.set_tenant_limits("acme", max_running=2, rate_limit="10/m")
    limits.set_tenant_limits("acme", queue="reports", max_running=1)
    limits.pause_tenant("globex")
    response = admin_client.get(TENANTS)
    html = response.content.decode()
    assert {"max running", "rate limit", "paused", "queue limits"} <= {
        h.lower() for h in headers(html)
    }
    acme = row_cells(html, "acme")
    assert (text(acme["cap"]), text(acme["rate"])) == ("2", "10/m")
    assert text(acme["queue_limits"]) == "reports: 0/1 running"
    assert 'alt="True"' in row_cells(html, "globex")["is_paused"]
    assert 'alt="False"' in acme["is_paused"]


def test_the_tenant_page_saves_limits_through_the_service(admin_client, monkeypatch):
    enqueue(1, "acme")
    calls = []
    real = limits.set_limits
    monkeypatch.setattr(limits, "set_limits", lambda **kw: calls.append(kw) or real(**kw))
    form = {"weight": "1", "max_running": "3", "rate_limit": "5/s", "_save": "Save"}
    response = admin_client.post(f"{TENANTS}acme/change/", form)
    assert response.status_code == 302, response.content.decode()
    row = own("acme")
    assert (row.max_running, row.rate_limit, row.paused) == (3, "5/s", False)
    assert [c.get("tenant") for c in calls] == ["acme"]

    # The page starts from the limits it has: saving it unchanged sets nothing.
    page = admin_client.get(f"{TENANTS}acme/change/").content.decode()
    assert 'name="max_running" value="3"' in page
    calls.clear()
    assert admin_client.post(f"{TENANTS}acme/change/", form).status_code == 302
    assert calls == []

    # Emptied, a limit is removed; the pause box pauses.
    form = {"weight": "1", "max_running": "", "rate_limit": "5/s", "paused": "on", "_save": "Save"}
    assert admin_client.post(f"{TENANTS}acme/change/", form).status_code == 302
    row = own("acme")
    assert (row.max_running, row.rate_limit, row.paused) == (None, "5/s", True)


def test_the_tenant_page_sets_limits_in_one_queue(admin_client):
    enqueue(1, "acme")
    form = {"weight": "1", "override_queue": "reports", "override_max_running": "1",
            "override_rate_limit": "10/m", "override_paused": "on", "_save": "Save"}  # fmt: skip
    assert admin_client.post(f"{TENANTS}acme/change/", form).status_code == 302
    row = own("acme", "reports")
    assert (row.max_running, row.rate_limit, row.paused) == (1, "10/m", True)
    page = admin_client.get(f"{TENANTS}acme/change/").content.decode()
    assert "reports: 0/1 running, 10/m, paused" in page


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"max_running": "0"}, "max_running: must be from 1 to 100,000"),
        ({"max_running": "100001"}, "max_running: must be from 1 to 100,000"),
        ({"max_running": "many"}, "Enter a whole number."),
        ({"rate_limit": "10/week"}, "rate_limit: must be"),
        ({"override_queue": "bad queue!", "override_max_running": "1"}, "queue: must match"),
        ({"override_max_running": "1"}, "Name the queue these limits are for."),
        ({"override_queue": "q", "override_rate_limit": "0/s"}, "rate_limit: must be"),
    ],
)
def test_the_tenant_page_shows_a_refused_value_as_a_form_error(admin_client, fields, message):
    enqueue(1, "acme")
    admin_client.raise_request_exception = False
    response = admin_client.post(
        f"{TENANTS}acme/change/", {"weight": "1", "_save": "Save", **fields}
    )
    assert response.status_code == 200, f"got {response.status_code}, not a form error"
    html = response.content.decode()
    assert "errorlist" in html
    assert message.replace('"', "&quot;") in html, html[:200]
    assert not Limit.objects.exists()


def test_pause_and_resume_actions_on_tenants(admin_client):
    enqueue(2, "acme")
    enqueue(2, "globex")
    response = act(admin_client, "pause_tenants", ["acme", "globex"], url=TENANTS)
    assert any("Paused 2 tenant(s)." in m for _, m in messages_of(response))
    assert own("acme").paused and own("globex").paused
    assert claim(limit=10) == []
    act(admin_client, "resume_tenants", ["acme"], url=TENANTS)
    assert not own("acme").paused and own("globex").paused
    assert {j.tenant for j in claim(limit=10)} == {"acme"}


def test_staff_who_may_only_view_tenants_cannot_pause_them(db):
    enqueue(1, "acme")
    client = logged_in(staff_user("viewer", "view_tenant"))
    page = client.get(TENANTS).content.decode()
    assert "pause_tenants" not in page
    act(client, "pause_tenants", ["acme"], url=TENANTS)
    assert not Limit.objects.exists()
    response = client.post(f"{TENANTS}acme/change/", {"weight": "1", "max_running": "1"})
    assert response.status_code == 403
    assert not Limit.objects.exists()


# -- queues -------------------------------------------------------------------------------


def test_the_queues_page_lists_counts_running_and_limits(admin_client):
    enqueue(3, "acme", "emails")
    limits.set_queue_limits("emails", max_running=2, rate_limit="50/s")
    limits.pause_queue("idle")
    assert len(claim(limit=5, queues=("emails",))) == 2
    html = admin_client.get(QUEUES).content.decode()
    assert "Queues" in html
    row = html.split('data-queue="emails"')[1].split("</tr>")[0]
    cells = [text(c) for c in row.split("<td>")[1:]]
    assert cells[:8] == ["emails", "0", "1", "2 / 2", "2", "50/s", "no", "0"]
    assert 'data-queue="idle" data-paused="true"' in html


def test_pause_and_resume_a_queue_from_its_buttons(admin_client):
    enqueue(2, "acme", "emails")
    response = admin_client.post(f"{QUEUES}queue/emails/pause/", follow=True)
    assert any("Paused queue emails." in m for _, m in messages_of(response))
    assert own(queue="emails").paused
    assert claim(limit=5, queues=("emails",)) == []
    assert 'data-action="resume"' in response.content.decode()
    admin_client.post(f"{QUEUES}queue/emails/resume/")
    assert not own(queue="emails").paused
    assert admin_client.get(f"{QUEUES}queue/emails/pause/").status_code == 405
    assert own(queue="emails").paused is False


def test_the_queue_page_saves_limits_and_shows_refused_values(admin_client):
    page = admin_client.get(f"{QUEUES}queue/emails/")
    assert page.status_code == 200
    response = admin_client.post(f"{QUEUES}queue/emails/", {"max_running": "20"})
    assert response.status_code == 302
    assert own(queue="emails").max_running == 20
    assert (
        'name="max_running" value="20"'
        in admin_client.get(f"{QUEUES}queue/emails/").content.decode()
    )

    response = admin_client.post(f"{QUEUES}queue/emails/", {"max_running": "20", "rate_limit": "x"})
    assert response.status_code == 200
    assert "rate_limit: must be" in response.content.decode().replace("&quot;", '"')
    assert own(queue="emails").rate_limit is None
    assert admin_client.get(f"{QUEUES}queue/bad%20name!/").status_code == 404


def test_queue_changes_need_the_change_permission_of_limits(db):
    enqueue(1, "acme", "emails")
    viewer = logged_in(staff_user("viewer", "view_limit"))
    html = viewer.get(QUEUES).content.decode()
    assert 'data-queue="emails"' in html and 'data-action="pause"' not in html
    assert viewer.post(f"{QUEUES}queue/emails/pause/").status_code == 403
    assert viewer.post(f"{QUEUES}queue/emails/", {"max_running": "1"}).status_code == 403
    assert not Limit.objects.exists()
    nobody = logged_in(staff_user("intern"))
    assert nobody.get(QUEUES).status_code == 403


# -- a job's page -------------------------------------------------------------------------


def test_a_waiting_jobs_page_says_what_it_waits_for(admin_client):
    first, second = enqueue(2, "acme", "emails")
    page = admin_client.get(f"/admin/pgqueue/job/{second}/change/").content.decode()
    assert "turn: its turn in line (1 job(s) ahead of it)" in page
    limits.pause_queue("emails")
    page = admin_client.get(f"/admin/pgqueue/job/{first}/change/").content.decode()
    assert "paused: its queue or tenant is paused" in page
    limits.resume_queue("emails")
    limits.set_tenant_limits("acme", max_running=1)
    claim(limit=5, queues=("emails",))
    page = admin_client.get(f"/admin/pgqueue/job/{second}/change/").content.decode()
    assert "tenant_cap: its tenant runs as many jobs as its cap allows" in page
    page = admin_client.get(f"/admin/pgqueue/job/{first}/change/").content.decode()
    assert "Waiting for" in page  # running: nothing to wait for
    assert "tenant_cap" not in page


# -- the dashboard ------------------------------------------------------------------------


def test_the_dashboard_shows_caps_rates_and_pauses(admin_client):
    enqueue(3, "acme", "emails")
    enqueue(2, "globex", "emails")
    limits.set_queue_limits("emails", max_running=4, rate_limit="50/s")
    limits.set_tenant_limits("acme", max_running=2)
    limits.pause_tenant("globex", queue="emails")
    limits.pause_queue("idle")
    claim(limit=5, queues=("emails",))
    html = admin_client.get(DASHBOARD).content.decode()
    emails = html.split('<tr data-queue="emails"')[1].split("</tr>")[0]
    assert '<td class="pgq-n" data-cap>2 / 4</td>' in emails
    assert "data-rate>50/s<" in emails
    assert '<tr data-queue="idle" data-paused="true">' in html
    acme = html.split('<tr data-tenant="acme"')[1].split("</tr>")[0]
    assert "data-cap>2 / 2<" in acme
    globex = html.split('<tr data-tenant="globex"')[1].split("</tr>")[0]
    assert "emails: paused" in globex
    assert Tenant.objects.filter(name="globex").exists()
