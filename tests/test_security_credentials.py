"""Cluster credentials are encrypted at rest: the column holds Fernet ciphertext, drivers get the plain settings,
keys rotate, and rows from before the migration are read and then encrypted."""

import json
from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from controlplane.security_crypto import CredentialsUnreadable
from fleet.drivers import driver_for
from fleet.drivers.kubernetes import KubernetesDriver
from fleet.models import Cluster
from tests.support.factories import make_cluster, make_fleet

pytestmark = pytest.mark.django_db

SECRET = {"kubeconfig": "/etc/lockstep/c1.yaml", "context": "c1", "token": "s3cr3t-bearer-of-the-cluster"}


def raw_column(cluster_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT connection FROM fleet_cluster WHERE id = %s", [cluster_id])
        return cursor.fetchone()[0]


def write_raw(cluster_id: int, text: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE fleet_cluster SET connection = %s WHERE id = %s", [text, cluster_id])


def test_the_column_holds_ciphertext_and_the_driver_gets_the_plain_settings(monkeypatch):
    cluster = make_cluster(driver="kubernetes", connection=SECRET)
    stored = raw_column(cluster.pk)
    assert stored.startswith("gAAAAA")  # a Fernet token
    assert "s3cr3t" not in stored and "kubeconfig" not in stored and "c1.yaml" not in stored

    seen = {}
    monkeypatch.setattr(
        KubernetesDriver, "core_api_factory", staticmethod(lambda conn: seen.update(conn) or object())
    )
    driver = driver_for(Cluster.objects.get(pk=cluster.pk))
    assert driver.connection == SECRET
    driver.core  # noqa: B018 - builds the Kubernetes client from the credentials
    assert seen == SECRET


def test_every_write_encrypts_anew_and_an_empty_mapping_is_encrypted_too():
    cluster = make_cluster()
    empty = raw_column(cluster.pk)
    assert empty.startswith("gAAAAA") and Cluster.objects.get(pk=cluster.pk).connection == {}
    cluster.connection = SECRET
    cluster.save()
    first = raw_column(cluster.pk)
    Cluster.objects.filter(pk=cluster.pk).update(connection=SECRET)
    assert raw_column(cluster.pk) != first  # a fresh IV each time: equal secrets do not look equal
    assert Cluster.objects.get(pk=cluster.pk).connection == SECRET


def test_the_api_stores_posted_credentials_encrypted(api, users):
    fleet = make_fleet()
    api.as_token(users["provider-admin"])
    response = api.post(
        "/api/v1/clusters/",
        {"name": "enc-1", "fleet": fleet.pk, "driver": "kubernetes", "connection": SECRET},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert "s3cr3t" not in response.content.decode()
    stored = raw_column(response.json()["id"])
    assert "s3cr3t" not in stored and Cluster.objects.get(pk=response.json()["id"]).connection == SECRET


def test_keys_rotate_with_multifernet_and_rotate_credentials():
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    with override_settings(CREDENTIALS_KEYS=[old]):
        cluster = make_cluster(connection=SECRET)
        under_old = raw_column(cluster.pk)
    with override_settings(CREDENTIALS_KEYS=[new, old]):
        assert Cluster.objects.get(pk=cluster.pk).connection == SECRET  # the old key still decrypts
        out = StringIO()
        call_command("rotate_credentials", stdout=out)
        assert "fleet.Cluster.connection" in out.getvalue()
    assert raw_column(cluster.pk) != under_old
    with override_settings(CREDENTIALS_KEYS=[new]):
        assert Cluster.objects.get(pk=cluster.pk).connection == SECRET  # the old key can go
    with override_settings(CREDENTIALS_KEYS=[old]), pytest.raises(CredentialsUnreadable):
        Cluster.objects.get(pk=cluster.pk)


def test_the_default_key_comes_from_secret_key_and_its_fallbacks():
    cluster = make_cluster(connection=SECRET)
    with override_settings(
        CREDENTIALS_KEYS=[], SECRET_KEY="a-new-secret-key-" + "n" * 40, SECRET_KEY_FALLBACKS=[]
    ):
        with pytest.raises(CredentialsUnreadable):
            Cluster.objects.get(pk=cluster.pk)
    from django.conf import settings

    with override_settings(
        CREDENTIALS_KEYS=[],
        SECRET_KEY="a-new-secret-key-" + "n" * 40,
        SECRET_KEY_FALLBACKS=[settings.SECRET_KEY],
    ):
        assert Cluster.objects.get(pk=cluster.pk).connection == SECRET


def test_rows_from_before_the_migration_read_and_are_encrypted_by_rotate_credentials():
    plain, quoted = make_cluster(), make_cluster(connection=SECRET)
    write_raw(plain.pk, json.dumps(SECRET))  # as the migration found it
    write_raw(
        quoted.pk, json.dumps(raw_column(quoted.pk))
    )  # ciphertext the previous release re-saved as a string
    assert Cluster.objects.get(pk=plain.pk).connection == SECRET
    assert Cluster.objects.get(pk=quoted.pk).connection == SECRET
    call_command("rotate_credentials", stdout=StringIO())
    for cluster in (plain, quoted):
        assert raw_column(cluster.pk).startswith("gAAAAA")
        assert Cluster.objects.get(pk=cluster.pk).connection == SECRET


def test_dumpdata_carries_ciphertext_only():
    make_cluster(connection=SECRET)
    out = StringIO()
    call_command("dumpdata", "fleet.cluster", stdout=out)
    dumped = json.loads(out.getvalue())
    assert dumped and "s3cr3t" not in out.getvalue()
    assert all(row["fields"]["connection"].startswith("gAAAAA") for row in dumped)
