"""Interval schedules (placeholder until the schedule change lands; no operations yet)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("pgqueue", "0020_concurrency_keys"),
    ]

    operations = []
