"""The cost model's facts (docs/format.md §4) in one place: what an op costs on a device, what a
message between two devices costs, which messages are the same message (caching), when an
op counts as instant, which devices a unit may use, the bytes an op holds while it runs, and
the memory proxy of a set of ops.

The simulator and every placer ask a :class:`CostModel` rather than computing times from the
graph and cluster themselves, so a rule changes in one place. Build it once per request: it
precomputes every op's time on every device and the link of every device pair.

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

import functools
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from baechi.cluster import Cluster
from baechi.errors import InfeasiblePlacement
from baechi.graph import Graph

if TYPE_CHECKING:
    from baechi.grouping import Units  # grouping imports this module

#: Ops shorter than this (µs) may end at the instant they start once added to a start time
#: (floating point), and then free their inputs before allocating: their inputs do not count.
INSTANT_US = 1e-6


def instant(us: float) -> bool:
    """The zero-time-op rule: whether an op taking ``us`` may end at the instant it starts."""
    return us < INSTANT_US


class CostModel:
    """Times of ops and messages for one graph on one cluster.

    Attributes
    ----------
    op_us : list of list of float
        ``op_us[d][op]``: the compute time of ``op`` on device ``d``; ``math.inf`` where the
        op cannot run on ``d``'s kind (``compute_us_by_kind`` null).
    fastest_us : list of float
        Each op's time on the device where it is fastest (the priority of list schedulers).
    sequential : bool
        Whether each device has one channel shared by its sends and receives.
    """

    def __init__(self, graph: Graph, cluster: Cluster) -> None:
        self.graph = graph
        self.cluster = cluster
        network = cluster.network
        self.sequential = network.mode == "sequential"
        self._latency_us = network.latency_us
        self._us_per_byte = network.us_per_byte
        self.op_us: list[list[float]] = [
            _op_times(graph, device.kind, device.speed) for device in cluster.devices
        ]
        kinds = {device.kind for device in cluster.devices}
        #: Whether some op's ``compute_us_by_kind`` names a kind of this cluster (else every
        #: time is ``compute_us / speed``, as before docs/format.md §10).
        self.kinds_matter = graph.compute_us_by_kind is not None and any(
            kind in kinds for by_kind in graph.compute_us_by_kind for kind in by_kind)
        self.fastest_us: list[float] = [
            min(times) for times in zip(*self.op_us, strict=True)
        ] if self.op_us else []
        # per-pair links (docs/format.md §10): (latency, µs per byte) of each device pair, or None
        # when every pair uses the default link
        self._pair: list[list[tuple[float, float]]] | None = None
        if network.links:
            index = cluster.index()
            default = (network.latency_us, network.us_per_byte)
            n_dev = len(cluster.devices)
            self._pair = [[default] * n_dev for _ in range(n_dev)]
            for link in network.links:
                a, b = index[link.devices[0]], index[link.devices[1]]
                own = network.link(link)
                self._pair[a][b] = self._pair[b][a] = (own.latency_us, own.us_per_byte)
        #: the distinct (latency, µs per byte) of the links between two different devices
        self._links = {link for a, row in enumerate(self._pair or []) for b, link in enumerate(row)
                       if a != b}
        self._measured = graph.edge_transfer_us
        #: The single-device run, once computed (:func:`baechi.simulate.single_device_run_of`).
        self.single_run: tuple[float, int] | None = None
        self._lower_bound: float | None = None

    # ------------------------------------------------------------------ messages
    def message_bytes(self, edge: int) -> int:
        """Bytes a transfer of ``edge`` carries: the edge's bytes, 0 for a control edge."""
        return 0 if self.graph.edge_control[edge] else self.graph.edge_bytes[edge]

    def transfer_us(self, edge: int, src_device: int, dst_device: int) -> float:
        """Time to send ``edge``'s message from ``src_device`` to ``dst_device`` (≠): the
        edge's measured ``transfer_us`` if it has one, else the formula of the pair's link
        (:meth:`baechi.cluster.Network.transfer_us`)."""
        if self._measured is not None and self._measured[edge] is not None:
            return self._measured[edge]
        if self._pair is None:
            return self._latency_us + self.message_bytes(edge) * self._us_per_byte
        latency, per_byte = self._pair[src_device][dst_device]
        return latency + self.message_bytes(edge) * per_byte

    def fastest_transfer_us(self, edge: int) -> float:
        """The least time a transfer of ``edge`` between two devices can take: its measured
        time, else its message on the cluster's fastest link. What a plan pays at least
        where the edge crosses devices (:mod:`baechi.bounds`)."""
        if self._pair is None or (self._measured is not None and self._measured[edge] is not None):
            return self.nominal_transfer_us(edge)  # one link, or a measured time
        nbytes = self.message_bytes(edge)
        return min(latency + nbytes * per_byte for latency, per_byte in self._links)

    def nominal_transfer_us(self, edge: int) -> float:
        """``edge``'s transfer time before devices are known: the measured time, else the
        default link's. For models that cost an edge once (m-SCT's LP)."""
        if self._measured is not None and self._measured[edge] is not None:
            return self._measured[edge]
        return self._latency_us + self.message_bytes(edge) * self._us_per_byte

    def transfer_key(self, edge: int, dst_device: int) -> tuple[Any, ...]:
        """The cache key of ``edge``'s message to ``dst_device``: a message with the same key
        is sent once and reused by every consumer there (docs/format.md §4, tensor identity).
        ``key[1]`` is the destination device."""
        g = self.graph
        if g.edge_control[edge]:
            return (g.edge_src[edge], dst_device, None, 0)
        return (g.edge_src[edge], dst_device, g.edge_tensor[edge], g.edge_bytes[edge])

    # ------------------------------------------------------------------ ops
    def is_instant(self, op: int, device: int) -> bool:
        """Whether ``op`` may end at the instant it starts on ``device`` (see
        :data:`INSTANT_US`): it then frees its inputs before it allocates."""
        return instant(self.op_us[device][op])

    def instant_somewhere(self, op: int) -> bool:
        """Whether ``op`` is instant on some device (a plan-independent memory bound may then
        only count its own bytes)."""
        return instant(self.fastest_us[op])

    def can_run(self, op: int, device: int) -> bool:
        """Whether ``op`` may be placed on ``device`` (its kind does not forbid it)."""
        return not math.isinf(self.op_us[device][op])

    def devices_for(self, ops: Iterable[int]) -> list[int]:
        """The devices where every op of ``ops`` can run, in cluster order."""
        ops = list(ops)
        return [d for d, us in enumerate(self.op_us) if all(us[op] != math.inf for op in ops)]

    def unit_devices(self, units: Units) -> list[list[int]]:
        """Per unit, the devices it may go to: its pin, else every device where all its
        members can run (:meth:`devices_for`), in cluster order; empty where none can."""
        return [[pin] if pin >= 0 else self.devices_for(members)
                for pin, members in zip(units.pin, units.members, strict=True)]

    @functools.cached_property
    def same_op_times(self) -> bool:
        """Whether every op takes the same time on every device (no speeds or kinds tell
        the devices apart).

        Examples
        --------
        >>> from baechi import Cluster, load_graph
        >>> g = load_graph({"format": "baechi.graph/v1",
        ...                 "ops": [{"name": "a", "compute_us": 10}]})
        >>> def same(*devices):
        ...     return CostModel(g, Cluster.parse({"devices": list(devices)})).same_op_times
        >>> same({"name": "x"}, {"name": "y", "kind": "tpu"})  # no time names a kind
        True
        >>> same({"name": "x"}, {"name": "y", "speed": 2})
        False
        """
        return all(times == self.op_us[0] for times in self.op_us)

    @functools.cached_property
    def op_running_bytes(self) -> list[int]:
        """Every op's :func:`running_bytes` under this cost model (its zero-time rule),
        computed once: the memory checks and bounds of a request each read it."""
        return [running_bytes(self.graph, op, self) for op in range(len(self.graph))]

    def check_runnable(self) -> None:
        """Raise :class:`~baechi.errors.InfeasiblePlacement` naming the first op that can run
        on no device of the cluster (``compute_us_by_kind`` null for every kind there)."""
        for op, us in enumerate(self.fastest_us):
            if us == math.inf:
                kinds = sorted({d.kind for d in self.cluster.devices})
                name = self.graph.names[op]
                raise InfeasiblePlacement(
                    f"op {name!r}.compute_us_by_kind: the op cannot run on any device of the "
                    f"cluster (null for kind{'s' if len(kinds) > 1 else ''} "
                    f"{', '.join(map(repr, kinds))})",
                    {"op": name, "field": "compute_us_by_kind"},
                )

    def single_device(self) -> int:
        """The device of the single-device plan: where every op can run and the sum of op
        times is least (the fastest device when no op has ``compute_us_by_kind``); -1 when no
        device can run every op."""
        if not self.kinds_matter:
            return self.cluster.fastest()
        best, best_total = -1, math.inf
        for d, us in enumerate(self.op_us):
            total = math.fsum(us)
            if total < best_total:
                best, best_total = d, total
        return best

    def lower_bound_us(self) -> float:
        """A lower bound of any plan's step time: the longest chain of ops, each at its
        fastest, and the work spread evenly (Σ compute / Σ speed; with kinds, Σ fastest
        time / devices). Computed once."""
        if self._lower_bound is None:
            self._lower_bound = self._compute_lower_bound()
        return self._lower_bound

    def _compute_lower_bound(self) -> float:
        graph = self.graph
        fastest = self.fastest_us
        longest = graph.longest_chain_us(fastest)
        devices = self.cluster.devices
        if not self.kinds_matter:
            spread = float(sum(graph.compute_us)) / sum(d.speed for d in devices)
        else:
            spread = math.fsum(fastest) / len(devices)
        return max(longest, spread)

def _op_times(graph: Graph, kind: str, speed: float) -> list[float]:
    """Every op's time on a device of ``kind`` and ``speed``: ``compute_us_by_kind[kind]``
    where given (``inf`` for null), else ``compute_us / speed``."""
    times = [c / speed for c in graph.compute_us]
    if graph.compute_us_by_kind is not None:
        for op, by_kind in enumerate(graph.compute_us_by_kind):
            if kind in by_kind:
                us = by_kind[kind]
                times[op] = math.inf if us is None else us
    return times


def running_bytes(graph: Graph, op: int, cost: CostModel) -> int:
    """Bytes that must be resident on ``op``'s device while it runs, whatever the plan.

    Its temp and output are allocated when it starts; each input tensor is there until it
    ends, as the producer's output or as a received copy (whichever is smaller counts). A
    zero-time op frees its inputs at the instant it allocates, so only its own bytes count
    (:meth:`CostModel.instant_somewhere`: zero time on some device of the cluster, the rule
    the simulator applies per device). :attr:`CostModel.op_running_bytes` holds every op's.

    Examples
    --------
    >>> from baechi import Cluster, load_graph
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
    ...     {"name": "a", "compute_us": 1, "output_bytes": 100},
    ...     {"name": "b", "compute_us": 1, "output_bytes": 50, "temp_bytes": 7}],
    ...     "edges": [{"src": "a", "dst": "b", "bytes": 80}]})
    >>> running_bytes(g, 1, CostModel(g, Cluster.uniform(1)))
    137
    """
    need = graph.temp_bytes[op] + graph.output_bytes[op]
    if cost.instant_somewhere(op):
        return need
    inputs: dict[tuple[int, str], int] = {}
    for k in graph.in_edges[op]:
        if not graph.edge_control[k]:
            src = graph.edge_src[k]
            held = min(graph.edge_bytes[k], graph.output_bytes[src])
            key = (src, graph.edge_tensor[k])
            inputs[key] = max(inputs.get(key, 0), held)
    return need + sum(inputs.values())


__all__ = ["INSTANT_US", "CostModel", "instant", "running_bytes"]
