"""The HTTP API's credentials (pgqueue.keys creates, checks and revokes them).

Kept apart from ``models`` (imported at its end, so Django registers it with the app).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class ApiKey(models.Model):
    """A credential for the HTTP API, bound to one tenant or (tenant NULL) to all of them.

    Only a SHA-256 hash of the key is stored: keys are 256-bit random tokens, so a fast
    hash is as safe as a slow one and costs nothing per request. The key itself is shown
    once, when it is created; ``prefix`` identifies it afterwards (listing, revoking).
    """

    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    tenant = models.ForeignKey(
        "pgqueue.Tenant",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        db_column="tenant",
        related_name="api_keys",
        help_text="The only tenant this key may act as; empty for an all-tenants key.",
    )
    name = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # The key's scope, narrower than what its tenant and PGQUEUE["API_TASKS"] allow.
    tasks = models.JSONField(
        default=list, blank=True, help_text="Task names it may enqueue; empty: every API task."
    )
    queues = models.JSONField(
        default=list, blank=True, help_text="Queues it may use and see; empty: every queue."
    )
    max_priority = models.SmallIntegerField(
        null=True,
        blank=True,
        help_text="Highest priority it may set; empty: TENANT_MAX_PRIORITY for a tenant key, "
        "100 for an all-tenants key.",
    )

    class Meta:
        db_table = "pgqueue_api_key"
        verbose_name = "API key"
        permissions = [
            # An all-tenants key does what a superuser's session does to every tenant
            # (weights, limits, pauses, every job): the admin lets a staff user create one
            # only with this permission (pgqueue.admin.keys).
            ("add_all_tenants_apikey", "Can create and change all-tenants API keys"),
        ]

    def __str__(self) -> str:
        scope = self.tenant_id or "all tenants"
        return f"{self.prefix} ({scope})"

    @property
    def all_tenants(self) -> bool:
        return self.tenant_id is None

    @property
    def active(self) -> bool:
        return self.revoked_at is None
