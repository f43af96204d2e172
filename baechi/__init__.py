"""Baechi: placement of ML training graphs on memory-limited devices.

>>> import baechi
>>> graph = baechi.load_graph({"format": "baechi.graph/v1",
...                            "ops": [{"name": "a", "compute_us": 3}]})
>>> plan = baechi.place(graph, {"devices": {"count": 2, "memory_bytes": "1GiB"}})
>>> plan.placement, plan.estimate.step_time_us
({'a': '/GPU:0'}, 3.0)
"""

from typing import TYPE_CHECKING, Any

from baechi._version import __version__
from baechi.cluster import Cluster, Device, Network, parse_size
from baechi.errors import (
    InfeasiblePlacement,
    InvalidCluster,
    InvalidGraph,
    InvalidPlan,
    InvalidRequest,
    PlacementError,
)
from baechi.graph import Graph, load_graph
from baechi.options import Options
from baechi.plan import Estimate, Plan
from baechi.simulate import Simulation, simulate, simulate_plan

if TYPE_CHECKING:
    from baechi.api import place


def __getattr__(name: str) -> Any:
    # ``place`` loads every placer: only on first use, so that importing one engine module
    # (``baechi.pipeline``, the service's schema) stays light.
    if name == "place":
        from baechi.api import place

        return place
    raise AttributeError(f"module 'baechi' has no attribute {name!r}")

__all__ = [
    "Cluster",
    "Device",
    "Estimate",
    "Graph",
    "InfeasiblePlacement",
    "InvalidCluster",
    "InvalidGraph",
    "InvalidPlan",
    "InvalidRequest",
    "Network",
    "Options",
    "PlacementError",
    "Plan",
    "Simulation",
    "__version__",
    "load_graph",
    "parse_size",
    "place",
    "simulate",
    "simulate_plan",
]
