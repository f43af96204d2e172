"""Units of placement: ops that must share a device (DESIGN §6, step 1).

Colocation groups are unioned; with ``forward_only`` every backward op joins its forward op's
unit; a unit takes the pin of any member (two different pins in one unit are an error).
"""

from __future__ import annotations

from dataclasses import dataclass

from baechi.cluster import Cluster
from baechi.errors import InvalidRequest
from baechi.graph import Graph


class DisjointSets:
    """Union-find over ``0..n-1`` with path halving."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)
        return min(ra, rb)


@dataclass
class Units:
    """A partition of a graph's ops into units placed together."""

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
    """The units every plan must respect: colocation groups, forward pairs, pins."""
    return units_from_sets(graph, cluster, colocation_sets(graph, forward_only))
