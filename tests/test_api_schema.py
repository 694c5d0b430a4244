"""The API's self-description: the OpenAPI schema, the docs page (served without a CDN)
and the Prometheus text of /metrics."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
from django.core.management import call_command
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from pgqueue import keys
from pgqueue.models import Worker
from tests.api_fixtures import client, make_job, new_key

pytestmark = pytest.mark.django_db

#: Every operation of the contract, as (method, path) with OpenAPI path templates.
OPERATIONS = {
    ("post", "/jobs"),
    ("get", "/jobs"),
    ("post", "/jobs/batch"),
    ("get", "/jobs/{job_id}"),
    ("delete", "/jobs/{job_id}"),
    ("post", "/jobs/{job_id}/retry"),
    ("post", "/workflows"),
    ("get", "/workflows"),
    ("get", "/workflows/{workflow_id}"),
    ("delete", "/workflows/{workflow_id}"),
    ("get", "/tenants"),
    ("get", "/tenants/{name}"),
    ("put", "/tenants/{name}"),
    ("get", "/stats"),
    ("get", "/metrics"),
    ("get", "/health"),
}
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def operations(schema: dict[str, Any]) -> set[tuple[str, str]]:
    """(method, path) of every operation, the path without its trailing slash."""
    return {
        (method, path.rstrip("/") or "/")
        for path, item in schema["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


# -- the schema ---------------------------------------------------------------------------


def test_the_spectacular_command_validates_without_warnings(tmp_path: Path):
    target = tmp_path / "schema.json"
    call_command(
        "spectacular",
        "--validate",
        "--fail-on-warn",
        "--format",
        "openapi-json",
        "--file",
        str(target),
    )
    schema = json.loads(target.read_text())
    assert schema["openapi"].startswith("3.")
    missing = OPERATIONS - operations(schema)
    assert not missing, f"the schema lacks {sorted(missing)}"


def test_the_spectacular_command_also_writes_yaml(tmp_path: Path):
    target = tmp_path / "schema.yml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    text = target.read_text()
    assert text.startswith("openapi: 3.")
    for _, path in OPERATIONS:
        assert f"  {path}" in text, path


@pytest.mark.parametrize("path", ["/schema", "/schema/"])
def test_schema_endpoint_serves_openapi_3(path):
    response = APIClient().get(path, {"format": "json"})
    assert response.status_code == 200, response.content[:300]
    schema = json.loads(response.content)
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"]
    missing = OPERATIONS - operations(schema)
    assert not missing, f"/schema lacks {sorted(missing)}"
    # The request bodies and the API key scheme are described.
    jobs_post = next(
        op
        for p, item in schema["paths"].items()
        for m, op in item.items()
        if p.rstrip("/") == "/jobs" and m == "post"
    )
    assert "application/json" in jobs_post["requestBody"]["content"]
    schemes = schema["components"]["securitySchemes"]
    assert any(s.get("scheme") == "bearer" for s in schemes.values()), schemes


def test_schema_endpoint_default_format_is_yaml():
    response = APIClient().get("/schema")
    assert response.status_code == 200
    assert response.content.startswith(b"openapi: 3.")


# -- the docs page ------------------------------------------------------------------------


class _Links(HTMLParser):
    """Every URL an HTML page makes the browser fetch or follow."""

    ATTRIBUTES = {"src", "href", "data-schema", "data-url", "action", "poster", "srcset"}

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []  # (tag, attribute, url)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in self.ATTRIBUTES and value:
                self.urls.append((tag, name, value))


def fetch(api: APIClient, url: str) -> Any:
    response = api.get(url)
    if response.streaming:  # FileResponse: read it all, which also closes the file
        response.content_bytes = b"".join(response.streaming_content)
    else:
        response.content_bytes = response.content
    return response


@pytest.mark.parametrize("page", ["/docs", "/docs/"])
def test_docs_use_only_this_servers_urls_and_each_answers(page):
    api = APIClient()
    response = api.get(page)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    parser = _Links()
    parser.feed(response.content.decode())
    urls = parser.urls
    tags = {(tag, attribute) for tag, attribute, _ in urls}
    assert ("script", "src") in tags, urls
    assert ("link", "href") in tags, urls
    for tag, attribute, url in urls:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc, f"{tag} {attribute}={url} is off-server"
        absolute = urljoin(f"http://testserver{page}", url)
        served = fetch(api, absolute)
        assert served.status_code == 200, (url, served.status_code)
        assert served.content_bytes, url
    scripts = [url for tag, attr, url in urls if tag == "script" and attr == "src"]
    for url in scripts:
        served = fetch(api, urljoin(f"http://testserver{page}", url))
        assert "javascript" in served["Content-Type"], (url, served["Content-Type"])
    stylesheets = [url for tag, _, url in urls if tag == "link" and url.endswith(".css")]
    for url in stylesheets:
        assert fetch(api, urljoin(f"http://testserver{page}", url))["Content-Type"].startswith(
            "text/css"
        )


def test_docs_assets_are_not_a_file_server():
    api = APIClient()
    for name in ("settings.py", "..%2F..%2Fsettings.py", "index.html", "nothing.js"):
        response = api.get(f"/docs/assets/{name}")
        assert response.status_code == 404, (name, response.status_code)


# -- /metrics -----------------------------------------------------------------------------


def test_metrics_parse_and_hold_pgqueues_series():
    make_job("queued", tenant="acme")
    make_job("queued", tenant="acme")
    make_job("scheduled", tenant="globex")
    make_job("running", tenant="acme", queue="busy")
    make_job("dead", tenant="acme", queue="busy")
    Worker.objects.create(id="w-alive", host="h", pid=1, concurrency=1)
    keys.create_api_key()  # an unrelated key: not a job, not a tenant backlog

    response = client(new_key()).get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.content.decode())}
    for name in (
        "pgqueue_jobs",
        "pgqueue_oldest_runnable_age_seconds",
        "pgqueue_tenant_backlog",
        "pgqueue_workers_alive",
    ):
        assert name in families, sorted(families)

    jobs = {
        (s.labels["queue"], s.labels["status"]): s.value for s in families["pgqueue_jobs"].samples
    }
    assert jobs == {
        ("default", "queued"): 2,
        ("default", "scheduled"): 1,
        ("busy", "running"): 1,
        ("busy", "dead"): 1,
    }
    oldest = {
        s.labels["queue"]: s.value for s in families["pgqueue_oldest_runnable_age_seconds"].samples
    }
    assert set(oldest) == {"default"} and oldest["default"] >= 0
    backlog = {s.labels["tenant"]: s.value for s in families["pgqueue_tenant_backlog"].samples}
    assert backlog == {"acme": 2, "globex": 1}
    (alive,) = families["pgqueue_workers_alive"].samples
    assert alive.value == 1


def test_metrics_of_an_empty_queue_still_parse():
    response = client(new_key()).get("/metrics/")
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.content.decode())}
    assert families["pgqueue_jobs"].samples == []
    assert [s.value for s in families["pgqueue_workers_alive"].samples] == [0]


def schema_json() -> dict[str, Any]:
    response = APIClient().get("/schema", {"format": "json"})
    assert response.status_code == 200
    return json.loads(response.content)


def test_the_two_lists_share_one_page_shape_and_their_parameters():
    schema = schema_json()
    pages = {}
    for path in ("/jobs", "/tenants"):
        op = next(item["get"] for p, item in schema["paths"].items() if p.rstrip("/") == path)
        params = {p["name"]: p for p in op["parameters"] if p["in"] == "query"}
        assert {"limit", "offset"} <= set(params), path
        assert "default 50" in params["limit"]["description"]
        assert "1..500" in params["limit"]["description"]
        ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        pages[path] = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    for page in pages.values():
        assert set(page["properties"]) == {
            "count",
            "count_is_estimate",
            "next",
            "previous",
            "results",
        }
        assert page["properties"]["results"]["type"] == "array"
    item = pages["/tenants"]["properties"]["results"]["items"]["$ref"]
    assert item.endswith("/Tenant")


def test_each_get_documents_exactly_the_query_parameters_it_accepts():
    """The schema and the rule that refuses unknown parameters cannot drift apart."""
    from django.urls import resolve

    schema = schema_json()
    for path, item in schema["paths"].items():
        if "get" not in item or path.rstrip("/") in {"/schema", "/docs"}:
            continue
        concrete = path.replace("{job_id}", "1").replace("{workflow_id}", "1")
        concrete = concrete.replace("{name}", "acme")
        view = resolve(concrete).func.view_class
        documented = {p["name"] for p in item["get"].get("parameters", []) if p["in"] == "query"}
        assert documented == set(view.query_params), path


SCHEMA_SCRIPT = """
import json, sys
import django
django.setup()
from django.test import Client
response = Client().get("/schema?format=json", HTTP_HOST="localhost")
sys.stdout.write(json.dumps({"status": response.status_code, "body": response.content.decode()}))
"""


@pytest.mark.parametrize("settings_module", ["tests.settings_drf_default", "tests.settings"])
def test_the_schema_does_not_depend_on_the_projects_default_schema_class(settings_module):
    """A project whose REST_FRAMEWORK names no DEFAULT_SCHEMA_CLASS (DRF's own then) gets
    the same schema as one that names drf-spectacular's. In a new process, because the
    schema classes are bound when pgqueue's URLconf is first imported."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings_module}
    done = subprocess.run(
        [sys.executable, "-c", SCHEMA_SCRIPT],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["status"] == 200, answer["body"][:500]
    served = json.loads(answer["body"])
    assert not OPERATIONS - operations(served)
    assert served == client().get("/schema?format=json").json()
