"""Workers record the tasks they serve; weights are bounded to [0.001, 1000]; promotion
finds the levels with due jobs by an index of scheduled jobs by level.

Rows with a weight out of range are clamped to the nearest bound before the constraints
are added, so the migration applies to any database the old constraint (weight > 0)
allowed.
"""

from django.db import migrations, models

CLAMP = """
UPDATE pgqueue_tenant SET weight = LEAST(GREATEST(weight, 0.001), 1000.0)
 WHERE weight < 0.001 OR weight > 1000.0;
UPDATE pgqueue_queue_weight SET weight = LEAST(GREATEST(weight, 0.001), 1000.0)
 WHERE weight < 0.001 OR weight > 1000.0;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("pgqueue", "0006_retention"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "scheduled")),
                fields=["queue", "tenant", "priority", "run_at"],
                name="pgqueue_job_scheduled_level",
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="tasks",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
        migrations.RunSQL(CLAMP, reverse_sql=migrations.RunSQL.noop),
        migrations.RemoveConstraint(
            model_name="tenant",
            name="pgqueue_tenant_weight_gt_0",
        ),
        migrations.AddConstraint(
            model_name="tenant",
            constraint=models.CheckConstraint(
                condition=models.Q(("weight__gte", 0.001), ("weight__lte", 1000.0)),
                name="pgqueue_tenant_weight_range",
            ),
        ),
        migrations.RemoveConstraint(
            model_name="queueweight",
            name="pgqueue_queue_weight_weight_gt_0",
        ),
        migrations.AddConstraint(
            model_name="queueweight",
            constraint=models.CheckConstraint(
                condition=models.Q(("weight__gte", 0.001), ("weight__lte", 1000.0)),
                name="pgqueue_queue_weight_weight_range",
            ),
        ),
    ]
