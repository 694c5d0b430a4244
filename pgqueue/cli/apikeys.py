"""``manage.py pgqueue apikey create|list|revoke``: API keys of the HTTP API.

Also ``manage.py pgqueue_apikey``, its alias (pgqueue/management/commands/pgqueue_apikey.py).
It prints text, not JSON: ``create`` prints the key once, alone on its last line, for a
shell to take with ``tail -n 1``. An error is one line on stderr and exit 1, as Django's
commands do.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from .. import keys
from ..conf import queue_db
from ..exceptions import InvalidJob
from ..models import ApiKey


class ApiKeyCommand(BaseCommand):
    #: The subcommand's name: ``manage.py pgqueue apikey``.
    name = "apikey"
    help = (
        "Manage API keys. `create --tenant NAME` makes a key bound to one tenant (created if "
        "new), `create --all-tenants` a service key; the key is printed once, alone on the "
        "last line. `list` shows prefixes, never keys. `revoke PREFIX` disables a key."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a key and print it once")
        scope = create.add_mutually_exclusive_group(required=True)
        scope.add_argument("--tenant", help="the only tenant the key may act as")
        scope.add_argument("--all-tenants", action="store_true", help="a service key")
        create.add_argument("--name", default="", help="a label, e.g. who uses the key")
        create.add_argument("--tasks", default="", help="a,b: the only tasks it may enqueue")
        create.add_argument("--queues", default="", help="q1,q2: the only queues it may use")
        create.add_argument(
            "--max-priority",
            type=int,
            default=None,
            help="the highest priority it may set (default: TENANT_MAX_PRIORITY for a "
            "tenant key, 100 for an all-tenants key)",
        )
        sub.add_parser("list", help="list keys (prefixes only)")
        revoke = sub.add_parser("revoke", help="revoke a key")
        revoke.add_argument("prefix")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "create":
            try:
                row, key = keys.create_api_key(
                    tenant=None if options["all_tenants"] else options["tenant"],
                    name=options["name"],
                    tasks=_split(options["tasks"]),
                    queues=_split(options["queues"]),
                    max_priority=options["max_priority"],
                )
            except InvalidJob as exc:
                raise CommandError(exc.detail) from None
            scope = "all tenants" if row.all_tenants else f"tenant {row.tenant_id}"
            self.stdout.write(
                f"Created API key {row.prefix} for {scope}. It is shown once; store it now:"
            )
            self.stdout.write(key)
        elif action == "list":
            rows = ApiKey.objects.using(queue_db()).order_by("created_at")
            if not rows:
                self.stdout.write("no API keys")
            for row in rows:
                state = "revoked" if row.revoked_at else "active"
                last = row.last_used_at.isoformat() if row.last_used_at else "never"
                self.stdout.write(
                    f"{row.prefix}  {row.tenant_id or '*all tenants*':<20} {state:<8} "
                    f"last used {last}  {row.name}"
                )
        else:
            try:
                row = keys.revoke_api_key(options["prefix"])
            except ApiKey.DoesNotExist:
                raise CommandError(f"no API key with prefix {options['prefix']!r}") from None
            self.stdout.write(f"revoked {row.prefix}")


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]
