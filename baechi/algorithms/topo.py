"""m-TOPO: fill devices in topological order, each up to its share of memory (Baechi)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from baechi.algorithms.base import Assignment, Problem
from baechi.errors import InfeasiblePlacement
from baechi.grouping import unit_memory


def footprint(problem: Problem) -> list[int]:
    """Static memory of each unit: the :func:`~baechi.memory.memory_proxy` of its ops.

    An upper bound of what the unit's ops hold at once, received copies aside.
    """
    return unit_memory(problem.graph, problem.units)


def place_topo(problem: Problem) -> Assignment:
    """Place units in canonical topological order, filling one device after another.

    Each device takes units until it holds its share, ``total / devices + largest unit``,
    and never more than its budget; a unit that fits on no later device goes to the device
    with the most room left. Every device runs its ops in the canonical order.

    Examples
    --------
    >>> from baechi import Cluster, load_graph
    >>> from baechi.grouping import colocation_units
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
    ...     {"name": f"o{i}", "compute_us": 1, "persistent_bytes": 10} for i in range(4)]})
    >>> c = Cluster.uniform(2)
    >>> place_topo(Problem.of(g, c, colocation_units(g, c))).device_of
    [0, 0, 0, 1]
    """
    graph, units, budget = problem.graph, problem.units, problem.budget
    n_dev = len(budget)
    need = footprint(problem)
    share = sum(need) / n_dev + max(need, default=0)
    used = [0.0] * n_dev
    unit_device = list(units.pin)
    counted = [False] * len(units)
    current = 0
    device_of = [0] * len(graph)
    orders: list[list[int]] = [[] for _ in range(n_dev)]
    for op in graph.topo:
        unit = units.unit_of[op]
        if not counted[unit]:
            counted[unit] = True
            if unit_device[unit] < 0:
                unit_device[unit] = _choose(unit, need[unit], used, budget, share, current,
                                            problem.devices_for(unit))
                current = max(current, unit_device[unit])
            used[unit_device[unit]] += need[unit]
        d = unit_device[unit]
        device_of[op] = d
        orders[d].append(op)
    return Assignment(device_of, orders)


def _choose(
    unit: int, need: int, used: list[float], budget: list[float], share: float, current: int,
    allowed: Sequence[int],
) -> int:
    for d in allowed:
        if d >= current and (
                used[d] + need <= min(share, budget[d]) or (used[d] == 0 and need <= budget[d])):
            return d
    roomiest = max(allowed, key=lambda d: budget[d] - used[d])
    if used[roomiest] + need <= budget[roomiest] or math.isinf(budget[roomiest]):
        return roomiest
    raise InfeasiblePlacement(
        f"m-topo: unit {unit} needs {need} bytes; the device with most room has "
        f"{budget[roomiest] - used[roomiest]:.0f} left",
        {"missing_bytes": int(used[roomiest] + need - budget[roomiest])},
    )
