"""Every benchmark, one report: `python -m bench.run_all [--quick] [--only a,b]`.

Runs against a database of its own (pgqueue_bench, next to DATABASE_URL's; `make bench`
starts an embedded PostgreSQL when DATABASE_URL is unset), shows progress while it runs,
prints one report, and writes the raw figures to bench/results/<date>.json and the charts
as PNG next to it. Each section says how its figures were measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import sys
import time
from pathlib import Path

from bench.common import machine, setup_database

RESULTS = Path(__file__).resolve().parent / "results"

#: (module in bench/, title) in report order. Each module has
#: run(quick: bool, out_dir: Path) -> dict with "title", "method", "report" (text) and
#: "figures" (JSON-serialisable raw numbers), and optionally "charts" (PNG paths).
RUNS = [
    ("noisy_neighbour", "1. Noisy neighbour: fair vs FIFO"),
    ("weights", "2. Weights 1:2:3"),
    ("throughput", "3. Throughput by claim strategy, and enqueue throughput"),
    ("latency", "4. Wake-up latency: LISTEN/NOTIFY vs polling"),
    ("chaos", "5. Crash safety"),
    ("verified", "6. Verified results"),
    ("table_scale", "7. Scale of the table"),
    ("hosts", "8. Workers on several hosts against one PostgreSQL"),
    ("profile", "9. Where a job's time goes in the worker (profile)"),
    ("prefetch", "10. Look-ahead: throughput against small-tenant wait"),
    ("soak", "11. Soak with retention"),
    ("heavy_flood", "12. Heavy flood: long jobs in every slot"),
    ("limits", "13. Caps and rate limits"),
    ("claim_shape", "14. The claim path's shape"),
    ("keys", "15. Concurrency keys and sequences"),
    ("workflows", "16. Workflows"),
    ("tracing", "17. Tracing: throughput with OpenTelemetry off and on"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--only", help="comma-separated module names to run")
    args = parser.parse_args()
    setup_database()
    chosen = [r for r in RUNS if not args.only or r[0] in args.only.split(",")]
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    RESULTS.mkdir(exist_ok=True)
    about = machine()
    print(f"machine: {about}", flush=True)
    sections, raw = [], {"machine": about, "quick": args.quick, "date": stamp, "runs": {}}
    started = time.monotonic()
    for name, title in chosen:
        print(f"\n== {title} ...", flush=True)
        t0 = time.monotonic()
        module = importlib.import_module(f"bench.{name}")
        result = module.run(quick=args.quick, out_dir=RESULTS)
        elapsed = time.monotonic() - t0
        print(f"   done in {elapsed:.0f} s", flush=True)
        raw["runs"][name] = {**result.get("figures", {}), "seconds": round(elapsed, 1)}
        sections.append(f"{title}\n{result['method']}\n\n{result['report']}")
        for chart in result.get("charts", []):
            sections[-1] += f"\nchart: {_relative(chart)}"
    suffix = "-quick" if args.quick else ""
    out = RESULTS / f"{stamp}{suffix}.json"
    out.write_text(json.dumps(raw, indent=2, default=str))
    print("\n" + "=" * 78)
    print(f"pgqueue benchmarks — {stamp}{' (quick)' if args.quick else ''}")
    print(f"machine: {about}")
    for section in sections:
        print("\n" + section)
    print(f"\nraw figures: {_relative(out)}  (total {time.monotonic() - started:.0f} s)")
    return 0


def _relative(path: Path | str) -> str:
    """A path as the repository names it: a committed report names no machine's checkout."""
    try:
        return str(Path(path).resolve().relative_to(RESULTS.parent.parent))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
