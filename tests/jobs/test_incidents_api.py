"""/api/v1/incidents/: one failure and every report of it; scoped as faults are, filtered, within a query budget."""

import pytest

from jobs.models import RecoveryAction
from tests.support.incidents import incident_world, make_action, make_incident
from tests.support.jobs import node_of

pytestmark = pytest.mark.django_db

LIST_FIELDS = {
    "id",
    "cluster",
    "node",
    "hostname",
    "scope",
    "nic_name",
    "kind",
    "xid",
    "state",
    "opened_at",
    "last_reported_at",
    "resolved_at",
    "report_count",
    "fault_count",
    "sources",
    "url",
}
FAULT_FIELDS = {
    "id",
    "kind",
    "xid",
    "gpu_index",
    "nic_name",
    "sources",
    "report_count",
    "detected_at",
    "state",
    "state_reason",
}
ACTION_FIELDS = {
    "id",
    "kind",
    "state",
    "job",
    "attempt",
    "previous",
    "to_node",
    "error",
    "gpu_hours_baseline",
    "gpu_hours_lost",
    "gpu_hours_saved",
    "saving",
    "gpu_hours_expected",
    "restart_baseline",
    "expected",
    "ended_at",
}


@pytest.fixture
def world(tenant_a, tenant_b):
    return incident_world(tenant_a, tenant_b)


def ids(response) -> list[int]:
    assert response.status_code == 200, response.content[:300]
    return [row["id"] for row in response.json()["results"]]


def test_list_and_detail_shape(api, users, world):
    api.as_token(users["operator"], "read")
    rows = api.get("/api/v1/incidents/").json()["results"]
    incidents = world.incidents
    assert [row["id"] for row in rows] == [
        incidents[name].pk for name in ("idle", "shared-globex", "shared-acme", "globex", "acme")
    ]
    acme = next(row for row in rows if row["id"] == incidents["acme"].pk)
    assert set(acme) == LIST_FIELDS
    assert (
        acme["kind"] == "gpu_xid"
        and acme["xid"] == 79
        and acme["state"] == "open"
        and acme["scope"] == "node"
    )
    assert (
        acme["hostname"] == node_of(world.jobs["acme"]).hostname and acme["cluster"] == world.acme_cluster.pk
    )
    assert acme["report_count"] == 3 and acme["fault_count"] == 2
    assert acme["sources"] == ["agent", "alertmanager", "api"]
    assert acme["url"] == f"/api/v1/incidents/{incidents['acme'].pk}/"
    nic = next(row for row in rows if row["id"] == incidents["shared-acme"].pk)
    assert nic["scope"] == "nic" and nic["nic_name"] == "mlx5_2"

    detail = api.get(acme["url"]).json()
    assert set(detail) == LIST_FIELDS | {"faults", "actions", "ledger"}
    assert [f["kind"] for f in detail["faults"]] == ["gpu_xid", "node_unreachable"]  # oldest first
    assert all(set(f) == FAULT_FIELDS for f in detail["faults"])
    assert detail["faults"][0]["report_count"] == 2 and detail["faults"][1]["sources"] == [
        "alertmanager",
        "api",
    ]
    actions = {a["id"]: a for a in detail["actions"]}
    assert set(actions) == {world.actions[n].pk for n in ("failed", "restart", "expected", "dry-run")}
    assert all(set(a) == ACTION_FIELDS for a in detail["actions"])
    restart = actions[world.actions["restart"].pk]
    assert restart["attempt"] == 2 and restart["previous"] == world.actions["failed"].pk
    assert restart["kind"] == "restart_from_checkpoint" and restart["saving"] == "realized"
    assert actions[world.actions["failed"].pk]["error"] == "no spare of this model"
    assert actions[world.actions["expected"].pk]["saving"] == "expected"
    assert api.get("/api/v1/incidents/999999/").status_code == 404


def test_ledger_totals_are_the_sums_of_its_booked_actions(api, users, world):
    """Succeeded actions that are not dry runs are booked (docs/gpu-hours.md): the failed attempt and the dry
    run are listed, not counted; the saved hours are the realized ones, the expected apart."""
    api.as_token(users["provider-admin"], "read")
    detail = api.get(f"/api/v1/incidents/{world.incidents['acme'].pk}/").json()
    booked = [
        a
        for a in detail["actions"]
        if a["state"] == "succeeded" and not RecoveryAction.objects.get(pk=a["id"]).dry_run
    ]
    assert len(booked) == 2
    ledger = detail["ledger"]
    for key in ("gpu_hours_baseline", "gpu_hours_lost"):
        assert ledger[key] == pytest.approx(sum(a[key] for a in booked))
    assert ledger["gpu_hours_saved"] == pytest.approx(
        sum(a["gpu_hours_saved"] for a in booked if a["saving"] == "realized")
    )
    assert ledger["gpu_hours_expected"] == pytest.approx(
        sum(a["gpu_hours_expected"] for a in booked if a["saving"] == "expected")
    )
    assert ledger == {
        "gpu_hours_baseline": 16.0,
        "gpu_hours_lost": 2.5,
        "gpu_hours_saved": 8.0,
        "gpu_hours_expected": 4.0,
        "jobs": 2,
        "restart_baselines": [],
    }
    idle = api.get(f"/api/v1/incidents/{world.incidents['idle'].pk}/").json()
    assert idle["actions"] == [] and idle["ledger"] == {
        "gpu_hours_baseline": 0,
        "gpu_hours_lost": 0,
        "gpu_hours_saved": 0,
        "gpu_hours_expected": 0,
        "jobs": 0,
        "restart_baselines": [],
    }


def test_each_filter(api, users, world):
    api.as_token(users["operator"], "read")
    incidents = world.incidents
    shared = {incidents[n].pk for n in ("shared-acme", "shared-globex", "idle")}
    assert set(ids(api.get(f"/api/v1/incidents/?cluster={world.shared.pk}"))) == shared
    node = incidents["acme"].node_id
    assert ids(api.get(f"/api/v1/incidents/?node={node}")) == [incidents["acme"].pk]
    # A job's incidents: those a recovery of it answered, once each however many attempts it took.
    assert ids(api.get(f"/api/v1/incidents/?job={world.jobs['acme'].pk}")) == [incidents["acme"].pk]
    assert ids(api.get(f"/api/v1/incidents/?job={world.jobs['globex-shared'].pk}")) == [
        incidents["shared-globex"].pk,
        incidents["shared-acme"].pk,
    ]
    assert ids(api.get("/api/v1/incidents/?state=resolved")) == [incidents["idle"].pk]
    assert len(ids(api.get("/api/v1/incidents/?state=open"))) == 4
    assert ids(api.get("/api/v1/incidents/?kind=ecc_uncorrectable")) == [incidents["globex"].pk]
    assert ids(api.get(f"/api/v1/incidents/?cluster={world.shared.pk}&state=open&kind=nic_down")) == [
        incidents["shared-acme"].pk
    ]
    assert api.get("/api/v1/incidents/?state=bogus").status_code == 400
    assert api.get("/api/v1/incidents/?job=999999").status_code == 400


@pytest.mark.parametrize("role", ["tenant-admin", "tenant-viewer"])
def test_a_tenant_sees_only_its_own_incidents_also_through_filters(api, users, world, role):
    api.as_token(users[role], "read")
    incidents, jobs = world.incidents, world.jobs
    mine = [
        incidents["shared-acme"].pk,
        incidents["acme"].pk,
    ]  # its dedicated cluster's, and one that hit its job
    assert ids(api.get("/api/v1/incidents/")) == mine
    # The shared cluster: only the incident that hit its job there, not globex's nor the idle node's.
    assert ids(api.get(f"/api/v1/incidents/?cluster={world.shared.pk}")) == [incidents["shared-acme"].pk]
    assert ids(api.get(f"/api/v1/incidents/?job={jobs['acme-shared'].pk}")) == [incidents["shared-acme"].pk]
    # The other tenant's cluster, node or job is no choice of theirs: refused, and nothing is listed.
    for query in (
        f"cluster={world.globex_cluster.pk}",
        f"job={jobs['globex'].pk}",
        f"job={jobs['globex-shared'].pk}",
        f"node={incidents['globex'].node_id}",
    ):
        response = api.get(f"/api/v1/incidents/?{query}")
        assert response.status_code == 400 and "results" not in response.json(), query
    for name in ("globex", "shared-globex", "idle"):
        assert api.get(f"/api/v1/incidents/{incidents[name].pk}/").status_code == 404, name
    # An incident that hit both tenants' jobs: its reports, and of its actions and ledger only acme's.
    both = api.get(f"/api/v1/incidents/{incidents['shared-acme'].pk}/").json()
    assert [a["id"] for a in both["actions"]] == [world.actions["shared-acme"].pk]
    assert both["ledger"] == {
        "gpu_hours_baseline": 2.0,
        "gpu_hours_lost": 0.5,
        "gpu_hours_saved": 1.5,
        "gpu_hours_expected": 0,
        "jobs": 1,
        "restart_baselines": [],
    }
    assert [f["kind"] for f in both["faults"]] == ["nic_down"]


def test_the_other_tenant_sees_its_own(api, users, world):
    api.as_token(users["other-viewer"], "read")
    incidents = world.incidents
    assert ids(api.get("/api/v1/incidents/")) == [
        incidents["shared-globex"].pk,
        incidents["shared-acme"].pk,
        incidents["globex"].pk,
    ]
    assert api.get(f"/api/v1/incidents/{incidents['acme'].pk}/").status_code == 404
    both = api.get(f"/api/v1/incidents/{incidents['shared-acme'].pk}/").json()
    assert [a["id"] for a in both["actions"]] == [world.actions["shared-acme-globex"].pk]


def test_faults_and_actions_name_their_incident(api, users, world):
    api.as_token(users["operator"], "read")
    incident = world.incidents["acme"]
    faults = api.get(f"/api/v1/faults/?node={incident.node_id}").json()["results"]
    assert {f["incident"] for f in faults} == {incident.pk, None}  # its two reports, and the orphan
    action = api.get(f"/api/v1/actions/{world.actions['restart'].pk}/").json()
    assert action["incident"] == incident.pk and action["attempt"] == 2
    assert action["previous"] == world.actions["failed"].pk and action["saving"] == "realized"
    assert action["gpu_hours_expected"] == 0 and "deadline_at" in action
    for field in (
        "kind",
        "state",
        "to_node",
        "gpu_hours_baseline",
        "gpu_hours_saved",
        "alternatives",
        "fault",
    ):
        assert field in action


def test_a_tenant_sees_the_reports_of_an_incident_that_hit_its_job(api, users, world):
    """A report of an incident on a shared cluster that no action names is still a fault of the tenant's job."""
    incident = world.incidents["shared-acme"]
    later = make_incident(incident.node, reports=[{"kind": "link_flap", "nic_name": "mlx5_2"}])
    later.faults.update(incident=incident)
    api.as_token(users["tenant-viewer"], "read")
    detail = api.get(f"/api/v1/incidents/{incident.pk}/").json()
    assert [f["kind"] for f in detail["faults"]] == ["nic_down", "link_flap"]
    fault_ids = set(ids(api.get("/api/v1/faults/?page_size=100")))
    assert {f["id"] for f in detail["faults"]} <= fault_ids


def test_list_query_count_does_not_grow_with_incidents(api, users, world, django_assert_max_num_queries):
    """The token, the count, a page of incidents and their reports; the detail adds its actions."""
    api.as_token(users["tenant-admin"], "read")
    with django_assert_max_num_queries(6):
        assert len(ids(api.get("/api/v1/incidents/"))) == 2
    for _ in range(6):
        incident = make_incident(
            node_of(world.jobs["acme"]), reports=[{"kind": "thermal"}, {"kind": "straggler"}]
        )
        make_action(incident, world.jobs["acme"], fault=False)
    with django_assert_max_num_queries(6):
        assert len(ids(api.get("/api/v1/incidents/"))) == 8
    with django_assert_max_num_queries(6):
        assert len(api.get(f"/api/v1/incidents/{world.incidents['acme'].pk}/").json()["actions"]) == 4
