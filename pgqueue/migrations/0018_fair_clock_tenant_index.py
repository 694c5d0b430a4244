from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built concurrently: every enqueue writes pgqueue_fair_clock, and a plain CREATE
    # INDEX would hold them all back for as long as it reads the table.
    atomic = False

    dependencies = [
        ("pgqueue", "0017_job_lost_claims"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="fairclock",
            index=models.Index(fields=["tenant", "queue"], name="pgqueue_fair_clock_tenant"),
        ),
    ]
