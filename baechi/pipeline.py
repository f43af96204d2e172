"""Baechi's reduction pipeline (docs/format.md §6, steps 1–3 and 5): units, co-placement, fusion.

:func:`reduce_graph` returns a :class:`Reduction`: the graph the algorithm places, its units,
and :meth:`Reduction.expand`, which maps the algorithm's assignment back to every original op.

1. grouping (always): colocation groups, forward pairs (``options.forward_only``), pins —
   :func:`baechi.grouping.colocation_units`. Hard constraints, never split.
2. co-placement (``options.co_placement``): single-consumer ops join their consumer's unit
   within the memory cap of :func:`baechi.grouping.merge_cap` — :func:`baechi.grouping.co_place`.
3. fusion (``options.fusion``): each unit's ops contracted into as few nodes as acyclicity
   and the same memory cap allow — :func:`baechi.fusion.fuse`.

Why expansion gives consistent orders: every original edge a→b between two nodes is an edge
of the reduced graph, and inside a node the members follow the canonical (topological) order.
Take a linear extension of the reduced edges plus the devices' node chains (one exists because
the algorithm's orders are consistent with the reduced graph) and order the ops by (their
node's position in it, canonical position). Every original edge and every link of an expanded
device chain goes forward in that order, so the expanded plan has no cycle.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from baechi.cluster import Cluster
from baechi.fusion import fuse
from baechi.graph import Graph
from baechi.grouping import Units, co_place, colocation_units, merge_cap
from baechi.options import Options


@dataclass
class Reduction:
    """The graph to place and how its nodes map back to the original ops.

    ``members[node]`` lists the original ops of a reduced node in canonical order and
    ``node_of[op]`` is the op's node; both are ``None`` when the graph was not fused (the
    algorithm then places the original ops, in ``units``). ``nodes`` has one entry per phase
    run: ``{"phase", "nodes", "units"}`` — the nodes the algorithm would place and the units
    they form after that phase. ``seconds`` holds the time of each step run (``grouping``,
    ``co_placement``, ``fusion``).
    """

    original: Graph
    graph: Graph
    units: Units
    members: list[list[int]] | None = None
    nodes: list[dict[str, Any]] = field(default_factory=list)
    node_of: list[int] | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    #: The merge cap's scale it was reduced with (:func:`reduce_graph`).
    cap_scale: float = 1.0
    #: What placers computed on this graph and units (:attr:`Problem.memo
    #: <baechi.algorithms.base.Problem.memo>`), shared by every problem made of it
    #: (:meth:`baechi.placing.Request.problem`): ``auto``'s runs of one reduction, memory
    #: retries and memory-blind starts alike, solve m-SCT's LP once.
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def expand(
        self, node_device: list[int], node_orders: list[list[int]]
    ) -> tuple[list[int], list[list[int]]]:
        """Device per original op and order per device, from a device per node and an order
        of nodes per device (an algorithm's assignment of the reduced graph).

        Each node becomes its members in canonical order, in the node's place in its device's
        order (consistent whenever the assignment's orders are, see the module docstring).
        """
        if self.members is None:
            return node_device, node_orders
        node_of = self.node_of
        if node_of is None:
            node_of = [0] * len(self.original)
            for node, ops in enumerate(self.members):
                for op in ops:
                    node_of[op] = node
        device_of = [node_device[node] for node in node_of]
        members = self.members
        orders = [[op for node in order for op in members[node]] for order in node_orders]
        return device_of, orders


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while the pipeline builds its acyclic containers.

    The steps allocate one set or list per op; with a large graph document alive, each
    automatic collection re-traverses every object of it (15-20% of the pipeline's time on a
    30k-op graph). Nothing built here holds a reference cycle, so nothing is left for later.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def reduce_graph(graph: Graph, cluster: Cluster, options: Options,
                 cap_scale: float = 1.0) -> Reduction:
    """Run the pipeline's reduction steps that ``options`` switch on.

    Parameters
    ----------
    graph, cluster
        The validated graph and the devices (pins, memory limits for the merge cap).
    options
        ``forward_only``, ``co_placement`` and ``fusion`` switch their steps.
    cap_scale
        Scales the merge cap (:func:`~baechi.grouping.merge_cap`): below 1, co-placement
        and fusion leave more, smaller nodes (``auto``'s finer reduction for ``exact``).

    Returns
    -------
    Reduction
        With ``nodes`` giving, for the input and each step run, the nodes to place and units,
        and ``seconds`` the time of each step.

    Examples
    --------
    >>> from baechi.graph import load_graph
    >>> g = load_graph({"format": "baechi.graph/v1",
    ...     "ops": [{"name": n, "compute_us": 1} for n in "abc"],
    ...     "edges": [{"src": "a", "dst": "b", "bytes": 1}, {"src": "b", "dst": "c", "bytes": 1}]})
    >>> r = reduce_graph(g, Cluster.uniform(2), Options())
    >>> [(p["phase"], p["nodes"], p["units"]) for p in r.nodes]
    [('input', 3, 3), ('grouping', 3, 3), ('co_placement', 3, 1), ('fusion', 1, 1)]
    >>> r.expand([1], [[], [0]])
    ([1, 1, 1], [[], [0, 1, 2]])
    """
    with _gc_paused():
        return _reduce(graph, cluster, options, cap_scale)


def _reduce(graph: Graph, cluster: Cluster, options: Options, cap_scale: float) -> Reduction:
    n = len(graph)
    phases: dict[str, float] = {}
    nodes: list[dict[str, Any]] = [{"phase": "input", "nodes": n, "units": n}]
    stats: dict[str, Any] = {}

    tick = time.perf_counter()
    units = colocation_units(graph, cluster, options.forward_only)
    phases["grouping"] = time.perf_counter() - tick
    nodes.append({"phase": "grouping", "nodes": n, "units": len(units)})

    cap = merge_cap(graph, cluster) * cap_scale
    if options.co_placement:
        tick = time.perf_counter()
        units = co_place(graph, cluster, units, cap)
        phases["co_placement"] = time.perf_counter() - tick
        nodes.append({"phase": "co_placement", "nodes": n, "units": len(units)})
        stats["merge_cap_bytes"] = cap

    if not options.fusion:
        return Reduction(graph, graph, units, None, nodes, None, stats, phases, cap_scale)

    tick = time.perf_counter()
    fusion = fuse(graph, cluster, units, cap=cap)
    phases["fusion"] = time.perf_counter() - tick
    nodes.append({"phase": "fusion", "nodes": len(fusion.graph), "units": len(fusion.units)})
    stats["fusion"] = fusion.stats
    return Reduction(graph, fusion.graph, fusion.units, fusion.members, nodes, fusion.node_of,
                     stats, phases, cap_scale)
