"""Draw the documentation's benchmark charts from the committed results.

The benchmarks take many minutes and their figures depend on the machine, so the
documentation shows what one recorded run measured rather than running anything again.
This module only reads bench/results/ (the JSON of the full report and the text reports
of single benchmarks) and writes PNG charts to docs/images/bench/:

    python -m bench.charts
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
OUT = ROOT / "docs" / "images" / "bench"


def text(name: str) -> str:
    return (RESULTS / name).read_text()


def rows(report: str, header: str) -> list[list[str]]:
    """The rows of the aligned table whose header line starts with `header`."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    width = len(re.split(r"\s{2,}", lines[start].strip()))
    found = []
    for line in lines[start + 2 :]:  # past the header and its dashes
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != width:  # a blank line or the notes under the table
            break
        found.append(cells)
    return found


def seconds(cell: str) -> float:
    """'12.74 s' or '204.3 ms' as seconds."""
    value, unit = cell.split()
    return float(value) / (1000 if unit == "ms" else 1)


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


def save(fig: Figure, name: str, source: str) -> None:
    fig.text(0.99, 0.01, f"source: bench/results/{source}", ha="right", fontsize=7, alpha=0.6)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(OUT / name)
    plt.close(fig)
    print(f"docs/images/bench/{name}")


def figure(columns: int = 1) -> tuple[Figure, list[Axes]]:
    fig, axes = plt.subplots(1, columns, figsize=(5 * columns if columns > 1 else 8, 4.5), dpi=110)
    return fig, list(axes) if columns > 1 else [axes]


def noisy_neighbour(runs: dict[str, Any]) -> None:
    fig, (ax,) = figure()
    for ordering, colour in (("fifo", "tab:red"), ("fair", "tab:blue")):
        series = runs["noisy_neighbour"][ordering]["small_series"]
        ax.plot(
            *zip(*[(t, w * 1000) for t, w in series], strict=True),
            ".-",
            lw=1,
            ms=4,
            color=colour,
            label=ordering,
        )
    ax.set(
        yscale="log",
        xlabel="seconds since the flood was enqueued",
        ylabel="small tenant's wait to start (ms, log)",
        title="5 small tenants beside a 10,000-job flood, 8 threads",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save(fig, "noisy-neighbour.png", "2026-12-01.json")


def heavy_flood() -> None:
    table = rows(text("heavy-flood-2026-12-03.txt"), "variant")
    fig, (ax, drain) = figure(2)
    names = [r[0] for r in table]
    for i, (label, column) in enumerate((("p50", 2), ("p95", 3))):
        ax.barh(
            [y + 0.4 * i for y in range(len(table))],
            [seconds(r[column]) * 1000 for r in table],
            height=0.4,
            label=label,
        )
    ax.set(
        xscale="log",
        xlabel="small tenants' wait to start (ms, log)",
        yticks=[y + 0.2 for y in range(len(table))],
        yticklabels=names,
    )
    ax.invert_yaxis()
    ax.legend()
    drain.barh(names, [seconds(r[5]) for r in table], color="tab:grey")
    drain.set(xlabel="flood of 400 x 500 ms drained in (s)", yticks=[])
    drain.invert_yaxis()
    fig.suptitle("Long jobs in every slot: ordering alone against a cap of 6 of 8 threads")
    save(fig, "heavy-flood.png", "heavy-flood-2026-12-03.txt")


def weights(runs: dict[str, Any]) -> None:
    tenants = runs["weights"]["tenants"]
    fig, (ax,) = figure()
    names = [f"{name} (weight {t['weight']})" for name, t in tenants.items()]
    ax.bar(names, [t["share"] * 100 for t in tenants.values()], label="measured share")
    targets = [t["target"] * 100 for t in tenants.values()]
    ax.hlines(
        targets,
        [x - 0.45 for x in range(3)],
        [x + 0.45 for x in range(3)],
        color="black",
        label="weight / 6",
    )
    ax.set(ylabel="share of the first 60% of starts (%)", title="Weights 1 : 2 : 3")
    ax.legend()
    save(fig, "weights.png", "2026-12-01.json")


def throughput(runs: dict[str, Any]) -> None:
    data = runs["throughput"]
    ceiling = data["ceiling_tps"]
    fig, (ax,) = figure()
    for name, by_n in data["claims"].items():
        ns = [n for n in ceiling if n in by_n]
        style = "o-" if name.startswith("runworker") else "o--"
        ax.plot(ns, [by_n[n] / ceiling[n] for n in ns], style, label=name)
    ax.axhline(1, color="grey", lw=1)
    ax.set(
        xlabel="workers (threads or connections)",
        ylabel="jobs/s ÷ commit ceiling",
        title="No-op jobs against pgbench's commit ceiling, same run",
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, "throughput.png", "2026-12-01.json")


def lookahead() -> None:
    table = rows(text("prefetch-2026-12-04.txt"), "look-ahead")
    k = [r[0] for r in table]
    fig, (ratio, wait) = figure(2)
    ratio.plot(k, [number(r[2]) for r in table], "o-", label="8 threads")
    ratio.plot(k, [number(r[4]) for r in table], "o-", label="1 thread")
    ratio.axhline(1, color="grey", lw=1)
    ratio.set(xlabel="PREFETCH (32 is the default)", ylabel="jobs/s ÷ commit ceiling")
    ratio.legend()
    wait.plot(k, [seconds(r[5]) * 1000 for r in table], "o-", label="p50")
    wait.plot(k, [seconds(r[6]) * 1000 for r in table], "o-", label="p95")
    wait.set(xlabel="PREFETCH", ylabel="small tenants' wait to start (ms)", ylim=(0, 15))
    wait.legend()
    fig.suptitle("Look-ahead: throughput and the wait beside a 5 ms flood")
    save(fig, "lookahead.png", "prefetch-2026-12-04.txt")


def latency(runs: dict[str, Any]) -> None:
    fig, (ax,) = figure()
    for name in ("LISTEN/NOTIFY", "polling every 1 s"):
        waits = sorted(w * 1000 for w in runs["latency"][name]["waits_s"])
        ax.plot([100 * (i + 1) / len(waits) for i in range(len(waits))], waits, ".-", label=name)
    ax.set(
        yscale="log",
        xlabel="percentile of 60 jobs",
        ylabel="enqueue → start (ms, log)",
        title="Wake-up of an idle worker",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save(fig, "latency.png", "2026-12-01.json")


def table_scale() -> None:
    report = text("table-scale-2026-12-01.txt")
    calls = rows(report, "finished jobs  enqueue")
    reads = rows(report, "finished jobs  /stats")
    ops = {"enqueue": 1, "claim": 3, "complete": 5}
    values = {op: [number(r[c]) for r in calls] for op, c in ops.items()}
    for i, op in enumerate(("/stats", "/metrics", "/jobs", "/jobs page 1000")):
        values[op] = [number(r[i + 1]) for r in reads]
    empty_first_page = values["/jobs"][0]
    fig, (ax,) = figure()
    for i, size in enumerate(("1,000,000", "10,000,000")):
        ratios = [
            v[i + 1] / (empty_first_page if op.endswith("1000") else v[0])
            for op, v in values.items()
        ]
        ax.bar(
            [x + 0.4 * i for x in range(len(values))],
            ratios,
            width=0.4,
            label=f"{size} finished jobs",
        )
    ax.axhline(1, color="grey", lw=1)
    ax.set(
        xticks=[x + 0.2 for x in range(len(values))],
        ylabel="p50 ÷ p50 on an empty table",
        title="Hot paths and reads as finished jobs pile up",
    )
    ax.set_xticklabels(list(values), fontsize=8)
    ax.legend()
    save(fig, "table-scale.png", "table-scale-2026-12-01.txt")


def soak() -> None:
    table = rows(text("soak-2026-12-01.txt"), "minute")
    minutes = [number(r[0]) for r in table]
    fig, (ax,) = figure()
    ax.plot(minutes, [number(r[1]) for r in table], "o-", label="job table (MiB)")
    ax.plot(minutes, [number(r[3]) for r in table], "o-", label="attempt table (MiB)")
    ax.set(
        xlabel="minutes at 1,000 jobs/s, retention 60 s",
        ylabel="MiB",
        title="Table sizes level off under retention",
    )
    ax.grid(True, alpha=0.3)
    ax.legend()
    save(fig, "soak.png", "soak-2026-12-01.txt")


def limits() -> None:
    report = text("limits-keys-2026-12-05.txt")
    fig, (exact, cost, rate) = figure(3)
    table = rows(report, "run   tenant")
    exact.scatter([number(r[2]) for r in table], [number(r[3]) for r in table], s=60)
    exact.plot([0, 6], [0, 6], color="grey", lw=1)
    exact.set(xlabel="cap", ylabel="most running at once", title="Caps are exact (3 runs)")
    rounds = re.findall(r"each round, caps / no limits: ([\d. ]+?) \(", report)
    for label, line in zip(("1 process x 8", "2 processes x 4"), rounds, strict=True):
        values = [float(v) for v in line.split()]
        cost.plot(range(1, len(values) + 1), values, "o-", label=label)
    cost.set(
        xlabel="round",
        ylabel="jobs/s with caps ÷ without",
        ylim=(0.7, 1.05),
        title="What caps cost",
    )
    cost.legend(fontsize=8)
    per_second = re.search(r"per second: ([\d ]+)", report)
    starts = [int(v) for v in per_second.group(1).split()] if per_second else []
    rate.bar(range(1, len(starts) + 1), starts)
    rate.axhline(55, color="grey", ls="--", lw=1, label="50/s + burst 5")
    rate.set(xlabel="second", ylabel="starts", title='Rate limit "50/s"')
    rate.legend(fontsize=8)
    save(fig, "limits.png", "limits-keys-2026-12-05.txt")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    runs = json.loads((RESULTS / "2026-12-01.json").read_text())["runs"]
    noisy_neighbour(runs)
    heavy_flood()
    weights(runs)
    throughput(runs)
    lookahead()
    latency(runs)
    table_scale()
    soak()
    limits()


if __name__ == "__main__":
    main()
