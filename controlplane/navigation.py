"""The navigation bar, filled by each app from its AppConfig.ready() so controlplane imports no app."""

from dataclasses import dataclass


@dataclass(frozen=True)
class NavItem:
    label: str
    url_name: str
    audience: str  # "all", "provider", "tenant", "audit", "users"
    order: int


_items: dict[str, NavItem] = {}


def register(label: str, url_name: str, *, audience: str = "all", order: int = 50) -> None:
    _items[url_name] = NavItem(label, url_name, audience, order)


def items() -> list[NavItem]:
    return sorted(_items.values(), key=lambda item: item.order)
