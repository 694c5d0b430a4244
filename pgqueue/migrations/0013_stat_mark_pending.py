from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pgqueue", "0009_finished_by_queue_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="statmark",
            name="pending_attempt_id",
            field=models.BigIntegerField(null=True),
        ),
        migrations.AddField(
            model_name="statmark",
            name="pending_xid",
            field=models.BigIntegerField(null=True),
        ),
    ]
