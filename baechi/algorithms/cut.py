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
import heapq
import itertools
import math
import time
from typing import Any, NamedTuple

import numpy as np

from baechi.algorithms.base import Assignment, Problem
from baechi.errors import InfeasiblePlacement
from baechi.memory import persistent_bytes_by

#: The key of :attr:`Problem.memo <baechi.algorithms.base.Problem.memo>` under which m-cut
#: keeps its walks.
MEMO_KEY = "m-cut"

#: On graphs of more than twice this many ops, stretches start only at the cut positions
#: of least cost and at evenly spaced ones, this many of each (the first position too):
#: each start costs a walk as long as its stretch.
CUT_STARTS = 128


def place_cut(problem: Problem) -> Assignment:
    """The contiguous split with the cheapest cuts that fits memory.

    A unit goes where its first op is, with all its ops: devices take stretches of the
    units' first positions in the canonical order. A cut before position ``p`` costs, for
    each op, its dearest transfer to a reader whose unit starts on the other side of ``p``
    from the op's own unit (:meth:`~baechi.costmodel.CostModel.nominal_transfer_us`): the
    forward activation a later unit reads, and the gradient a backward op reads from a
    unit that starts later. A stretch fits a device when its units do, every op of them,
    under m-fill's accounting on a device of its own (:func:`_reach`): their persistent
    bytes, at each position where one of their ops runs its temp and output, outputs until
    their last reader, received copies from their first reader there until the last reader
    of their producer's output (without m-fill's zero-time rule: an instant op's inputs
    count while it runs, so a stretch may hold a little less than m-fill would put there).
    Devices take the stretches in cluster order (a device may take none); pinned units go
    to their pin, and each device runs its ops in canonical order. The simulator then
    judges the plan: it frees memory as time passes and sends copies as soon as their
    producer ends.

    Where units span the order (a forward op and its backward op, a colocated variable and
    its reader), counting their later ops and the cuts between units rather than positions
    made the plans faster: on every shared graph at 30/50/75/90% of its peak on 4 PCIe
    devices, both pipelines (218 placements with a plan either way), geomean step 0.963 of
    counting each stretch's positions only, and 18 fallbacks to m-fill instead of 26
    (bert_l-6_inference_operator unreduced at 90%: 274.0 -> 144.7 ms; 2 plans lost:
    resnet50_training_operator at 30%, where the stretches counted too little and the
    simulator's timing let them fit).

    Cost: one walk per start position and device kind, each as long as the stretch that
    fits, with a few array updates per op and, per unit, a look at the positions of the
    later ops taken so far (O(ops × stretch) steps), and a shortest path in O(devices ×
    ops) array operations: the 312 placements above, with a plan or not, took 1.7 times
    the time of counting positions only. The walks are kept in ``problem.memo``: a memory
    retry (less memory for the same problem) reads its stretches off them (gnmt_baechi at
    90% of its peak on 4 PCIe devices, named: 0.3 s instead of 3.4 s with a walk per retry
    and start, before units were taken whole).

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
    graph, units, budget = problem.graph, problem.units, problem.budget
    order = graph.topo
    n = len(order)
    walks = problem.memo.get(MEMO_KEY)
    if not isinstance(walks, _Walks) or walks.graph is not graph or walks.units is not units \
            or walks.cost is not problem.cost:
        # built once per graph, units and cost model: a memory retry (other budgets) reuses
        # the walks
        walks = problem.memo[MEMO_KEY] = _Walks(problem)
    first, cut_us, candidates = walks.first, walks.cut_us, walks.candidates
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
            reaches[key] = _reach(problem, walks, d, candidates,
                                  walks.profiles.setdefault(key[1:], {}))
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
    """What :func:`place_cut` computes once per graph, units and cost model, whatever the
    budgets (a memory retry places the same problem with less memory).

    The cut costs and the start positions; the tables of :func:`_reach`: the units'
    persistent bytes and positions, per position its unit, its data inputs as (source unit,
    message id, bytes) (a message id per message key, :meth:`CostModel.transfer_key
    <baechi.costmodel.CostModel.transfer_key>` without its destination: the destination is
    the stretch's device) and the messages it sends, the position of each message's last
    reader, the bytes an op allocates while it runs and holds after it, and the position of
    its last reader, where what it holds is freed; and ``profiles``: per device kind (and
    pin) and start position, the walks made so far (:class:`_Profile`).
    """

    def __init__(self, problem: Problem) -> None:
        graph, units, cost = problem.graph, problem.units, problem.cost
        self.graph, self.units, self.cost = graph, units, cost
        order = graph.topo
        n = len(order)
        position = [0] * n
        first = [n] * len(units)  # each unit's first position
        for p, op in enumerate(order):
            position[op] = p
            first[units.unit_of[op]] = min(first[units.unit_of[op]], p)
        # last[op]: the position of its last data reader (its own when none reads it)
        last = list(position)
        # cut_us[p]: the cost of cutting between positions p - 1 and p. A unit goes where its
        # first op is, so a read crosses the cuts between the first positions of the two
        # units, whichever starts first (a backward op reads from a unit that starts later)
        change = np.zeros(n + 1)
        for op in range(n):
            at = first[units.unit_of[op]]
            later: list[tuple[int, float]] = []  # (first position, transfer) of the readers'
            earlier: list[tuple[int, float]] = []  # units that start after/before op's
            for k in graph.out_edges[op]:
                if graph.edge_control[k]:
                    continue
                dst = graph.edge_dst[k]
                last[op] = max(last[op], position[dst])
                reader = first[units.unit_of[dst]]
                if reader != at:
                    (later if reader > at else earlier).append(
                        (reader, cost.nominal_transfer_us(k)))
            # a cut sends op's dearest transfer that crosses it: a cut at p in (at, b] that
            # of the readers' units starting at or after p, at p in (b, at] before p
            dearest = 0.0
            for (b, transfer_us), (b_next, _) in itertools.pairwise(
                    [*sorted(later, reverse=True), (at, 0.0)]):
                dearest = max(dearest, transfer_us)
                change[b_next + 1] += dearest
                change[b + 1] -= dearest
            dearest = 0.0
            for (b, transfer_us), (b_next, _) in itertools.pairwise(
                    [*sorted(earlier), (at, 0.0)]):
                dearest = max(dearest, transfer_us)
                change[b + 1] += dearest
                change[b_next + 1] -= dearest
        self.cut_us = np.cumsum(change)[:n]
        self.cut_us[0] = 0.0
        if n <= 2 * CUT_STARTS:
            self.candidates = list(range(n))
        else:  # the cheapest cuts, and evenly spaced ones so that some split fits
            cheapest = np.argsort(self.cut_us[1:], kind="stable")[:CUT_STARTS] + 1
            spaced = np.linspace(0, n - 1, CUT_STARTS + 1).astype(int)
            self.candidates = sorted({0, *cheapest.tolist(), *spaced.tolist()})
        self.first = first
        self.unit_persistent = persistent_bytes_by(graph, units.unit_of, len(units))
        self.unit_of = [units.unit_of[op] for op in order]  # by position
        message_ids: dict[tuple[Any, ...], int] = {}
        self.inputs: list[list[tuple[int, int, int]]] = []
        self.last_of_message: list[int] = []
        self.sent: list[list[int]] = [[] for _ in range(n)]  # by position, its messages
        for op in order:
            inputs = []
            for k in graph.in_edges[op]:
                if graph.edge_control[k]:
                    continue
                src = graph.edge_src[k]
                key = cost.transfer_key(k, 0)
                if key not in message_ids:
                    message_ids[key] = len(message_ids)
                    self.last_of_message.append(last[src])
                    self.sent[position[src]].append(message_ids[key])
                inputs.append((units.unit_of[src], message_ids[key], graph.edge_bytes[k]))
            self.inputs.append(inputs)
        self.positions: list[list[int]] = [[] for _ in range(len(units))]  # by unit, ascending
        for p, op in enumerate(order):
            self.positions[units.unit_of[op]].append(p)
        self.own_bytes = [graph.temp_bytes[op] + graph.output_bytes[op] for op in order]
        self.held_bytes = [graph.output_bytes[op] if last[op] > p else 0
                           for p, op in enumerate(order)]
        self.releases = [last[op] for op in order]  # where each held output is freed
        self.profiles: dict[tuple[str, int], dict[int, _Profile]] = {}


class _Profile(NamedTuple):
    """One walk from a start position ``i``: what the stretch needs with each position
    (``needs[k]``: the bytes of the stretch ``i..i+k``, non-decreasing), where the walk
    stopped, and what the stretch would need with the op there (``None`` when memory did
    not stop it: a unit that cannot run on the device, or the end of the order). For any
    limit, the stretch ends at the first position it needs more than that: a walk serves
    every smaller limit too."""

    needs: np.ndarray
    stop: int
    stop_need: float | None


def _reach(problem: Problem, walks: _Walks, d: int, starts: list[int],
           profiles: dict[int, _Profile]) -> tuple[list[int], list[float]]:
    """Per start position ``i``, the end ``j`` of the longest stretch ``i..j-1`` of the
    canonical order that fits device ``d`` on its own, with every op of the units that start
    in it, and the bytes the stretch would go over with the unit that starts at ``j`` (0
    when it ends for another reason): for the positions of ``starts`` and those where
    m-fill's stretches start (``i`` for the others, and where not even the unit at ``i``
    fits). Ops of units that start before ``i`` or are pinned elsewhere are not the
    stretch's: they go to their unit's device; what they send is received like any copy.
    ``profiles``: the walks made on devices of ``d``'s kind (and pin) so far, by start
    position; a walk is made again only for a higher limit than its own that memory
    stopped.
    """
    units = problem.units
    n = len(problem.graph)
    first = walks.first
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
    unit_persistent, unit_of, positions = walks.unit_persistent, walks.unit_of, walks.positions
    inputs, sent, last_of_message = walks.inputs, walks.sent, walks.last_of_message
    own_bytes, held_bytes, releases = walks.own_bytes, walks.held_bytes, walks.releases
    # per position, the first position of its unit, -1 for a unit pinned elsewhere (that
    # op is never the stretch's: ``first < i`` then holds for every start ``i``)
    first_at = [-1 if pinned_away[u] else first[u] for u in unit_of]
    taken = [False] * len(units)  # the units of the walk's stretch, reset after each walk

    def walk(i: int) -> _Profile:
        """The stretch from ``i`` until it needs more than ``limit``: each unit that starts
        in it with all its ops, later ones included (a forward op's backward op)."""
        held = np.zeros(n)  # per position, the bytes on the device while its op would run
        peak = 0.0
        persistent = 0
        needs: list[float] = []  # persistent + peak with each position
        copies: dict[int, tuple[int, int]] = {}  # message id -> (first reader, bytes)
        members: list[int] = []
        later: list[int] = []  # heap: positions after j of the taken units' ops
        try:
            for j in range(i, n):
                if first_at[j] != j:
                    # an op of a unit taken before, or not the stretch's (its unit starts
                    # before i or is pinned elsewhere)
                    needs.append(persistent + peak)
                    continue
                unit = unit_of[j]
                if not allowed[unit]:
                    return _Profile(np.array(needs), j, None)
                taken[unit] = True
                members.append(unit)
                persistent += unit_persistent[unit]
                # every change is at j or after it: what is held before j is final
                for q in positions[unit]:
                    held[q] += own_bytes[q]
                    if held_bytes[q]:
                        held[q + 1:releases[q] + 1] += held_bytes[q]
                    for message in sent[q]:  # its output, no longer a copy where it is read
                        copy = copies.pop(message, None)
                        if copy is not None:
                            held[copy[0]:last_of_message[message] + 1] -= copy[1]
                    for src_unit, message, nbytes in inputs[q]:
                        if taken[src_unit]:
                            continue
                        # a copy arrives for its first reader and leaves once every reader
                        # of its producer's output ran
                        copy = copies.get(message)
                        if copy is None:
                            copies[message] = (q, nbytes)
                            held[q:last_of_message[message] + 1] += nbytes
                        elif q < copy[0]:
                            copies[message] = (q, copy[1])
                            held[q:copy[0]] += copy[1]
                    if q > j:
                        heapq.heappush(later, q)
                while later and later[0] <= j:
                    heapq.heappop(later)
                # the most held is where an op of the device runs (between two, only frees)
                peak = max(peak, float(held[j]), float(held[later].max()) if later else 0.0)
                if persistent + peak > limit:
                    return _Profile(np.array(needs), j, persistent + peak)
                needs.append(persistent + peak)
            return _Profile(np.array(needs), n, None)
        finally:
            for unit in members:
                taken[unit] = False

    reach = list(range(n))
    short = [0.0] * n
    done: set[int] = set()

    def reach_from(i: int) -> None:
        if time.perf_counter() > problem.deadline:
            raise InfeasiblePlacement(
                f"m-cut: the request's time limit passed after {len(done)} of "
                f"{len(starts)} start positions", {"deadline_reached": True})
        done.add(i)
        profile = profiles.get(i)
        if profile is None or (profile.stop_need is not None and profile.stop_need <= limit):
            profile = profiles[i] = walk(i)
        # the first position the stretch needs more than the limit at, if it walked there
        k = int(np.searchsorted(profile.needs, limit, side="right"))
        if k < len(profile.needs):
            reach[i], short[i] = i + k, float(profile.needs[k] - limit)
        else:
            reach[i] = profile.stop
            short[i] = 0.0 if profile.stop_need is None else float(profile.stop_need - limit)

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
