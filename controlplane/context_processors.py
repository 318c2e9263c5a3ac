from django.urls import NoReverseMatch, reverse

from controlplane import navigation
from controlplane.access import principal


def _visible(item, who) -> bool:
    if item.audience == "all":
        return True
    if item.audience == "provider":
        return who.is_provider
    if item.audience == "tenant":
        return who.tenant_id is not None
    if item.audience == "audit":
        return who.may_read_audit
    if item.audience == "users":
        return who.manages_users
    return False


def navigation_context(request):
    who = principal(getattr(request, "user", None))
    if not who.is_authenticated:
        return {"nav_items": [], "principal": who}
    items = []
    for item in navigation.items():
        if not _visible(item, who):
            continue
        try:
            url = reverse(item.url_name)
        except NoReverseMatch:
            continue
        items.append(
            {
                "label": item.label,
                "url": url,
                "active": request.path == url or (url != "/" and request.path.startswith(url)),
            }
        )
    return {"nav_items": items, "principal": who}
