"""The dashboard's throughput chart, drawn on the server as inline SVG.

Drawn here rather than in the browser so the page needs no script and no chart library, and
so the drawing can be tested as text. Sizes and colours are the admin's own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .reads import Bucket

CHART_WIDTH = 600
CHART_HEIGHT = 240
_LEFT, _RIGHT, _TOP, _BOTTOM = 52, 14, 34, 42
DONE_COLOR = "#447e9b"
FAILED_COLOR = "#ba2121"
AXIS_COLOR = "#666666"
#: Font size of the axis labels, and the width of an x label ("HH:MM"): five characters of
#: about 0.6 em each. Two labels' centres stay at least that plus X_LABEL_GAP apart.
AXIS_FONT_SIZE = 12
X_LABEL_WIDTH = 5 * 0.6 * AXIS_FONT_SIZE
X_LABEL_GAP = 6


def x_label_indexes(buckets: Sequence[Bucket], slot: float) -> list[int]:
    """The minutes the x axis labels: every whole ten minutes, and the current (last) one.

    The current minute's label always shows (it says how fresh the chart is); a ten-minute
    label that would sit closer than its width (and a gap) to it is dropped rather than
    drawn over it.
    """
    if not buckets:
        return []
    last = len(buckets) - 1
    tens = [i for i, b in enumerate(buckets[:last]) if b.minute.minute % 10 == 0]
    return [i for i in tens if (last - i) * slot >= X_LABEL_WIDTH + X_LABEL_GAP] + [last]


def _nice_scale(peak: int, ticks: int = 4) -> tuple[int, int]:
    """The y axis' top and tick step: a round whole step (1, 2, 2.5 or 5 times a power of
    ten) so the labels read at a glance and the highest bar fills most of the height."""
    if peak <= 0:
        return ticks, 1
    raw = peak / ticks
    magnitude = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = int(
        next(
            m * magnitude
            for m in (1, 2, 2.5, 5, 10)
            if m * magnitude >= raw and float(m * magnitude).is_integer()
        )
    )
    return step * math.ceil(peak / step), step


def _fmt(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def throughput_chart_svg(buckets: Sequence[Bucket], *, title: str = "Attempts per minute") -> str:
    """Draw done (bars) and failed (line) attempts per minute as inline SVG.

    Drawn on the server so the page needs no script and no chart library; every piece of
    text is escaped, so the result can be marked safe and placed in the page as it is. Each
    minute has a hover title with its exact numbers.
    """
    w, h = CHART_WIDTH, CHART_HEIGHT
    plot_w, plot_h = w - _LEFT - _RIGHT, h - _TOP - _BOTTOM
    n = max(1, len(buckets))
    slot = plot_w / n
    peak = max([0, *(b.done for b in buckets), *(b.failed for b in buckets)])
    top, step = _nice_scale(peak)
    base = _TOP + plot_h

    def y(value: float) -> float:
        return base - plot_h * value / top

    def x(i: int) -> float:
        return _LEFT + slot * i

    total_done = sum(b.done for b in buckets)
    total_failed = sum(b.failed for b in buckets)
    label = f"{title}: {total_done} done, {total_failed} failed or lease expired"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="pgq-chart" viewBox="0 0 {w} {h}" '
        f'width="{w}" height="{h}" role="img" aria-label="{escape(label)}">',
        f"<title>{escape(label)}</title>",
    ]
    # Grid lines and y labels.
    for value in range(0, top + 1, step):
        yy = _fmt(y(value))
        out.append(
            f'<line class="pgq-grid" x1="{_LEFT}" x2="{w - _RIGHT}" y1="{yy}" y2="{yy}" '
            f'stroke="#dddddd" stroke-width="1"/>'
        )
        out.append(
            f'<text class="pgq-axis-label" x="{_LEFT - 6}" y="{yy}" text-anchor="end" '
            f'dominant-baseline="middle" font-size="12" fill="{AXIS_COLOR}">{value}</text>'
        )
    # Done: one bar per minute.
    bar_w = _fmt(max(1.0, slot * 0.7))
    for i, b in enumerate(buckets):
        if b.done:
            out.append(
                f'<rect class="pgq-done" x="{_fmt(x(i) + slot * 0.15)}" y="{_fmt(y(b.done))}" '
                f'width="{bar_w}" height="{_fmt(base - y(b.done))}" fill="{DONE_COLOR}"/>'
            )
    # Failed: a line through every minute, with a dot where there were any.
    points = " ".join(f"{_fmt(x(i) + slot / 2)},{_fmt(y(b.failed))}" for i, b in enumerate(buckets))
    if buckets:
        out.append(
            f'<polyline class="pgq-failed" points="{points}" fill="none" '
            f'stroke="{FAILED_COLOR}" stroke-width="1.5" stroke-linejoin="round"/>'
        )
    for i, b in enumerate(buckets):
        if b.failed:
            out.append(
                f'<circle class="pgq-failed-dot" cx="{_fmt(x(i) + slot / 2)}" '
                f'cy="{_fmt(y(b.failed))}" r="2.5" fill="{FAILED_COLOR}"/>'
            )
    # Hover targets: the whole height of each minute, with its numbers.
    for i, b in enumerate(buckets):
        tip = f"{b.minute:%H:%M} UTC: {b.done} done, {b.failed} failed"
        out.append(
            f'<rect class="pgq-hit" x="{_fmt(x(i))}" y="{_TOP}" width="{_fmt(slot)}" '
            f'height="{plot_h}" fill="transparent"><title>{escape(tip)}</title></rect>'
        )
    # Axes; x labels at whole ten minutes and at the current minute, never overlapping.
    labelled = x_label_indexes(buckets, slot)
    out.append(
        f'<path class="pgq-axis" d="M{_LEFT},{_TOP} V{base} H{w - _RIGHT}" fill="none" '
        f'stroke="{AXIS_COLOR}" stroke-width="1"/>'
    )
    for i in labelled:
        xx = _fmt(x(i) + slot / 2)
        out.append(
            f'<line class="pgq-axis" x1="{xx}" x2="{xx}" y1="{base}" y2="{base + 4}" '
            f'stroke="{AXIS_COLOR}"/>'
        )
        out.append(
            f'<text class="pgq-axis-label pgq-x-label" x="{xx}" y="{base + 16}" '
            f'text-anchor="middle" font-size="{AXIS_FONT_SIZE}" fill="{AXIS_COLOR}">'
            f"{escape(f'{buckets[i].minute:%H:%M}')}</text>"
        )
    out.append(
        f'<text class="pgq-axis-title" x="{_LEFT + plot_w / 2:.0f}" y="{h - 6}" '
        f'text-anchor="middle" font-size="12" fill="{AXIS_COLOR}">minute (UTC)</text>'
    )
    out.append(
        f'<text class="pgq-axis-title" x="12" y="{_TOP + plot_h / 2:.0f}" text-anchor="middle" '
        f'font-size="12" fill="{AXIS_COLOR}" '
        f'transform="rotate(-90 12 {_TOP + plot_h / 2:.0f})">attempts / min</text>'
    )
    # Legend.
    out.append(
        f'<rect x="{_LEFT}" y="8" width="12" height="12" fill="{DONE_COLOR}"/>'
        f'<text class="pgq-legend" x="{_LEFT + 17}" y="18" font-size="12" fill="{AXIS_COLOR}">'
        f"done ({total_done})</text>"
    )
    lx = _LEFT + 140
    out.append(
        f'<line x1="{lx}" x2="{lx + 14}" y1="14" y2="14" stroke="{FAILED_COLOR}" '
        f'stroke-width="2"/><circle cx="{lx + 7}" cy="14" r="2.5" fill="{FAILED_COLOR}"/>'
        f'<text class="pgq-legend" x="{lx + 19}" y="18" font-size="12" fill="{AXIS_COLOR}">'
        f"failed + lease expired ({total_failed})</text>"
    )
    if not total_done and not total_failed:
        out.append(
            f'<text class="pgq-empty" x="{_LEFT + plot_w / 2:.0f}" y="{_TOP + plot_h / 2:.0f}" '
            f'text-anchor="middle" font-size="13" fill="{AXIS_COLOR}">'
            f"No attempts finished in the last hour</text>"
        )
    out.append("</svg>")
    return "\n".join(out)


#: Colours of the wait chart: the p95 bar, and the p50 mark on it.
WAIT_P95_COLOR = "#447e9b"
WAIT_P50_COLOR = "#1f3f4f"
#: Margins of the wait chart: room for a tenant's name on the left, and for half of the
#: last x label ("250 ms") on the right.
_WAIT_LEFT, _WAIT_RIGHT, _WAIT_ROW, _WAIT_TOP, _WAIT_BOTTOM = 150, 32, 22, 30, 40


def _nice_seconds(peak: float, ticks: int = 4) -> tuple[float, float]:
    """The x axis' end and tick step for seconds: a 1, 2, 2.5 or 5 step times a power of ten
    (fractions of a second included), so a wait of 30 ms and one of 30 s both fill the axis."""
    if peak <= 0:
        return 1.0, 0.25
    raw = peak / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return step * math.ceil(peak / step - 1e-9), step


def _seconds_label(value: float) -> str:
    """A tick of the wait chart: "250 ms", "1.5 s"."""
    if value == 0:
        return "0"
    if value < 1:
        return f"{value * 1000:.4g} ms"
    return f"{value:.4g} s"


def wait_chart_svg(rows: Sequence[tuple[str, float, float, int]]) -> str:
    """Draw each tenant's wait (runnable to start) as a bar to its p95 with a mark at its
    p50, one row per tenant, as inline SVG: ``rows`` are ``(label, p50, p95, attempts)``.

    A tenant starved by its neighbours shows as a bar far longer than the others; a fair
    queue draws bars of about the same length (weights aside). Every text is escaped, so
    the result can be marked safe.
    """
    w = CHART_WIDTH
    plot_w = w - _WAIT_LEFT - _WAIT_RIGHT
    h = _WAIT_TOP + _WAIT_ROW * max(1, len(rows)) + _WAIT_BOTTOM
    top, step = _nice_seconds(max([0.0, *(p95 for _, _, p95, _ in rows)]))
    base = _WAIT_TOP + _WAIT_ROW * max(1, len(rows))

    def x(value: float) -> float:
        return _WAIT_LEFT + plot_w * value / top

    label = "Wait from runnable to start by tenant (p95 bar, p50 mark)"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="pgq-chart pgq-wait-chart" '
        f'viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        f'aria-label="{escape(label)}">',
        f"<title>{escape(label)}</title>",
    ]
    ticks = round(top / step)
    for i in range(ticks + 1):
        value = step * i
        xx = _fmt(x(value))
        out.append(
            f'<line class="pgq-grid" x1="{xx}" x2="{xx}" y1="{_WAIT_TOP}" y2="{base}" '
            f'stroke="#dddddd" stroke-width="1"/>'
        )
        out.append(
            f'<text class="pgq-axis-label" x="{xx}" y="{base + 16}" text-anchor="middle" '
            f'font-size="{AXIS_FONT_SIZE}" fill="{AXIS_COLOR}">'
            f"{escape(_seconds_label(value))}</text>"
        )
    for i, (name, p50, p95, attempts) in enumerate(rows):
        y0 = _WAIT_TOP + _WAIT_ROW * i
        name_text = name if len(name) <= 22 else name[:21] + "…"
        out.append(
            f'<text class="pgq-axis-label pgq-wait-tenant" x="{_WAIT_LEFT - 6}" '
            f'y="{_fmt(y0 + _WAIT_ROW / 2)}" text-anchor="end" dominant-baseline="middle" '
            f'font-size="{AXIS_FONT_SIZE}" fill="{AXIS_COLOR}">{escape(name_text)}</text>'
        )
        tip = f"{name}: p50 {_seconds_label(p50)}, p95 {_seconds_label(p95)} ({attempts} attempts)"
        out.append(
            f'<rect class="pgq-wait-p95" x="{_WAIT_LEFT}" y="{_fmt(y0 + 4)}" '
            f'width="{_fmt(max(1.0, x(p95) - _WAIT_LEFT))}" height="{_WAIT_ROW - 8}" '
            f'fill="{WAIT_P95_COLOR}"><title>{escape(tip)}</title></rect>'
        )
        out.append(
            f'<line class="pgq-wait-p50" x1="{_fmt(x(p50))}" x2="{_fmt(x(p50))}" '
            f'y1="{_fmt(y0 + 2)}" y2="{_fmt(y0 + _WAIT_ROW - 2)}" stroke="{WAIT_P50_COLOR}" '
            f'stroke-width="3"/>'
        )
    out.append(
        f'<path class="pgq-axis" d="M{_WAIT_LEFT},{_WAIT_TOP} V{base} H{w - _WAIT_RIGHT}" '
        f'fill="none" stroke="{AXIS_COLOR}" stroke-width="1"/>'
    )
    out.append(
        f'<text class="pgq-axis-title" x="{_WAIT_LEFT + plot_w / 2:.0f}" y="{h - 6}" '
        f'text-anchor="middle" font-size="12" fill="{AXIS_COLOR}">'
        f"wait from runnable to start</text>"
    )
    out.append(
        f'<rect x="{_WAIT_LEFT}" y="8" width="12" height="12" fill="{WAIT_P95_COLOR}"/>'
        f'<text class="pgq-legend" x="{_WAIT_LEFT + 17}" y="18" font-size="12" '
        f'fill="{AXIS_COLOR}">p95</text>'
        f'<line x1="{_WAIT_LEFT + 60}" x2="{_WAIT_LEFT + 60}" y1="7" y2="21" '
        f'stroke="{WAIT_P50_COLOR}" stroke-width="3"/>'
        f'<text class="pgq-legend" x="{_WAIT_LEFT + 66}" y="18" font-size="12" '
        f'fill="{AXIS_COLOR}">p50</text>'
    )
    if not rows:
        out.append(
            f'<text class="pgq-empty" x="{_WAIT_LEFT + plot_w / 2:.0f}" '
            f'y="{_fmt(_WAIT_TOP + _WAIT_ROW / 2)}" text-anchor="middle" '
            f'dominant-baseline="middle" font-size="13" fill="{AXIS_COLOR}">'
            f"No attempt started and finished in the last hour</text>"
        )
    out.append("</svg>")
    return "\n".join(out)
