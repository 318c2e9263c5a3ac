import django_filters

from jobs.models import FaultEvent, Job, RecoveryAction


class JobFilterSet(django_filters.FilterSet):
    class Meta:
        model = Job
        fields = ["state", "cluster", "tenant", "simulated"]


class FaultEventFilterSet(django_filters.FilterSet):
    class Meta:
        model = FaultEvent
        fields = ["state", "kind", "cluster", "node", "severity", "needs_human"]


class RecoveryActionFilterSet(django_filters.FilterSet):
    class Meta:
        model = RecoveryAction
        fields = ["state", "kind", "job", "cluster", "fault", "dry_run"]
