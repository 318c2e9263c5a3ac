from django.contrib.auth.mixins import LoginRequiredMixin
from django_filters.views import FilterView
from django_tables2 import SingleTableMixin

from controlplane import selectors
from controlplane.access import principal, require
from controlplane.filtersets import AuditEntryFilterSet
from controlplane.pagination import OneMomentPaginator
from controlplane.tables import AuditEntryTable


class AuditEntryListView(LoginRequiredMixin, SingleTableMixin, FilterView):
    """The audit trail: sortable, filtered by the same FilterSet as /api/v1/audit/, paginated; its filters
    offer actors, objects and tenants by name."""

    template_name = "controlplane/auditentry_list.html"
    paginator_class = OneMomentPaginator
    table_class = AuditEntryTable
    filterset_class = AuditEntryFilterSet

    def get_queryset(self):
        require(principal(self.request.user).may_read_audit)
        return selectors.audit_list(user=self.request.user)

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        # After the page of rows is read (as of one moment): the pickers' lists are no part of that moment.
        self.filterset.offer_choices()
        return context
