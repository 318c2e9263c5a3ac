"""The UI's write actions in a real browser (issue 24, item 1): each as a role allowed to use it, through the page's
own form and the same service as the API (its audit entry is there), with its confirmation where it is destructive
(cancelling the confirmation changes nothing); and as refused roles, which do not see the control and get a 403
when they post to it anyway. Screenshots of the new forms go to test-artifacts/ (the README shows them).

One uvicorn and one demo world serve the whole module (building the world takes longer than most tests), so the
tests run in file order and each acts on objects the others leave alone: the refused roles first, while nothing
has moved; the automation switch last."""

import pytest
from django.contrib.auth import get_user_model

from controlplane.access import Role
from controlplane.models import AuditEntry
from fleet import blueprint_yaml
from fleet.models import AutomationSwitch, Blueprint, BlueprintVersion, Cluster, Node, Rollout
from jobs.models import Job
from simulator.world import world_build
from tenancy.models import ApiToken
from tests.support.browser import SERVER_ENV, log_in, screenshot, usable_password
from tests.support.factories import make_user

# Each test reads the module's world in a transaction of its own that is rolled back (it writes nothing itself);
# at read committed it sees every change the server commits.
pytestmark = pytest.mark.django_db
PASSWORD = "correct-horse-9"
User = get_user_model()


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_setup):
    """One live server for the module (the database is the test database; each test's world is its own)."""
    from tests.support.processes import uvicorn_server

    with uvicorn_server(tmp_path_factory.mktemp("write-actions"), **SERVER_ENV) as running:
        yield running


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    """The demo world (a pending rollout of gpu-base v2 holds its two clusters), the provider admin (the
    simulator's user), an operator, and the demo tenants' users, all with a known password. Flushed at the end
    of the module, as a transactional test would be."""
    from django.core.management import call_command

    with django_db_blocker.unblock():
        world_build(seed=11, nodes_per_cluster=8, spares=2)
        make_user(Role.OPERATOR, username="ops", password=PASSWORD)
        for name in ("lockstep-simulator", "acme-admin", "acme-viewer", "nimbus-admin", "ops"):
            usable_password(User.objects.get(username=name), PASSWORD)
        rollout = Rollout.objects.get().pk
    yield {"admin": "lockstep-simulator", "operator": "ops", "rollout": rollout}
    with django_db_blocker.unblock():
        call_command("flush", interactive=False, verbosity=0, allow_cascade=True)


def submit(page, control):
    """Click a submit control; the response the browser navigated to (after any redirect)."""
    with page.expect_navigation() as navigation:
        control.click()
    return navigation.value


def post(page, server, path: str, data: dict | None = None):
    """A POST straight to a page action, with the session and a valid CSRF token (so a 403 is the permission
    check's, not CSRF's)."""
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    return page.request.post(
        f"{server.url}{path}",
        form={**(data or {}), "csrfmiddlewaretoken": token},
        headers={"X-CSRFToken": token},
        max_redirects=0,
    )


def refused(page, server, path: str, data: dict | None = None) -> None:
    response = post(page, server, path, data)
    assert response.status == 403, (path, response.status)
    assert "CSRF" not in response.text(), path


def serious_axe_findings(page, within: str | None = None) -> list[str]:
    """axe-core's serious and critical violations on the page, or within one part of it (a form added to a page
    whose other parts are checked elsewhere)."""
    from axe_playwright_python.sync_playwright import Axe

    found = Axe().run(page, context=within).response["violations"]
    return [
        f"{v['id']}: {v['help']} {v['nodes'][0]['target']}"
        for v in found
        if v["impact"] in ("serious", "critical")
    ]


def audited(action: str) -> int:
    return AuditEntry.objects.filter(action=action).count()


# --- refused roles ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("username", ["acme-admin", "acme-viewer"])
def test_tenant_roles_see_no_fleet_controls_and_are_refused_the_posts(page, server, world, username):
    # acme's dedicated cluster: its pages are the tenant's to read, its controls are not.
    own = Cluster.objects.get(name="euw-h100-c")
    node = own.nodes.filter(state="ready").first()
    job = Job.objects.filter(tenant__slug="acme", state="Running").first()
    base = Blueprint.objects.get(name="gpu-base")
    rollout = Rollout.objects.get(pk=world["rollout"])
    log_in(page, server.url, username, PASSWORD)
    page.goto(f"{server.url}/clusters/{own.pk}/")
    assert page.locator("#cluster-assign-form, #cluster-reconcile").count() == 0
    page.goto(f"{server.url}/nodes/{node.pk}/")
    assert page.locator("#node-actions").count() == 0
    page.goto(f"{server.url}/drift/")
    assert page.locator("#drift-sweep").count() == 0
    page.goto(f"{server.url}/fleet/")
    assert page.locator("#automation-switch").count() == 0
    page.goto(f"{server.url}/jobs/{job.pk}/")
    assert page.locator("#job-cancel").count() == (1 if username == "acme-admin" else 0)
    nav = page.get_by_role("navigation", name="Main").inner_text()
    assert "Blueprints" not in nav and "Rollouts" not in nav
    assert ("Users" in nav) is (username == "acme-admin")

    yes = {"confirmed": "yes"}
    for path, data in [
        (f"/blueprints/{base.pk}/versions/new/", {"content": "addons: []", "create": "1"}),
        (f"/blueprints/{base.pk}/versions/2/activate/", yes),
        ("/blueprints/import/", {"document": blueprint_yaml.dump(base), "apply": "1"}),
        ("/rollouts/new/", {"version": f"{base.pk}:2", "target_kind": "tracking", "start": "1"}),
        (f"/rollouts/{rollout.pk}/cancel/", yes),
        (f"/rollouts/{rollout.pk}/rollback/", yes),
        (f"/clusters/{own.pk}/blueprint/", {"assignment": f"track:{base.pk}", **yes}),
        (f"/clusters/{own.pk}/reconcile/", {}),
        (f"/nodes/{node.pk}/cordon/", yes),
        (f"/nodes/{node.pk}/drain/", yes),
        (f"/nodes/{node.pk}/uncordon/", {}),
        ("/drift/sweep/", {}),
        ("/automation/", {"mode": "paused", **yes}),
    ]:
        refused(page, server, path, data)
    if username == "acme-viewer":
        refused(page, server, f"/jobs/{job.pk}/cancel/", yes)
        refused(page, server, f"/users/{User.objects.get(username='acme-admin').pk}/remove/", yes)
        assert page.goto(f"{server.url}/users/").status == 403
    # Nothing moved.
    assert BlueprintVersion.objects.filter(blueprint=base).count() == 2
    assert Rollout.objects.get(pk=world["rollout"]).state == "Pending" and Rollout.objects.count() == 1
    node.refresh_from_db()
    job.refresh_from_db()
    assert node.state == "ready" and job.state == "Running"
    assert not AutomationSwitch.objects.filter(mode="paused").exists()
    assert User.objects.get(username="acme-admin").is_active


# --- blueprint versions and YAML import ----------------------------------------------------------------------


def test_a_new_version_is_validated_previewed_with_its_diffs_created_and_activated(page, server, world):
    base = Blueprint.objects.get(name="gpu-base")
    log_in(page, server.url, world["admin"], PASSWORD)
    page.goto(f"{server.url}/blueprints/{base.pk}/")
    page.locator("#version-new-link").click()
    page.wait_for_url(f"{server.url}/blueprints/{base.pk}/versions/new/")
    editor = page.locator("#id_content")
    original = editor.input_value()
    assert "gpu-operator" in original and "24.9.0" in original  # starts from v2's own content

    # Invalid YAML, then a valid document with a bad field: inline errors, 400, nothing written.
    editor.fill("addons: [")
    response = submit(page, page.locator("#version-preview"))
    assert response.status == 400
    assert "not valid YAML" in page.locator("#field-content .field-errors").inner_text()
    editor.fill("addons:\n- name: x\n  version: 1\nnonsense: true\n")
    response = submit(page, page.locator("#version-create"))
    assert response.status == 400
    assert "unknown keys: nonsense" in page.locator("#field-content .field-errors").inner_text()
    assert base.versions.count() == 2

    # Preview: the diff against the active version (v2), nothing written.
    editor.fill(original.replace("24.9.0", "25.3.0"))
    page.locator("#id_notes").fill("gpu-operator 25.3.0")
    response = submit(page, page.locator("#version-preview"))
    assert response.status == 200
    diffs = page.locator("#version-diffs").inner_text()
    assert "Against the active version v2" in diffs and "gpu-operator changed" in diffs and "25.3.0" in diffs
    assert base.versions.count() == 2
    screenshot(page, "version-editor")
    assert serious_axe_findings(page) == []

    # With a parent, the diff against it too.
    page.locator("#id_parent").select_option("1")
    submit(page, page.locator("#version-preview"))
    assert "Against its parent v1" in page.locator("#version-diffs").inner_text()
    page.locator("#id_parent").select_option("")

    created = audited("blueprint.version_create")
    response = submit(page, page.locator("#version-create"))
    assert response.url.startswith(f"{server.url}/blueprints/{base.pk}/?from=2&to=3")
    version = base.versions.get(number=3)
    assert version.state == "draft" and version.notes == "gpu-operator 25.3.0"
    assert audited("blueprint.version_create") == created + 1
    assert "25.3.0" in page.locator("main").inner_text()  # the blueprint page's diff v2 → v3

    # Activate asks first; cancelling the confirmation leaves the draft a draft.
    activate = page.locator('td[data-version="3"] button.version-activate')
    submit(page, activate)
    assert "immutable" in page.locator("#confirm").inner_text()
    screenshot(page, "version-activate-confirm")
    assert serious_axe_findings(page) == []
    page.locator("#confirm-no").click()
    page.wait_for_url(f"{server.url}/blueprints/{base.pk}/")
    version.refresh_from_db()
    assert version.state == "draft"
    submit(page, page.locator('td[data-version="3"] button.version-activate'))
    submit(page, page.locator("#confirm-yes"))
    version.refresh_from_db()
    assert version.state == "active"
    assert "gpu-base v3 is active" in page.locator(".messages").inner_text()


def test_a_blueprint_document_is_checked_then_applied(page, server, world):
    resilient = Blueprint.objects.get(name="gpu-resilient")
    document = blueprint_yaml.dump(resilient)
    extra = (
        "- number: 3\n  state: draft\n  parent: 2\n  notes: from git\n  addons:\n  - name: nic-failover\n"
        "    repo: https://charts.example.com\n    chart: nic-failover\n    version: 1.4.0\n"
        "    namespace: lockstep\n  node_software: {}\n  policy: {}\n"
    )
    log_in(page, server.url, world["operator"], PASSWORD)
    page.goto(f"{server.url}/blueprints/")
    page.locator("#blueprint-import-link").click()
    page.locator("#id_document").fill("apiVersion: nope\n")
    response = submit(page, page.locator("#import-check"))
    assert response.status == 400
    assert "apiVersion" in page.locator("#field-document .field-errors").inner_text()

    page.locator("#id_document").fill(document + extra)
    response = submit(page, page.locator("#import-check"))
    assert response.status == 200
    assert "new version, draft" in page.locator("#import-summary").inner_text()
    assert resilient.versions.count() == 2
    screenshot(page, "blueprint-import")
    assert serious_axe_findings(page) == []
    response = submit(page, page.locator("#import-apply"))
    assert response.url == f"{server.url}/blueprints/{resilient.pk}/"
    assert "created version 3" in page.locator(".messages").inner_text()
    assert resilient.versions.get(number=3).notes == "from git"


# --- clusters, nodes, drift, automation ----------------------------------------------------------------------


def test_a_cluster_is_pinned_then_tracks_again_and_reconciles(page, server, world):
    cluster = Cluster.objects.get(name="euw-h200-d")
    resilient = cluster.blueprint
    before = (cluster.blueprint_version.number, cluster.track_latest)
    log_in(page, server.url, world["admin"], PASSWORD)
    page.goto(f"{server.url}/clusters/{cluster.pk}/")
    assert serious_axe_findings(page, "#cluster-assign-form") == []
    page.locator("#id_assignment").select_option(f"pin:{resilient.pk}:1")
    page.locator("#id_reason").fill("holding for the vendor")
    submit(page, page.locator("#cluster-assign"))
    assert "pin gpu-resilient v1" in page.locator("#confirm").inner_text().lower()
    page.locator("#confirm-no").click()
    cluster.refresh_from_db()
    assert (cluster.blueprint_version.number, cluster.track_latest) == before
    page.locator("#id_assignment").select_option(f"pin:{resilient.pk}:1")
    page.locator("#id_reason").fill("holding for the vendor")
    submit(page, page.locator("#cluster-assign"))
    submit(page, page.locator("#confirm-yes"))
    cluster.refresh_from_db()
    assert (cluster.blueprint_version.number, cluster.track_latest) == (1, False)
    assert cluster.pinned_reason == "holding for the vendor"

    page.locator("#id_assignment").select_option(f"track:{resilient.pk}")
    submit(page, page.locator("#cluster-assign"))
    assert "does not move at once" in page.locator("#confirm").inner_text()
    submit(page, page.locator("#confirm-yes"))
    cluster.refresh_from_db()  # tracking moves it by a rollout of v2, through its soak and gate, not at once
    assert (cluster.blueprint_version.number, cluster.track_latest) == (1, True)
    tracking = Rollout.objects.get(version__number=2, clusters__cluster=cluster, finished_at__isnull=True)
    page.goto(f"{server.url}/rollouts/{tracking.pk}/")  # cancelled, so the world stays free for later tests
    submit(page, page.locator('button[data-action="cancel"]'))
    if page.locator("#confirm-yes").count():
        submit(page, page.locator("#confirm-yes"))
    assert Rollout.objects.get(pk=tracking.pk).state == "Cancelled"
    page.goto(f"{server.url}/clusters/{cluster.pk}/")

    reconciled = audited("cluster.reconcile")
    submit(page, page.locator("#cluster-reconcile"))
    assert "Reconcile" in page.locator(".messages").inner_text()
    assert audited("cluster.reconcile") == reconciled + 1


def test_a_node_is_cordoned_drained_and_uncordoned_with_confirmations(page, server, world):
    node = Node.objects.filter(cluster__name="euw-h200-d", state="ready").order_by("hostname").first()
    cordons, drains = audited("node.cordon"), audited("node.drain")
    log_in(page, server.url, world["operator"], PASSWORD)
    page.goto(f"{server.url}/nodes/{node.pk}/")
    assert serious_axe_findings(page, "#node-actions") == []
    submit(page, page.locator('#node-actions button[data-action="cordon"]'))
    screenshot(page, "node-cordon-confirm")
    page.locator("#confirm-no").click()
    node.refresh_from_db()
    assert node.state == "ready"
    page.locator("#node-reason-cordon").fill("flaky fan")
    submit(page, page.locator('#node-actions button[data-action="cordon"]'))
    submit(page, page.locator("#confirm-yes"))
    node.refresh_from_db()
    assert node.state == "cordoned" and node.state_reason == "flaky fan"
    submit(page, page.locator('#node-actions button[data-action="uncordon"]'))  # no confirmation
    node.refresh_from_db()
    assert node.state == "ready"
    submit(page, page.locator('#node-actions button[data-action="drain"]'))
    submit(page, page.locator("#confirm-yes"))
    node.refresh_from_db()
    assert node.state == "draining"
    assert (audited("node.cordon"), audited("node.drain")) == (cordons + 1, drains + 1)


def test_a_drift_sweep_reports_what_it_did(page, server, world):
    log_in(page, server.url, world["operator"], PASSWORD)
    page.goto(f"{server.url}/drift/")
    submit(page, page.locator("#drift-sweep"))
    message = page.locator(".messages").inner_text()
    entry = AuditEntry.objects.get(action="drift.sweep")
    counts = entry.changes
    assert counts["clusters"] == Cluster.objects.filter(blueprint_version__isnull=False).count() == 4
    assert message.startswith(
        f"Drift sweep: {counts['clusters']} clusters observed ({counts['checks']} add-on"
    )
    assert f"{counts['opened']} finding" in message and f"{counts['resolved']} resolved" in message


# --- rollouts ------------------------------------------------------------------------------------------------


def test_a_rollout_is_previewed_then_started_as_previewed(page, server, world):
    clusters = list(Cluster.objects.filter(blueprint__name="gpu-resilient").order_by("name"))
    before = Rollout.objects.count()
    log_in(page, server.url, world["operator"], PASSWORD)
    page.goto(f"{server.url}/rollouts/")
    page.locator("#rollout-new-link").click()
    page.wait_for_url(f"{server.url}/rollouts/new/")
    assert page.locator("#rollout-start").count() == 0  # no start before a preview
    version = Blueprint.objects.get(name="gpu-resilient").versions.get(number=2)
    page.locator("#id_version").select_option(f"{version.blueprint_id}:2")
    page.get_by_label("named clusters").check()
    page.locator("#id_clusters").select_option([str(c.pk) for c in clusters])
    page.locator("#id_canary").fill("1")
    page.locator("#id_batch_size").fill("1")

    # A cluster already in the world's rollout is refused inline, as the service refuses it.
    busy = Cluster.objects.get(name="use-h100-a")
    page.locator("#id_clusters").select_option([str(c.pk) for c in clusters] + [str(busy.pk)])
    response = submit(page, page.locator("#rollout-preview"))
    assert response.status == 400
    assert "already in an unfinished rollout: use-h100-a" in page.locator("#field-clusters").inner_text()
    page.locator("#id_clusters").select_option([str(c.pk) for c in clusters])

    response = submit(page, page.locator("#rollout-preview"))
    assert response.status == 200
    rows = page.locator("#rollout-plan-table tbody tr")
    assert rows.count() == 2
    assert rows.nth(0).inner_text().startswith("1 (canary)")
    assert [rows.nth(i).locator(".plan-cluster").inner_text() for i in range(2)] == [c.name for c in clusters]
    # What the first is on now: v2 as the world is built, v1 where the pin-and-track walk above ran first on this
    # worker (tracking starts a rollout to v2, which it cancels). Moving to v2 is an effective change only from v1.
    now = clusters[0].blueprint_version.number
    assert f"(now gpu-resilient v{now})" in rows.nth(0).inner_text()
    assert ("effective change" in rows.nth(0).inner_text()) == (now != 2)
    assert Rollout.objects.count() == before  # a preview writes nothing
    screenshot(page, "rollout-preview")
    assert serious_axe_findings(page) == []

    started = audited("rollout.start")
    submit(page, page.locator("#rollout-start"))
    rollout = Rollout.objects.order_by("-pk").first()
    assert Rollout.objects.count() == before + 1
    page.wait_for_url(f"{server.url}/rollouts/{rollout.pk}/")
    assert sorted(rollout.clusters.values_list("cluster__name", "batch_index")) == [
        (clusters[0].name, 0),
        (clusters[1].name, 1),
    ]
    assert audited("rollout.start") == started + 1


def test_rollback_and_cancel_ask_first_and_cancelling_the_confirmation_changes_nothing(page, server, world):
    rollout = Rollout.objects.get(pk=world["rollout"])  # the world's, pending
    log_in(page, server.url, world["admin"], PASSWORD)
    page.goto(f"{server.url}/rollouts/{rollout.pk}/")
    page.locator("#reason-cancel").fill("wrong window")
    submit(page, page.locator('button[data-action="cancel"]'))
    assert f"Cancel rollout #{rollout.pk}" in page.locator("h1").inner_text()
    screenshot(page, "rollout-cancel-confirm")
    page.locator("#confirm-no").click()
    page.wait_for_url(f"{server.url}/rollouts/{rollout.pk}/")
    rollout.refresh_from_db()
    assert rollout.state == "Pending"
    page.locator("#reason-cancel").fill("wrong window")
    submit(page, page.locator('button[data-action="cancel"]'))
    submit(page, page.locator("#confirm-yes"))
    rollout.refresh_from_db()
    assert rollout.state == "Cancelled" and "wrong window" in rollout.reason

    # Roll back (now offered) asks too.
    submit(page, page.locator('button[data-action="rollback"]'))
    page.locator("#confirm-no").click()
    rollout.refresh_from_db()
    assert rollout.state == "Cancelled"
    submit(page, page.locator('button[data-action="rollback"]'))
    submit(page, page.locator("#confirm-yes"))
    rollout.refresh_from_db()
    assert rollout.state == "RolledBack"


# --- jobs, users, tokens ---------------------------------------------------------------------------------------


def test_a_tenant_admin_cancels_its_own_job_after_confirming(page, server, world):
    job = Job.objects.filter(tenant__slug="acme", state="Running").order_by("pk").first()
    log_in(page, server.url, "acme-admin", PASSWORD)
    page.goto(f"{server.url}/jobs/{job.pk}/")
    submit(page, page.locator("#job-cancel"))
    assert f"Cancel {job.name}" in page.locator("h1").inner_text()
    page.locator("#confirm-no").click()
    job.refresh_from_db()
    assert job.state == "Running"
    submit(page, page.locator("#job-cancel"))
    submit(page, page.locator("#confirm-yes"))
    job.refresh_from_db()
    assert job.state == "Cancelled"
    assert page.locator("#job-cancel").count() == 0
    # Another tenant's job is not there to cancel.
    other = Job.objects.filter(tenant__slug="nimbus", state="Running").first()
    assert post(page, server, f"/jobs/{other.pk}/cancel/", {"confirmed": "yes"}).status == 404
    other.refresh_from_db()
    assert other.state == "Running"


def test_a_tenant_admin_adds_and_removes_its_own_users_only(page, server, world):
    log_in(page, server.url, "acme-admin", PASSWORD)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Users").click()
    page.wait_for_url(f"{server.url}/users/")
    table = page.locator("#user-table").inner_text()
    assert "acme-viewer" in table and "nimbus" not in table
    page.locator("#id_username").fill("bad name!")
    response = submit(page, page.locator("#user-add"))
    assert response.status == 400 and page.locator("#field-username .field-errors").count() == 1
    page.locator("#id_username").fill("acme-viewer")
    response = submit(page, page.locator("#user-add"))
    assert response.status == 400 and "exists" in page.locator("#field-username").inner_text()
    page.locator("#id_username").fill("acme-intern")
    page.locator("#id_role").select_option("tenant-viewer")
    submit(page, page.locator("#user-add"))
    assert page.locator("#new-password").inner_text()
    intern = User.objects.get(username="acme-intern")
    assert intern.membership.tenant.slug == "acme" and intern.membership.role == "tenant-viewer"
    screenshot(page, "users-page")
    assert serious_axe_findings(page) == []

    disable = page.locator(f'tr[data-user="{intern.pk}"]').get_by_role("button", name="Disable")
    submit(page, disable)
    page.locator("#confirm-no").click()
    intern.refresh_from_db()
    assert intern.is_active
    submit(page, disable)
    submit(page, page.locator("#confirm-yes"))
    intern.refresh_from_db()
    assert not intern.is_active
    # Another tenant's user: not listed, and not there to remove.
    nimbus_viewer = User.objects.get(username="nimbus-viewer")
    assert post(page, server, f"/users/{nimbus_viewer.pk}/remove/", {"confirmed": "yes"}).status == 404
    nimbus_viewer.refresh_from_db()
    assert nimbus_viewer.is_active


def test_token_revoke_asks_first(page, server, world):
    log_in(page, server.url, "acme-viewer", PASSWORD)
    page.goto(f"{server.url}/tokens/")
    page.locator("#id_name").fill("laptop")
    submit(page, page.get_by_role("button", name="Create token"))
    token = ApiToken.objects.get(name="laptop")
    submit(page, page.get_by_role("button", name="Revoke"))
    assert "cannot be undone" in page.locator("#confirm").inner_text()
    page.locator("#confirm-no").click()
    token.refresh_from_db()
    assert token.revoked_at is None
    submit(page, page.get_by_role("button", name="Revoke"))
    submit(page, page.locator("#confirm-yes"))
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_the_automation_switch_asks_first_and_an_operator_may_only_dry_run_or_pause(page, server, world):
    log_in(page, server.url, world["admin"], PASSWORD)
    page.goto(f"{server.url}/fleet/")
    assert page.locator("#automation-mode").inner_text() == "active"
    assert serious_axe_findings(page, "#automation-switch") == []
    page.get_by_label("Paused").check()
    page.locator("#automation-form #id_reason").fill("incident review")
    submit(page, page.locator("#automation-set"))
    assert "Nothing acts anywhere" in page.locator("#confirm").inner_text()
    screenshot(page, "automation-confirm")
    page.locator("#confirm-no").click()
    assert not AutomationSwitch.objects.filter(mode="paused").exists()
    page.get_by_label("Dry run").check()
    submit(page, page.locator("#automation-set"))
    submit(page, page.locator("#confirm-yes"))
    assert AutomationSwitch.objects.get().mode == "dry-run"
    assert page.locator("#automation-mode").inner_text() == "dry-run"
    assert (
        AuditEntry.objects.filter(action="automation.switch", changes__mode=["active", "dry-run"]).count()
        == 1
    )

    # The operator may dry-run or pause (DESIGN), not set it active again: it sees only those two, and the post
    # for active is refused (as the API refuses it).
    page.context.clear_cookies()
    log_in(page, server.url, world["operator"], PASSWORD)
    page.goto(f"{server.url}/fleet/")
    assert page.locator("#automation-mode").inner_text() == "dry-run"
    assert page.get_by_label("Active").count() == 0
    refused(page, server, "/automation/", {"mode": "active", "confirmed": "yes"})
    assert AutomationSwitch.objects.get().mode == "dry-run"
    page.goto(f"{server.url}/fleet/")
    page.get_by_label("Paused").check()
    submit(page, page.locator("#automation-set"))
    submit(page, page.locator("#confirm-yes"))
    assert AutomationSwitch.objects.get().mode == "paused"
    assert page.locator("#automation-mode").inner_text() == "paused"
