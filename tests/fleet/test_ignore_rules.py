"""Ignore rules: paths of an add-on's values that a controller owns are not drift (an add-on's own
``ignore_differences`` or the version policy's), are kept when drift is corrected, and stay visible on request."""

import pytest

from controlplane.errors import ServiceError
from fleet.models import DriftFinding, SimulatedAddon
from fleet.services.blueprints import version_create
from fleet.services.clusters import cluster_reconcile
from fleet.services.drift import drift_sweep
from tests.support.blueprints import ADDONS, blueprint, clusters_on

pytestmark = pytest.mark.django_db


def _with_rule(addons, name, paths):
    return [{**a, "ignore_differences": paths} if a["name"] == name else a for a in addons]


def _controller_sets(cluster, addon, **values):
    row = SimulatedAddon.objects.get(cluster=cluster, name=addon)
    row.values = {**row.values, **values}
    row.save()


def test_an_ignore_rule_silences_a_controller_owned_field(users):
    bp, v1 = blueprint(users["operator"], addons=_with_rule(ADDONS, "gpu-operator", ["operator.replicas"]))
    cluster = clusters_on(v1, 1)[0]
    _controller_sets(cluster, "gpu-operator", operator={"replicas": 3})
    drift_sweep(cluster_ids=[cluster.pk])
    assert not DriftFinding.objects.filter(cluster=cluster, resolved_at__isnull=True).exists()
    _controller_sets(cluster, "gpu-operator", operator={"replicas": 3}, driver={"enabled": False})
    drift_sweep(cluster_ids=[cluster.pk])
    finding = DriftFinding.objects.get(cluster=cluster, resolved_at__isnull=True)
    assert [change["path"] for change in finding.diff] == ["values.driver.enabled"]


def test_a_policy_rule_covers_every_add_on_and_wildcards_match(users):
    actor = users["operator"]
    bp, v1 = blueprint(actor)
    v2 = version_create(
        actor=actor,
        blueprint=bp,
        addons=ADDONS,
        policy={"protection": {"nic_failover": True}, "ignore_differences": {"*": ["*.image.tag"]}},
        activate=True,
    )
    cluster = clusters_on(v2, 1)[0]
    _controller_sets(cluster, "gpu-operator", driver={"enabled": True, "image": {"tag": "550"}})
    _controller_sets(cluster, "nic-failover", agent={"image": {"tag": "1.2.3"}})
    drift_sweep(cluster_ids=[cluster.pk])
    assert not DriftFinding.objects.filter(cluster=cluster, resolved_at__isnull=True).exists()


def test_correcting_drift_keeps_what_the_controller_owns(users):
    bp, v1 = blueprint(users["operator"], addons=_with_rule(ADDONS, "gpu-operator", ["operator"]))
    cluster = clusters_on(v1, 1)[0]
    _controller_sets(cluster, "gpu-operator", operator={"replicas": 3}, driver={"enabled": False})
    result = cluster_reconcile(actor=users["operator"], cluster=cluster)
    assert result["corrected"] == ["gpu-operator"]
    values = SimulatedAddon.objects.get(cluster=cluster, name="gpu-operator").values
    assert values == {"driver": {"enabled": True}, "operator": {"replicas": 3}}


def test_ignored_differences_are_shown_on_request_to_who_sees_the_cluster(api, users, tenant_a):
    bp, v1 = blueprint(users["operator"], addons=_with_rule(ADDONS, "gpu-operator", ["operator.replicas"]))
    mine = clusters_on(v1, 1, dedicated_tenant=tenant_a)[0]
    shared = clusters_on(v1, 1)[0]
    for cluster in (mine, shared):
        _controller_sets(cluster, "gpu-operator", operator={"replicas": 3})
    drift_sweep()
    api.as_token(users["operator"])
    answer = api.get(f"/api/v1/drift/ignored/?cluster={shared.pk}").json()["results"]
    assert answer == [
        {
            "cluster": shared.pk,
            "name": shared.name,
            "addon": "gpu-operator",
            "ignored": [{"path": "values.operator.replicas", "op": "added", "observed": 3}],
        }
    ]
    api.as_token(users["tenant-admin"], "read")
    seen = api.get("/api/v1/drift/ignored/").json()["results"]
    assert {row["cluster"] for row in seen} == {mine.pk}
    assert api.get("/api/v1/drift/ignored/?cluster=abc").status_code == 400
    assert api.get("/api/v1/drift/ignored/?cluster=99999999999999").status_code == 400


@pytest.mark.parametrize(
    "addons, policy, field",
    [
        (_with_rule(ADDONS, "gpu-operator", "operator"), {}, "addons[0].ignore_differences"),
        (_with_rule(ADDONS, "gpu-operator", ["a..b"]), {}, "addons[0].ignore_differences[0]"),
        (_with_rule(ADDONS, "gpu-operator", [7]), {}, "addons[0].ignore_differences[0]"),
        (ADDONS, {"ignore_differences": ["x"]}, "policy.ignore_differences"),
        (ADDONS, {"ignore_differences": {"Bad Name": ["x"]}}, "policy.ignore_differences"),
        (ADDONS, {"ignore_differences": {"*": ["x y"]}}, "policy.ignore_differences.*[0]"),
    ],
)
def test_bad_ignore_rules_are_refused_naming_the_field(users, addons, policy, field):
    bp, _ = blueprint(users["operator"])
    with pytest.raises(ServiceError) as refused:
        version_create(actor=users["operator"], blueprint=bp, addons=addons, policy=policy)
    assert refused.value.field == field
