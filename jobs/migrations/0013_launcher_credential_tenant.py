# A launcher credential is bound to a tenant (issue 54, H1): a credential every tenant's job scripts held could
# register any tenant's job on a shared cluster. Credentials of a cluster dedicated to one tenant take that tenant;
# those of shared clusters stay cluster-wide, which register only where jobs prove themselves (a job secret).

import django.db.models.deletion
from django.db import migrations, models


def bind_dedicated(apps, schema_editor):
    LauncherCredential = apps.get_model("jobs", "LauncherCredential")
    for credential in LauncherCredential.objects.filter(
        cluster__dedicated_tenant__isnull=False
    ).select_related("cluster"):
        credential.tenant_id = credential.cluster.dedicated_tenant_id
        credential.save(update_fields=["tenant"])


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0012_drain_fault_kind"),
        ("tenancy", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="launchercredential",
            name="tenant",
            field=models.ForeignKey(
                blank=True,
                help_text="the tenant whose jobs it registers; empty: cluster-wide (needs job secrets)",
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="launcher_credentials",
                to="tenancy.tenant",
            ),
        ),
        migrations.RunPython(bind_dedicated, migrations.RunPython.noop),
    ]
