"""``{% automation_banners %}``: the holds on automation and node maintenance that govern the page being shown
(``fleet.selectors_banners``), rendered once in templates/base.html for every page."""

import logging

from django import template
from django.db import DatabaseError

from fleet.selectors_banners import banners, governing_cluster

register = template.Library()
log = logging.getLogger(__name__)

# Pages about one object, by URL name: the kind of object (``fleet.selectors_banners.GOVERNED``) and the URL
# parameter that names it. A page of a cluster, of its nodes, jobs and incidents shows that cluster's holds.
OBJECT_PAGES = {
    "fleet-cluster": ("cluster", "pk"),
    "fleet-cluster-reconcile": ("cluster", "pk"),
    "fleet-cluster-assign": ("cluster", "pk"),
    "fabric": ("cluster", "cluster_id"),
    "node-detail": ("node", "pk"),
    "fleet-node-action": ("node", "pk"),
    "job-detail": ("job", "pk"),
    "job-cancel": ("job", "pk"),
    "incident-detail": ("incident", "pk"),
}
# Pages over the whole fleet: every fleet's own holds.
FLEET_PAGES = {"fleet-overview", "fleet-clusters"}


@register.inclusion_tag("fleet/_banners.html", takes_context=True)
def automation_banners(context):
    """The banners for the request in ``context``; none without one (the 500 page renders with no request and
    must not need the database)."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if request is None or user is None or not user.is_authenticated:
        return {"banners": []}
    match = getattr(request, "resolver_match", None)
    name = getattr(match, "url_name", None)
    try:
        cluster_id = None
        if name in OBJECT_PAGES:
            kind, parameter = OBJECT_PAGES[name]
            cluster_id = governing_cluster(user=user, kind=kind, pk=match.kwargs.get(parameter))
        found = banners(user=user, cluster_id=cluster_id, fleets=name in FLEET_PAGES)
    except DatabaseError:
        # The page (an error page, perhaps) still renders; the banners are read again on the next one.
        log.warning("automation banners not read on %s", request.path, exc_info=True)
        found = []
    return {"banners": found}
