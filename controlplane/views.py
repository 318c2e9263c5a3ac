from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import PermissionDenied
from django_filters.views import FilterView
from django_tables2 import SingleTableMixin

from controlplane import selectors
from controlplane.access import principal
from controlplane.filtersets import AuditEntryFilterSet
from controlplane.pagination import OneMomentPaginator
from controlplane.tables import AuditEntryTable


class AuditEntryListView(LoginRequiredMixin, SingleTableMixin, FilterView):
    """The audit trail: sortable, filtered by the same FilterSet as /api/v1/audit/, paginated."""

    template_name = "controlplane/auditentry_list.html"
    paginator_class = OneMomentPaginator
    table_class = AuditEntryTable
    filterset_class = AuditEntryFilterSet

    def get_queryset(self):
        if not principal(self.request.user).may_read_audit:
            raise PermissionDenied
        return selectors.audit_list(user=self.request.user)
