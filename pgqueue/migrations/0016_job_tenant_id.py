from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built concurrently: on a job table that has run for a year, a plain CREATE INDEX
    # would block enqueues and claims for as long as it takes to read every row.
    atomic = False

    dependencies = [
        ("pgqueue", "0015_all_tenants_key_permission"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(fields=["tenant", "id"], name="pgqueue_job_tenant_id"),
        ),
    ]
