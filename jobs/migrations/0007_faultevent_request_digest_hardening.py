# Issue 25 (hardening): an Idempotency-Key is bound to a digest of the report it came with. Nullable, so the
# previous release (which does not know the column) keeps inserting faults while this applies.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0006_runtime_snapshot_reports"),
    ]

    operations = [
        migrations.AddField(
            model_name="faultevent",
            name="request_digest",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
    ]
