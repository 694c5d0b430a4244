"""docker-compose.yml and the Dockerfile, checked by parsing: no Docker engine runs here.

What is checked is what a broken file would get wrong: the services and their order of
start, health checks that hit real endpoints, a non-root image, COPY sources that exist,
and commands that exist in the image.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from django.core.management import get_commands, load_command_class
from django.urls import resolve

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) pairs, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    steps = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, args = line.partition(" ")
            steps.append((instruction.upper(), args.strip()))
    return steps


def _command(service: dict) -> list[str]:
    command = service["command"]
    return command if isinstance(command, list) else shlex.split(command)


def test_services_start_in_order(compose):
    services = compose["services"]
    assert set(services) == {"postgres", "migrate", "api", "worker"}
    assert services["postgres"]["image"] == "postgres:16"
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "worker"):
        assert (
            services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        )
    assert services["migrate"]["restart"] == "no"


def test_app_services_share_the_image_and_the_database(compose):
    services = compose["services"]
    postgres_env = services["postgres"]["environment"]
    for name in ("migrate", "api", "worker"):
        service = services[name]
        assert service["build"] == "."
        url = service["environment"]["DATABASE_URL"]
        assert url == (
            f"postgresql://{postgres_env['POSTGRES_USER']}:{postgres_env['POSTGRES_PASSWORD']}"
            f"@postgres:5432/{postgres_env['POSTGRES_DB']}"
        )


def test_api_serves_port_8000_with_a_health_check_on_health(compose):
    api = compose["services"]["api"]
    assert "8000:8000" in api["ports"]
    command = _command(api)
    assert command[0] == "gunicorn" and "0.0.0.0:8000" in command
    check = " ".join(api["healthcheck"]["test"])
    assert "http://127.0.0.1:8000/health" in check
    path = re.search(r"http://127\.0\.0\.1:8000(/\S*?)'", check).group(1)
    assert resolve(path).url_name == "health"


def test_worker_runs_two_processes_and_stops_gracefully(compose):
    worker = compose["services"]["worker"]
    command = _command(worker)
    assert command[:3] == ["python", "manage.py", "runworker"]
    assert command[command.index("--processes") + 1] == "2"
    assert worker["stop_signal"] == "SIGTERM"
    assert int(worker["stop_grace_period"].rstrip("s")) >= 30


def test_management_commands_used_exist():
    commands = get_commands()
    assert {"runworker", "migrate", "collectstatic", "pgqueue"} <= set(commands)


def test_the_readmes_key_command_for_the_containers_parses():
    """The README's `docker compose exec api python manage.py …` (a key for the compose
    demo): a command that exists, with options it takes."""
    readme = (ROOT / "README.md").read_text()
    (line,) = re.findall(r"`docker compose exec api python manage\.py ([^`]+)`", readme)
    name, *args = shlex.split(line)
    assert [name, *args[:2]] == ["pgqueue", "apikey", "create"]
    command = load_command_class(get_commands()[name], name)
    options = command.create_parser("manage.py", name).parse_args(args)  # CommandError if not
    assert (options.subcommand, options.action, options.all_tenants) == ("apikey", "create", True)


def test_image_runs_as_a_non_root_user(dockerfile):
    users = [args for instruction, args in dockerfile if instruction == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert any("useradd" in args for instruction, args in dockerfile if instruction == "RUN")


def test_image_copies_files_that_exist_and_installs_the_servers(dockerfile):
    assert dockerfile[0][0] == "FROM" and dockerfile[0][1].startswith("python:3.1")
    for instruction, args in dockerfile:
        if instruction == "COPY":
            *sources, _dest = args.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY source {source} does not exist"
    installs = " ".join(args for instruction, args in dockerfile if instruction == "RUN")
    assert "pip install" in installs and "gunicorn" in installs and "whitenoise" in installs
    # The demo serves the HTTP API, whose packages come with pgqueue's `api` extra.
    assert '".[api]"' in installs, installs
    cmd = next(args for instruction, args in dockerfile if instruction == "CMD")
    assert cmd.startswith('["gunicorn", "demo_project.wsgi"')
    assert (ROOT / "demo_project" / "wsgi.py").exists()
