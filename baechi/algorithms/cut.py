"""m-cut: contiguous segments of the topological order, cut where transfers cost least.

m-fill's plan, memory first, with its cuts chosen: m-fill fills each device before it starts
the next, so its cuts fall wherever a device is full, often across the largest activations
(ResNet-50's layer graph on 14 devices of 2 GiB: 50 tensors cross, 7.1 GB, seven of them
411 MB). m-cut places the same kind of plan (each device runs one stretch of the canonical
order) at the cuts that cost least in sum, among the splits whose every stretch fits its
device: a shortest path over the cut positions.
"""

from __future__ import annotations

import bisect
import math
import time
from typing import Any

import numpy as np

from baechi.algorithms.base import Assignment, Problem
from baechi.costmodel import persistent_bytes_by
from baechi.errors import InfeasiblePlacement

#: On graphs of more than twice this many ops, stretches start only at the cut positions
#: of least cost and at evenly spaced ones, this many of each (the first position too):
#: each start costs a walk as long as its stretch.
CUT_STARTS = 128


def place_cut(problem: Problem) -> Assignment:
    """The contiguous split with the cheapest cuts that fits memory.

    A cut before position ``p`` of the canonical order costs, for each op before ``p``
    whose output an op of another unit at ``p`` or later reads, its dearest such transfer
    (:meth:`~baechi.costmodel.CostModel.nominal_transfer_us`). A stretch fits a device when
    it does under m-fill's accounting on a device of its own (:func:`_reach`): the
    persistent bytes of the units that start in it, outputs until their last reader,
    received copies until the last reader of their tensor, and each op's temp while it runs
    (without m-fill's zero-time rule: an instant op's inputs count while it runs, so a
    stretch may hold a little less than m-fill would put there). Devices take the stretches
    in cluster order (a device may take none); a unit's ops follow its first op, pinned
    units their pin, and each device runs its ops in canonical order. The simulator then
    judges the plan: units that span stretches (a forward op and its backward op) add to
    their device later than the stretch accounts for.

    Cost: one walk per start position and distinct device budget, each as long as the
    stretch that fits (O(ops × stretch) steps), and a shortest path in O(devices × ops)
    array operations.

    Raises
    ------
    InfeasiblePlacement
        No contiguous split fits (``details["op"]``: the op no stretch reaches).

    Examples
    --------
    A chain whose middle edge is light: m-fill cuts where the first device is full (after
    ``o2``, across 100 bytes), m-cut across the 1 byte.

    >>> from baechi import Cluster, load_graph
    >>> from baechi.algorithms.fill import place_fill
    >>> from baechi.grouping import colocation_units
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
    ...     {"name": f"o{i}", "compute_us": 1, "persistent_bytes": 100} for i in range(4)],
    ...     "edges": [{"src": "o0", "dst": "o1", "bytes": 100},
    ...               {"src": "o1", "dst": "o2", "bytes": 1},
    ...               {"src": "o2", "dst": "o3", "bytes": 100}]})
    >>> c = Cluster.uniform(2, memory_bytes=350)
    >>> problem = Problem.of(g, c, colocation_units(g, c))
    >>> place_fill(problem).device_of, place_cut(problem).device_of
    ([0, 0, 0, 1], [0, 0, 1, 1])
    """
    graph, units, cost, budget = problem.graph, problem.units, problem.cost, problem.budget
    order = graph.topo
    n = len(order)
    position = [0] * n
    first = [n] * len(units)  # each unit's first position
    for p, op in enumerate(order):
        position[op] = p
        first[units.unit_of[op]] = min(first[units.unit_of[op]], p)
    # last[op]: the position of its last data reader (its own when none reads it)
    last = list(position)
    # cut_us[p]: the cost of cutting between positions p - 1 and p
    change = np.zeros(n + 1)
    for op in range(n):
        readers = []  # (position, transfer) of the readers in other units
        for k in graph.out_edges[op]:
            if graph.edge_control[k]:
                continue
            dst = graph.edge_dst[k]
            last[op] = max(last[op], position[dst])
            if units.unit_of[dst] != units.unit_of[op]:
                readers.append((position[dst], cost.nominal_transfer_us(k)))
        # a cut before position p sends the dearest transfer to a reader at p or later
        dearest, upto = 0.0, -1  # the dearest so far, from the farthest reader, and where
        for at, transfer_us in sorted(readers, reverse=True):
            if transfer_us > dearest:
                if dearest:  # cuts after ``at`` (up to ``upto``) send the dearest so far
                    change[at + 1] += dearest
                    change[upto + 1] -= dearest
                dearest, upto = transfer_us, at
        if dearest:
            change[position[op] + 1] += dearest
            change[upto + 1] -= dearest
    cut_us = np.cumsum(change)[:n]
    cut_us[0] = 0.0
    if n <= 2 * CUT_STARTS:
        candidates = list(range(n))
    else:  # the cheapest cuts, and evenly spaced ones so that some split fits
        cheapest = np.argsort(cut_us[1:], kind="stable")[:CUT_STARTS] + 1
        spaced = np.linspace(0, n - 1, CUT_STARTS + 1).astype(int)
        candidates = sorted({0, *cheapest.tolist(), *spaced.tolist()})
    walks = _Walks(problem, first, last)  # what every device's walks share
    reaches: dict[tuple[float, str, int], tuple[list[int], list[float]]] = {}
    farthest = 0  # the farthest position a stretch ends at (where memory stops it)
    missing = math.inf  # the least a stretch ending at the farthest position went over
    best = np.full(n + 1, math.inf)  # best[j]: cheapest cuts covering positions 0..j-1
    best[0] = 0.0
    starts: list[np.ndarray] = []  # per device, the start of its stretch ending at j
    pinned = any(pin >= 0 for pin in units.pin)
    for d, device in enumerate(problem.cluster.devices):
        if best[n] == 0.0:
            break  # no cut at all: the devices after take nothing
        key = (budget[d], device.kind, d if pinned else -1)
        if key not in reaches:
            reaches[key] = _reach(problem, walks, d, candidates)
        reach, short = reaches[key]
        after = best.copy()
        start = np.full(n + 1, -1)  # -1: the device takes nothing
        for i in np.flatnonzero(np.isfinite(best[:n])):
            end = reach[i]
            if short[i] and end >= farthest:
                if end > farthest:
                    farthest, missing = end, math.inf
                missing = min(missing, short[i])
            if end <= i:
                continue
            value = best[i] + cut_us[i]
            window = after[i + 1:end + 1]
            better = value < window
            window[better] = value
            start[i + 1:end + 1][better] = i
        best = after
        starts.append(start)
    if math.isinf(best[n]):
        op = graph.names[order[farthest]]
        why = f"the closest is {missing:.0f} bytes short" if math.isfinite(missing) else \
            "no device left in cluster order can run it (its compute_us_by_kind)"
        raise InfeasiblePlacement(
            f"m-cut: no contiguous split of the topological order fits memory: no stretch "
            f"reaches past op {op!r}; {why}",
            {"op": op, **({"missing_bytes": int(missing)} if math.isfinite(missing) else {})})
    unit_device = list(units.pin)
    segment_device = [0] * n
    j = n
    for d in range(len(starts) - 1, -1, -1):
        i = int(starts[d][j])
        if i < 0:
            continue
        segment_device[i:j] = [d] * (j - i)
        j = i
    device_of = [0] * n
    orders: list[list[int]] = [[] for _ in budget]
    for op in order:
        unit = units.unit_of[op]
        if unit_device[unit] < 0:
            unit_device[unit] = segment_device[first[unit]]
        device_of[op] = unit_device[unit]
        orders[device_of[op]].append(op)
    return Assignment(device_of, orders)


class _Walks:
    """The tables of :func:`_reach` that no device changes, built once per placement: the
    units' persistent bytes, per position its unit, its data inputs as (source unit, message
    id, bytes) (a message id per message key, :meth:`CostModel.transfer_key
    <baechi.costmodel.CostModel.transfer_key>` without its destination: the destination is
    the stretch's device), the position of each message's last reader, and the bytes an op
    allocates while it runs and holds after it."""

    def __init__(self, problem: Problem, first: list[int], last: list[int]) -> None:
        graph, units, cost = problem.graph, problem.units, problem.cost
        order = graph.topo
        self.first, self.last = first, last
        self.unit_persistent = persistent_bytes_by(graph, units.unit_of, len(units))
        self.unit_of = [units.unit_of[op] for op in order]  # by position
        message_ids: dict[tuple[Any, ...], int] = {}
        self.inputs: list[list[tuple[int, int, int]]] = []
        self.last_of_message: list[int] = []
        for op in order:
            inputs = []
            for k in graph.in_edges[op]:
                if graph.edge_control[k]:
                    continue
                key = cost.transfer_key(k, 0)
                if key not in message_ids:
                    message_ids[key] = len(message_ids)
                    self.last_of_message.append(last[graph.edge_src[k]])
                inputs.append((units.unit_of[graph.edge_src[k]], message_ids[key],
                               graph.edge_bytes[k]))
            self.inputs.append(inputs)
        self.own_bytes = [graph.temp_bytes[op] + graph.output_bytes[op] for op in order]
        self.held_bytes = [graph.output_bytes[op] if last[op] > p else 0
                           for p, op in enumerate(order)]


def _reach(problem: Problem, walks: _Walks, d: int, starts: list[int]
           ) -> tuple[list[int], list[float]]:
    """Per start position ``i``, the end ``j`` of the longest stretch ``i..j-1`` of the
    canonical order that fits device ``d`` on its own, and the bytes the stretch would go
    over with the op at ``j`` (0 when it ends for another reason): for the positions of
    ``starts`` and those where m-fill's stretches start (``i`` for the others, and where
    not even the op at ``i`` fits). Ops of units that start before ``i`` or are pinned
    elsewhere are not the stretch's: they go to their unit's device; what they send is
    received like any copy.
    """
    units = problem.units
    n = len(problem.graph)
    first, last, order = walks.first, walks.last, problem.graph.topo
    limit = problem.budget[d]
    allowed = [d in problem.devices_for(u) for u in range(len(units))]
    pinned_away = [units.pin[u] not in (-1, d) for u in range(len(units))]
    if math.isinf(limit):
        # only kinds end a stretch: at the first unit from ``i`` on that cannot run on ``d``
        blocked = sorted(first[u] for u in range(len(units))
                         if not allowed[u] and not pinned_away[u])
        reach = list(range(n))
        for i in starts:
            k = bisect.bisect_left(blocked, i)
            reach[i] = blocked[k] if k < len(blocked) else n
        return reach, [0.0] * n
    unit_persistent, unit_of, inputs = walks.unit_persistent, walks.unit_of, walks.inputs
    last_of_message, own_bytes, held_bytes = \
        walks.last_of_message, walks.own_bytes, walks.held_bytes

    def walk(i: int) -> tuple[int, float]:
        """The end of the longest stretch from ``i`` and the bytes its next op is short."""
        persistent = 0
        level = 0  # outputs and copies held
        peak = 0
        frees: dict[int, int] = {}  # position -> bytes freed after that position's op
        copied: set[int] = set()  # message ids of the copies received
        j = i
        while j < n:
            unit = unit_of[j]
            if first[unit] < i or pinned_away[unit]:
                # not this stretch's op: it runs on its unit's device
                level -= frees.pop(j, 0)
                j += 1
                continue
            if not allowed[unit]:
                return j, 0.0
            new_persistent = unit_persistent[unit] if first[unit] == j else 0
            arriving = {message: nbytes for src_unit, message, nbytes in inputs[j]
                        if (first[src_unit] < i or pinned_away[src_unit])
                        and message not in copied}  # copies it receives, once each
            running = level + own_bytes[j] + sum(arriving.values())
            over = persistent + new_persistent + max(peak, running) - limit
            if over > 0:
                return j, over
            persistent += new_persistent
            peak = max(peak, running)
            for message, nbytes in arriving.items():
                # a copy leaves once every reader of its producer's output ran
                copied.add(message)
                level += nbytes
                frees[last_of_message[message]] = \
                    frees.get(last_of_message[message], 0) + nbytes
            if held_bytes[j]:
                level += held_bytes[j]
                frees[last[order[j]]] = frees.get(last[order[j]], 0) + held_bytes[j]
            level -= frees.pop(j, 0)
            j += 1
        return n, 0.0

    reach = list(range(n))
    short = [0.0] * n
    done: set[int] = set()

    def reach_from(i: int) -> None:
        if time.perf_counter() > problem.deadline:
            raise InfeasiblePlacement(
                f"m-cut: the request's time limit passed after {len(done)} of "
                f"{len(starts)} start positions", {"deadline_reached": True})
        done.add(i)
        reach[i], short[i] = walk(i)

    for i in starts:
        reach_from(i)
    # and m-fill's starts (each stretch from where the one before ended), so that a split
    # exists wherever filling one device after another finds one
    i = 0
    while i < n and reach[i] > i:
        i = reach[i]
        if i < n and i not in done:
            reach_from(i)
    return reach, short


__all__ = ["place_cut"]
