"""``place(..., objective="throughput")``: one placer on the unreduced graph's units, the plan
judged by the step-time simulator (its ``estimate``, as every plan) and by the throughput
model (``estimate.time_per_sample_us`` and ``estimate.device_load_us``).

The reduction pipeline is not used: co-placement and fusion merge along edges to shorten one
step, which is not what balances a pipeline, and the throughput placers already work on units.

Memory is the throughput model's (persistent bytes plus the activations kept for the
micro-batches in flight, :func:`baechi.throughput.throughput`). The throughput placers keep
to it; a step-time placer does not know it, so its plan is checked: one that does not fit is
replaced by :data:`THROUGHPUT_DEFAULT`'s (``stats.fallback`` says so), and when that finds none
the request fails with :class:`~baechi.errors.InfeasiblePlacement`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from baechi.algorithms import get_algorithm
from baechi.algorithms.base import Problem, Progress
from baechi.algorithms.throughput import meets_throughput_bound
from baechi.cluster import Cluster
from baechi.errors import InfeasiblePlacement, InvalidRequest
from baechi.graph import Graph
from baechi.grouping import colocation_units
from baechi.options import Options
from baechi.plan import GraphInfo, Plan, PlanRequest
from baechi.simulate import replay
from baechi.throughput import Throughput, throughput

#: What ``auto`` (and the default algorithm) runs for the throughput objective.
THROUGHPUT_DEFAULT = "throughput-cpsat"


def place_for_throughput(
    graph: Graph, cluster: Cluster, cluster_json: dict[str, Any], algorithm: str,
    options: Options, report: Progress, version: str,
) -> Plan:
    """Place ``graph`` for the throughput objective (see the module docstring)."""
    started = time.perf_counter()
    _refuse_step_time_options(options)
    name = THROUGHPUT_DEFAULT if algorithm == "auto" else algorithm
    units = colocation_units(graph, cluster, options.forward_only)
    deadline = started + options.time_limit_s
    problem = Problem.of(graph, cluster, units, time_limit_s=options.time_limit_s,
                         deadline=deadline, progress=report,
                         allow_single=options.allow_single)
    report("place", 0.0)
    why = None  # why the named algorithm's plan is not the answer
    try:
        assignment = get_algorithm(name, "throughput")(problem)
    except InfeasiblePlacement as exc:
        if name == THROUGHPUT_DEFAULT or not exc.details.get("deadline_reached"):
            raise
        why = f"{name} was still placing at the deadline (time_limit_s {options.time_limit_s:g})"
    else:
        verdict = throughput(graph, cluster, assignment.device_of, problem.cost)
        if not verdict.memory_ok:
            why = f"{name}'s plan {_overshoot(cluster, verdict)}"
    if why is not None:
        # the default keeps to the memory rule; past the deadline it returns its warm start
        rest = dataclasses.replace(problem, time_limit_s=deadline - time.perf_counter(),
                                   deadline=math.inf)
        try:
            assignment = get_algorithm(THROUGHPUT_DEFAULT, "throughput")(rest)
        except InfeasiblePlacement as exc:
            raise InfeasiblePlacement(f"{why}; {exc.message}", exc.details) from None
        verdict = throughput(graph, cluster, assignment.device_of, problem.cost)
        assert verdict.memory_ok, "the throughput placers keep to the memory rule"
        said = assignment.stats.get("fallback")
        assignment.stats["fallback"] = f"{why}; placed with {THROUGHPUT_DEFAULT}" + (
            f" ({said})" if said else "")
        name = THROUGHPUT_DEFAULT
    simulation = replay(graph, cluster, assignment.device_of, assignment.orders, problem.cost)
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
        "deadline_reached": time.perf_counter() > deadline,
        "phases": {"place": time.perf_counter() - started},
        "largest_op": graph.largest_op(),
        "placement_seconds": time.perf_counter() - started,
    }
    bound = stats.get("bound_us")
    if bound is not None and bound > verdict.time_per_sample_us * (1 + 1e-12):
        stats.update(bound_us=None, optimal=False,
                     optimal_note="the solver's bound is above this split's time per sample: "
                                  "nothing is proved")
    elif bound is not None:
        stats["optimal"] = meets_throughput_bound(verdict.time_per_sample_us, bound)
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


#: Options of the step-time objective that the throughput objective does not apply, and the
#: value that says what it does (it places the colocation units as they are, with no
#: reduction, portfolio or transfer-order pass).
STEP_TIME_ONLY = {"co_placement": False, "fusion": False, "portfolio": False,
                  "transfer_order": "fifo"}


def _refuse_step_time_options(options: Options) -> None:
    """Refuse an option set to what the throughput objective cannot do. Its defaults pass:
    the service fills every option in (a request's digest must not depend on how it was
    written), so a default cannot tell whether the user asked for it; they are documented as
    not applying to this objective."""
    for option, honoured in STEP_TIME_ONLY.items():
        value = getattr(options, option)
        if value != honoured and value != Options.model_fields[option].default:
            raise InvalidRequest(
                f"options.{option}: {getattr(options, option)!r} applies to objective "
                f"'step_time' only; the throughput objective places the colocation units as "
                f"they are (leave it out, or set it to {honoured!r})")


def _overshoot(cluster: Cluster, verdict: Throughput) -> str:
    """What a plan over memory needs on its most overfull device, in words."""
    over, device, used = max(
        (used - dev.memory_bytes, dev.name, used)
        for dev, used in zip(cluster.devices, verdict.memory_bytes, strict=True)
        if dev.memory_bytes is not None)
    return (f"needs {used} bytes on {device!r} ({over} over its limit) with the activations "
            "kept for the micro-batches in flight")


__all__ = ["THROUGHPUT_DEFAULT", "place_for_throughput"]
