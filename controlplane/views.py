from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import PermissionDenied
from django.views.generic import ListView

from controlplane import selectors
from controlplane.access import principal


class AuditEntryListView(LoginRequiredMixin, ListView):
    template_name = "controlplane/auditentry_list.html"
    paginate_by = 50

    def get_queryset(self):
        if not principal(self.request.user).may_read_audit:
            raise PermissionDenied
        return selectors.audit_list(user=self.request.user).select_related("actor")
