"""Repair a plan that overshoots memory by moving units off the overflowing devices.

When a greedy placer dead-ends (m-ETF commits ops regardless of memory once nothing fits),
its plan is usually fast but over a limit on one or two devices. Instead of placing again
from scratch with lower budgets, :func:`repair` moves units from the device that overflows
most to the devices with the most room, one unit per step, until every device fits, no move
helps, or the deadline passes. Two strategies choose the step:

- **"largest"** (for a greedy placer's plan, a little over): of the overflowing device's
  :data:`UNITS_PER_STEP` movable units (not pinned) holding the most bytes
  (:func:`~baechi.memory.memory_proxy`: persistent + outputs + largest temp), each to the
  :data:`TARGETS_PER_STEP` other devices with the most room where all its ops can run, the
  move that lowers the total overshoot most, then the shortest step.
- **"cheapest"** (for plans placed as if memory were unlimited, over by whole blocks): the
  candidates are the units that hold or keep bytes on that device at its peak instant
  (:func:`units_at_peak`), heaviest first (else, when none of their moves lowers the
  overshoot, the heaviest units: persistent bytes count all step); of the moves that lower
  the overshoot, the one with the shortest step. From the single-device plan of
  pipedream_resnet50 (PCIe, 75% memory) it reaches 706 ms where "largest" reaches 955 ms
  (869 ms with the held units as candidates); from the refused greedy plans of the
  benchmark it was worse in 3 settings of 174 (up to 9%: resnet50_inference_operator, PCIe,
  30%).

Both keep, for every candidate, one linear order of all ops, the current schedule's (start
time, then canonical position): each device's order is its subsequence, so orders stay
consistent, and a moved unit runs on its new device where it ran before. Candidates are
replayed exactly (:class:`~baechi.evaluator.PlanEvaluator`, memory peaks included); the
repaired plan is returned only if every device fits.

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

import math
import time
from typing import Literal

import numpy as np

from baechi.cluster import Cluster
from baechi.costmodel import CostModel
from baechi.evaluator import Evaluation, PlanEvaluator
from baechi.graph import Graph
from baechi.grouping import Units
from baechi.memory import memory_proxy
from baechi.simulate import Simulation, replay

#: How :func:`repair` chooses each step's move (see the module docstring).
Strategy = Literal["largest", "cheapest"]

#: Units of the most overflowing device tried per step (the ones holding the most bytes).
UNITS_PER_STEP = 6

#: Destination devices tried per unit (the ones with the most room).
TARGETS_PER_STEP = 3


def repair(
    graph: Graph, cluster: Cluster, device_of: list[int], orders: list[list[int]], *,
    units: Units, deadline: float, cost: CostModel | None = None,
    strategy: Strategy = "largest", give_up_us: float = math.inf,
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
    strategy
        How each step's move is chosen (see the module docstring).
    give_up_us
        Stop (``None``) once the plan being repaired is no faster than this, and cut short
        candidates that cannot beat it: a caller that keeps only a faster plan than one it
        has passes that plan's step time.

    Returns
    -------
    (device_of, orders) or None
        A plan within every device's memory, or ``None`` when none was reached.
    """
    limits = [d.memory_bytes for d in cluster.devices]
    cost = cost or CostModel(graph, cluster)
    evaluator = PlanEvaluator(graph, cluster, cost)
    current = evaluator.run(list(device_of), [list(o) for o in orders])
    assert current is not None and current.peaks is not None
    weight = [memory_proxy(graph, members) for members in units.members]
    allowed = cost.unit_devices(units)
    while _excess(current, limits) > 0 and time.perf_counter() < deadline:
        if current.step_us >= give_up_us:
            return None
        over = [(current.peaks[d] - limit, d) for d, limit in enumerate(limits)  # type: ignore[index]
                if limit is not None]
        _, source = max(over)
        on_source = {units.unit_of[op] for op in current.orders[source]}
        pools = [on_source]
        if strategy == "cheapest":
            pools.insert(0, units_at_peak(
                graph, replay(graph, cluster, current.device_of, current.orders, cost), units,
                source))
        # "largest" takes any move that is better by its rule; "cheapest" only moves that
        # lower the overshoot (a faster move that does not would be taken again and again)
        better = _cheaper if strategy == "cheapest" else _lower
        accept = _lower_overshoot if strategy == "cheapest" else _lower
        rank = _rank(graph, current)
        best: Evaluation | None = None
        for pool in pools:
            movable = sorted((u for u in pool if units.pin[u] < 0), key=lambda u: -weight[u])
            for unit in movable[:UNITS_PER_STEP]:
                targets = sorted((d for d in allowed[unit] if d != source),
                                 key=lambda d: _room(current, limits, d), reverse=True)
                for target in targets[:TARGETS_PER_STEP]:
                    moved = list(current.device_of)
                    for op in units.members[unit]:
                        moved[op] = target
                    candidate = evaluator.run(moved, _orders(rank, moved, len(limits)),
                                              bound=give_up_us)
                    if candidate is not None and accept(candidate, current, limits) and (
                            best is None or better(candidate, best, limits)):
                        best = candidate
            if best is not None:
                break
        if best is None:
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


def _lower(a: Evaluation, b: Evaluation, limits: list[int | None]) -> bool:
    """Less overshoot, then a shorter step."""
    return (_excess(a, limits), a.step_us) < (_excess(b, limits), b.step_us)


def _lower_overshoot(a: Evaluation, b: Evaluation, limits: list[int | None]) -> bool:
    return _excess(a, limits) < _excess(b, limits)


def _cheaper(a: Evaluation, b: Evaluation, limits: list[int | None]) -> bool:
    """A shorter step, then less overshoot."""
    return (a.step_us, _excess(a, limits)) < (b.step_us, _excess(b, limits))


def units_at_peak(graph: Graph, simulation: Simulation, units: Units, device: int) -> set[int]:
    """The units that hold or keep bytes on ``device`` at the instant its memory peaks: an op
    there whose temp or output is held then, and the ops there whose later end keeps an
    output or a received copy held (moving one of them away may release it).

    An item counts at an instant when it was allocated by then and is freed after it, or was
    allocated at it (docs/format.md §4: frees of earlier items come first).
    """
    trace = simulation.memory[device]
    instant = float(trace.times[int(np.argmax(trace.bytes))])
    start, end, device_of = simulation.start, simulation.end, simulation.device_of

    def keepers(src: int) -> list[int]:  # the ops on ``device`` still to use src's output
        return [c for c in graph.successors(src) if device_of[c] == device and end[c] > instant]

    held: set[int] = set()
    for op in simulation.orders[device]:
        if start[op] > instant:
            break  # a device runs its order in time
        keep = keepers(op)
        if keep or end[op] > instant or start[op] == instant:
            held.add(units.unit_of[op])
            held.update(units.unit_of[c] for c in keep)
    transfers = simulation.transfers
    for index, src in enumerate(transfers.src_op):
        if transfers.dst_device[index] == device and transfers.start[index] <= instant:
            held.update(units.unit_of[c] for c in keepers(src))
    return held


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


__all__ = ["Strategy", "repair", "units_at_peak"]
