"""Permission matrix: every list endpoint of the API declares who may read it, and a test checks each role.

A new endpoint that is not declared here fails ``test_every_api_list_endpoint_is_declared``, so no endpoint
escapes its permission test.
"""

from django.urls import URLPattern, URLResolver, get_resolver

ROLES = ("anonymous", "provider-admin", "operator", "tenant-admin", "tenant-viewer")

# url name (in the "api" namespace) -> {role: expected status of GET}
API_LIST_MATRIX: dict[str, dict[str, int]] = {
    "tenant-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 403, "tenant-viewer": 403},
    "token-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 200, "tenant-viewer": 200},
    "user-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 200, "tenant-viewer": 200},
    "agent-token-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 403, "tenant-viewer": 403},
    "notification-channel-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 403, "tenant-viewer": 403},
    "notification-delivery-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 403, "tenant-viewer": 403},
    "whatif-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 403, "tenant-viewer": 403},
    "prediction-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 403, "tenant-viewer": 403},
    "audit-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 403, "tenant-viewer": 403},
    # Jobs, faults and actions: everyone signed in, scoped to their tenant; stats default to the tenant's figures.
    "job-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 200, "tenant-viewer": 200},
    "fault-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 200, "tenant-viewer": 200},
    "action-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 200, "tenant-viewer": 200},
    "stats-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 200, "tenant-viewer": 200},
    # Fleet: tenants see their dedicated clusters (and shared ones in outline); blueprints and rollouts are provider-only.
    "fleet-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 200, "tenant-viewer": 200},
    "cluster-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 200, "tenant-viewer": 200},
    "node-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 200, "tenant-viewer": 200},
    "blueprint-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 403, "tenant-viewer": 403},
    "rollout-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 403, "tenant-viewer": 403},
    "drift-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 200, "tenant-viewer": 200},
    # Tenant users must name a topic they may see; without one the list is refused as a bad request.
    "event-list": {"anonymous": 401, "provider-admin": 200, "operator": 200, "tenant-admin": 400, "tenant-viewer": 400},
}


def api_list_url_names() -> set[str]:
    """Names of the list routes registered under the ``api`` namespace."""
    names: set[str] = set()

    def walk(patterns, namespace):
        for entry in patterns:
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, entry.namespace or namespace)
            elif isinstance(entry, URLPattern) and namespace == "api" and entry.name and entry.name.endswith("-list"):
                names.add(entry.name)

    walk(get_resolver().url_patterns, None)
    return names
