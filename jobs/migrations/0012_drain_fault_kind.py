# A fault kind for drain requests (jobs.services.drain): choices only, no schema change.

from django.db import migrations, models

KINDS = [
    ("nic_down", "Nic Down"),
    ("link_flap", "Link Flap"),
    ("link_degraded", "Link Degraded"),
    ("gpu_xid", "Gpu Xid"),
    ("ecc_uncorrectable", "Ecc Uncorrectable"),
    ("nvlink_error", "Nvlink Error"),
    ("node_unreachable", "Node Unreachable"),
    ("thermal", "Thermal"),
    ("facility", "Facility"),
    ("straggler", "Straggler"),
    ("predicted_failure", "Predicted Failure"),
    ("software_crash", "Software Crash"),
    ("hang", "Hang"),
    ("drain", "Drain"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0011_job_reports_progress"),
    ]

    operations = [
        migrations.AlterField(
            model_name="faultevent",
            name="kind",
            field=models.CharField(choices=KINDS, max_length=20),
        ),
        migrations.AlterField(
            model_name="incident",
            name="kind",
            field=models.CharField(choices=KINDS, max_length=20),
        ),
    ]
