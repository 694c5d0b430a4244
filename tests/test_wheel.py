"""pgqueue as a new user installs it: the wheel, a fresh project, the documented steps.

The sdist and the wheel are built once from this checkout (`python -m build`), checked as
a package index would render them (`twine check`), and the wheel is installed into fresh
virtual environments outside the checkout. `django-admin startproject` makes a project
there; the Python snippets of the guides "Tasks and enqueueing" and "The HTTP API"
(docs/guide/tasks.md, docs/guide/http-api.md) are applied to it as written (each starts
with the file it belongs to), so the documentation cannot drift from what works. The
project migrates a database of its own on the test server, runs a job with
`manage.py pgqueue worker --burst`, and every pgqueue admin page, the API's docs and the
metrics answer 200 — through Django's test Client, in a script that the fresh
environment's python runs. The LICENSE ships in the wheel and the sdist.

The core needs no `api` extra: installed without it, on the newest Django the index offers
for this Python, the wheel runs a worker, the commands and the admin, every module of the
core imports, and `include("pgqueue.urls")` says what to install. Neither the wheel nor
its `api` extra makes pip move that Django.
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


def guide_snippets(guides: tuple[Path, ...] = GUIDES) -> list[tuple[str, str]]:
    """(file, code) for each part of the sections' Python blocks that names its file.

    A block may hold several files (`# settings.py` … `# urls.py` …): it is cut at each such
    line. Blocks that name no file (usage examples) are left out.
    """
    snippets: list[tuple[str, str]] = []
    for guide in guides:
        for block in re.findall(r"```python\n(.*?)```", guide.read_text(), re.DOTALL):
            parts = re.split(r"^# ([\w/]+\.py)\n", block, flags=re.MULTILINE)
            # parts: [text before the first marker, file, code, file, code, ...]
            snippets.extend(zip(parts[1::2], parts[2::2], strict=True))
    return snippets


def test_the_guides_name_their_files_and_the_install_is_honest():
    """Fast: what the slow tests below rely on, and the install lines of the README and
    the guide: pgqueue is not on PyPI, so they install the wheel this repository builds
    (named after the distribution; the `api` extra through pip's --find-links, which takes
    the name from the wheel's folder) or the repository, never a name from an index."""
    files = [name for name, _ in guide_snippets()]
    assert set(files) <= set(SNIPPET_FILES), files
    assert {"settings.py", "urls.py", "myapp/tasks.py"} <= set(files)
    name = distribution_name()
    wheel = f"dist/{name.replace('-', '_')}-*.whl"
    with_api = f"--find-links dist '{name}[api]'"
    repository = "git+https://github.com/pgqueue/pgqueue"
    for text in (README.read_text(), GUIDES[0].read_text()):
        assert "not on PyPI" in text
        installs = re.findall(r"pip install ((?:--find-links \S+ )?\S+)", text)
        assert wheel in installs, installs
        assert with_api in installs, installs
        assert set(installs) <= {wheel, with_api, "build", repository}


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


# Run by the fresh environment's python inside the new project, with the worker's command
# as its arguments: a job run by a worker, then every pgqueue admin page. The scripts below
# add their own checks, then print one JSON report.
ADMIN_SCRIPT = r"""
import importlib
import json
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

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
    [sys.executable, "manage.py", *sys.argv[1:]],
    capture_output=True, text=True, timeout=120,
)
report["worker"] = {"exit": worker.returncode, "log": worker.stderr[-3000:]}
job.refresh_from_db()
report["job"] = {"status": job.status, "result": job.result}

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
"""

# With the `api` extra: the API's docs, schema, resources and metrics, and its 404s.
PAGES_SCRIPT = (
    ADMIN_SCRIPT
    + r"""
out = StringIO()
call_command("pgqueue", "apikey", "create", "--all-tenants", stdout=out)
key = out.getvalue().strip().splitlines()[-1]

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
)

#: The packages of the `api` extra, as imported.
API_PACKAGES = ("rest_framework", "drf_spectacular", "drf_spectacular_sidecar")

# Without the `api` extra: a command's --json, every module of the core imported (all but
# pgqueue.urls and pgqueue.api), none of the extra's packages loaded by any of it, and what
# including pgqueue.urls says.
CORE_SCRIPT = (
    ADMIN_SCRIPT
    + f"API_PACKAGES = {API_PACKAGES!r}\n"
    + r"""
from django.core.exceptions import ImproperlyConfigured
from django.urls import include

out = StringIO()
call_command("pgqueue", "show", str(job.pk), "--json", stdout=out)
report["show"] = json.loads(out.getvalue())

root = Path(pgqueue.__file__).parent
report["imported"], report["unimportable"] = [], {}
for path in sorted(root.rglob("*.py")):
    parts = path.relative_to(root.parent).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    if parts == ("pgqueue", "urls") or parts[:2] == ("pgqueue", "api"):
        continue
    if parts == ("pgqueue", "testing_plugin"):  # pytest's plugin: only pytest imports it
        continue
    name = ".".join(parts)
    try:
        importlib.import_module(name)
    except (ImportError, ImproperlyConfigured) as exc:
        report["unimportable"][name] = str(exc)
    else:
        report["imported"].append(name)
report["django"] = django.VERSION[0]
report["loaded"] = sorted(
    name for name in sys.modules
    if name.split(".")[0] in API_PACKAGES or name == "pgqueue.api"
    or name.startswith("pgqueue.api.")
)
try:
    include("pgqueue.urls")
except ImproperlyConfigured as exc:
    report["include"] = str(exc)
else:
    report["include"] = None

print(json.dumps(report))
"""
)

# With the `api` extra added to the same project: the API answers.
API_SCRIPT = r"""
import json

import django

django.setup()

from django.test.utils import setup_test_environment

setup_test_environment()

from django.test import Client

client = Client()
print(json.dumps({url: client.get(url).status_code for url in
                  ("/queue/health", "/queue/schema", "/queue/docs")}))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel, built once for this module's tests from the files a clone
    has (tracked, or new and not ignored), not from this checkout as it stands, and
    checked as a package index would render them. The wheel's folder is ``dist``."""
    tmp = tmp_path_factory.mktemp("built")
    source = tmp / "source"
    clone_files(source)
    dist = tmp / "dist"
    run(sys.executable, "-m", "build", "--outdir", dist, source, cwd=tmp, env=dict(os.environ))
    wheels, sdists = list(dist.glob("*.whl")), list(dist.glob("*.tar.gz"))
    assert len(wheels) == len(sdists) == 1, list(dist.iterdir())
    run(sys.executable, "-m", "twine", "check", "--strict", *wheels, *sdists, cwd=tmp,
        env=dict(os.environ))  # fmt: skip
    return {"dist": dist, "wheel": wheels[0], "sdist": sdists[0]}


def fresh_env() -> dict[str, str]:
    """This process's environment without what would let this checkout leak in."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE", "DATABASE_URL")
        and not k.startswith("PGQUEUE_")
    }


def new_venv(path: Path, env: dict[str, str]) -> Path:
    """A fresh virtual environment outside the checkout; returns its python."""
    run(sys.executable, "-m", "venv", path, cwd=path.parent, env=env)
    return path / "bin" / "python"


def pip_install(python: Path, *args: str | Path, env: dict[str, str]) -> None:
    run(python, "-m", "pip", "install", "--quiet", *args, cwd=python.parent, env=env,
        timeout=600)  # fmt: skip


def django_version(python: Path, env: dict[str, str]) -> str:
    return run(python, "-c", "import django; print(django.__version__)", cwd=python.parent,
               env=env).strip()  # fmt: skip


def apply_snippets(project: Path, snippets: list[tuple[str, str]]) -> None:
    for name, code in snippets:
        with (project / SNIPPET_FILES[name]).open("a") as f:
            f.write(f"\n# From the guides:\n{code}")


def new_project(
    where: Path,
    python: Path,
    env: dict[str, str],
    database: dict[str, Any],
    snippets: list[tuple[str, str]],
) -> tuple[Path, dict[str, str]]:
    """`startproject` with an app, the guides' ``snippets``, a PostgreSQL database of its
    own, checked, migrated and with a superuser. Returns the project and its environment."""
    project = where / "project"
    project.mkdir()
    run(python.parent / "django-admin", "startproject", "mysite", project, cwd=where, env=env)
    run(python, "manage.py", "startapp", "myapp", cwd=project, env=env)
    apply_snippets(project, snippets)
    with (project / "mysite" / "settings.py").open("a") as f:
        # The project's own choices: its app with the tasks, and a PostgreSQL database.
        f.write(f'\nINSTALLED_APPS += ["myapp"]\nDATABASES = {{"default": {database!r}}}\n')
    env = {**env, "DJANGO_SETTINGS_MODULE": "mysite.settings"}
    run(python, "manage.py", "check", cwd=project, env=env)
    run(python, "manage.py", "migrate", "--no-input", "-v", "0", cwd=project, env=env)
    run(python, "manage.py", "createsuperuser", "--no-input", "--username", "admin",
        "--email", "admin@example.com", cwd=project,
        env={**env, "DJANGO_SUPERUSER_PASSWORD": "a-long-Password-1"})  # fmt: skip
    return project, env


def script_report(python: Path, project: Path, env: dict[str, str], script: str,
                  *args: str) -> dict[str, Any]:  # fmt: skip
    (project / "check_script.py").write_text(script)
    return json.loads(run(python, "check_script.py", *args, cwd=project, env=env).splitlines()[-1])


def assert_worked(report: dict[str, Any], venv: Path) -> None:
    """The fresh environment's pgqueue ran the job, and every admin page answered 200."""
    assert Path(report["pgqueue"]).is_relative_to(venv), report["pgqueue"]
    assert report["worker"]["exit"] == 0, report["worker"]["log"]
    assert report["job"] == {"status": "done", "result": {"words": 3}}, report["worker"]["log"]
    assert report["login"] is True
    pages = report["pages"]
    assert {url: status for url, status in pages.items() if status != 200} == {}
    # What was loaded: every pgqueue changelist, the dashboard, add and change pages.
    for fragment in ("/job/", "/tenant/", "/worker/", "/apikey/", "/dashboard/", "/add/",
                     "/change/"):  # fmt: skip
        assert any(fragment in url for url in pages), (fragment, sorted(pages))


@pytest.mark.slow
def test_the_wheel_installs_and_serves_every_page(tmp_path, built, project_database):
    wheel, sdist = built["wheel"], built["sdist"]
    # Every file of the package ships, templates and static files included.
    shipped = set(zipfile.ZipFile(wheel).namelist())
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
    assert zipfile.ZipFile(wheel).read(licensed).decode() == license_text
    with tarfile.open(sdist) as archive:
        (member,) = [m for m in archive.getnames() if m.count("/") == 1 and m.endswith("/LICENSE")]
        assert archive.extractfile(member).read().decode() == license_text

    # A fresh environment outside the checkout; nothing of this one leaks in. The wheel
    # with its `api` extra as the guide installs it (pip finds the name in the wheel's
    # folder), and django-prometheus for the request metrics the guide adds to /metrics.
    env = fresh_env()
    python = new_venv(tmp_path / "venv", env)
    pip_install(python, "--find-links", built["dist"], f"{distribution_name()}[api]",
                "django-prometheus", env=env)  # fmt: skip
    project, env = new_project(tmp_path, python, env, project_database, guide_snippets())
    report = script_report(python, project, env, PAGES_SCRIPT, "pgqueue", "worker", "--burst")

    assert_worked(report, tmp_path / "venv")
    pages = report["pages"]
    for fragment in ("/queue/docs", "/queue/docs/assets/"):
        assert any(fragment in url for url in pages), (fragment, sorted(pages))
    assert "pgqueue_jobs{" in report["metrics"]
    assert "django_http_requests_total_by_method" in report["metrics"]
    # JSON 404s under the API's paths only; the rest of the site keeps its own.
    not_found = report["not_found"]
    assert not_found["/queue/jobs/abc"] == [404, "application/json"]
    assert not_found["/no-such-page/"][0] == 404
    assert "json" not in not_found["/no-such-page/"][1]


@pytest.mark.slow
def test_the_core_needs_no_api_extra_and_nothing_holds_django_back(
    tmp_path, built, project_database
):
    """A project on the newest Django the index offers for this Python installs the wheel
    alone: Django stays, the worker, the commands and the admin work, every module of the
    core imports without DRF or drf-spectacular, and ``include("pgqueue.urls")`` is an
    ImproperlyConfigured naming the extra. Then the extra, as the guide installs it:
    Django still stays, and the API answers."""
    env = fresh_env()
    python = new_venv(tmp_path / "venv", env)
    pip_install(python, "django", env=env)  # the newest this Python can have
    newest = django_version(python, env)
    pip_install(python, built["wheel"], env=env)
    assert django_version(python, env) == newest
    found = run(python, "-c", f"import importlib.util as u; print([p for p in {API_PACKAGES!r} "
                "if u.find_spec(p)])", cwd=tmp_path, env=env)  # fmt: skip
    assert found.strip() == "[]"

    core_snippets = guide_snippets(GUIDES[:1])
    project, env = new_project(tmp_path, python, env, project_database, core_snippets)
    report = script_report(python, project, env, CORE_SCRIPT, "runworker", "--burst")

    assert_worked(report, tmp_path / "venv")
    assert (report["show"]["status"], report["show"]["result"]) == ("done", {"words": 3})
    assert len(report["show"]["history"]) == 1
    assert len(report["imported"]) > 50
    assert {"pgqueue.models", "pgqueue.admin", "pgqueue.services", "pgqueue.metrics",
            "pgqueue.management.commands.pgqueue", "pgqueue.management.commands.runworker",
            "pgqueue.worker"} <= set(report["imported"])  # fmt: skip
    # On Django 5.2 the Tasks backend needs the backport (the `tasks` extra), and only that.
    assert {
        module: error
        for module, error in report["unimportable"].items()
        if not (
            report["django"] < 6
            and module.startswith("pgqueue.backends")
            and "pip install 'django-tasks>=0.12'" in error
        )
    } == {}
    assert report["loaded"] == []
    message = report["include"]
    assert message is not None, "include('pgqueue.urls') worked without the api extra"
    assert "pip install 'django-pgqueue-fair[api]'" in message
    assert 'INSTALLED_APPS += ["rest_framework", "drf_spectacular"]' in message

    # The extra, as the guide installs it, and the guide's settings and URLconf for it (all
    # but django-prometheus's, an optional package of its own).
    pip_install(python, "--find-links", built["dist"], f"{distribution_name()}[api]", env=env)
    assert django_version(python, env) == newest
    run(python, "-m", "pip", "check", cwd=project, env=env)
    apply_snippets(
        project, [s for s in guide_snippets(GUIDES[1:]) if "django_prometheus" not in s[1]]
    )
    run(python, "manage.py", "check", cwd=project, env=env)
    assert script_report(python, project, env, API_SCRIPT) == {
        "/queue/health": 200,
        "/queue/schema": 200,
        "/queue/docs": 200,
    }
