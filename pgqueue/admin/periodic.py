"""Periodic schedules: those the code declares and those created here, when each runs next,
their on/off switch, and "run now".

A schedule created here (source "admin") is the operator's: added, changed and deleted on
its pages. One declared in code (source "code") is shown read-only: the code owns it and
each worker's start-up copies it again, so only its switch is the operator's. Every change
goes through ``pgqueue.schedules`` (``create_schedule``, ``update_schedule``,
``delete_schedule``, ``set_periodic_enabled``, ``run_schedule_now``), which validates as an
enqueue does; the form shows what it refuses on the field, never a row write here.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms.fields import InvalidJSONInput
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from .. import schedules
from ..conf import pgqueue_settings
from ..exceptions import InvalidJob, PgQueueError
from ..models import PeriodicSchedule
from ..periodic_models import Missed, Source
from ..registry import registered_tasks
from .common import pretty_json, timestamp

#: What the page of a schedule declared in code says about who changes what.
CODE_OWNED = (
    "Declared in code (@pgqueue.periodic or PGQUEUE['PERIODIC']): each worker copies it here "
    "when it starts, so change it in the code. Its on/off switch is yours (the Enable and "
    "Disable actions of the list), and a deploy never undoes it; Run now enqueues one job of "
    "it without moving its next run."
)
ADMIN_OWNED = (
    "A schedule created here is yours to change or delete. Workers' start-ups leave it "
    "alone, unless the code comes to declare a schedule of the same name: the code's then "
    "replaces it (and the admin refuses a name the code declares now)."
)


#: The page of a schedule of the code: what it is (read-only), then how it ran.
CODE_SCHEDULE_FIELDS = ["name", "task", "cadence", "zone", "missed", "job_payload", "tenant",
                        "queue", "priority", "max_attempts"]  # fmt: skip
RUN_FIELDS = ["defined_in", "state", "next_run", "last_run", "last_job", "created", "updated"]


def task_choices() -> list[tuple[str, str]]:
    """The tasks this process knows, by name (a schedule can only run one of them)."""
    return [(name, name) for name in sorted(registered_tasks())]


class IntervalField(forms.CharField):
    """An interval typed as ``30s``, ``5m``, ``1h 30m``, ``2d`` (or seconds); shown so."""

    def prepare_value(self, value: Any) -> Any:
        return schedules.format_every(value) if isinstance(value, dt.timedelta) else value

    def to_python(self, value: Any) -> dt.timedelta | None:
        text = super().to_python(value)
        if not text:
            return None
        try:
            every = schedules.parse_every(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc).capitalize() + ".") from None
        try:  # its bounds here too: an error on the field, whatever else the form lacks
            return schedules.check_interval(every, "")
        except schedules.InvalidSchedule as exc:
            raise forms.ValidationError(exc.reason[:1].upper() + exc.reason[1:] + ".") from None


class PayloadField(forms.JSONField):
    """JSON, refusing text nested too deeply for the parser (a form error, not a 500)."""

    def prepare_value(self, value: Any) -> Any:
        return "" if value is None else super().prepare_value(value)  # no payload: empty

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except RecursionError:
            raise forms.ValidationError("The payload is nested too deeply.") from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except RecursionError:  # shown again as it was typed
            return InvalidJSONInput(data)


class ScheduleForm(forms.ModelForm):
    """A schedule of the admin's: checked by ``pgqueue.schedules`` as the save will be, so
    what the service would refuse is an error on its field. The fields left empty take
    the task's defaults, as an enqueue's do; the saved schedule shows what they became."""

    task = forms.ChoiceField(choices=task_choices, help_text="A task the workers run.")
    cron = forms.CharField(
        required=False,
        max_length=200,
        help_text="Five fields (minute hour day-of-month month day-of-week), e.g. "
        '"*/5 * * * *" or "30 2 * * 1-5". Give a cron or an interval, not both.',
    )
    every = IntervalField(
        required=False, label="Every", widget=forms.TextInput(attrs={"maxlength": 32})
    )
    timezone = forms.CharField(
        required=False,
        label="Time zone",
        max_length=64,
        help_text="Cron only: the wall clock its ticks follow (e.g. Europe/Paris); empty: "
        "settings.TIME_ZONE.",
    )
    payload = PayloadField(required=False, help_text="JSON; each job's payload.")
    tenant = forms.CharField(max_length=64, help_text="The tenant each job is enqueued for.")
    queue = forms.CharField(required=False, max_length=64, help_text="Empty: the task's queue.")
    priority = forms.IntegerField(
        required=False, help_text="-100 to 100 (higher first); empty: the task's, else 0."
    )
    max_attempts = forms.IntegerField(
        required=False, help_text="1 to 100; empty: the task's, else the default."
    )
    missed = forms.ChoiceField(
        choices=Missed.choices,
        initial=Missed.RUN_ONCE,
        help_text="Ticks passed while no worker ran: one job for the latest (run_once) or "
        "none (skip).",
    )
    enabled = forms.BooleanField(required=False, initial=True)

    class Meta:
        model = PeriodicSchedule
        fields = ["name", "task", "cron", "every", "timezone", "payload", "tenant", "queue",
                  "priority", "max_attempts", "missed", "enabled"]  # fmt: skip

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        low = schedules.min_interval().total_seconds()
        self.fields["every"].help_text = (
            f'An interval instead of a cron: "30s", "5m", "1h 30m", "2d" (whole seconds, '
            f"{low:g} s to 365 days). Its runs fall on the multiples of the interval since "
            "1970-01-01 00:00 UTC: every hour on the hour, every day at 00:00 UTC."
        )
        if self.instance.pk is None:
            self.initial.setdefault("tenant", pgqueue_settings.DEFAULT_TENANT)
        else:
            if self.instance.every is not None:
                self.initial["timezone"] = ""  # counted in UTC; the field is cron's
            task = self.instance.task
            if task and task not in registered_tasks():  # kept visible, refused on save
                self.fields["task"].choices = [*task_choices(), (task, f"{task} (unknown)")]
        self.schedule: schedules.Schedule | None = None

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:  # a field's own error first: the service would repeat or hide it
            return data
        schedule = schedules.Schedule(
            name=self.instance.name if self.instance.pk else data.get("name", ""),
            task=data["task"],
            cron=(data.get("cron") or "").strip() or None,
            every=data.get("every"),
            tenant=data.get("tenant"),
            queue=data.get("queue") or None,
            priority=data.get("priority"),
            max_attempts=data.get("max_attempts"),
            payload=data.get("payload"),
            missed=data.get("missed") or Missed.RUN_ONCE,
            timezone=(data.get("timezone") or "").strip() or None,
        )
        try:
            if self.instance.pk is None:
                row = schedules.check_new_schedule(schedule)
            else:
                row = schedules.resolve(schedule, dt.datetime.now(dt.UTC))
        except InvalidJob as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.reason)
            return data
        self.schedule = schedule
        # What will be stored, for the model's own checks (and the page after the save).
        every = row["every_seconds"]
        data.update(
            cron=row["cron"],
            every=None if every is None else dt.timedelta(seconds=every),
            timezone=row["timezone"],
            tenant=row["tenant"],
            queue=row["queue"],
            priority=row["priority"],
            max_attempts=row["max_attempts"],
        )
        return data


@admin.register(PeriodicSchedule)
class PeriodicScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    list_display = [
        "name",
        "cadence",
        "zone",
        "task",
        "tenant",
        "queue",
        "defined_in",
        "state",
        "next_run",
        "last_run",
        "last_job",
    ]
    list_filter = ["enabled", "source"]
    search_fields = ["name", "task"]
    ordering = ["name"]
    list_per_page = 100
    actions = ["enable", "disable", "run_now"]

    next_run = timestamp("next_run_at", "next run")
    last_run = timestamp("last_run_at", "last run")
    created = timestamp("created_at")
    updated = timestamp("updated_at")

    # -- who may do what -------------------------------------------------------------------

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        # The list and its actions need "change"; a schedule of the code's page is read-only.
        if obj is not None and obj.source != Source.ADMIN:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        # A live schedule of the code would come back at the next start-up.
        if obj is not None and obj.source != Source.ADMIN and obj.removed_at is None:
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # ``action_location`` is Django 6.1's (named so that it passes it); 5.2 has none.
        if action_location is None:
            actions = super().get_actions(request)
        else:
            actions = super().get_actions(request, action_location=action_location)
        actions.pop("delete_selected", None)  # one at a time, on a schedule's page
        return actions

    # -- the pages -------------------------------------------------------------------------

    def get_form(self, request: Any, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is not None and obj.source != Source.ADMIN:
            kwargs["form"] = forms.ModelForm  # shown, never submitted
        return super().get_form(request, obj, change, **kwargs)

    def get_fieldsets(self, request: Any, obj: Any = None) -> list[tuple[str | None, dict]]:
        if obj is not None and obj.source != Source.ADMIN:
            return [
                (None, {"fields": CODE_SCHEDULE_FIELDS, "description": CODE_OWNED}),
                ("Runs", {"fields": RUN_FIELDS}),
            ]
        fieldsets: list[tuple[str | None, dict]] = [
            (None, {"fields": ["name", "task", "enabled"], "description": ADMIN_OWNED}),
            ("When", {"fields": ["cron", "timezone", "every", "missed"]}),
            ("Each job", {"fields": ["payload", "tenant", "queue", "priority", "max_attempts"]}),
        ]
        if obj is not None:
            fieldsets.append(("Runs", {"fields": RUN_FIELDS}))
        return fieldsets

    def get_readonly_fields(self, request: Any, obj: Any = None) -> list[str]:
        if obj is None:
            return []
        if obj.source != Source.ADMIN:
            return [*CODE_SCHEDULE_FIELDS, *RUN_FIELDS]
        return ["name", *RUN_FIELDS]

    # -- saving, through pgqueue.schedules ---------------------------------------------------

    def save_model(self, request: Any, obj: PeriodicSchedule, form: Any, change: bool) -> None:
        schedule = form.schedule
        enabled = bool(form.cleaned_data.get("enabled"))
        try:
            if change:
                schedules.update_schedule(obj.name, schedule, enabled=enabled)
            else:
                obj.pk = schedules.create_schedule(schedule, enabled=enabled)
        except PgQueueError as exc:  # changed meanwhile (a name taken, code took it over)
            request.pgqueue_not_saved = str(exc)

    def delete_model(self, request: Any, obj: PeriodicSchedule) -> None:
        try:
            schedules.delete_schedule(obj.name)
        except PgQueueError as exc:
            self.message_user(request, f"Not deleted: {exc}", messages.ERROR)

    def log_addition(self, request: Any, obj: Any, message: Any) -> Any:
        if not hasattr(request, "pgqueue_not_saved"):
            return super().log_addition(request, obj, message)
        return None

    def log_change(self, request: Any, obj: Any, message: Any) -> Any:
        if not hasattr(request, "pgqueue_not_saved"):
            return super().log_change(request, obj, message)
        return None

    def response_add(
        self, request: HttpRequest, obj: Any, post_url_continue: str | None = None
    ) -> HttpResponse:
        return self._not_saved(request) or super().response_add(request, obj, post_url_continue)

    def response_change(self, request: HttpRequest, obj: Any) -> HttpResponse:
        return self._not_saved(request) or super().response_change(request, obj)

    def _not_saved(self, request: HttpRequest) -> HttpResponse | None:
        problem = getattr(request, "pgqueue_not_saved", None)
        if problem is None:
            return None
        self.message_user(request, f"Not saved: {problem}", messages.ERROR)
        return HttpResponseRedirect(reverse("admin:pgqueue_periodicschedule_changelist"))

    # -- columns ---------------------------------------------------------------------------

    @admin.display(description="schedule")
    def cadence(self, obj: PeriodicSchedule) -> str:
        if obj.every is not None:
            return f"every {schedules.format_every(obj.every)}"
        return obj.cron or "—"

    @admin.display(description="time zone", ordering="timezone")
    def zone(self, obj: PeriodicSchedule) -> str:
        return "—" if obj.every is not None else obj.timezone  # intervals count in UTC

    @admin.display(description="defined in", ordering="source")
    def defined_in(self, obj: PeriodicSchedule) -> str:
        return "code" if obj.source == Source.CODE else "admin"

    @admin.display(description="state", ordering="enabled")
    def state(self, obj: PeriodicSchedule) -> str:
        if obj.removed_at is not None:
            label, colour = "removed from code", "#6c757d"
        elif not obj.enabled:
            label, colour = "disabled", "#dc3545"
        else:
            label, colour = "enabled", "#198754"
        return format_html('<b style="color:{}">{}</b>', colour, label)

    @admin.display(description="payload")
    def job_payload(self, obj: PeriodicSchedule) -> str:
        return pretty_json(obj.payload)

    @admin.display(description="last job")
    def last_job(self, obj: PeriodicSchedule) -> str:
        if obj.last_job_id is None:
            return "-"
        url = reverse("admin:pgqueue_job_change", args=[obj.last_job_id])
        return format_html('<a href="{}">{}</a>', url, obj.last_job_id)

    # -- actions ---------------------------------------------------------------------------

    def _switch(self, request: Any, queryset: QuerySet, enabled: bool) -> None:
        changed = 0
        for name in queryset.values_list("name", flat=True):
            with contextlib.suppress(schedules.ScheduleNotFound):  # deleted meanwhile
                changed += schedules.set_periodic_enabled(name, enabled)
        verb = "Enabled" if enabled else "Disabled"
        self.message_user(request, f"{verb} {changed} schedule(s).", messages.SUCCESS)

    @admin.action(description="Enable the selected schedules", permissions=["change"])
    def enable(self, request: Any, queryset: QuerySet) -> None:
        self._switch(request, queryset, True)

    @admin.action(description="Disable the selected schedules", permissions=["change"])
    def disable(self, request: Any, queryset: QuerySet) -> None:
        self._switch(request, queryset, False)

    @admin.action(
        description="Run the selected schedules now (one job each; next runs unchanged)",
        permissions=["change"],
    )
    def run_now(self, request: Any, queryset: QuerySet) -> None:
        enqueued: list[tuple[str, int]] = []
        for name in queryset.order_by("name").values_list("name", flat=True):
            try:
                enqueued.append((name, schedules.run_schedule_now(name)))
            except PgQueueError as exc:
                self.message_user(request, f"{name}: not run: {exc}", messages.WARNING)
        if enqueued:
            links = format_html_join(
                ", ",
                '<a href="{}">job {}</a> ({})',
                (
                    (reverse("admin:pgqueue_job_change", args=[job_id]), job_id, name)
                    for name, job_id in enqueued
                ),
            )
            self.message_user(request, format_html("Enqueued {} job(s): {}.", len(enqueued), links))
