"""LISTEN/NOTIFY wake-ups on a dedicated connection.

Enqueue and promotion send ``pg_notify(channel, queue)`` in their transaction; PostgreSQL
delivers it on commit. An idle worker sleeps until a notification for one of its queues
arrives. A notification sent while this connection is being re-made is lost, which is why
the worker also polls, and why every (re)connection wakes the worker once.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any

import psycopg
from psycopg import sql as pgsql

logger = logging.getLogger("pgqueue.worker")


class Listener(threading.Thread):
    def __init__(
        self,
        params: dict[str, Any],
        channel: str,
        queues: Collection[str],
        wake: Callable[[], None],
        on_payload: Mapping[str, Callable[[], None]] | None = None,
    ) -> None:
        super().__init__(name="pgqueue-listener", daemon=True)
        self.params = params
        self.channel = channel
        self.queues = set(queues)
        self.wake = wake
        #: Payloads other than a queue's name, each with what to call when it arrives (a
        #: worker's 'cancel:<worker id>'); a queue name cannot hold ':', so none collides.
        self.on_payload = dict(on_payload or {})
        # Not ``_stop``: threading.Thread has a method of that name, which the hook Python
        # runs in a forked child calls (a handler that forks would get a TypeError there).
        self._stopping = threading.Event()
        self.connected = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        delay = 0.1
        while not self._stopping.is_set():
            try:
                with psycopg.connect(**self.params, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(self.channel)))
                    self.connected.set()
                    delay = 0.1
                    self.wake()  # anything sent while we were away was missed: look now
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=1.0):
                            if note.payload in self.queues:
                                self.wake()
                            elif note.payload in self.on_payload:
                                self.on_payload[note.payload]()
            except psycopg.Error as exc:
                self.connected.clear()
                logger.warning(
                    "event=listen_error error=%r retry_in=%.1fs", str(exc).strip(), delay
                )
                self._stopping.wait(delay * (0.5 + random.random()))
                delay = min(delay * 2, 5.0)
        self.connected.clear()
