"""What every operator subcommand shares: ``--json``, the exit codes, the database check."""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import uuid
from collections.abc import Callable
from typing import Any, NoReturn

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import OperationalError, connections
from django.utils.dateparse import parse_datetime

from ..conf import queue_db


class JSONEncoder(json.JSONEncoder):
    """The values the commands print, written as the HTTP API writes them: a datetime in
    ISO 8601 with ``Z`` for UTC and its microseconds, a Decimal as a number. (The core does
    not need DRF; this is the part of its encoder the commands use.)"""

    def default(self, o: Any) -> Any:
        if isinstance(o, dt.datetime):
            text = o.isoformat()
            return text[:-6] + "Z" if text.endswith("+00:00") else text
        if isinstance(o, dt.date | dt.time):
            return o.isoformat()
        if isinstance(o, dt.timedelta):
            return str(o.total_seconds())
        if isinstance(o, decimal.Decimal):
            return float(o)
        if isinstance(o, uuid.UUID):
            return str(o)
        return super().default(o)


#: Exit codes. argparse exits 2 for a usage error of its own; the commands use 2 too when
#: the service layer refuses an argument (a weight of 0, an invalid tenant name).
EXIT_OK = 0
EXIT_SKIPPED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

EXIT_CODES_HELP = (
    "exit codes: 0 success; 1 some of the given jobs were skipped (wrong status) or do not "
    "exist, or the job to show does not exist; 2 usage error (a bad option or argument); "
    "3 the database cannot be reached."
)

#: Bounds of ``--limit`` (those of the HTTP API's lists).
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
#: The largest job id PostgreSQL's bigint holds.
MAX_ID = 2**63 - 1


class OperatorCommand(BaseCommand):
    """One subcommand: its options in ``add_options``, its work in ``run``, which returns
    an exit code.

    ``handle`` reaches the database first, so that an unreachable one is exit 3 with one
    line on stderr, not a traceback from the first query. Results go to stdout (one JSON
    document with ``--json``, else tables); errors and skipped jobs go to stderr.
    """

    #: The subcommand's name: ``manage.py pgqueue <name>``.
    name: str = ""
    # The pgqueue command that dispatches here has run the system checks already.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.epilog = EXIT_CODES_HELP
        parser.add_argument(
            "--json", action="store_true", help="print one JSON document on stdout, for scripts"
        )
        parser.add_argument(
            "--database",
            choices=list(settings.DATABASES),
            default=None,
            help='the database alias (default: PGQUEUE["DATABASE"])',
        )
        self.add_options(parser)

    def add_options(self, parser: CommandParser) -> None:
        """The subcommand's own options and arguments."""

    def run(self, options: dict[str, Any]) -> int:
        """Do the work and return the exit code: what ``handle`` exits with."""
        raise NotImplementedError

    def handle(self, *args: Any, **options: Any) -> None:
        self.using = queue_db(options["database"])
        try:
            connections[self.using].ensure_connection()
        except OperationalError as exc:
            # psycopg's message spans lines: one line here, as the worker logs it.
            reason = " ".join(str(exc).split()) or type(exc).__name__
            self.fail(EXIT_UNREACHABLE, f"cannot reach the database: {reason}")
        code = self.run(options)
        if code != EXIT_OK:
            raise SystemExit(code)

    # -- output --------------------------------------------------------------------------

    def emit(self, options: dict[str, Any], document: Any, human: Callable[[], str]) -> None:
        """``document`` as JSON with ``--json`` (datetimes as the HTTP API writes them),
        else the text ``human`` returns."""
        if options["json"]:
            self.stdout.write(json.dumps(document, cls=JSONEncoder, indent=2))
        else:
            self.stdout.write(human())

    def warn(self, message: str) -> None:
        self.stderr.write(f"pgqueue {self.name}: {message}")

    def fail(self, code: int, message: str) -> NoReturn:
        self.warn(message)
        raise SystemExit(code)


# -- argument types ----------------------------------------------------------------------


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not from {low} to {high}")
        return value

    parse.__name__ = "integer"
    return parse


job_id = bounded_int(1, MAX_ID)
job_id.__name__ = "job id"


def matching(pattern: Any, what: str) -> Callable[[str], str]:
    """An argparse type: a name the service layer would accept (``pattern``)."""

    def parse(text: str) -> str:
        if not pattern.match(text):
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {what} name")
        return text

    parse.__name__ = f"{what} name"
    return parse


def moment(text: str) -> dt.datetime:
    """An argparse type: an ISO-8601 date and time, as GET /jobs reads one (naive is UTC)."""
    try:
        parsed = parse_datetime(text)
    except ValueError:  # well-formed but impossible, e.g. February 30th
        parsed = None
    if parsed is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO-8601 date and time")
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=dt.UTC)
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range") from None


moment.__name__ = "date and time"


def limit_option(parser: CommandParser, what: str) -> None:
    parser.add_argument(
        "--limit",
        type=bounded_int(1, MAX_LIMIT),
        default=DEFAULT_LIMIT,
        help=f"show at most this many {what}: 1 to {MAX_LIMIT}, default {DEFAULT_LIMIT}",
    )
