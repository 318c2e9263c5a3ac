"""Blueprints from git: a commit pushed to a real on-disk repository becomes a draft version within one poll and
within one webhook call; an invalid commit leaves the versions as they are with its error beside the commit; the
outbound-URL rule refuses file:// (unless the test setting allows it) and internal addresses."""

import hashlib
import hmac
import json

import pytest

from controlplane.errors import ServiceError
from fleet.choices import VersionState
from fleet.models import BlueprintSource, Rollout, SourceCommit
from fleet.services.sources import source_due, source_set, source_sync
from fleet.tasks import blueprint_source_sync_task
from tests.support.blueprints import ADDONS, blueprint, bump, clusters_on
from tests.support.git import AUTHOR, Repository, version_document

pytestmark = [pytest.mark.django_db, pytest.mark.slow]  # every test runs git

SECRET = "a-webhook-secret-of-some-length"


@pytest.fixture
def git_settings(settings, tmp_path):
    settings.BLUEPRINT_SOURCE_ALLOW_FILE = True
    settings.BLUEPRINT_SOURCE_CACHE_DIR = str(tmp_path / "cache")
    return settings


@pytest.fixture
def sourced(users, git_settings, tmp_path):
    """A blueprint at v1 (no rollout on activation) whose source is a repository holding v1's document."""
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    repo = Repository(tmp_path / "repo")
    repo.commit({"fleet/gpu.yaml": version_document()}, "the blueprint as it is")
    source = source_set(
        actor=actor, blueprint=bp, url=repo.url, ref="main", path="fleet/gpu.yaml", webhook_secret=SECRET
    )
    first = source_sync(source_id=source.pk)
    assert first["created"] == [] and "error" not in first  # the same document as v1: no new version
    return {"actor": actor, "bp": bp, "v1": v1, "repo": repo, "source": source}


def test_a_pushed_commit_becomes_a_draft_within_one_poll(sourced):
    repo, source, bp = sourced["repo"], sourced["source"], sourced["bp"]
    sha = repo.commit(
        {"fleet/gpu.yaml": version_document(bump(ADDONS, "gpu-operator", "24.9.1"))}, "Bump gpu-operator"
    )
    result = source_sync(source_id=source.pk)
    assert result["created"] == [2] and result["head"] == sha
    v2 = bp.versions.get(number=2)
    assert v2.state == VersionState.DRAFT
    assert v2.effective_addons()["gpu-operator"]["version"] == "24.9.1"
    commit = SourceCommit.objects.get(version=v2)
    assert (commit.sha, commit.author, commit.message) == (sha, AUTHOR, "Bump gpu-operator")
    assert source_sync(source_id=source.pk)["created"] == []  # a second poll: nothing new
    assert bp.versions.count() == 2
    repo.commit({"README.md": "unrelated"}, "docs only")
    assert source_sync(source_id=source.pk)["created"] == []  # a commit that leaves the document alone


def test_an_invalid_commit_leaves_the_version_and_shows_its_error(sourced):
    repo, source, bp = sourced["repo"], sourced["source"], sourced["bp"]
    bad = repo.commit(
        {"fleet/gpu.yaml": version_document(bump(ADDONS, "gpu-operator", "latest"))}, "float it"
    )
    result = source_sync(source_id=source.pk)
    assert result["created"] == [] and result["refused"] == [bad]
    assert bp.versions.count() == 1
    error = SourceCommit.objects.get(sha=bad).error
    assert "addons[0].version" in error and "pinned chart version" in error
    source.refresh_from_db()
    assert source.last_commit == bad and source.last_error == ""
    repo.commit({"fleet/gpu.yaml": "versions: [unclosed"}, "broken yaml")
    repo.commit({"fleet/gpu.yaml": version_document(bump(ADDONS, "gpu-operator", "24.9.2"))}, "fixed")
    result = source_sync(source_id=source.pk)
    assert result["created"] == [2] and len(result["refused"]) == 1
    assert bp.versions.get(number=2).commit.message == "fixed"


def test_auto_activation_activates_the_newest_and_rolls_out(sourced, users):
    repo, source, bp, actor = sourced["repo"], sourced["source"], sourced["bp"], sourced["actor"]
    bp.auto_rollout = True
    bp.save()
    tracking = clusters_on(sourced["v1"], 1)[0]
    source_set(actor=actor, blueprint=bp, auto_activate=True)
    repo.commit({"fleet/gpu.yaml": version_document(bump(ADDONS, "gpu-operator", "24.9.1"))}, "one")
    repo.commit({"fleet/gpu.yaml": version_document(bump(ADDONS, "gpu-operator", "24.9.2"))}, "two")
    result = source_sync(source_id=source.pk)
    assert result["created"] == [2, 3] and result["activated"] == 3
    assert bp.versions.get(number=2).state == VersionState.DRAFT
    assert bp.versions.get(number=3).state == VersionState.ACTIVE
    assert Rollout.objects.filter(version__number=3, clusters__cluster=tracking).exists()


def _github(body: bytes, secret: str = SECRET) -> dict:
    signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"HTTP_X_HUB_SIGNATURE_256": signature, "HTTP_X_GITHUB_EVENT": "push"}


def test_a_pushed_commit_becomes_a_draft_within_one_webhook_call(
    sourced, client, monkeypatch, django_capture_on_commit_callbacks
):
    repo, source, bp = sourced["repo"], sourced["source"], sourced["bp"]
    monkeypatch.setattr(blueprint_source_sync_task, "delay", blueprint_source_sync_task)  # the worker, inline
    sha = repo.commit({"fleet/gpu.yaml": version_document(bump(ADDONS, "gpu-operator", "24.9.1"))}, "pushed")
    body = json.dumps({"ref": "refs/heads/main", "after": sha}).encode()
    url = f"/api/v1/blueprint-sources/{source.pk}/webhook/"
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(url, body, content_type="application/json", **_github(body))
    assert answer.status_code == 200 and answer.json() == {"queued": True}
    assert bp.versions.get(number=2).commit.sha == sha
    sha = repo.commit({"fleet/gpu.yaml": version_document(bump(ADDONS, "gpu-operator", "24.9.2"))}, "gitlab")
    body = json.dumps({"ref": "refs/heads/main", "object_kind": "push"}).encode()
    gitlab = {"HTTP_X_GITLAB_TOKEN": SECRET, "HTTP_X_GITLAB_EVENT": "Push Hook"}
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(url, body, content_type="application/json", **gitlab)
    assert answer.status_code == 200 and bp.versions.get(number=3).commit.sha == sha


def test_a_webhook_is_verified_before_anything_happens(sourced, client):
    source = sourced["source"]
    url = f"/api/v1/blueprint-sources/{source.pk}/webhook/"
    body = json.dumps({"ref": "refs/heads/main"}).encode()
    post = lambda headers, target=url: client.post(target, body, content_type="application/json", **headers)  # noqa: E731
    assert post({}).status_code == 401
    assert post(_github(body, secret="not-the-secret-at-all")).status_code == 403
    assert post({"HTTP_X_HUB_SIGNATURE_256": "sha256=zz"}).status_code == 403
    assert post({"HTTP_X_GITLAB_TOKEN": "wrong"}).status_code == 403
    assert post(_github(body), f"/api/v1/blueprint-sources/{source.pk + 1000}/webhook/").status_code == 403
    assert post(_github(body), "/api/v1/blueprint-sources/99999999999999999999/webhook/").status_code == 403
    other = json.dumps({"ref": "refs/heads/feature"}).encode()
    answer = client.post(url, other, content_type="application/json", **_github(other))
    assert answer.status_code == 200 and answer.json()["queued"] is False
    ping = {**_github(b"{}"), "HTTP_X_GITHUB_EVENT": "ping"}
    assert client.post(url, b"{}", content_type="application/json", **ping).json()["reason"] == "ping"
    garbage = b"\xff not json"
    assert client.post(url, garbage, content_type="application/json", **_github(garbage)).status_code == 400


@pytest.mark.parametrize(
    "url",
    [
        "http://github.com/acme/fleet.git",
        "https://127.0.0.1/acme/fleet.git",
        "https://169.254.169.254/latest/meta-data",
        "https://10.0.0.8/fleet.git",
        "ssh://git@github.com/acme/fleet.git",
        "file:///etc",
        "https://user:pass@github.com/acme/fleet.git",
    ],
)
def test_source_urls_follow_the_outbound_rule(users, settings, url):
    settings.BLUEPRINT_SOURCE_ALLOW_FILE = False
    bp, _ = blueprint(users["operator"])
    with pytest.raises(ServiceError) as refused:
        source_set(actor=users["operator"], blueprint=bp, url=url)
    assert refused.value.field == "url"


def test_a_file_source_is_refused_at_fetch_once_the_setting_is_off(sourced, settings):
    settings.BLUEPRINT_SOURCE_ALLOW_FILE = False
    result = source_sync(source_id=sourced["source"].pk)
    assert "file://" in result["error"]
    sourced["source"].refresh_from_db()
    assert "file://" in sourced["source"].last_error


def test_the_sync_task_once_twice_and_gone(sourced):
    repo, source, bp = sourced["repo"], sourced["source"], sourced["bp"]
    repo.commit({"fleet/gpu.yaml": version_document(bump(ADDONS, "gpu-operator", "24.9.1"))}, "bump")
    assert blueprint_source_sync_task(source.pk)["created"] == [2]
    assert blueprint_source_sync_task(source.pk)["created"] == []
    assert bp.versions.count() == 2
    assert blueprint_source_sync_task(source.pk + 1000) == {"gone": True}


def test_due_sources_are_claimed_once(sourced):
    source = sourced["source"]
    BlueprintSource.objects.filter(pk=source.pk).update(next_poll_at=None)
    assert source_due() == []
    from django.utils import timezone

    BlueprintSource.objects.filter(pk=source.pk).update(next_poll_at=timezone.now())
    assert source_due() == [source.pk]
    assert source_due() == []


def test_the_blueprint_page_shows_each_commit_with_its_version_or_error(sourced, client, users):
    repo, source, bp = sourced["repo"], sourced["source"], sourced["bp"]
    repo.commit({"fleet/gpu.yaml": version_document(bump(ADDONS, "gpu-operator", "latest"))}, "float it")
    repo.commit({"fleet/gpu.yaml": version_document(bump(ADDONS, "gpu-operator", "24.9.1"))}, "pin it")
    source_sync(source_id=source.pk)
    client.force_login(users["operator"])
    page = client.get(f"/blueprints/{bp.pk}/").content.decode()
    assert "Git source" in page and "float it" in page and "pinned chart version" in page
    assert "pin it" in page and "v2" in page
    assert SECRET not in page
