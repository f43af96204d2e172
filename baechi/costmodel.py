"""The cost model's facts (DESIGN §4) in one place: what an op costs on a device, what a
message between two devices costs, and which messages are the same message (caching).

The simulator and every placer ask a :class:`CostModel` rather than computing times from the
graph and cluster themselves, so a rule changes in one place. Build it once per request: it
precomputes every op's time on every device.

Examples
--------
>>> from baechi import Cluster, load_graph
>>> g = load_graph({"format": "baechi.graph/v1",
...     "ops": [{"name": "a", "compute_us": 8}, {"name": "b", "compute_us": 2}],
...     "edges": [{"src": "a", "dst": "b", "bytes": 1000}]})
>>> cm = CostModel(g, Cluster.uniform(2, latency_us=10, bandwidth_gbps=1))
>>> cm.op_us[1][0], cm.transfer_us(0, 0, 1), cm.transfer_key(0, 1)
(8.0, 11.0, (0, 1, 'a', 1000))
"""

from __future__ import annotations

from typing import Any

from baechi.cluster import Cluster
from baechi.graph import Graph

#: Ops shorter than this (µs) may end at the instant they start once added to a start time
#: (floating point), and then free their inputs before allocating: their inputs do not count.
INSTANT_US = 1e-6


class CostModel:
    """Times of ops and messages for one graph on one cluster.

    Attributes
    ----------
    op_us : list of list of float
        ``op_us[d][op]``: the compute time of ``op`` on device ``d``.
    sequential : bool
        Whether each device has one channel shared by its sends and receives.
    """

    def __init__(self, graph: Graph, cluster: Cluster) -> None:
        self.graph = graph
        self.cluster = cluster
        network = cluster.network
        self.sequential = network.mode == "sequential"
        self._latency_us = network.latency_us
        self._us_per_byte = 1.0 / (network.bandwidth_gbps * 1000.0)
        self.op_us: list[list[float]] = [
            [c / device.speed for c in graph.compute_us] for device in cluster.devices
        ]

    def message_bytes(self, edge: int) -> int:
        """Bytes a transfer of ``edge`` carries: the edge's bytes, 0 for a control edge."""
        return 0 if self.graph.edge_control[edge] else self.graph.edge_bytes[edge]

    def transfer_us(self, edge: int, src_device: int, dst_device: int) -> float:
        """Time to send ``edge``'s message from ``src_device`` to ``dst_device`` (≠)."""
        return self._latency_us + self.message_bytes(edge) * self._us_per_byte

    def transfer_key(self, edge: int, dst_device: int) -> tuple[Any, ...]:
        """The cache key of ``edge``'s message to ``dst_device``: a message with the same key
        is sent once and reused by every consumer there (DESIGN §4, tensor identity)."""
        g = self.graph
        if g.edge_control[edge]:
            return (g.edge_src[edge], dst_device, None, 0)
        return (g.edge_src[edge], dst_device, g.edge_tensor[edge], g.edge_bytes[edge])

    def is_instant(self, op: int, device: int) -> bool:
        """Whether ``op`` may end at the instant it starts on ``device`` (see
        :data:`INSTANT_US`): it then frees its inputs before it allocates."""
        return self.op_us[device][op] < INSTANT_US


__all__ = ["INSTANT_US", "CostModel"]
