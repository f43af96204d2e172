"""m-fill: contiguous segments of the topological order, each device filled to its memory.

The memory-first placer: it gives up parallelism to fit where greedy schedulers dead-end
(chains of large activations, as in PipeDream's layer graphs). ``place`` also uses it as the
last resort when the requested algorithm finds no plan within memory.
"""

from __future__ import annotations

from typing import Any

from baechi.algorithms.base import Assignment, Problem
from baechi.errors import InfeasiblePlacement
from baechi.memory import persistent_bytes_by


def place_fill(problem: Problem) -> Assignment:
    """Walk the canonical order; keep each op on the current device while it fits.

    Memory is counted as the simulator does for a device running its ops in this order:
    the persistent bytes of every unit placed there (from the start), outputs until their
    last consumer is placed, received copies until the last consumer of the tensor is
    placed, and the op's temp while it runs. A unit goes to the current device if it fits
    there, else to the next device that holds it. Pinned or already placed units go where
    they must; the simulator then judges the plan.

    A unit that fits on no device goes where it is least short and the walk goes on: the
    :class:`~baechi.errors.InfeasiblePlacement` raised at the end names the first such op and
    carries the whole assignment as ``plan``, a start for repair (and a plan when the
    simulator, which frees memory as time passes, finds that it fits after all).

    Examples
    --------
    >>> from baechi import Cluster, load_graph
    >>> from baechi.grouping import colocation_units
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
    ...     {"name": f"o{i}", "compute_us": 1, "persistent_bytes": 60} for i in range(4)],
    ...     "edges": [{"src": f"o{i}", "dst": f"o{i + 1}", "bytes": 0} for i in range(3)]})
    >>> c = Cluster.uniform(2, memory_bytes=150)
    >>> place_fill(Problem.of(g, c, colocation_units(g, c))).device_of
    [0, 0, 1, 1]
    """
    graph, units, budget, cost = problem.graph, problem.units, problem.budget, problem.cost
    n_dev = len(budget)
    unit_device = list(units.pin)
    persistent = [0] * n_dev  # resident from the start
    level = [0] * n_dev  # live outputs and copies, as the walk goes
    peak = [0] * n_dev  # highest level seen so far, persistent excluded
    unit_persistent = persistent_bytes_by(graph, units.unit_of, len(units))
    for unit, d in enumerate(unit_device):
        if d >= 0:
            persistent[d] += unit_persistent[unit]
    consumers_left = [sum(1 for k in graph.out_edges[op] if not graph.edge_control[k])
                      for op in range(len(graph))]
    # received copies, by the simulator's message key (CostModel.transfer_key) -> bytes held
    copies: dict[tuple[Any, ...], int] = {}
    copies_of: dict[int, list[tuple[Any, ...]]] = {}  # src -> its keys in ``copies``
    device_of = [-1] * len(graph)
    orders: list[list[int]] = [[] for _ in range(n_dev)]
    current = 0
    short: InfeasiblePlacement | None = None  # the first op that fitted nowhere

    def incoming(op: int, d: int) -> int:
        total = 0
        for k in graph.in_edges[op]:
            src = graph.edge_src[k]
            if (not graph.edge_control[k] and device_of[src] != d
                    and cost.transfer_key(k, d) not in copies):
                total += graph.edge_bytes[k]
        return total

    def running(op: int, d: int) -> int:
        """The level on ``d`` while ``op`` runs there (its inputs arrive first)."""
        arrived = level[d] + incoming(op, d)
        own = graph.temp_bytes[op] + graph.output_bytes[op]
        if not cost.is_instant(op, d):
            return arrived + own
        # a zero-time op frees the inputs it is the last consumer of before it allocates
        uses: dict[int, int] = {}
        for k in graph.in_edges[op]:
            if not graph.edge_control[k]:
                uses[graph.edge_src[k]] = uses.get(graph.edge_src[k], 0) + 1
        held: dict[tuple[Any, ...], int] = {}
        for k in graph.in_edges[op]:
            src = graph.edge_src[k]
            if graph.edge_control[k] or uses[src] != consumers_left[src]:
                continue
            if device_of[src] == d:
                held[(src,)] = graph.output_bytes[src]
            else:
                held[cost.transfer_key(k, d)] = graph.edge_bytes[k]
        freed = sum(held.values())
        return max(arrived, arrived - freed + own)

    def shortfall(op: int, d: int, new_persistent: int) -> float:
        """Bytes ``d`` would go over its budget with ``op`` (≤ 0: it fits)."""
        return persistent[d] + new_persistent + max(peak[d], running(op, d)) - budget[d]

    def fits(op: int, d: int, new_persistent: int) -> bool:
        return shortfall(op, d, new_persistent) <= 0

    for op in graph.topo:
        unit = units.unit_of[op]
        d = unit_device[unit]
        if d < 0:
            new = unit_persistent[unit]
            allowed = problem.devices_for(unit)
            d = next((e for e in allowed if e >= current and fits(op, e, new)), -1)
            if d < 0:
                d = next((e for e in allowed if e < current and fits(op, e, new)), -1)
            if d < 0:
                missing, d = min((shortfall(op, e, new), e) for e in allowed)
                if short is None:
                    short = InfeasiblePlacement(
                        f"m-fill: op {graph.names[op]!r} fits on no device in topological "
                        f"order: the closest is {missing:.0f} bytes short",
                        {"op": graph.names[op], "missing_bytes": int(missing)},
                    )
            current = max(current, d)
            unit_device[unit] = d
            persistent[d] += new
        peak[d] = max(peak[d], running(op, d))
        for k in graph.in_edges[op]:
            src = graph.edge_src[k]
            if graph.edge_control[k] or device_of[src] == d:
                continue
            key = cost.transfer_key(k, d)
            if key not in copies:
                copies[key] = graph.edge_bytes[k]
                copies_of.setdefault(src, []).append(key)
                level[d] += graph.edge_bytes[k]
        level[d] += graph.output_bytes[op]
        device_of[op] = d
        orders[d].append(op)
        for k in graph.in_edges[op]:
            src = graph.edge_src[k]
            if graph.edge_control[k]:
                continue
            consumers_left[src] -= 1
            if consumers_left[src] == 0:
                # every consumer is placed: the output and its copies leave the devices
                level[device_of[src]] -= graph.output_bytes[src]
                for key in copies_of.pop(src, ()):
                    level[key[1]] -= copies.pop(key)
        if consumers_left[op] == 0:
            level[d] -= graph.output_bytes[op]
    if short is not None:
        short.plan = Assignment(device_of, orders)
        raise short
    return Assignment(device_of, orders)

