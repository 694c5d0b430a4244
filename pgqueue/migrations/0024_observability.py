"""Seeing inside: the enqueuing code's W3C trace context on each job (traceparent,
tracestate: pgqueue.tracing), when each attempt became runnable (due_at: the wait a tenant
saw is started_at - due_at), and the per-queue, per-tenant totals of those waits and of run
times that maintenance folds for /metrics (pgqueue_tenant_stat). The new columns are NULL,
so adding them rewrites no table."""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pgqueue", "0023_workflows"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="traceparent",
            field=models.CharField(
                blank=True,
                help_text="the W3C trace context it was enqueued in: its attempts' spans are children",
                max_length=55,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="tracestate",
            field=models.CharField(blank=True, max_length=512, null=True),
        ),
        migrations.AddField(
            model_name="jobattempt",
            name="due_at",
            field=models.DateTimeField(null=True),
        ),
        migrations.CreateModel(
            name="TenantStat",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("queue", models.CharField(max_length=64)),
                ("tenant", models.CharField(blank=True, max_length=64)),
                ("kind", models.CharField(help_text="wait or run", max_length=8)),
                ("le", models.FloatField(help_text="the bucket's upper bound, in seconds")),
                ("count", models.BigIntegerField(default=0)),
                ("seconds", models.FloatField(default=0.0)),
                (
                    "folded_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "db_table": "pgqueue_tenant_stat",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("queue", "tenant", "kind", "le"), name="pgqueue_tenant_stat_uniq"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("kind__in", ["wait", "run"])),
                        name="pgqueue_tenant_stat_kind_valid",
                    ),
                ],
            },
        ),
    ]
