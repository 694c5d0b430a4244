"""``manage.py pgqueue_prune``: an alias of ``manage.py pgqueue prune`` (pgqueue.cli.prune),
kept so that scripts written for the old name go on working."""

from __future__ import annotations

from pgqueue.cli.prune import PruneCommand


class Command(PruneCommand):
    #: The command this one is an alias of (the CLI reference shows it as such).
    alias_of = "pgqueue prune"
    help = f"An alias of `manage.py pgqueue prune`. {PruneCommand.help}"
