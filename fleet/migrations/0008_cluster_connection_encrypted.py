"""Cluster credentials (``Cluster.connection``) encrypted at rest: the column becomes text holding Fernet
ciphertext, and every existing row is encrypted with the configured key (docs/security.md)."""

import json

from django.db import migrations

import controlplane.security_crypto
from controlplane.security_crypto import FERNET_MARK, encrypt_json, read_stored


def _rows(apps, schema_editor):
    table = schema_editor.connection.ops.quote_name(apps.get_model("fleet", "Cluster")._meta.db_table)
    cursor = schema_editor.connection.cursor()
    cursor.execute(f"SELECT id, connection FROM {table}")  # the raw column: the field would try to decrypt
    return table, cursor, cursor.fetchall()


def encrypt_connections(apps, schema_editor):
    table, cursor, rows = _rows(apps, schema_editor)
    for pk, stored in rows:
        if stored is None or stored.startswith(FERNET_MARK):
            continue  # already encrypted (a rerun)
        cursor.execute(f"UPDATE {table} SET connection = %s WHERE id = %s", [encrypt_json(read_stored(stored)), pk])


def decrypt_connections(apps, schema_editor):
    table, cursor, rows = _rows(apps, schema_editor)
    for pk, stored in rows:
        if stored is not None:
            cursor.execute(f"UPDATE {table} SET connection = %s WHERE id = %s", [json.dumps(read_stored(stored)), pk])


class Migration(migrations.Migration):
    # Changes what the column holds in place (rule 3 of docs/operations.md): the previous release reads the
    # ciphertext where it expects the connection settings, so its workers and web processes stop first.
    needs_downtime = "rewrites fleet_cluster.connection from JSON to Fernet ciphertext in place"

    dependencies = [
        ('fleet', '0007_rollout_cluster_reverting'),
    ]

    operations = [
        migrations.AlterField(
            model_name='cluster',
            name='connection',
            field=controlplane.security_crypto.EncryptedJSONField(blank=True, default=dict),
        ),
        migrations.RunPython(encrypt_connections, decrypt_connections),
    ]
