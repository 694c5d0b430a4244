"""Where a job's time goes in ``runworker``: a sampling profile, and the toggles that exist.

Part 1, the profile. N no-op jobs are pre-enqueued (4 tenants, fair) and one
``manage.py runworker --burst --concurrency C`` (verbosity 1, the operator's default: one
INFO line per job, written to a file) runs them under py-spy (``record --nonblocking
--threads --format raw``, idle samples off: only threads on a CPU are counted). Samples of
start-up and shutdown (stacks outside ``Worker.run`` and the worker's threads) are left
out; each remaining sample goes to a bucket by its innermost frame that names one (see
BUCKETS). A bucket's µs per job is its share of those samples times the worker's CPU time
per job, measured without the profiler in the same run: ``os.wait4`` user + sys of the
worker process, minus that of a run with no job (start-up), divided by the jobs. CPU time
per job barely depends on what else the machine runs; wall time per job does, so the
report gives both, and "off the worker's CPU" (wall - CPU) is where the database wait,
the commit and the machine's other load show. A second py-spy run with ``--idle`` splits
the loop thread's wall time into waiting on the database, waiting for handlers, running.
The folded stacks are kept as bench/results/profile-c<C>[-wall].folded (speedscope and
flamegraph.pl read them).

Part 2, the toggles. The same burst without the profiler, at concurrency 1, 2, 4 and 8,
with the per-job INFO line (``-v 1``) and without (``-v 0``: the pgqueue loggers at
WARNING, as the other benchmarks run), and at concurrency 8 with PGQUEUE_BATCH_SIZE below
the concurrency; jobs/s = jobs / (last finish - first start) from the jobs' timestamps,
median of the repeats (interleaved), beside the pgbench commit ceiling measured in the
same run; jobs per claim and per record count the distinct claimed_at (each claim stamps
its jobs with its transaction's now()) and the distinct transactions that last wrote the
done rows (xmin: the recording's).

    python scripts/with_db.py -- python -m bench.profile [--quick]
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import ROOT, commit_ceiling, median, reset_tables, table
from bench.harness import worker_env

PROFILE_RATE = 250  # samples per second: at 2 cores, more slows the worker it measures
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*?):(?P<line>\d+)\)$")

#: (bucket, predicate on (function, file)), tried from the innermost frame outwards; the
#: first frame that matches names the sample's bucket. Frames that match none (Django's
#: internals, generated dataclass __init__, a Condition made inside a Future) are skipped.
BUCKETS: list[tuple[str, Any]] = [
    ("per-job logging", lambda f, p: p.startswith("logging/") or f == "Worker._log_outcomes"),
    ("Django connection handling", lambda f, p: f == "close_old_connections"),
    ("JSON encode/decode", lambda f, p: p.startswith("json/") or f == "_encode_result"),
    ("psycopg execute/fetch", lambda f, p: p.startswith("psycopg/")),
    (
        "thread hand-off",
        lambda f, p: (
            (p == "threading.py" and not f.endswith("__init__"))
            or p.startswith("queue.py")
            or (f == "_worker" and p.endswith("futures/thread.py"))
            or f in ("Worker._take_outcomes", "Worker._linger", "Worker.wake")
        ),
    ),
    (
        "handler dispatch",
        lambda f, p: (
            p.startswith("concurrent/futures/")
            or f
            in (
                "Worker._dispatch",
                "Worker._execute",
                "Worker._on_done",
                "get_task",
                "noop",
            )
        ),
    ),
    (
        "row building",
        lambda f, p: (
            f in ("_claimed", "_best_first", "_complete_params", "_claim_params", "Worker._split")
            or p.endswith("pgqueue/worker/context.py")
        ),
    ),
    ("SQL wrappers (pgqueue/store.py)", lambda f, p: p.endswith("pgqueue/store.py")),
    (
        "heartbeat, maintenance, listener",
        lambda f, p: (
            f == "Worker._heartbeat"
            or p.endswith("pgqueue/worker/maintenance.py")
            or p.endswith("pgqueue/worker/listener.py")
        ),
    ),
    ("loop bookkeeping (Worker.run, _turn)", lambda f, p: p.endswith("pgqueue/worker/runtime.py")),
]
OTHER = "other (no pgqueue frame decides)"
#: A sample whose innermost frame is one of these is a thread blocked in that call that
#: py-spy, not pausing the process, still saw as running: counted, but given no CPU time.
BLOCKED = "blocked (leaf: queue get, Condition/psycopg wait)"
BLOCKING_LEAVES = {
    ("_worker", "concurrent/futures/thread.py"),
    ("Condition.wait", "threading.py"),
    ("Event.wait", "threading.py"),
    ("Connection.wait", "psycopg/connection.py"),
    ("Connection.notifies", "psycopg/connection.py"),
}


@dataclass
class Burst:
    jobs: int
    rate: float  # jobs/s from the jobs' own timestamps
    claims: int  # claim statements: distinct claimed_at (now() of the claiming transaction)
    records: int  # completion statements: distinct xmin of the done rows
    cpu: float  # user + sys seconds of the worker process, start-up included
    wall: float  # seconds from start to exit


def _fill(jobs: int) -> None:
    from django.db import connection

    import pgqueue

    reset_tables()
    for t in range(4):
        if jobs // 4:
            pgqueue.enqueue_many("bench.noop", [None] * (jobs // 4), tenant=f"tenant{t}")
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE pgqueue_job")


def _rate(expected: int) -> tuple[float, int, int]:
    """jobs/s, and how many claim and completion statements ran them: each claim stamps
    its jobs with its own transaction's now(), each recording writes them in its own
    transaction (their xmin)."""
    from django.db import connection

    if not expected:
        return float("nan"), 0, 0
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE status = 'done'), "
            "extract(epoch FROM max(finished_at) - min(started_at)), "
            "count(DISTINCT claimed_at), count(DISTINCT xmin::text) FROM pgqueue_job"
        )
        done, seconds, claims, records = cur.fetchone()
    if done != expected:
        raise SystemExit(f"only {done} of {expected} jobs done")
    return done / float(seconds), claims, records


def _burst(
    jobs: int,
    concurrency: int,
    verbosity: int,
    log_dir: Path,
    prefix: list[str] | None = None,
    **settings: Any,
) -> Burst:
    """Fill, then ``runworker --burst`` (under ``prefix``, e.g. a profiler) until it exits.

    The CPU time is the direct child's (``os.wait4``): the worker's own when nothing wraps it.
    """
    _fill(jobs)
    cmd = [
        *(prefix or []),
        sys.executable,
        str(ROOT / "manage.py"),
        "runworker",
        "--burst",
        "-v",
        str(verbosity),
        "--concurrency",
        str(concurrency),
    ]
    env = worker_env(**settings)
    with tempfile.NamedTemporaryFile(dir=log_dir, prefix="worker-", suffix=".log") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True,
        )  # fmt: skip
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            log.seek(0)
            tail = log.read()[-2000:].decode(errors="replace")
            raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{tail}")
    return Burst(jobs, *_rate(jobs), usage.ru_utime + usage.ru_stime, wall)


def _py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def _parse_folded(text: str) -> list[tuple[str, list[tuple[str, str]], int]]:
    """(thread name, frames outermost first as (function, file), count) per folded line."""
    out = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";")
        thread = parts[0].split(": ", 1)[1] if ": " in parts[0] else ""
        frames = []
        for part in parts[1:]:
            m = FRAME.match(part)
            if m:
                frames.append((m["func"], m["file"]))
        out.append((thread, frames, int(count)))
    return out


def _steady(thread: str, frames: list[tuple[str, str]]) -> bool:
    """A sample of the worker at work, not of its start-up or shutdown."""
    funcs = {f for f, _ in frames}
    if "Worker._shutdown" in funcs or "Worker._register" in funcs:
        return False
    return "Worker.run" in funcs or thread.startswith(("pgqueue-job", "pgqueue-listener"))


def _bucket(frames: list[tuple[str, str]]) -> str:
    if frames[-1] in BLOCKING_LEAVES:
        return BLOCKED
    for func, path in reversed(frames):
        for name, matches in BUCKETS:
            if matches(func, path):
                return name
    return OTHER


def analyse(text: str) -> dict[str, Any]:
    """Buckets, top own and cumulative entries, per-thread shares of the steady samples."""
    buckets: Counter[str] = Counter()
    own: Counter[str] = Counter()
    cumulative: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = skipped = 0
    for thread, frames, count in _parse_folded(text):
        if not frames or not _steady(thread, frames):
            skipped += count
            continue
        total += count
        buckets[_bucket(frames)] += count
        threads["loop thread" if thread == "MainThread" else re.sub(r"_\d+$", "", thread)] += count
        func, path = frames[-1]
        own[f"{func} ({path})"] += count
        for entry in {f"{f} ({p})" for f, p in frames}:
            cumulative[entry] += count
    return {
        "samples": total,
        "skipped_startup_shutdown": skipped,
        "buckets": dict(buckets),
        "threads": dict(threads),
        "own": own.most_common(15),
        "cumulative": cumulative.most_common(25),
    }


def _profile(
    spy: str, jobs: int, concurrency: int, log_dir: Path, out_dir: Path, suffix: str, wall: bool
) -> tuple[Burst, str, Path]:
    """One burst under py-spy: on-CPU samples only, or every sample (``--idle``) when
    ``wall``, for the loop thread's wall time."""
    folded = out_dir / f"profile-c{concurrency}{'-wall' if wall else ''}{suffix}.folded"
    prefix = [
        spy, "record", "--nonblocking", "--threads", "--rate", str(PROFILE_RATE),
        "--format", "raw", "--output", str(folded), *(["--idle"] if wall else []), "--",
    ]  # fmt: skip
    burst = _burst(jobs, concurrency, 1, log_dir, prefix)
    return burst, folded.read_text(), folded


def loop_wall(text: str) -> dict[str, int]:
    """The loop thread's steady samples (every sample, idle or not) by what it waits on."""
    split: Counter[str] = Counter()
    for thread, frames, count in _parse_folded(text):
        if thread != "MainThread" or not frames or not _steady(thread, frames):
            continue
        func, path = frames[-1]
        if func == "Connection.wait" and "psycopg" in path:
            split["waiting on the database (claim + record + commit)"] += count
        elif path == "threading.py" and func in ("Event.wait", "Condition.wait"):
            split["waiting for handlers (wake_event)"] += count
        else:
            split["running (or waiting for the GIL)"] += count
    return dict(split)


def _cpu_us(burst: Burst, startup_cpu: float) -> float:
    return max(burst.cpu - startup_cpu, 0.0) / burst.jobs * 1e6


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    levels = [1, 8] if quick else [1, 2, 4, 8]
    repeats = 1 if quick else 3
    small_batches = [2] if quick else [1, 2, 4]

    def jobs_at(c: int) -> int:
        return min(500 * c, 2_000) if quick else min(1_000 * c, 6_000)

    out_dir.mkdir(exist_ok=True)
    suffix = "-quick" if quick else ""
    load_before = os.getloadavg()
    figures: dict[str, Any] = {"levels": levels, "repeats": repeats, "load_before": load_before}
    ceilings = {n: commit_ceiling(n, seconds=2 if quick else 5) for n in levels}
    figures["ceiling_tps"] = ceilings
    with tempfile.TemporaryDirectory(prefix="pgqueue-profile-") as tmp:
        log_dir = Path(tmp)
        # Start-up CPU (Django set-up, connections, registration): a burst with no job.
        startup = {
            v: median([_burst(0, 1, v, log_dir).cpu for _ in range(max(repeats, 2))])
            for v in (0, 1)
        }
        figures["startup_cpu_s"] = startup

        # Part 2 first, interleaved: every toggle at every level within each repeat, so that
        # a change in the machine's load hits them all alike.
        shapes: list[tuple[str, int, int, dict[str, Any]]] = []
        for c in levels:
            shapes.append((f"c={c}, -v 1 (INFO line per job)", c, 1, {}))
            shapes.append((f"c={c}, -v 0 (WARNING)", c, 0, {}))
        for b in small_batches:
            shapes.append((f"c=8, -v 0, BATCH_SIZE={b}", 8, 0, {"BATCH_SIZE": b}))
        samples: dict[str, list[Burst]] = {label: [] for label, *_ in shapes}
        for r in range(repeats):
            for label, c, v, settings in shapes:
                samples[label].append(_burst(jobs_at(c), c, v, log_dir, **settings))
                b = samples[label][-1]
                print(
                    f"   [{r + 1}/{repeats}] {label:32} {b.rate:7,.0f} jobs/s "
                    f"{_cpu_us(b, startup[v]):5.0f} µs CPU/job",
                    flush=True,
                )
        toggles = {}
        for label, c, v, _ in shapes:
            runs = samples[label]
            toggles[label] = {
                "concurrency": c,
                "verbosity": v,
                "jobs_per_s": median([b.rate for b in runs]),
                "cpu_us_per_job": median([_cpu_us(b, startup[v]) for b in runs]),
                "wall_us_per_job": median([1e6 / b.rate for b in runs]),
                "jobs_per_claim": median([b.jobs / b.claims for b in runs]),
                "jobs_per_record": median([b.jobs / b.records for b in runs]),
            }
        figures["toggles"] = toggles

        # Part 1: the profile at 1 and 8: on-CPU samples, then every sample of the loop.
        spy = _py_spy()
        profiles: dict[int, dict[str, Any]] = {}
        if spy is not None:
            for c in (1, 8):
                burst, text, folded = _profile(
                    spy, 3 * jobs_at(c), c, log_dir, out_dir, suffix, wall=False
                )
                found = analyse(text)
                found["profiled_jobs_per_s"] = burst.rate
                # What the samples add up to if each stood for 1/rate s of one CPU: a check
                # of the sampler against the rusage figure (py-spy lags when the box is busy).
                found["sampled_cpu_us_per_job"] = found["samples"] / PROFILE_RATE / burst.jobs * 1e6
                found["folded"] = str(folded.relative_to(ROOT))
                burst, text, folded = _profile(spy, jobs_at(c), c, log_dir, out_dir, suffix, True)
                found["loop_wall"] = loop_wall(text)
                found["loop_wall_us_per_job"] = 1e6 / burst.rate
                found["wall_folded"] = str(folded.relative_to(ROOT))
                profiles[c] = found
                print(f"   profiled c={c}: {found['samples']} on-CPU samples", flush=True)
        figures["profiles"] = profiles
    figures["load_after"] = os.getloadavg()
    return {
        "title": "profile",
        "method": __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0],
        "report": _report(figures, spy is not None),
        "figures": figures,
    }


def _report(figures: dict[str, Any], profiled: bool) -> str:
    toggles, ceilings = figures["toggles"], figures["ceiling_tps"]
    lines = [
        "load average (1, 5, 15 min) before: "
        + ", ".join(f"{x:.1f}" for x in figures["load_before"])
        + "; after: "
        + ", ".join(f"{x:.1f}" for x in figures["load_after"])
        + f" (on {os.cpu_count()} cores)",
        "",
    ]
    rows = []
    for label, t in toggles.items():
        ceiling = ceilings.get(t["concurrency"])
        rows.append(
            [
                label,
                t["jobs_per_s"],
                ceiling or float("nan"),
                t["jobs_per_s"] / ceiling if ceiling else float("nan"),
                t["cpu_us_per_job"],
                t["wall_us_per_job"],
                t["jobs_per_claim"],
                t["jobs_per_record"],
            ]
        )
    lines.append(
        table(
            [
                *("runworker --burst", "jobs/s", "ceiling", "÷ ceiling", "CPU µs/job"),
                *("wall µs/job", "jobs/claim", "jobs/record"),
            ],
            rows,
        )
    )
    levels = sorted({t["concurrency"] for t in toggles.values()})
    deltas = []
    for c in levels:
        on, off = toggles[f"c={c}, -v 1 (INFO line per job)"], toggles[f"c={c}, -v 0 (WARNING)"]
        deltas.append(
            f"c={c}: {on['cpu_us_per_job'] - off['cpu_us_per_job']:+.0f} µs "
            f"({on['cpu_us_per_job']:.0f} vs {off['cpu_us_per_job']:.0f})"
        )
    lines += ["", "CPU per job of the INFO line (-v 1 minus -v 0): " + "; ".join(deltas)]
    # CPU per job against jobs per claim at concurrency 8: cpu = per_job + per_turn / k.
    points = [
        (1 / t["jobs_per_claim"], t["cpu_us_per_job"])
        for t in toggles.values()
        if t["concurrency"] == 8 and t["verbosity"] == 0
    ]
    if len(points) >= 2:
        mx = sum(x for x, _ in points) / len(points)
        my = sum(y for _, y in points) / len(points)
        sxx = sum((x - mx) ** 2 for x, _ in points)
        per_turn = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")
        per_job = my - per_turn * mx
        figures["fit_c8_v0"] = {"per_job_us": per_job, "per_turn_us": per_turn}
        lines.append(
            f"CPU per job at c=8, -v 0, fitted to k jobs per claim ({len(points)} points): "
            f"{per_job:.0f} µs + {per_turn:.0f} µs / k (a turn: one claim+record statement, "
            "its commit, the wake-ups around it)"
        )
    if not profiled:
        lines += ["", "py-spy is not installed (pip install -e '.[dev]'): no profile taken."]
        return "\n".join(lines)
    profiles = figures["profiles"]
    names = [name for name, _ in BUCKETS] + [OTHER, BLOCKED]
    cpu = {c: toggles[f"c={c}, -v 1 (INFO line per job)"]["cpu_us_per_job"] for c in profiles}
    rows = []
    for name in names:
        row: list[Any] = [name]
        for c, found in profiles.items():
            n = found["buckets"].get(name, 0)
            running = max(found["samples"] - found["buckets"].get(BLOCKED, 0), 1)
            row += [
                f"{n / max(found['samples'], 1) * 100:.1f}%",
                "-" if name == BLOCKED else n / running * cpu[c],
            ]
        rows.append(row)
    rows.append(["total (worker CPU per job, -v 1)", *[x for c in profiles for x in ("", cpu[c])]])
    headers = ["bucket (profile at -v 1)"]
    for c in profiles:
        headers += [f"c={c} samples", f"c={c} CPU µs/job"]
    lines += ["", table(headers, rows)]
    for c, found in profiles.items():
        wall = toggles[f"c={c}, -v 1 (INFO line per job)"]["wall_us_per_job"]
        threads = ", ".join(
            f"{k} {v / max(found['samples'], 1) * 100:.0f}%"
            for k, v in sorted(found["threads"].items(), key=lambda kv: -kv[1])
        )
        lines += [
            "",
            f"c={c}: {found['samples']} steady samples ({found['skipped_startup_shutdown']} left "
            "out: start-up, shutdown, no Python frame), "
            f"{found['profiled_jobs_per_s']:,.0f} jobs/s under the profiler, samples/rate = "
            f"{found['sampled_cpu_us_per_job']:,.0f} µs/job;",
            f"  CPU by thread: {threads}; wall {wall:,.0f} µs/job, of which "
            f"{max(wall - cpu[c], 0):,.0f} off the worker's CPU (database, commit, machine load)",
            f"folded stacks: {found['folded']} (on-CPU), {found['wall_folded']} (--idle)",
            "the loop thread's wall time (--idle profile, "
            f"{found['loop_wall_us_per_job']:,.0f} µs/job under the profiler):",
        ]
        loop_total = max(sum(found["loop_wall"].values()), 1)
        for what, n in sorted(found["loop_wall"].items(), key=lambda kv: -kv[1]):
            per_job = n / loop_total * found["loop_wall_us_per_job"]
            lines.append(f"  {n / loop_total * 100:5.1f}%  {per_job:7,.0f} µs/job  {what}")
        lines.append("top by own time (on-CPU samples):")
        share = max(found["samples"], 1) / 100
        lines += [f"  {n / share:5.1f}%  {entry}" for entry, n in found["own"][:12]]
        lines.append("top by cumulative time (pgqueue and library frames):")
        shown = 0
        for entry, n in found["cumulative"]:
            if entry.startswith(("<module>", "execute_from_command_line", "ManagementUtility")):
                continue
            if entry.startswith(("BaseCommand", "Command.handle", "Thread.")):
                continue
            lines.append(f"  {n / max(found['samples'], 1) * 100:5.1f}%  {entry}")
            shown += 1
            if shown == 12:
                break
    return "\n".join(lines)


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
