"""``--processes P``: P worker processes under one parent, for CPU-bound tasks.

Each child is a plain ``runworker`` process (its own interpreter, connections and
threads). The parent restarts a child that dies, tells every child to finish its jobs and
exit when it gets SIGTERM or SIGINT, and exits 0 when they all did. A second signal kills
the children (SIGKILL) and the parent exits at once with status 1; leases recover the jobs.

The parent asks with SIGUSR2, not by forwarding the signal it got. A signal often reaches
the children too: Ctrl-C signals the terminal's whole process group, and systemd's default
``KillMode=control-group`` signals every process of the unit. A forwarded SIGTERM would then
be each child's second signal, which makes a worker exit at once, leaving its jobs running
until their leases run out. SIGUSR2 stops a worker as its first signal does and is never
counted as a second one.

The parent writes a health file of its own (``pgqueue.worker.health``, role
``supervisor``) from its watch loop, listing its children, each of which writes its own:
``manage.py pgqueue healthcheck`` sees a parent that stopped watching, and counts a
parent restarting its children as alive while no child is.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from .health import HealthFile

logger = logging.getLogger("pgqueue.worker")


class RestartBackoff:
    """When to restart a slot's child that died on its own: at once-ish (FIRST seconds)
    after a child that had run HEALTHY seconds or longer, else twice the slot's last wait,
    at most MAX. Each slot has its own: one crashing child slows no other."""

    FIRST = 0.5
    MAX = 30.0
    HEALTHY = 30.0

    def __init__(self) -> None:
        self._last: dict[int, float] = {}

    def delay(self, slot: int, ran: float) -> float:
        """The wait before restarting ``slot``, whose child ran ``ran`` seconds."""
        last = self._last.get(slot)
        delay = self.FIRST if last is None or ran >= self.HEALTHY else min(last * 2, self.MAX)
        self._last[slot] = delay
        return delay


class Supervisor:
    def __init__(self, child_argv: Sequence[str], processes: int, *, restart: bool) -> None:
        self.child_argv = list(child_argv)
        self.processes = processes
        self.restart = restart  # False with --burst / --max-jobs: a child that ends is done
        self.children: dict[int, subprocess.Popen] = {}
        self.started: dict[int, float] = {}  # slot -> time.monotonic() its child started
        self.signals = 0

    def _spawn(self, slot: int) -> None:
        self.children[slot] = subprocess.Popen(self.child_argv)
        self.started[slot] = time.monotonic()
        logger.info("event=child_started slot=%d pid=%d", slot, self.children[slot].pid)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signals += 1
        for child in self.children.values():
            if child.poll() is None:
                if self.signals == 1:
                    child.send_signal(signal.SIGUSR2)  # finish the jobs in hand, then exit
                else:
                    child.kill()

    def run(self) -> int:
        """Watch the children every 0.1 s: nothing here sleeps longer, so a signal is
        acted on at once, and a slot waiting to restart its child holds up no other."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        health = HealthFile("supervisor")
        health.open()
        try:
            return self._watch(health)
        finally:
            health.close()

    def _watch(self, health: HealthFile) -> int:
        for slot in range(self.processes):
            self._spawn(slot)
        health.set_state("running")
        backoff = RestartBackoff()
        due: dict[int, float] = {}  # slot -> time.monotonic() to restart its child at
        failed = False
        while self.children or (due and not self.signals):
            health.turn()  # on this thread, as the workers' loops do
            if self.signals:
                health.set_state("stopping")  # here, not in the signal handler
            pids = sorted(child.pid for child in self.children.values())
            if pids != health.children:
                health.set_children(pids)
            now = time.monotonic()
            for slot, child in list(self.children.items()):
                code = child.poll()
                if code is None:
                    continue
                del self.children[slot]
                if self.signals:
                    failed |= code != 0
                    continue
                if code == 0 and not self.restart:
                    continue
                # A child died on its own (crash, OOM kill): its leases recover its jobs;
                # start a new one, backing off if it keeps dying.
                delay = backoff.delay(slot, now - self.started[slot])
                logger.warning(
                    "event=child_died slot=%d pid=%d code=%s restart_in=%.1fs",
                    slot,
                    child.pid,
                    code,
                    delay,
                )
                due[slot] = now + delay
            for slot, at in list(due.items()):
                if self.signals:
                    due.clear()  # stopping: nothing is restarted
                elif now >= at:
                    del due[slot]
                    self._spawn(slot)
            if self.signals > 1:
                return 1
            time.sleep(0.1)
        return 1 if failed or self.signals > 1 else 0


def child_command(argv: Sequence[str]) -> list[str]:
    """This process's command line with ``--processes`` dropped (children run 1 each)."""
    out: list[str] = [sys.executable]
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--processes", "-p"):
            skip = True
            continue
        if arg.startswith("--processes="):
            continue
        out.append(arg)
    return out
