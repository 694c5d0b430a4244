"""``manage.py pgqueue healthcheck``: liveness and readiness of real worker processes.

The workers are real ``runworker`` subprocesses (tests/workers.py), or a ``WorkerLoop``
running on a thread of this process where the test must reach inside it. Each test gives
the workers and the probe a health directory of its own (``HEALTH_DIR`` under tmp_path), so
that no other worker of this machine counts, and a short ``HEALTH_STALL_SECONDS`` for the
probe. The probe runs in this process through ``call_command`` (its output and exit code),
and as a real ``python manage.py`` process where only a process shows it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
import yaml
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

import pgqueue
from pgqueue.management.commands import pgqueue as pgqueue_command
from pgqueue.worker import WorkerLoop
from pgqueue.worker.connection import connect
from pgqueue.worker.health import read_records
from tests.test_checks import manage
from tests.test_worker_startup import closed_port_url
from tests.workers import REPO, STARTUP, StartWorker, WorkerProcess, database_url, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: The probe's stall bound in these tests: a loop that turns every POLL (below) and writes
#: at most once a second is well inside it; a frozen one is caught within seconds.
STALL = 3.0
#: The workers' idle poll: an idle loop turns at least this often.
POLL = {"POLL_SECONDS": 0.2}


def probe(directory: Path, *args: str, stall: float = STALL) -> tuple[int, str, str]:
    """``manage.py pgqueue healthcheck *args`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    settings = {"HEALTH_DIR": str(directory), "HEALTH_STALL_SECONDS": stall}
    with override_settings(PGQUEUE=settings):
        try:
            call_command("pgqueue", "healthcheck", *args, stdout=out, stderr=err)
        except SystemExit as exc:
            return int(exc.code), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def probe_json(directory: Path, *args: str, stall: float = STALL) -> tuple[int, dict[str, Any]]:
    code, out, _ = probe(directory, *args, "--json", stall=stall)
    return code, json.loads(out)


def failure(directory: Path, *args: str) -> str:
    """The probe's stderr if it fails (exit 1), else "": what a test waits for."""
    code, _, err = probe(directory, *args)
    return err if code == 1 else ""


def failed_json(directory: Path, *args: str) -> dict[str, Any] | None:
    """The probe's --json document if it fails (exit 1), else None."""
    code, document = probe_json(directory, *args)
    return document if code == 1 else None


def running(directory: Path, pid: int) -> Any:
    """The health record of ``pid`` once its loop is connected and has reached the
    database (state running, a database round trip recorded); else None."""
    for record in read_records(directory):
        if record.pid == pid and record.state == "running" and record.db_at is not None:
            return record
    return None


def start(workers: StartWorker, directory: Path, *args: str, **settings: Any) -> WorkerProcess:
    """A worker writing its health file in ``directory``, once that file says running."""
    w = workers(*args, settings={"HEALTH_DIR": str(directory), **POLL, **settings})
    wait_for(lambda: running(directory, w.pid), STARTUP, f"{w.name}'s health file")
    return w


def stop(w: WorkerProcess) -> None:
    w.send(signal.SIGTERM)
    assert w.wait_exit(STARTUP) == 0


# -- a healthy worker, none, a clean stop -------------------------------------------------------


def test_a_running_worker_is_live_and_ready_and_its_clean_stop_removes_its_file(
    workers: StartWorker, tmp_path: Path
) -> None:
    """One line per process and a verdict; --json; --pid and --worker select one worker;
    after SIGTERM the file is gone and liveness fails: no worker is left."""
    w = start(workers, tmp_path)
    worker_id = w.registered()

    code, out, err = probe(tmp_path)
    assert (code, err) == (0, ""), out
    lines = out.splitlines()
    assert len(lines) == 3, out  # the header, one process, the verdict
    assert lines[1].split()[:5] == ["ok", "worker", str(w.pid), worker_id, "running"]
    assert lines[2] == f"liveness: ok (1 process on {socket.gethostname()})"

    code, out, err = probe(tmp_path, "--readiness")
    assert (code, err) == (0, ""), out
    assert "database: reachable" in out and "readiness: ok (1 process" in out

    code, document = probe_json(tmp_path, "--readiness")
    assert code == 0 and document["healthy"] and document["reason"] is None
    assert document["database"] == {"reachable": True, "error": None}
    (process,) = document["processes"]
    assert (process["pid"], process["worker"], process["role"]) == (w.pid, worker_id, "worker")
    assert process["state"] == "running" and process["healthy"]
    assert process["loop_age_seconds"] <= STALL
    assert process["db_age_seconds"] <= process["lease_seconds"]

    assert probe(tmp_path, "--pid", str(w.pid))[0] == 0
    assert probe(tmp_path, "--worker", worker_id, "--readiness")[0] == 0
    code, _, err = probe(tmp_path, "--worker", "elsewhere:1:abc")
    assert code == 1
    assert "no live worker process with worker id elsewhere:1:abc has a health file" in err

    stop(w)
    assert read_records(tmp_path) == []
    code, out, err = probe(tmp_path)
    assert (code, out) == (1, "")
    assert err.startswith("pgqueue healthcheck: liveness failed: no live worker process has")


def test_no_worker_fails_both_checks(tmp_path: Path) -> None:
    assert probe(tmp_path)[0] == 1
    code, document = probe_json(tmp_path / "never-made", "--readiness")
    assert code == 1 and not document["healthy"] and document["processes"] == []
    assert document["reason"].startswith("no live worker process has a health file")
    assert document["database"]["reachable"]


# -- a stuck loop, a long handler -------------------------------------------------------------


def test_a_long_handler_keeps_its_worker_live_and_a_frozen_worker_fails_liveness(
    workers: StartWorker, tmp_path: Path
) -> None:
    """Handlers run on threads of their own: a handler running longer than the stall bound
    leaves the loop turning, so liveness and readiness pass throughout. SIGSTOP freezes the
    whole process, a wedged worker: liveness fails within the stall bound (plus the
    probe's own rounds), and passes again after SIGCONT."""
    w = start(workers, tmp_path, "--concurrency", "1")
    release, started = tmp_path / "release", tmp_path / "started"
    pgqueue.enqueue(
        "test.block", {"release": str(release), "started": str(started), "timeout": 60}, tenant="a"
    )
    wait_for(lambda: Path(f"{started}.1").exists(), STARTUP, "the handler to start")
    began = time.monotonic()
    while time.monotonic() - began < 2 * STALL:  # the one thread is busy all along
        code, out, err = probe(tmp_path)
        assert code == 0, (out, err)
        time.sleep(0.2)
    assert probe(tmp_path, "--readiness")[0] == 0

    w.send(signal.SIGSTOP)
    try:
        err = wait_for(
            lambda: failure(tmp_path),
            STALL + 5,
            "liveness to fail once the worker is frozen",
        )
        assert f"liveness failed: worker pid {w.pid}: its loop has not turned for" in err
        assert "(HEALTH_STALL_SECONDS: 3; state running)" in err
    finally:
        w.send(signal.SIGCONT)
    wait_for(lambda: probe(tmp_path)[0] == 0, STALL + 5, "liveness once the worker runs again")

    release.touch()
    stop(w)


def test_a_loop_thread_stuck_on_a_lock_fails_liveness_while_its_other_threads_run(
    tmp_path: Path,
) -> None:
    """The loop's own thread marks its turns, not a timer: a loop blocked on a lock it takes
    at every turn (its wake-up event's, as in a deadlock) stops marking, though the process
    and its other threads (the listener's, say) run on. Liveness fails within the stall
    bound and passes again once the lock is free.

    Fails if a thread other than the loop's kept the file fresh."""
    settings = {"HEALTH_DIR": str(tmp_path), **POLL}
    with override_settings(PGQUEUE=settings):
        worker = WorkerLoop(queues=["health"], concurrency=1)
        thread = threading.Thread(target=worker.run, name="loop-under-test", daemon=True)
        thread.start()
    try:
        wait_for(lambda: running(tmp_path, os.getpid()), STARTUP, "the loop's health file")
        assert probe(tmp_path, "--readiness")[0] == 0

        with worker.wake_event._cond:  # taken by every turn (wake_event.clear / wait)
            err = wait_for(
                lambda: failure(tmp_path),
                STALL + 5,
                "liveness to fail while the loop is stuck",
            )
            assert thread.is_alive() and worker.listener.is_alive()
        assert f"worker pid {os.getpid()}: its loop has not turned for" in err
        wait_for(lambda: probe(tmp_path)[0] == 0, STALL + 5, "liveness once the loop turns")
    finally:
        worker.request_stop()
        thread.join(STARTUP)
    assert not thread.is_alive()
    assert read_records(tmp_path) == []  # run() returned: the file went with it


# -- the database away ----------------------------------------------------------------------


class Relay:
    """A TCP relay between a worker and PostgreSQL that the test can cut: every connection
    through it closed and new ones refused, as when the database server goes down, until
    it is restored on the same port."""

    def __init__(self, target: tuple[str, int] | str) -> None:
        """``target``: PostgreSQL's (host, port), or the path of its Unix socket."""
        self.target = target
        self.port = 0
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.restore()

    def restore(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and close those open (both ends). Idempotent."""
        # shutdown() first: close() alone leaves the port listening while the accepting
        # thread is blocked on it, and the next connection would still get through.
        for sock in [self.listener, *self.sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self.lock:
            self.sockets.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            if isinstance(self.target, str):
                server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                server.connect(self.target)
            else:
                server = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass

    def url(self) -> str:
        """The test database's URL, through this relay."""
        parts = urlsplit(database_url())
        auth = parts.netloc.rpartition("@")[0]
        netloc = f"{auth}@127.0.0.1:{self.port}" if auth else f"127.0.0.1:{self.port}"
        # A socket directory in the query (?host=/dir) would win over the netloc's host.
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "host"])
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def test_a_worker_that_cannot_reach_the_database_is_not_ready_but_stays_live(
    workers: StartWorker, tmp_path: Path
) -> None:
    """The database goes away for longer than the stall bound: the worker's heartbeats fail,
    so readiness fails once its last one is older than its lease, while liveness passes
    all along (the loop marks its turns as it waits to reconnect). When the database is
    back, the worker reconnects and readiness passes again.

    Fails if the waits between reconnection attempts do not mark the loop's turns
    (connection.connect_until_up's ``tick``): a back-off of seconds reads as stuck."""
    db = connections["default"].settings_dict
    port = int(db["PORT"] or 5432)
    host = db["HOST"] or "/var/run/postgresql"
    # Over TCP, or to the Unix socket of the embedded server: the worker reaches it over TCP.
    relay = Relay(os.path.join(host, f".s.PGSQL.{port}") if host.startswith("/") else (host, port))
    try:
        worker_away_from_the_database(workers, tmp_path, relay)
    finally:
        relay.cut()  # no session of the relay's left on the test database


def worker_away_from_the_database(workers: StartWorker, tmp_path: Path, relay: Relay) -> None:
    w = workers(settings={"HEALTH_DIR": str(tmp_path), "LEASE_SECONDS": 2, **POLL}, url=relay.url())
    wait_for(lambda: running(tmp_path, w.pid), STARTUP, "the worker's health file")
    assert probe(tmp_path, "--readiness")[0] == 0

    relay.cut()
    cut = time.monotonic()
    document = wait_for(
        lambda: failed_json(tmp_path, "--readiness"),
        10,
        "readiness to fail once the worker's heartbeats do",
    )
    (process,) = document["processes"]
    assert process["problem"].startswith("its last database heartbeat was")
    assert "longer than its lease (2s; state reconnecting)" in process["problem"]
    assert document["database"]["reachable"]  # the probe itself reaches the database
    while time.monotonic() - cut < STALL + 1.5:  # away for longer than the stall bound
        code, out, err = probe(tmp_path)
        assert code == 0, (out, err)
        time.sleep(0.2)

    relay.restore()
    wait_for(lambda: probe(tmp_path, "--readiness")[0] == 0, 20, "readiness once it is back")
    stop(w)


def test_the_probe_that_cannot_reach_the_database_fails_readiness_only(
    workers: StartWorker, tmp_path: Path
) -> None:
    """As a real process, with the database's address wrong for the probe alone (a healthy
    worker): readiness exits 1 saying why, liveness exits 0; a usage error exits 2."""
    w = start(workers, tmp_path)
    env = {
        "DATABASE_URL": closed_port_url(),
        "PGQUEUE_HEALTH_DIR": json.dumps(str(tmp_path)),
        "PGQUEUE_HEALTH_STALL_SECONDS": "10",
    }
    settings_module = "tests.worker_settings"
    ready = manage("pgqueue", "healthcheck", "--readiness", settings_module=settings_module, **env)
    assert ready.returncode == 1, ready
    assert "database: cannot be reached:" in ready.stdout
    assert "pgqueue healthcheck: readiness failed: cannot reach the database:" in ready.stderr
    live = manage("pgqueue", "healthcheck", settings_module=settings_module, **env)
    assert live.returncode == 0, live
    assert str(w.pid) in live.stdout and "liveness: ok (1 process" in live.stdout
    usage = manage(
        "pgqueue", "healthcheck", "--liveness", "--readiness", settings_module=settings_module
    )
    assert usage.returncode == 2 and "not allowed with argument" in usage.stderr
    stop(w)


# -- stale files, a supervisor ----------------------------------------------------------------


def test_the_file_of_a_killed_worker_is_stale_ignored_and_removed(
    workers: StartWorker, tmp_path: Path
) -> None:
    """SIGKILL leaves a worker no time to remove its file: the probe sees its pid gone,
    ignores the file (the other worker alone is judged) and removes it. A file whose pid
    now belongs to another process (here, the probe's own), which started later than the
    file says, is stale too."""
    kept, killed = start(workers, tmp_path), start(workers, tmp_path)
    killed_record = running(tmp_path, killed.pid)
    killed_file = killed_record.path
    killed.kill_group()
    assert killed_file.exists()

    code, document = probe_json(tmp_path)
    assert code == 0, document
    assert [p["pid"] for p in document["processes"]] == [kept.pid]
    assert document["stale"] == [
        {"pid": killed.pid, "role": "worker", "worker": killed_record.worker}
    ]
    assert not killed_file.exists()

    if not Path("/proc/self/stat").exists():
        pytest.skip("process start times come from /proc")
    reused = running(tmp_path, kept.pid)
    forged = json.loads(reused.path.read_text())
    forged.update(pid=os.getpid(), start=forged["start"] - 1)  # another process, long gone
    forged_path = tmp_path / f"worker-{os.getpid()}-forged.json"
    forged_path.write_text(json.dumps(forged))
    code, document = probe_json(tmp_path)
    assert code == 0 and [p["pid"] for p in document["stale"]] == [os.getpid()]
    assert not forged_path.exists()
    stop(kept)


def test_a_supervisor_and_its_children_each_have_a_file(
    workers: StartWorker, tmp_path: Path
) -> None:
    """``--processes 2``: the parent's file lists its two children, each with a file of its
    own; a frozen child fails liveness of the host but not ``--pid`` of the other; a
    graceful stop removes all three files."""
    parent = workers("--processes", "2", settings={"HEALTH_DIR": str(tmp_path), **POLL})

    def family() -> Any:
        records = read_records(tmp_path)
        supervisors = [r for r in records if r.role == "supervisor"]
        children = [r for r in records if r.role == "worker" and r.db_at is not None]
        if supervisors and len(supervisors[0].children) == 2 and len(children) == 2:
            return supervisors[0], children
        return None

    supervisor, children = wait_for(family, STARTUP, "the parent's and children's files")
    assert supervisor.pid == parent.pid
    assert sorted(supervisor.children) == sorted(c.pid for c in children)
    code, document = probe_json(tmp_path, "--readiness")
    assert code == 0, document
    assert sorted(p["role"] for p in document["processes"]) == ["supervisor", "worker", "worker"]

    frozen, other = children
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        err = wait_for(
            lambda: failure(tmp_path),
            STALL + 5,
            "liveness to fail with a frozen child",
        )
        assert f"worker pid {frozen.pid}: its loop has not turned" in err
        assert probe(tmp_path, "--pid", str(other.pid))[0] == 0
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    stop(parent)
    assert read_records(tmp_path) == []


# -- the loop's connection, the compose file ----------------------------------------------------


def test_the_loops_connection_gives_up_on_a_silent_server_within_a_third_of_the_stall() -> None:
    """TCP keepalives and tcp_user_timeout on the loop's connection, so that a server that
    vanished without closing it becomes a connection error (and a reconnection, turning)
    rather than a statement waiting for hours: the default stall of 60 s gives 10 s idle,
    3 probes 3 s apart, 20 s for data unacknowledged. A project's OPTIONS win."""
    with override_settings(PGQUEUE={}):
        loop = WorkerLoop(queues=["health"])
    db = connect(loop.params)
    try:
        given = db.info.get_parameters()
    finally:
        db.close()
        loop.executor.shutdown()
    assert {k: given.get(k) for k in ("keepalives_idle", "keepalives_interval",
                                      "keepalives_count", "tcp_user_timeout")} == {
        "keepalives_idle": "10", "keepalives_interval": "3", "keepalives_count": "3",
        "tcp_user_timeout": "20000"}  # fmt: skip

    settings_dict = connections["default"].settings_dict
    original = settings_dict["OPTIONS"]
    settings_dict["OPTIONS"] = {**original, "keepalives_idle": 42}
    try:
        with override_settings(PGQUEUE={}):
            loop = WorkerLoop(queues=["health"])
    finally:
        settings_dict["OPTIONS"] = original
    loop.executor.shutdown()
    assert loop.params["keepalives_idle"] == 42


def test_the_compose_worker_runs_the_probe_as_its_healthcheck() -> None:
    """docker-compose.yml's worker healthcheck is the liveness probe, with options the
    command takes, and gives a stuck loop the stall bound before it counts."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    check = compose["services"]["worker"]["healthcheck"]
    kind, *argv = check["test"]
    assert kind == "CMD" and argv[:4] == ["python", "manage.py", "pgqueue", "healthcheck"]
    parser = pgqueue_command.Command().create_parser("manage.py", "pgqueue")
    options = parser.parse_args(argv[3:])
    assert (options.subcommand, options.check) == ("healthcheck", "liveness")
    seconds = {k: int(str(check[k]).rstrip("s")) for k in ("interval", "timeout")}
    assert seconds["timeout"] < seconds["interval"]
