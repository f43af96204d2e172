"""The throughput objective (docs/format.md §10): a pipelined steady state, as in Tarnawski et al.
(NeurIPS 2020, "Efficient algorithms for device placement of DNN graph operators").

Many micro-batches stream through the devices; each device works on a different one at a
time, so the time per sample is the load of the busiest device. A device's load is

- the compute time of its ops on its kind (:class:`~baechi.costmodel.CostModel.op_us`);
- unless it is a host (``host: true``: host DRAM stages transfers, it pays nothing), the
  transfer time of every tensor it sends to another device, once per tensor whatever the
  number of receivers, and of every tensor it receives, once per tensor per receiving device.

A tensor is an edge's (source op, tensor name); its transfer time is the cost model's
(:meth:`~baechi.costmodel.CostModel.transfer_us`: the edge's measured ``transfer_us`` or the
pair's link), the largest over its edges when they differ.

Memory, 1F1B (PipeDream-Flush): a device must hold its ops' persistent bytes, and on a
training graph (some op has a ``forward_op`` or ``attrs.is_backward``) the activations it keeps
for backward ops, once per micro-batch in flight. Stages are the used devices in the order of
their first op in the canonical order; under 1F1B stage ``i`` of ``S`` has ``S - i``
micro-batches in flight. A kept activation is the ``output_bytes`` of a forward op with a
backward consumer.

Examples
--------
>>> from baechi import Cluster, load_graph
>>> g = load_graph({"format": "baechi.graph/v1",
...     "ops": [{"name": "a", "compute_us": 8}, {"name": "b", "compute_us": 5},
...             {"name": "c", "compute_us": 4}],
...     "edges": [{"src": "a", "dst": "b", "bytes": 0, "transfer_us": 2},
...               {"src": "a", "dst": "c", "bytes": 0, "transfer_us": 2}]})
>>> t = throughput(g, Cluster.uniform(3), [0, 1, 2])
>>> t.device_load_us, t.time_per_sample_us
([10.0, 7.0, 6.0], 10.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baechi.cluster import Cluster
from baechi.costmodel import CostModel
from baechi.graph import Graph
from baechi.memory import persistent_bytes_by

#: The request's objectives (docs/format.md §10); ``step_time`` is the default.
OBJECTIVES = ("step_time", "throughput")


@dataclass
class Throughput:
    """The throughput model's verdict on a placement (device indices)."""

    time_per_sample_us: float
    device_load_us: list[float]
    compute_us: list[float]
    communication_us: list[float]
    memory_bytes: list[int]
    memory_ok: bool

    def loads_by_name(self, cluster: Cluster) -> dict[str, float]:
        return {d.name: load for d, load in zip(cluster.devices, self.device_load_us,
                                                strict=True)}


def is_backward(graph: Graph, op: int) -> bool:
    """Whether ``op`` belongs to the backward pass: it names a ``forward_op`` or says
    ``attrs.is_backward``."""
    return graph.forward_op[op] >= 0 or bool(graph.attrs and graph.attrs[op].get("is_backward"))


def kept_activation_bytes(graph: Graph) -> list[int]:
    """Per op, the bytes a pipeline keeps per micro-batch in flight: the ``output_bytes`` of a
    forward op that a backward op consumes (0 otherwise, and everywhere on inference graphs)."""
    backward = [is_backward(graph, op) for op in range(len(graph))]
    kept = [0] * len(graph)
    for k in range(graph.num_edges):
        src = graph.edge_src[k]
        if not backward[src] and backward[graph.edge_dst[k]] and not graph.edge_control[k]:
            kept[src] = graph.output_bytes[src]
    return kept


def tensors(graph: Graph) -> dict[tuple[int, Any], list[int]]:
    """Each tensor, (source op, tensor name or ``None`` for control), to its edges."""
    out: dict[tuple[int, Any], list[int]] = {}
    for k in range(graph.num_edges):
        key = (graph.edge_src[k], None if graph.edge_control[k] else graph.edge_tensor[k])
        out.setdefault(key, []).append(k)
    return out


def stage_order(graph: Graph, device_of: list[int], n_devices: int) -> list[int]:
    """Used devices in the order of their first op in the canonical order (pipeline stages)."""
    seen = [False] * n_devices
    order = []
    for op in graph.topo:
        d = device_of[op]
        if not seen[d]:
            seen[d] = True
            order.append(d)
    return order


def throughput(
    graph: Graph, cluster: Cluster, device_of: list[int], cost: CostModel | None = None
) -> Throughput:
    """Loads, time per sample and memory of a placement under the throughput objective."""
    cost = cost or CostModel(graph, cluster)
    devices = cluster.devices
    n_dev = len(devices)
    compute = [0.0] * n_dev
    for op, d in enumerate(device_of):
        compute[d] += cost.op_us[d][op]
    comm = [0.0] * n_dev
    for (src, _), edges in tensors(graph).items():
        s = device_of[src]
        received: dict[int, float] = {}
        for k in edges:
            r = device_of[graph.edge_dst[k]]
            if r != s:
                us = cost.transfer_us(k, s, r)
                if us > received.get(r, -1.0):
                    received[r] = us
        if not received:
            continue
        if not devices[s].host:
            comm[s] += max(received.values())
        for r, us in received.items():
            if not devices[r].host:
                comm[r] += us
    loads = [c + m for c, m in zip(compute, comm, strict=True)]
    memory = _memory(graph, cluster, device_of)
    ok = all(dev.memory_bytes is None or used <= dev.memory_bytes
             for dev, used in zip(devices, memory, strict=True))
    return Throughput(max(loads, default=0.0), loads, compute, comm, memory, ok)


def _memory(graph: Graph, cluster: Cluster, device_of: list[int]) -> list[int]:
    n_dev = len(cluster.devices)
    persistent = persistent_bytes_by(graph, device_of, n_dev)
    kept_on = [0] * n_dev
    kept = kept_activation_bytes(graph)
    for op, d in enumerate(device_of):
        kept_on[d] += kept[op]
    order = stage_order(graph, device_of, n_dev)
    in_flight = [0] * n_dev
    for i, d in enumerate(order):
        in_flight[d] = len(order) - i
    return [p + a * f for p, a, f in zip(persistent, kept_on, in_flight, strict=True)]


def check_objective(value: Any) -> str:
    """The objective named by a request (``None`` → ``step_time``); :class:`InvalidRequest`
    otherwise."""
    from baechi.errors import InvalidRequest

    if value is None:
        return "step_time"
    if value not in OBJECTIVES:
        raise InvalidRequest(
            f"objective: unknown objective {value!r}; choose one of {', '.join(OBJECTIVES)}",
            {"field": "objective"})
    return str(value)


__all__ = ["OBJECTIVES", "Throughput", "check_objective", "kept_activation_bytes", "throughput"]
