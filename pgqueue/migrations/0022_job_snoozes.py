"""Snoozes: a handler's ``raise pgqueue.Retry(in_=...)`` puts its job off without spending
an attempt; the job counts them (``snoozes``, bounded by ``PGQUEUE["MAX_SNOOZES"]``) and
the attempt history records each as a 'snoozed' row. The column has a constant default,
so adding it does not rewrite the job table."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pgqueue", "0021_schedule_interval"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="jobattempt",
            name="pgqueue_attempt_outcome_valid",
        ),
        migrations.AddField(
            model_name="job",
            name="snoozes",
            field=models.IntegerField(
                db_default=0, default=0, help_text="snoozes taken (pgqueue.Retry), not attempts"
            ),
        ),
        migrations.AlterField(
            model_name="jobattempt",
            name="outcome",
            field=models.CharField(
                choices=[
                    ("done", "Done"),
                    ("failed", "Failed"),
                    ("lease_expired", "Lease Expired"),
                    ("cancelled", "Cancelled"),
                    ("snoozed", "Snoozed"),
                ],
                max_length=16,
            ),
        ),
        migrations.AlterField(
            model_name="taskstat",
            name="outcome",
            field=models.CharField(
                choices=[
                    ("done", "Done"),
                    ("failed", "Failed"),
                    ("lease_expired", "Lease Expired"),
                    ("cancelled", "Cancelled"),
                    ("snoozed", "Snoozed"),
                ],
                max_length=16,
            ),
        ),
        migrations.AddConstraint(
            model_name="jobattempt",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("outcome__in", ["done", "failed", "lease_expired", "cancelled", "snoozed"])
                ),
                name="pgqueue_attempt_outcome_valid",
            ),
        ),
    ]
