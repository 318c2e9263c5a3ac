from django.contrib.auth.decorators import login_required
from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import PermissionDenied
from django.shortcuts import render
from django.views.generic import ListView

from controlplane import selectors
from controlplane.access import principal


@login_required
def home(request):
    """The landing page: the provider's fleet view or the tenant's own view (filled by later work)."""
    who = principal(request.user)
    topic = "fleet" if who.is_provider else (f"tenant-{who.tenant_id}" if who.tenant_id else "")
    return render(request, "controlplane/home.html", {"who": who, "topic": topic, "after": selectors.topic_seq(topic)})


class AuditEntryListView(LoginRequiredMixin, ListView):
    template_name = "controlplane/auditentry_list.html"
    paginate_by = 50

    def get_queryset(self):
        if not principal(self.request.user).may_read_audit:
            raise PermissionDenied
        return selectors.audit_list(user=self.request.user).select_related("actor")
