"""pgqueue as a new user installs it: the wheel, a fresh project, the documented steps.

The sdist and the wheel are built from this checkout (`python -m build`), checked as a
package index would render them (`twine check`), and the wheel is installed into a fresh
virtual environment outside the checkout. `django-admin startproject` makes a project
there; the Python snippets of the guides "Tasks and enqueueing" and "The HTTP API"
(docs/guide/tasks.md, docs/guide/http-api.md) are applied to it as written (each starts
with the file it belongs to), so the documentation cannot drift from what works. The
project migrates a database of its own on the test server, runs a job with
`manage.py pgqueue worker --burst`, and every pgqueue admin page, the API's docs and the
metrics answer 200 — through Django's test Client, in a script that the fresh
environment's python runs. The LICENSE ships in the wheel and the sdist.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from tests.workers import clone_files, scratch_database

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
GUIDES = (REPO / "docs" / "guide" / "tasks.md", REPO / "docs" / "guide" / "http-api.md")
# The files a snippet may name on its first line, and where they are in the new project.
SNIPPET_FILES = {
    "settings.py": "mysite/settings.py",
    "urls.py": "mysite/urls.py",
    "myapp/tasks.py": "myapp/tasks.py",
}
PREFIX = "/queue/"  # where the guide's snippet mounts the API


def distribution_name() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]


def guide_snippets() -> list[tuple[str, str]]:
    """(file, code) for each part of the sections' Python blocks that names its file.

    A block may hold several files (`# settings.py` … `# urls.py` …): it is cut at each such
    line. Blocks that name no file (usage examples) are left out.
    """
    snippets: list[tuple[str, str]] = []
    for guide in GUIDES:
        for block in re.findall(r"```python\n(.*?)```", guide.read_text(), re.DOTALL):
            parts = re.split(r"^# ([\w/]+\.py)\n", block, flags=re.MULTILINE)
            # parts: [text before the first marker, file, code, file, code, ...]
            snippets.extend(zip(parts[1::2], parts[2::2], strict=True))
    return snippets


def test_the_guides_name_their_files_and_the_install_is_honest():
    """Fast: what the slow test below relies on, and the install lines of the README and
    the guide: pgqueue is not on PyPI, so they install the wheel this repository builds
    (named after the distribution) or the repository, never a name from an index."""
    files = [name for name, _ in guide_snippets()]
    assert set(files) <= set(SNIPPET_FILES), files
    assert {"settings.py", "urls.py", "myapp/tasks.py"} <= set(files)
    wheel = f"dist/{distribution_name().replace('-', '_')}-*.whl"
    for text in (README.read_text(), GUIDES[0].read_text()):
        assert "not on PyPI" in text
        installs = re.findall(r"pip install (\S+)", text)
        assert wheel in installs, installs
        assert set(installs) <= {wheel, "build", "git+https://github.com/pgqueue/pgqueue"}


@pytest.fixture
def project_database() -> Iterator[dict[str, Any]]:
    """DATABASES['default'] for the new project: a database of its own on the test server."""
    name = f"{connections['default'].settings_dict['NAME'].removeprefix('test_')}_wheel"
    with scratch_database(name) as s:
        yield {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "HOST": s["HOST"],
            "PORT": s["PORT"],
            "USER": s["USER"],
            "PASSWORD": s["PASSWORD"],
            "OPTIONS": dict(s.get("OPTIONS") or {}),
        }


def run(*args: str | Path, cwd: Path, env: dict[str, str], timeout: float = 180) -> str:
    result = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, (
        f"{' '.join(map(str, args))} exited {result.returncode}:\n"
        f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    return result.stdout


# Run by the fresh environment's python inside the new project. Prints one JSON report.
PAGES_SCRIPT = r"""
import json
import re
import shutil
import subprocess
import sys
from io import StringIO

import django

django.setup()

from django.test.utils import setup_test_environment

setup_test_environment()  # lets the test Client's "testserver" host in

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.core.management import call_command
from django.test import Client, RequestFactory
from django.urls import NoReverseMatch, reverse

import pgqueue
from django.contrib.auth import get_user_model

report = {"pgqueue": pgqueue.__file__, "pages": {}}

job, _ = pgqueue.enqueue("word_count", {"text": "hello job queue"}, tenant="acme")
worker = subprocess.run(
    [sys.executable, "manage.py", "pgqueue", "worker", "--burst"],
    capture_output=True, text=True, timeout=120,
)
report["worker"] = {"exit": worker.returncode, "log": worker.stderr[-3000:]}
job.refresh_from_db()
report["job"] = {"status": job.status, "result": job.result}

out = StringIO()
call_command("pgqueue_apikey", "create", "--all-tenants", stdout=out)
key = out.getvalue().strip().splitlines()[-1]

client = Client()
user = get_user_model().objects.get(username="admin")
report["login"] = client.login(username="admin", password="a-long-Password-1")


def get(url, **headers):
    try:
        response = client.get(url, headers=headers)
    except Exception as exc:  # the page's failure, reported with its URL
        report["pages"][url] = f"{type(exc).__name__}: {exc}"
        return None
    report["pages"][url] = response.status_code
    return response


get("/admin/")
get("/admin/pgqueue/")
request = RequestFactory().get("/admin/")
request.user = user
for model, model_admin in admin.site._registry.items():
    if model._meta.app_label != "pgqueue":
        continue
    info = f"admin:{model._meta.app_label}_{model._meta.model_name}"
    get(reverse(f"{info}_changelist"))
    if model_admin.has_add_permission(request):
        get(reverse(f"{info}_add"))
    obj = model_admin.get_queryset(request).first()
    try:
        change = reverse(f"{info}_change", args=[quote(obj.pk)]) if obj else None
    except NoReverseMatch:  # the dashboard: a page, no objects
        change = None
    if change:
        get(change)

docs = get("/queue/docs")
if docs is not None:
    for asset in re.findall(r'(?:src|href)="(/queue/docs/assets/[^"]+)"', docs.content.decode()):
        get(asset)
get("/queue/schema")
get("/queue/health")
auth = {"Authorization": f"Bearer {key}"}
get(f"/queue/jobs/{job.pk}", **auth)
get("/queue/tenants", **auth)
get("/queue/stats", **auth)
metrics = get("/queue/metrics", **auth)
report["metrics"] = metrics.content.decode() if metrics is not None else ""

for url in ("/queue/jobs/abc", "/no-such-page/"):
    response = client.get(url)
    report.setdefault("not_found", {})[url] = [response.status_code, response["Content-Type"]]

print(json.dumps(report))
"""


@pytest.mark.slow
def test_the_wheel_installs_and_serves_every_page(tmp_path, project_database):
    # Built from the files a clone has (tracked, or new and not ignored), not from this
    # checkout as it stands.
    source = tmp_path / "source"
    clone_files(source)
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--outdir", dist, source, cwd=tmp_path,
        env=dict(os.environ))  # fmt: skip
    wheels, sdists = list(dist.glob("*.whl")), list(dist.glob("*.tar.gz"))
    assert len(wheels) == len(sdists) == 1, list(dist.iterdir())
    run(sys.executable, "-m", "twine", "check", "--strict", *wheels, *sdists, cwd=tmp_path,
        env=dict(os.environ))  # fmt: skip

    # Every file of the package ships, templates and static files included.
    shipped = set(zipfile.ZipFile(wheels[0]).namelist())
    package = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "pgqueue").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert package - shipped == set()
    assert any(name.endswith(".html") for name in shipped)
    # The license ships in both: the wheel's metadata and the sdist's root.
    license_text = (REPO / "LICENSE").read_text()
    (licensed,) = [n for n in shipped if n.endswith(".dist-info/licenses/LICENSE")]
    assert zipfile.ZipFile(wheels[0]).read(licensed).decode() == license_text
    with tarfile.open(sdists[0]) as sdist:
        (member,) = [m for m in sdist.getnames() if m.count("/") == 1 and m.endswith("/LICENSE")]
        assert sdist.extractfile(member).read().decode() == license_text

    # A fresh environment outside the checkout; nothing of this one leaks in.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE", "DATABASE_URL")
        and not k.startswith("PGQUEUE_")
    }
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path, env=env)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "--quiet", wheels[0], cwd=tmp_path, env=env)

    project = tmp_path / "project"
    project.mkdir()
    run(venv / "bin" / "django-admin", "startproject", "mysite", project, cwd=tmp_path, env=env)
    run(python, "manage.py", "startapp", "myapp", cwd=project, env=env)
    for name, code in guide_snippets():
        with (project / SNIPPET_FILES[name]).open("a") as f:
            f.write(f"\n# From the guides:\n{code}")
    with (project / "mysite" / "settings.py").open("a") as f:
        # The project's own choices: its app with the tasks, and a PostgreSQL database.
        f.write(f'\nINSTALLED_APPS += ["myapp"]\nDATABASES = {{"default": {project_database!r}}}\n')

    env["DJANGO_SETTINGS_MODULE"] = "mysite.settings"
    run(python, "manage.py", "check", cwd=project, env=env)
    run(python, "manage.py", "migrate", "--no-input", "-v", "0", cwd=project, env=env)
    run(python, "manage.py", "createsuperuser", "--no-input", "--username", "admin",
        "--email", "admin@example.com", cwd=project,
        env={**env, "DJANGO_SUPERUSER_PASSWORD": "a-long-Password-1"})  # fmt: skip
    (project / "check_pages.py").write_text(PAGES_SCRIPT)
    report = json.loads(run(python, "check_pages.py", cwd=project, env=env).splitlines()[-1])

    assert Path(report["pgqueue"]).is_relative_to(venv), report["pgqueue"]
    assert report["worker"]["exit"] == 0, report["worker"]["log"]
    assert report["job"] == {"status": "done", "result": {"words": 3}}, report["worker"]["log"]
    assert report["login"] is True
    pages = report["pages"]
    assert {url: status for url, status in pages.items() if status != 200} == {}
    # What was loaded: every pgqueue changelist, the dashboard, add and change pages, the docs.
    for fragment in ("/job/", "/tenant/", "/worker/", "/apikey/", "/dashboard/", "/add/",
                     "/change/", "/queue/docs", "/queue/docs/assets/"):  # fmt: skip
        assert any(fragment in url for url in pages), (fragment, sorted(pages))
    assert "pgqueue_jobs{" in report["metrics"]
    assert "django_http_requests_total_by_method" in report["metrics"]
    # JSON 404s under the API's paths only; the rest of the site keeps its own.
    not_found = report["not_found"]
    assert not_found["/queue/jobs/abc"] == [404, "application/json"]
    assert not_found["/no-such-page/"][0] == 404
    assert "json" not in not_found["/no-such-page/"][1]
