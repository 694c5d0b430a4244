"""API keys: created (the key shown once) and revoked through the service layer."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet

from .. import keys
from ..models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Create a key (shown once, in a message), revoke keys, see their last use."""

    list_display = ["prefix", "scope", "name", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "name", "tenant__name"]
    fields = ["tenant", "name"]
    actions = ["revoke"]

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    @admin.display(description="tenant")
    def scope(self, obj: ApiKey) -> str:
        return obj.tenant_id or "all tenants"

    def save_model(self, request: Any, obj: ApiKey, form: Any, change: bool) -> None:
        row, key = keys.create_api_key(tenant=obj.tenant_id, name=obj.name)
        obj.pk = row.pk
        obj.prefix = row.prefix
        self.message_user(
            request,
            f"API key {row.prefix} created. It is shown only now; store it: {key}",
            messages.WARNING,
        )

    @admin.action(description="Revoke the selected API keys", permissions=["change"])
    def revoke(self, request: Any, queryset: QuerySet) -> None:
        prefixes = list(queryset.values_list("prefix", flat=True))
        for prefix in prefixes:
            keys.revoke_api_key(prefix)
        self.message_user(request, f"Revoked {len(prefixes)} key(s).")
