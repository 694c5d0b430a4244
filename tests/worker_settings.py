"""Settings of the worker subprocesses that tests/workers.py starts.

The test settings, plus every ``PGQUEUE_<NAME>`` environment variable read into
``PGQUEUE`` (JSON when it parses, else the string), the way demo_project does: each test
gives its worker the lease, backoff and maintenance timings it needs. The database comes
from DATABASE_URL, which the test points at its own test database.
"""

import faulthandler
import json
import os
import signal

from tests.settings import *  # noqa: F403

PGQUEUE: dict = {}
for _key, _value in os.environ.items():
    if _key.startswith("PGQUEUE_"):
        try:
            PGQUEUE[_key.removeprefix("PGQUEUE_")] = json.loads(_value)
        except ValueError:
            PGQUEUE[_key.removeprefix("PGQUEUE_")] = _value

# Django's TASKS setting, which tests/test_tasks_backend.py passes the same way (not a
# PGQUEUE setting: taken out again).
if "TASKS" in PGQUEUE:
    TASKS = PGQUEUE.pop("TASKS")

# SIGUSR1 dumps every thread's stack to stderr (the worker's log): the tests send it to a
# worker that is still running at teardown, so a hang shows where it is stuck.
faulthandler.register(signal.SIGUSR1, all_threads=True)
