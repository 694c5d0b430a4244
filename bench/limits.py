"""Caps and rate limits: exact caps, what they cost everyone else, a rate limit's starts.

- Exactness: three tenants capped at 2, 3 and 5 and two uncapped ones, 5 ms jobs
  (bench.sleep_ms), `manage.py runworker --processes 2 --concurrency 8` (16 threads, more
  than the caps together, so the caps bind). Each capped tenant's highest concurrency is
  computed afterwards from its attempts' [claimed_at, finished_at] intervals (from the
  claim to the handler's end: within the lease the cap counts) by a sweep line (a finish
  at the same instant as a start counts first), and, as a second measure, sampled while it
  runs: its jobs in status 'running' in one snapshot, every 10 ms.
- Cost: no-op jobs of 100 tenants, equal shares, one `runworker --burst --concurrency 8`
  per run; with 10 of the tenants capped at 2 (their jobs 10% of all: 20 capped slots for
  8 threads, so the caps are never the bottleneck) against no limit at all, alternated
  (none, caps, none, caps, ...), medians; jobs/s = jobs / (last finish - first start).
  The same difference measured where the burst's noise cannot reach it: a worker's
  steady-state turn (record 40 successes and claim 40) on one fixed state, without limits
  and with the caps, interleaved run by run, rolled back each time (statement_cost); and
  the share of a drain's turns that started capped jobs (each claim leases its jobs at
  one instant: its distinct claimed_at).
  Then a huge backlog: one tenant at its cap (cap 1, its one running job a long sleep held
  by a worker of another queue) with N jobs queued behind the cap (one INSERT ... SELECT
  generate_series, gated), while 99 tenants' no-op jobs drain, against the same with
  nothing queued behind the cap; alternated, medians.
- Rate limit: one tenant limited to "50/s" with a 5,000-job no-op backlog, one worker of 8
  threads for 10 s (quick: "20/s", 500 jobs, 5 s); claims (what the limit governs: a
  claimed job starts at most PREFETCH_HOLD_SECONDS later) from the attempts' claimed_at:
  per second, per 100 ms (the chart), and the most in any 1 s sliding window, against
  N + burst (burst = max(1, ceil(N / 10)), the bucket full when the limit is set).

    BENCH_DB=pgq_limitsbench python scripts/with_db.py -- python -m bench.limits [--quick]
"""

from __future__ import annotations

import bisect
import math
import time
from pathlib import Path
from typing import Any, NamedTuple

from bench.common import median, query, reset_tables, scalar, table
from bench.harness import run_burst, running_worker, start_worker, wait_for

CAPS = {"capped2": 2, "capped3": 3, "capped5": 5}
FREE = ("free0", "free1")
TENANTS = 100
CAPPED_TENANTS = 10
COST_CAP = 2
IDLE_CAPPED = 1_000  # tenants capped at COST_CAP with nothing queued (the "idle" variant)
TURN_JOBS = 40  # jobs one turn of a no-op worker records and claims (8 threads + PREFETCH 32)
BACKLOG = "backlog"
HOLD_QUEUE = "hold"


def _enqueue(task: str, jobs: dict[str, int], payload: Any = None) -> None:
    import pgqueue

    for tenant, count in jobs.items():
        for start in range(0, count, 1000):
            n = min(1000, count - start)
            pgqueue.enqueue_many(task, [payload] * n, tenant=tenant)


def _set_caps(caps: dict[str, int]) -> None:
    from pgqueue import limits

    for tenant, cap in caps.items():
        limits.set_tenant_limits(tenant, max_running=cap)


def _vacuum() -> None:
    query("VACUUM ANALYZE pgqueue_job, pgqueue_limit")


def _epochs(sql: str, params: Any = None) -> list[tuple[float, ...]]:
    return [tuple(float(v) for v in row) for row in query(sql, params)]


def sweep_max(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at once; an interval ending where another starts does not
    overlap it (the slot was given back, then taken)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(f, -1) for _, f in intervals])
    best = now = 0
    for _, step in events:  # at equal times -1 sorts before +1
        now += step
        best = max(best, now)
    return best


def max_in_window(starts: list[float], width: float) -> int:
    """The most of ``starts`` (sorted) in any half-open window [t, t + width)."""
    return max((bisect.bisect_left(starts, s + width) - i for i, s in enumerate(starts)), default=0)


# -- exactness ----------------------------------------------------------------------------


def exactness_run(per_tenant: int) -> dict[str, Any]:
    reset_tables()
    _set_caps(CAPS)
    _enqueue("bench.sleep_ms", dict.fromkeys([*CAPS, *FREE], per_tenant), {"ms": 5})
    _vacuum()
    sampled = dict.fromkeys(CAPS, 0)
    samples = 0

    def drained() -> bool:
        nonlocal samples
        rows = query(
            "SELECT tenant, count(*) FILTER (WHERE status = 'running'), "
            "count(*) FILTER (WHERE status NOT IN ('done', 'dead', 'cancelled')) "
            "FROM pgqueue_job GROUP BY tenant"
        )
        samples += 1
        for tenant, running, _ in rows:
            if tenant in sampled:
                sampled[tenant] = max(sampled[tenant], running)
        return all(left == 0 for _, _, left in rows)

    started = time.monotonic()
    with running_worker(8, 2):
        wait_for(drained, 600, "the capped tenants' jobs", poll=0.01)
    elapsed = time.monotonic() - started
    result: dict[str, Any] = {"samples": samples, "seconds": round(elapsed, 2)}
    for tenant, cap in CAPS.items():
        intervals = _epochs(
            "SELECT extract(epoch FROM a.claimed_at), extract(epoch FROM a.finished_at) "
            "FROM pgqueue_job_attempt a JOIN pgqueue_job j ON j.id = a.job_id "
            "WHERE j.tenant = %s",
            [tenant],
        )
        result[tenant] = {
            "cap": cap,
            "attempts": len(intervals),
            "max_concurrent": sweep_max(intervals),  # type: ignore[arg-type]
            "max_sampled": sampled[tenant],
        }
    return result


# -- cost ---------------------------------------------------------------------------------


def _drain_rate(exclude: str | None = None) -> float:
    """jobs/s of the burst just run over the done jobs (all but ``exclude``'s)."""
    ((done, seconds),) = query(
        "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) "
        "FROM pgqueue_job WHERE status = 'done' AND tenant <> %s",
        [exclude or ""],
    )
    return done / float(seconds)


class Drain(NamedTuple):
    """One cost run: its jobs/s, and how many claim statements started its jobs (``turns``)
    and how many of those started a capped tenant's job (``capped_turns``), counted from
    the jobs' claim times: each statement leases its jobs at one instant of its own."""

    rate: float
    turns: int
    capped_turns: int


def cost_run(variant: str, jobs: int, processes: int = 1) -> Drain:
    """``jobs`` no-op jobs of TENANTS tenants, drained by one runworker --burst of
    concurrency 8 in all (``processes`` processes of 8 / processes threads). ``variant``:
    "none" (no limit), "caps" (CAPPED_TENANTS of them capped at COST_CAP) or "idle" (the
    same, and IDLE_CAPPED more tenants capped at COST_CAP with nothing queued)."""
    reset_tables()
    names = [f"t{i:02}" for i in range(TENANTS)]
    if variant == "idle":
        _set_caps({f"idle{i:04}": COST_CAP for i in range(IDLE_CAPPED)})
    if variant != "none":
        _set_caps(dict.fromkeys(names[:CAPPED_TENANTS], COST_CAP))
    _enqueue("bench.noop", dict.fromkeys(names, jobs // TENANTS))
    _vacuum()
    run_burst(8 // processes, processes)
    left = scalar("SELECT count(*) FROM pgqueue_job WHERE status <> 'done'")
    if left:
        raise SystemExit(f"{left} jobs not done after the burst")
    ((turns, capped_turns),) = query(
        "SELECT count(DISTINCT claimed_at), "
        "count(DISTINCT claimed_at) FILTER (WHERE tenant = ANY(%s)) FROM pgqueue_job",
        [names[:CAPPED_TENANTS]],
    )
    return Drain(_drain_rate(), turns, capped_turns)


def cost_pairs(
    pairs: int, jobs: int, processes: int = 1, variants: tuple[str, ...] = ("none", "caps")
) -> dict[str, list[Drain]]:
    """``pairs`` rounds of alternated cost runs (each of ``variants`` in turn, see cost_run)
    at ``processes``."""
    label = "" if processes == 1 else f"{processes} processes, "
    runs: dict[str, list[Drain]] = {variant: [] for variant in variants}
    for _ in range(pairs):
        for variant in variants:
            runs[variant].append(drain := cost_run(variant, jobs, processes))
            print(
                f"   cost, {label}{variant}: {drain.rate:,.0f} jobs/s, {drain.turns} turns, "
                f"{drain.capped_turns} starting capped jobs",
                flush=True,
            )
    return runs


def _rates(runs: dict[str, list[Drain]]) -> dict[str, list[float]]:
    return {variant: [d.rate for d in drains] for variant, drains in runs.items()}


def _round_ratios(
    rates: dict[str, list[float]], over: str = "none", of: str = "caps"
) -> list[float]:
    """Each round's ratio, ``of`` / ``over`` (caps / no limits): the two runs of a round are
    seconds apart, so each ratio is less exposed to the host's drift than the ratio of the
    medians."""
    return [c / n for n, c in zip(rates[over], rates[of], strict=True)]


def _each_pair(rates: dict[str, list[float]], over: str = "none", of: str = "caps") -> str:
    """The report's line of each round's ratio, ``of`` / ``over`` (caps / no limits)."""
    ratios = _round_ratios(rates, over, of)
    names = {"none": "no limits", "caps": "caps", "idle": "caps and idle capped tenants"}
    each = " ".join(f"{r:.2f}" for r in ratios)
    return f"\neach round, {names[of]} / {names[over]}: {each} (median {median(ratios):.2f})"


def statement_cost(runs: int, jobs: int = TURN_JOBS) -> dict[str, float]:
    """Median µs of a worker's steady-state turn (record ``jobs`` successes and claim
    ``jobs``: TURN_PLAN, LIMIT_LOCK_TURN, JOB_COMPLETE_MANY, JOB_CLAIM, prepared, one after
    another in one transaction) on one fixed state, rolled back each run, "plain" and
    "limited" interleaved run by run, so that the machine's drift falls on both alike.
    Queue OTHER has no limit; queue 'default' has the cost mix, 10 of its 100 tenants
    capped at 2 (as (queue, tenant) caps, so that OTHER stays unlimited), each state reached
    after 60 committed turns of a worker of its own (capped and uncapped jobs running, and
    given back by the turn, as in a drain)."""
    import psycopg

    import pgqueue
    from pgqueue import claim_store, limits, sql
    from pgqueue.worker.connection import connect_params

    other = "other"
    reset_tables()
    names = [f"t{i:02}" for i in range(TENANTS)]
    for tenant in names[:CAPPED_TENANTS]:
        limits.set_tenant_limits(tenant, queue="default", max_running=COST_CAP)
    for queue in ("default", other):
        for tenant in names:
            pgqueue.enqueue_many("bench.noop", [None] * 200, tenant=tenant, queue=queue)
    _vacuum()
    statements = claim_store.STATEMENTS
    with psycopg.connect(**connect_params("default"), autocommit=True) as conn:
        turns: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for name, queue in (("plain", other), ("limited", "default")):
            worker = f"cost-{name}"
            held: list[Any] = []
            for _ in range(61):
                done = [claim_store.Success(j.id, j.attempt, None) for j in held]
                held = claim_store.turn(
                    conn, worker=worker, queues=[queue], limit=jobs, successes=done
                ).jobs
            assert len(held) == jobs
            done = [claim_store.Success(j.id, j.attempt, None) for j in held]
            params = {"queues": [queue], "limit": jobs, "worker": worker, "lease": 60.0}
            params.update(now=None, ids=[j.id for j in held if j.limit_ids])
            turns[name] = [
                (statements["TURN_PLAN"], {}),
                (statements["LIMIT_LOCK_TURN"], params),
                (sql.JOB_COMPLETE_MANY, {**params, **claim_store.complete_params(done)}),
                (statements["JOB_CLAIM"], params),
            ]
        times: dict[str, list[float]] = {name: [] for name in turns}
        for _ in range(runs):
            for name, steps in turns.items():
                conn.pgconn.exec_(b"BEGIN")  # not conn.execute: a rollback through psycopg
                started = time.perf_counter()  # forgets the prepared statements
                for text, args in steps:
                    with conn.cursor() as cur:
                        cur.execute(text, args, prepare=True)
                        cur.fetchall()
                times[name].append(time.perf_counter() - started)
                conn.pgconn.exec_(b"ROLLBACK")
    return {name: median(t) * 1e6 for name, t in times.items()}


def insert_backlog(rows: int) -> float:
    """``rows`` queued, gated no-op jobs of BACKLOG in the default queue, in claim order, by
    one INSERT ... SELECT; seconds taken (VACUUM ANALYZE included)."""
    started = time.monotonic()
    query(
        """
        INSERT INTO pgqueue_job (queue, tenant, task, payload, status, priority, vtime,
                                 attempts, max_attempts, gated)
        SELECT 'default', %(tenant)s, 'bench.noop', '{}'::jsonb, 'queued', 0, g::float8,
               0, 5, TRUE
          FROM generate_series(1, %(rows)s) g
        """,
        {"tenant": BACKLOG, "rows": rows},
    )
    _vacuum()
    return time.monotonic() - started


def backlog_run(backlog: int, jobs: int) -> dict[str, Any]:
    """99 tenants' no-op jobs drained by a burst while BACKLOG, capped at 1, runs one long
    job (held by a worker of HOLD_QUEUE, killed afterwards) with ``backlog`` jobs behind."""
    import pgqueue

    reset_tables()
    _set_caps({BACKLOG: 1})
    pgqueue.enqueue("bench.sleep_ms", {"ms": 600_000}, tenant=BACKLOG, queue=HOLD_QUEUE)
    holder = start_worker(["--queues", HOLD_QUEUE, "--concurrency", "1", "--prefetch", "0"])
    try:
        wait_for(
            lambda: (
                not holder.alive()
                or scalar("SELECT count(*) FROM pgqueue_job WHERE status = 'running'")
            ),
            30,
            "the backlog tenant's long job to start",
        )
        if not holder.alive():
            raise RuntimeError("the holding worker exited: " + holder.log_tail())
        insert_s = insert_backlog(backlog) if backlog else 0.0
        _enqueue("bench.noop", {f"o{i:02}": jobs // (TENANTS - 1) for i in range(TENANTS - 1)})
        _vacuum()
        run_burst(8)
        rate = _drain_rate(exclude=BACKLOG)
        ((left, queued),) = query(
            "SELECT count(*) FILTER (WHERE status <> 'done' AND tenant <> %(t)s), "
            "count(*) FILTER (WHERE status = 'queued' AND tenant = %(t)s) FROM pgqueue_job",
            {"t": BACKLOG},
        )
    finally:
        holder.kill()
    if left:
        raise SystemExit(f"{left} jobs not done after the burst")
    if queued != backlog:
        raise SystemExit(f"the capped backlog ran: {queued} of {backlog} left")
    return {"jobs_per_s": rate, "insert_s": round(insert_s, 1)}


# -- rate limit ---------------------------------------------------------------------------


def rate_run(count: int, jobs: int, seconds: float) -> dict[str, Any]:
    reset_tables()
    from pgqueue import limits

    limits.set_tenant_limits("rated", rate_limit=f"{count}/s")
    _enqueue("bench.noop", {"rated": jobs})
    _vacuum()
    with running_worker(8):
        time.sleep(seconds)  # the measurement window itself, not a wait for something
    starts = sorted(
        s
        for (s,) in _epochs(
            "SELECT extract(epoch FROM claimed_at) FROM pgqueue_job_attempt "
            "WHERE claimed_at IS NOT NULL"
        )
    )
    burst = max(1, math.ceil(count / 10))
    first = starts[0] if starts else 0.0
    rel = [s - first for s in starts]
    whole = int(rel[-1]) if rel else 0  # full seconds from the first start
    per_second = [sum(1 for r in rel if k <= r < k + 1) for k in range(whole)]
    buckets = [0] * (int(rel[-1] * 10) + 1 if rel else 0)
    for r in rel:
        buckets[int(r * 10)] += 1
    steady = sum(1 for r in rel if 1 <= r < whole) / (whole - 1) if whole > 1 else float("nan")
    return {
        "rate": f"{count}/s",
        "burst": burst,
        "bound": count + burst,
        "starts": len(starts),
        "per_second": per_second,
        "per_100ms": buckets,
        "max_1s_window": max_in_window(starts, 1.0),
        "steady_per_s": steady,
    }


def chart(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buckets = r["per_100ms"]
    xs = [i / 10 for i in range(len(buckets))]
    window = [sum(buckets[max(0, i - 9) : i + 1]) for i in range(len(buckets))]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    ax.bar(xs, buckets, width=0.09, align="edge", color="tab:blue", label="starts per 100 ms")
    ax.set_xlabel("seconds since the first start")
    ax.set_ylabel("starts per 100 ms")
    ax.grid(True, alpha=0.3)
    right = ax.twinx()
    right.plot([x + 0.1 for x in xs], window, color="tab:red", label="claims in the last 1 s")
    count = int(r["rate"].split("/")[0])
    right.axhline(count, color="grey", linestyle=":", linewidth=1, label=f"limit {r['rate']}")
    right.axhline(r["bound"], color="tab:red", linestyle="--", linewidth=1, label="limit + burst")
    right.set_ylabel("starts in the last second")
    right.set_ylim(0, r["bound"] * 1.3)
    lines, labels = ax.get_legend_handles_labels()
    more, more_labels = right.get_legend_handles_labels()
    ax.legend(lines + more, labels + more_labels, fontsize=8, loc="lower right")
    ax.set_title(f"Rate limit {r['rate']}: claims of one tenant's backlog, 8 threads")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# -- the section --------------------------------------------------------------------------


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    exact_jobs, exact_runs = (300, 2) if quick else (2_000, 3)
    cost_jobs, pairs = (5_000, 3) if quick else (20_000, 9)
    statement_runs = 200 if quick else 1_000
    pairs2 = 1 if quick else 5
    backlog = 50_000 if quick else 1_000_000
    rate_count, rate_jobs, rate_s = (20, 500, 5.0) if quick else (50, 5_000, 10.0)

    exact = []
    for n in range(exact_runs):
        exact.append(r := exactness_run(exact_jobs))
        print(
            f"   exactness run {n + 1}: "
            + ", ".join(
                f"{t} max {r[t]['max_concurrent']} (sampled {r[t]['max_sampled']}) of cap {c}"
                for t, c in CAPS.items()
            ),
            flush=True,
        )

    drains = cost_pairs(pairs, cost_jobs, variants=("none", "caps", "idle"))
    rates = _rates(drains)
    cost_ratio = median(rates["caps"]) / median(rates["none"])
    round_ratio = median(_round_ratios(rates))  # each round's two runs are seconds apart
    turn = statement_cost(statement_runs)
    capped_turns = median([d.capped_turns for d in drains["caps"]])
    turns = median([d.turns for d in drains["caps"]])
    print(
        f"   turn: plain {turn['plain']:,.0f} us, limited {turn['limited']:,.0f} us",
        flush=True,
    )
    idle_ratio = median(rates["idle"]) / median(rates["caps"])
    # The same mix with two worker processes, whose claims meet each other's locks.
    rates2 = _rates(cost_pairs(pairs2, cost_jobs, processes=2))
    cost_ratio2 = median(rates2["caps"]) / median(rates2["none"])

    held: dict[str, list[dict[str, Any]]] = {"empty": [], "backlog": []}
    for _ in range(2):
        for variant, n in (("empty", 0), ("backlog", backlog)):
            held[variant].append(r := backlog_run(n, cost_jobs))
            print(
                f"   backlog {n:,}: {r['jobs_per_s']:,.0f} jobs/s (insert {r['insert_s']} s)",
                flush=True,
            )
    held_rates = {k: median([r["jobs_per_s"] for r in v]) for k, v in held.items()}
    backlog_ratio = held_rates["backlog"] / held_rates["empty"]

    rated = rate_run(rate_count, rate_jobs, rate_s)
    print(
        f"   rate {rated['rate']}: {rated['starts']} claims, max {rated['max_1s_window']} in"
        f" a 1 s window (bound {rated['bound']})",
        flush=True,
    )
    path = out_dir / ("limits-rate-quick.png" if quick else "limits-rate.png")
    chart(rated, path)

    rows = []
    for n, r in enumerate(exact, 1):
        for t, cap in CAPS.items():
            rows.append([n, t, cap, r[t]["max_concurrent"], r[t]["max_sampled"], r[t]["attempts"]])
    exact_ok = all(r[t]["max_concurrent"] <= c for r in exact for t, c in CAPS.items())
    report = "Exactness (2 processes x 8 threads, 5 ms jobs):\n" + table(
        ["run", "tenant", "cap", "max from history", "max sampled", "attempts"], rows
    )
    report += f"\ncaps never exceeded (history): {'yes' if exact_ok else 'NO'}"
    report += "\n\nCost (no-op jobs, runworker --burst, concurrency 8):\n" + table(
        ["case", "jobs/s (median)", "runs"],
        [
            ["no limits", median(rates["none"]), " ".join(f"{x:,.0f}" for x in rates["none"])],
            [
                f"{CAPPED_TENANTS} of {TENANTS} tenants capped at {COST_CAP}",
                median(rates["caps"]),
                " ".join(f"{x:,.0f}" for x in rates["caps"]),
            ],
            [
                f"the same and {IDLE_CAPPED:,} more capped, nothing queued",
                median(rates["idle"]),
                " ".join(f"{x:,.0f}" for x in rates["idle"]),
            ],
            [
                "1 tenant at cap 1, nothing behind",
                held_rates["empty"],
                " ".join(f"{r['jobs_per_s']:,.0f}" for r in held["empty"]),
            ],
            [
                f"1 tenant at cap 1, {backlog:,} behind",
                held_rates["backlog"],
                " ".join(f"{r['jobs_per_s']:,.0f}" for r in held["backlog"]),
            ],
        ],
    )
    report += _each_pair(rates) + _each_pair(rates, "caps", "idle")
    report += (
        f"\ncaps / no limits: {cost_ratio:.2f}, the rounds' median {round_ratio:.2f}; "
        f"{backlog:,}-job backlog / none: {backlog_ratio:.2f}; "
        f"{IDLE_CAPPED:,} idle capped tenants / caps alone: {idle_ratio:.2f}"
    )
    report += (
        f"\na turn alone (record {TURN_JOBS} successes and claim {TURN_JOBS}, fixed state, "
        f"{statement_runs:,} interleaved runs, medians): plain {turn['plain']:,.0f} us, "
        f"limited {turn['limited']:,.0f} us ({turn['limited'] / turn['plain'] - 1:+.0%}); "
        f"in the drains with caps, {capped_turns:,.0f} of {turns:,.0f} turns started capped "
        "jobs (medians)"
    )
    report += "\n\nCost with 2 processes x 4 threads (the same mix):\n" + table(
        ["case", "jobs/s (median)", "runs"],
        [
            [name, median(rates2[key]), " ".join(f"{x:,.0f}" for x in rates2[key])]
            for name, key in (
                ("no limits", "none"),
                (f"{CAPPED_TENANTS} of {TENANTS} tenants capped at {COST_CAP}", "caps"),
            )
        ],
    )
    report += _each_pair(rates2)
    report += f"\ncaps / no limits, 2 processes: {cost_ratio2:.2f}"
    report += (
        f"\n\nRate limit {rated['rate']} ({rate_jobs:,} no-op jobs, 1 worker x 8 threads, "
        f"{rate_s:.0f} s): {rated['starts']} claims; per second: "
        + " ".join(str(c) for c in rated["per_second"])
        + f"\nsteady rate after the first second: {rated['steady_per_s']:.1f}/s; most in any "
        f"1 s window: {rated['max_1s_window']} (bound N + burst = {rated['bound']}: "
        f"{'met' if rated['max_1s_window'] <= rated['bound'] else 'NOT met'})"
    )
    method = (
        f"Exactness: {exact_jobs:,} jobs of 5 ms for each of 3 capped tenants (caps "
        f"{', '.join(map(str, CAPS.values()))}) and 2 uncapped ones, runworker --processes 2 "
        f"--concurrency 8, {exact_runs} runs; max from history = sweep line over the "
        "attempts' [claimed_at, finished_at] (the claim's time once it holds its limit "
        "rows, the handler's end: within the lease the cap counts), max sampled = its "
        "'running' jobs in one snapshot, every 10 ms. Cost: "
        f"{cost_jobs:,} no-op jobs of {TENANTS} tenants in equal shares, one runworker --burst "
        f"--concurrency 8 per run, {CAPPED_TENANTS} tenants (10% of the jobs) capped at "
        f"{COST_CAP} against none, and the same with {IDLE_CAPPED:,} more tenants capped at "
        f"{COST_CAP} that have nothing queued, {pairs} alternated rounds (none, caps, idle), "
        "medians, jobs/s = jobs / (last finish - first start); the turn: a worker's "
        f"steady-state turn (record {TURN_JOBS} successes, claim {TURN_JOBS}: TURN_PLAN, "
        "LIMIT_LOCK_TURN, JOB_COMPLETE_MANY, JOB_CLAIM) on one fixed state of the same mix "
        "after 60 turns, prepared, rolled back each time, plain and limited interleaved, "
        f"{statement_runs:,} runs each, medians; the same with "
        f"runworker "
        "--processes 2 --concurrency 4, "
        f"{pairs2} alternated pairs; backlog: {cost_jobs:,} no-op jobs of {TENANTS - 1} tenants "
        f"while one tenant capped at 1 runs a long job (a worker of another queue holds it) "
        f"with {backlog:,} gated jobs queued behind its cap (INSERT ... SELECT "
        "generate_series), against nothing behind it, 2 alternated pairs, medians. Rate: "
        f"one tenant limited to {rated['rate']}, {rate_jobs:,} no-op jobs, one runworker "
        f"--concurrency 8 for {rate_s:.0f} s; claims from the attempts' claimed_at."
    )
    return {
        "title": "Caps and rate limits",
        "method": method,
        "report": report,
        "figures": {
            "exactness": exact,
            "caps_never_exceeded": exact_ok,
            "cost_jobs_per_s": rates,
            "cost_ratio": cost_ratio,
            "cost_ratio_rounds_median": round_ratio,
            "turn_us": turn,
            "cost_turns": {v: [[d.turns, d.capped_turns] for d in ds] for v, ds in drains.items()},
            "idle_capped_ratio": idle_ratio,
            "cost_jobs_per_s_2_processes": rates2,
            "cost_ratio_2_processes": cost_ratio2,
            "backlog": backlog,
            "backlog_runs": held,
            "backlog_ratio": backlog_ratio,
            "rate": rated,
        },
        "charts": [str(path)],
    }


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
