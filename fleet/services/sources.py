"""Blueprint sources: set one on a blueprint, poll it, take its push webhooks. Each new commit that changes the
document becomes a draft version with its commit recorded (activated at once when the source says so); a document
that fails validation leaves the versions as they are and its error is kept with the commit."""

import hashlib
import hmac
import json
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from controlplane.outbound import OutboundRefused
from controlplane.queueing import queue
from fleet import blueprint_yaml, git_sources
from fleet.models import Blueprint, BlueprintSource, BlueprintVersion, SourceCommit
from fleet.services.blueprints import version_activate, version_create
from fleet.services.publishing import publish
from fleet.specs import clean_addons, clean_node_software, clean_policy, refuse_unknown_keys

SOURCE_FIELDS = ("url", "ref", "path", "credentials", "webhook_secret", "poll_seconds", "auto_activate")
VERSION_DOCUMENT_KEYS = {"apiVersion", "kind", "notes", "addons", "node_software", "policy"}
CONTENT = ("addons", "node_software", "policy")


def source_url(blueprint_id: int) -> str:
    return f"/api/v1/blueprints/{blueprint_id}/source/"


def _clean_source_fields(fields: dict) -> dict:
    cleaned = {}
    if "url" in fields:
        try:
            git_sources.check_source_url(fields["url"], resolve=False)
        except OutboundRefused as refusal:
            raise ServiceError(f"a repository URL Lockstep may fetch: {refusal}", field="url") from None
        cleaned["url"] = fields["url"]
    if "ref" in fields:
        if not isinstance(fields["ref"], str) or not git_sources.REF.match(fields["ref"]):
            raise ServiceError("a branch or tag name such as main or v1.2", field="ref")
        cleaned["ref"] = fields["ref"]
    if "path" in fields:
        if not isinstance(fields["path"], str) or not git_sources.PATH.match(fields["path"]):
            raise ServiceError("a relative path in the repository, such as blueprints/gpu.yaml", field="path")
        cleaned["path"] = fields["path"]
    if "credentials" in fields:
        credentials = fields["credentials"] or {}
        if (
            not isinstance(credentials, dict)
            or set(credentials) - {"username", "password"}
            or not all(isinstance(v, str) and len(v) <= 4096 for v in credentials.values())
        ):
            raise ServiceError("a mapping of username and password (or token)", field="credentials")
        cleaned["credentials"] = credentials
    if "webhook_secret" in fields:
        secret = fields["webhook_secret"] or ""
        if not isinstance(secret, str) or len(secret) > 1024 or (secret and len(secret) < 16):
            raise ServiceError("a secret of 16 to 1024 characters, or empty", field="webhook_secret")
        cleaned["webhook_secret"] = secret
    if "poll_seconds" in fields:
        seconds = fields["poll_seconds"]
        if isinstance(seconds, bool) or not isinstance(seconds, int) or not 10 <= seconds <= 7 * 86400:
            raise ServiceError("a whole number of seconds from 10 to 604800", field="poll_seconds")
        cleaned["poll_seconds"] = seconds
    if "auto_activate" in fields:
        if not isinstance(fields["auto_activate"], bool):
            raise ServiceError("true or false", field="auto_activate")
        cleaned["auto_activate"] = fields["auto_activate"]
    return cleaned


@transaction.atomic
def source_set(*, actor, blueprint: Blueprint, **fields) -> BlueprintSource:
    """Give ``blueprint`` a git source, or change the one it has (fields left out keep their value; a new source
    needs ``url``). The source is polled soon after; a changed URL, ref or path starts its history over."""
    unknown = set(fields) - set(SOURCE_FIELDS)
    if unknown:
        raise ServiceError("unknown field", field=sorted(unknown)[0])
    cleaned = _clean_source_fields(fields)
    blueprint = Blueprint.objects.select_for_update().get(pk=blueprint.pk)
    source = BlueprintSource.objects.filter(blueprint=blueprint).first()
    if source is None:
        if "url" not in cleaned:
            raise ServiceError("the repository URL is required", field="url")
        source = BlueprintSource(blueprint=blueprint)
    moved = any(key in cleaned and cleaned[key] != getattr(source, key) for key in ("url", "ref", "path"))
    for key, value in cleaned.items():
        setattr(source, key, value)
    if moved:
        source.last_commit, source.last_error = "", ""
    source.next_poll_at = timezone.now()
    source.save()
    shown = {k: v for k, v in cleaned.items() if k not in ("credentials", "webhook_secret")}
    shown.update({k: "(set)" for k in ("credentials", "webhook_secret") if cleaned.get(k)})
    audit_record(actor=actor, action="blueprint.source_set", target=blueprint, changes=shown)
    publish("blueprint.source_set", {"blueprint": blueprint.pk, "url": source.url}, source_url(blueprint.pk))
    _queue_sync(source.pk)
    return source


@transaction.atomic
def source_delete(*, actor, blueprint: Blueprint) -> None:
    """Stop taking versions from git; the versions already taken stay."""
    deleted, _ = BlueprintSource.objects.filter(blueprint=blueprint).delete()
    if not deleted:
        raise ServiceError("the blueprint has no source", status=404)
    audit_record(actor=actor, action="blueprint.source_delete", target=blueprint, changes={})


@transaction.atomic
def source_poll_now(*, actor, blueprint: Blueprint) -> BlueprintSource:
    """Poll the blueprint's source now rather than at its next interval (a worker fetches it)."""
    source = BlueprintSource.objects.select_for_update().filter(blueprint=blueprint).first()
    if source is None:
        raise ServiceError("the blueprint has no source", status=404)
    source.next_poll_at = timezone.now()
    source.save(update_fields=["next_poll_at"])
    audit_record(actor=actor, action="blueprint.source_poll", target=blueprint, changes={})
    _queue_sync(source.pk)
    return source


def _queue_sync(source_id: int) -> None:
    from fleet.tasks import blueprint_source_sync_task

    transaction.on_commit(lambda: queue(blueprint_source_sync_task, source_id))


def parse_version_document(text: bytes, *, blueprint_name: str) -> dict:
    """The version content (addons, node_software, policy, notes) a source's document describes, or ServiceError
    naming the field. The document is a ``kind: BlueprintVersion`` (one version's content) or a whole
    ``kind: Blueprint`` as ``manage.py blueprint export`` writes it (its highest-numbered version is taken)."""
    document = blueprint_yaml.parse(text)
    if isinstance(document, dict) and document.get("kind") == "Blueprint":
        whole = blueprint_yaml.load(text)
        if whole["name"] != blueprint_name:
            raise ServiceError(f"the document describes {whole['name']}, not {blueprint_name}", field="name")
        if not whole.get("versions"):
            raise ServiceError("the document lists no version", field="versions")
        document = {k: v for k, v in whole["versions"][-1].items() if k in VERSION_DOCUMENT_KEYS}
    elif not isinstance(document, dict):
        raise ServiceError("the document must be a mapping", field="document")
    else:
        refuse_unknown_keys(document, VERSION_DOCUMENT_KEYS, "document")
        if (
            document.get("apiVersion") != blueprint_yaml.API_VERSION
            or document.get("kind") != "BlueprintVersion"
        ):
            raise ServiceError(
                f"apiVersion must be {blueprint_yaml.API_VERSION} and kind BlueprintVersion (or Blueprint)",
                field="apiVersion",
            )
    notes = document.get("notes") or ""
    if not isinstance(notes, str):
        raise ServiceError("text", field="notes")
    return {
        "addons": clean_addons(document.get("addons") or []),
        "node_software": clean_node_software(document.get("node_software") or {}),
        "policy": clean_policy(document.get("policy") or {}),
        "notes": notes,
    }


def _read(source: BlueprintSource, commit: git_sources.Commit) -> tuple[dict | None, str]:
    """The commit's version content, or None and why not."""
    try:
        text = git_sources.read_document(
            source_id=source.pk, sha=commit.sha, path=source.path, max_bytes=blueprint_yaml.max_bytes()
        )
        if text is None:
            return None, f"the commit has no file {source.path}"
        return parse_version_document(text, blueprint_name=source.blueprint.name), ""
    except ServiceError as error:
        return None, f"{error.field}: {error.detail}" if error.field else str(error.detail)
    except git_sources.GitError as error:
        return None, str(error)


def source_sync(*, source_id: int, now=None) -> dict:
    """One poll: fetch the source's branch or tag and turn each new commit that changed the document into a draft
    version. Safe to run twice (a commit becomes at most one version); a gone source is skipped."""
    source = BlueprintSource.objects.select_related("blueprint").filter(pk=source_id).first()
    if source is None:
        return {"gone": True}
    now = now or timezone.now()
    try:
        head = git_sources.fetch(
            source_id=source.pk, url=source.url, ref=source.ref, credentials=source.credentials or {}
        )
        commits = git_sources.commits_changing(
            source_id=source.pk, since=source.last_commit, head=head, path=source.path
        )
        read = [(commit, *_read(source, commit)) for commit in commits]
    except (git_sources.GitError, OutboundRefused) as error:
        BlueprintSource.objects.filter(pk=source.pk).update(
            last_error=str(error)[:2000],
            last_polled_at=now,
            next_poll_at=now + timedelta(seconds=source.poll_seconds),
        )
        return {"error": str(error)}
    return _record(source_id=source.pk, head=head, read=read, now=now)


def _same_content(version: BlueprintVersion | None, content: dict) -> bool:
    return version is not None and all(getattr(version, key) == content[key] for key in CONTENT)


@transaction.atomic
def _record(*, source_id: int, head: str, read: list, now) -> dict:
    source = (
        BlueprintSource.objects.select_for_update().select_related("blueprint").filter(pk=source_id).first()
    )
    if source is None:
        return {"gone": True}
    blueprint = source.blueprint
    created, refused = [], []
    seen = set(source.commits.filter(sha__in=[c.sha for c, _, _ in read]).values_list("sha", flat=True))
    for commit, content, error in read:
        if commit.sha in seen:
            continue
        row = SourceCommit(
            source=source,
            sha=commit.sha,
            author=commit.author,
            message=commit.message,
            committed_at=commit.committed_at,
        )
        latest = blueprint.versions.order_by("-number").first()
        if content is not None and _same_content(latest, content):
            row.error = f"no change from version {latest.number}"
        elif content is not None:
            try:
                with transaction.atomic():
                    row.version = version_create(
                        actor=None,
                        blueprint=blueprint,
                        notes=(content["notes"] or f"{commit.sha[:12]}: {commit.message}")[:5000],
                        **{key: content[key] for key in CONTENT},
                    )
                created.append(row.version)
            except ServiceError as refusal:
                error = f"{refusal.field}: {refusal.detail}" if refusal.field else str(refusal.detail)
        if error:
            row.error = error[:2000]
            refused.append(commit.sha)
            publish(
                "blueprint.source_refused",
                {"blueprint": blueprint.pk, "commit": commit.sha, "error": row.error},
                source_url(blueprint.pk),
            )
        row.save()
    activated = None
    if source.auto_activate and created:
        # Only the newest: activating each would start a rollout per commit of one push.
        activated = _activate(created[-1])
    source.last_commit, source.last_error, source.last_polled_at = head, "", now
    source.next_poll_at = now + timedelta(seconds=source.poll_seconds)
    source.save(update_fields=["last_commit", "last_error", "last_polled_at", "next_poll_at"])
    return {
        "head": head,
        "created": [v.number for v in created],
        "refused": refused,
        "activated": activated,
    }


def _activate(version: BlueprintVersion) -> int | None:
    try:
        with transaction.atomic():
            version_activate(actor=None, version=version)
    except ServiceError as refusal:
        SourceCommit.objects.filter(version=version).update(error=f"not activated: {refusal.detail}"[:2000])
        return None
    return version.number


def source_due(*, now=None) -> list[int]:
    """Sources whose next poll is due, claimed (their next poll moved on) so a second sweep does not queue them
    again while their fetch runs."""
    now = now or timezone.now()
    with transaction.atomic():
        due = list(
            BlueprintSource.objects.select_for_update(skip_locked=True)
            .filter(next_poll_at__lte=now)
            .values_list("pk", "poll_seconds")
        )
        for pk, seconds in due:
            BlueprintSource.objects.filter(pk=pk).update(next_poll_at=now + timedelta(seconds=seconds))
    return [pk for pk, _ in due]


def _signature_ok(secret: str, headers, body: bytes) -> bool:
    """GitHub: X-Hub-Signature-256 is sha256=HMAC-SHA256(secret, body) in hex. GitLab: X-Gitlab-Token is the
    secret itself. Both compared in constant time."""
    github = headers.get("X-Hub-Signature-256")
    if github is not None:
        expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected.encode(), github.encode("utf-8", "replace"))
    gitlab = headers.get("X-Gitlab-Token")
    if gitlab is not None:
        return hmac.compare_digest(secret.encode(), gitlab.encode("utf-8", "replace"))
    return False


def source_webhook(*, source_id: int, headers, body: bytes) -> dict:
    """A push webhook (GitHub or GitLab format) for the source: verified against its secret, then, when it pushed
    the source's branch or tag, a poll is queued at once. A bad or missing signature, or a source without a
    secret, is refused alike (403), so the answer does not say which sources exist."""
    source = BlueprintSource.objects.filter(pk=source_id).first() if 0 < source_id < 2**31 else None
    secret = (source.webhook_secret or "") if source is not None else ""
    if "X-Hub-Signature-256" not in headers and "X-Gitlab-Token" not in headers:
        raise ServiceError("an X-Hub-Signature-256 (GitHub) or X-Gitlab-Token (GitLab) header", status=401)
    if not secret or not _signature_ok(secret, headers, body):
        raise ServiceError("the signature does not match", status=403)
    event = headers.get("X-GitHub-Event") or headers.get("X-Gitlab-Event") or ""
    if event == "ping":
        return {"queued": False, "reason": "ping"}
    try:
        payload = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise ServiceError("the body must be JSON", field="body") from None
    ref = payload.get("ref") if isinstance(payload, dict) else None
    if ref not in (f"refs/heads/{source.ref}", f"refs/tags/{source.ref}", source.ref):
        return {"queued": False, "reason": f"pushed {str(ref)[:200]}, the source follows {source.ref}"}
    with transaction.atomic():
        BlueprintSource.objects.filter(pk=source.pk).update(next_poll_at=timezone.now())
        _queue_sync(source.pk)
    return {"queued": True}
