"""Workflows: jobs that wait for other jobs. A job with dependencies waits in the new
status 'waiting' (outside every claim and promotion index) until they end; the edges are
rows of pgqueue_job_dependency (upstream < job: no cycle can form); a workflow groups a
tenant's jobs enqueued together. The new job columns are NULL or have a constant default,
so adding them does not rewrite the job table; the status CHECK is replaced to admit
'waiting' (a scan of the table, as every change of that constraint)."""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pgqueue", "0022_job_snoozes"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobDependency",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ],
            options={
                "db_table": "pgqueue_job_dependency",
            },
        ),
        migrations.CreateModel(
            name="Workflow",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(blank=True, default="", max_length=200)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "db_table": "pgqueue_workflow",
            },
        ),
        migrations.RemoveConstraint(
            model_name="job",
            name="pgqueue_job_status_valid",
        ),
        migrations.AddField(
            model_name="job",
            name="failed_upstream_id",
            field=models.BigIntegerField(
                blank=True, help_text="the dependency whose end cancelled this job", null=True
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="run_on_upstream_failure",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name="job",
            name="step",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.AlterField(
            model_name="job",
            name="status",
            field=models.CharField(
                choices=[
                    ("waiting", "Waiting"),
                    ("scheduled", "Scheduled"),
                    ("queued", "Queued"),
                    ("running", "Running"),
                    ("done", "Done"),
                    ("dead", "Dead"),
                    ("cancelled", "Cancelled"),
                ],
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="jobdependency",
            name="job",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="pgqueue.job",
            ),
        ),
        migrations.AddField(
            model_name="jobdependency",
            name="upstream",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="pgqueue.job",
            ),
        ),
        migrations.AddField(
            model_name="workflow",
            name="tenant",
            field=models.ForeignKey(
                db_column="tenant",
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="workflows",
                to="pgqueue.tenant",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="workflow",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="jobs",
                to="pgqueue.workflow",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "waiting")), fields=["id"], name="pgqueue_job_waiting"
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("workflow__isnull", False)),
                fields=["workflow", "id"],
                name="pgqueue_job_workflow",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(
                    ("status__in", ("waiting", "scheduled", "queued", "running")),
                    ("workflow__isnull", False),
                ),
                fields=["workflow"],
                name="pgqueue_job_workflow_live",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "status__in",
                        ["waiting", "scheduled", "queued", "running", "done", "dead", "cancelled"],
                    )
                ),
                name="pgqueue_job_status_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(("step__isnull", False), ("workflow__isnull", False)),
                fields=("workflow", "step"),
                name="pgqueue_job_workflow_step",
            ),
        ),
        migrations.AddIndex(
            model_name="jobdependency",
            index=models.Index(fields=["upstream", "job"], name="pgqueue_job_dep_upstream"),
        ),
        migrations.AddConstraint(
            model_name="jobdependency",
            constraint=models.UniqueConstraint(
                fields=("job", "upstream"), name="pgqueue_job_dep_uniq"
            ),
        ),
        migrations.AddConstraint(
            model_name="jobdependency",
            constraint=models.CheckConstraint(
                condition=models.Q(("upstream__lt", models.F("job"))), name="pgqueue_job_dep_older"
            ),
        ),
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(fields=["tenant", "id"], name="pgqueue_workflow_tenant_id"),
        ),
    ]
