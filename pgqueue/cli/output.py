"""Human output: aligned tables, times to the second in UTC."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

NONE = "-"


def when(value: dt.datetime | None) -> str:
    """``2026-12-01 10:25:29``: UTC, to the second (every table header says UTC)."""
    if value is None:
        return NONE
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def duration(start: dt.datetime | None, end: dt.datetime | None) -> str:
    """A run time: ms under a second, else seconds with one decimal."""
    if start is None or end is None:
        return NONE
    seconds = (end - start).total_seconds()
    return f"{seconds * 1000:.0f}ms" if seconds < 1 else f"{seconds:.1f}s"


def short(text: str | None, width: int = 60) -> str:
    """The first line of ``text``, cut to ``width`` characters."""
    if not text:
        return NONE
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """Columns as wide as their widest cell, two spaces apart; ``right``-aligned columns
    (numbers) by index. Trailing spaces are trimmed."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)
