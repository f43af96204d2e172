"""What every placement algorithm takes and returns."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from baechi.cluster import Cluster
from baechi.costmodel import CostModel
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
    time_limit_s: float = 60.0
    progress: Progress = no_progress
    cost: CostModel = None  # type: ignore[assignment]  # built in __post_init__

    def __post_init__(self) -> None:
        if self.cost is None:
            self.cost = CostModel(self.graph, self.cluster)

    @classmethod
    def of(cls, graph: Graph, cluster: Cluster, units: Units, **kwargs: Any) -> Problem:
        budget = [math.inf if d.memory_bytes is None else float(d.memory_bytes)
                  for d in cluster.devices]
        return cls(graph, cluster, units, budget, **kwargs)


@dataclass
class Assignment:
    """A device per op and the order of ops on each device (op and device indices)."""

    device_of: list[int]
    orders: list[list[int]]
    stats: dict[str, Any] = field(default_factory=dict)


Algorithm = Callable[[Problem], Assignment]
