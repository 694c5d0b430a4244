"""The claim's instant gets a column of its own (``claimed_at``, on jobs and attempts), and
``started_at`` / ``finished_at`` become when the handler began and ended.

Rows written before this migration are left as they are (no rewrite of a large table): their
``started_at`` is the claim's instant, which is what it meant then, and their ``claimed_at``
is NULL.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pgqueue", "0013_stat_mark_pending"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="claimed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="jobattempt",
            name="claimed_at",
            field=models.DateTimeField(null=True),
        ),
    ]
