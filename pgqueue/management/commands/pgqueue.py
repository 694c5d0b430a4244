"""``manage.py pgqueue <subcommand>``: pgqueue's commands under its own name.

``runworker`` is a common name: Django Channels has a command of that name too, and the app
listed first in INSTALLED_APPS wins. ``manage.py pgqueue worker`` is the same command as
pgqueue's ``runworker``, whichever apps are installed. Each subcommand is an ordinary
management command (its own options, its own ``handle``) registered in ``SUBCOMMANDS``: the
worker, the operators' commands of ``pgqueue.cli`` (jobs, show, retry, weight…), whose
registry is where new ones are added, the ``healthcheck`` probe (``pgqueue.cli.PROBES``),
and ``apikey`` and ``prune``, which print text only
(no ``--json``) and also answer to their older names, ``pgqueue_apikey`` and
``pgqueue_prune`` (aliases: the same classes).
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from pgqueue import cli
from pgqueue.cli.apikeys import ApiKeyCommand
from pgqueue.cli.prune import PruneCommand

from . import runworker

# name -> the command it runs. The subcommand takes exactly that command's options.
SUBCOMMANDS: dict[str, type[BaseCommand]] = {
    "worker": runworker.Command,
    **cli.SUBCOMMANDS,
    **cli.PROBES,
    ApiKeyCommand.name: ApiKeyCommand,
    PruneCommand.name: PruneCommand,
}

# Django's own options (-v, --settings, --traceback…), accepted after the subcommand too
# (`pgqueue worker --burst -v 0`). SUPPRESS: when absent there, the value given before the
# subcommand, or Django's default, stands.
_BASE_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("-v", "--verbosity"), {"type": int, "choices": [0, 1, 2, 3]}),
    (("--settings",), {}),
    (("--pythonpath",), {}),
    (("--traceback",), {"action": "store_true"}),
    (("--no-color",), {"action": "store_true"}),
    (("--force-color",), {"action": "store_true"}),
    (("--skip-checks",), {"action": "store_true"}),
]


class Command(BaseCommand):
    help = (
        "pgqueue's commands: `worker` runs jobs (the same command as runworker); `apikey` "
        "creates, lists and revokes API keys, and `prune` deletes finished jobs past their "
        "retention now (the same commands as pgqueue_apikey and pgqueue_prune); "
        f"{', '.join(f'`{name}`' for name in cli.SUBCOMMANDS)} do what the admin does, each "
        "with --json for scripts (`manage.py pgqueue SUBCOMMAND --help`). Their "
        f"{cli.EXIT_CODES_HELP} `healthcheck` probes the worker processes of this host "
        "for an orchestrator (--liveness, --readiness): exit 0 healthy, 1 not."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        subparsers = parser.add_subparsers(
            dest="subcommand", metavar="SUBCOMMAND", title="subcommands", required=True
        )
        for name, command_class in SUBCOMMANDS.items():
            command = command_class()
            sub = subparsers.add_parser(name, help=command.help, description=command.help)
            command.add_arguments(sub)
            for flags, kwargs in _BASE_OPTIONS:
                sub.add_argument(*flags, default=argparse.SUPPRESS, **kwargs)

    def handle(self, *args: Any, subcommand: str, **options: Any) -> None:
        # stdout/stderr, when call_command gave them, are in options and carried over; this
        # command's own run has done the system checks already.
        SUBCOMMANDS[subcommand]().execute(*args, **{**options, "skip_checks": True})
