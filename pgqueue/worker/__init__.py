"""The worker runtime behind ``manage.py runworker``.

One module per duty: ``runtime`` (the claim/run/record loop of one process), ``listener``
(LISTEN/NOTIFY wake-ups), ``maintenance`` (reaping expired leases, promoting due jobs),
``supervisor`` (several processes under one parent), ``context`` (what a handler sees).
"""

from .context import JobContext
from .runtime import Worker

__all__ = ["JobContext", "Worker"]
