from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pgqueue", "0012_limits"),
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
