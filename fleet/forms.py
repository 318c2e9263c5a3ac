"""Forms of the fleet pages' write actions. They check the shape of the input; the services decide (and refuse
with a ServiceError naming the field, which the views put back on the form)."""

import yaml
from django import forms

from controlplane.errors import ServiceError
from fleet import blueprint_yaml
from fleet.choices import AutomationMode, VersionState
from fleet.models import Blueprint, BlueprintVersion, Cluster, Fleet
from fleet.specs import clean_addons, clean_node_software, clean_policy

CONTENT_KEYS = ("addons", "node_software", "policy")


def content_yaml(version: BlueprintVersion | None) -> str:
    """A version's own content (what it sets, not what it inherits) as the editor's YAML."""
    content = {
        key: getattr(version, key) if version else ({} if key != "addons" else []) for key in CONTENT_KEYS
    }
    return yaml.safe_dump(content, sort_keys=False, default_flow_style=False, allow_unicode=True)


def _service_error(error: ServiceError) -> forms.ValidationError:
    return forms.ValidationError(f"{error.field}: {error.detail}" if error.field else error.detail)


class VersionForm(forms.Form):
    """A new version of one blueprint: its parent and its own content as YAML (add-ons, node software, policy)."""

    parent = forms.TypedChoiceField(
        required=False,
        coerce=int,
        empty_value=None,
        help_text="The version it overrides; it inherits what it does not set.",
    )
    content = forms.CharField(
        max_length=blueprint_yaml.max_bytes(),
        strip=False,
        label="Content (YAML)",
        help_text="addons (a list of name, repo, chart, version, namespace, values), node_software, policy.",
        widget=forms.Textarea(attrs={"rows": 22, "spellcheck": "false", "class": "yaml-editor"}),
    )
    notes = forms.CharField(required=False, max_length=5000, widget=forms.Textarea(attrs={"rows": 2}))

    def __init__(self, *args, blueprint: Blueprint, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["parent"].choices = [("", "none")] + [
            (v.number, f"v{v.number} ({v.state})") for v in blueprint.versions.order_by("number")
        ]

    def clean_content(self) -> dict:
        try:
            content = blueprint_yaml.parse(self.cleaned_data["content"], field="content")
        except ServiceError as error:
            raise forms.ValidationError(error.detail) from error
        if content is None:
            content = {}
        if not isinstance(content, dict):
            raise forms.ValidationError("a mapping with addons, node_software and policy")
        unknown = set(content) - set(CONTENT_KEYS)
        if unknown:
            raise forms.ValidationError(
                f"unknown keys: {', '.join(sorted(map(str, unknown)))}; use {', '.join(CONTENT_KEYS)}"
            )
        try:
            return {
                "addons": clean_addons(content.get("addons") or []),
                "node_software": clean_node_software(content.get("node_software") or {}),
                "policy": clean_policy(content.get("policy") or {}),
            }
        except ServiceError as error:
            raise _service_error(error) from error


class BlueprintImportForm(forms.Form):
    document = forms.CharField(
        max_length=blueprint_yaml.max_bytes(),
        strip=False,
        label="Blueprint document (YAML)",
        help_text="The document GET /api/v1/blueprints/{id}/yaml/ returns: apiVersion, kind, name, versions.",
        widget=forms.Textarea(attrs={"rows": 22, "spellcheck": "false", "class": "yaml-editor"}),
    )

    def clean_document(self) -> dict:
        try:
            return blueprint_yaml.load(self.cleaned_data["document"])
        except ServiceError as error:
            raise _service_error(error) from error


TARGET_KINDS = [
    ("clusters", "named clusters"),
    ("fleet", "a fleet"),
    ("labels", "clusters with labels"),
    ("tracking", "the blueprint's tracking clusters"),
]


class RolloutForm(forms.Form):
    """A rollout: an active version, its targets (one kind) and its strategy."""

    version = forms.ChoiceField(help_text="Only active versions roll out.")
    target_kind = forms.ChoiceField(choices=TARGET_KINDS, label="Targets", widget=forms.RadioSelect)
    clusters = forms.TypedMultipleChoiceField(
        required=False, coerce=int, widget=forms.SelectMultiple(attrs={"size": 8})
    )
    fleet = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    labels = forms.CharField(required=False, max_length=500, help_text="key=value, comma-separated: gpu=h100")
    canary = forms.IntegerField(
        min_value=0,
        max_value=10_000,
        initial=1,
        help_text="Clusters in the first batch, which must pass before the rest.",
    )
    batch_percent = forms.IntegerField(min_value=1, max_value=100, initial=25, label="Batch size (%)")
    batch_size = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=100_000,
        label="Batch size (clusters)",
        help_text="Overrides the percentage when set.",
    )
    max_failures = forms.IntegerField(min_value=0, max_value=100_000, initial=0, label="Failure budget")
    soak_seconds = forms.IntegerField(min_value=0, max_value=7 * 86400, initial=60)
    progress_deadline_seconds = forms.IntegerField(min_value=1, max_value=7 * 86400, initial=600)
    auto_rollback = forms.BooleanField(required=False, initial=True)
    plan = forms.CharField(required=False, widget=forms.HiddenInput, max_length=100_000)
    # The second confirmation a start needs when the preview warns (another blueprint, protection turned off);
    # rendered beside the Start button, with the count of jobs it drops, not among the fields above.
    acknowledge_drop = forms.BooleanField(required=False, label="I understand protection is dropped")

    def visible_fields(self):
        return [field for field in super().visible_fields() if field.name != "acknowledge_drop"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        versions = (
            BlueprintVersion.objects.filter(state=VersionState.ACTIVE)
            .select_related("blueprint")
            .order_by("blueprint__name", "-number")
        )
        self.fields["version"].choices = [
            (f"{v.blueprint_id}:{v.number}", f"{v.blueprint.name} v{v.number}") for v in versions
        ]
        self.fields["clusters"].choices = list(Cluster.objects.order_by("name").values_list("pk", "name"))
        self.fields["fleet"].choices = [("", "—")] + list(
            Fleet.objects.order_by("name").values_list("pk", "name")
        )

    def clean(self):
        data = super().clean()
        kind = data.get("target_kind")
        if kind == "clusters" and not data.get("clusters"):
            self.add_error("clusters", "choose at least one cluster")
        elif kind == "fleet" and not data.get("fleet"):
            self.add_error("fleet", "choose a fleet")
        elif kind == "labels":
            labels = {}
            for part in filter(None, (p.strip() for p in (data.get("labels") or "").split(","))):
                key, sep, value = part.partition("=")
                if not sep or not key.strip():
                    self.add_error("labels", f"{part!r} is not key=value")
                    break
                labels[key.strip()] = value.strip()
            if not labels and "labels" not in self.errors:
                self.add_error("labels", "give at least one key=value")
            data["label_map"] = labels
        return data

    def version_object(self) -> BlueprintVersion | None:
        blueprint_id, _, number = self.cleaned_data["version"].partition(":")
        return (
            BlueprintVersion.objects.select_related("blueprint")
            .filter(blueprint_id=int(blueprint_id), number=int(number))
            .first()
        )

    def targets(self) -> dict:
        data, kind = self.cleaned_data, self.cleaned_data["target_kind"]
        value = {
            "clusters": lambda: list(data["clusters"]),
            "fleet": lambda: data["fleet"],
            "labels": lambda: data["label_map"],
            "tracking": lambda: True,
        }[kind]()
        return {kind: value}

    def strategy(self) -> dict:
        data = self.cleaned_data
        return {
            "canary": data["canary"],
            "batch_size": data["batch_size"] if data.get("batch_size") else f"{data['batch_percent']}%",
            "max_failures": data["max_failures"],
            "soak_seconds": data["soak_seconds"],
            "progress_deadline_seconds": data["progress_deadline_seconds"],
            "auto_rollback": data["auto_rollback"],
        }


class AssignmentForm(forms.Form):
    """Pin a cluster to an active version, or let it track a blueprint's latest."""

    assignment = forms.ChoiceField(label="Blueprint version")
    reason = forms.CharField(
        required=False, max_length=300, help_text="Why it is pinned (shown on the page)."
    )

    def __init__(self, *args, cluster: Cluster, **kwargs):
        super().__init__(*args, **kwargs)
        choices = []
        for blueprint in Blueprint.objects.order_by("name").prefetch_related("versions"):
            choices.append((f"track:{blueprint.pk}", f"track the latest {blueprint.name}"))
            for version in sorted(blueprint.versions.all(), key=lambda v: -v.number):
                if version.state == VersionState.ACTIVE or version.pk == cluster.blueprint_version_id:
                    choices.append(
                        (f"pin:{blueprint.pk}:{version.number}", f"pin {blueprint.name} v{version.number}")
                    )
        self.fields["assignment"].choices = choices

    def parsed(self) -> dict:
        kind, _, rest = self.cleaned_data["assignment"].partition(":")
        if kind == "track":
            return {"blueprint": int(rest), "track_latest": True}
        blueprint, _, number = rest.partition(":")
        return {"blueprint": int(blueprint), "version": int(number)}


class ReasonForm(forms.Form):
    reason = forms.CharField(required=False, max_length=300)


class AutomationForm(forms.Form):
    mode = forms.ChoiceField(choices=AutomationMode.choices, widget=forms.RadioSelect)
    reason = forms.CharField(required=False, max_length=300)

    def __init__(self, *args, modes=None, **kwargs):
        super().__init__(*args, **kwargs)
        if modes is not None:  # only the modes this reader may set (automation_modes_for)
            self.fields["mode"].choices = [c for c in AutomationMode.choices if c[0] in modes]
