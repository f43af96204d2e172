"""Units of placement: ops that must share a device (docs/format.md §6, steps 1 and 2).

Step 1, *grouping* (hard constraints, never split): colocation groups are unioned; with
``forward_only`` every backward op joins its forward op's unit; a unit takes the pin of any
member (two different pins in one unit are an error).

Step 2, *co-placement* (optional merges): an op whose output is used by exactly one consumer
joins that consumer's unit (:func:`co_place`), unless the merged unit would outgrow the memory
cap of :func:`merge_cap`. Memory is estimated by :func:`unit_memory`, a safe upper bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from baechi.cluster import Cluster
from baechi.errors import InvalidRequest
from baechi.graph import Graph
from baechi.memory import MemoryProxy, memory_proxy


class DisjointSets:
    """Union-find over ``0..n-1``: union by size, path halving (near-constant time per call)."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))
        self.size = [1] * n

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: int, b: int) -> int:
        """Join the sets of ``a`` and ``b``; returns the root of the joint set."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return ra
        size = self.size
        if size[ra] < size[rb]:
            ra, rb = rb, ra
        self.parent[rb] = ra
        size[ra] += size[rb]
        return ra

    def attach(self, root: int, child: int) -> None:
        """Join root ``child``'s set into root ``root``'s, ``root`` staying the root (for
        callers that name a set by a chosen member)."""
        self.parent[child] = root
        self.size[root] += self.size[child]


@dataclass
class Units:
    """A partition of a graph's ops into units placed together.

    ``unit_of[op]`` is the op's unit, ``members[unit]`` its ops in file order, ``pin[unit]``
    the device index it is pinned to or -1. Units are numbered by their first op in file order.
    """

    unit_of: list[int]
    members: list[list[int]]
    pin: list[int]  # device index per unit, -1 when free

    def __len__(self) -> int:
        return len(self.members)


def units_from_sets(graph: Graph, cluster: Cluster, sets: DisjointSets) -> Units:
    """Number the sets' roots in file order and resolve each unit's pin."""
    device_index = cluster.index()
    unit_of = [0] * len(graph)
    root_unit: dict[int, int] = {}
    members: list[list[int]] = []
    for op in range(len(graph)):
        root = sets.find(op)
        unit = root_unit.get(root)
        if unit is None:
            unit = root_unit[root] = len(members)
            members.append([])
        unit_of[op] = unit
        members[unit].append(op)
    pin = [-1] * len(members)
    pinned_by = [-1] * len(members)
    for op, name in enumerate(graph.pin):
        if name is None:
            continue
        d = device_index.get(name)
        if d is None:
            raise InvalidRequest(
                f"op {graph.names[op]!r}.device: pinned to {name!r}, which is not a device of "
                f"the cluster ({', '.join(device_index)})",
                {"op": graph.names[op], "field": "device"},
            )
        unit = unit_of[op]
        if pin[unit] >= 0 and pin[unit] != d:
            other = graph.names[pinned_by[unit]]
            raise InvalidRequest(
                f"op {graph.names[op]!r}.device: pinned to {name!r} but must share a device "
                f"with {other!r}, pinned to {cluster.devices[pin[unit]].name!r}",
                {"op": graph.names[op], "field": "device"},
            )
        pin[unit], pinned_by[unit] = d, op
    return Units(unit_of, members, pin)


def colocation_sets(graph: Graph, forward_only: bool) -> DisjointSets:
    """Union colocation groups, and with ``forward_only`` each backward op with its forward op."""
    sets = DisjointSets(len(graph))
    first_of_group: dict[str, int] = {}
    for op, group in enumerate(graph.colocation_group):
        if group is not None:
            first = first_of_group.setdefault(group, op)
            if first != op:
                sets.union(first, op)
    if forward_only:
        for op, forward in enumerate(graph.forward_op):
            if forward >= 0:
                sets.union(op, forward)
    return sets


def colocation_units(graph: Graph, cluster: Cluster, forward_only: bool = True) -> Units:
    """The units every plan must respect: colocation groups, forward pairs, pins.

    Examples
    --------
    >>> from baechi.graph import load_graph
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
    ...     {"name": "w", "compute_us": 1, "colocation_group": "v"},
    ...     {"name": "x", "compute_us": 1},
    ...     {"name": "gw", "compute_us": 1, "forward_op": "x"},
    ...     {"name": "u", "compute_us": 1, "colocation_group": "v"}]})
    >>> colocation_units(g, Cluster.uniform(2)).members
    [[0, 3], [1, 2]]
    """
    return units_from_sets(graph, cluster, colocation_sets(graph, forward_only))


# ---------------------------------------------------------------------------- memory


def unit_memory(graph: Graph, units: Units) -> list[int]:
    """A safe upper bound of what each unit needs on a device by itself, in bytes.

    Σ ``persistent_bytes`` + Σ ``output_bytes`` + max ``temp_bytes`` over the unit's ops:
    weights stay resident, at worst every output is alive at once (training keeps forward
    activations until the backward pass), and a device runs one op at a time so only one temp
    is held. Received copies of other units' tensors are not included.

    Examples
    --------
    >>> from baechi.graph import load_graph
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
    ...     {"name": "a", "compute_us": 1, "output_bytes": 10, "temp_bytes": 7},
    ...     {"name": "b", "compute_us": 1, "persistent_bytes": 5, "temp_bytes": 3,
    ...      "colocation_group": "g"},
    ...     {"name": "c", "compute_us": 1, "output_bytes": 1, "colocation_group": "g"}]})
    >>> unit_memory(g, colocation_units(g, Cluster.uniform(1)))
    [17, 9]
    """
    proxy = MemoryProxy(graph, units.unit_of, len(units))
    return [proxy.of(unit) for unit in range(len(units))]


def graph_memory(graph: Graph) -> int:
    """The :func:`unit_memory` proxy of the whole graph taken as one unit."""
    return memory_proxy(graph, range(len(graph)))


#: A merged unit may take at most this fraction of the smallest device's memory.
DEVICE_FRACTION = 0.5


def merge_cap(graph: Graph, cluster: Cluster) -> float:
    """The largest :func:`unit_memory` an optional merge may build, in bytes.

    The smaller of

    - half the smallest device's memory (:data:`DEVICE_FRACTION`): a unit must fit wherever
      it lands, and with units of at most half a device every device can take two of them,
      which leaves the placer room to pack and balance under a tight limit;
    - one device's share of the whole graph, ``graph_memory / len(devices)``: a unit larger
      than its share leaves the placer nothing to balance and, merged further, collapses the
      graph onto one device as Baechi's co-placement does with ResNet-50.

    ``math.inf`` when neither limits (one device with unlimited memory).

    Examples
    --------
    >>> from baechi.graph import load_graph
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
    ...     {"name": "a", "compute_us": 1, "output_bytes": 400},
    ...     {"name": "b", "compute_us": 1, "output_bytes": 400}]})
    >>> merge_cap(g, Cluster.uniform(4)), merge_cap(g, Cluster.uniform(2, memory_bytes=600))
    (200.0, 300.0)
    """
    limits = [d.memory_bytes for d in cluster.devices if d.memory_bytes is not None]
    per_device: float = min(limits) * DEVICE_FRACTION if limits else math.inf
    n_devices = len(cluster.devices)
    share = graph_memory(graph) / n_devices if n_devices > 1 else math.inf
    return min(per_device, share)


# ---------------------------------------------------------------------------- co-placement


def single_consumers(graph: Graph) -> tuple[list[int], list[int]]:
    """The one consumer of each op's output (-1 if none or several) and the bytes it receives.

    Consumers are the distinct destination ops of the op's *data* edges: a control edge moves
    no tensor (crossing devices costs one latency), so it neither makes nor breaks co-placement.
    An op with no data consumer at all (a sink, or an op with control successors only) falls
    back to its control successors: one distinct control successor is its consumer, which saves
    that latency. Several edges to the same op (several tensors) count as one consumer.

    Examples
    --------
    >>> from baechi.graph import load_graph
    >>> g = load_graph({"format": "baechi.graph/v1",
    ...     "ops": [{"name": n, "compute_us": 1} for n in "abcd"],
    ...     "edges": [{"src": "a", "dst": "b", "bytes": 8},
    ...               {"src": "a", "dst": "b", "bytes": 4, "tensor": "a:1"},
    ...               {"src": "a", "dst": "c", "bytes": 0, "control": True},
    ...               {"src": "b", "dst": "c", "bytes": 1}, {"src": "b", "dst": "d", "bytes": 1}]})
    >>> single_consumers(g)
    ([1, -1, -1, -1], [12, 0, 0, 0])
    """
    n = len(graph)
    consumer = [-1] * n
    weight = [0] * n
    edge_dst, edge_control, edge_bytes = graph.edge_dst, graph.edge_control, graph.edge_bytes
    for op, outs in enumerate(graph.out_edges):
        if not outs:
            continue
        data_c, data_w, data_many = -1, 0, False
        ctrl_c, ctrl_many = -1, False
        for k in outs:
            d = edge_dst[k]
            if edge_control[k]:
                if ctrl_c < 0:
                    ctrl_c = d
                elif d != ctrl_c:
                    ctrl_many = True
            elif data_c < 0:
                data_c, data_w = d, edge_bytes[k]
            elif d != data_c:
                data_many = True
                break
            else:
                data_w += edge_bytes[k]
        if data_c >= 0:
            if not data_many:
                consumer[op], weight[op] = data_c, data_w
        elif not ctrl_many:
            consumer[op] = ctrl_c
    return consumer, weight


def merge_units(graph: Graph, units: Units, sets: DisjointSets) -> Units:
    """Units made of the unions in ``sets`` (a partition of ``units``), numbered in file order.

    The caller guarantees that no set joins two units pinned to different devices.
    """
    unit_of = [0] * len(graph)
    members: list[list[int]] = []
    pin: list[int] = []
    new_of_root: dict[int, int] = {}
    find = sets.find
    for op, unit in enumerate(units.unit_of):
        root = find(unit)
        new = new_of_root.get(root)
        if new is None:
            new = new_of_root[root] = len(members)
            members.append([])
            pin.append(-1)
        unit_of[op] = new
        members[new].append(op)
    for unit, d in enumerate(units.pin):
        if d >= 0:
            pin[new_of_root[find(unit)]] = d
    return Units(unit_of, members, pin)


def forbidden_kinds(graph: Graph, cluster: Cluster, units: Units) -> list[frozenset[str]] | None:
    """Per unit, the cluster's device kinds some member cannot run on (``None`` when no op
    has ``compute_us_by_kind``)."""
    if graph.compute_us_by_kind is None:
        return None
    kinds = {d.kind for d in cluster.devices}
    forbidden: list[set[str]] = [set() for _ in range(len(units))]
    for op, by_kind in enumerate(graph.compute_us_by_kind):
        for kind, us in by_kind.items():
            if us is None and kind in kinds:
                forbidden[units.unit_of[op]].add(kind)
    return [frozenset(f) for f in forbidden]


def co_place(graph: Graph, cluster: Cluster, units: Units, cap: float | None = None) -> Units:
    """Co-placement: each op with a single consumer joins the consumer's unit, within ``cap``.

    Candidate merges (op, its single consumer per :func:`single_consumers`) are tried once each,
    heaviest tensor first (ties in canonical order), so that when the cap stops merging, the
    transfers left between units are the small ones. A merge is skipped when the two units are
    pinned to different devices or their joint :func:`unit_memory` exceeds ``cap`` (default
    :func:`merge_cap`); a unit that already exceeds it (a large colocation group) stays as it
    is but takes no more ops. Units only grow, so a skipped merge would stay skipped: one pass
    reaches the fixed point. Time O(n α(n) + m + c log c) for c candidates.

    Parameters
    ----------
    graph, cluster
        The graph and the devices (for the default cap).
    units
        The hard units (:func:`colocation_units`); they are never split.
    cap
        Largest unit memory a merge may build; ``math.inf`` merges like Baechi.

    Examples
    --------
    >>> from baechi.graph import load_graph
    >>> g = load_graph({"format": "baechi.graph/v1",
    ...     "ops": [{"name": n, "compute_us": 1, "output_bytes": 10} for n in "abcd"],
    ...     "edges": [{"src": "a", "dst": "b", "bytes": 10}, {"src": "b", "dst": "c", "bytes": 10},
    ...               {"src": "c", "dst": "d", "bytes": 20}]})
    >>> hard = colocation_units(g, Cluster.uniform(2))
    >>> co_place(g, Cluster.uniform(2), hard, cap=math.inf).members
    [[0, 1, 2, 3]]
    >>> co_place(g, Cluster.uniform(2), hard).members  # cap: half of 40 bytes
    [[0, 1], [2, 3]]
    """
    if cap is None:
        cap = merge_cap(graph, cluster)
    k = len(units)
    proxy = MemoryProxy(graph, units.unit_of, k)  # kept at each set's root
    pin = list(units.pin)

    consumer, weight = single_consumers(graph)
    unit_of = units.unit_of
    position = graph.topo_position
    # with compute_us_by_kind, units merge only when the same kinds forbid them: a merge never
    # takes a device away from an op
    forbidden = forbidden_kinds(graph, cluster, units)
    candidates = [
        (-weight[op], position[op], op) for op in range(len(graph))
        if consumer[op] >= 0 and unit_of[op] != unit_of[consumer[op]]
    ]
    candidates.sort()

    sets = DisjointSets(k)
    find = sets.find
    for _, _, op in candidates:
        a, b = find(unit_of[op]), find(unit_of[consumer[op]])
        if a == b:
            continue
        if pin[a] >= 0 and pin[b] >= 0 and pin[a] != pin[b]:
            continue
        if forbidden is not None and forbidden[a] != forbidden[b]:
            continue
        if proxy.merged(a, b) > cap:
            continue
        root = sets.union(a, b)
        proxy.merge(root, b if root == a else a)
        pin[root] = pin[a] if pin[a] >= 0 else pin[b]
    return merge_units(graph, units, sets)
