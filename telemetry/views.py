from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from controlplane.access import principal, require
from telemetry import selectors
from telemetry.services.prediction import emptied_before_failure, prediction_metrics
from telemetry.tables import fabric_cells, sparkline


@login_required
def prediction_overview(request):
    """Nodes ranked by risk per cluster, with a sparkline each, and the live precision, recall and lead time
    beside what random predictions at the same rate would score."""
    require(principal(request.user).is_provider)
    ranking = selectors.risk_ranking(user=request.user)
    for block in ranking:
        for row in block["nodes"]:
            row["points"] = sparkline(row["history"] or [row["node"].risk_score])
    predictions = list(selectors.prediction_list(user=request.user)[:50])
    emptied = emptied_before_failure(predictions)
    for prediction in predictions:
        prediction.emptied = prediction.pk in emptied
    return render(
        request,
        "telemetry/predictions.html",
        {
            "ranking": ranking,
            "metrics": prediction_metrics(),
            "predictions": predictions,
        },
    )


@login_required
def fabric_index(request):
    """The navigation's way to the fabric pages: the clusters the reader sees in full, each linking to its fabric."""
    from fleet.selectors import cluster_list

    return render(
        request,
        "telemetry/fabric_index.html",
        {"clusters": cluster_list(user=request.user).order_by("name")[:500]},
    )


@login_required
def fabric_view(request, cluster_id: int):
    """A cluster's fabric: leaf switches × rails coloured by the health of the ports on them."""
    from django.shortcuts import get_object_or_404

    from fleet.selectors import cluster_list
    from telemetry.diagnosis import fabric_health

    cluster = get_object_or_404(cluster_list(user=request.user), pk=cluster_id)
    health = fabric_health(cluster.pk)
    for leaf in health["leaves"]:
        leaf["cells"] = fabric_cells(leaf["cells"], health["threshold"])
    return render(request, "telemetry/fabric.html", {"cluster": cluster, "health": health})
