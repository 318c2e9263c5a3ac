"""The cells of the telemetry pages' tables, shaped for their templates (the pages lay their tables out in the
template, without django-tables2: a risk ranking with a sparkline per node, a fabric grid of leaf × rail)."""


def sparkline(values: list[float], width: int = 120, height: int = 24) -> str:
    """SVG polyline points for a score history in [0, 1] (drawn server-side: no script per row)."""
    if not values:
        return ""
    step = width / max(1, len(values) - 1)
    return " ".join(f"{i * step:.1f},{height - v * height:.1f}" for i, v in enumerate(values))


def fabric_cells(cells: list[float], threshold: float) -> list[dict]:
    """One leaf switch's row of the fabric grid: each rail's worst deviation with the level it is shown at
    (``bad`` from the threshold, ``warn`` from half of it, else ``ok``)."""
    return [
        {"z": z, "level": "bad" if z >= threshold else ("warn" if z >= threshold / 2 else "ok")}
        for z in cells
    ]
