"""Progress a caller can follow: what a handler reports while it runs (job.progress(),
job.output()), written by its worker's heartbeat rounds. The new columns are NULL, so
adding them rewrites no table."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pgqueue", "0024_observability"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="progress",
            field=models.JSONField(
                blank=True, help_text="the latest progress its handler reported", null=True
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="output",
            field=models.JSONField(
                blank=True, help_text="the latest output its handler reported", null=True
            ),
        ),
    ]
