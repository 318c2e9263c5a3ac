"""What jobs asks of apps that import it (telemetry), without importing them: registered in their AppConfig.ready().

- ``precision_for(score) -> tuple[float, int, str] | None``: the measured precision of judged failure predictions
  whose score falls in the band of ``score``, how many were judged, and the band in words (None: not known).
  A proactive move's expected saving is weighted by it (docs/gpu-hours.md).
- ``links_clean(links, window=, now=) -> dict[(node id, NIC name), bool]``: whether telemetry shows each link healthy
  again (up, no new error for ``window``); links with no telemetry are left out (jobs.services.links).
"""

from collections.abc import Callable

from django.conf import settings

_precision_for: Callable[[float], tuple[float, int, str] | None] | None = None


_links_clean: Callable[..., dict] | None = None


def register_links_clean(provider: Callable[..., dict]) -> None:
    global _links_clean
    _links_clean = provider


def links_clean(links: dict, *, window, now) -> dict:
    return _links_clean(links, window=window, now=now) if _links_clean else {}


def register_precision(provider: Callable[[float], tuple[float, int, str] | None]) -> None:
    global _precision_for
    _precision_for = provider


def prediction_precision(score: float | None) -> tuple[float, str]:
    """(precision, where it comes from): measured when at least PROACTIVE_PRECISION_MIN_JUDGED predictions of the
    score's band were judged, else the prior PROACTIVE_PRECISION_PRIOR."""
    prior = float(settings.PROACTIVE_PRECISION_PRIOR)
    found = _precision_for(score) if (_precision_for and score is not None) else None
    if found is None:
        return prior, f"prior {prior:.2f}: no judged predictions"
    precision, judged, band = found
    if judged < settings.PROACTIVE_PRECISION_MIN_JUDGED:
        return (
            prior,
            f"prior {prior:.2f}: {judged} judged predictions of score {band}, fewer than "
            f"{settings.PROACTIVE_PRECISION_MIN_JUDGED}",
        )
    return precision, f"measured on {judged} judged predictions of score {band}"
