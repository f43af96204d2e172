"""``single``: every op on the fastest device that holds the whole graph."""

from __future__ import annotations

from baechi.algorithms.base import Assignment, Problem
from baechi.errors import InfeasiblePlacement
from baechi.simulate import trace


def place_single(problem: Problem) -> Assignment:
    """Canonical order on the fastest device whose memory holds the whole step.

    Devices are tried fastest first (cluster order among equals). Pins are ignored only in
    the sense that a pinned op must be on the chosen device, else that device is skipped.
    """
    graph, cluster, units = problem.graph, problem.cluster, problem.units
    pins = {p for p in units.pin if p >= 0}
    ranked = sorted(range(len(cluster.devices)), key=lambda d: -cluster.devices[d].speed)
    best_peak = None
    for d in ranked:
        if pins - {d}:
            continue
        orders: list[list[int]] = [[] for _ in cluster.devices]
        orders[d] = list(graph.topo)
        device_of = [d] * len(graph)
        peak = trace(graph, cluster, device_of, orders)[3][d].peak
        if peak <= problem.budget[d]:
            return Assignment(device_of, orders)
        best_peak = peak if best_peak is None else min(best_peak, peak)
    if best_peak is None:
        raise InfeasiblePlacement("single: the graph pins ops to more than one device")
    raise InfeasiblePlacement(
        f"single: the whole graph needs {best_peak} bytes at its peak; no device holds it "
        f"(largest: {max(problem.budget):.0f} bytes)",
        {"graph_needs_bytes": best_peak, "missing_bytes": int(best_peak - max(problem.budget))},
    )
