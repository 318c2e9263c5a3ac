"""Bad input that matters gets a clear 4xx and changes nothing: oversized and truncated bodies, wrong content
types, unknown enum values, ids of another tenant's objects, negative and huge numbers, unicode in names, and
YAML documents that try to blow up the reader. (Telemetry batches have their own in tests/telemetry/test_ingest.py,
the alias bomb and deep nesting of the blueprint document in tests/fleet/test_api.py.)"""

import json

import pytest
from django.urls import reverse

from fleet.models import Blueprint, Fleet
from jobs.models import Job
from tenancy.models import ApiToken, Tenant
from tests.support.factories import make_blueprint, make_cluster, make_fleet, make_node
from tests.support.jobs import submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(tenant_a, tenant_b):
    fleet = make_fleet("bad-input")
    shared = make_cluster(fleet, "shared-one", driver="simulated")
    mine = make_cluster(fleet, "acme-only", dedicated_tenant=tenant_a, driver="simulated")
    theirs = make_cluster(fleet, "globex-only", dedicated_tenant=tenant_b, driver="simulated")
    for cluster in (shared, mine, theirs):
        for _ in range(2):
            make_node(cluster)
    blueprint, _ = make_blueprint("bad-input-bp")
    return {
        "fleet": fleet,
        "shared": shared,
        "mine": mine,
        "theirs": theirs,
        "blueprint": blueprint,
        "their_job": submit(theirs, tenant_b, gpus=8, name="globex-secret-run"),
    }


def detail_or_fields(response) -> dict:
    body = response.json()
    assert isinstance(body, dict) and body, body
    return body


# --- oversized and truncated bodies -------------------------------------------------------------------------------


def test_a_body_over_the_upload_limit_is_refused_with_a_4xx(api, users, settings):
    api.as_token(users["operator"])
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024
    body = json.dumps({"name": "big", "description": "x" * (128 * 1024)})
    response = api.generic("POST", "/api/v1/fleets/", body, content_type="application/json")
    assert response.status_code in (400, 413), response.content[:300]
    assert not Fleet.objects.filter(name="big").exists()


def test_an_oversized_blueprint_document_is_refused(api, users, world):
    api.as_token(users["operator"])
    url = f"/api/v1/blueprints/{world['blueprint'].pk}/yaml/"
    document = "name: bad-input-bp\ndescription: " + "y" * (600 * 1024) + "\n"
    response = api.generic("PUT", url, document, content_type="application/yaml")
    assert response.status_code == 400 and "document" in detail_or_fields(response)


@pytest.mark.parametrize(
    "body", ['{"name": "cut', '{"name": "cut-off", "description":', "[", '{"name": "x"}}']
)
def test_truncated_json_is_a_400_naming_the_parse_error(api, users, body):
    api.as_token(users["operator"])
    response = api.generic("POST", "/api/v1/fleets/", body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert "detail" in detail_or_fields(response)
    assert Fleet.objects.count() == 0


def test_truncated_yaml_document_is_a_400(api, users, world):
    api.as_token(users["operator"])
    url = f"/api/v1/blueprints/{world['blueprint'].pk}/yaml/"
    response = api.generic(
        "PUT",
        url,
        "name: bad-input-bp\nversions:\n  - number: 1\n    addons: [{name: x",
        content_type="application/yaml",
    )
    assert response.status_code == 400, response.content


# --- wrong content types ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", "image/png", "application/yaml"])
def test_a_json_endpoint_refuses_other_media_types_with_415(api, users, content_type):
    api.as_token(users["operator"])
    response = api.generic("POST", "/api/v1/fleets/", "name: x", content_type=content_type)
    assert response.status_code == 415, (content_type, response.content)
    assert Fleet.objects.count() == 0


def test_the_yaml_endpoint_refuses_json_and_text(api, users, world):
    api.as_token(users["operator"])
    url = f"/api/v1/blueprints/{world['blueprint'].pk}/yaml/"
    for content_type in ("application/json", "text/plain"):
        response = api.generic("PUT", url, '{"name": "bad-input-bp"}', content_type=content_type)
        assert response.status_code == 415, (content_type, response.content)


def test_not_utf8_json_is_a_400(api, users):
    api.as_token(users["operator"])
    response = api.generic(
        "POST", "/api/v1/fleets/", '{"name": "caf\xe9"}'.encode("latin-1"), content_type="application/json"
    )
    assert response.status_code == 400, response.content


# --- unknown enum values -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, body, field",
    [
        ("/api/v1/faults/", {"node": 1, "kind": "meteor_strike"}, "kind"),
        ("/api/v1/tenants/", {"name": "Enum Co", "slug": "enum-co", "tier": "platinum"}, "tier"),
        ("/api/v1/tokens/", {"name": "t", "scope": "root"}, "scope"),
        ("/api/v1/users/", {"username": "enum-user", "role": "overlord"}, "role"),
        ("/api/v1/blueprints/", {"name": "enum-bp", "drift_mode": "ignore-forever"}, "drift_mode"),
        (
            "/api/v1/notification-channels/",
            {"name": "c", "url": "https://x.example", "kind": "carrier-pigeon"},
            "kind",
        ),
    ],
)
def test_unknown_enum_values_are_a_400_naming_the_field(api, users, url, body, field):
    api.as_token(users["provider-admin"])
    response = api.post(url, body, format="json")
    assert response.status_code == 400 and field in detail_or_fields(response), response.content


@pytest.mark.parametrize(
    "query", ["state=Exploded", "kind=teleport", "group=galaxy", "bucket=fortnight", "severity=apocalyptic"]
)
def test_unknown_enum_values_in_filters_are_a_400(api, users, query):
    api.as_token(users["operator"])
    path = (
        "/api/v1/stats/"
        if query.startswith(("group", "bucket"))
        else ("/api/v1/faults/" if query.startswith(("kind", "severity")) else "/api/v1/jobs/")
    )
    response = api.get(f"{path}?{query}")
    assert response.status_code == 400, response.content
    assert query.split("=")[0] in detail_or_fields(response)


# --- ids of another tenant's objects ------------------------------------------------------------------------------


def test_a_job_cannot_be_submitted_on_another_tenants_cluster(api, users, world):
    api.as_token(users["tenant-admin"])
    response = api.post(
        "/api/v1/jobs/", {"name": "sneaky", "cluster": world["theirs"].pk, "gpus": 8}, format="json"
    )
    assert response.status_code in (400, 403), response.content
    assert not Job.objects.filter(name="sneaky").exists()


def test_a_filter_naming_another_tenants_object_answers_as_one_that_does_not_exist(api, users, world):
    """A foreign id must tell nothing: the same answer as an id nobody has."""
    api.as_token(users["tenant-admin"])
    for path, key, foreign in [
        ("/api/v1/jobs/", "cluster", world["theirs"].pk),
        ("/api/v1/nodes/", "cluster", world["theirs"].pk),
        ("/api/v1/faults/", "cluster", world["theirs"].pk),
        ("/api/v1/actions/", "job", world["their_job"].pk),
        ("/api/v1/jobs/", "tenant", world["their_job"].tenant_id),
    ]:
        theirs = api.get(f"{path}?{key}={foreign}")
        nobody = api.get(f"{path}?{key}=987654321")
        assert theirs.status_code == nobody.status_code == 400, (path, theirs.content, nobody.content)
        assert "globex" not in theirs.content.decode().lower()


def test_another_tenants_job_is_404_everywhere_a_tenant_names_it(api, client, users, world):
    job = world["their_job"]
    api.as_token(users["tenant-admin"])
    for method, path in [
        ("get", f"/api/v1/jobs/{job.pk}/"),
        ("get", f"/api/v1/jobs/{job.pk}/timeline/"),
        ("get", f"/api/v1/jobs/{job.pk}/diagnosis/"),
        ("post", f"/api/v1/jobs/{job.pk}/cancel/"),
        ("get", f"/api/v1/events/?topic=job-{job.pk}"),
    ]:
        response = getattr(api, method)(path)
        assert response.status_code in (403, 404), (path, response.status_code)
        assert b"globex" not in response.content.lower()
    client.force_login(users["tenant-admin"])
    assert client.get(reverse("job-detail", args=[job.pk])).status_code == 404
    assert client.get(reverse("fault-overview") + f"?cluster={world['theirs'].pk}").status_code == 404
    assert Job.objects.get(pk=job.pk).state == "Running"


def test_a_tenant_admin_cannot_make_tokens_for_another_tenants_user(api, users):
    api.as_token(users["tenant-admin"])
    before = ApiToken.objects.count()
    response = api.post(
        "/api/v1/tokens/", {"name": "borrowed", "user": users["other-viewer"].username}, format="json"
    )
    assert response.status_code in (400, 403, 404), response.content
    assert ApiToken.objects.count() == before


def test_a_tenant_admin_cannot_change_another_tenant(api, users, tenant_b):
    api.as_token(users["tenant-admin"])
    response = api.patch(f"/api/v1/tenants/{tenant_b.pk}/", {"name": "Pwned"}, format="json")
    assert response.status_code in (403, 404)
    assert Tenant.objects.get(pk=tenant_b.pk).name == "Globex"


# --- negative and huge numbers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [-8, 0, 10**6, 2**63, 10**40, 8.5, "eight", None, True])
def test_job_sizes_out_of_range_are_a_400(api, users, world, gpus):
    api.as_token(users["tenant-admin"])
    response = api.post(
        "/api/v1/jobs/", {"name": "sized", "cluster": world["mine"].pk, "gpus": gpus}, format="json"
    )
    assert response.status_code == 400 and "gpus" in detail_or_fields(response), response.content
    assert not Job.objects.filter(name="sized").exists()


@pytest.mark.parametrize("value", [-1, -(2**63), 2**31, 2**63, 10**40])
def test_fleet_caps_out_of_range_are_a_400(api, users, value):
    api.as_token(users["operator"])
    response = api.post("/api/v1/fleets/", {"name": "capped", "max_cordoned_nodes": value}, format="json")
    assert response.status_code == 400, response.content
    assert not Fleet.objects.filter(name="capped").exists()


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/jobs/?page=-1",
        "/api/v1/jobs/?page=0",
        f"/api/v1/jobs/?page={10**30}",
        f"/api/v1/jobs/{10**30}/",
        "/api/v1/jobs/-1/",
        f"/api/v1/events/?after={10**30}",
        f"/api/v1/stats/?hours={10**30}",
        "/api/v1/stats/?hours=-3",
        f"/api/v1/blueprints/1/diff/?from=-1&to={10**30}",
        f"/api/v1/blueprints/1/versions/{10**9 - 1}/",
    ],
)
def test_negative_and_huge_numbers_in_urls_are_4xx(api, users, path):
    api.as_token(users["operator"])
    response = api.get(path)
    assert 400 <= response.status_code < 500, (path, response.status_code, response.content[:200])
    assert response["Content-Type"].startswith("application/json")


@pytest.mark.parametrize("page_size", [10**30, 10**6, -5, 0, "many"])
def test_a_page_size_out_of_range_falls_back_within_the_cap(api, users, world, page_size):
    """DRF's rule: a page size that is not a whole number in range is not an error; the page stays capped."""
    from controlplane.pagination import Pagination

    api.as_token(users["operator"])
    response = api.get(f"/api/v1/nodes/?page_size={page_size}")
    assert response.status_code == 200
    assert len(response.json()["results"]) <= Pagination.max_page_size


@pytest.mark.parametrize(
    "config", [{"days": -1}, {"days": 1e308}, {"gpus": 2**70}, {"seed": -(2**80)}, {"checkpoint_minutes": 0}]
)
def test_whatif_numbers_out_of_range_are_a_400(api, users, config):
    api.as_token(users["operator"])
    response = api.post("/api/v1/whatif/", config, format="json")
    assert response.status_code == 400, response.content


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_json_nan_and_infinity_are_refused(api, users, world, literal):
    api.as_token(users["tenant-admin"])
    body = (
        f'{{"name": "nan-job", "cluster": {world["mine"].pk}, "gpus": 8, "seconds_per_iteration": {literal}}}'
    )
    response = api.generic("POST", "/api/v1/jobs/", body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert not Job.objects.filter(name="nan-job").exists()


# --- unicode in names ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["東京リージョン", "Zürich ☃ région", "مرحبا", "🚀 launch", "a\u200bb", "e\u0301"]
)
def test_unicode_names_round_trip_and_render(api, client, users, name):
    api.as_token(users["operator"])
    created = api.post(
        "/api/v1/fleets/", {"name": name, "description": f"{name} — description"}, format="json"
    )
    assert created.status_code == 201, created.content
    fetched = api.get(f"/api/v1/fleets/{created.json()['id']}/").json()
    assert fetched["name"] == name
    make_cluster(Fleet.objects.get(name=name), name="unicode-cluster")
    client.force_login(users["operator"])
    page = client.get(reverse("fleet-overview"))
    assert page.status_code == 200


def test_unicode_job_and_tenant_names(api, users, world):
    api.as_token(users["tenant-admin"])
    job = api.post(
        "/api/v1/jobs/", {"name": "学習-ジョブ 🧠", "cluster": world["mine"].pk, "gpus": 8}, format="json"
    )
    assert job.status_code == 201, job.content
    assert api.get(f"/api/v1/jobs/{job.json()['id']}/").json()["name"] == "学習-ジョブ 🧠"
    api.as_token(users["provider-admin"])
    tenant = api.post("/api/v1/tenants/", {"name": "Ünïcödé GmbH", "slug": "unicode-gmbh"}, format="json")
    assert tenant.status_code == 201 and tenant.json()["name"] == "Ünïcödé GmbH"


@pytest.mark.parametrize(
    "url, body",
    [
        ("/api/v1/fleets/", {"name": "nul\x00fleet"}),
        ("/api/v1/jobs/", {"name": "nul\x00job", "cluster": 1, "gpus": 8}),
        ("/api/v1/tokens/", {"name": "nul\x00token"}),
    ],
)
def test_nul_characters_are_a_400(api, users, url, body):
    api.as_token(users["provider-admin"])
    response = api.post(url, body, format="json")
    assert response.status_code == 400, response.content


@pytest.mark.parametrize("name", ["Ünicode", "UPPER", "has space", "日本", "-leading", "x" * 64])
def test_blueprint_names_outside_their_alphabet_are_a_400(api, users, name):
    api.as_token(users["operator"])
    response = api.post("/api/v1/blueprints/", {"name": name}, format="json")
    assert response.status_code == 400 and "name" in detail_or_fields(response), response.content
    assert not Blueprint.objects.filter(name=name).exists()


# --- YAML that tries to blow up the reader ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "document",
    [
        # billion laughs, nine levels deep
        "\n".join(
            ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
            + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
        )
        + "\n",
        # an alias without its anchor, and a merge key pulling an anchor in
        "name: bad-input-bp\nversions: *nowhere\n",
        "base: &base {name: bad-input-bp}\n<<: *base\n",
        # Python object tags: the safe reader must not construct them
        "!!python/object/apply:os.system ['echo pwned']\n",
        "name: !!python/name:os.system\n",
        # a huge number of keys, a key that is a mapping, a scalar that is not a mapping at all
        "{" + ", ".join(f"k{i}: {i}" for i in range(20000)) + "}\n",
        "? {a: 1}\n: value\n",
        "just a string\n",
        "- a list\n- not a mapping\n",
        "name: bad-input-bp\nname: twice\n",
    ],
)
def test_hostile_yaml_documents_are_a_400_and_change_nothing(api, users, world, document):
    api.as_token(users["operator"])
    blueprint = world["blueprint"]
    versions = blueprint.versions.count()
    url = f"/api/v1/blueprints/{blueprint.pk}/yaml/"
    response = api.generic("PUT", url, document, content_type="application/yaml")
    assert response.status_code == 400, response.content[:300]
    assert blueprint.versions.count() == versions
    assert Blueprint.objects.get(pk=blueprint.pk).description == blueprint.description
