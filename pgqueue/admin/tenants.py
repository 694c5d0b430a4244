"""Tenants: their weights (edited in the list, saved through the service layer), backlogs
and share of the last hour's work."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.utils import timezone

from .. import reads, services
from ..models import MAX_WEIGHT, MIN_WEIGHT, Tenant


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


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    form = TenantForm
    list_display = ["name", "weight", "backlog", "running", "done", "dead", "share_last_hour"]
    list_editable = ["weight"]
    search_fields = ["name"]
    ordering = ["name"]
    list_per_page = 50

    def get_queryset(self, request: Any) -> QuerySet:
        # Counts for the tenants of one page (index pgqueue_job_tenant_status), and their
        # share of the jobs done in the last hour (index pgqueue_attempt_finished).
        since = timezone.now() - dt.timedelta(hours=1)
        return reads.tenant_done_share(reads.tenant_counts(super().get_queryset(request)), since)

    def get_readonly_fields(self, request: Any, obj: Any = None) -> list[str]:
        return ["name"] if obj is not None else []

    def get_changelist_form(self, request: Any, **kwargs: Any) -> Any:
        # The list's weight column validates like the change page.
        return super().get_changelist_form(request, form=TenantForm, **kwargs)

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def save_model(self, request: Any, obj: Tenant, form: Any, change: bool) -> None:
        services.set_tenant_weight(obj.name, obj.weight)

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
