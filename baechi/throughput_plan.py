"""``place(..., objective="throughput")``: one placer on the unreduced graph's units, the plan
judged by the step-time simulator (its ``estimate``, as every plan) and by the throughput
model (``estimate.time_per_sample_us`` and ``estimate.device_load_us``).

The reduction pipeline is not used: co-placement and fusion merge along edges to shorten one
step, which is not what balances a pipeline, and the throughput placers already work on units.
"""

from __future__ import annotations

import time
from typing import Any

from baechi.algorithms import get_algorithm
from baechi.algorithms.base import Problem, Progress
from baechi.cluster import Cluster
from baechi.graph import Graph
from baechi.grouping import colocation_units
from baechi.options import Options
from baechi.plan import GraphInfo, Plan, PlanRequest
from baechi.simulate import replay
from baechi.throughput import throughput

#: What ``auto`` (and the default algorithm) runs for the throughput objective.
THROUGHPUT_DEFAULT = "throughput-cpsat"


def place_for_throughput(
    graph: Graph, cluster: Cluster, cluster_json: dict[str, Any], algorithm: str,
    options: Options, report: Progress, version: str,
) -> Plan:
    """Place ``graph`` for the throughput objective (see the module docstring)."""
    started = time.perf_counter()
    name = THROUGHPUT_DEFAULT if algorithm == "auto" else algorithm
    units = colocation_units(graph, cluster, options.forward_only)
    problem = Problem.of(graph, cluster, units, time_limit_s=options.time_limit_s,
                         progress=report)
    report("place", 0.0)
    assignment = get_algorithm(name, "throughput")(problem)
    simulation = replay(graph, cluster, assignment.device_of, assignment.orders, problem.cost)
    verdict = throughput(graph, cluster, assignment.device_of, problem.cost)
    estimate = simulation.estimate.model_copy(update={
        "time_per_sample_us": verdict.time_per_sample_us,
        "device_load_us": verdict.loads_by_name(cluster),
    })
    names = [d.name for d in cluster.devices]
    stats = {
        **assignment.stats,
        "algorithm_run": name,
        "throughput_memory_bytes": dict(zip(names, verdict.memory_bytes, strict=True)),
        "throughput_memory_ok": verdict.memory_ok,
        "placement_seconds": time.perf_counter() - started,
    }
    report("done", 1.0)
    return Plan(
        graph=GraphInfo(name=graph.name, sha256=graph.sha256, ops=len(graph)),
        request=PlanRequest(algorithm=algorithm, cluster=cluster_json,
                            options=options.model_dump(), objective="throughput"),
        placement={graph.names[op]: names[d] for op, d in enumerate(assignment.device_of)},
        order={names[d]: [graph.names[op] for op in ops]
               for d, ops in enumerate(assignment.orders)},
        estimate=estimate,
        stats=stats,
        engine={"version": version},
    )


__all__ = ["THROUGHPUT_DEFAULT", "place_for_throughput"]
