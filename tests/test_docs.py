"""The documentation site says what the code does: its reference pages cannot fall behind.

The settings, command-line and HTTP reference pages are generated from the code by
scripts/gen_reference.py. These tests fail when a committed page differs from what the code
generates now, and, independently of the generator, when a setting, a subcommand or an
endpoint exists that its page does not show. The whole site is built as `make docs` builds
it, with warnings as errors, so a broken link fails the suite as well as CI. The README stays
short and its links lead to files that exist.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from django.core.management import load_command_class

from pgqueue.conf import DEFAULTS, HELP

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
REFERENCE = DOCS / "reference"


def generator() -> ModuleType:
    path = REPO / "scripts" / "gen_reference.py"
    spec = importlib.util.spec_from_file_location("gen_reference", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def gen(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("COLUMNS", "100")  # as the script sets it: argparse wraps usage lines
    return generator()


def test_every_setting_has_its_meaning_and_no_meaning_is_left_over():
    assert list(HELP) == list(DEFAULTS)
    assert all(text.strip() for text in HELP.values())


@pytest.mark.parametrize("page", ["settings.md", "cli.md", "http-api.md"])
def test_the_generated_reference_pages_are_current(gen, page):
    """Run `python scripts/gen_reference.py` and commit its pages when this fails."""
    assert (REFERENCE / page).read_text() == gen.PAGES[page](), f"docs/reference/{page} is stale"


def test_the_settings_page_shows_every_setting():
    page = (REFERENCE / "settings.md").read_text()
    shown = set(re.findall(r"^\| `([A-Z_]+)` \|", page, re.MULTILINE))
    assert shown == set(DEFAULTS)


def _parsers(
    parser: argparse.ArgumentParser, title: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """The parser and its subcommands', at any depth, by title (``pgqueue apikey create``)."""
    yield title, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{title} {name}")


def _own_options(gen: ModuleType, parser: argparse.ArgumentParser, title: str) -> dict:
    """{subcommand path below ``title``: its options but Django's}."""
    return {
        sub_title.removeprefix(title): {
            option
            for action in sub._actions
            if action.dest not in gen.DJANGO_OPTIONS
            for option in action.option_strings
        }
        for sub_title, sub in _parsers(parser, title)
    }


def test_the_cli_page_shows_every_command_subcommand_and_option(gen):
    page = (REFERENCE / "cli.md").read_text()
    pgqueue = load_command_class("pgqueue", "pgqueue").create_parser("manage.py", "pgqueue")
    every = dict(_parsers(pgqueue, "pgqueue"))
    for name in gen.COMMANDS:
        command = load_command_class("pgqueue", name)
        parser = command.create_parser("manage.py", name)
        assert f"\n## {name}\n" in page, name
        alias_of = getattr(command, "alias_of", None)
        if alias_of:
            # Its section points at the command it is an alias of, whose section shows
            # the options: the same options, at every depth.
            assert f"[`{alias_of}`](#{alias_of.replace(' ', '-')})" in page, name
            assert f"\n### {alias_of}\n" in page, alias_of
            assert _own_options(gen, parser, name) == _own_options(gen, every[alias_of], alias_of)
            continue
        for title, sub in _parsers(parser, name):
            if title != name:
                assert re.search(rf"\n###+ {re.escape(title)}\n", page), title
            # Every option of every subcommand, found by walking the parsers, appears.
            for action in sub._actions:
                for option in action.option_strings:
                    assert f"`{option}`" in page or action.dest in gen.DJANGO_OPTIONS, option


def test_the_management_commands_are_all_documented(gen):
    """A new command in pgqueue/management/commands must be added to the page."""
    shipped = {
        p.stem
        for p in (REPO / "pgqueue" / "management" / "commands").glob("*.py")
        if not p.name.startswith("_")
    }
    assert shipped == set(gen.COMMANDS)


def test_the_http_page_shows_every_operation(gen):
    page = (REFERENCE / "http-api.md").read_text()
    schema = gen.schema()
    operations = {
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method in {"get", "post", "put", "patch", "delete"}
    }
    assert len(operations) > 15
    for method, path in operations:
        assert f"\n## {method} {path}\n" in page, (method, path)


def test_the_readme_is_short_and_its_links_lead_somewhere():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme)
    assert links
    missing = [link for link in links if not (REPO / link).exists()]
    assert missing == []


def test_every_page_of_docs_is_in_the_site():
    """Sphinx warns about a page in no table of contents; this names it without a build."""
    index = (DOCS / "index.md").read_text()
    listed = set(re.findall(r"^([a-z-]+(?:/[a-z-]+)?)$", index, re.MULTILINE))
    pages = {
        p.relative_to(DOCS).with_suffix("").as_posix()
        for p in DOCS.rglob("*.md")
        if "_build" not in p.parts
    }
    assert pages - {"index"} == listed


@pytest.mark.slow
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    """What `make docs` runs after generating the reference: a broken link fails here too."""
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         str(DOCS), str(tmp_path / "html")],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-5000:]
    assert (tmp_path / "html" / "reference" / "settings.html").exists()
