"""A job's progress as its pages show it (``manage.py pgqueue show``, the admin).

The worker writes what a handler reported (``JobContext.progress()``) to the job's
``progress`` column as ``{"done", "total", "note", "at"}``; this reads it back as one
line of text: "3 / 10 (30 %) — copying", "42 — scanning" when the total is unknown.
"""

from __future__ import annotations

from typing import Any


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def progress_text(progress: Any) -> str:
    """One line for a ``progress`` column's value; "" for none (or one not as written)."""
    if not isinstance(progress, dict) or not isinstance(progress.get("done"), (int, float)):
        return ""
    done, total, note = progress["done"], progress.get("total"), progress.get("note")
    text = _number(done)
    if isinstance(total, (int, float)):
        text += f" / {_number(total)}"
        if total > 0:
            text += f" ({100 * done / total:.0f} %)"
    if isinstance(note, str) and note:
        text += f" — {note}"
    return text
