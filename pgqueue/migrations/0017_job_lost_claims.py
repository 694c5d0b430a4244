"""A job counts the leases it lost before its handler's start was recorded
(``lost_claims``): maintenance gives such a job back without spending an attempt, and
``PGQUEUE["MAX_LOST_CLAIMS"]`` of them make it dead (see JOB_REAP_EXPIRED).

The column has a constant default, so adding it does not rewrite the job table. From
here on a 'lease_expired' attempt row without a ``started_at`` is such a loss, not an
attempt; rows written before this migration counted as one either way.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pgqueue", "0016_job_tenant_id"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="lost_claims",
            field=models.IntegerField(
                db_default=0,
                default=0,
                help_text="leases lost before its start was recorded, not counted as attempts",
            ),
        ),
    ]
