"""API keys: created (the key shown once), scoped and revoked through ``keys``."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.cache import add_never_cache_headers, patch_cache_control

from .. import keys
from ..exceptions import InvalidJob
from ..models import ApiKey
from .common import timestamp

#: The page that shows a new key, once: the response to the add form's POST.
CREATED_TEMPLATE = "admin/pgqueue/apikey/created.html"


class NameListField(forms.CharField):
    """A list of names typed as ``a, b``; empty is the empty list (no limit)."""

    def prepare_value(self, value: Any) -> Any:
        return ", ".join(value) if isinstance(value, list) else value

    def to_python(self, value: Any) -> list[str]:
        text = super().to_python(value) or ""
        return [part.strip() for part in text.split(",") if part.strip()]


#: What a tenant key lets its holder do to its tenant's jobs (enqueue, read, cancel and
#: retry): a staff user must be allowed all of it to hand out such a key.
TENANT_KEY_PERMISSIONS = ("pgqueue.add_job", "pgqueue.view_job", "pgqueue.change_job")
#: An all-tenants key acts on every tenant, its weights, limits and pauses: only a
#: superuser, or a staff user given this permission, may create one or change its scope.
ALL_TENANTS_PERMISSION = "pgqueue.add_all_tenants_apikey"


def key_refusal(user: Any, all_tenants: bool) -> str | None:
    """Why ``user`` may not create (or rescope) a key of that kind, or None: a staff user
    never hands out a key that can do more than they may themselves."""
    if all_tenants and not user.has_perm(ALL_TENANTS_PERMISSION):
        return (
            "an all-tenants key acts on every tenant: only a superuser, or a user with the "
            f"{ALL_TENANTS_PERMISSION!r} permission, may create or change one; choose a tenant"
        )
    missing = [p for p in TENANT_KEY_PERMISSIONS if not user.has_perm(p)]
    if missing:
        return (
            "a key lets its holder enqueue, read, cancel and retry jobs; you would need "
            f"{', '.join(missing)} to hand that out"
        )
    return None


class ApiKeyForm(forms.ModelForm):
    """The scope fields as comma-separated names, checked as ``keys`` checks them; who
    may create which key, as ``key_refusal`` says (``user``: set by ApiKeyAdmin.get_form)."""

    tasks = NameListField(required=False, help_text="a, b: the only tasks it may enqueue")
    queues = NameListField(required=False, help_text="q1, q2: the only queues it may use")
    user: Any = None

    class Meta:
        model = ApiKey
        fields = ["tenant", "name", "tasks", "queues", "max_priority"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.user is not None:
            existing = self.instance.pk is not None
            all_tenants = (
                self.instance.tenant_id is None if existing else data.get("tenant") is None
            )
            refusal = key_refusal(self.user, all_tenants)
            if refusal:
                self.add_error(None if existing else "tenant", refusal)
                return data
        try:
            keys.validate_scope(
                tasks=data.get("tasks"),
                queues=data.get("queues"),
                max_priority=data.get("max_priority"),
            )
        except InvalidJob as exc:
            field = "max_priority" if exc.field == "priority" else exc.field
            self.add_error(field if field in self.fields else None, exc.reason)
        return data


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Create a key (shown once, on the page that answers the add form), revoke keys, see
    their last use.

    The key goes into that one response's body and nowhere else: not a message (the
    messages framework keeps them in a signed, not encrypted, cookie or in the session
    until the next page reads them), not the session, not the log entry.
    """

    list_display = ["prefix", "scope", "name", "created", "last_used", "revoked"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "name", "tenant__name"]
    form = ApiKeyForm
    fields = ["tenant", "name", "tasks", "queues", "max_priority"]
    actions = ["revoke"]

    created = timestamp("created_at")
    last_used = timestamp("last_used_at", "last used")
    revoked = timestamp("revoked_at")

    def get_form(self, request: Any, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        """The form, knowing who fills it in (a class of its own per request)."""
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"user": request.user})

    def get_readonly_fields(self, request: Any, obj: Any = None) -> list[str]:
        """A key's tenant and name are fixed once it exists; only its scope changes."""
        return ["tenant", "name"] if obj is not None else []

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    @admin.display(description="tenant")
    def scope(self, obj: ApiKey) -> str:
        return obj.tenant_id or "all tenants"

    def save_model(self, request: Any, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            keys.set_api_key_scope(
                obj.prefix, tasks=obj.tasks, queues=obj.queues, max_priority=obj.max_priority
            )
            return
        row, key = keys.create_api_key(
            tenant=obj.tenant_id,
            name=obj.name,
            tasks=obj.tasks,
            queues=obj.queues,
            max_priority=obj.max_priority,
        )
        obj.pk = row.pk
        obj.prefix = row.prefix
        obj.created_at = row.created_at
        # Held by this request's object only, for response_add to print.
        obj._new_key = key  # type: ignore[attr-defined]

    def response_add(
        self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None
    ) -> HttpResponse:
        """The new key, on a page of its own: the only time it is shown."""
        key = getattr(obj, "_new_key", None)
        if key is None:  # not created by save_model: nothing to show
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "title": "API key created",
            "opts": self.opts,
            "row": obj,
            "key": key,
            "scope": self.scope(obj),
        }
        response = TemplateResponse(request, CREATED_TEMPLATE, context)
        add_never_cache_headers(response)
        patch_cache_control(response, no_store=True)
        return response

    @admin.action(description="Revoke the selected API keys", permissions=["change"])
    def revoke(self, request: Any, queryset: QuerySet) -> None:
        prefixes = list(queryset.values_list("prefix", flat=True))
        for prefix in prefixes:
            keys.revoke_api_key(prefix)
        self.message_user(request, f"Revoked {len(prefixes)} key(s).")
