"""Look-ahead (PGQUEUE["PREFETCH"]): what claiming ahead buys, and every wait to the real start.

For each look-ahead K in 0, 2, 4, 8, 16, 32 (quick: 0, 8 and 32):

- throughput: pre-enqueued no-op jobs (4 tenants, fair ordering), one `manage.py runworker
  --burst` with PGQUEUE_PREFETCH=K at concurrency 8 and at concurrency 1; jobs/s = jobs /
  (last finish - first start) from the rows, the median of the runs (interleaved: every K
  once, then again), and its ratio to pgbench's commit ceiling at as many clients,
  measured in the same run;
- fairness: the noisy-neighbour scenario (bench/noisy_neighbour.py, fair ordering, 8
  threads, 5 ms jobs) with PGQUEUE_PREFETCH=K: the small tenants' wait, started_at -
  created_at, which is the wait to the handler's real start.

Then, at the default look-ahead:

- heavy flood: bench/heavy_flood.py's capped variant (400 jobs of 500 ms, the flood tenant
  capped at 6 of 8 threads; quick: 80 of 200 ms): the small tenants' wait to the start;
- stranding: two `runworker --concurrency 1` processes, both idle; a long job (2 s; quick
  1 s) of one tenant and a no-op of another are enqueued in one transaction, 6 trials
  (quick 3). When one worker claims both, the no-op waits in it behind the long job unless
  it is given back. Its wait is measured from its enqueue to its finish (a no-op runs for
  microseconds): the same measure in a release whose started_at was the claim's. With
  BENCH_BEFORE=<git ref>, the same trials also run on workers of that commit (checked out
  in a temporary git worktree), so that the line shows before and after from one run.

    python scripts/with_db.py -- python -m bench.prefetch [--quick]
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import heavy_flood, noisy_neighbour
from bench.common import ROOT, commit_ceiling, median, ms, query, reset_tables, scalar, table
from bench.harness import STARTUP, listeners, start_worker, stop_workers, wait_for

LEVELS = [0, 2, 4, 8, 16, 32]
QUICK_LEVELS = [0, 8, 32]
DEFAULT = 32  # PGQUEUE["PREFETCH"]'s default: the figures the targets are read at
CEILING_TARGET = 0.8  # c=8 jobs/s over the commit ceiling at the default look-ahead
WAIT_TARGET = 0.050  # small tenants' p95 wait to the start, in seconds


def _fill(jobs: int) -> None:
    from django.db import connection

    import pgqueue

    reset_tables()
    for t in range(4):
        pgqueue.enqueue_many("bench.noop", [None] * (jobs // 4), tenant=f"tenant{t}")
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE pgqueue_job")


def _burst(concurrency: int, prefetch: int, jobs: int, *extra: str) -> float:
    """jobs/s of one ``runworker --burst`` over ``jobs`` pre-enqueued no-op jobs."""
    _fill(jobs)
    worker = start_worker(["--burst", "--concurrency", str(concurrency), *extra], PREFETCH=prefetch)
    try:
        code = worker.proc.wait()
    finally:
        stop_workers([worker])
    if code != 0:
        raise subprocess.CalledProcessError(code, worker.proc.args)
    ((done, seconds),) = query(
        "SELECT count(*) FILTER (WHERE status = 'done'), "
        "extract(epoch FROM max(finished_at) - min(started_at)) FROM pgqueue_job"
    )
    if done != jobs:
        raise SystemExit(f"only {done} of {jobs} jobs done")
    return done / float(seconds)


@contextlib.contextmanager
def _prefetch_env(prefetch: int) -> Iterator[None]:
    """Workers started by bench.noisy_neighbour inherit PGQUEUE_PREFETCH from here."""
    before = os.environ.get("PGQUEUE_PREFETCH")
    os.environ["PGQUEUE_PREFETCH"] = str(prefetch)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PGQUEUE_PREFETCH", None)
        else:
            os.environ["PGQUEUE_PREFETCH"] = before


def _fairness(prefetch: int, big: int) -> dict[str, Any]:
    with _prefetch_env(prefetch):
        r = noisy_neighbour.one_run("fair", big)
    return {
        "start_wait_p50_s": r["small_wait_p50_s"],
        "start_wait_p95_s": r["small_wait_p95_s"],
        "big_jobs_per_s": r["big_jobs_per_s"],
        "small_jobs": r["small_jobs"],
    }


def stranding(trials: int, long_ms: int, root: Path = ROOT) -> dict[str, Any]:
    """The stranding trials (see the module's docstring) on the workers of ``root``: the
    no-op's wait from enqueue to finish in each, and how many times a worker gave back
    jobs claimed ahead that had not started (its log; none in a release without it)."""
    from django.db import transaction

    import pgqueue

    reset_tables()
    waits: list[float] = []
    with tempfile.TemporaryDirectory(prefix="pgqueue-stranding-") as logs:
        ready = listeners() + 2
        workers = [
            start_worker(["--concurrency", "1", "-v", "1"], log_dir=Path(logs), root=root)
            for _ in range(2)
        ]
        try:
            wait_for(lambda: listeners() >= ready, STARTUP, "both workers to LISTEN")
            for _ in range(trials):
                with transaction.atomic():
                    pgqueue.enqueue("bench.sleep_ms", {"ms": long_ms}, tenant="long")
                    short, _ = pgqueue.enqueue("bench.noop", tenant="short")
                wait_for(
                    lambda: (
                        not scalar(
                            "SELECT EXISTS (SELECT 1 FROM pgqueue_job WHERE status <> 'done')"
                        )
                    ),
                    60,
                    "the trial's two jobs",
                )
                waits.append(
                    float(
                        scalar(
                            "SELECT extract(epoch FROM finished_at - created_at)::float8"
                            " FROM pgqueue_job WHERE id = %s",
                            [short.id],
                        )
                    )
                )
        finally:
            stop_workers(workers)
        given_back = sum(
            (w.log_path.read_text(errors="replace") if w.log_path else "").count(
                "reason=not_started_within_hold"
            )
            for w in workers
        )
    return {
        "waits_s": waits,
        "median_s": median(waits),
        "max_s": max(waits),
        "given_back": given_back,
        "long_ms": long_ms,
    }


@contextlib.contextmanager
def _checkout(ref: str) -> Iterator[Path]:
    """A temporary git worktree of this repository at ``ref``."""
    path = Path(tempfile.mkdtemp(prefix="pgqueue-before-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref],
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(path, ignore_errors=True)


def chart(levels: list[int], figures: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for c, colour in ((8, "tab:blue"), (1, "tab:green")):
        ax.plot(
            levels,
            [figures["throughput"][c][k]["ratio"] for k in levels],
            marker="o",
            color=colour,
            label=f"jobs/s ÷ commit ceiling, concurrency {c}",
        )
    ax.axhline(CEILING_TARGET, color="grey", linestyle=":", linewidth=1, label="target 0.8 at c=8")
    ax.set_xlabel("look-ahead K (PGQUEUE PREFETCH): jobs claimed beyond the free slots")
    ax.set_ylabel("throughput ÷ pgbench commit ceiling (log)")
    ax.set_yscale("log")  # c=1 passes its 1-client ceiling many times over
    ax.set_xticks(levels)
    ax.grid(True, alpha=0.3)
    right = ax.twinx()
    right.plot(
        levels,
        [figures["fairness"][k]["start_wait_p95_s"] * 1000 for k in levels],
        marker="s",
        color="tab:red",
        label="small tenant p95 wait, enqueue → handler start (ms)",
    )
    right.axhline(WAIT_TARGET * 1000, color="tab:red", linestyle=":", linewidth=1)
    right.set_ylabel("small tenant p95 (ms)")
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    ax.set_title("Look-ahead: throughput against small-tenant wait (noisy neighbour, fair)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    levels = QUICK_LEVELS if quick else LEVELS
    runs = 1 if quick else 3
    jobs = {8: 4_000 if quick else 12_000, 1: 1_000 if quick else 3_000}
    big = 1_000 if quick else 10_000
    flood, flood_ms = (80, 200) if quick else (400, 500)
    trials, long_ms = (3, 1000) if quick else (6, 2000)
    ceilings = {c: commit_ceiling(c, seconds=2 if quick else 5) for c in (1, 8)}
    rates: dict[int, dict[int, list[float]]] = {c: {k: [] for k in levels} for c in jobs}
    for _ in range(runs):
        for k in levels:
            for c in (8, 1):
                rates[c][k].append(_burst(c, k, jobs[c]))
                print(
                    f"   prefetch {k:2}, concurrency {c}: {rates[c][k][-1]:8,.0f} jobs/s",
                    flush=True,
                )
    throughput = {
        c: {
            k: {
                "jobs_per_s": median(rates[c][k]),
                "ratio": median(rates[c][k]) / ceilings[c] if ceilings[c] else float("nan"),
                "runs": rates[c][k],
            }
            for k in levels
        }
        for c in jobs
    }
    fairness = {}
    for k in levels:
        fairness[k] = _fairness(k, big)
        print(
            f"   prefetch {k:2}, noisy neighbour: small p95 to start "
            f"{ms(fairness[k]['start_wait_p95_s'])}",
            flush=True,
        )
    heavy = heavy_flood.one_run("capped", flood, flood_ms)
    heavy.pop("small_series", None)
    print(f"   heavy flood, capped: small p95 to start {ms(heavy['small_wait_p95_s'])}", flush=True)
    strand = {"after": stranding(trials, long_ms)}
    before_ref = os.environ.get("BENCH_BEFORE")
    if before_ref:
        with _checkout(before_ref) as old:
            strand["before"] = {**stranding(trials, long_ms, root=old), "ref": before_ref}
    for when, r in strand.items():
        print(
            f"   stranding, {when}: no-op waits median {ms(r['median_s'])}, max "
            f"{ms(r['max_s'])} ({r['given_back']} give-backs)",
            flush=True,
        )
    figures = {
        "levels": levels,
        "ceiling_tps": ceilings,
        "throughput": throughput,
        "fairness": fairness,
        "heavy_flood_capped": heavy,
        "stranding": strand,
    }
    rows = [
        [
            k,
            throughput[8][k]["jobs_per_s"],
            f"{throughput[8][k]['ratio']:.3f}",
            throughput[1][k]["jobs_per_s"],
            f"{throughput[1][k]['ratio']:.3f}",
            ms(fairness[k]["start_wait_p50_s"]),
            ms(fairness[k]["start_wait_p95_s"]),
            f"{fairness[k]['big_jobs_per_s']:,.0f}",
        ]
        for k in levels
    ]
    report = table(
        [
            "look-ahead",
            "c=8 jobs/s",
            "÷ ceiling",
            "c=1 jobs/s",
            "÷ ceiling",
            "small p50 to start",
            "p95",
            "big jobs/s",
        ],
        rows,
    )
    ratio8 = throughput[8][DEFAULT]["ratio"] if DEFAULT in levels else float("nan")
    noisy95 = fairness[DEFAULT]["start_wait_p95_s"] if DEFAULT in levels else float("nan")
    heavy95 = heavy["small_wait_p95_s"]
    after = strand["after"]
    report += (
        f"\npgbench commit ceiling: {ceilings[8] or float('nan'):,.0f} tps at 8 clients, "
        f"{ceilings[1] or float('nan'):,.0f} at 1 (same run)."
        f"\ntarget: c=8 ÷ ceiling ≥ {CEILING_TARGET} at look-ahead {DEFAULT}: "
        f"{_met(ratio8 >= CEILING_TARGET)} ({ratio8:.3f})"
        f"\ntarget: small p95 to the start < {ms(WAIT_TARGET)}, noisy neighbour (5 ms flood) "
        f"at look-ahead {DEFAULT}: {_met(noisy95 < WAIT_TARGET)} ({ms(noisy95)}); heavy flood "
        f"({flood} x {flood_ms} ms, capped at {heavy_flood.CAP}): "
        f"{_met(heavy95 < WAIT_TARGET)} ({ms(heavy95)}, p50 {ms(heavy['small_wait_p50_s'])})"
        f"\nstranding ({trials} trials, a {long_ms / 1000:g} s job and a no-op enqueued together,"
        f" two idle 1-thread workers): the no-op's enqueue → done, median "
        f"{ms(after['median_s'])}, max {ms(after['max_s'])}; {after['given_back']} give-backs"
    )
    if "before" in strand:
        b = strand["before"]
        report += (
            f"\n  before ({b['ref']}, same trials, same run): median {ms(b['median_s'])}, "
            f"max {ms(b['max_s'])}"
        )
    path = out_dir / ("prefetch-quick.png" if quick else "prefetch.png")
    chart(levels, figures, path)
    method = (
        f"No-op jobs pre-enqueued ({jobs[8]:,} at concurrency 8, {jobs[1]:,} at 1; 4 tenants, "
        f"fair), one runworker --burst per run with PGQUEUE_PREFETCH=K, median of {runs} "
        "interleaved runs; jobs/s from the rows' timestamps (first handler start to last "
        "handler end), divided by pgbench's ceiling at as many clients in the same run. "
        f"Fairness: noisy neighbour ({big:,}-job flood, 5 ms jobs, 8 threads, fair) per K; "
        f"heavy flood ({flood} jobs of {flood_ms} ms capped at {heavy_flood.CAP}, 8 threads); "
        "waits are started_at - created_at: to the handler's start. Stranding: see the "
        "line; before/after only with BENCH_BEFORE set."
    )
    return {
        "title": "Look-ahead",
        "method": method,
        "report": report,
        "figures": figures,
        "charts": [str(path)],
    }


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
