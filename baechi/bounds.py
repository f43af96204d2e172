"""Lower bounds on the memory any plan needs, used to explain infeasibility up front."""

from __future__ import annotations

from baechi.costmodel import CostModel, instant
from baechi.graph import Graph
from baechi.grouping import Units


def running_bytes(graph: Graph, op: int, cost: CostModel | None = None) -> int:
    """Bytes that must be resident on ``op``'s device while it runs, whatever the plan.

    Its temp and output are allocated when it starts; each input tensor is there until it
    ends, as the producer's output or as a received copy (whichever is smaller counts). A
    zero-time op frees its inputs at the instant it allocates, so only its own bytes count
    (:meth:`CostModel.instant_somewhere <baechi.costmodel.CostModel.instant_somewhere>`;
    without ``cost``, the op's ``compute_us`` at speed 1 decides).

    Examples
    --------
    >>> from baechi import load_graph
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
    ...     {"name": "a", "compute_us": 1, "output_bytes": 100},
    ...     {"name": "b", "compute_us": 1, "output_bytes": 50, "temp_bytes": 7}],
    ...     "edges": [{"src": "a", "dst": "b", "bytes": 80}]})
    >>> running_bytes(g, 1)
    137
    """
    need = graph.temp_bytes[op] + graph.output_bytes[op]
    if cost.instant_somewhere(op) if cost is not None else instant(graph.compute_us[op]):
        return need
    inputs: dict[tuple[int, str], int] = {}
    for k in graph.in_edges[op]:
        if not graph.edge_control[k]:
            src = graph.edge_src[k]
            held = min(graph.edge_bytes[k], graph.output_bytes[src])
            key = (src, graph.edge_tensor[k])
            inputs[key] = max(inputs.get(key, 0), held)
    return need + sum(inputs.values())


def unit_floor(
    graph: Graph, units: Units, unit: int, cost: CostModel | None = None
) -> tuple[int, int]:
    """(bytes, op): what the unit's device must hold at least, and the op where it peaks.

    Every member's persistent bytes are resident all step, plus the running bytes of the
    member that needs most.
    """
    members = units.members[unit]
    persistent = sum(graph.persistent_bytes[op] for op in members)
    worst = max(members, key=lambda op: running_bytes(graph, op, cost))
    return persistent + running_bytes(graph, worst, cost), worst
