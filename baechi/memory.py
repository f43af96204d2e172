"""Memory of sets of ops that holds whatever the plan: resident weights and the safe proxy
of what a set of ops needs by itself (docs/format.md §4 has the memory rule the simulator
applies; :func:`baechi.costmodel.running_bytes` adds what depends on the cost model).

A leaf module (it needs only the graph), so that the cost model, the reduction pipeline and
the placers all take these sums from one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from baechi.graph import Graph


def memory_proxy(graph: Graph, ops: Iterable[int]) -> int:
    """A safe upper bound of what ``ops`` need on a device by themselves, in bytes.

    Σ ``persistent_bytes`` + Σ ``output_bytes`` + max ``temp_bytes``: weights stay resident,
    at worst every output is alive at once (training keeps forward activations until the
    backward pass), and a device runs one op at a time so only one temp is held. Received
    copies of other ops' tensors are not included. :class:`MemoryProxy` keeps it for sets that
    merge.

    Examples
    --------
    >>> from baechi import load_graph
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
    ...     {"name": "a", "compute_us": 1, "output_bytes": 10, "temp_bytes": 7},
    ...     {"name": "b", "compute_us": 1, "persistent_bytes": 5, "temp_bytes": 3}]})
    >>> memory_proxy(g, [0, 1])
    22
    """
    resident, temp = 0, 0
    output, persistent, scratch = graph.output_bytes, graph.persistent_bytes, graph.temp_bytes
    for op in ops:
        resident += persistent[op] + output[op]
        if scratch[op] > temp:
            temp = scratch[op]
    return resident + temp


def persistent_bytes_by(graph: Graph, set_of: Sequence[int], count: int) -> list[int]:
    """Σ ``persistent_bytes`` of each set of ops (numbered ``0 .. count-1`` by ``set_of``):
    what the set holds on its device for the whole step, wherever and whenever its ops run.
    Per unit with ``units.unit_of``, per device with a plan's ``device_of``.

    Examples
    --------
    >>> from baechi import load_graph
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
    ...     {"name": "w", "compute_us": 1, "persistent_bytes": 5},
    ...     {"name": "x", "compute_us": 1},
    ...     {"name": "v", "compute_us": 1, "persistent_bytes": 7}]})
    >>> persistent_bytes_by(g, [0, 1, 0], 2)
    [12, 0]
    """
    held = [0] * count
    for op, i in enumerate(set_of):
        held[i] += graph.persistent_bytes[op]
    return held


class MemoryProxy:
    """:func:`memory_proxy` of sets that merge: ``resident[i]`` (Σ persistent + Σ output) and
    ``temp[i]`` (max temp) per set, the sets numbered by ``set_of`` (default: one op each).

    Examples
    --------
    >>> from baechi import load_graph
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
    ...     {"name": "a", "compute_us": 1, "output_bytes": 10, "temp_bytes": 7},
    ...     {"name": "b", "compute_us": 1, "persistent_bytes": 5, "temp_bytes": 3}]})
    >>> proxy = MemoryProxy(g)
    >>> proxy.of(0), proxy.merged(0, 1)
    (17, 22)
    >>> proxy.merge(1, 0); proxy.of(1)
    22
    """

    def __init__(self, graph: Graph, set_of: list[int] | None = None,
                 count: int | None = None) -> None:
        if set_of is None:
            self.resident = [p + o for p, o in zip(graph.persistent_bytes, graph.output_bytes,
                                                   strict=True)]
            self.temp = list(graph.temp_bytes)
            return
        k = count if count is not None else max(set_of, default=-1) + 1
        self.resident = [0] * k
        self.temp = [0] * k
        output, persistent, scratch = graph.output_bytes, graph.persistent_bytes, graph.temp_bytes
        for op, i in enumerate(set_of):
            self.resident[i] += persistent[op] + output[op]
            if scratch[op] > self.temp[i]:
                self.temp[i] = scratch[op]

    def of(self, i: int) -> int:
        """The proxy of set ``i``."""
        return self.resident[i] + self.temp[i]

    def merged(self, a: int, b: int) -> int:
        """The proxy sets ``a`` and ``b`` would have as one."""
        ta, tb = self.temp[a], self.temp[b]
        return self.resident[a] + self.resident[b] + (ta if ta > tb else tb)

    def merge(self, into: int, other: int) -> None:
        """Make set ``into`` hold ``other`` too."""
        self.resident[into] += self.resident[other]
        if self.temp[other] > self.temp[into]:
            self.temp[into] = self.temp[other]


__all__ = ["MemoryProxy", "memory_proxy", "persistent_bytes_by"]
