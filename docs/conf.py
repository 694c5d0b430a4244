"""Sphinx configuration of pgqueue's documentation site.

Sphinx with the furo theme, pages in Markdown (MyST). `make docs` builds it to
docs/_build/html with warnings as errors (-W, -n): a broken link, a reference to a missing
object or a page left out of every table of contents fails the build, locally and in CI.
The reference pages docs/reference/{settings,cli,http-api}.md are generated from the code by
scripts/gen_reference.py, which `make docs` runs first.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The Python API page reads pgqueue's docstrings with autodoc, which imports the modules:
# they need Django's settings (no database connection is made).
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
import django  # noqa: E402

django.setup()

project = "pgqueue"
author = "pgqueue contributors"
copyright = "pgqueue contributors"

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
# Links to a section of another page, [text](page.md#a-heading), are checked too.
myst_heading_anchors = 3

html_theme = "furo"
html_title = "pgqueue"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "description"
# Members only where a page lists them (`:members: a, b`).
autodoc_default_options: dict = {}
# Type hints name Django and psycopg classes this site does not document.
nitpicky = False
