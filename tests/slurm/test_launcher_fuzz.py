"""Fuzzers for who a job is (issue 54, item 6): registration (``POST /api/v1/launchers/register/``) and the job-token
endpoints (``progress/``, ``snapshots/``), with bodies, job ids, headers and tokens drawn at random, on a real Slurm
running three jobs (two tenants' and one of an unmapped account). Whatever arrives: never a 5xx; a registration
answers a token only to a credential that may have that job (its tenant's, or cluster-wide) with that job's own
secret; a job endpoint accepts a job token only for its own job, and only while it is the job's newest.

Bounded: a fixed number of examples, each in a transaction rolled back after it (state stays what the setup made),
no example database; the whole file runs in well under a minute."""

import json

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from fleet.choices import ClusterKind, DriverName
from jobs.launchers import job_secret_of, launcher_credential_create, launcher_credential_revoke
from jobs.models import JobToken, SlurmJob
from jobs.services.slurm_jobs import slurm_sync
from tenancy.tokens import digest
from tests.support.factories import make_cluster, make_fleet
from tests.support.slurm import sbatch, wait

REGISTER = "/api/v1/launchers/register/"
FUZZ = hypothesis_settings(
    max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)

# The draws from the right pieces: a smaller space.
CLOSE = hypothesis_settings(
    max_examples=50,
    deadline=None,
    database=None,
    derandomize=True,  # the same draws each run: the allowed cases are always among them
    suppress_health_check=list(HealthCheck),
)

text = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
json_scalar = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text
)
anything = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
# Tokens of every shape: the kinds' prefixes with random tails, odd schemes, no header, bytes that are not ASCII
# (what a header can carry: Latin-1, as servers decode it).
header_text = st.text(alphabet=st.characters(max_codepoint=255, blacklist_categories=["Cc"]), max_size=60)
garbage_tokens = st.one_of(
    st.builds(
        lambda kind, tail: f"{kind}_{tail}", st.sampled_from(["lsl", "lsj", "lsk", "lsa"]), header_text
    ),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", max_size=80),
    header_text,
)


def header_for(token: str | None, scheme: str) -> dict:
    if token is None:
        return {}
    return {"HTTP_AUTHORIZATION": f"{scheme} {token}".strip()}


def post(path: str, body, headers: dict, *, raw: bool):
    """One request in a transaction rolled back after it."""
    client = APIClient()
    with transaction.atomic():
        if raw:
            answer = client.generic("POST", path, body, content_type="application/json", **headers)
        else:
            answer = client.post(path, body, format="json", **headers)
        status = answer.status_code
        content = answer.content
        transaction.set_rollback(True)
    return status, content


@pytest.fixture(scope="module")
def fuzz_slurm(tmp_path_factory):
    """One test Slurm for the file (each test's world cancels its jobs)."""
    from jobs.local_slurm.cluster import SlurmCluster, available

    why = available()
    if why:
        pytest.skip(why)
    with SlurmCluster(tmp_path_factory.mktemp("fuzz") / "slurm", nodes=3, spare_nodes=0) as cluster:
        yield cluster


@pytest.fixture
def world(fuzz_slurm, tenant_a, tenant_b):
    """A cluster two tenants share (jobs prove themselves), three running jobs, credentials and job tokens."""
    slurm = fuzz_slurm
    cluster = make_cluster(
        make_fleet(),
        driver=DriverName.SLURM,
        kind=ClusterKind.SLURM,
        connection=slurm.connection(
            accounts={"acme": tenant_a.slug, "beta": tenant_b.slug}, gpu_model="H100"
        ),
    )
    slurm_sync(cluster=cluster)
    jobs = {
        account: sbatch(slurm, "-w", node, "-A", account, "-o", "/dev/null", "--wrap", "sleep 300")
        for account, node in (("acme", "n1"), ("beta", "n2"), ("nobody", "n3"))
    }
    key = cluster.connection["job_secret_key"]
    found = {}
    for account, slurm_id in jobs.items():
        found[slurm_id] = wait(
            lambda slurm_id=slurm_id: next(
                (
                    j
                    for j in json.loads(slurm.run("squeue", "--json", "--all", "--jobs", slurm_id).stdout)[
                        "jobs"
                    ]
                    if str(j["job_id"]) == slurm_id and j["job_state"] == "RUNNING"
                ),
                None,
            ),
            what=f"{account}'s job to run",
        )
        assert slurm.job_secret(slurm_id) == job_secret_of(key, found[slurm_id])
    credentials = {
        "cluster-wide": launcher_credential_create(actor=None, cluster=cluster, name="all")[1],
        "acme": launcher_credential_create(actor=None, cluster=cluster, name="a", tenant=tenant_a)[1],
        "beta": launcher_credential_create(actor=None, cluster=cluster, name="b", tenant=tenant_b)[1],
    }
    revoked, credentials["revoked"] = launcher_credential_create(actor=None, cluster=cluster, name="r")
    launcher_credential_revoke(actor=None, credential=revoked)
    credentials["other cluster"] = launcher_credential_create(
        actor=None, cluster=make_cluster(make_fleet()), name="o", tenant=tenant_a
    )[1]
    # Each mapped job registered twice: its first token revoked, its second live.
    tokens = {}
    for account in ("acme", "beta"):
        slurm_id = jobs[account]
        for _ in range(2):
            answer = APIClient().post(
                REGISTER,
                {"slurm_job_id": slurm_id, "job_secret": job_secret_of(key, found[slurm_id])},
                format="json",
                HTTP_AUTHORIZATION=f"Bearer {credentials[account]}",
            )
            assert answer.status_code == 201, answer.content
            tokens.setdefault(account, []).append(answer.json()["job_token"])
    yield {
        "cluster": cluster,
        "jobs": jobs,
        "found": found,
        "secrets": {slurm_id: job_secret_of(key, found[slurm_id]) for slurm_id in found},
        "credentials": credentials,
        "tenants": {"acme": tenant_a.pk, "beta": tenant_b.pk},
        "tokens": tokens,
        "job_ids": {
            account: SlurmJob.objects.get(cluster=cluster, slurm_job_id=jobs[account]).job_id
            for account in ("acme", "beta")
        },
    }
    slurm.run("scancel", *jobs.values(), check=False)
    wait(lambda: not slurm.run("squeue", "-h", check=False).stdout.strip(), what="the jobs to end")


def test_registration_fuzzed_never_fails_and_never_gives_another_jobs_token(world):
    credentials, secrets, jobs = world["credentials"], world["secrets"], world["jobs"]
    account_of = {slurm_id: account for account, slurm_id in jobs.items()}
    edge_ids = ["0", "00001", "4294967293", "4294967294", "4294967295", "9" * 20, "١", " 1 ", "+1", "1e3"]
    job_ids = (
        st.sampled_from(list(jobs.values()) + edge_ids)
        | st.integers(-5, 2**70).map(str)
        | st.integers(0, 2**40)
        | text
        | anything
    )
    secret_values = st.sampled_from(list(secrets.values())) | text | st.text(max_size=300) | anything
    bodies = st.one_of(
        st.fixed_dictionaries(
            {"slurm_job_id": job_ids},
            optional={
                "job_secret": secret_values,
                "cluster": text | st.sampled_from([str(world["cluster"].pk)]),
            },
        ),
        anything,
    )
    tokens = st.sampled_from(list(credentials)).map(credentials.get) | garbage_tokens | st.none()
    seen = {"201": 0, "4xx": 0}

    @FUZZ
    @given(
        body=bodies,
        token=tokens,
        scheme=st.sampled_from(["Bearer", "bearer", "Basic", "", "Bearer Bearer"]),
        raw=st.booleans(),
        raw_body=st.binary(max_size=200),
    )
    def register(body, token, scheme, raw, raw_body):
        status, content = post(REGISTER, raw_body if raw else body, header_for(token, scheme), raw=raw)
        assert status < 500, (body, token, status, content[:300])
        if status != 201:
            seen["4xx"] += 1
            return
        seen["201"] += 1
        # A token only for a job the credential may have, named with that job's own secret.
        assert not raw and isinstance(body, dict) and scheme.lower() == "bearer", (body, scheme)
        slurm_id = str(int(str(body["slurm_job_id"]).strip()))
        holder = next(name for name, value in credentials.items() if value == token)
        assert account_of.get(slurm_id) in ("acme", "beta"), (holder, body)
        assert body.get("job_secret") == secrets[slurm_id], (holder, body)
        assert holder in ("cluster-wide", account_of[slurm_id]), (holder, body)
        answered = json.loads(content)
        assert answered["job"] == world["job_ids"][account_of[slurm_id]]

    # Drawn from the right pieces (every credential, job and secret, extra keys): exactly the allowed are 201.
    @CLOSE
    @given(
        holder=st.sampled_from(["cluster-wide", *credentials]),
        slurm_id=st.sampled_from(list(jobs.values())),
        whose=st.sampled_from(["own", "own", "another job's", "none"]),
        extra=st.dictionaries(st.sampled_from(["cluster", "tenant", "job", "account", "uid"]), anything),
    )
    def register_close_to_right(holder, slurm_id, whose, extra):
        others = [value for key, value in secrets.items() if key != slurm_id]
        secret = {"own": secrets[slurm_id], "another job's": others[0], "none": None}[whose]
        body = {**extra, "slurm_job_id": slurm_id, **({"job_secret": secret} if secret is not None else {})}
        status, content = post(REGISTER, body, header_for(credentials[holder], "Bearer"), raw=False)
        account = account_of[slurm_id]
        allowed = (
            holder in ("cluster-wide", account)
            and account != "nobody"
            and secret == secrets[slurm_id]
            and str(extra.get("cluster", world["cluster"].pk))
            in (str(world["cluster"].pk), world["cluster"].name)
        )
        assert status == (201 if allowed else status) and (status == 201) == allowed, (holder, body, content)
        assert 400 <= status < 500 or allowed, (holder, body, status, content[:300])
        seen["201" if allowed else "4xx"] += 1

    register()
    register_close_to_right()
    assert seen["4xx"] >= 80 and seen["201"] >= 3, seen


def test_job_token_endpoints_fuzzed_accept_only_the_jobs_newest_token(world):
    tokens = world["tokens"]
    job_ids = world["job_ids"]
    known = [token for pair in tokens.values() for token in pair]
    paths = st.builds(
        lambda job, endpoint: f"/api/v1/jobs/{job}/{endpoint}/",
        st.sampled_from(list(job_ids.values()))
        | st.integers(-3, 2**64)
        | st.text(alphabet="0123456789ab-", max_size=12),
        st.sampled_from(["progress", "snapshots"]),
    )
    progress = st.fixed_dictionaries(
        {},
        optional={
            "iteration": st.integers(-5, 2**70) | anything,
            "step_seconds": st.floats(allow_nan=False, allow_infinity=False) | anything,
            "checkpoint_iteration": st.integers(-5, 2**64) | anything,
            "loss": st.floats(allow_nan=False, allow_infinity=False) | anything,
        },
    )
    report = st.fixed_dictionaries(
        {
            "kind": st.sampled_from(
                ["snapshot", "restore", "hang", "disk_fallback", "write_through", "platform"]
            )
            | text
        },
        optional={
            "iteration": st.integers(-5, 2**70) | anything,
            "seconds": st.floats(allow_nan=False, allow_infinity=False) | anything,
            "bytes": st.integers(-5, 2**70),
            "stalled_ranks": st.lists(st.integers(-5, 2**40), max_size=5) | anything,
            "locations": anything,
            "note": text,
        },
    )
    seen = {"2xx": 0, "other": 0}

    @FUZZ
    @given(
        path=paths,
        body=progress | report | anything,
        token=st.sampled_from(known) | garbage_tokens | st.none(),
        raw=st.booleans(),
        raw_body=st.binary(max_size=200)
        | st.sampled_from(
            [
                b'{"iteration": NaN}',
                b'{"iteration": 1e999}',
                b'{"kind": "hang", "iteration": 1, "seconds": Infinity}',
            ]
        ),
    )
    def report_as_a_job(path, body, token, raw, raw_body):
        status, content = post(path, raw_body if raw else body, header_for(token, "Bearer"), raw=raw)
        assert status < 500, (path, body, token, status, content[:300])
        if status >= 300:
            seen["other"] += 1
            return
        seen["2xx"] += 1
        row = JobToken.objects.filter(digest=digest(token or "")).first()
        assert row is not None and row.revoked_at is None, (path, token)
        assert path.split("/")[4] == str(row.job_id), (path, row.job_id)

    live = {tokens[account][-1]: job_ids[account] for account in tokens}

    # A well-formed progress report with each token on each job: 200 exactly for the live token on its own job.
    @CLOSE
    @given(
        token=st.sampled_from(known),
        job=st.sampled_from(list(job_ids.values())),
        iteration=st.integers(0, 10**6),
    )
    def report_with_a_known_token(token, job, iteration):
        status, content = post(
            f"/api/v1/jobs/{job}/progress/", {"iteration": iteration}, header_for(token, "Bearer"), raw=False
        )
        expected = 200 if live.get(token) == job else (403 if token in live else 401)
        assert status == expected, (token, job, status, content[:300])
        seen["2xx" if status == 200 else "other"] += 1

    report_as_a_job()
    report_with_a_known_token()
    assert seen["other"] >= 80 and seen["2xx"] >= 3, seen
