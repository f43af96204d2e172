"""What every placement algorithm takes and returns."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from baechi.cluster import Cluster
from baechi.costmodel import CostModel
from baechi.errors import InfeasiblePlacement, InvalidRequest
from baechi.graph import Graph
from baechi.grouping import Units

#: ``progress(phase, fraction)``: called a few times per phase, fraction in [0, 1].
Progress = Callable[[str, float], None]


def no_progress(phase: str, fraction: float) -> None:
    """The progress callback used when the caller gives none."""


@dataclass
class Problem:
    """A graph to place, its units (placed as one), the cluster and per-device budgets.

    ``budget[d]`` is the memory the placer may plan to use on device ``d`` (its limit, or
    less when a first plan overshot under the simulator); ``math.inf`` means unlimited.
    ``cost`` is the graph's :class:`~baechi.costmodel.CostModel` on the cluster (built when
    not given): every time an algorithm uses comes from it.
    """

    graph: Graph
    cluster: Cluster
    units: Units
    budget: list[float]
    #: A :func:`time.perf_counter` value after which a placer stops (``math.inf``: never):
    #: with a plan if it has one, else raising :class:`~baechi.errors.InfeasiblePlacement`
    #: with ``details["deadline_reached"]``. Solvers also get ``time_limit_s``.
    deadline: float = math.inf
    time_limit_s: float = 60.0
    progress: Progress = no_progress
    #: A plan to start from (``exact`` warm-starts from it and never returns a slower one).
    hint: Assignment | None = None
    #: Solve a relaxation that finds fast plans sooner: ``exact`` leaves the channels of
    #: sequential mode and, under memory limits, the received copies out of its model (its
    #: bound still holds; its plans are replayed).
    relaxed: bool = False
    #: Whether a plan may put every unit on one device (``options.allow_single``; the
    #: throughput placers keep to it, the step-time request checks it after placing).
    allow_single: bool = True
    #: What a placer computed on this graph and units that a placement of the same problem
    #: with other budgets may reuse (m-cut's walks: :func:`~baechi.algorithms.cut.place_cut`),
    #: by the placer's key. ``dataclasses.replace`` keeps it, as the memory retries do, and
    #: a request's problems of one reduction share it (:meth:`baechi.placing.Request.problem`).
    memo: dict[str, Any] = field(default_factory=dict)
    cost: CostModel = None  # type: ignore[assignment]  # built in __post_init__

    def __post_init__(self) -> None:
        if self.cost is None:
            self.cost = CostModel(self.graph, self.cluster)
        self._allowed = allowed_devices(self.graph, self.cluster, self.units, self.cost)

    def devices_for(self, unit: int) -> Sequence[int]:
        """The devices ``unit`` may go to: its pin, else every device where all its ops can
        run (``compute_us_by_kind``), in cluster order; never empty."""
        pin = self.units.pin[unit]
        if pin >= 0:
            return (pin,)
        if self._allowed is None:
            return range(len(self.cluster.devices))
        return self._allowed[unit]

    @classmethod
    def of(cls, graph: Graph, cluster: Cluster, units: Units, **kwargs: Any) -> Problem:
        budget = [math.inf if d.memory_bytes is None else float(d.memory_bytes)
                  for d in cluster.devices]
        return cls(graph, cluster, units, budget, **kwargs)


@dataclass
class Assignment:
    """A device per op and the order of ops on each device (op and device indices).

    ``transfer_order`` (optional): the channel order the placer scheduled its messages in,
    per device the message keys of :meth:`~baechi.costmodel.CostModel.transfer_key` in
    booking order (:func:`baechi.simulate.replay`'s ``transfer_order``). The transfer-order
    post-pass tries it first; it is dropped when the placer saw a reduced graph.
    """

    device_of: list[int]
    orders: list[list[int]]
    stats: dict[str, Any] = field(default_factory=dict)
    transfer_order: list[list[tuple[Any, ...]]] | None = None


Algorithm = Callable[[Problem], Assignment]


def allowed_devices(
    graph: Graph, cluster: Cluster, units: Units, cost: CostModel
) -> list[list[int]] | None:
    """Per unit, the devices where every member can run (``None``: every device, no op has
    ``compute_us_by_kind``). Raises when a unit can run nowhere or is pinned where it cannot.
    """
    if not cost.kinds_matter:
        return None
    cost.check_runnable()
    allowed = []
    names = [d.name for d in cluster.devices]
    for unit, members in enumerate(units.members):
        devices = cost.devices_for(members)
        pin = units.pin[unit]
        if pin >= 0 and pin not in devices:
            op = next(op for op in members if not cost.can_run(op, pin))
            raise InvalidRequest(
                f"op {graph.names[op]!r}: must be on {names[pin]!r} (pinned, or sharing a "
                f"device with a pinned op) but cannot run on its kind "
                f"{cluster.devices[pin].kind!r} (compute_us_by_kind)",
                {"op": graph.names[op], "field": "compute_us_by_kind"},
            )
        if not devices:
            first = members[0]
            raise InfeasiblePlacement(
                f"op {graph.names[first]!r} and the {len(members) - 1} ops that must share its "
                "device (colocation, forward pairs) have no device kind that runs them all "
                "(compute_us_by_kind)",
                {"op": graph.names[first], "field": "compute_us_by_kind"},
            )
        allowed.append(devices)
    return allowed
