"""The Django admin for pgqueue: jobs, workflows, tenants, queues, workers, API keys and the
dashboard.

Every state change goes through the service layer (actions and saves call
``pgqueue.services``); nothing here writes job rows itself. List pages stay fast on large
tables: no full-table COUNT on a page load (an estimate when unfiltered, a bounded count
when filtered), and filters list their choices from small tables. Their figures come from
the read side, ``pgqueue.reads``.

One module per model; importing this package (Django's admin autodiscovery does) registers
them all.
"""

from __future__ import annotations

from .dashboard import DashboardAdmin
from .jobs import JobAdmin
from .keys import ApiKeyAdmin
from .periodic import PeriodicScheduleAdmin  # noqa: F401  (registers the schedules' admin)
from .queues import QueueAdmin
from .tenants import TenantAdmin
from .workers import WorkerAdmin
from .workflows import WorkflowAdmin

__all__ = [
    "ApiKeyAdmin",
    "DashboardAdmin",
    "JobAdmin",
    "QueueAdmin",
    "TenantAdmin",
    "WorkerAdmin",
    "WorkflowAdmin",
]
