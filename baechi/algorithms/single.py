"""``single``: every op on the fastest device that holds the whole graph."""

from __future__ import annotations

import math

from baechi.algorithms.base import Assignment, Problem
from baechi.errors import InfeasiblePlacement
from baechi.simulate import single_device_run, single_device_run_of


def place_single(problem: Problem) -> Assignment:
    """Canonical order on the fastest device whose memory holds the whole step.

    Devices are tried fastest first (cluster order among equals). Pins are ignored only in
    the sense that a pinned op must be on the chosen device, else that device is skipped.
    """
    graph, cluster, units = problem.graph, problem.cluster, problem.units
    pins = {p for p in units.pin if p >= 0}
    if len(pins) > 1:
        raise InfeasiblePlacement("single: the graph pins ops to more than one device")
    cost = problem.cost
    if not cost.kinds_matter:
        ranked = sorted(range(len(cluster.devices)), key=lambda d: -cluster.devices[d].speed)
        peak = single_device_run_of(cost)[1]
    else:  # only devices where every op can run, least total time first
        ranked = sorted(cost.devices_for(range(len(graph))), key=lambda d: math.fsum(cost.op_us[d]))
        if not ranked:
            raise InfeasiblePlacement(
                "single: no device can run every op (compute_us_by_kind)",
                {"field": "compute_us_by_kind"})
        peak = single_device_run(graph, cluster, ranked[0], cost)[1]
    # one device, one order: the peak is the same whichever device runs it
    for d in ranked:
        if not pins - {d} and peak <= problem.budget[d]:
            orders: list[list[int]] = [[] for _ in cluster.devices]
            orders[d] = list(graph.topo)
            return Assignment([d] * len(graph), orders)
    room = max(problem.budget[d] for d in ranked if not pins - {d})
    raise InfeasiblePlacement(
        f"single: the whole graph needs {peak} bytes at its peak; no device holds it "
        f"(largest: {room:.0f} bytes)",
        {"graph_needs_bytes": peak, "missing_bytes": int(peak - room)},
    )
