"""The limit fields of the admin's forms (a tenant's page, a queue's page): a cap, a rate
limit and a pause, validated by ``pgqueue.limits``'s own validators so that a value the
service would refuse is a form error naming the reason, never a 500 at save."""

from __future__ import annotations

from typing import Any

from django import forms

from .. import limits, services
from ..exceptions import InvalidJob
from ..limit_models import MAX_RUNNING_BOUND


def limits_label(lim: dict[str, Any]) -> str:
    """One scope's limits for a table cell: ``1/3 running, 10/m, paused``."""
    parts = []
    if lim.get("max_running") is not None:
        parts.append(f"{lim.get('running', 0)}/{lim['max_running']} running")
    if lim.get("rate_limit"):
        parts.append(lim["rate_limit"])
    if lim.get("paused"):
        parts.append("paused")
    return ", ".join(parts) or "no limit"


def _check(field: str, call: Any, value: Any) -> Any:
    try:
        return call(value)
    except InvalidJob as exc:
        raise forms.ValidationError(f"{field}: {exc.reason}") from None


def clean_max_running(value: int | None) -> int | None:
    return _check("max_running", limits.validate_max_running, value)


def clean_rate(value: str | None) -> str | None:
    value = (value or "").strip() or None
    _check("rate_limit", limits.parse_rate, value)
    return value


def max_running_field(**kwargs: Any) -> forms.IntegerField:
    return forms.IntegerField(
        required=False,
        help_text=f"Most jobs running at once: 1 to {MAX_RUNNING_BOUND:,}; empty for no cap.",
        **kwargs,
    )


def rate_field(**kwargs: Any) -> forms.CharField:
    return forms.CharField(
        required=False,
        max_length=32,
        help_text='Most starts per period: "N/s", "N/m" or "N/h"; empty for none.',
        **kwargs,
    )


class ScopeLimitsForm(forms.Form):
    """A scope's three limits; the form's initial values are the scope's now, so that
    ``changed_data`` names only what the operator changed (and only that is set)."""

    max_running = max_running_field()
    rate_limit = rate_field()
    paused = forms.BooleanField(
        required=False, help_text="No job of it starts until resumed; running ones finish."
    )

    def clean_max_running(self) -> int | None:
        return clean_max_running(self.cleaned_data.get("max_running"))

    def clean_rate_limit(self) -> str | None:
        return clean_rate(self.cleaned_data.get("rate_limit"))

    def limit_changes(self) -> dict[str, Any]:
        """The keyword arguments of ``limits.set_limits`` for what changed."""
        return {
            name: self.cleaned_data[name]
            for name in ("max_running", "rate_limit", "paused")
            if name in self.changed_data
        }


class QueueOverrideForm(forms.Form):
    """A tenant's limits in one queue: the three fields replace that queue's, as
    PUT /tenants/<name> with ``queue`` does."""

    override_queue = forms.CharField(
        required=False,
        max_length=64,
        label="Queue",
        help_text="Set the tenant's limits in this queue (the three fields below replace "
        "those listed above for it); empty: no change.",
    )
    override_max_running = max_running_field(label="Max running in the queue")
    override_rate_limit = rate_field(label="Rate limit in the queue")
    override_paused = forms.BooleanField(required=False, label="Paused in the queue")

    def clean_override_queue(self) -> str | None:
        queue = (self.cleaned_data.get("override_queue") or "").strip()
        return (
            _check("queue", lambda q: services.validate_name(q, "queue"), queue) if queue else None
        )

    def clean_override_max_running(self) -> int | None:
        return clean_max_running(self.cleaned_data.get("override_max_running"))

    def clean_override_rate_limit(self) -> str | None:
        return clean_rate(self.cleaned_data.get("override_rate_limit"))

    def check_override(self, data: dict[str, Any]) -> None:
        """Limits in one queue need the queue: called by the form's ``clean``."""
        given = data.get("override_max_running") is not None or data.get("override_rate_limit")
        if (given or data.get("override_paused")) and not data.get("override_queue"):
            self.add_error("override_queue", "Name the queue these limits are for.")

    def override(self) -> dict[str, Any] | None:
        """``limits.set_limits``'s keyword arguments for the queue given, or None."""
        if not self.cleaned_data.get("override_queue"):
            return None
        return {
            "queue": self.cleaned_data["override_queue"],
            "max_running": self.cleaned_data.get("override_max_running"),
            "rate_limit": self.cleaned_data.get("override_rate_limit"),
            "paused": bool(self.cleaned_data.get("override_paused")),
        }
