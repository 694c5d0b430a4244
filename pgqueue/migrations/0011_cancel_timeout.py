from django.db import migrations, models


class Migration(migrations.Migration):
    # Two nullable columns without a default: PostgreSQL adds them without rewriting the
    # table or holding its lock for longer than the catalogue change.
    dependencies = [
        ("pgqueue", "0010_job_charge"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="timeout_seconds",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="cancel_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
