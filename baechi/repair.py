"""Repair a plan that overshoots memory by moving units off the overflowing devices.

When a greedy placer dead-ends (m-ETF commits ops regardless of memory once nothing fits),
its plan is usually fast but over a limit on one or two devices. Instead of placing again
from scratch with lower budgets, :func:`repair` moves units from the device that overflows
most to the devices with the most room, one unit per step, keeping the move that lowers the
total overshoot most (then the step time), until every device fits, no move helps, or the
deadline passes.

- **Candidates.** Of the device with the largest overshoot, the :data:`UNITS_PER_STEP`
  movable units (not pinned) holding the most bytes (:func:`~baechi.costmodel.memory_proxy`:
  persistent + outputs + largest temp), each to the :data:`TARGETS_PER_STEP` other devices
  with the most room where all its ops can run.
- **Orders.** Every candidate keeps one linear order of all ops, the current schedule's
  (start time, then canonical position): each device's order is its subsequence, so orders
  stay consistent, and a moved unit runs on its new device where it ran before.
- **The judge.** Candidates are replayed exactly (:class:`~baechi.evaluator.PlanEvaluator`,
  memory peaks included); the repaired plan is returned only if every device fits.

Examples
--------
>>> import math
>>> from baechi import Cluster, load_graph
>>> from baechi.grouping import colocation_units
>>> g = load_graph({"format": "baechi.graph/v1", "ops": [
...     {"name": n, "compute_us": 10, "persistent_bytes": 600} for n in "abc"]})
>>> c = Cluster.uniform(3, memory_bytes=1000)
>>> device_of, orders = repair(g, c, [0, 0, 0], [[0, 1, 2], [], []],
...                            units=colocation_units(g, c), deadline=math.inf)
>>> sorted(device_of)  # 600 bytes each, 1000 per device: one op per device
[0, 1, 2]
"""

from __future__ import annotations

import time

from baechi.cluster import Cluster
from baechi.costmodel import CostModel, memory_proxy
from baechi.evaluator import Evaluation, PlanEvaluator
from baechi.graph import Graph
from baechi.grouping import Units

#: Units of the most overflowing device tried per step (the ones holding the most bytes).
UNITS_PER_STEP = 6

#: Destination devices tried per unit (the ones with the most room).
TARGETS_PER_STEP = 3


def repair(
    graph: Graph, cluster: Cluster, device_of: list[int], orders: list[list[int]], *,
    units: Units, deadline: float, cost: CostModel | None = None,
) -> tuple[list[int], list[list[int]]] | None:
    """Move units until every device's simulated peak fits its memory.

    Parameters
    ----------
    graph, cluster
        What the plan places.
    device_of, orders
        The plan that overshoots (consistent orders; units not split).
    units
        Ops that move together; pinned units never move.
    deadline
        A :func:`time.perf_counter` value; no step starts after it.
    cost
        The request's cost model (built when not given).

    Returns
    -------
    (device_of, orders) or None
        A plan within every device's memory, or ``None`` when none was reached.
    """
    limits = [d.memory_bytes for d in cluster.devices]
    evaluator = PlanEvaluator(graph, cluster, cost or CostModel(graph, cluster))
    current = evaluator.run(list(device_of), [list(o) for o in orders])
    assert current is not None and current.peaks is not None
    weight = [memory_proxy(graph, members) for members in units.members]
    allowed = [evaluator.cost.devices_for(members) for members in units.members]
    while _excess(current, limits) > 0 and time.perf_counter() < deadline:
        over = [(current.peaks[d] - limit, d) for d, limit in enumerate(limits)  # type: ignore[index]
                if limit is not None]
        _, source = max(over)
        on_source = {units.unit_of[op] for op in current.orders[source]}
        movable = sorted((u for u in on_source if units.pin[u] < 0), key=lambda u: -weight[u])
        rank = _rank(graph, current)
        best: Evaluation | None = None
        for unit in movable[:UNITS_PER_STEP]:
            targets = sorted((d for d in allowed[unit] if d != source),
                             key=lambda d: _room(current, limits, d), reverse=True)
            for target in targets[:TARGETS_PER_STEP]:
                moved = list(current.device_of)
                for op in units.members[unit]:
                    moved[op] = target
                candidate = evaluator.run(moved, _orders(rank, moved, len(limits)))
                if candidate is not None and (best is None or _better(candidate, best, limits)):
                    best = candidate
        if best is None or not _better(best, current, limits):
            return None  # stuck: no single move lowers the overshoot
        current = best
    if _excess(current, limits) > 0:
        return None
    return current.device_of, current.orders


def _excess(evaluation: Evaluation, limits: list[int | None]) -> int:
    """Bytes over the limits, summed over the devices."""
    assert evaluation.peaks is not None
    return sum(max(0, peak - limit) for peak, limit in zip(evaluation.peaks, limits, strict=True)
               if limit is not None)


def _room(evaluation: Evaluation, limits: list[int | None], d: int) -> float:
    assert evaluation.peaks is not None
    limit = limits[d]
    return float("inf") if limit is None else limit - evaluation.peaks[d]


def _better(a: Evaluation, b: Evaluation, limits: list[int | None]) -> bool:
    """Less overshoot, then a shorter step."""
    return (_excess(a, limits), a.step_us) < (_excess(b, limits), b.step_us)


def _rank(graph: Graph, evaluation: Evaluation) -> list[int]:
    """Every op by (start, canonical position): a linear order consistent with the edges and
    with each device's order in ``evaluation`` (an op starts no earlier than its producers
    and its device predecessor; at equal starts the canonical order breaks the tie)."""
    position = graph.topo_position
    return sorted(range(len(graph)), key=lambda op: (evaluation.start[op], position[op]))


def _orders(rank: list[int], device_of: list[int], n_dev: int) -> list[list[int]]:
    orders: list[list[int]] = [[] for _ in range(n_dev)]
    for op in rank:
        orders[device_of[op]].append(op)
    return orders


__all__ = ["repair"]
