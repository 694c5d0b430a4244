"""A worker and a database it cannot reach: a bounded wait at start-up, and stop at once.

The workers are real ``runworker`` subprocesses (tests/workers.py) pointed at a port of
this machine where nothing listens, so every connection attempt fails at once.
"""

from __future__ import annotations

import re
import signal
import socket
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.test import override_settings

from pgqueue import checks
from tests.workers import STARTUP, StartWorker, database_url, wait_for


def closed_port_url() -> str:
    """The test database's URL with its host and port replaced by a port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    parts = urlsplit(database_url())
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}"
    query = "&".join(q for q in parts.query.split("&") if q and not q.startswith("host="))
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


@pytest.mark.django_db(transaction=True)
def test_unreachable_database_at_start_up_exits_1_with_the_reason(workers: StartWorker) -> None:
    """After CONNECT_ATTEMPTS failed tries the worker exits 1 with one line saying why.

    Before the fix it retried for ever. Three tries back off about 0.1 + 0.2 s: the bound
    of STARTUP seconds leaves room for the interpreter and Django starting.
    """
    w = workers(url=closed_port_url(), settings={"CONNECT_ATTEMPTS": 3})
    assert w.wait_exit(STARTUP) == 1
    lines = [line for line in w.log().splitlines() if "cannot reach the database" in line]
    assert len(lines) == 1, w.log()
    assert lines[0].startswith("CommandError: pgqueue worker: cannot reach the database after 3")
    assert "127.0.0.1" in lines[0] or "connection" in lines[0].lower()


@pytest.mark.django_db(transaction=True)
def test_sigterm_while_the_database_is_unreachable_exits_0_at_once(
    workers: StartWorker,
) -> None:
    """The first SIGTERM is honoured while the worker waits for the database to come up.

    Before the fix the retry loop slept (up to 7.5 s a try) without looking at the stop
    request, and tried again for ever: the worker was still running 30 s later.
    """
    w = workers(url=closed_port_url(), settings={"CONNECT_ATTEMPTS": 1000})
    wait_for(lambda: w.log().count("event=db_unavailable") >= 6, STARTUP, "a few failed tries")
    w.send(signal.SIGTERM)
    assert w.wait_exit(3) == 0


@pytest.mark.parametrize("value", [0, -1, 2.5, "10", None])
def test_connect_attempts_must_be_a_positive_integer(value: object) -> None:
    with override_settings(PGQUEUE={"CONNECT_ATTEMPTS": value}):
        errors = checks.check_settings()
    assert [e.id for e in errors] == ["pgqueue.E003"]
    assert "CONNECT_ATTEMPTS" in errors[0].msg


def test_a_slots_restart_backoff_doubles_and_resets_after_a_healthy_run() -> None:
    """Each slot backs off on its own (0.5, 1, 2, ... up to 30 s) while its child keeps
    dying young, and starts again from 0.5 s once a child ran HEALTHY seconds: a pool
    whose children crashed a few times an hour ago restarts at once today."""
    from pgqueue.worker.supervisor import RestartBackoff

    backoff = RestartBackoff()
    assert [backoff.delay(0, 1.0) for _ in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert backoff.delay(1, 1.0) == 0.5  # another slot: its own
    assert backoff.delay(0, RestartBackoff.HEALTHY) == 0.5  # after a healthy run: reset
    assert backoff.delay(0, 1.0) == 1


def test_sigterm_stops_a_pool_of_crashing_children_at_once(workers: StartWorker) -> None:
    """Two children that die at start-up (no database) are restarted, each slot on its
    own backoff; once they have died three times each (the next restart seconds away),
    SIGTERM ends the parent at once, status 0, and no child is started after it.

    Protection: the supervisor never sleeps longer than its 0.1 s poll (restarts are
    scheduled, not slept for). Without it the parent slept each backoff in turn, one slot
    after the other, and a SIGTERM waited for the sleeps (about 17 s in the report)."""
    parent = workers("--processes", "2", url=closed_port_url(), settings={"CONNECT_ATTEMPTS": 1})
    wait_for(
        lambda: parent.log().count("event=child_died") >= 6,
        STARTUP * 2,
        "the children to die three times each",
    )
    died = parent.log().count("event=child_died")
    parent.send(signal.SIGTERM)
    assert parent.wait_exit(3) == 0
    for slot in (0, 1):
        delays = re.findall(rf"event=child_died slot={slot} .* restart_in=(\S+)s", parent.log())
        assert delays[:3] == ["0.5", "1.0", "2.0"], parent.log()
    assert parent.log().count("event=child_died") == died
