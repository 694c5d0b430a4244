"""What the pgqueue admins share: list pagination that never counts a whole table, the
operator's report of an action, JSON display, timestamps to the second, the column filter
and the view-only base."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils import dateformat, timezone
from django.utils.functional import cached_property
from django.utils.html import format_html

from .. import reads

#: Filtered lists count at most this many rows (pagination shows "N+" past it).
COUNT_BOUND = 10_000


#: A count that stopped at the bound: compares as a number, reads as "N+" (shared with the
#: read side, whose bounded counts the dashboard and the tenant list show the same way).
BoundedCount = reads.BoundedCount


class EstimatedCountPaginator(Paginator):
    """Counts without scanning the whole table.

    Unfiltered, the planner's row estimate for the table (``pg_class.reltuples``) is used
    once it is large; filtered, rows are counted up to COUNT_BOUND and no further.
    """

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if isinstance(qs, QuerySet) and not qs.query.where:
            estimate = reads.row_estimate(qs.model._meta.db_table, using=qs.db)
            if estimate is not None and estimate > COUNT_BOUND:
                return estimate
        if isinstance(qs, QuerySet):
            counted = qs.order_by()[: COUNT_BOUND + 1].count()
            return BoundedCount(counted) if counted > COUNT_BOUND else counted
        return len(qs)


#: How the admin prints a moment: to the second (the project's DATETIME_FORMAT usually stops
#: at the minute, and jobs live for seconds), in the current time zone, named.
TIMESTAMP_FORMAT = "Y-m-d H:i:s T"


def format_timestamp(value: dt.datetime | None) -> str:
    """A moment as every pgqueue admin page prints it, e.g. "2026-12-01 09:47:44 UTC"."""
    if value is None:
        return "—"
    return dateformat.format(timezone.template_localtime(value), TIMESTAMP_FORMAT)


def timestamp(field: str, description: str | None = None) -> Callable[[Any, Any], str]:
    """A column or read-only field showing the datetime ``field`` to the second, sorted by
    it: ``created = timestamp("created_at")`` in a ModelAdmin or inline."""

    def show(self: Any, obj: Any) -> str:
        return format_timestamp(getattr(obj, field))

    show.__name__ = field
    return admin.display(description=description or field.replace("_", " "), ordering=field)(show)


def pretty_json(value: Any) -> str:
    """``value`` as indented JSON; compact when it is nested too deeply for the indenting
    encoder (pure Python, a few frames per level: a payload a thousand levels deep would
    end the page in a RecursionError), and a note when even that cannot show it."""
    try:
        text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    except RecursionError:
        try:
            text = json.dumps(value, ensure_ascii=False)  # the C encoder: no frame per level
        except RecursionError:
            text = "(nested too deeply to show here; GET /jobs/<id> returns it)"
    return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', text)


def report_changes(modeladmin: admin.ModelAdmin, request: Any, verb: str, result: Any) -> None:
    """Tell the operator how many jobs changed, and why the others did not."""
    modeladmin.message_user(request, f"{verb} {len(result.changed)} job(s).", messages.SUCCESS)
    if getattr(result, "requested", None):  # cancel: running jobs are asked to stop
        modeladmin.message_user(
            request,
            f"Asked {len(result.requested)} running job(s) to stop: each ends cancelled "
            "once its worker learns it (at once, or at its next heartbeat).",
            messages.SUCCESS,
        )
    if result.skipped:
        reasons = Counter(
            f"{result.statuses[i]}" if i in result.statuses else "missing" for i in result.skipped
        )
        detail = ", ".join(f"{n} {status}" for status, n in sorted(reasons.items()))
        sample = next(iter(result.skipped.values()))
        modeladmin.message_user(
            request,
            f"Skipped {len(result.skipped)} job(s) ({detail}), e.g. {sample}.",
            messages.WARNING,
        )


class ColumnFilter(admin.SimpleListFilter):
    """Filters on one column, their choices read from a small table, never from the jobs."""

    column = ""

    def choices_of(self) -> Iterable[str]:
        raise NotImplementedError

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [(value, value) for value in self.choices_of()]

    def queryset(self, request: Any, queryset: QuerySet) -> QuerySet:
        return queryset.filter(**{self.column: self.value()}) if self.value() else queryset


class ViewOnlyAdmin(admin.ModelAdmin):
    """Pages to look at: nothing added, changed or deleted through them."""

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False
