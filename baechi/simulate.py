"""The cost model (docs/format.md §4): replay a placement and per-device order, exactly.

:func:`replay` is the judge of every plan. It works on the indexed form (device index per op,
op indices per device); :func:`simulate` and :func:`simulate_plan` take a
:class:`~baechi.plan.Plan` with op and device names and check it first (every op placed once,
orders consistent with the graph, colocation groups, forward pairs and pins respected).
:func:`single_device_run` is the one-device baseline (the cost model caches it per request:
:meth:`~baechi.costmodel.CostModel.single_device_run`); the lower bound is
:meth:`~baechi.costmodel.CostModel.lower_bound_us`. Those are the entry points; the rest is
private.

Decisions where docs/format.md §4 leaves room (also in docs/decisions.md):

- Completion events are processed in the order (end, start, device index, position in the
  device's order); a transfer is booked on the channels when its producer's completion is
  processed, edges in file order. An op starts as soon as its inputs' arrival times are known.
- Forward pairing (a backward op on its ``forward_op``'s device) is required only when the
  plan's ``options.forward_only`` is true (the default); colocation groups and pins always.
- A plan's transfer order (docs/format.md §10, docs/format.md §10): each channel is
  booked in its list's order instead of first come, first served; a message starts at
  max(issue, end of its predecessor in the sender's list, end of its predecessor in the
  receiver's list). In parallel mode there are no channels and the order is ignored.
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
from baechi.memory import persistent_bytes_by
from baechi.plan import Estimate, Plan, TransferEntry

#: One message as the cost model keys it (:meth:`~baechi.costmodel.CostModel.transfer_key`):
#: ``(src op, destination device, tensor, bytes)``, ``(src op, destination device, None, 0)``
#: for a control message.
TransferKey = tuple[Any, ...]


@dataclass
class Transfers:
    """Every message sent between devices, in booking order (parallel lists); ``key`` is the
    message's :data:`TransferKey`."""

    src_op: list[int] = field(default_factory=list)
    src_device: list[int] = field(default_factory=list)
    dst_device: list[int] = field(default_factory=list)
    start: list[float] = field(default_factory=list)
    end: list[float] = field(default_factory=list)
    nbytes: list[int] = field(default_factory=list)
    control: list[bool] = field(default_factory=list)
    tensor: list[str] = field(default_factory=list)
    key: list[TransferKey] = field(default_factory=list)

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
    """The full result of a replay: per-op times, transfers, memory, and the estimate.

    ``transfer_order`` is the channel order the replay was given (per device, the keys of its
    channel's messages in booking order), ``None`` when the channels were booked first come,
    first served (docs/format.md §4).
    """

    estimate: Estimate
    device_of: list[int]
    orders: list[list[int]]
    start: list[float]
    end: list[float]
    transfers: Transfers
    memory: list[MemoryTrace]
    transfer_order: list[list[TransferKey]] | None = None

    def channel_orders(self) -> list[list[int]]:
        """Per device, the indices (into :attr:`transfers`) of the messages its channel
        carried, in booking order: a transfer appears in its sender's and its receiver's list.
        Written out (:meth:`booked_order`) and replayed, it gives this replay's times."""
        lists: list[list[int]] = [[] for _ in self.orders]
        for index, (d, dd) in enumerate(zip(self.transfers.src_device,
                                            self.transfers.dst_device, strict=True)):
            lists[d].append(index)
            lists[dd].append(index)
        return lists

    def booked_order(self) -> list[list[TransferKey]]:
        """:meth:`channel_orders` as message keys: a transfer order that replays to this
        simulation's times (FIFO's order written out, for a FIFO replay)."""
        keys = self.transfers.key
        return [[keys[i] for i in channel] for channel in self.channel_orders()]


def _timing(
    cost: CostModel, device_of: list[int], orders: list[list[int]],
    transfer_order: list[list[TransferKey]] | None = None,
    priority: dict[TransferKey, float] | None = None, name_cycle: bool = True,
) -> tuple[list[float], list[float], Transfers, list[float], dict[tuple[Any, ...], int]]:
    """Event-driven execution; returns start, end, transfers, edge arrivals, transfer per key.

    Without ``transfer_order`` a message is booked when its producer's completion is
    processed (first come, first served). With it (sequential mode only), a message is booked
    once it is issued and first in what is left of both its channels' lists; booking it may
    let the next message of either list go. With ``priority`` instead (dispatch, sequential
    mode only), issued messages wait until both their channels are free, and then the one with
    the smallest priority goes first (ties: issue order).
    """
    graph = cost.graph
    n = len(graph)
    devices = cost.cluster.devices
    op_us = cost.op_us
    sequential = cost.sequential
    in_edges, out_edges = graph.in_edges, graph.out_edges
    edge_dst = graph.edge_dst
    edge_src, edge_tensor, edge_control = graph.edge_src, graph.edge_tensor, graph.edge_control
    dispatching = priority is not None and sequential
    ordered = (transfer_order is not None or dispatching) and sequential
    channel_list = transfer_order if transfer_order is not None else []
    wakeup = (math.inf, len(devices), 0, -1)  # after every completion at the same instant

    start = [0.0] * n
    end = [0.0] * n
    arrival = [0.0] * graph.num_edges
    waiting = [len(ins) for ins in in_edges]
    position = [0] * len(devices)
    device_free = [0.0] * len(devices)
    channel_free = [0.0] * len(devices)
    channel_position = [0] * len(devices)
    transfers = Transfers()
    sent: dict[tuple[Any, ...], int] = {}
    # ordered mode: issued messages not booked yet -> (issue time, first edge, sender);
    # the edges waiting for each
    issued: dict[tuple[Any, ...], tuple[float, int, int]] = {}
    held: dict[tuple[Any, ...], list[int]] = {}
    # dispatch: per (sender, receiver), the issued messages as (priority, issue number, key)
    waiting_on: dict[tuple[int, int], list[tuple[float, int, tuple[Any, ...]]]] = {}
    issue_number = itertools.count()
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

    def book(key: tuple[Any, ...], t: float, k: int, d: int, dd: int) -> int:
        """Book ``key``'s message (first edge ``k``, issued at ``t``) from ``d`` to ``dd``."""
        duration = cost.transfer_us(k, d, dd)
        s = t
        if sequential:
            s = max(t, channel_free[d], channel_free[dd])
            channel_free[d] = channel_free[dd] = s + duration
        index = sent[key] = len(transfers)
        transfers.src_op.append(edge_src[k])
        transfers.src_device.append(d)
        transfers.dst_device.append(dd)
        transfers.start.append(s)
        transfers.end.append(s + duration)
        transfers.nbytes.append(cost.message_bytes(k))
        transfers.control.append(edge_control[k])
        transfers.tensor.append("" if edge_control[k] else edge_tensor[k])
        transfers.key.append(key)
        return index

    def book_in_order(key: tuple[Any, ...]) -> None:
        """Book ``key`` if it is issued and next on both channels, then what that frees."""
        stack = [key]
        while stack:
            key = stack.pop()
            if key not in issued:
                continue
            t, k, d = issued[key]
            dd = key[1]
            if (channel_position[d] >= len(channel_list[d])
                    or channel_list[d][channel_position[d]] != key
                    or channel_position[dd] >= len(channel_list[dd])
                    or channel_list[dd][channel_position[dd]] != key):
                continue
            del issued[key]
            index = book(key, t, k, d, dd)
            channel_position[d] += 1
            channel_position[dd] += 1
            for c in (d, dd):
                if channel_position[c] < len(channel_list[c]):
                    stack.append(channel_list[c][channel_position[c]])
            deliver(key, index, dd)

    def deliver(key: tuple[Any, ...], index: int, dd: int) -> None:
        """The edges waiting for ``key``'s message get its arrival; start what is ready."""
        for edge in held.pop(key):
            arrival[edge] = transfers.end[index]
            waiting[edge_dst[edge]] -= 1
            if not waiting[edge_dst[edge]]:
                start_ready(dd)

    def dispatch(t: float) -> None:
        """Book, most urgent first, the issued messages whose channels are free at ``t``.

        The waiting messages are kept per (sender, receiver) in heaps of (priority, issue
        number): whether a message may go depends on its pair's channels only, so the most
        urgent one that may go is the smallest top among the pairs whose channels are free
        (a scan of all waiting messages per event was most of a dispatch replay's time)."""
        while True:
            best: tuple[float, int, tuple[Any, ...]] | None = None
            for (d, dd), queue in waiting_on.items():
                if queue and channel_free[d] <= t and channel_free[dd] <= t \
                        and (best is None or queue[0] < best):
                    best = queue[0]
            if best is None:
                return
            key = best[2]
            t_issue, k, d = issued.pop(key)
            dd = key[1]
            heapq.heappop(waiting_on[d, dd])
            index = book(key, t_issue, k, d, dd)
            heapq.heappush(events, (transfers.end[index], *wakeup))
            deliver(key, index, dd)

    for d in range(len(devices)):
        start_ready(d)
    while events:
        t, _, d, _, op = heapq.heappop(events)
        if op < 0:  # a channel freed up (dispatch)
            dispatch(t)
            continue
        new: list[tuple[Any, ...]] = []
        for k in out_edges[op]:
            dst = edge_dst[k]
            dd = device_of[dst]
            if dd == d:
                arrival[k] = t
            else:
                key = cost.transfer_key(k, dd)
                index = sent.get(key)
                if index is None and ordered:
                    if key not in held:
                        issued[key] = (t, k, d)
                        held[key] = []
                        new.append(key)
                        if dispatching:
                            assert priority is not None
                            heapq.heappush(waiting_on.setdefault((d, dd), []),
                                           (priority[key], next(issue_number), key))
                    held[key].append(k)
                    continue
                if index is None:
                    index = book(key, t, k, d, dd)
                arrival[k] = transfers.end[index]
            waiting[dst] -= 1
            if not waiting[dst]:
                start_ready(dd)
        if dispatching:
            if new:
                dispatch(t)
        else:
            for key in new:
                book_in_order(key)
    stuck = [d for d in range(len(devices)) if position[d] < len(orders[d])]
    if stuck or issued:
        if ordered and transfer_order is not None:
            if not name_cycle:
                raise InvalidPlan("transfer_order deadlocks")
            raise _deadlock(cost, device_of, orders, transfer_order, list(issued))
        # only reachable when the caller skipped check_plan
        raise InvalidPlan(f"the order of device {devices[stuck[0]].name!r} deadlocks")
    return start, end, transfers, arrival, sent


def schedule_graph(
    cost: CostModel, device_of: list[int], orders: list[list[int]],
    transfer_order: list[list[TransferKey]] | None = None,
) -> tuple[list[TransferKey], list[list[int]]]:
    """The dependencies of a plan's schedule as one graph: what waits for what.

    Nodes ``0..n-1`` are the ops, node ``n + j`` is the message ``keys[j]`` (every message
    the placement makes, in graph edge order). An op precedes its same-device consumers, the
    next op in its device's order and the messages of its outputs; a message precedes its
    consumers and, with ``transfer_order``, the next message in its sender's and in its
    receiver's list. Returns ``keys`` and each node's successors.
    """
    graph = cost.graph
    n = len(graph)
    keys: list[TransferKey] = []
    node_of: dict[TransferKey, int] = {}
    successors: list[list[int]] = [[] for _ in range(n)]
    for k, (src, dst) in enumerate(zip(graph.edge_src, graph.edge_dst, strict=True)):
        dd = device_of[dst]
        if dd == device_of[src]:
            successors[src].append(dst)
            continue
        key = cost.transfer_key(k, dd)
        node = node_of.get(key)
        if node is None:
            node = node_of[key] = n + len(keys)
            keys.append(key)
            successors.append([])
            successors[src].append(node)
        successors[node].append(dst)
    for order in orders:
        for a, b in itertools.pairwise(order):
            successors[a].append(b)
    for channel in transfer_order or []:
        for a, b in itertools.pairwise(channel):
            if a in node_of and b in node_of:
                successors[node_of[a]].append(node_of[b])
    return keys, successors


def topological_nodes(successors: list[list[int]]) -> list[int]:
    """The nodes of a graph given by successor lists in a topological order (Kahn); nodes on
    or after a cycle are left out."""
    indegree = [0] * len(successors)
    for succ in successors:
        for b in succ:
            indegree[b] += 1
    ready = [i for i, deg in enumerate(indegree) if deg == 0]
    order: list[int] = []
    while ready:
        node = ready.pop()
        order.append(node)
        for b in successors[node]:
            indegree[b] -= 1
            if indegree[b] == 0:
                ready.append(b)
    return order


def describe_transfer(graph: Graph, cluster: Cluster, key: TransferKey) -> str:
    """A message in words: ``transfer of 'a:0' (4096 bytes) from 'a' to '/GPU:1'``."""
    src, dst = graph.names[key[0]], cluster.devices[key[1]].name
    if key[2] is None:
        return f"control message from {src!r} to {dst!r}"
    return f"transfer of {key[2]!r} ({key[3]} bytes) from {src!r} to {dst!r}"


def _deadlock(
    cost: CostModel, device_of: list[int], orders: list[list[int]],
    transfer_order: list[list[TransferKey]], unbooked: list[TransferKey],
) -> InvalidPlan:
    """The error of a transfer order that deadlocks, naming a cycle of ops and messages
    (or an ``unbooked`` message no list names, for an order not checked by
    :func:`index_transfer_order`)."""
    graph, cluster = cost.graph, cost.cluster
    keys, successors = schedule_graph(cost, device_of, orders, transfer_order)
    n = len(graph)
    done = set(topological_nodes(successors))
    cycle = find_cycle([i for i in range(len(successors)) if i not in done],
                       successors.__getitem__)
    if not cycle:
        listed = {key for channel in transfer_order for key in channel}
        missing = next((key for key in unbooked if key not in listed), unbooked[0])
        return InvalidPlan("transfer_order: the "
                           f"{describe_transfer(graph, cluster, missing)} is never booked")
    words = [repr(graph.names[i]) if i < n else describe_transfer(graph, cluster, keys[i - n])
             for i in cycle]
    return InvalidPlan(
        "transfer_order deadlocks: ops and messages wait for each other in a cycle "
        + " -> ".join(words), {"cycle": words})


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
    held = persistent_bytes_by(graph, device_of, n_dev)
    for d in range(n_dev):
        ops = np.array(ops_on[d], dtype=np.int64)
        copies = np.array(copies_on[d], dtype=np.int64)
        base = held[d]
        alloc = np.concatenate([start_a[ops], start_a[ops], t_start[copies]])
        free = np.concatenate([end_a[ops], out_free_a[ops], t_free[copies]])
        nbytes = np.concatenate([temp_a[ops], out_a[ops], t_bytes[copies]])
        traces.append(_peak(alloc, free, nbytes, base))
    return traces


def _trace(
    graph: Graph, cluster: Cluster, device_of: list[int], orders: list[list[int]],
    cost: CostModel | None = None, transfer_order: list[list[TransferKey]] | None = None,
    priority: dict[TransferKey, float] | None = None, name_cycle: bool = True,
) -> tuple[list[float], list[float], Transfers, list[MemoryTrace]]:
    """Start and end per op, transfers, and memory per device for consistent orders.

    ``cost``: the request's :class:`~baechi.costmodel.CostModel`, built when not given.
    """
    cost = cost or CostModel(graph, cluster)
    start, end, transfers, arrival, sent = _timing(cost, device_of, orders, transfer_order,
                                                   priority, name_cycle)
    memory = _memory(cost, device_of, start, end, transfers, arrival, sent)
    return start, end, transfers, memory


def replay(
    graph: Graph, cluster: Cluster, device_of: list[int], orders: list[list[int]],
    cost: CostModel | None = None, transfer_order: list[list[TransferKey]] | None = None,
    priority: dict[TransferKey, float] | None = None, name_cycle: bool = True,
) -> Simulation:
    """Simulate ``orders[d]`` (op indices) on each device ``d``; orders must be consistent.

    Use :func:`check_orders` first when the orders come from outside. ``transfer_order``:
    per device, the keys of its channel's messages in booking order (every message the
    placement makes, once in its sender's and once in its receiver's list; see
    :func:`index_transfer_order`); ignored in parallel mode. Raises
    :class:`~baechi.errors.InvalidPlan` naming the cycle when it deadlocks; with
    ``name_cycle`` off, without naming it, which spares a pass over the schedule's graph
    (:mod:`baechi.ordering` tries orders that may deadlock and drops them: on a layered
    graph of 10,000 ops, named m-ETF in sequential mode, three such tries named their
    cycles in 0.10 s of the 1.15 s request).

    ``priority`` (instead of ``transfer_order``; a tool of :mod:`baechi.ordering`, not a plan
    rule): dispatch each channel by urgency, the smallest value first among the messages
    waiting when both their channels are free. The result's ``transfer_order`` is ``None``;
    its :meth:`Simulation.booked_order`, replayed, is the order it found.
    """
    cost = cost or CostModel(graph, cluster)
    if not cost.sequential:
        transfer_order = priority = None  # no channels: nothing to order
    start, end, transfers, memory = _trace(graph, cluster, device_of, orders, cost,
                                           transfer_order, priority, name_cycle)
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
    return Simulation(estimate, device_of, orders, start, end, transfers, memory,
                      transfer_order)


def single_device_run(
    graph: Graph, cluster: Cluster, device: int | None = None, cost: CostModel | None = None
) -> tuple[float, int]:
    """Step time and peak memory of the canonical order on one device (the fastest)."""
    d = cluster.fastest() if device is None else device
    orders: list[list[int]] = [[] for _ in cluster.devices]
    orders[d] = graph.topo
    _, end, _, memory = _trace(graph, cluster, [d] * len(graph), orders, cost)
    return max(end, default=0.0), memory[d].peak


def single_device_run_of(cost: CostModel) -> tuple[float, int]:
    """Step time and peak memory of the canonical order on :meth:`CostModel.single_device`,
    computed once per cost model (every replay of a request reports it); ``(inf, 0)`` when
    no device can run every op."""
    if cost.single_run is None:
        d = cost.single_device()
        cost.single_run = (math.inf, 0) if d < 0 else single_device_run(
            cost.graph, cost.cluster, d, cost=cost)
    return cost.single_run


def _single_device(
    graph: Graph, cluster: Cluster, cost: CostModel | None = None
) -> tuple[float, bool]:
    """Step time of the canonical order on the fastest device, and whether it fits there.

    With ``cost``, the run is computed once per cost model (:func:`single_device_run_of`).
    """
    cost = cost or CostModel(graph, cluster)
    step, peak = single_device_run_of(cost)
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


def plan_transfers(cost: CostModel, device_of: list[int]) -> list[TransferKey]:
    """Every message a placement makes, once each, in graph edge order."""
    graph = cost.graph
    seen: dict[TransferKey, None] = {}
    for k, (src, dst) in enumerate(zip(graph.edge_src, graph.edge_dst, strict=True)):
        if device_of[src] != device_of[dst]:
            seen.setdefault(cost.transfer_key(k, device_of[dst]), None)
    return list(seen)


def index_transfer_order(
    cost: CostModel, device_of: list[int], transfer_order: dict[str, list[TransferEntry]],
) -> list[list[TransferKey]]:
    """Turn a plan's ``transfer_order`` (names) into message keys per device, checked: every
    message the placement makes is listed once by its sender and once by its receiver, and
    nothing else is listed. Raises :class:`InvalidPlan` naming the entry otherwise."""
    graph, cluster = cost.graph, cost.cluster
    device_index = cluster.index()
    every = plan_transfers(cost, device_of)
    made = set(every)
    lists: list[list[TransferKey]] = [[] for _ in cluster.devices]
    for device, entries in transfer_order.items():
        d = device_index.get(device)
        if d is None:
            raise InvalidPlan(f"transfer_order: unknown device {device!r}", {"device": device})
        listed: set[TransferKey] = set()
        for i, entry in enumerate(entries):
            where = f"transfer_order[{device!r}][{i}]"
            src = graph.index.get(entry.src)
            if src is None:
                raise InvalidPlan(f"{where}: op {entry.src!r} is not in the graph",
                                  {"op": entry.src})
            dd = device_index.get(entry.dst)
            if dd is None:
                raise InvalidPlan(f"{where}: unknown device {entry.dst!r}", {"device": entry.dst})
            key = ((src, dd, None, 0) if entry.control
                   else (src, dd, entry.tensor, entry.bytes))
            if key not in made:
                raise InvalidPlan(f"{where}: the plan makes no "
                                  f"{describe_transfer(graph, cluster, key)}",
                                  {"entry": entry.model_dump()})
            if d not in (device_of[src], dd):
                raise InvalidPlan(
                    f"{where}: the {describe_transfer(graph, cluster, key)} does not use "
                    f"{device!r}'s channel (it goes from "
                    f"{cluster.devices[device_of[src]].name!r})", {"entry": entry.model_dump()})
            if key in listed:
                raise InvalidPlan(f"{where}: the {describe_transfer(graph, cluster, key)} "
                                  "appears twice", {"entry": entry.model_dump()})
            listed.add(key)
            lists[d].append(key)
    listed_on = [set(channel) for channel in lists]
    for key in every:  # in graph edge order: the first missing one is named
        for d in (device_of[key[0]], key[1]):
            if key not in listed_on[d]:
                raise InvalidPlan(
                    f"transfer_order[{cluster.devices[d].name!r}]: the "
                    f"{describe_transfer(graph, cluster, key)} is missing",
                    {"device": cluster.devices[d].name})
    return lists


def transfer_entries(
    graph: Graph, cluster: Cluster, transfer_order: list[list[TransferKey]],
) -> dict[str, list[TransferEntry]]:
    """A transfer order of message keys as the plan's ``transfer_order`` (names)."""
    names = [d.name for d in cluster.devices]
    out: dict[str, list[TransferEntry]] = {}
    for d, channel in enumerate(transfer_order):
        out[names[d]] = [
            TransferEntry(src=graph.names[key[0]], dst=names[key[1]], control=True)
            if key[2] is None else
            TransferEntry(src=graph.names[key[0]], tensor=key[2], bytes=key[3],
                          dst=names[key[1]])
            for key in channel
        ]
    return out


def simulate_plan(graph: Any, plan: Plan | dict[str, Any], cluster: Any = None) -> Simulation:
    """Check a plan against its graph and replay it; ``cluster`` defaults to the plan's.

    The plan's ``transfer_order``, when it has one, is checked (:func:`index_transfer_order`)
    and replayed (ignored in parallel mode).
    """
    graph = load_graph(graph)
    plan = Plan.parse(plan)
    cluster = Cluster.parse(cluster if cluster is not None else plan.request.cluster)
    device_of, orders = index_plan(graph, plan, cluster)
    forward_pairs = bool(plan.request.options.get("forward_only", True))
    check_constraints(graph, cluster, device_of, forward_pairs)
    check_orders(graph, orders)
    cost = CostModel(graph, cluster)
    keys = None
    if plan.transfer_order is not None and cost.sequential:
        keys = index_transfer_order(cost, device_of, plan.transfer_order)
    return replay(graph, cluster, device_of, orders, cost, keys)


def simulate(graph: Any, plan: Plan | dict[str, Any], cluster: Any = None) -> Estimate:
    """Replay a plan and return its :class:`~baechi.plan.Estimate`.

    Raises :class:`~baechi.errors.InvalidPlan` when the plan breaks a rule of docs/format.md §4.
    """
    return simulate_plan(graph, plan, cluster).estimate
