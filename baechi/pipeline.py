"""Baechi's reduction pipeline (DESIGN §6, steps 1–3 and 5): units, co-placement, fusion.

:func:`reduce_graph` returns a :class:`Reduction`: the graph the algorithm places, its units,
and :meth:`Reduction.expand`, which maps the algorithm's assignment back to every original op.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from baechi.algorithms.base import Assignment
from baechi.cluster import Cluster
from baechi.graph import Graph
from baechi.grouping import Units, colocation_units
from baechi.options import Options


@dataclass
class Reduction:
    """The graph to place and how its nodes map back to the original ops.

    ``members[node]`` lists the original ops of a reduced node in canonical order; when the
    graph was not reduced, ``members`` is ``None``.
    """

    original: Graph
    graph: Graph
    units: Units
    members: list[list[int]] | None = None
    nodes: list[dict[str, Any]] = field(default_factory=list)

    def expand(self, assignment: Assignment) -> tuple[list[int], list[list[int]]]:
        """Device per original op and order per device, from an assignment of the nodes."""
        if self.members is None:
            return assignment.device_of, assignment.orders
        device_of = [0] * len(self.original)
        for node, ops in enumerate(self.members):
            d = assignment.device_of[node]
            for op in ops:
                device_of[op] = d
        orders = [[op for node in order for op in self.members[node]]
                  for order in assignment.orders]
        return device_of, orders


def reduce_graph(
    graph: Graph, cluster: Cluster, options: Options, phases: dict[str, float]
) -> Reduction:
    """Group the graph's ops into units (and, with the pipeline on, fuse them)."""
    tick = time.perf_counter()
    units = colocation_units(graph, cluster, options.forward_only)
    phases["grouping"] = time.perf_counter() - tick
    nodes = [{"phase": "input", "nodes": len(graph)}, {"phase": "grouping", "nodes": len(units)}]
    return Reduction(graph, graph, units, None, nodes)
