"""Statements kept whole in ``.sql`` files, each under a ``-- name: X`` line.

A file holds named statements and nothing else: the comment lines right after a name are
the statement's header (what it does, locks, which indexes serve it, who calls it) and are
not sent; the lines after them, up to the next name, are the statement, sent as written.
Parameters are ``%(name)s``, bound by the driver.
"""

from __future__ import annotations

import re
from importlib import resources


def load(filename: str) -> dict[str, str]:
    """The statements of ``filename`` (in this package), by name."""
    text = resources.files(__package__).joinpath(filename).read_text(encoding="utf-8")
    statements: dict[str, str] = {}
    for block in re.split(r"^-- name: ", text, flags=re.MULTILINE)[1:]:
        name, _, rest = block.partition("\n")
        lines = rest.splitlines()
        while lines and lines[0].startswith("--"):
            lines.pop(0)  # the header
        statements[name.strip()] = "\n".join(lines).strip()
    return statements
