"""Interval schedules and schedules created in the admin.

A periodic schedule has a cron expression or an interval (``every``, whole seconds), never
both: ``cron`` becomes nullable and a CHECK holds the rule. ``source`` says who owns the
schedule's definition, the code (every existing row: the column's default) or an operator
in the admin. Adding a nullable column and one with a constant default rewrites nothing;
the table holds one row per schedule.
"""

import datetime

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pgqueue", "0020_concurrency_keys"),
    ]

    operations = [
        migrations.AddField(
            model_name="periodicschedule",
            name="every",
            field=models.DurationField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="periodicschedule",
            name="source",
            field=models.CharField(
                choices=[("code", "Code"), ("admin", "Admin")],
                db_default="code",
                default="code",
                max_length=8,
            ),
        ),
        migrations.AlterField(
            model_name="periodicschedule",
            name="cron",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddConstraint(
            model_name="periodicschedule",
            constraint=models.CheckConstraint(
                condition=models.Q(("source__in", ["code", "admin"])),
                name="pgqueue_periodic_source",
            ),
        ),
        migrations.AddConstraint(
            model_name="periodicschedule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("cron__isnull", False), ("every__isnull", True)),
                    models.Q(
                        ("cron__isnull", True),
                        ("every__gt", datetime.timedelta(0)),
                        ("every__isnull", False),
                    ),
                    _connector="OR",
                ),
                name="pgqueue_periodic_cron_or_every",
            ),
        ),
    ]
