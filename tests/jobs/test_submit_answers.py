"""Issue 54 (low): the job-submit answers told a tenant a shared cluster's driver and how many of its nodes were free,
and that another tenant's dedicated cluster existed. Now a tenant gets one answer for every cluster it may not put a
job on, the same as for an id that names no cluster, and a capacity refusal says what the job needs, not what is
free."""

import re

import pytest

from fleet.models import Cluster
from jobs.models import Job
from jobs.services.jobs import job_submit
from tests.support.factories import make_cluster, make_node

pytestmark = pytest.mark.django_db

NO_SUCH = {"cluster": ["no such cluster for this tenant"]}


@pytest.fixture
def clusters(tenant_a, tenant_b, users):
    shared_sim = make_cluster(name="shared-sim", driver="simulated")
    shared_real = make_cluster(shared_sim.fleet, name="shared-k8s", driver="kubernetes")
    shared_slurm = make_cluster(shared_sim.fleet, name="shared-slurm", driver="slurm")
    theirs_sim = make_cluster(
        shared_sim.fleet, name="globex-sim", driver="simulated", dedicated_tenant=tenant_b
    )
    theirs_real = make_cluster(
        shared_sim.fleet, name="globex-k8s", driver="kubernetes", dedicated_tenant=tenant_b
    )
    for cluster in (shared_sim, shared_real, shared_slurm, theirs_sim, theirs_real):
        for i in range(3):
            make_node(cluster, f"{cluster.name}-{i}")
    # Another tenant holds one of the shared simulated cluster's three nodes.
    job_submit(actor=users["operator"], tenant=tenant_b, cluster=shared_sim, name="globex", gpus=8)
    return {
        "shared_sim": shared_sim,
        "shared_real": shared_real,
        "shared_slurm": shared_slurm,
        "theirs_sim": theirs_sim,
        "theirs_real": theirs_real,
    }


def submit(api, cluster_id, **extra):
    return api.post(
        "/api/v1/jobs/", {"name": "probe", "cluster": cluster_id, "gpus": 8, **extra}, format="json"
    )


def test_a_tenant_gets_one_answer_for_a_cluster_it_may_not_use_and_for_none(api, users, clusters, tenant_a):
    api.as_token(users["tenant-admin"], "write")
    missing = Cluster.objects.order_by("-pk").first().pk + 1000
    answers = {
        name: submit(api, cluster_id, **extra)
        for name, cluster_id, extra in [
            ("none", missing, {}),
            ("none with hosts", missing, {"hostnames": ["x-0"]}),
            ("theirs, simulated", clusters["theirs_sim"].pk, {}),
            ("theirs, real", clusters["theirs_real"].pk, {}),
            ("theirs, real, with its hosts", clusters["theirs_real"].pk, {"hostnames": ["globex-k8s-0"]}),
            ("shared kubernetes", clusters["shared_real"].pk, {}),
            ("shared slurm", clusters["shared_slurm"].pk, {}),
            (
                "shared kubernetes, with its hosts",
                clusters["shared_real"].pk,
                {"hostnames": ["shared-k8s-0"]},
            ),
        ]
    }
    seen = {(answer.status_code, answer.content) for answer in answers.values()}
    assert seen == {(400, b'{"cluster":["no such cluster for this tenant"]}')}, {
        name: (a.status_code, a.content) for name, a in answers.items()
    }
    assert not Job.objects.filter(name="probe").exists()
    # A provider, for a tenant, is refused another tenant's dedicated cluster the same way.
    api.as_token(users["operator"], "write")
    for cluster in (clusters["theirs_sim"], clusters["theirs_real"]):
        answer = submit(api, cluster.pk, tenant=tenant_a.pk)
        assert (answer.status_code, answer.json()) == (400, NO_SUCH)


def test_a_capacity_refusal_on_a_shared_cluster_says_what_the_job_needs_not_what_is_free(
    api, users, clusters
):
    api.as_token(users["tenant-admin"], "write")
    answer = submit(api, clusters["shared_sim"].pk, gpus=32)  # 4 nodes; 2 of 3 are free
    assert answer.status_code == 409, answer.content
    message = answer.json()["gpus"][0]
    assert message == "cluster shared-sim has too few free ready nodes: the job needs 4 nodes for its GPUs"
    assert not re.search(r"\b[23]\b", message)  # neither the free count nor the held one
    assert submit(api, clusters["shared_sim"].pk, gpus=16).status_code == 201  # what is free is usable


def test_the_home_form_gives_one_answer_too(client, users, clusters):
    client.force_login(users["tenant-admin"])
    missing = Cluster.objects.order_by("-pk").first().pk + 1000
    pages = {
        name: client.post("/", {"name": "probe", "cluster": cluster_id, "gpus": 8}).content.decode()
        for name, cluster_id in [
            ("none", missing),
            ("theirs", clusters["theirs_sim"].pk),
            ("theirs, real", clusters["theirs_real"].pk),
            ("shared, real", clusters["shared_real"].pk),
        ]
    }
    messages = {
        name: re.search(r'<p class="error" role="alert">(.*?)</p>', page).group(1)
        for name, page in pages.items()
    }
    assert set(messages.values()) == {
        "No such cluster for this tenant: choose one of the clusters listed."
    }, messages
    assert not Job.objects.filter(name="probe").exists()
