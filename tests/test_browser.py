"""The admin and the dashboard in a real headless Chromium, against pytest-django's live server.

What a unit test can't see: the pages load without console errors, they fetch nothing from
anywhere but this server (no CDN, no fonts), the dashboard fits a laptop screen, and
screenshots under ``test-output/screenshots/`` show what an operator gets. The documentation
site's pictures of the admin and the dashboard are some of these screenshots
(``docs/images/screenshots/``): each run of the test takes them again, so they show the
pages as they are.

Chromium and its driver come from Debian's packages. A machine without them installs them
once per session when it can (root and apt-get); otherwise the test is skipped, saying why.
"""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Count
from django.utils import timezone
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import pgqueue
from pgqueue import services, store
from pgqueue.models import Job, JobAttempt, Worker

SCREENSHOTS = Path(__file__).resolve().parent.parent / "test-output" / "screenshots"
#: The screenshots the documentation shows (docs/how-to/operate.md), copied there by each run.
DOC_SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "images" / "screenshots"
DOC_SHOTS = {"admin_index", "dashboard", "dashboard_waits", "job_changelist", "job_dead"}
DASHBOARD_URL = "/admin/pgqueue/dashboard/"
#: Seconds apt-get may take, update and install together, before the test gives up.
INSTALL_TIMEOUT = 900
BROWSERS = ("chromium", "chromium-browser")
DRIVERS = ("chromedriver",)
#: Debian puts the driver here too; PATH may not include it.
DRIVER_FALLBACKS = ("/usr/lib/chromium/chromedriver",)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)


def _which(names: tuple[str, ...], fallbacks: tuple[str, ...] = ()) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return next((p for p in fallbacks if os.access(p, os.X_OK)), None)


def _find_chromium() -> tuple[str | None, str | None]:
    return _which(BROWSERS), _which(DRIVERS, DRIVER_FALLBACKS)


def _install_chromium() -> None:
    """``apt-get update`` then ``apt-get install -y chromium chromium-driver``, within
    INSTALL_TIMEOUT seconds in all; skips the test with the reason when that can't work."""
    apt = shutil.which("apt-get")
    if apt is None:
        pytest.skip("chromium could not be installed: apt-get is not available")
    if os.geteuid() != 0:
        pytest.skip("chromium could not be installed: installing needs root (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    deadline = time.monotonic() + INSTALL_TIMEOUT
    for command in ([apt, "update"], [apt, "install", "-y", "chromium", "chromium-driver"]):
        left = deadline - time.monotonic()
        try:
            subprocess.run(
                command, check=True, capture_output=True, text=True, timeout=left, env=env
            )
        except subprocess.TimeoutExpired:
            pytest.skip(
                f"chromium could not be installed: {' '.join(command)} took over "
                f"{INSTALL_TIMEOUT} s in all"
            )
        except subprocess.CalledProcessError as exc:
            tail = (exc.stderr or exc.stdout or "").strip().splitlines()[-3:]
            pytest.skip(
                f"chromium could not be installed: {' '.join(command)} exited with "
                f"{exc.returncode}: {' | '.join(tail)}"
            )


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    """Paths of the Chromium binary and its chromedriver, installing them if needed.

    Both paths are given to Selenium explicitly, so Selenium Manager (which would download
    a browser and a driver from the internet) never runs.
    """
    browser, driver = _find_chromium()
    if browser is None or driver is None:
        _install_chromium()
        browser, driver = _find_chromium()
    if browser is None or driver is None:
        pytest.skip(
            "chromium could not be installed: apt-get succeeded but "
            f"{'chromium' if browser is None else 'chromedriver'} is still not on PATH"
        )
    return browser, driver


@pytest.fixture
def browser(chromium: tuple[str, str], tmp_path: Path) -> Iterator[webdriver.Chrome]:
    """A headless Chromium with a fresh profile, logging the console and the network."""
    binary, driver_path = chromium
    options = Options()
    options.binary_location = binary
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    service = Service(executable_path=driver_path, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


#: Documents of the browser's own (its start-up new-tab page): not pages of this server, and
#: what they load is the browser's business, not the admin's.
BROWSER_PAGES = ("chrome://", "chrome-untrusted://")


class Journal:
    """What the browser did: the URL of every request our pages made, and every SEVERE
    console message (but a missing /favicon.ico).

    Chrome hands out each log entry once, so the logs are drained after every page.
    """

    def __init__(self, driver: webdriver.Chrome) -> None:
        self.driver = driver
        self.requests: list[str] = []
        self.errors: list[str] = []

    def drain(self) -> None:
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message.get("method") == "Network.requestWillBeSent":
                params = message["params"]
                if not params.get("documentURL", "").startswith(BROWSER_PAGES):
                    self.requests.append(params["request"]["url"])
        for entry in self.driver.get_log("browser"):
            if entry["level"] == "SEVERE" and "/favicon.ico" not in entry["message"]:
                self.errors.append(entry["message"])


def screenshot(driver: webdriver.Chrome, name: str) -> Path:
    """The whole page (not only the window), as a PNG under test-output/screenshots/."""
    metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
    size = metrics.get("cssContentSize") or metrics["contentSize"]
    return _capture(
        driver, {"x": 0, "y": 0, "width": size["width"], "height": size["height"]}, name
    )


def element_screenshot(driver: webdriver.Chrome, element: Any, name: str) -> Path:
    """One element of the page, wherever it is on it, as a PNG under
    test-output/screenshots/."""
    box = driver.execute_script(
        "const r = arguments[0].getBoundingClientRect();"
        "return {x: r.left + window.scrollX, y: r.top + window.scrollY,"
        " width: r.width, height: r.height};",
        element,
    )
    return _capture(driver, box, name)


def _capture(driver: webdriver.Chrome, clip: dict[str, float], name: str) -> Path:
    """The part ``clip`` of the page, beyond the window if need be, into ``name``.png; a
    picture the documentation shows (DOC_SHOTS) is copied there too."""
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {"format": "png", "captureBeyondViewport": True, "clip": {**clip, "scale": 1}},
    )
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    if name in DOC_SHOTS:
        DOC_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOC_SCREENSHOTS / path.name)
    return path


def dead_job() -> int:
    """A job whose only attempt failed for good, in a queue of its own."""
    job, _ = pgqueue.enqueue("test.echo", {"n": 1}, tenant="acme", queue="graveyard")
    with connection.cursor() as cur:
        (claimed,) = store.claim(cur, worker="w-dead", queues=["graveyard"], limit=1)
        store.fail_many(
            cur,
            worker="w-dead",
            failures=[store.Failure(claimed.id, claimed.attempt, "KeyError: 'x'", "tb", True)],
        )
    assert Job.objects.get(pk=job.pk).status == "dead"
    return job.pk


def populate() -> None:
    """An hour of history and a live backlog, so every section of the dashboard has rows."""
    tenants = {"acme": 2.0, "globex": 1.0, "initech": 0.5, "umbrella": 1.0}
    for name, weight in tenants.items():
        services.set_tenant_weight(name, weight)
    services.set_tenant_weight("globex", 3.0, queue="limited")
    tasks = ["test.noop", "test.echo", "test.sleep", "test.block"]
    for i, task_name in enumerate(tasks):
        for name in tenants:
            pgqueue.enqueue_many(task_name, [{"n": n} for n in range(30 + 10 * i)], tenant=name)
    with connection.cursor() as cur:
        claimed = store.claim(cur, worker="w-browser", queues=["default"], limit=420)
        done, failed = claimed[:380], claimed[380:]
        store.complete_many(
            cur, worker="w-browser", results=[(j.id, j.attempt, None) for j in done]
        )
        store.fail_many(
            cur,
            worker="w-browser",
            failures=[store.Failure(j.id, j.attempt, "RuntimeError: boom") for j in failed],
        )
        # Spread the attempts over the last hour and give each task its own run time.
        cur.execute(
            """
            UPDATE pgqueue_job_attempt a
               SET finished_at = %(now)s - ((a.id * 7919) %% 60) * interval '1 minute'
                                         - (a.id %% 50) * interval '1 second',
                   started_at = %(now)s - ((a.id * 7919) %% 60) * interval '1 minute'
                                        - (a.id %% 50) * interval '1 second'
                                        - (1 + a.id %% 3) * interval '1 second'
                                          * CASE j.task WHEN 'test.sleep' THEN 2.5
                                                        WHEN 'test.block' THEN 0.8
                                                        WHEN 'test.echo' THEN 0.12
                                                        ELSE 0.03 END
              FROM pgqueue_job j
             WHERE j.id = a.job_id
            """,
            {"now": timezone.now()},
        )
        # And a wait from runnable to start of each tenant's own: umbrella's are the longest.
        cur.execute(
            """
            UPDATE pgqueue_job_attempt a
               SET due_at = a.started_at - (1 + a.id % 7) * interval '1 second'
                                         * CASE j.tenant WHEN 'umbrella' THEN 0.9
                                                         WHEN 'initech' THEN 0.2
                                                         WHEN 'globex' THEN 0.08
                                                         ELSE 0.03 END
              FROM pgqueue_job j
             WHERE j.id = a.job_id
            """
        )
    assert JobAttempt.objects.count() == 420
    pgqueue.enqueue_many("test.limited", [{}] * 25, tenant="globex")
    pgqueue.enqueue_many("test.noop", [{}] * 15, tenant="initech", delay=3600)
    now = timezone.now()
    seen_and_stopped = [
        (now, None),  # alive
        (now - dt.timedelta(seconds=4), None),  # alive
        (now - dt.timedelta(minutes=5), None),  # stale
        (now - dt.timedelta(hours=2), now - dt.timedelta(hours=2)),  # stopped
    ]
    for i, (seen, stopped) in enumerate(seen_and_stopped):
        Worker.objects.create(
            id=f"worker-{i}:{4100 + i}",
            host=f"worker-{i}",
            pid=4100 + i,
            queues=["default", "limited"] if i % 2 else ["default"],
            concurrency=8,
            last_seen_at=seen,
            stopped_at=stopped,
        )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_admin_and_dashboard_in_a_real_browser(browser: webdriver.Chrome, live_server: Any):
    populate()
    # A queue with a runnable job and no worker taking from it.
    pgqueue.enqueue("test.noop", tenant="umbrella", queue="orphan")
    dead = dead_job()
    User.objects.create_superuser("ops", "ops@example.com", "correct horse battery")
    base = live_server.url
    journal = Journal(browser)
    wait = WebDriverWait(browser, 15)

    # Log in through the admin's own form.
    browser.get(f"{base}/admin/login/?next=/admin/")
    browser.find_element(By.ID, "id_username").send_keys("ops")
    browser.find_element(By.ID, "id_password").send_keys("correct horse battery")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(lambda d: d.current_url == f"{base}/admin/")
    journal.drain()

    # The index lists the dashboard under pgqueue, as a link.
    module = browser.find_element(By.CSS_SELECTOR, ".app-pgqueue")
    assert "Dashboard" in module.text
    links = [
        a.get_attribute("href")
        for a in module.find_elements(By.CSS_SELECTOR, "a")
        if a.text.strip() == "Dashboard"
    ]
    screenshot(browser, "admin_index")

    # The dashboard.
    browser.get(f"{base}{DASHBOARD_URL}")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "svg.pgq-chart"))
    journal.drain()
    path = screenshot(browser, "dashboard")
    assert path.stat().st_size > 10_000
    # The wait-by-tenant panel: each tenant's p95, the longest umbrella's, and its chart.
    panel = browser.find_element(By.ID, "pgq-waits")
    p95 = {
        row.get_attribute("data-wait-tenant"): float(
            row.find_element(By.CSS_SELECTOR, "[data-wait-p95]").get_attribute("data-wait-p95")
        )
        for row in panel.find_elements(By.CSS_SELECTOR, "tbody tr")
    }
    assert set(p95) == {"acme", "globex", "initech", "umbrella"}
    assert max(p95, key=p95.get) == "umbrella"
    assert len(panel.find_elements(By.CSS_SELECTOR, "svg.pgq-wait-chart rect.pgq-wait-p95")) == 4
    element_screenshot(browser, panel, "dashboard_waits")
    assert browser.find_element(By.TAG_NAME, "h1").text == "pgqueue dashboard"
    refresh = browser.find_element(By.CSS_SELECTOR, 'meta[http-equiv="refresh"]')
    assert 5 <= int(refresh.get_attribute("content")) <= 10
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.pgq-chart rect.pgq-hit")) == 60
    tile = browser.find_element(By.CSS_SELECTOR, '[data-status="done"] .pgq-num')
    assert tile.text == "380"
    tenants = [
        row.get_attribute("data-tenant")
        for row in browser.find_elements(By.CSS_SELECTOR, "#pgq-tenants tbody tr")
    ]
    backlog = (
        Job.objects.filter(status__in=["queued", "scheduled"])
        .values("tenant_id")
        .annotate(n=Count("id"))
        .order_by("-n", "tenant_id")
    )
    assert tenants == [row["tenant_id"] for row in backlog]
    assert set(tenants) == {"acme", "globex", "initech", "umbrella"}
    flagged = browser.find_elements(By.CSS_SELECTOR, "#pgq-queues tr[data-unserved] .pgq-unserved")
    assert [f.text for f in flagged] == ["no live worker serves this queue"]
    assert flagged[0].find_element(By.XPATH, "ancestor::tr").get_attribute("data-queue") == (
        "orphan"
    )
    # The x axis' labels, as the browser lays them out: none overlaps the next.
    boxes = browser.execute_script(
        "return [...document.querySelectorAll('svg.pgq-chart text.pgq-x-label')]"
        ".map(t => { const b = t.getBoundingClientRect(); return [b.left, b.right]; })"
    )
    assert len(boxes) >= 6
    assert all(right < next_left for (_, right), (next_left, _) in itertools.pairwise(boxes))
    states = browser.find_elements(By.CSS_SELECTOR, "#pgq-workers .pgq-state")
    assert [s.text for s in states] == ["alive", "alive", "stale", "stopped"]
    # It fits the laptop-sized window: no sideways scrolling.
    overflow = browser.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0

    # The same page in the admin's dark theme, which follows the system's colour scheme.
    dark = {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", dark)
    browser.refresh()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "svg.pgq-chart"))
    journal.drain()
    screenshot(browser, "dashboard_dark")
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})

    # The Job changelist, which the admin registers next to the dashboard.
    browser.get(f"{base}/admin/pgqueue/job/")
    wait.until(lambda d: d.find_elements(By.ID, "changelist"))
    journal.drain()
    screenshot(browser, "job_changelist")

    # A dead job's page: its Retry button, times to the second; the button retries it.
    browser.get(f"{base}/admin/pgqueue/job/{dead}/change/")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#content-main"))
    journal.drain()
    tools = browser.find_elements(By.CSS_SELECTOR, ".object-tools button.pgq-job-action")
    assert [b.text for b in tools] == ["RETRY"]  # upper-cased by the admin's style
    created = browser.find_element(By.CSS_SELECTOR, ".field-created .readonly").text
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [A-Z]+", created), created
    screenshot(browser, "job_dead")
    tools[0].click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".messagelist .success"))
    journal.drain()
    assert "Retried 1 job(s)." in browser.find_element(By.CSS_SELECTOR, ".messagelist").text
    assert Job.objects.get(pk=dead).status == "queued"
    tools = browser.find_elements(By.CSS_SELECTOR, ".object-tools button.pgq-job-action")
    assert [b.text for b in tools] == ["CANCEL"]
    screenshot(browser, "job_retried")

    assert links == [f"{base}{DASHBOARD_URL}"], (
        "the admin index shows 'Dashboard' without a link to the dashboard: Django links "
        "each entry to admin:<app>_<model>_changelist"
    )
    assert journal.errors == []
    assert journal.requests, "the performance log recorded no request"
    outside = [u for u in journal.requests if not u.startswith((base, "data:"))]
    assert outside == []
