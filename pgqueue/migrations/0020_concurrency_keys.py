"""Concurrency keys (pgqueue.key_models): a job's ``concurrency_key``, its cap
``key_max_running`` and where it stands with its key (``key_state``), and the table of keys
with slots held (``pgqueue_key``).

``gated`` becomes nullable: NULL while a job waits for its key, which keeps it out of both
claim indexes. Every new column is nullable or has a constant default, so none rewrites the
job table; existing jobs have no key.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pgqueue", "0019_limit_room"),
    ]

    operations = [
        migrations.CreateModel(
            name="ConcurrencyKey",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("key", models.CharField(max_length=128)),
                ("running", models.IntegerField()),
            ],
            options={
                "db_table": "pgqueue_key",
            },
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_key",
            field=models.CharField(blank=True, max_length=128, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="key_max_running",
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="key_state",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "none held (its slot given back)"),
                    ("new", "not yet examined: waits for admission"),
                    ("waiting", "waiting for a slot of its key"),
                    ("held", "holding a slot of its key"),
                ],
                db_default="",
                default="",
                max_length=8,
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="gated",
            field=models.BooleanField(db_default=False, default=False, null=True),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("key_state", "new"), ("status", "queued")),
                fields=["id"],
                name="pgqueue_job_key_new",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("key_state", "waiting"), ("status", "queued")),
                fields=["concurrency_key", "id"],
                name="pgqueue_job_key_waiting",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(
                        ("concurrency_key__isnull", True),
                        ("key_max_running__isnull", True),
                        ("key_state", ""),
                    ),
                    models.Q(
                        ("concurrency_key__isnull", False),
                        ("key_max_running__gte", 1),
                        ("key_max_running__lte", 10000),
                    ),
                    _connector="OR",
                ),
                name="pgqueue_job_key_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(("key_state__in", ["", "new", "waiting", "held"])),
                name="pgqueue_job_key_state_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("gated__isnull", True), ("key_state__in", ["new", "waiting"])),
                    models.Q(
                        ("gated__isnull", False),
                        models.Q(("key_state__in", ["new", "waiting"]), _negated=True),
                    ),
                    _connector="OR",
                ),
                name="pgqueue_job_gated_unless_key_waits",
            ),
        ),
        migrations.AddConstraint(
            model_name="concurrencykey",
            constraint=models.UniqueConstraint(fields=("key",), name="pgqueue_key_uniq"),
        ),
        migrations.AddConstraint(
            model_name="concurrencykey",
            constraint=models.CheckConstraint(
                condition=models.Q(("running__gt", 0)), name="pgqueue_key_running"
            ),
        ),
    ]
