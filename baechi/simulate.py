"""The cost model (DESIGN §4): replay a placement and per-device order, exactly.

:func:`replay` is the judge of every plan. It works on the indexed form (device index per op,
op indices per device); :func:`simulate` and :func:`simulate_plan` take a
:class:`~baechi.plan.Plan` with op and device names and check it first (every op placed once,
orders consistent with the graph, colocation groups, forward pairs and pins respected).
:func:`single_device_run` is the one-device baseline (the cost model caches it per request:
:meth:`~baechi.costmodel.CostModel.single_device_run`); the lower bound is
:meth:`~baechi.costmodel.CostModel.lower_bound_us`. Those are the entry points; the rest is
private.

Decisions where DESIGN §4 leaves room (also in ARCHITECTURE.md):

- Completion events are processed in the order (end, start, device index, position in the
  device's order); a transfer is booked on the channels when its producer's completion is
  processed, edges in file order. An op starts as soon as its inputs' arrival times are known.
- Forward pairing (a backward op on its ``forward_op``'s device) is required only when the
  plan's ``options.forward_only`` is true (the default); colocation groups and pins always.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from baechi.cluster import Cluster
from baechi.costmodel import CostModel
from baechi.errors import InvalidPlan
from baechi.graph import Graph, find_cycle, load_graph
from baechi.plan import Estimate, Plan


@dataclass
class Transfers:
    """Every message sent between devices, in booking order (parallel lists)."""

    src_op: list[int] = field(default_factory=list)
    src_device: list[int] = field(default_factory=list)
    dst_device: list[int] = field(default_factory=list)
    start: list[float] = field(default_factory=list)
    end: list[float] = field(default_factory=list)
    nbytes: list[int] = field(default_factory=list)
    control: list[bool] = field(default_factory=list)
    tensor: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.src_op)


@dataclass
class MemoryTrace:
    """Memory in use on one device: ``bytes[i]`` from ``times[i]`` on.

    Each instant appears twice: the level after its allocations (the instant's peak),
    then after the frees of items allocated and freed at that same instant.
    """

    times: np.ndarray
    bytes: np.ndarray
    peak: int


@dataclass
class Simulation:
    """The full result of a replay: per-op times, transfers, memory, and the estimate."""

    estimate: Estimate
    device_of: list[int]
    orders: list[list[int]]
    start: list[float]
    end: list[float]
    transfers: Transfers
    memory: list[MemoryTrace]


def _timing(
    cost: CostModel, device_of: list[int], orders: list[list[int]]
) -> tuple[list[float], list[float], Transfers, list[float], dict[tuple[Any, ...], int]]:
    """Event-driven execution; returns start, end, transfers, edge arrivals, transfer per key."""
    graph = cost.graph
    n = len(graph)
    devices = cost.cluster.devices
    op_us = cost.op_us
    sequential = cost.sequential
    in_edges, out_edges = graph.in_edges, graph.out_edges
    edge_dst = graph.edge_dst
    edge_tensor, edge_control = graph.edge_tensor, graph.edge_control

    start = [0.0] * n
    end = [0.0] * n
    arrival = [0.0] * graph.num_edges
    waiting = [len(ins) for ins in in_edges]
    position = [0] * len(devices)
    device_free = [0.0] * len(devices)
    channel_free = [0.0] * len(devices)
    transfers = Transfers()
    sent: dict[tuple[Any, ...], int] = {}
    events: list[tuple[float, float, int, int, int]] = []

    def start_ready(d: int) -> None:
        order = orders[d]
        while position[d] < len(order):
            op = order[position[d]]
            if waiting[op]:
                return
            s = device_free[d]
            for k in in_edges[op]:
                if arrival[k] > s:
                    s = arrival[k]
            e = s + op_us[d][op]
            start[op] = s
            end[op] = e
            device_free[d] = e
            heapq.heappush(events, (e, s, d, position[d], op))
            position[d] += 1

    for d in range(len(devices)):
        start_ready(d)
    while events:
        t, _, d, _, op = heapq.heappop(events)
        for k in out_edges[op]:
            dst = edge_dst[k]
            dd = device_of[dst]
            if dd == d:
                arrival[k] = t
            else:
                control = edge_control[k]
                key = cost.transfer_key(k, dd)
                index = sent.get(key)
                if index is None:
                    nbytes = cost.message_bytes(k)
                    duration = cost.transfer_us(k, d, dd)
                    s = t
                    if sequential:
                        s = max(t, channel_free[d], channel_free[dd])
                        channel_free[d] = channel_free[dd] = s + duration
                    index = sent[key] = len(transfers)
                    transfers.src_op.append(op)
                    transfers.src_device.append(d)
                    transfers.dst_device.append(dd)
                    transfers.start.append(s)
                    transfers.end.append(s + duration)
                    transfers.nbytes.append(nbytes)
                    transfers.control.append(control)
                    transfers.tensor.append("" if control else edge_tensor[k])
                arrival[k] = transfers.end[index]
            waiting[dst] -= 1
            if not waiting[dst]:
                start_ready(dd)
    stuck = [d for d in range(len(devices)) if position[d] < len(orders[d])]
    if stuck:  # only reachable when the caller skipped check_plan
        raise InvalidPlan(f"the order of device {devices[stuck[0]].name!r} deadlocks")
    return start, end, transfers, arrival, sent


def _peak(alloc: np.ndarray, free: np.ndarray, nbytes: np.ndarray, base: int) -> MemoryTrace:
    """Peak and curve of items held over [alloc, free]; frees before allocs at an instant."""
    keep = nbytes > 0
    alloc, free, nbytes = alloc[keep], free[keep], nbytes[keep]
    if not len(nbytes):
        return MemoryTrace(np.zeros(1), np.array([base], dtype=np.int64), base)
    # phase 0: frees of items allocated earlier; 1: allocations; 2: frees at the same instant
    times = np.concatenate([free, alloc])
    phase = np.concatenate([np.where(free > alloc, 0, 2), np.ones(len(alloc), dtype=np.int64)])
    delta = np.concatenate([-nbytes, nbytes])
    order = np.lexsort((phase, times))
    level = base + np.cumsum(delta[order])
    return MemoryTrace(times[order], level, int(max(base, level.max())))


def _memory(
    cost: CostModel,
    device_of: list[int],
    start: list[float],
    end: list[float],
    transfers: Transfers,
    arrival: list[float],
    sent: dict[tuple[Any, ...], int],
) -> list[MemoryTrace]:
    graph = cost.graph
    n_dev = len(cost.cluster.devices)
    ops_on: list[list[int]] = [[] for _ in range(n_dev)]
    for op, d in enumerate(device_of):
        ops_on[d].append(op)
    # outputs are freed after the last same-device data consumer and the last transfer arrival
    output_free = list(end)
    copy_free = [t for t in transfers.start]
    for k, (src, dst) in enumerate(zip(graph.edge_src, graph.edge_dst, strict=True)):
        if graph.edge_control[k]:
            continue
        d = device_of[src]
        if device_of[dst] == d:
            if end[dst] > output_free[src]:
                output_free[src] = end[dst]
        else:
            if arrival[k] > output_free[src]:
                output_free[src] = arrival[k]
            index = sent[cost.transfer_key(k, device_of[dst])]
            if end[dst] > copy_free[index]:
                copy_free[index] = end[dst]
    copies_on: list[list[int]] = [[] for _ in range(n_dev)]
    for index, d in enumerate(transfers.dst_device):
        if not transfers.control[index]:
            copies_on[d].append(index)
    start_a, end_a, out_free_a = np.array(start), np.array(end), np.array(output_free)
    temp_a = np.array(graph.temp_bytes, dtype=np.int64)
    out_a = np.array(graph.output_bytes, dtype=np.int64)
    t_start, t_free = np.array(transfers.start), np.array(copy_free)
    t_bytes = np.array(transfers.nbytes, dtype=np.int64)
    traces = []
    for d in range(n_dev):
        ops = np.array(ops_on[d], dtype=np.int64)
        copies = np.array(copies_on[d], dtype=np.int64)
        base = int(sum(graph.persistent_bytes[op] for op in ops_on[d]))
        alloc = np.concatenate([start_a[ops], start_a[ops], t_start[copies]])
        free = np.concatenate([end_a[ops], out_free_a[ops], t_free[copies]])
        nbytes = np.concatenate([temp_a[ops], out_a[ops], t_bytes[copies]])
        traces.append(_peak(alloc, free, nbytes, base))
    return traces


def _trace(
    graph: Graph, cluster: Cluster, device_of: list[int], orders: list[list[int]],
    cost: CostModel | None = None,
) -> tuple[list[float], list[float], Transfers, list[MemoryTrace]]:
    """Start and end per op, transfers, and memory per device for consistent orders.

    ``cost``: the request's :class:`~baechi.costmodel.CostModel`, built when not given.
    """
    cost = cost or CostModel(graph, cluster)
    start, end, transfers, arrival, sent = _timing(cost, device_of, orders)
    memory = _memory(cost, device_of, start, end, transfers, arrival, sent)
    return start, end, transfers, memory


def replay(
    graph: Graph, cluster: Cluster, device_of: list[int], orders: list[list[int]],
    cost: CostModel | None = None,
) -> Simulation:
    """Simulate ``orders[d]`` (op indices) on each device ``d``; orders must be consistent.

    Use :func:`check_orders` first when the orders come from outside.
    """
    cost = cost or CostModel(graph, cluster)
    start, end, transfers, memory = _trace(graph, cluster, device_of, orders, cost)
    names = [d.name for d in cluster.devices]
    peaks = {name: m.peak for name, m in zip(names, memory, strict=True)}
    memory_ok = all(
        dev.memory_bytes is None or m.peak <= dev.memory_bytes
        for dev, m in zip(cluster.devices, memory, strict=True)
    )
    single_us, single_fits = _single_device(graph, cluster, cost)
    if single_us == math.inf:  # no device can run every op
        single_fits = False
    estimate = Estimate(
        step_time_us=max(end, default=0.0),
        lower_bound_us=cost.lower_bound_us(),
        single_device_us=single_us,
        single_device_fits=single_fits,
        peak_memory_bytes=peaks,
        transfer_bytes=int(sum(transfers.nbytes)),
        transfers=len(transfers),
        memory_ok=memory_ok,
    )
    return Simulation(estimate, device_of, orders, start, end, transfers, memory)


def single_device_run(
    graph: Graph, cluster: Cluster, device: int | None = None, cost: CostModel | None = None
) -> tuple[float, int]:
    """Step time and peak memory of the canonical order on one device (the fastest)."""
    d = cluster.fastest() if device is None else device
    orders: list[list[int]] = [[] for _ in cluster.devices]
    orders[d] = graph.topo
    _, end, _, memory = _trace(graph, cluster, [d] * len(graph), orders, cost)
    return max(end, default=0.0), memory[d].peak


def _single_device(
    graph: Graph, cluster: Cluster, cost: CostModel | None = None
) -> tuple[float, bool]:
    """Step time of the canonical order on the fastest device, and whether it fits there.

    With ``cost``, the run is computed once per cost model (:meth:`CostModel.single_device_run`).
    """
    cost = cost or CostModel(graph, cluster)
    step, peak = cost.single_device_run()
    d = cost.single_device()
    if d < 0:
        return step, False
    limit = cluster.devices[d].memory_bytes
    return step, limit is None or peak <= limit


def check_orders(graph: Graph, orders: list[list[int]]) -> None:
    """Raise :class:`InvalidPlan` if the edges plus each device's chain contain a cycle."""
    n = len(graph)
    chain_next = [-1] * n
    for order in orders:
        for a, b in itertools.pairwise(order):
            chain_next[a] = b
    indegree = [len(ins) for ins in graph.in_edges]
    for b in chain_next:
        if b >= 0:
            indegree[b] += 1

    def successors(op: int) -> list[int]:
        succ = [graph.edge_dst[k] for k in graph.out_edges[op]]
        return [*succ, chain_next[op]] if chain_next[op] >= 0 else succ

    ready = [i for i in range(n) if indegree[i] == 0]
    seen = 0
    while ready:
        op = ready.pop()
        seen += 1
        for nxt in successors(op):
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    if seen < n:
        cycle = find_cycle([i for i in range(n) if indegree[i] > 0], successors)
        raise InvalidPlan(
            "inconsistent order: ops wait for each other in a cycle "
            + " -> ".join(repr(graph.names[i]) for i in cycle),
            {"cycle": [graph.names[i] for i in cycle]},
        )


def check_constraints(
    graph: Graph, cluster: Cluster, device_of: list[int], forward_pairs: bool = True
) -> None:
    """Raise :class:`InvalidPlan` where a colocation group, pin or forward pair is broken, or
    an op is on a device of a kind it cannot run on (``compute_us_by_kind`` null)."""
    names = [d.name for d in cluster.devices]
    if graph.compute_us_by_kind is not None:
        for op, d in enumerate(device_of):
            kind = cluster.devices[d].kind
            by_kind = graph.compute_us_by_kind[op]
            if kind in by_kind and by_kind[kind] is None:
                raise InvalidPlan(
                    f"op {graph.names[op]!r} is placed on {names[d]!r} of kind {kind!r}, where "
                    f"it cannot run (compute_us_by_kind.{kind} is null)",
                    {"op": graph.names[op], "field": "compute_us_by_kind"},
                )
    group_device: dict[str, int] = {}
    group_first: dict[str, int] = {}
    for op, d in enumerate(device_of):
        pin = graph.pin[op]
        if pin is not None and pin != names[d]:
            raise InvalidPlan(
                f"op {graph.names[op]!r} is pinned to {pin!r} but placed on {names[d]!r}",
                {"op": graph.names[op]},
            )
        group = graph.colocation_group[op]
        if group is not None:
            if group not in group_device:
                group_device[group], group_first[group] = d, op
            elif group_device[group] != d:
                first = group_first[group]
                raise InvalidPlan(
                    f"colocation group {group!r} is split: {graph.names[first]!r} on "
                    f"{names[group_device[group]]!r}, {graph.names[op]!r} on {names[d]!r}",
                    {"group": group},
                )
        forward = graph.forward_op[op]
        if forward_pairs and forward >= 0 and device_of[forward] != d:
            raise InvalidPlan(
                f"op {graph.names[op]!r} is placed on {names[d]!r} but its forward op "
                f"{graph.names[forward]!r} is on {names[device_of[forward]]!r}",
                {"op": graph.names[op]},
            )


def index_plan(graph: Graph, plan: Plan, cluster: Cluster) -> tuple[list[int], list[list[int]]]:
    """Turn a plan's names into device indices per op and op indices per device, checked."""
    device_index = cluster.index()
    device_of = [-1] * len(graph)
    for name, device in plan.placement.items():
        op = graph.index.get(name)
        if op is None:
            raise InvalidPlan(f"placement: op {name!r} is not in the graph", {"op": name})
        d = device_index.get(device)
        if d is None:
            raise InvalidPlan(
                f"placement: op {name!r} is placed on unknown device {device!r}", {"op": name}
            )
        device_of[op] = d
    missing = [graph.names[i] for i, d in enumerate(device_of) if d < 0]
    if missing:
        raise InvalidPlan(
            f"placement: {len(missing)} ops are not placed, e.g. {missing[0]!r}",
            {"missing": missing[:20]},
        )
    orders: list[list[int]] = [[] for _ in cluster.devices]
    seen = [False] * len(graph)
    for device, names in plan.order.items():
        d = device_index.get(device)
        if d is None:
            raise InvalidPlan(f"order: unknown device {device!r}", {"device": device})
        for name in names:
            op = graph.index.get(name)
            if op is None:
                raise InvalidPlan(f"order[{device!r}]: op {name!r} is not in the graph")
            if device_of[op] != d:
                raise InvalidPlan(
                    f"order[{device!r}]: op {name!r} is placed on "
                    f"{cluster.devices[device_of[op]].name!r}",
                    {"op": name},
                )
            if seen[op]:
                raise InvalidPlan(f"order[{device!r}]: op {name!r} appears twice", {"op": name})
            seen[op] = True
            orders[d].append(op)
    unordered = [graph.names[i] for i, s in enumerate(seen) if not s]
    if unordered:
        raise InvalidPlan(
            f"order: {len(unordered)} placed ops are missing from their device's order, "
            f"e.g. {unordered[0]!r}",
            {"missing": unordered[:20]},
        )
    return device_of, orders


def simulate_plan(graph: Any, plan: Plan | dict[str, Any], cluster: Any = None) -> Simulation:
    """Check a plan against its graph and replay it; ``cluster`` defaults to the plan's."""
    graph = load_graph(graph)
    plan = Plan.parse(plan)
    cluster = Cluster.parse(cluster if cluster is not None else plan.request.cluster)
    device_of, orders = index_plan(graph, plan, cluster)
    forward_pairs = bool(plan.request.options.get("forward_only", True))
    check_constraints(graph, cluster, device_of, forward_pairs)
    check_orders(graph, orders)
    return replay(graph, cluster, device_of, orders)


def simulate(graph: Any, plan: Plan | dict[str, Any], cluster: Any = None) -> Estimate:
    """Replay a plan and return its :class:`~baechi.plan.Estimate`.

    Raises :class:`~baechi.errors.InvalidPlan` when the plan breaks a rule of DESIGN §4.
    """
    return simulate_plan(graph, plan, cluster).estimate
