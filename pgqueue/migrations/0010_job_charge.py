from django.db import migrations, models


class Migration(migrations.Migration):
    # A nullable column without a default: PostgreSQL adds it without rewriting the table.
    dependencies = [
        ("pgqueue", "0009_finished_by_queue_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="charge",
            field=models.FloatField(
                blank=True, null=True, help_text="run time charged, in seconds"
            ),
        ),
    ]
