"""``manage.py pgqueue <subcommand>`` for operators: what the admin does, from a shell.

One module per group of subcommands; each module's ``COMMANDS`` lists its command classes
(``pgqueue.cli.base.OperatorCommand`` subclasses, each with its ``name``). A new group is a
new module and one line in ``GROUPS``; the management command
(``pgqueue/management/commands/pgqueue.py``) takes every subcommand from ``SUBCOMMANDS`` and
stays as it is.

``healthcheck`` (``pgqueue.cli.health``) is in ``PROBES``, apart: a probe for an
orchestrator, with exit codes of its own (0 healthy, 1 not), that reads the worker
processes' health files and never needs the database for liveness.

``apikeys`` and ``prune`` are subcommands of another kind, registered by the management
command beside ``worker``: ``apikey`` and ``prune`` print text only (no ``--json``) and also
answer to their older names, ``manage.py pgqueue_apikey`` and ``pgqueue_prune``.

The commands are adapters like the admin and the API: they read through ``pgqueue.reads``
and change jobs and tenants only through ``pgqueue.services``.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from . import health, jobs, limits, overview, periodic, tenants, workflows
from .base import EXIT_CODES_HELP, OperatorCommand

__all__ = ["EXIT_CODES_HELP", "GROUPS", "PROBES", "SUBCOMMANDS", "OperatorCommand"]

#: The modules of subcommands, in the order ``manage.py pgqueue --help`` lists them.
GROUPS = [jobs, tenants, limits, overview, periodic, workflows]

#: name -> command class, every group's.
SUBCOMMANDS: dict[str, type[BaseCommand]] = {
    command.name: command for group in GROUPS for command in group.COMMANDS
}

#: name -> command class of the probes (``healthcheck``): subcommands of ``manage.py
#: pgqueue`` too, with the exit codes of a probe rather than the operators' ones.
PROBES: dict[str, type[BaseCommand]] = {command.name: command for command in health.COMMANDS}
