"""The provider's one automation switch (``AutomationSwitch``, a single row): paused holds all automation
everywhere (fault recovery, the escalation ladder, drift correction, rollout steps), dry-run makes all of it
decide and record only; each cluster's effective mode is the strictest of its own, its fleet's and this one
(``Cluster.effective_automation``). A row rather than a setting, so the provider admin can throw it at once
through the API, with the audit trail saying who and why, and every worker reads it on its next step."""

from django.db import transaction
from django.utils import timezone

from controlplane.access import principal, require
from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from fleet.choices import AutomationMode
from fleet.models import AutomationSwitch
from fleet.services.publishing import publish


def automation_switch() -> AutomationSwitch:
    """The switch as it stands (an unsaved active one when it was never thrown)."""
    return AutomationSwitch.objects.select_related("changed_by").filter(pk=1).first() or AutomationSwitch(
        pk=1
    )


def automation_modes_for(actor) -> list[str]:
    """The modes this actor may set the provider switch to (DESIGN, *Who may do what*): the provider admin any;
    an operator may dry-run or pause automation, and putting it back to active is the provider admin's; nobody
    else any. No actor (a command, a task) is the system itself."""
    if not getattr(actor, "is_authenticated", False):
        return list(AutomationMode.values)
    who = principal(actor)
    if who.is_provider_admin:
        return list(AutomationMode.values)
    if who.may_operate:
        return [AutomationMode.DRY_RUN, AutomationMode.PAUSED]
    return []


@transaction.atomic
def automation_switch_set(*, actor, mode: str, reason: str = "") -> AutomationSwitch:
    """Throw the provider switch (as ``automation_modes_for`` allows); audited, and published on the ``fleet``
    topic."""
    allowed = automation_modes_for(actor)
    require(bool(allowed), "only provider roles may throw the provider-wide automation switch")
    require(
        mode not in AutomationMode.values or mode in allowed,
        f"an operator may dry-run or pause automation; only the provider admin sets it {mode}",
    )
    if mode not in AutomationMode.values:
        raise ServiceError(f"one of {', '.join(AutomationMode.values)}", field="mode")
    switch, _ = AutomationSwitch.objects.select_for_update().get_or_create(pk=1)
    old = switch.mode
    switch.mode, switch.reason = mode, reason[:300]
    switch.changed_by = actor if getattr(actor, "is_authenticated", False) else None
    switch.changed_at = timezone.now()
    switch.save()
    audit_record(
        actor=actor,
        action="automation.switch",
        target=switch,
        changes={"mode": [old, mode], "reason": reason},
    )
    publish(
        "automation.updated",
        {"mode": mode, "previous": old, "reason": switch.reason, "name": "the whole provider"},
        "/api/v1/automation/",
    )
    return switch
