"""Is it the fabric? Why a job runs slow, answered from the telemetry along its path.

The job's path is its nodes' NICs (one per rail), the leaf switch ports they plug into and the leaf and spine
switches above. Each NIC on the path is compared with every other NIC of the cluster on the same measures
(symbol errors, receive errors, link recoveries, congestion — port_xmit_wait — and time down); each of the
job's GPUs with the job's other GPUs (throttling, temperature, utilisation). A NIC far outside the cluster's
spread (robust z-score over the median and MAD, with a floor so an all-quiet cluster does not make noise look
huge) is evidence against the fabric part it sits on; several such NICs on one leaf switch or one rail point at
the switch or the rail. The verdict rules the fabric in (naming the likeliest link, switch or rail, with the
evidence) or out (pointing at the GPUs or hosts that stand out instead).
"""

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from django.db.models import Avg, Min

from fleet.models import NIC
from jobs.models import Job, JobProgress
from telemetry.models import GPUState, NICState

NIC_MEASURES = {  # measure -> (what it means, floor of the spread in its units per hour)
    "symbol_rate": ("symbol errors", 50.0),
    "rcv_error_rate": ("port receive errors", 20.0),
    "recovery_rate": ("link error recoveries", 1.0),
    "congestion_rate": ("congestion (port_xmit_wait)", 10_000.0),
}
OUTLIER_Z = 6.0


@dataclass
class Finding:
    where: str  # "nic", "leaf", "rail", "gpu", "host"
    name: str
    score: float
    evidence: list[str] = field(default_factory=list)


def _spread(values: list[float], floor: float) -> tuple[float, float]:
    median = statistics.median(values) if values else 0.0
    mad = statistics.median([abs(v - median) for v in values]) * 1.4826 if values else 0.0
    return median, max(mad, floor)


def _slowness(job: Job) -> dict:
    steps = list(
        JobProgress.objects.filter(job=job, step_seconds__isnull=False)
        .order_by("at")
        .values_list("step_seconds", flat=True)
    )
    baseline = JobProgress.objects.filter(job=job, step_seconds__isnull=False).aggregate(
        m=Min("step_seconds")
    )["m"]
    recent = statistics.median(steps[-5:]) if steps else None
    if not steps or not baseline:
        return {
            "slow": None,
            "baseline_seconds": baseline,
            "recent_seconds": recent,
            "detail": "the job reports no step times yet; diagnosing its path anyway",
        }
    ratio = recent / baseline
    return {
        "slow": ratio > 1.1,
        "ratio": round(ratio, 3),
        "baseline_seconds": round(baseline, 4),
        "recent_seconds": round(recent, 4),
        "detail": f"step time {recent:.2f} s against its own best {baseline:.2f} s ({ratio - 1:+.0%})",
    }


def _nic_finding(nic: NIC, state: NICState, spreads: dict) -> Finding | None:
    """A NIC on the path that stands out against the cluster's spread (or whose link is down), or None."""
    evidence, worst = [], 0.0
    for measure, (meaning, _) in NIC_MEASURES.items():
        median, scale = spreads[measure]
        z = (getattr(state, measure) - median) / scale
        if z >= OUTLIER_Z:
            evidence.append(
                f"{meaning} {getattr(state, measure):,.0f}/h against a cluster median of {median:,.0f}/h"
            )
            worst = max(worst, z)
    if state.link_state == "down":
        evidence.append("link down")
        worst = max(worst, 50.0)
    if not evidence:
        return None
    label = f"{nic.node.hostname}/{nic.name} (rail {nic.rail}, port {nic.switch_port or '?'})"
    return Finding("nic", label, worst, evidence)


def _path_findings(on_path: dict, states: dict) -> list[Finding]:
    """The NICs on the job's path that stand out, then the leaf switches and rails where several of them do."""
    findings: list[Finding] = []
    spreads = {
        m: _spread([getattr(s, m) for s in states.values()], floor) for m, (_, floor) in NIC_MEASURES.items()
    }
    per_leaf, per_rail = defaultdict(list), defaultdict(list)
    for nic_id, nic in on_path.items():
        state = states.get(nic_id)
        if state is None:
            continue
        finding = _nic_finding(nic, state, spreads)
        if finding is not None:
            findings.append(finding)
            per_leaf[nic.node.leaf_switch].append(finding.name)
            per_rail[nic.rail].append(finding.name)
    for leaf, labels in per_leaf.items():
        if len(labels) >= 2 and leaf:
            findings.append(
                Finding(
                    "leaf",
                    f"leaf switch {leaf}",
                    max(f.score for f in findings if f.name in labels) + 1,
                    [f"{len(labels)} of the job's NICs on it stand out: {', '.join(labels[:4])}"],
                )
            )
    for rail, labels in per_rail.items():
        nodes_hit = {label.split("/")[0] for label in labels}
        if len(nodes_hit) >= 2:
            findings.append(
                Finding(
                    "rail",
                    f"rail {rail}",
                    max(f.score for f in findings if f.name in labels) + 0.5,
                    [f"rail {rail} stands out on {len(nodes_hit)} of the job's nodes"],
                )
            )
    return findings


def _gpu_findings(nodes: dict) -> list[Finding]:
    """The job's GPUs that stand out against its other GPUs: throttled, hotter or less busy."""
    findings = []
    gpu_rows = list(GPUState.objects.filter(node_id__in=nodes).select_related("gpu", "node"))
    job_means = GPUState.objects.filter(node_id__in=nodes).aggregate(
        t=Avg("temperature"), u=Avg("utilization")
    )
    for row in gpu_rows:
        evidence = []
        if row.throttle_share >= 0.3:
            evidence.append(f"throttled {row.throttle_share:.0%} of the time")
        if (
            row.temperature is not None
            and job_means["t"] is not None
            and row.temperature - job_means["t"] >= 12
        ):
            evidence.append(f"{row.temperature:.0f} °C against the job's {job_means['t']:.0f} °C")
        if (
            row.utilization is not None
            and job_means["u"] is not None
            and job_means["u"] - row.utilization >= 25
        ):
            evidence.append(f"utilisation {row.utilization:.0f} % against the job's {job_means['u']:.0f} %")
        if evidence:
            findings.append(
                Finding("gpu", f"{row.node.hostname}/gpu{row.gpu.index}", 5.0 + 5.0 * len(evidence), evidence)
            )
    return findings


def _verdict(fabric: list[Finding], hosts: list[Finding], slowness: dict) -> dict:
    """Fabric or not, the culprit and a summary: the strongest finding wins, the fabric on a tie; a job at its own
    best pace is said to be not slow first."""
    if fabric and (not hosts or fabric[0].score >= hosts[0].score):
        culprit = fabric[0]
        verdict = {
            "fabric": True,
            "culprit": culprit.name,
            "where": culprit.where,
            "summary": f"The fabric: {culprit.name} — {'; '.join(culprit.evidence)}.",
        }
    elif hosts:
        culprit = hosts[0]
        verdict = {
            "fabric": False,
            "culprit": culprit.name,
            "where": culprit.where,
            "summary": f"Not the fabric: the job's path is clean; {culprit.name} stands out — {'; '.join(culprit.evidence)}.",
        }
    else:
        verdict = {
            "fabric": False,
            "culprit": None,
            "where": None,
            "summary": "Not the fabric: nothing on the job's path or among its GPUs stands out.",
        }
    if slowness["slow"] is False:
        # A job that runs at its own best pace is not slow: say that first, rather than answer a question nobody
        # should be asking ("Not the fabric"); what stands out on its path is still worth a look.
        if fabric or hosts:
            found = verdict["summary"]
            verdict["summary"] = f"Not slow: {slowness['detail']}. Still, {found[0].lower()}{found[1:]}"
        else:
            verdict["summary"] = (
                f"Not slow: {slowness['detail']}; nothing on its path or among its GPUs stands out."
            )
    return verdict


def diagnose(job: Job) -> dict:
    """The verdict for one job: ``fabric`` true/false, the likeliest culprit and the evidence."""
    allocations = list(job.allocations.filter(released_at__isnull=True).select_related("node"))
    nodes = {a.node_id: a.node for a in allocations}
    on_path = {nic.pk: nic for nic in NIC.objects.filter(node_id__in=nodes).select_related("node")}
    states = {s.nic_id: s for s in NICState.objects.filter(node__cluster_id=job.cluster_id)}
    findings = _path_findings(on_path, states) + _gpu_findings(nodes)
    fabric = sorted((f for f in findings if f.where in ("nic", "leaf", "rail")), key=lambda f: -f.score)
    hosts = sorted((f for f in findings if f.where in ("gpu", "host")), key=lambda f: -f.score)
    slowness = _slowness(job)
    verdict = _verdict(fabric, hosts, slowness)
    return {
        "job": job.pk,
        **verdict,
        "slowness": slowness,
        "path": {"nodes": len(nodes), "nics": len(on_path)},
        "findings": [
            {"where": f.where, "name": f.name, "score": round(f.score, 1), "evidence": f.evidence}
            for f in fabric + hosts
        ][:10],
    }


def fabric_health(cluster_id: int) -> dict:
    """A cluster's fabric as leaf switches × rails, each cell the worst NIC on it against the cluster's spread
    (robust z-score; ≥ OUTLIER_Z stands out), and the NICs that stand out: for the fabric view."""
    states = list(
        NICState.objects.filter(node__cluster_id=cluster_id).values_list(
            "nic__rail",
            "node__leaf_switch",
            "node__hostname",
            "nic__name",
            "link_state",
            *NIC_MEASURES.keys(),
        )
    )
    spreads = {
        m: _spread([row[5 + i] for row in states], floor)
        for i, (m, (_, floor)) in enumerate(NIC_MEASURES.items())
    }
    grid: dict[str, dict[int, float]] = defaultdict(dict)
    standing_out = []
    for row in states:
        rail, leaf, host, name, link = row[:5]
        worst = 50.0 if link == "down" else 0.0
        for i, measure in enumerate(NIC_MEASURES):
            median, scale = spreads[measure]
            worst = max(worst, (row[5 + i] - median) / scale)
        grid[leaf or "?"][rail] = max(grid[leaf or "?"].get(rail, 0.0), worst)
        if worst >= OUTLIER_Z:
            standing_out.append(
                {"nic": f"{host}/{name}", "leaf": leaf, "rail": rail, "z": round(worst, 1), "link": link}
            )
    rails = sorted({rail for cells in grid.values() for rail in cells})
    return {
        "rails": rails,
        "leaves": [
            {"leaf": leaf, "cells": [round(grid[leaf].get(r, 0.0), 1) for r in rails]}
            for leaf in sorted(grid)
        ],
        "standing_out": sorted(standing_out, key=lambda s: -s["z"])[:20],
        "threshold": OUTLIER_Z,
    }
