"""The worker runtime end to end: ``manage.py runworker`` as a real subprocess.

The workers are started by the ``workers`` fixture of ``tests/workers.py`` (settings,
database and teardown are described there), so every test is transactional: the worker
only sees committed rows.

Nothing here sleeps to synchronise: tests wait for a state of the database (or of a file
a task touches, or of the worker's log) by polling every 50 ms up to a bound, and fail
with what they were waiting for. Tasks talk to the test through files (see the worker
tasks in ``tests/taskapp/tasks.py``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
import signal
import threading
import time
from collections.abc import Collection
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

import pgqueue
from pgqueue import store
from pgqueue.models import Job, JobAttempt
from pgqueue.models import Worker as WorkerRow
from pgqueue.worker import WorkerLoop
from tests.taskapp.tasks import GATES
from tests.workers import (
    FAST_RECOVERY,
    STARTUP,
    StartWorker,
    WorkerProcess,
    history,
    wait_for,
)

# -- looking at the database ----------------------------------------------------------------


def status(job_id: int) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job_id)


def start_recorded(job_id: int) -> bool:
    """The worker has written the job's start to its row (its heartbeat does so within
    about a second of the start): a loss of the job from now on spends an attempt."""
    return Job.objects.filter(pk=job_id, started_at__isnull=False).exists()


def count_done(ids: list[int]) -> int:
    return Job.objects.filter(id__in=ids, status="done").count()


def backends(kind: str, worker_id: str | None = None) -> list[tuple[int, str, str]]:
    """``(pid, state, query)`` of this database's pgqueue ``kind`` ("worker" or "listener")
    connections, of one worker when ``worker_id`` is given."""
    if worker_id is None:
        condition, param = "application_name LIKE %s", f"pgqueue {kind} %"
    else:  # the worker sets application_name to this, cut to PostgreSQL's 63 bytes
        condition, param = "application_name = %s", f"pgqueue {kind} {worker_id}"[:63]
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pid, state, query FROM pg_stat_activity"
            f" WHERE datname = current_database() AND pid <> pg_backend_pid() AND {condition}",
            [param],
        )
        return cur.fetchall()


def listening(worker_id: str) -> bool:
    """True once the worker's listener connection sits idle after its LISTEN."""
    return any(
        state == "idle" and query.startswith("LISTEN")
        for _, state, query in backends("listener", worker_id)
    )


def terminate_worker_backends() -> list[int]:
    """pg_terminate_backend every pgqueue worker and listener connection of this database."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND (application_name LIKE %s OR application_name LIKE %s)",
            ["pgqueue worker %", "pgqueue listener %"],
        )
        return [pid for pid, terminated in cur.fetchall() if terminated]


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with contextlib.suppress(OSError):  # a zombie nobody reaped is gone too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    return False


def live_children(parent: WorkerProcess, exclude: Collection[int] = ()) -> dict[str, int]:
    """``{worker id: pid}`` of running, registered workers other than ``parent`` itself."""
    rows = WorkerRow.objects.filter(stopped_at__isnull=True).exclude(pid=parent.pid)
    return {
        worker_id: pid
        for worker_id, pid in rows.values_list("id", "pid")
        if pid not in exclude and not process_gone(pid)
    }


# -- 1. LISTEN/NOTIFY -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_notification_wakes_an_idle_worker(workers: StartWorker) -> None:
    """An enqueue's NOTIFY wakes a sleeping worker at once, not its next poll.

    The worker polls every 30 s and runs maintenance every 30 s, and its heartbeat is
    every 40 s (lease 120 s): nothing but the notification can wake it within seconds.
    A first job is run to the end so that the loop is back in its long sleep (the
    listener's wake-up on connecting is spent) before the measured enqueue. The job must
    start within 2 s of its enqueue, measured between the database's own timestamps
    (created_at → started_at).
    """
    w = workers(settings={"POLL_SECONDS": 30, "MAINTENANCE_SECONDS": 30, "LEASE_SECONDS": 120})
    worker_id = w.registered()
    wait_for(lambda: listening(worker_id), STARTUP, "the worker's listener to LISTEN")

    warm_up, _ = pgqueue.enqueue("test.noop", tenant="acme")
    wait_for(lambda: status(warm_up.id) == "done", 10, "the warm-up job to be done")

    job, _ = pgqueue.enqueue("test.noop", tenant="acme")
    wait_for(
        lambda: status(job.id) == "done",
        10,
        "the job to be done (only a notification can wake the worker this soon)",
    )
    row = Job.objects.get(pk=job.id)
    latency = (row.started_at - row.created_at).total_seconds()
    assert latency < 2.0, f"the job started {latency:.2f}s after its enqueue"
    assert history(job.id) == [(1, "done", worker_id)]


# -- 2. a killed worker ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_job_of_a_worker_killed_mid_job_is_recovered_by_another(
    workers: StartWorker, tmp_path: Path
) -> None:
    """A job whose worker is SIGKILLed while running it is run again, by another worker.

    Worker A runs a job that blocks; once A has recorded its start, A is killed with
    SIGKILL (no cleanup at all). Its lease runs out, worker B's maintenance reaps it (a
    lease_expired row for A's attempt, an attempt spent) and B runs it to the end: done,
    attempts 2, the result from B's attempt.
    """
    release, started = tmp_path / "release", tmp_path / "started"
    job, _ = pgqueue.enqueue(
        "test.block", {"release": str(release), "started": str(started)}, tenant="acme"
    )
    a = workers("--concurrency", "1", settings=FAST_RECOVERY, name="A")
    a_id = a.registered()
    wait_for(lambda: Path(f"{started}.1").exists(), STARTUP, "the handler to start under A")
    wait_for(lambda: start_recorded(job.id), 10, "A to record the job's start")
    assert Job.objects.filter(pk=job.id, status="running", lease_owner=a_id, attempts=1).exists()

    a.send(signal.SIGKILL)
    assert a.wait_exit(10) == -signal.SIGKILL
    release.touch()  # from now on the task returns at once
    b = workers("--concurrency", "1", settings=FAST_RECOVERY, name="B")
    b_id = b.registered()

    wait_for(lambda: status(job.id) == "done", 20, "B to recover and finish the job")
    row = Job.objects.get(pk=job.id)
    assert (row.attempts, row.lease_owner, row.result) == (2, b_id, {"attempt": 2, "worker": b_id})
    assert history(job.id) == [(1, "lease_expired", a_id), (2, "done", b_id)]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_handler_that_ends_its_process_spends_its_own_attempts_not_its_neighbours(
    workers: StartWorker,
) -> None:
    """``os._exit`` in one tenant's handler costs the jobs claimed beside it nothing.

    Two worker processes (``--processes 2``: the parent restarts a child that dies), one
    thread each, jobs held ahead for as long as it takes (PREFETCH_HOLD_SECONDS). Tenant evil's
    job ends the process the moment it runs; tenant acme's job, claimed with it and behind
    it (a lower priority), waits for the thread and dies with the process unstarted, each
    time. The first loss of evil's job cannot be told from acme's (neither was seen to
    start): both are given back free. From then on evil's start is written before its
    handler runs, so each of its losses spends one of its two attempts and sends it to a
    backoff, and it ends dead, while acme's job, never charged, runs and is done at its
    first attempt. Before, acme's job paid an attempt for every crash; with the give-back
    alone, the two were given back together until both were dead at MAX_LOST_CLAIMS.
    """
    evil, _ = pgqueue.enqueue("test.exit", {}, tenant="evil", max_attempts=2)
    victim, _ = pgqueue.enqueue("test.echo", {"n": 1}, tenant="acme", priority=-1)
    settings = {**FAST_RECOVERY, "PREFETCH_HOLD_SECONDS": 60, "MAX_LOST_CLAIMS": 4}
    parent = workers("--processes", "2", "--concurrency", "1", settings=settings)

    wait_for(
        lambda: {status(evil.id), status(victim.id)} <= {"done", "dead"},
        90,
        "both jobs to end",
    )
    row = Job.objects.get(pk=victim.id)
    assert (row.status, row.attempts, row.result) == ("done", 1, {"n": 1}), row.last_error
    assert [(a, o) for a, o, _ in history(victim.id)] == [
        *[(1, "lease_expired")] * row.lost_claims,
        (1, "done"),
    ]
    assert 1 <= row.lost_claims < 4
    lost = JobAttempt.objects.filter(job_id=victim.id, outcome="lease_expired")
    assert all(a.started_at is None for a in lost)

    dead = Job.objects.get(pk=evil.id)
    assert (dead.attempts, dead.lost_claims) == (2, 1)
    assert dead.last_error.startswith("lease expired: worker ")
    assert [
        (a.attempt, a.outcome, a.started_at is not None)
        for a in JobAttempt.objects.filter(job_id=evil.id).order_by("id")
    ] == [(1, "lease_expired", False), (1, "lease_expired", True), (2, "lease_expired", True)]
    assert "event=child_died" in parent.log()


# -- 3. retries -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_failing_job_is_retried_until_it_succeeds(workers: StartWorker) -> None:
    """A job that fails twice is retried (backoff, promotion, new claim) and then succeeds.

    Proves the whole retry loop through a real worker: each failure is recorded with its
    error, the job waits out its backoff in 'scheduled', maintenance promotes it, it is
    claimed again with the next attempt number, and the third attempt's result is kept.
    """
    job, _ = pgqueue.enqueue("test.fail_until", {"succeed_on": 3}, tenant="acme", max_attempts=5)
    w = workers(settings={"BACKOFF_BASE": 0.05, "MAINTENANCE_SECONDS": 0.1})
    worker_id = w.registered()

    wait_for(lambda: status(job.id) == "done", 20, "the job to succeed on its third attempt")
    row = Job.objects.get(pk=job.id)
    assert (row.attempts, row.result) == (3, {"attempt": 3})
    assert history(job.id) == [
        (1, "failed", worker_id),
        (2, "failed", worker_id),
        (3, "done", worker_id),
    ]
    errors = list(
        JobAttempt.objects.filter(job_id=job.id, outcome="failed")
        .order_by("attempt")
        .values_list("error", flat=True)
    )
    assert errors == [
        "RuntimeError: failing on purpose on attempt 1",
        "RuntimeError: failing on purpose on attempt 2",
    ]


# -- 4. stopping ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_sigterm_finishes_the_job_in_hand_and_exits_0(workers: StartWorker, tmp_path: Path) -> None:
    """SIGTERM: stop claiming, finish the job in hand, record it, deregister, exit 0.

    The job blocks until the test creates its release file, which it does only after
    sending SIGTERM: the job was certainly in progress when the signal came. Jobs
    enqueued meanwhile are never claimed (they stay queued with attempts 0) although a
    slot frees up when the job ends, and the worker row is marked stopped.
    """
    release, started = tmp_path / "release", tmp_path / "started"
    job, _ = pgqueue.enqueue(
        "test.block", {"release": str(release), "started": str(started)}, tenant="acme"
    )
    w = workers("--concurrency", "1")
    worker_id = w.registered()
    wait_for(lambda: Path(f"{started}.1").exists(), STARTUP, "the handler to start")
    others = pgqueue.enqueue_many("test.noop", [1, 2, 3], tenant="acme")

    w.send(signal.SIGTERM)
    release.touch()
    assert w.wait_exit(15) == 0

    row = Job.objects.get(pk=job.id)
    assert (row.status, row.attempts, row.result) == (
        "done",
        1,
        {"attempt": 1, "worker": worker_id},
    )
    assert history(job.id) == [(1, "done", worker_id)]
    assert (
        list(Job.objects.filter(id__in=others).values_list("status", "attempts"))
        == [("queued", 0)] * 3
    )
    assert not JobAttempt.objects.filter(job_id__in=others).exists()
    assert WorkerRow.objects.get(pk=worker_id).stopped_at is not None
    assert "event=worker_stopped" in w.log()


@pytest.mark.django_db(transaction=True)
def test_second_sigterm_exits_at_once_with_status_1(workers: StartWorker, tmp_path: Path) -> None:
    """A second SIGTERM exits immediately with status 1, leaving the job to its lease.

    The job blocks (for up to 30 s) and is never released, so a graceful stop could not
    end before then: an exit within seconds can only be the second signal's os._exit(1).
    The job is left running under the worker's lease (recovered later as in the SIGKILL
    test) and nothing was recorded or deregistered.

    Two signals that arrive before Python runs the handler of the first are handled once,
    so SIGTERM is re-sent every 50 ms until the process exits.
    """
    release, started = tmp_path / "release", tmp_path / "started"
    job, _ = pgqueue.enqueue(
        "test.block", {"release": str(release), "started": str(started)}, tenant="acme"
    )
    w = workers("--concurrency", "1")
    worker_id = w.registered()
    wait_for(lambda: Path(f"{started}.1").exists(), STARTUP, "the handler to start")

    first_signal = time.monotonic()
    w.send(signal.SIGTERM)

    def exited() -> bool:
        w.send(signal.SIGTERM)  # a no-op once the process has exited
        return w.proc.poll() is not None

    wait_for(exited, 5, "the worker to exit on a second SIGTERM")
    assert w.proc.returncode == 1
    assert time.monotonic() - first_signal < 5

    row = Job.objects.get(pk=job.id)
    assert (row.status, row.lease_owner, row.attempts) == ("running", worker_id, 1)
    assert row.lease_expires_at is not None and row.result is None
    assert history(job.id) == []
    assert WorkerRow.objects.get(pk=worker_id).stopped_at is None
    assert "event=worker_stopped" not in w.log()


def run_first_hold_second(worker: WorkerLoop, first: int, second: int) -> None:
    """Connect ``worker`` (one thread), claim ``first`` and ``second`` in one claim and
    dispatch both: the first runs (a gated handler, say), the second waits for the thread."""
    worker._connect_until_up()
    assert worker.db is not None
    with worker.db.cursor() as cur:
        claimed = store.claim(
            cur, worker=worker.id, queues=worker.queues, limit=2, lease_seconds=worker.lease
        )
    assert [c.id for c in claimed] == [first, second]
    worker._dispatch(claimed)
    wait_for(lambda: worker.in_flight[first].started, 5, "the first job to start")


@pytest.mark.django_db(transaction=True)
def test_a_thread_freed_after_a_stop_request_starts_no_job_claimed_ahead() -> None:
    """A stop asked (what SIGTERM's handler does) while a job claimed ahead waits for the
    one thread: the running job ends before the loop has turned to give the waiting one
    back. The freed thread must not start it: it stays unstarted, and the loop's give-back
    queues it again. Fails without JobExecutor.stop_starting, which _stop_now calls first:
    the thread would run the second job as soon as the first one ended.
    """
    gate = threading.Event()
    GATES["late-loop"] = gate
    first, _ = pgqueue.enqueue("test.gate", {"gate": "late-loop"}, tenant="acme", queue="q")
    second, _ = pgqueue.enqueue("test.noop", {}, tenant="acme", queue="q")
    worker = WorkerLoop(queues=["q"], concurrency=1)
    try:
        run_first_hold_second(worker, first.id, second.id)
        worker._stop_now()  # the loop does not turn meanwhile
        gate.set()
        wait_for(lambda: worker.outcomes.qsize() == 1, 10, "the first job's outcome")
        wait_for(lambda: worker.executor.queued() == 0, 10, "the thread to take the queue")
        assert not worker.in_flight[second.id].started
        worker._release_unstarted()
        row = Job.objects.get(pk=second.id)
        assert (row.status, row.attempts) == ("queued", 0)
    finally:
        gate.set()
        worker._shutdown()
        del GATES["late-loop"]
    assert status(first.id) == "done"
    assert history(second.id) == []


@pytest.mark.django_db(transaction=True)
def test_stop_releases_claimed_but_unstarted_jobs() -> None:
    """On stop, a job claimed but not started is given back at once, keeping its place.

    In-process, with the WorkerLoop's own methods: one executor thread, two jobs claimed; the
    first blocks on an event, so the second waits in the executor, unstarted. After
    request_stop(), _release_unstarted() must put the second back to queued with the
    attempt not counted and its old vtime (no lease to wait out, no lost place in the
    line); _shutdown() then waits for the first and records it done.
    """
    gate = threading.Event()
    GATES["release-unstarted"] = gate
    first, _ = pgqueue.enqueue("test.gate", {"gate": "release-unstarted"}, tenant="acme", queue="q")
    second, _ = pgqueue.enqueue("test.noop", {}, tenant="acme", queue="q")
    vtime = Job.objects.get(pk=second.id).vtime

    worker = WorkerLoop(queues=["q"], concurrency=1)
    try:
        run_first_hold_second(worker, first.id, second.id)
        assert not worker.in_flight[second.id].started
        assert status(second.id) == "running"  # claimed: the database says it is ours

        worker.request_stop()
        worker._release_unstarted()

        row = Job.objects.get(pk=second.id)
        assert (row.status, row.attempts, row.vtime) == ("queued", 0, vtime)
        assert (row.lease_owner, row.lease_expires_at, row.started_at) == (None, None, None)
        assert second.id not in worker.in_flight
        assert status(first.id) == "running"
    finally:
        gate.set()
        worker._shutdown()
        del GATES["release-unstarted"]

    row = Job.objects.get(pk=first.id)
    assert (row.status, row.attempts, row.result) == ("done", 1, {"gate": "release-unstarted"})
    assert history(first.id) == [(1, "done", worker.id)]
    assert history(second.id) == []
    assert status(second.id) == "queued"
    assert WorkerRow.objects.get(pk=worker.id).stopped_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_job_given_back_while_its_worker_stalled_runs_once_when_that_worker_claims_it_again() -> (
    None
):
    """A held-up worker whose unstarted job maintenance gave back, and which then claims
    that job again under the same attempt number, runs it once, under the new claim.

    In-process, with the WorkerLoop's own methods: one thread, on a job that blocks (its
    start recorded by a heartbeat round), and a second job claimed ahead behind it. The
    leases run out as if the process had stalled (a neighbour holding the GIL): the
    reaper spends the first job's attempt and gives the second back uncounted. The same
    worker claims the second again: attempt 1 again, so its old context and the new one
    both match the fence (worker, attempt). The old one is dropped as lost, never started
    and never given back; the new one runs and is recorded.
    """
    gate = threading.Event()
    GATES["stalled"] = gate
    first, _ = pgqueue.enqueue("test.gate", {"gate": "stalled"}, tenant="evil", queue="q")
    second, _ = pgqueue.enqueue("test.echo", {"n": 2}, tenant="acme", queue="q")
    worker = WorkerLoop(queues=["q"], concurrency=1)
    try:
        run_first_hold_second(worker, first.id, second.id)
        worker._heartbeat()  # writes the first job's start
        old = worker.in_flight[second.id]
        assert not old.started

        with connection.cursor() as cur:  # the process stalls past its leases
            assert store.reap_expired(cur, now=timezone.now() + dt.timedelta(hours=1)) == {
                first.id: "scheduled",
                second.id: "queued",
            }
        with worker.db.cursor() as cur:
            again = store.claim(
                cur, worker=worker.id, queues=worker.queues, limit=1, lease_seconds=worker.lease
            )
        assert [(c.id, c.attempt) for c in again] == [(second.id, old.attempt)]
        worker._dispatch(again)
        assert old.lost and worker.in_flight[second.id] is not old
        assert status(second.id) == "running"

        gate.set()
        wait_for(lambda: worker.outcomes.qsize() == 3, 10, "the three outcomes")
        worker._take_outcomes()
        assert not worker.stops.lingering and not worker.in_flight
        outcomes = {id(o.ctx): o for o in worker.pending}
        assert outcomes[id(old)].error == "not run: lease lost" and not old.started
        worker._turn()
    finally:
        gate.set()
        worker._shutdown()
        del GATES["stalled"]

    row = Job.objects.get(pk=second.id)
    assert (row.status, row.attempts, row.result) == ("done", 1, {"n": 2})
    assert history(second.id) == [(1, "lease_expired", worker.id), (1, "done", worker.id)]
    assert (status(first.id), Job.objects.get(pk=first.id).attempts) == ("scheduled", 1)


@pytest.mark.django_db(transaction=True)
def test_request_stop_is_safe_in_a_signal_handler() -> None:
    """request_stop() (documented signal-safe) works from a handler that interrupted the loop.

    runworker's SIGTERM handler calls request_stop(), and Python runs a signal handler in
    the main thread between two bytecodes, wherever the loop happens to be, e.g. inside
    wake_event.clear() or wake_event.wait(), which hold the Event's internal lock. Here the
    signal is made to arrive exactly there: SIGUSR1 is left pending for this thread while
    blocked, and unblocked while holding wake_event's lock. A handler that needs that lock
    again waits for itself forever; an alarm after 2 s turns that into a failure.
    """
    worker = WorkerLoop(queues=["q"], concurrency=1)

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError("the signal handler is stuck")

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGALRM)}
    signal.signal(signal.SIGUSR1, lambda signum, frame: worker.request_stop())
    signal.signal(signal.SIGALRM, on_alarm)
    stuck = False
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # pending until unblocked
        signal.setitimer(signal.ITIMER_REAL, 2.0)
        try:
            with worker.wake_event._cond:  # as in the loop's wake_event.clear() / .wait()
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        except TimeoutError:
            stuck = True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        worker.executor.shutdown()
    assert not stuck, (
        "request_stop() deadlocked: called from a signal handler that interrupted the loop "
        "inside wake_event.clear()/wait(), it waits for the Event lock its own thread holds"
    )
    assert worker.stopping.wait(5), "request_stop() did not stop the worker"


# -- 5. lost connections --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_connections_dropped_while_jobs_flow_lose_no_job(workers: StartWorker) -> None:
    """Killing the worker's PostgreSQL connections mid-flow loses nothing, duplicates nothing.

    300 short jobs, 4 handler threads; three times, while jobs are being done, every
    worker and listener backend is terminated from the server side. The worker must
    reconnect each time (new backends) and every job must end done with exactly one
    'done' attempt row. A job may run more than once only through lease recovery
    (a claim whose commit succeeded but whose answer was lost): its history is then
    'lease_expired' for every earlier attempt, never a second 'done' or a silent rerun.
    """
    rng = random.Random(20240501)
    ids = pgqueue.enqueue_many(
        "test.sleep", [{"seconds": rng.uniform(0.005, 0.02)} for _ in range(300)], tenant="acme"
    )
    w = workers(
        "--concurrency",
        "4",
        settings={"LEASE_SECONDS": 3, "MAINTENANCE_SECONDS": 0.2, "BACKOFF_BASE": 0.05},
    )
    worker_id = w.registered()
    wait_for(lambda: listening(worker_id), STARTUP, "the worker's listener to LISTEN")

    terminated: set[int] = set()
    done_at_drop = []
    for threshold in (30, 100, 170):
        wait_for(lambda t=threshold: count_done(ids) >= t, 20, f"{threshold} jobs done")
        pids = terminate_worker_backends()
        assert pids, "no worker connection to terminate"
        done_at_drop.append(count_done(ids))
        terminated.update(pids)

        def reconnected() -> bool:
            return all(
                any(pid not in terminated for pid, _, _ in backends(kind, worker_id))
                for kind in ("worker", "listener")
            )

        wait_for(reconnected, 15, "the worker and its listener to reconnect")

    wait_for(lambda: count_done(ids) == len(ids), 30, "every job to be done")
    assert all(n < len(ids) for n in done_at_drop), f"jobs done at each drop: {done_at_drop}"
    assert "event=db_error" in w.log()

    attempts = dict(Job.objects.filter(id__in=ids).values_list("id", "attempts"))
    rows: dict[int, list[tuple[int, str]]] = {job_id: [] for job_id in ids}
    for job_id, attempt, outcome in (
        JobAttempt.objects.filter(job_id__in=ids)
        .order_by("job_id", "attempt", "id")
        .values_list("job_id", "attempt", "outcome")
    ):
        rows[job_id].append((attempt, outcome))
    not_done_once = {j: r for j, r in rows.items() if [o for _, o in r].count("done") != 1}
    assert not not_done_once, f"jobs without exactly one 'done' row: {not_done_once}"
    unexplained = {
        j: r
        for j, r in rows.items()
        if attempts[j] > 1 and not any(o == "lease_expired" for _, o in r)
    }
    assert not unexplained, f"jobs run again without a lease_expired row: {unexplained}"
    # Every attempt but the last ended by lease expiry; the last is the one done.
    odd = {
        j: r
        for j, r in rows.items()
        if r != [(n, "lease_expired") for n in range(1, attempts[j])] + [(attempts[j], "done")]
    }
    assert not odd, f"jobs with an unexpected history: {odd}"


# -- 6. heartbeats and fencing --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_heartbeat_keeps_a_job_longer_than_its_lease(workers: StartWorker) -> None:
    """Heartbeats renew the lease of a job that runs three times as long as the lease.

    Lease 1 s (heartbeat every 1/3 s), maintenance reaping every 0.1 s, a job of 3 s: it
    is never reaped and never run twice (attempts 1, no lease_expired row).
    """
    job, _ = pgqueue.enqueue("test.sleep", {"seconds": 3.0}, tenant="acme")
    w = workers(settings={"LEASE_SECONDS": 1, "MAINTENANCE_SECONDS": 0.1, "BACKOFF_BASE": 0.05})
    worker_id = w.registered()

    wait_for(lambda: status(job.id) == "done", 20, "the 3 s job to be done")
    row = Job.objects.get(pk=job.id)
    assert (row.finished_at - row.started_at).total_seconds() >= 3.0
    assert (row.attempts, row.result) == (1, {"attempt": 1})
    assert history(job.id) == [(1, "done", worker_id)]
    assert "event=lease_expired" not in w.log()
    assert "event=lease_lost" not in w.log()


@pytest.mark.django_db(transaction=True)
def test_result_of_a_fenced_out_handler_is_not_written(
    workers: StartWorker, tmp_path: Path
) -> None:
    """A handler whose job was taken over has its result discarded, not written.

    While the handler loops on job.heartbeat(), the test steals the job the way a
    reclaim by another worker would (new owner 'thief', next attempt, a fresh lease long
    enough that maintenance leaves it alone). The worker's heartbeat must find the lease
    lost, the handler then returns {"finished": True}, and the row must still be the
    thief's: running, attempt 2, result NULL, no attempt row written by the old owner.
    """
    started = tmp_path / "started"
    job, _ = pgqueue.enqueue("test.until_lost", {"started": str(started)}, tenant="acme")
    w = workers(settings={"LEASE_SECONDS": 5, "MAINTENANCE_SECONDS": 0.2})
    worker_id = w.registered()
    wait_for(lambda: Path(f"{started}.1").exists(), STARTUP, "the handler to start")

    with connection.cursor() as cur:
        cur.execute(
            "UPDATE pgqueue_job SET lease_owner = 'thief', attempts = attempts + 1,"
            " lease_expires_at = now() + interval '1 hour'"
            " WHERE id = %s AND status = 'running' AND lease_owner = %s AND attempts = 1",
            [job.id, worker_id],
        )
        assert cur.rowcount == 1

    wait_for(lambda: "outcome=discarded" in w.log(), 15, "the worker to discard the outcome")
    row = Job.objects.get(pk=job.id)
    assert (row.lease_owner, row.status, row.attempts) == ("thief", "running", 2)
    assert row.result is None and row.finished_at is None
    assert history(job.id) == []
    log = w.log()
    assert f"job={job.id} attempt=1 event=lease_lost" in log
    assert f"job={job.id} task=test.until_lost" in log and "reason=lease_lost" in log


# -- 7. --burst and --max-jobs --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_burst_exits_when_no_job_is_runnable(workers: StartWorker) -> None:
    """--burst runs what is runnable and exits 0; a job scheduled for later does not hold it."""
    runnable = pgqueue.enqueue_many("test.noop", [1, 2], tenant="acme")
    delayed, _ = pgqueue.enqueue("test.noop", 3, tenant="acme", delay=3600)
    w = workers("--burst")
    assert w.wait_exit(STARTUP) == 0
    assert count_done(runnable) == 2
    row = Job.objects.get(pk=delayed.id)
    assert (row.status, row.attempts) == ("scheduled", 0)
    assert WorkerRow.objects.filter(pid=w.pid, stopped_at__isnull=False).exists()


@pytest.mark.django_db(transaction=True)
def test_max_jobs_exits_after_that_many_jobs(workers: StartWorker) -> None:
    """--max-jobs 3 runs exactly 3 jobs and exits 0, though it has 4 slots and 5 jobs wait.

    It claims no more than it may run: the other two are still queued with attempts 0.
    """
    ids = pgqueue.enqueue_many("test.noop", [1, 2, 3, 4, 5], tenant="acme")
    w = workers("--max-jobs", "3", "--concurrency", "4")
    assert w.wait_exit(STARTUP) == 0
    statuses = dict(Job.objects.filter(id__in=ids).values_list("id", "status"))
    assert [statuses[i] for i in ids] == ["done"] * 3 + ["queued"] * 2
    assert list(Job.objects.filter(id__in=ids[3:]).values_list("attempts", flat=True)) == [0, 0]


# -- 8. --processes -------------------------------------------------------------------------


def two_children_listening(parent: WorkerProcess) -> dict[str, int]:
    """The two child workers of a ``--processes 2`` parent, once both LISTEN: {id: pid}."""
    children = wait_for(
        lambda: c if len(c := live_children(parent)) == 2 else None,
        STARTUP,
        "two child workers to register",
    )
    for worker_id in children:
        wait_for(lambda i=worker_id: listening(i), STARTUP, f"{worker_id} to LISTEN")
    return children


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_processes_run_jobs_in_children_and_stop_on_sigterm(workers: StartWorker) -> None:
    """--processes 2 runs jobs in two child processes; SIGTERM to the parent stops all.

    Each child is a worker of its own (its own pgqueue_worker row and pid) and both do
    jobs. SIGTERM to the parent is forwarded: the children finish, deregister and exit,
    then the parent exits 0 with no child left behind. ``--prefetch 0`` (passed on to the
    children) keeps each child to one job at a time, so that one cannot claim all six.
    """
    parent = workers("--processes", "2", "--concurrency", "1", "--prefetch", "0")
    children = two_children_listening(parent)

    ids = pgqueue.enqueue_many("test.sleep", [{"seconds": 0.2}] * 6, tenant="acme")
    wait_for(lambda: count_done(ids) == len(ids), 20, "every job to be done")
    doers = set(
        JobAttempt.objects.filter(job_id__in=ids, outcome="done").values_list("worker", flat=True)
    )
    assert doers == set(children)
    assert parent.pid not in children.values()

    parent.send(signal.SIGTERM)
    assert parent.wait_exit(15) == 0
    assert all(process_gone(pid) for pid in children.values())
    stopped = WorkerRow.objects.filter(id__in=children, stopped_at__isnull=False).count()
    assert stopped == 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_processes_stop_gracefully_when_the_whole_process_group_is_signalled(
    workers: StartWorker,
) -> None:
    """SIGTERM to the parent and its children at once (Ctrl-C in a terminal, systemd's
    default KillMode=control-group) is one request to stop, not two: both running jobs
    finish and are recorded done, and the parent exits 0.

    Protection: the parent asks its children to stop with SIGUSR2, which a worker never
    counts as a second signal. When it forwarded the SIGTERM it got, each child received
    two, exited at once with status 1 and left its job running until its lease ran out.
    """
    parent = workers("--processes", "2", "--concurrency", "1", "--prefetch", "0")
    children = two_children_listening(parent)
    ids = pgqueue.enqueue_many("test.sleep", [{"seconds": 2}] * 2, tenant="acme")
    wait_for(
        lambda: Job.objects.filter(id__in=ids, started_at__isnull=False).count() == 2,
        STARTUP,
        "both jobs to start, one in each child",
    )

    os.killpg(parent.pid, signal.SIGTERM)  # the group: the parent and both children
    assert parent.wait_exit(15) == 0, parent.log()
    assert all(process_gone(pid) for pid in children.values())
    assert list(Job.objects.filter(id__in=ids).values_list("status", "attempts")) == [
        ("done", 1),
        ("done", 1),
    ]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_processes_restart_a_child_killed_with_sigkill(workers: StartWorker) -> None:
    """A child worker that dies (SIGKILL) is replaced by a new one; the parent keeps going.

    After the kill a new child (a new pid) registers beside the survivor; SIGTERM then
    still stops everything cleanly, the new child included, with status 0.
    """
    parent = workers("--processes", "2", "--concurrency", "1")
    children = wait_for(
        lambda: c if len(c := live_children(parent)) == 2 else None,
        STARTUP,
        "two child workers to register",
    )
    victim_id, victim_pid = sorted(children.items())[0]
    os.kill(victim_pid, signal.SIGKILL)

    replacement = wait_for(
        lambda: live_children(parent, exclude=set(children.values())) or None,
        STARTUP,
        "a new child to replace the killed one",
    )
    assert len(replacement) == 1
    assert len(live_children(parent)) == 2  # the survivor and the replacement
    assert "event=child_died" in parent.log()

    parent.send(signal.SIGTERM)
    assert parent.wait_exit(15) == 0
    for pid in [*children.values(), *replacement.values()]:
        assert process_gone(pid), f"pid {pid} still running"
    assert WorkerRow.objects.get(pk=victim_id).stopped_at is None  # killed: no clean exit
    assert all(
        WorkerRow.objects.get(pk=worker_id).stopped_at is not None
        for worker_id in [*replacement, *(i for i in children if i != victim_id)]
    )


@pytest.mark.django_db(transaction=True)
def test_a_stopped_worker_leaves_no_thread_or_process_of_a_handler_behind(
    workers: StartWorker, tmp_path: Path
) -> None:
    """A handler that starts a non-daemon thread and forks a child, both sleeping a
    minute, does not keep its worker from exiting: the burst ends with status 0 in a few
    seconds, the log names what was left, and the forked child is gone.

    Protection: runworker's ``leave`` ends the children its handlers left and exits
    without waiting for their threads. Without it Python waits for the thread (a minute)
    and the forked child outlives the worker, an orphan."""
    pid_file = tmp_path / "child.pid"
    job, _ = pgqueue.enqueue("test.leave_behind", {"pid_file": str(pid_file)}, tenant="acme")
    w = workers("--burst", "--concurrency", "1")
    assert w.wait_exit(STARTUP) == 0
    assert Job.objects.get(pk=job.id).status == "done"
    child = int(pid_file.read_text())
    wait_for(lambda: process_gone(child), 10, "the forked child to be ended")
    log = w.log()
    assert "event=threads_left_behind count=1 names=left-behind" in log, log
    assert f"event=processes_left_behind pids={child} action=ended" in log, log
    assert "_after_fork" not in log, log  # the fork ran Python's after-fork hook cleanly
