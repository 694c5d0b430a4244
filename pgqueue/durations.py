"""How pgqueue prints a duration for a person: the admin's columns and the dashboard share it,
so one value reads the same on every page."""

from __future__ import annotations


def format_seconds(seconds: float | None) -> str:
    """A duration as an operator reads it at a glance: "850 ms", "42 s", "3 min 5 s", "2 h 4 min".

    Exact values stay in the data (``*_seconds``); this is only for the page. Two units past
    a minute, so "3 min 5 s" is not rounded to "3 min"; a negative duration (clock skew
    between hosts) reads as zero.
    """
    if seconds is None:
        return "—"
    seconds = max(0.0, float(seconds))
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"
