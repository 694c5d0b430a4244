"""``--processes P``: P worker processes under one parent, for CPU-bound tasks.

Each child is a plain ``runworker`` process (its own interpreter, connections and
threads). The parent restarts a child that dies, forwards SIGTERM/SIGINT so every child
finishes its jobs and exits, and exits 0 when they all did. A second signal is forwarded
too: the children exit at once and so does the parent, with status 1.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

logger = logging.getLogger("pgqueue.worker")


class Supervisor:
    def __init__(self, child_argv: Sequence[str], processes: int, *, restart: bool) -> None:
        self.child_argv = list(child_argv)
        self.processes = processes
        self.restart = restart  # False with --burst / --max-jobs: a child that ends is done
        self.children: dict[int, subprocess.Popen] = {}
        self.signals = 0

    def _spawn(self, slot: int) -> None:
        self.children[slot] = subprocess.Popen(self.child_argv)
        logger.info("event=child_started slot=%d pid=%d", slot, self.children[slot].pid)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signals += 1
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signum)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for slot in range(self.processes):
            self._spawn(slot)
        restarts: dict[int, float] = {}
        failed = False
        while self.children:
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
                delay = restarts.get(slot, 0.5)
                logger.warning(
                    "event=child_died slot=%d pid=%d code=%s restart_in=%.1fs",
                    slot,
                    child.pid,
                    code,
                    delay,
                )
                time.sleep(delay)
                restarts[slot] = min(delay * 2, 30.0)
                if not self.signals:
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
