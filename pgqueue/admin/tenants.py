"""Tenants: their weights (edited in the list, saved through the service layer), backlogs,
share of the last hour's work, and limits (cap, rate limit, pause; per queue too), edited
on a tenant's page and paused or resumed by actions, through ``pgqueue.limits``."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.utils import timezone

from .. import limits, reads, services
from ..limit_reads import scope_limits
from ..models import MAX_WEIGHT, MIN_WEIGHT, Tenant
from .limit_forms import QueueOverrideForm, ScopeLimitsForm, limits_label


class TenantForm(forms.ModelForm):
    class Meta:
        model = Tenant
        fields = ["name", "weight"]

    def clean_name(self) -> Any:
        name = self.cleaned_data["name"]
        if not isinstance(name, str):  # the list's hidden primary-key field: a Tenant
            return name
        try:
            return services.validate_name(name, "tenant")
        except services.InvalidJob as exc:
            raise forms.ValidationError(exc.reason) from None

    def clean_weight(self) -> float:
        weight = self.cleaned_data["weight"]
        if weight is None or not weight > 0:
            raise forms.ValidationError("The weight must be greater than 0.")
        try:
            return services.validate_weight(weight)
        except services.InvalidJob:
            raise forms.ValidationError(
                f"The weight must be from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}."
            ) from None


class TenantLimitsForm(TenantForm, ScopeLimitsForm, QueueOverrideForm):
    """A tenant's page: its weight, its own limits (initially those it has) and, for one
    queue at a time, its limits there. Saved through ``pgqueue.limits``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            own = scope_limits([self.instance.name]).get(("", self.instance.name))
            if own:
                for name in ("max_running", "rate_limit", "paused"):
                    self.initial[name] = own[name]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        self.check_override(data)
        return data

    def save_limits(self, tenant: str) -> None:
        changes = self.limit_changes()
        if changes:
            limits.set_limits(tenant=tenant, using=self.instance._state.db or "default", **changes)
        override = self.override()
        if override:
            limits.set_limits(tenant=tenant, using=self.instance._state.db or "default", **override)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    form = TenantForm
    list_display = ["name", "weight", "backlog", "running", "cap", "rate", "is_paused",
                    "queue_limits", "done", "dead", "share_last_hour"]  # fmt: skip
    list_editable = ["weight"]
    actions = ["pause_tenants", "resume_tenants"]
    fieldsets = [
        (None, {"fields": ["name", "weight"]}),
        (
            "Limits in every queue",
            {"fields": ["max_running", "rate_limit", "paused", "limit_running"]},
        ),
        (
            "Limits in one queue (on top of the tenant's own)",
            {
                "fields": ["queue_limits", "override_queue", "override_max_running",
                           "override_rate_limit", "override_paused"],
            },
        ),
    ]  # fmt: skip
    search_fields = ["name"]
    ordering = ["name"]
    list_per_page = 50

    def get_queryset(self, request: Any) -> QuerySet:
        # Counts for the tenants of one page (index pgqueue_job_tenant_status), and their
        # share of the jobs done in the last hour (index pgqueue_attempt_finished).
        since = timezone.now() - dt.timedelta(hours=1)
        return reads.tenant_done_share(reads.tenant_counts(super().get_queryset(request)), since)

    def get_readonly_fields(self, request: Any, obj: Any = None) -> list[str]:
        shown = ["limit_running", "queue_limits"]
        return ["name", *shown] if obj is not None else shown

    def get_form(self, request: Any, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        # The page edits the limits too; the list's weight column keeps TenantForm.
        return super().get_form(request, obj, change, form=TenantLimitsForm, **kwargs)

    def get_changelist_instance(self, request: Any) -> Any:
        """The list, with the limits of the page's tenants: one read of pgqueue_limit for
        the page (``limit_reads.scope_limits``), not one per row."""
        changelist = super().get_changelist_instance(request)
        self._attach_limits(list(changelist.result_list))
        return changelist

    def _attach_limits(self, tenants: list[Tenant]) -> None:
        rows = scope_limits([t.name for t in tenants], using=self._db(tenants))
        for tenant in tenants:
            tenant.pgq_limits = rows.get(("", tenant.name))
            tenant.pgq_queue_limits = {
                q: lim for (q, name), lim in sorted(rows.items()) if name == tenant.name and q
            }

    @staticmethod
    def _db(tenants: list[Tenant]) -> str:
        return tenants[0]._state.db if tenants and tenants[0]._state.db else "default"

    def _limits_of(self, obj: Tenant) -> dict[str, Any]:
        if not hasattr(obj, "pgq_limits"):  # a tenant's page: this tenant alone
            self._attach_limits([obj] if obj.pk else [])
        return getattr(obj, "pgq_limits", None) or {}

    def get_changelist_form(self, request: Any, **kwargs: Any) -> Any:
        # The list's weight column validates like the change page.
        return super().get_changelist_form(request, form=TenantForm, **kwargs)

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def save_model(self, request: Any, obj: Tenant, form: Any, change: bool) -> None:
        services.set_tenant_weight(obj.name, obj.weight)
        if isinstance(form, TenantLimitsForm):
            form.save_limits(obj.name)

    @admin.display(description="max running")
    def cap(self, obj: Tenant) -> Any:
        value = self._limits_of(obj).get("max_running")
        return "—" if value is None else value

    @admin.display(description="rate limit")
    def rate(self, obj: Tenant) -> str:
        return self._limits_of(obj).get("rate_limit") or "—"

    @admin.display(description="paused", boolean=True)
    def is_paused(self, obj: Tenant) -> bool:
        return bool(self._limits_of(obj).get("paused"))

    @admin.display(description="counted in its cap now")
    def limit_running(self, obj: Tenant) -> Any:
        """The jobs the claim counted in the tenant's limit row: what its cap is checked
        against (the running column counts every running job of the tenant)."""
        limits_now = self._limits_of(obj)
        return limits_now.get("running", 0) if limits_now else "—"

    @admin.display(description="queue limits")
    def queue_limits(self, obj: Tenant) -> str:
        self._limits_of(obj)
        per_queue = getattr(obj, "pgq_queue_limits", {})
        return "; ".join(f"{q}: {limits_label(lim)}" for q, lim in per_queue.items()) or "—"

    @admin.action(description="Pause the selected tenants (in every queue)", permissions=["change"])
    def pause_tenants(self, request: Any, queryset: QuerySet) -> None:
        self._switch(request, queryset, limits.pause_tenant, "Paused")

    @admin.action(description="Resume the selected tenants", permissions=["change"])
    def resume_tenants(self, request: Any, queryset: QuerySet) -> None:
        self._switch(request, queryset, limits.resume_tenant, "Resumed")

    def _switch(self, request: Any, queryset: QuerySet, call: Any, verb: str) -> None:
        names = list(queryset.values_list("name", flat=True))
        for name in names:
            call(name, using=queryset.db)
        self.message_user(request, f"{verb} {len(names)} tenant(s).", messages.SUCCESS)

    @admin.display(description="backlog", ordering="n_backlog")
    def backlog(self, obj: Tenant) -> int:
        return obj.n_backlog

    @admin.display(description="running", ordering="n_running")
    def running(self, obj: Tenant) -> int:
        return obj.n_running

    @admin.display(description="done", ordering="n_done")
    def done(self, obj: Tenant) -> int:
        return reads.bounded(obj.n_done, reads.count_cap())  # "1000+" past the cap

    @admin.display(description="dead", ordering="n_dead")
    def dead(self, obj: Tenant) -> int:
        return reads.bounded(obj.n_dead, reads.count_cap())

    @admin.display(description="share of work, last hour", ordering="n_hour")
    def share_last_hour(self, obj: Tenant) -> str:
        if not obj.n_hour_total:
            return "—"
        return f"{(obj.n_hour or 0) / obj.n_hour_total:.0%}"
