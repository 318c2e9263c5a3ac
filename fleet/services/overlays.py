"""Values overlays of a blueprint: set the whole list at once (what git or an operator holds), in precedence order."""

from django.db import transaction

from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from fleet.models import Blueprint, Cluster, ValuesOverlay
from fleet.services.publishing import publish
from fleet.specs import MAX_DEPTH, NAME, refuse_unknown_keys, too_deep

OVERLAY_KEYS = {"name", "cluster", "labels", "addon", "values"}
MAX_OVERLAYS = 200


def _clean(overlays) -> list[dict]:
    if not isinstance(overlays, list) or len(overlays) > MAX_OVERLAYS:
        raise ServiceError(f"a list of at most {MAX_OVERLAYS} overlays", field="overlays")
    cleaned, names, cluster_refs = [], set(), []
    for i, overlay in enumerate(overlays):
        at = f"overlays[{i}]"
        if not isinstance(overlay, dict):
            raise ServiceError("must be a mapping", field=at)
        refuse_unknown_keys(overlay, OVERLAY_KEYS, at)
        name = overlay.get("name")
        if not isinstance(name, str) or not NAME.match(name) or name in names:
            raise ServiceError(
                "a name of lower-case letters, digits and dashes, once each", field=f"{at}.name"
            )
        names.add(name)
        cluster, labels = overlay.get("cluster"), overlay.get("labels") or {}
        if (cluster is None) == (not labels):
            raise ServiceError("either a cluster (id or name) or labels to match", field=f"{at}.cluster")
        if cluster is not None and (isinstance(cluster, bool) or not isinstance(cluster, int | str)):
            raise ServiceError("a cluster id or name", field=f"{at}.cluster")
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 63 and len(v) <= 63
            for k, v in labels.items()
        ):
            raise ServiceError("a mapping of label to value", field=f"{at}.labels")
        addon = overlay.get("addon")
        if not isinstance(addon, str) or not NAME.match(addon):
            raise ServiceError("the name of an add-on of the blueprint", field=f"{at}.addon")
        values = overlay.get("values")
        if not isinstance(values, dict):
            raise ServiceError("values must be a mapping", field=f"{at}.values")
        if too_deep(values):
            raise ServiceError(f"values nest deeper than {MAX_DEPTH} levels", field=f"{at}.values")
        cleaned.append({"name": name, "cluster": cluster, "labels": labels, "addon": addon, "values": values})
        if cluster is not None:
            cluster_refs.append((i, cluster))
    ids = {c for _, c in cluster_refs if isinstance(c, int) and 0 < c < 2**31}
    names_wanted = {c for _, c in cluster_refs if isinstance(c, str)}
    known = {
        key: pk
        for pk, name in Cluster.objects.filter(pk__in=ids).values_list("pk", "name")
        for key in (pk, name)
    }
    known.update(
        {name: pk for pk, name in Cluster.objects.filter(name__in=names_wanted).values_list("pk", "name")}
    )
    for i, cluster in cluster_refs:
        if cluster not in known:
            raise ServiceError(f"no such cluster {cluster}", field=f"overlays[{i}].cluster")
        cleaned[i]["cluster"] = known[cluster]
    return cleaned


@transaction.atomic
def overlays_set(*, actor, blueprint: Blueprint, overlays) -> list[ValuesOverlay]:
    """Replace the blueprint's overlays with ``overlays`` (their order is their precedence among label overlays and
    among cluster overlays). Clusters pick the new effective values up on their next drift sweep or reconcile."""
    cleaned = _clean(overlays)
    blueprint = Blueprint.objects.select_for_update().get(pk=blueprint.pk)
    before = list(
        ValuesOverlay.objects.filter(blueprint=blueprint).values(
            "name", "cluster_id", "labels", "addon", "values"
        )
    )
    ValuesOverlay.objects.filter(blueprint=blueprint).delete()
    rows = ValuesOverlay.objects.bulk_create(
        [
            ValuesOverlay(
                blueprint=blueprint,
                position=i,
                name=o["name"],
                cluster_id=o["cluster"],
                labels=o["labels"],
                addon=o["addon"],
                values=o["values"],
            )
            for i, o in enumerate(cleaned)
        ]
    )
    audit_record(
        actor=actor,
        action="blueprint.overlays_set",
        target=blueprint,
        changes={"before": len(before), "after": [o["name"] for o in cleaned]},
    )
    publish(
        "blueprint.overlays_set",
        {"blueprint": blueprint.pk, "overlays": len(rows)},
        f"/api/v1/blueprints/{blueprint.pk}/overlays/",
    )
    return rows
