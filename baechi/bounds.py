"""Lower bounds: the memory any plan needs (to explain infeasibility up front), and the step
time any plan needs once memory forces ops apart."""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from typing import Any, Literal, NamedTuple

from ortools.sat.python import cp_model

from baechi.cluster import Cluster
from baechi.costmodel import CostModel
from baechi.graph import Graph
from baechi.grouping import Units
from baechi.memory import persistent_bytes_by
from baechi.simulate import Simulation

#: The relative rounding of one float addition (half an ulp of 1.0): a step time and a bound
#: are sums of at most one term per op and per transfer, each addition rounding by at most this.
UNIT_ROUNDOFF = 2.0**-53


def unit_floor(graph: Graph, units: Units, unit: int, cost: CostModel) -> tuple[int, int]:
    """(bytes, op): what the unit's device must hold at least, and the op where it peaks.

    Every member's persistent bytes are resident all step, plus the running bytes of the
    member that needs most (:attr:`CostModel.op_running_bytes
    <baechi.costmodel.CostModel.op_running_bytes>`).
    """
    members = units.members[unit]
    persistent = sum(graph.persistent_bytes[op] for op in members)
    running = cost.op_running_bytes
    worst = max(members, key=running.__getitem__)
    return persistent + running[worst], worst


#: How long :func:`pack_units` lets CP-SAT look for a packing (or prove there is none) after
#: first-fit decreasing failed, in seconds; a request gives it at most a tenth of its time
#: limit. Measured: bert_l-6_inference_operator at 30% of its peak on 4 devices (227 units)
#: is proved impossible in 0.05 s; on inceptionv3_inference_layer, 12 devices of 2 GiB
#: (326 units), CP-SAT needs 1.6-4 s to find a packing, so no proof is missed there by
#: stopping at 1 s.
PACKING_TIME_LIMIT_S = 1.0


#: :func:`pack_units` bisects the bytes missing until the packing found and the proof are
#: within this relative distance: the steps near the threshold are the slow ones
#: (bert_l-6_inference_operator at 30%: 1.28 MB missing per device, proofs 0.045 s each
#: far from it, up to 2.8 s within 0.1% of it).
MISSING_PRECISION = 0.1


class Packing(NamedTuple):
    """The outcome of :func:`pack_units`: ``"packed"`` with a device per unit, ``"impossible"``
    (proved: no plan fits memory; every device with a limit would need at least
    ``missing_bytes`` more for a packing to exist), or ``"unknown"`` (the time limit came
    first)."""

    status: Literal["packed", "impossible", "unknown"]
    unit_device: list[int] | None = None
    missing_bytes: int = 0


def pack_units(
    graph: Graph, cluster: Cluster, units: Units, cost: CostModel,
    time_limit_s: float = PACKING_TIME_LIMIT_S,
) -> Packing:
    """A device per unit such that, on every device, its units' persistent bytes plus the
    largest :func:`~baechi.costmodel.running_bytes` of an op placed there fit its memory.

    Every plan within memory is such a packing (persistent bytes are resident all step, and
    each op's running bytes are there while it runs), so when none exists no plan fits,
    whatever the algorithm: a proof of infeasibility that the checks of single units
    (:func:`unit_floor`) and of the total miss, where the weights fit the cluster in sum but
    not in any split. First-fit decreasing (by persistent plus running bytes, each unit onto
    the device it leaves the most room on); when it fails, CP-SAT for at most
    ``time_limit_s`` (interchangeable devices' symmetry broken: same memory and kind, no
    pins). When CP-SAT proves there is none, a bisection over extra memory on every limited
    device, each step a CP-SAT proof or packing, gives how much is missing at least (within
    :data:`MISSING_PRECISION` when it ends within the time).

    Examples
    --------
    Three 70-byte weights fit 2 devices of 130 bytes in sum (210 of 260) but not in a split:
    one device holds two of them, 10 bytes over.

    >>> from baechi import Cluster, load_graph
    >>> from baechi.costmodel import CostModel
    >>> from baechi.grouping import colocation_units
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
    ...     {"name": n, "compute_us": 1, "persistent_bytes": 70} for n in "abc"]})
    >>> c = Cluster.parse({"devices": {"count": 2, "memory_bytes": 130}})
    >>> pack_units(g, c, colocation_units(g, c), CostModel(g, c))
    Packing(status='impossible', unit_device=None, missing_bytes=10)
    >>> c = Cluster.parse({"devices": {"count": 3, "memory_bytes": 130}})
    >>> pack_units(g, c, colocation_units(g, c), CostModel(g, c))
    Packing(status='packed', unit_device=[0, 1, 2], missing_bytes=0)
    """
    end = time.perf_counter() + time_limit_s
    limits = [math.inf if d.memory_bytes is None else d.memory_bytes for d in cluster.devices]
    held = persistent_bytes_by(graph, units.unit_of, len(units))
    running = cost.op_running_bytes
    need = [max(running[op] for op in members) for members in units.members]
    allowed = cost.unit_devices(units)
    if not all(allowed):
        return Packing("impossible")  # CostModel.check_runnable names the op
    order = sorted(range(len(units)), key=lambda u: -(held[u] + need[u]))
    unit_device, over = _first_fit(held, need, allowed, order, limits)
    if over <= 0:
        return Packing("packed", unit_device)
    problem = (cluster, units, held, need, allowed, order, limits)
    packed = _pack_exactly(*problem, 0, end)
    if packed is not False:
        return Packing("unknown") if packed is None else Packing("packed", packed)
    lo, hi = 1, math.ceil(over)  # proved short by lo - 1; first-fit fits with hi more
    while hi - lo > lo * MISSING_PRECISION and time.perf_counter() < end:
        mid = (lo + hi) // 2
        packed = _pack_exactly(*problem, mid, end)
        if packed is None:
            break
        if packed is False:
            lo = mid + 1
        else:
            hi = mid
    return Packing("impossible", missing_bytes=lo)


def _first_fit(held: list[int], need: list[int], allowed: list[list[int]], order: list[int],
               limits: list[float]) -> tuple[list[int], float]:
    """First-fit decreasing, each unit onto the allowed device it leaves the most room on,
    even when that is none: the packing and the most it puts over a limit (≤ 0: it fits)."""
    load, peak = [0] * len(limits), [0] * len(limits)
    unit_device = [-1] * len(held)
    over = -math.inf
    for u in order:
        best, d = -math.inf, allowed[u][0]
        for candidate in allowed[u]:
            room = limits[candidate] - load[candidate] - held[u] - max(peak[candidate], need[u])
            if room > best:
                best, d = room, candidate
        unit_device[u] = d
        load[d] += held[u]
        peak[d] = max(peak[d], need[u])
        over = max(over, -best)
    return unit_device, over


def _pack_exactly(
    cluster: Cluster, units: Units, held: list[int], need: list[int], allowed: list[list[int]],
    order: list[int], limits: list[float], extra: int, end: float,
) -> list[int] | bool | None:
    """:func:`pack_units` on CP-SAT with ``extra`` bytes on every limited device, until
    ``end`` (a :func:`time.perf_counter` value): a packing, ``False`` when proved impossible,
    ``None`` when the time ran out first."""
    model = cp_model.CpModel()
    on = [{d: model.new_bool_var(f"u{u}d{d}") for d in allowed[u]} for u in range(len(units))]
    for choices in on:
        model.add_exactly_one(choices.values())
    for d, limit in enumerate(limits):
        if math.isinf(limit):
            continue
        placed = [u for u in range(len(units)) if d in on[u]]
        peak = model.new_int_var(0, int(limit) + extra, f"peak{d}")
        for u in placed:
            if need[u] > 0:
                model.add(peak >= need[u]).only_enforce_if(on[u][d])
        model.add(sum(held[u] * on[u][d] for u in placed if held[u]) + peak
                  <= int(limit) + extra)
    # interchangeable devices: the i-th largest unit that may use them takes one of the first
    # i + 1 (relabel the devices by the largest unit each holds)
    pinned = {pin for pin in units.pin if pin >= 0}
    classes: dict[tuple[float, str], list[int]] = {}
    for d, device in enumerate(cluster.devices):
        if d not in pinned:
            classes.setdefault((limits[d], device.kind), []).append(d)
    for same in classes.values():
        free = [u for u in order if units.pin[u] < 0 and same[0] in on[u]]
        for i, u in enumerate(free[:len(same) - 1]):
            for d in same[i + 1:]:
                model.add(on[u][d] == 0)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, end - time.perf_counter())
    solver.parameters.num_workers = 1
    status = solver.solve(model)
    if status == cp_model.INFEASIBLE:
        return False
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return [next(d for d, var in on[u].items() if solver.value(var)) for u in range(len(units))]


def step_bound_us(graph: Graph, cluster: Cluster, units: Units, cost: CostModel) -> float:
    """A lower bound of every plan's step time that counts the transfers placement forces.

    A stretch of a chain of ops cannot run on one device when its units' persistent bytes
    plus, while one of its ops runs, the op's running bytes
    (:func:`~baechi.costmodel.running_bytes`) and the outputs of earlier ops of the stretch
    that later ones read (a residual block's skip tensor, held on the device until its reader
    ends) exceed the largest device, or when it holds two different pins: one of its edges
    then crosses devices, and a crossing edge delays its consumer by at least the edge's
    fastest transfer
    (:meth:`CostModel.fastest_transfer_us <baechi.costmodel.CostModel.fastest_transfer_us>`;
    channels can only add to it). So the chain takes at least its compute (each op at its
    fastest) plus the cheapest set of its edges that splits every such stretch (an interval
    cover, solved exactly in linear time). The bound is the largest of the format's
    (:meth:`CostModel.lower_bound_us <baechi.costmodel.CostModel.lower_bound_us>`) and this
    over two chains: the longest with each edge whose ends cannot share a device costed, and
    the longest by compute alone. O((ops + edges) log ops).

    Examples
    --------
    ``a`` and ``c`` (60 bytes each, resident all step) cannot share a 100-byte device, so
    ``a → b`` or ``b → c`` crosses; the cheaper costs 1.1 µs (1 µs latency, 1000 bytes per µs).

    >>> from baechi import Cluster, load_graph
    >>> from baechi.costmodel import CostModel
    >>> from baechi.grouping import colocation_units
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
    ...     {"name": "a", "compute_us": 10, "persistent_bytes": 60},
    ...     {"name": "b", "compute_us": 10},
    ...     {"name": "c", "compute_us": 10, "persistent_bytes": 60}],
    ...     "edges": [{"src": "a", "dst": "b", "bytes": 1000},
    ...               {"src": "b", "dst": "c", "bytes": 100}]})
    >>> c = Cluster.parse({"devices": {"count": 2, "memory_bytes": 100},
    ...                    "network": {"latency_us": 1, "bandwidth_gbps": 1}})
    >>> cost = CostModel(g, c)
    >>> cost.lower_bound_us(), round(step_bound_us(g, c, colocation_units(g, c), cost), 6)
    (30.0, 31.1)
    """
    floor = cost.lower_bound_us()
    limits = [d.memory_bytes for d in cluster.devices]
    pinned = {pin for pin in units.pin if pin >= 0}
    if len(limits) < 2 or (None in limits and len(pinned) < 2):
        return floor  # nothing forces ops apart
    capacity = math.inf if None in limits else float(max(limits))  # type: ignore[type-var]
    unit_persistent = persistent_bytes_by(graph, units.unit_of, len(units))
    running = cost.op_running_bytes

    def apart(k: int) -> bool:  # whether edge k's ends cannot share a device
        return _cover_us(graph, cost, [graph.edge_src[k], graph.edge_dst[k]], unit_persistent,
                         running, units, capacity) > 0

    forced = [cost.fastest_transfer_us(k) if apart(k) else 0.0 for k in range(graph.num_edges)]
    best = floor
    for edge_us in (forced, [0.0] * graph.num_edges):
        chain = _longest_chain(graph, cost.fastest_us, edge_us)
        cut_us = _cover_us(graph, cost, chain, unit_persistent, running, units, capacity)
        best = max(best, math.fsum(cost.fastest_us[op] for op in chain) + cut_us)
    return best


def _longest_chain(graph: Graph, op_us: list[float], edge_us: list[float]) -> list[int]:
    """The ops of a longest chain, each op taking ``op_us[op]`` and each edge ``edge_us[k]``."""
    finish = [0.0] * len(graph)
    before = [-1] * len(graph)
    for op in graph.topo:
        start = 0.0
        for k in graph.in_edges[op]:
            arrival = finish[graph.edge_src[k]] + edge_us[k]
            if arrival > start:
                start, before[op] = arrival, graph.edge_src[k]
        finish[op] = start + op_us[op]
    op = max(range(len(graph)), key=finish.__getitem__, default=-1)
    chain = []
    while op >= 0:
        chain.append(op)
        op = before[op]
    return chain[::-1]


def _cover_us(graph: Graph, cost: CostModel, chain: list[int], unit_persistent: list[int],
              running: list[int], units: Units, capacity: float) -> float:
    """The cheapest set of ``chain``'s edges that splits every stretch of it no one device can
    hold (0 when there is none; ``chain``'s compute not included).

    A stretch ``chain[i..j]`` on one device puts all its units' persistent bytes there, plus,
    while one of its ops runs, that op's running bytes and the output of every earlier op of
    the stretch that a later op of it reads (held on the device until that reader ends, which
    is after the running op ends; counted only while an op that takes time runs, so never at
    an instant where the reader ends too). If that exceeds ``capacity``, or the stretch holds
    two different pins, one of its edges crosses.
    """
    # last_split[j]: the largest i whose stretch i..j must be split (-1: none). Stretches
    # only grow harder to hold as they lengthen, so one left pointer serves every j.
    last_split = [-1] * len(chain)
    held: dict[int, int] = {}  # units of the stretch -> their ops in it
    pins: dict[int, int] = {}  # pins of the stretch -> their ops in it
    peak: deque[int] = deque()  # stretch positions, running bytes decreasing
    persistent = 0
    left = 0
    # while each op that takes time runs: its running bytes plus the outputs held through it
    # (a stretch of two ops holds nothing through an op: an edge's ends, for ``apart``)
    through = _MaxTree([-math.inf if cost.instant_somewhere(op) else float(running[op])
                        for op in chain]) if len(chain) > 2 else None
    position = {op: i for i, op in enumerate(chain)} if through is not None else {}
    read_at: list[list[int]] = [[] for _ in position]  # per producer, its readers' positions

    def enter(op: int, sign: int) -> None:
        nonlocal persistent
        unit = units.unit_of[op]
        held[unit] = held.get(unit, 0) + sign
        if held[unit] == (1 if sign > 0 else 0):
            persistent += sign * unit_persistent[unit]
        pin = units.pin[unit]
        if pin >= 0:
            pins[pin] = pins.get(pin, 0) + sign
            if not pins[pin]:
                del pins[pin]

    def hold(a: int, readers: list[int], sign: int) -> None:
        """Count chain[a]'s output (``sign`` 1) or stop counting it (-1) at the positions
        between ``readers`` (consecutive ones, from ``a`` on) that do not read it."""
        assert through is not None
        nbytes = sign * graph.output_bytes[chain[a]]
        for lo, hi in itertools.pairwise(readers):
            if hi - lo > 1 and nbytes:
                through.add(lo + 1, hi, nbytes)

    def too_much() -> bool:
        most = float(running[chain[peak[0]]])
        if through is not None:
            most = max(most, through.max(left, j + 1))
        return len(pins) > 1 or persistent + most > capacity

    for j, op in enumerate(chain):
        enter(op, 1)
        while peak and running[chain[peak[-1]]] <= running[op]:
            peak.pop()
        peak.append(j)
        if through is not None:
            for a in {position[graph.edge_src[k]] for k in graph.in_edges[op]
                      if not graph.edge_control[k] and graph.edge_src[k] in position}:
                if a >= left:  # held from its last reader so far (or itself) to this one
                    hold(a, [read_at[a][-1] if read_at[a] else a, j], 1)
                read_at[a].append(j)
        while left < j and too_much():
            enter(chain[left], -1)
            if through is not None:
                hold(left, [left, *read_at[left]], -1)
            left += 1
            if peak[0] < left:
                peak.popleft()
        last_split[j] = left - 1
    if max(last_split, default=-1) < 0:
        return 0.0
    # cut c is the edge chain[c] -> chain[c + 1]: its consumer waits for the slowest message
    cut_us = []
    for c in range(len(chain) - 1):
        src, dst = chain[c], chain[c + 1]
        a, b = units.unit_of[src], units.unit_of[dst]
        together = a == b or (units.pin[a] >= 0 and units.pin[a] == units.pin[b])
        cut_us.append(math.inf if together else max(
            cost.fastest_transfer_us(k) for k in graph.in_edges[dst] if graph.edge_src[k] == src))
    # covered[c]: the cheapest cuts ending with cut c that split every stretch ending by op c;
    # stretch i..j needs a cut in [i, j - 1], so the cut before c must be at or after
    # ``low``, the largest i of the stretches with j <= c (a window whose ends only grow)
    covered = [math.inf] * len(cut_us)
    window: deque[int] = deque()  # cuts in the window, their ``covered`` increasing
    low = -1
    for c in range(len(cut_us)):
        low = max(low, last_split[c])
        while window and window[0] < low:
            window.popleft()
        before = 0.0 if low < 0 else (covered[window[0]] if window else math.inf)
        covered[c] = cut_us[c] + before
        while window and covered[window[-1]] >= covered[c]:
            window.pop()
        window.append(c)
    low = max(low, last_split[-1])
    best = min(covered[low:], default=math.inf)
    return 0.0 if math.isinf(best) else best


class _MaxTree:
    """Range add and range maximum over a fixed list of numbers (a segment tree, each
    operation O(log n))."""

    def __init__(self, values: list[float]) -> None:
        n = self.n = len(values)
        self.height = n.bit_length()
        self.top = [-math.inf] * n + list(values)  # node i: max of its range, adds included
        self.pending = [0.0] * n  # add not yet passed to node i's children
        for i in range(n - 1, 0, -1):
            self.top[i] = max(self.top[2 * i], self.top[2 * i + 1])

    def _apply(self, i: int, value: float) -> None:
        self.top[i] += value
        if i < self.n:
            self.pending[i] += value

    def _rebuild(self, i: int) -> None:
        while i > 1:
            i >>= 1
            self.top[i] = max(self.top[2 * i], self.top[2 * i + 1]) + self.pending[i]

    def _push(self, i: int) -> None:
        for s in range(self.height, 0, -1):
            node = i >> s
            if node and self.pending[node]:
                self._apply(2 * node, self.pending[node])
                self._apply(2 * node + 1, self.pending[node])
                self.pending[node] = 0.0

    def add(self, lo: int, hi: int, value: float) -> None:
        """Add ``value`` to positions ``lo`` to ``hi - 1``."""
        lo += self.n
        hi += self.n
        first, last = lo, hi - 1
        self._push(first)
        self._push(last)
        while lo < hi:
            if lo & 1:
                self._apply(lo, value)
                lo += 1
            if hi & 1:
                hi -= 1
                self._apply(hi, value)
            lo >>= 1
            hi >>= 1
        self._rebuild(first)
        self._rebuild(last)

    def max(self, lo: int, hi: int) -> float:
        """The largest value at positions ``lo`` to ``hi - 1``.

        >>> tree = _MaxTree([1.0, 5.0, 2.0, -math.inf])
        >>> tree.add(2, 4, 4.0)
        >>> tree.max(0, 4), tree.max(2, 4), tree.max(3, 4)
        (6.0, 6.0, -inf)
        """
        lo += self.n
        hi += self.n
        self._push(lo)
        self._push(hi - 1)
        best = -math.inf
        while lo < hi:
            if lo & 1:
                best = max(best, self.top[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                best = max(best, self.top[hi])
            lo >>= 1
            hi >>= 1
        return best


def meets_bound(simulation: Simulation | None, bound_us: float) -> bool:
    """Whether ``simulation``'s plan is proven optimal: its step time meets a lower bound of
    every plan's, up to the rounding of the two float sums (:data:`UNIT_ROUNDOFF` per term).

    A fixed relative slack would also call optimal a plan slower than the optimum by less
    than it: with 1e-9, a 60.00000006 µs plan (an op of 6e-8 µs on the device of a 60 µs
    group) met the bound of 60 µs, so ``auto`` stopped before m-ETF unreduced's 60 µs.
    """
    assert simulation is not None
    terms = len(simulation.device_of) + len(simulation.transfers) + 1
    return simulation.estimate.step_time_us <= bound_us * (1 + 2 * terms * UNIT_ROUNDOFF)


#: The solver's own figures, which describe the plan it returned and no other.
SOLVER_FIELDS = ("solver_status", "solve_seconds", "model_step_us", "model_exact",
                 "channels_modelled", "scale", "optimal_note")


def settle_claims(stats: dict[str, Any], simulation: Simulation, own_plan: bool) -> None:
    """Make ``stats``' claims (``optimal``, ``bound_us``) describe ``simulation``, the plan
    returned, in place.

    ``own_plan`` says whether it is the plan the algorithm that filled ``stats`` returned;
    when a later pass replaced it (transfer order, single device, local search), the
    solver's own figures go. ``optimal`` is true exactly when the plan's replay meets
    ``bound_us``; a "bound" above the plan's own replay proves nothing (a model stricter than
    the simulator) and is dropped with a note, as is any claim without a bound.

    Examples
    --------
    >>> from baechi import Cluster, load_graph
    >>> from baechi.simulate import replay
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [{"name": "a", "compute_us": 5}]})
    >>> run = replay(g, Cluster.uniform(1), [0], [[0]])
    >>> stats = {"optimal": False, "bound_us": 5.0, "solver_status": "FEASIBLE"}
    >>> settle_claims(stats, run, own_plan=False); stats
    {'optimal': True, 'bound_us': 5.0}
    >>> stats = {"optimal": True, "bound_us": 6.0}
    >>> settle_claims(stats, run, own_plan=True); stats["optimal"], stats["bound_us"]
    (False, None)
    """
    if not own_plan:
        for key in SOLVER_FIELDS:
            stats.pop(key, None)
    bound = stats.get("bound_us")
    if bound is None:
        if stats.get("optimal"):
            stats["optimal"] = False
            stats["optimal_note"] = "no bound was proved for the plan returned"
        return
    step = simulation.estimate.step_time_us
    terms = len(simulation.device_of) + len(simulation.transfers) + 1
    if bound > step * (1 + 2 * terms * UNIT_ROUNDOFF):
        stats["bound_us"] = None
        stats["optimal"] = False
        stats["optimal_note"] = (f"the solver's bound ({bound:g} us) is above this plan's "
                                 "replay: its model was stricter than the simulator, so "
                                 "nothing is proved")
        return
    stats["optimal"] = meets_bound(simulation, bound)
