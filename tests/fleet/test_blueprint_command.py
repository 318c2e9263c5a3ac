from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from fleet.models import Blueprint, BlueprintVersion

pytestmark = pytest.mark.django_db

DOCUMENT = """apiVersion: lockstep.io/v1
kind: Blueprint
name: gpu-golden
description: the golden base
auto_rollout: false
drift_mode: correct
default_strategy: {canary: 1, batch_size: 25%, soak_seconds: 120}
versions:
- number: 1
  state: active
  addons:
  - {name: gpu-operator, repo: "https://helm.ngc.nvidia.com/nvidia", chart: gpu-operator, version: 24.9.0,
     namespace: gpu-operator, values: {driver: {enabled: false}}}
  node_software: {gpu_driver: 550.90.07, cuda: "12.4"}
  policy: {protection: {nic_failover: true, live_migration: true}}
- number: 2
  parent: 1
  addons:
  - {name: nic-failover, repo: "oci://registry.example/lockstep", chart: nic-failover, version: 1.2.0, namespace: lockstep}
"""


def test_apply_then_export_round_trips(tmp_path):
    path = tmp_path / "bp.yaml"
    path.write_text(DOCUMENT)
    out = StringIO()
    call_command("blueprint", "apply", "-f", str(path), stdout=out)
    assert "created version 2" in out.getvalue() and "activated version 1" in out.getvalue()
    blueprint = Blueprint.objects.get(name="gpu-golden")
    assert blueprint.drift_mode == "correct" and blueprint.default_strategy["batch_size"] == "25%"
    v2 = blueprint.versions.get(number=2)
    assert v2.state == "draft" and set(v2.effective_addons()) == {"gpu-operator", "nic-failover"}
    exported = StringIO()
    call_command("blueprint", "export", "gpu-golden", stdout=exported)
    again = tmp_path / "again.yaml"
    again.write_text(exported.getvalue())
    out = StringIO()
    call_command("blueprint", "apply", "-f", str(again), stdout=out)
    assert "updated draft 2" in out.getvalue()
    assert BlueprintVersion.objects.count() == 2


def test_apply_refuses_bombs_unknown_keys_and_changes_to_active_versions(tmp_path):
    path = tmp_path / "bp.yaml"
    path.write_text(DOCUMENT)
    call_command("blueprint", "apply", "-f", str(path), stdout=StringIO())
    cases = {
        "bomb": "a: &a [1,2,3]\nb: [*a, *a]\n",
        "unknown": DOCUMENT.replace("drift_mode: correct", "drift_mode: correct\nflavour: vanilla"),
        "active": DOCUMENT.replace("version: 24.9.0", "version: 24.9.1"),
        "duplicate": DOCUMENT.replace("description: the golden base", "description: a\ndescription: b"),
        "bad version": DOCUMENT.replace("version: 1.2.0", "version: latest"),
    }
    for name, text in cases.items():
        path.write_text(text)
        with pytest.raises(CommandError) as refused:
            call_command("blueprint", "apply", "-f", str(path), stdout=StringIO())
        assert refused.value, name
    assert BlueprintVersion.objects.count() == 2
    assert BlueprintVersion.objects.get(number=2).addons[0]["version"] == "1.2.0"
    with pytest.raises(CommandError):
        call_command("blueprint", "export", "missing")
