"""The fleet API: scoping per role, credentials never shown, bad input answered 400 naming the field."""

import json

import pytest

from controlplane.models import AuditEntry
from fleet.choices import VersionState
from fleet.models import Blueprint, BlueprintVersion, Cluster, Rollout
from fleet.services.drift import drift_sweep
from tests.support.blueprints import ADDONS, blueprint, bump, clusters_on
from tests.support.factories import make_cluster, make_fleet, make_node

pytestmark = pytest.mark.django_db

SECRET = "kubeconfig-secret-token-XYZ"
DEEP = json.loads("[" * 40 + "]" * 40)


@pytest.fixture
def world(users, tenant_a, tenant_b):
    bp, v1 = blueprint(users["operator"], auto_rollout=False)
    fleet = make_fleet("eu-west")
    mine = clusters_on(v1, 1, fleet=fleet, dedicated_tenant=tenant_a)[0]
    shared = clusters_on(v1, 1, fleet=fleet)[0]
    theirs = clusters_on(v1, 1, fleet=fleet, dedicated_tenant=tenant_b)[0]
    for cluster in (mine, shared, theirs):
        cluster.connection = {"apply_seconds": 0, "token": SECRET}
        cluster.save()
        make_node(cluster)
    drift_sweep()
    return {"blueprint": bp, "v1": v1, "fleet": fleet, "mine": mine, "shared": shared, "theirs": theirs}


def test_tenant_sees_its_dedicated_cluster_in_full_and_shared_ones_in_outline(api, users, world):
    api.as_token(users["tenant-viewer"], "read")
    rows = {row["name"]: row for row in api.get("/api/v1/clusters/").json()["results"]}
    assert set(rows) == {world["mine"].name, world["shared"].name}
    assert rows[world["mine"].name]["status"]["total"] == 3
    assert set(rows[world["shared"].name]) == {"id", "name", "tier", "shared", "blueprint_version"}
    assert rows[world["shared"].name]["blueprint_version"] == {
        "blueprint": "gpu-base",
        "number": 1,
        "state": "active",
    }
    assert api.get(f"/api/v1/clusters/{world['theirs'].pk}/").status_code == 404
    nodes = api.get("/api/v1/nodes/").json()["results"]
    assert {n["cluster"] for n in nodes} == {world["mine"].pk} and len(nodes[0]["gpus"]) == 8
    assert [f["name"] for f in api.get("/api/v1/fleets/").json()["results"]] == ["eu-west"]
    assert api.get("/api/v1/blueprints/").status_code == 403
    assert api.get("/api/v1/rollouts/").status_code == 403


def test_credentials_never_appear_in_any_response(api, users, world):
    api.as_token(users["provider-admin"])
    bodies = [
        api.get(url).content
        for url in [
            "/api/v1/clusters/",
            f"/api/v1/clusters/{world['mine'].pk}/",
            "/api/v1/nodes/",
            "/api/v1/fleets/",
            "/api/v1/audit/",
        ]
    ]
    response = api.patch(
        f"/api/v1/clusters/{world['mine'].pk}/", {"connection": {"token": "new-" + SECRET}}, format="json"
    )
    assert response.status_code == 200
    bodies.append(response.content)
    assert not any(SECRET.encode() in body for body in bodies)
    assert "connection" not in response.json()
    world["mine"].refresh_from_db()
    assert world["mine"].connection == {"token": "new-" + SECRET}


def test_operators_may_not_set_credentials_and_tenants_may_not_write(api, users, world):
    api.as_token(users["operator"])
    response = api.patch(f"/api/v1/clusters/{world['mine'].pk}/", {"connection": {"x": 1}}, format="json")
    assert response.status_code == 403 and "connection" in response.json()
    api.as_token(users["tenant-admin"])
    assert (
        api.patch(f"/api/v1/clusters/{world['mine'].pk}/", {"region": "x"}, format="json").status_code == 403
    )
    assert api.post(f"/api/v1/nodes/{world['mine'].nodes.first().pk}/cordon/", {}).status_code == 403


def test_fleet_and_cluster_crud(api, users, world):
    api.as_token(users["operator"])
    fleet = api.post("/api/v1/fleets/", {"name": "us-east"}, format="json").json()
    assert api.post("/api/v1/fleets/", {"name": "us-east"}, format="json").status_code == 400
    created = api.post(
        "/api/v1/clusters/",
        {"name": "c-new", "fleet": fleet["id"], "labels": {"gpu": "h100"}, "tier": "resilient"},
        format="json",
    )
    assert created.status_code == 201, created.content
    bad = api.post(
        "/api/v1/clusters/", {"name": "c-bad", "fleet": fleet["id"], "labels": {"gpu": 3}}, format="json"
    )
    assert bad.status_code == 400 and "labels" in bad.json()
    assert api.get("/api/v1/clusters/?label=gpu=h100").json()["count"] == 1
    assert api.delete(f"/api/v1/fleets/{fleet['id']}/").status_code == 409
    assert api.delete(f"/api/v1/clusters/{created.json()['id']}/").status_code == 204
    assert api.delete(f"/api/v1/fleets/{fleet['id']}/").status_code == 204
    assert api.get(f"/api/v1/fleets/{world['fleet'].pk}/").json()["status"]["total"] == 3


def test_node_actions_and_taints(api, users, world):
    api.as_token(users["operator"])
    node = world["mine"].nodes.first()
    assert (
        api.post(f"/api/v1/nodes/{node.pk}/cordon/", {"reason": "xid 79"}, format="json").json()["state"]
        == "cordoned"
    )
    assert api.post(f"/api/v1/nodes/{node.pk}/uncordon/", {}, format="json").json()["state"] == "ready"
    assert api.post(f"/api/v1/nodes/{node.pk}/drain/", {}, format="json").json()["state"] == "draining"
    taints = [{"key": "lockstep.io/quarantine", "value": "xid", "effect": "NoSchedule"}]
    assert (
        api.patch(f"/api/v1/nodes/{node.pk}/", {"taints": taints}, format="json").json()["taints"] == taints
    )
    bad = api.patch(
        f"/api/v1/nodes/{node.pk}/", {"taints": [{"key": "k", "effect": "Sometimes"}]}, format="json"
    )
    assert bad.status_code == 400 and "taints[0].effect" in bad.json()


def test_version_lifecycle_and_immutability(api, users, world):
    api.as_token(users["operator"])
    bp = world["blueprint"]
    url = f"/api/v1/blueprints/{bp.pk}/versions/"
    draft = api.post(url, {"addons": bump(ADDONS, "gpu-operator", "24.9.1"), "notes": "bump"}, format="json")
    assert draft.status_code == 201 and draft.json()["number"] == 2 and draft.json()["state"] == "draft"
    patched = api.patch(f"{url}2/", {"notes": "bump the operator"}, format="json")
    assert patched.status_code == 200 and patched.json()["notes"] == "bump the operator"
    assert api.post(f"{url}2/activate/").json()["state"] == "active"
    refused = api.patch(f"{url}2/", {"addons": ADDONS}, format="json")
    assert refused.status_code == 400 and "addons" in refused.json()
    listed = {v["number"]: v for v in api.get(url).json()}
    assert listed[1]["clusters"] == 3 and listed[2]["clusters"] == 0
    assert api.post(f"{url}1/disable/").json()["state"] == "disabled"
    diff = api.get(f"/api/v1/blueprints/{bp.pk}/diff/?from=1&to=2").json()
    assert diff["addons"] == [
        {
            "name": "gpu-operator",
            "change": "changed",
            "changes": [{"path": "version", "op": "changed", "old": "24.9.0", "new": "24.9.1"}],
        }
    ]
    assert api.get(f"/api/v1/blueprints/{bp.pk}/diff/?from=1&to=9").status_code == 400


@pytest.mark.parametrize(
    "body, field",
    [
        (
            {"addons": [{"name": "x", "chart": "x", "version": "latest", "namespace": "x"}]},
            "addons[0].version",
        ),
        ({"addons": [{"name": "x", "chart": "bad chart!", "version": "1.0.0"}]}, "addons[0].chart"),
        ({"addons": [{"name": "x", "chart": "x", "version": "1.0.0", "repo": "ftp://x"}]}, "addons[0].repo"),
        ({"addons": [{"name": "x", "chart": "x", "version": "1.0.0", "values": [1, 2]}]}, "addons[0].values"),
        ({"addons": [{"name": "x", "chart": "x", "version": "1.0.0", "colour": "red"}]}, "addons[0]"),
        ({"node_software": {"bios": "1"}}, "node_software"),
        ({"policy": {"risk_threshold": 3}}, "policy.risk_threshold"),
        ({"parent": 99}, "parent"),
        (
            {"addons": [{"name": "x", "chart": "x", "version": "1.0.0", "values": {"a": DEEP}}]},
            "addons[0].values",
        ),
    ],
)
def test_bad_version_input_is_400_naming_the_field_and_writes_nothing(api, users, world, body, field):
    api.as_token(users["operator"])
    before = BlueprintVersion.objects.count(), AuditEntry.objects.count()
    response = api.post(f"/api/v1/blueprints/{world['blueprint'].pk}/versions/", body, format="json")
    assert response.status_code == 400 and field in response.json(), response.content
    assert (BlueprintVersion.objects.count(), AuditEntry.objects.count()) == before


def test_rollout_api_start_follow_and_act(api, users, world):
    api.as_token(users["operator"])
    bp = world["blueprint"]
    api.post(
        f"/api/v1/blueprints/{bp.pk}/versions/",
        {"addons": bump(ADDONS, "gpu-operator", "24.9.1"), "activate": True},
        format="json",
    )
    started = api.post(
        "/api/v1/rollouts/",
        {
            "blueprint": bp.pk,
            "version": 2,
            "targets": {"fleet": "eu-west"},
            "strategy": {"batch_size": 1, "soak_seconds": 0},
        },
        format="json",
    )
    assert started.status_code == 201, started.content
    body = started.json()
    assert body["state"] == "Pending" and len(body["batches"]) == 3 and len(body["clusters"]) == 3
    again = api.post(
        "/api/v1/rollouts/",
        {"blueprint": bp.pk, "version": 2, "targets": {"fleet": "eu-west"}},
        format="json",
    )
    assert again.status_code == 400 and "targets" in again.json()
    rid = body["id"]
    assert (
        api.post(f"/api/v1/rollouts/{rid}/pause/", {"reason": "lunch"}, format="json").json()["state"]
        == "Paused"
    )
    assert api.post(f"/api/v1/rollouts/{rid}/resume/").json()["state"] == "Running"
    rolled = api.post(f"/api/v1/rollouts/{rid}/rollback/", {"reason": "test"}, format="json").json()
    assert rolled["state"] == "RolledBack"
    assert api.post(f"/api/v1/rollouts/{rid}/cancel/").status_code == 409
    assert api.get("/api/v1/rollouts/?state=RolledBack").json()["count"] == 1


@pytest.mark.parametrize(
    "body, field",
    [
        ({"version": 1, "targets": {"labels": {"none": "here"}}}, "targets"),
        ({"version": 1, "targets": {"clusters": []}}, "targets.clusters"),
        (
            {"version": 1, "targets": {"fleet": "eu-west"}, "strategy": {"max_failures": -1}},
            "strategy.max_failures",
        ),
        ({"version": 7, "targets": {"fleet": "eu-west"}}, "version"),
        ({"version": 1, "targets": {"clusters": [True]}}, "targets.clusters"),
        ({"version": 1, "targets": {"tracking": "yes"}}, "targets.tracking"),
        ({"version": 1, "targets": ["eu-west"]}, "targets"),
    ],
)
def test_bad_rollouts_are_400_naming_the_field(api, users, world, body, field):
    api.as_token(users["operator"])
    response = api.post("/api/v1/rollouts/", {"blueprint": world["blueprint"].pk, **body}, format="json")
    assert response.status_code == 400 and field in response.json(), response.content
    assert not Rollout.objects.exists()


def test_rollout_of_a_disabled_version_is_refused(api, users, world):
    api.as_token(users["operator"])
    api.post(f"/api/v1/blueprints/{world['blueprint'].pk}/versions/1/disable/")
    response = api.post(
        "/api/v1/rollouts/",
        {"blueprint": world["blueprint"].pk, "version": 1, "targets": {"fleet": "eu-west"}},
        format="json",
    )
    assert response.status_code == 400 and "version" in response.json()


def test_assignment_pins_or_tracks(api, users, world):
    api.as_token(users["operator"])
    bp, cluster = world["blueprint"], world["shared"]
    api.post(f"/api/v1/blueprints/{bp.pk}/versions/", {"addons": ADDONS, "notes": "draft"}, format="json")
    draft = api.put(
        f"/api/v1/clusters/{cluster.pk}/blueprint/", {"blueprint": bp.pk, "version": 2}, format="json"
    )
    assert draft.status_code == 400 and "version" in draft.json()
    pinned = api.put(
        f"/api/v1/clusters/{cluster.pk}/blueprint/",
        {"blueprint": bp.pk, "version": 1, "reason": "freeze"},
        format="json",
    ).json()
    assert pinned["track_latest"] is False and pinned["pinned_reason"] == "freeze"
    tracking = api.put(
        f"/api/v1/clusters/{cluster.pk}/blueprint/", {"blueprint": bp.pk, "track_latest": True}, format="json"
    ).json()
    assert tracking["track_latest"] is True and tracking["pinned_reason"] == ""
    neither = api.put(f"/api/v1/clusters/{cluster.pk}/blueprint/", {"blueprint": bp.pk}, format="json")
    assert neither.status_code == 400 and "version" in neither.json()


def test_reconcile_and_drift_endpoints(api, users, world):
    from fleet.drivers.simulated import simulate_drift

    simulate_drift(world["mine"], addon="gpu-operator", kind="version", version="9.9.9")
    simulate_drift(world["theirs"], addon="gpu-operator", kind="version", version="9.9.9")
    drift_sweep()
    api.as_token(users["tenant-admin"], "read")
    findings = api.get("/api/v1/drift/?open=true").json()["results"]
    assert [f["cluster"] for f in findings] == [world["mine"].pk]
    assert findings[0]["diff"][0]["observed"] == "9.9.9"
    api.as_token(users["operator"])
    result = api.post(f"/api/v1/clusters/{world['mine'].pk}/reconcile/").json()
    assert result["corrected"] == ["gpu-operator"]
    drift_sweep()
    assert api.get(f"/api/v1/drift/?open=true&cluster={world['mine'].pk}").json()["count"] == 0


def test_yaml_round_trip_and_refusals(api, users, world):
    api.as_token(users["operator"])
    bp = world["blueprint"]
    url = f"/api/v1/blueprints/{bp.pk}/yaml/"
    got = api.get(url)
    assert got.status_code == 200 and got["Content-Type"].startswith("application/yaml")
    text = got.content.decode()
    assert "name: gpu-base" in text and "24.9.0" in text
    added = (
        text
        + """- number: 2
  state: active
  parent: 1
  notes: patch
  addons:
  - name: gpu-operator
    repo: https://helm.ngc.nvidia.com/nvidia
    chart: gpu-operator
    version: 24.9.2
    namespace: gpu-operator
"""
    )
    put = api.generic("PUT", url, added, content_type="application/yaml")
    assert put.status_code == 200, put.content
    version = bp.versions.get(number=2)
    assert version.state == VersionState.ACTIVE and version.parent.number == 1
    assert version.effective_addons()["gpu-operator"]["version"] == "24.9.2"
    assert len(version.effective_addons()) == 3
    # the same document again is a no-op
    assert api.generic("PUT", url, added, content_type="application/yaml").status_code == 200
    assert bp.versions.count() == 2
    changed = added.replace("24.9.2", "24.9.3")
    refused = api.generic("PUT", url, changed, content_type="application/yaml")
    assert refused.status_code == 400 and "versions[1].addons" in refused.json()
    unknown = added.replace("notes: patch", "notes: patch\n  colour: red")
    assert "versions[1]" in api.generic("PUT", url, unknown, content_type="application/yaml").json()
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b]\n"
    response = api.generic("PUT", url, bomb, content_type="application/yaml")
    assert response.status_code == 400 and "aliases" in json.dumps(response.json())
    assert api.generic("PUT", url, "name: other\n", content_type="application/yaml").status_code == 400
    deep = api.generic("PUT", url, "a: " + "[" * 5000 + "]" * 5000 + "\n", content_type="application/yaml")
    assert deep.status_code == 400 and "document" in deep.json()
    assert bp.versions.count() == 2 and Blueprint.objects.count() == 1


def test_schema_lists_the_fleet_paths():
    """Generated from fleet's routes alone, so another app's schema trouble cannot hide ours."""
    from django.urls import include, path
    from drf_spectacular.generators import SchemaGenerator

    generator = SchemaGenerator(patterns=[path("api/v1/", include(("fleet.api.urls", "api")))])
    schema = generator.get_schema(request=None, public=True)
    for route in [
        "/api/v1/clusters/{id}/reconcile/",
        "/api/v1/clusters/{id}/blueprint/",
        "/api/v1/blueprints/{id}/versions/",
        "/api/v1/blueprints/{id}/versions/{number}/activate/",
        "/api/v1/blueprints/{id}/yaml/",
        "/api/v1/blueprints/{id}/diff/",
        "/api/v1/rollouts/{id}/rollback/",
        "/api/v1/drift/",
        "/api/v1/nodes/{id}/drain/",
        "/api/v1/fleets/",
    ]:
        assert route in schema["paths"], route
    assert "connection" not in json.dumps(schema["components"]["schemas"]["Cluster"])
    assert "connection" in json.dumps(schema["components"]["schemas"]["ClusterRequest"])


def test_cluster_list_query_count_does_not_grow(api, users, world, django_assert_max_num_queries):
    api.as_token(users["operator"], "read")
    for _ in range(10):
        make_cluster(world["fleet"])
    with django_assert_max_num_queries(12):
        assert api.get("/api/v1/clusters/").json()["count"] == Cluster.objects.count()


def test_drift_sweep_on_demand_is_queued_for_provider_roles(api, users, world, monkeypatch):
    from fleet import tasks

    queued = []
    monkeypatch.setattr(tasks.drift_sweep_task, "delay", lambda *a, **k: queued.append(a))
    api.as_token(users["tenant-admin"])
    assert api.post("/api/v1/drift/sweep/").status_code == 403
    api.as_token(users["operator"])
    assert api.post("/api/v1/drift/sweep/").status_code == 202 and queued == [()]


def test_yaml_error_bodies_render_as_yaml(api, users):
    api.as_token(users["operator"], "read")
    response = api.get("/api/v1/blueprints/999999/yaml/?format=yaml")
    assert response.status_code == 404 and b"detail:" in response.content
