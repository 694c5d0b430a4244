"""``manage.py pgqueue_apikey``: an alias of ``manage.py pgqueue apikey`` (pgqueue.cli.apikeys),
kept so that scripts written for the old name go on working."""

from __future__ import annotations

from pgqueue.cli.apikeys import ApiKeyCommand


class Command(ApiKeyCommand):
    #: The command this one is an alias of (the CLI reference shows it as such).
    alias_of = "pgqueue apikey"
    help = f"An alias of `manage.py pgqueue apikey`. {ApiKeyCommand.help}"
