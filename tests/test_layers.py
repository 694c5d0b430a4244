"""The direction of imports inside pgqueue: a lower layer never imports a higher one.

Read from the source with ``ast`` (imports inside functions count too), so a cycle that
only shows up at call time is caught as well as one that breaks at import time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pgqueue"


def module_path(module: str) -> Path:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def pgqueue_imports(module: str) -> set[str]:
    """The pgqueue modules ``module`` imports anywhere in its source."""
    path = module_path(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                parent = ".".join([*base, node.module] if node.module else base)
            else:
                parent = node.module or ""
            # ``from . import services`` imports a module; ``from .x import name`` a name of x.
            for alias in node.names:
                child = f"{parent}.{alias.name}"
                found.add(child if module_path(child).exists() else parent)
    return {name for name in found if name == "pgqueue" or name.startswith("pgqueue.")}


def test_the_registry_imports_only_the_exceptions() -> None:
    """The registry is the bottom of the task machinery: the services look tasks up in it,
    and ``Task.enqueue`` (``pgqueue.decorators``) calls the services. An import of the
    services, or of anything above them, from the registry closes a circle again."""
    assert pgqueue_imports("pgqueue.registry") == {"pgqueue.exceptions"}


def test_the_services_do_not_import_the_task_decorator() -> None:
    assert "pgqueue.decorators" not in pgqueue_imports("pgqueue.services")
    assert "pgqueue.services" in pgqueue_imports("pgqueue.decorators")


#: The modules of pgqueue.backends, each allowed to import only those before it.
BACKENDS = ["framework", "options", "results", "runner", "backend"]


@pytest.mark.parametrize("position", range(len(BACKENDS)))
def test_the_tasks_backend_modules_import_only_those_below(position: int) -> None:
    module = f"pgqueue.backends.{BACKENDS[position]}"
    siblings = {n for n in pgqueue_imports(module) if n.startswith("pgqueue.backends")}
    below = {f"pgqueue.backends.{name}" for name in BACKENDS[:position]}
    assert siblings <= below, f"{module} imports {sorted(siblings - below)}"


def test_the_helper_sees_relative_and_lazy_imports() -> None:
    """Guards the guard: the parser must find what the tests above rely on it to find."""
    assert "pgqueue.services" in pgqueue_imports("pgqueue.backends.options")  # from .. import
    assert "pgqueue.services" in pgqueue_imports("pgqueue.decorators")  # inside a method
    assert "pgqueue.backends" in pgqueue_imports("pgqueue.apps")  # inside ready()
