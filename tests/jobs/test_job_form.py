"""The tenant's job form: a refusal says what it counted in the unit the form asks for, and keeps the input."""

import re

import pytest

from jobs.models import Job
from tests.support.factories import make_cluster, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def small_cluster(tenant_a):
    cluster = make_cluster(name="acme-small", dedicated_tenant=tenant_a)
    for i in range(2):
        make_node(cluster, f"acme-small-{i}")
    return cluster


def field_value(page: str, name: str) -> str:
    return re.search(rf'<input[^>]*name="{name}"[^>]*value="([^"]*)"', page).group(1)


def test_too_many_gpus_is_explained_in_gpus_and_nodes_and_the_form_keeps_its_input(
    client, users, small_cluster
):
    client.force_login(users["tenant-admin"])
    sent = {
        "name": "big-one",
        "cluster": small_cluster.pk,
        "gpus": 500,
        "seconds_per_iteration": 3.5,
        "checkpoint_interval": 250,
    }
    page = client.post("/", sent).content.decode()
    message = re.search(r'<p class="error" role="alert">(.*?)</p>', page).group(1)
    assert "500 GPUs" in message and "63 free ready nodes of 8 GPUs" in message, message
    assert "needs 500" not in page and not Job.objects.filter(name="big-one").exists()
    assert field_value(page, "name") == "big-one" and field_value(page, "gpus") == "500"
    assert (
        field_value(page, "seconds_per_iteration") == "3.5"
        and field_value(page, "checkpoint_interval") == "250"
    )
    assert f'<option value="{small_cluster.pk}" selected>' in page


def test_a_fresh_form_has_its_defaults(client, users, small_cluster):
    client.force_login(users["tenant-admin"])
    page = client.get("/").content.decode()
    assert field_value(page, "name") == "" and field_value(page, "gpus") == "16" and " selected>" not in page
    assert client.post("/", {"name": "fits", "cluster": small_cluster.pk, "gpus": 16}).status_code == 302
    assert Job.objects.get(name="fits").cluster == small_cluster
