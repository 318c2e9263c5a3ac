"""The rollout preview's blast radius (issue 53, item 3): per cluster, its running jobs and whether each stays
protected after the change (jobs.protection's verdict against the target version's policy, nothing written); a
warning and a second confirmation when the rollout moves a cluster to another blueprint or turns protection off
(a start without it is a 400 naming the field and starts nothing); the rollback confirmation names the clusters
and the versions they go back to. (The browser walk is tests/browser/test_rollout_blast_radius.py.)"""

import pytest

from fleet.models import Rollout
from fleet.services.rollout_steps import rollout_step
from fleet.services.rollouts import rollout_start
from jobs.choices import JobState
from jobs.selectors import running_jobs_on
from tests.support.blast import blast_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(users, tenant_a, tenant_b):
    return blast_world(users["operator"], tenant_a, tenant_b)


def form_for(version, clusters, **extra):
    return {
        "version": f"{version.blueprint_id}:{version.number}",
        "target_kind": "clusters",
        "clusters": [c.pk for c in clusters],
        "canary": "1",
        "batch_percent": "100",
        "max_failures": "0",
        "soak_seconds": "0",
        "progress_deadline_seconds": "600",
        **extra,
    }


def previewed(client, form):
    """Preview, then the form as the preview left it (with its plan) and the preview's response."""
    response = client.post("/rollouts/new/", {**form, "preview": "1"})
    assert response.status_code == 200, response.context["form"].errors
    return {**form, "plan": response.context["form"]["plan"].value()}, response


def job_rows(response) -> dict:
    rows = {}
    for cluster in response.context["blast"]["clusters"].values():
        for row in cluster["jobs"]:
            rows[row["job"].name] = (row["now"].protected, row["after"].protected)
    return rows


def test_the_preview_lists_running_jobs_protected_now_and_after(client, users, world):
    client.force_login(users["operator"])
    form, response = previewed(client, form_for(world["v3"], world["clusters"]))
    # v3 keeps v2's policy: the protected job stays protected, the one whose runtime is silent stays unprotected.
    assert job_rows(response) == {"guarded": (True, True), "bare": (False, False), "theirs": (False, False)}
    page = response.content.decode()
    assert 'id="rollout-blast"' in page and "rollout-blast-warning" not in page
    assert f'data-job="{world["jobs"]["guarded"].pk}"' in page
    assert "acknowledge_drop" not in page  # nothing to acknowledge
    _, dropping = previewed(client, form_for(world["v1"], world["clusters"][:1]))
    assert job_rows(dropping) == {"guarded": (True, False), "bare": (False, False)}
    assert "does not turn on the protection runtime" in dropping.content.decode()
    started = client.post("/rollouts/new/", {**form, "start": "1"})
    assert started.status_code == 302 and Rollout.objects.count() == 1


def test_a_rollout_dropping_protection_needs_the_acknowledgement(client, users, world):
    client.force_login(users["operator"])
    form, response = previewed(client, form_for(world["v1"], world["clusters"]))
    page = response.content.decode()
    assert response.context["blast"]["warned"] and response.context["blast"]["dropped"] == 1
    assert 'id="rollout-blast-warning"' in page and "turns off runtime" in page
    assert "I understand protection is dropped for 1 job" in page
    refused = client.post("/rollouts/new/", {**form, "start": "1"})
    assert refused.status_code == 400
    assert "acknowledge_drop" in refused.context["form"].errors
    assert 'id="field-acknowledge_drop"' in refused.content.decode()
    assert not Rollout.objects.exists()
    started = client.post("/rollouts/new/", {**form, "start": "1", "acknowledge_drop": "on"})
    assert started.status_code == 302
    assert Rollout.objects.get().version == world["v1"]


def test_a_switch_to_another_blueprint_warns_even_when_protection_stays(client, users, world):
    client.force_login(users["operator"])
    form, response = previewed(client, form_for(world["other"], world["clusters"][:1]))
    assert job_rows(response) == {"guarded": (True, True), "bare": (False, False)}
    assert response.context["blast"]["dropped"] == 0
    assert (
        f"{world['clusters'][0].name} moves from blueprint gpu-base to gpu-other" in response.content.decode()
    )
    assert client.post("/rollouts/new/", {**form, "start": "1"}).status_code == 400
    assert not Rollout.objects.exists()
    assert client.post("/rollouts/new/", {**form, "start": "1", "acknowledge_drop": "on"}).status_code == 302


def test_tenants_cannot_open_the_form_and_never_read_another_tenants_jobs(client, users, world):
    for role in ("tenant-admin", "tenant-viewer"):
        client.force_login(users[role])
        assert client.get("/rollouts/new/").status_code == 403
        assert client.post("/rollouts/new/", form_for(world["v1"], world["clusters"])).status_code == 403
    ids = [c.pk for c in world["clusters"]]
    names = set(running_jobs_on(user=users["tenant-admin"], cluster_ids=ids).values_list("name", flat=True))
    assert names == {"guarded", "bare"}
    everything = running_jobs_on(user=users["operator"], cluster_ids=ids)
    assert set(everything.values_list("name", flat=True)) == {"guarded", "bare", "theirs"}
    world["jobs"]["bare"].state = JobState.COMPLETED
    world["jobs"]["bare"].save()
    assert "bare" not in set(everything.all().values_list("name", flat=True))


def test_the_rollback_confirmation_names_clusters_and_versions(client, users, world):
    rollout = rollout_start(
        actor=users["operator"],
        version=world["v3"],
        targets={"clusters": [c.pk for c in world["clusters"]]},
        strategy={"batch_size": 2, "soak_seconds": 0},
    )
    rollout_step(rollout_id=rollout.pk)
    assert rollout.clusters.filter(applied_at__isnull=False).count() == 2
    client.force_login(users["operator"])
    response = client.post(f"/rollouts/{rollout.pk}/rollback/", {"reason": "bad driver"})
    assert response.status_code == 200
    page = response.content.decode()
    for cluster in world["clusters"]:
        assert f"{cluster.name} goes back from gpu-base v3 to gpu-base v2." in page
    rollout.refresh_from_db()
    assert rollout.state != "RolledBack"  # asking writes nothing
