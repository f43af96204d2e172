"""``place``: the whole job, from graph and cluster to a simulated plan (DESIGN §6).

Steps: reject requests no plan can fit (memory floors, :mod:`baechi.bounds`), build units
(colocation, forward pairs, pins), reduce the graph (co-placement, fusion), place the reduced
graph, expand to every op, derive each device's order, simulate. When the simulated peak
exceeds a device's memory, the placer runs again with that device's budget lowered, a few
times; then the unreduced graph and m-fill are tried before :class:`InfeasiblePlacement`.
With ``portfolio`` the unreduced graph and m-fill are tried anyway and the fastest plan kept;
with ``allow_single`` a faster single-device plan replaces the result.
"""

from __future__ import annotations

import math
import time
from typing import Any

from baechi import __version__
from baechi.algorithms import DEFAULT_ALGORITHM, get_algorithm
from baechi.algorithms.base import Problem, Progress, no_progress
from baechi.bounds import unit_floor
from baechi.cluster import Cluster
from baechi.errors import InfeasiblePlacement
from baechi.graph import Graph, load_graph
from baechi.grouping import Units, colocation_units
from baechi.options import Options
from baechi.pipeline import Reduction, reduce_graph
from baechi.plan import GraphInfo, Plan, PlanRequest
from baechi.simulate import Simulation, replay, single_device_run

#: How many times the placer is re-run with tighter budgets after a plan overshoots memory.
MEMORY_RETRIES = 4


def place(
    graph: Graph | dict[str, Any] | str,
    cluster: Cluster | dict[str, Any],
    algorithm: str = DEFAULT_ALGORITHM,
    options: Options | dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> Plan:
    """Place ``graph`` on ``cluster`` and return the simulated plan.

    Parameters
    ----------
    graph : Graph, dict, or path
        A ``baechi.graph/v1`` document (see :func:`baechi.load_graph`).
    cluster : Cluster or dict
        Devices and network (DESIGN §3).
    algorithm : str
        A name of :data:`baechi.algorithms.ALGORITHMS`: ``single``, ``m-topo``, ``m-etf``,
        ``m-sct`` or ``m-fill``.
    options : Options or dict, optional
        Pipeline switches and time limit; every step on by default.
    progress : callable, optional
        ``progress(phase, fraction)``, called a few times per phase.

    Raises
    ------
    InvalidGraph, InvalidCluster, InvalidRequest
        Bad input, naming the op or field.
    InfeasiblePlacement
        No plan within the devices' memory was found.

    Examples
    --------
    >>> g = {"format": "baechi.graph/v1",
    ...      "ops": [{"name": "a", "compute_us": 5}, {"name": "b", "compute_us": 5}],
    ...      "edges": [{"src": "a", "dst": "b", "bytes": 0}]}
    >>> place(g, {"devices": {"count": 2}}, "m-etf").estimate.step_time_us
    10.0
    """
    started = time.perf_counter()
    report = progress or no_progress
    cluster_json = cluster.to_json() if isinstance(cluster, Cluster) else cluster
    cluster = Cluster.parse(cluster)
    options = Options.parse(options)
    get_algorithm(algorithm)  # an unknown name fails before any work
    report("validate", 0.0)
    graph = load_graph(graph)
    phases: dict[str, float] = {"validate": time.perf_counter() - started}

    _check_units_fit(graph, cluster, colocation_units(graph, cluster, options.forward_only))
    stats: dict[str, Any] = {"memory_retries": 0}
    reduced = options.co_placement or options.fusion
    # When memory defeats the request, fall back to what gives the placer more freedom (the
    # unreduced graph), then to the memory-first placer; say so in the plan's stats.
    attempts = [(algorithm, options, "")]
    if reduced:
        attempts.append((algorithm, options.without_pipeline(),
                         "the reduced graph did not fit in memory; placed the unreduced graph"))
    if algorithm not in ("single", "m-fill"):
        attempts.append(("m-fill", options.without_pipeline(),
                         f"{algorithm} found no plan within memory; placed with m-fill "
                         "(topological segments, each device filled to its memory)"))
    first_error: InfeasiblePlacement | None = None
    for name, attempt_options, note in attempts:
        try:
            reduction, simulation = _place_reduced(
                graph, cluster, name, attempt_options, report, phases, stats)
        except InfeasiblePlacement as exc:
            first_error = first_error or exc
            continue
        if note:
            stats["fallback"] = note
        break
    else:
        assert first_error is not None
        if len(attempts) > 1:
            first_error.message += " (no fallback found one either)"
            first_error.args = (first_error.message,)
        raise first_error
    if options.portfolio and "fallback" not in stats:
        reduction, simulation = _portfolio(
            graph, cluster, algorithm, options, report, phases, stats, reduction, simulation)
    stats["nodes"] = reduction.nodes
    stats["reduction"] = reduction.stats
    if algorithm != "single" and options.allow_single:
        simulation = _prefer_single(graph, cluster, options, simulation, stats)
    stats["placement_seconds"] = time.perf_counter() - started
    stats["phases"] = phases
    stats["nodes_placed"] = reduction.nodes[-1]["nodes"] if reduction.nodes else len(graph)
    report("done", 1.0)
    return _plan(graph, cluster, cluster_json, algorithm, options, simulation, stats)


def _place_reduced(
    graph: Graph, cluster: Cluster, algorithm: str, options: Options, report: Progress,
    phases: dict[str, float], stats: dict[str, Any],
) -> tuple[Reduction, Simulation]:
    """Reduce, place and simulate; re-place with tighter budgets while memory overshoots."""
    reduction = reduce_graph(graph, cluster, options, phases)
    problem = Problem.of(
        reduction.graph, cluster, reduction.units,
        time_limit_s=options.time_limit_s, progress=report,
    )
    place_fn = get_algorithm(algorithm)
    for attempt in range(MEMORY_RETRIES + 1):
        tick = time.perf_counter()
        assignment = place_fn(problem)
        phases["place"] = phases.get("place", 0.0) + time.perf_counter() - tick
        tick = time.perf_counter()
        device_of, orders = reduction.expand(assignment)
        simulation = replay(graph, cluster, device_of, orders)
        phases["simulate"] = phases.get("simulate", 0.0) + time.perf_counter() - tick
        over = _overshoot(simulation, cluster)
        if not over:
            stats.update(assignment.stats)
            return reduction, simulation
        if attempt == MEMORY_RETRIES:
            _raise_over_limit(graph, simulation, cluster, over, algorithm)
        stats["memory_retries"] += 1
        for d, excess in over.items():
            # the placer's memory model can be off by more than the overshoot it was told
            limit = cluster.devices[d].memory_bytes or 0
            problem.budget[d] -= max(excess * 1.05, 0.02 * limit)
        report("place", 0.0)
    raise AssertionError("unreachable")


def _portfolio(
    graph: Graph, cluster: Cluster, algorithm: str, options: Options, report: Progress,
    phases: dict[str, float], stats: dict[str, Any], reduction: Reduction,
    simulation: Simulation,
) -> tuple[Reduction, Simulation]:
    """Also place the unreduced graph, and with m-fill; keep the plan predicted fastest.

    Fused nodes are all-or-nothing in the placer's timing, which costs on graphs with much
    parallelism inside them (NASNet); under tight memory, m-fill's segments often beat the
    greedy schedulers' many transfers (gnmt_baechi at 768 MiB: 118.7 ms against m-ETF's 139.1).
    """
    unreduced = options.without_pipeline()
    candidates = [("unreduced", algorithm, unreduced)]
    if algorithm != "m-fill":
        candidates.append(("m-fill", "m-fill", unreduced))
    best = ("reduced", reduction, simulation, stats.copy())
    times = {"reduced": simulation.estimate.step_time_us}
    for label, name, candidate_options in candidates:
        candidate_stats: dict[str, Any] = {"memory_retries": 0}
        try:
            found = _place_reduced(graph, cluster, name, candidate_options, report, phases,
                                   candidate_stats)
        except InfeasiblePlacement:
            continue
        times[label] = found[1].estimate.step_time_us
        if times[label] < best[2].estimate.step_time_us:
            best = (label, *found, candidate_stats)
    label, reduction, simulation, chosen_stats = best
    stats.update(chosen_stats)
    stats["portfolio_step_times_us"] = times
    stats["portfolio_choice"] = label
    return reduction, simulation


def _overshoot(simulation: Simulation, cluster: Cluster) -> dict[int, int]:
    """Device index → bytes over its limit, for devices whose simulated peak exceeds it."""
    over = {}
    for d, device in enumerate(cluster.devices):
        peak = simulation.memory[d].peak
        if device.memory_bytes is not None and peak > device.memory_bytes:
            over[d] = peak - device.memory_bytes
    return over


def _graph_needs(graph: Graph, cluster: Cluster) -> dict[str, int]:
    """What the whole graph needs: its single-device peak and its persistent bytes."""
    peak = single_device_run(graph, cluster)[1]
    return {"graph_needs_bytes": peak, "graph_persistent_bytes": sum(graph.persistent_bytes)}


def _check_units_fit(graph: Graph, cluster: Cluster, units: Units) -> None:
    """Fail fast, naming the op, when a unit cannot fit on any device it may use
    (:func:`~baechi.bounds.unit_floor`: no plan can use less on the unit's device)."""
    limits = [math.inf if d.memory_bytes is None else d.memory_bytes for d in cluster.devices]
    largest = max(limits)
    for unit, ops in enumerate(units.members):
        pin = units.pin[unit]
        room = limits[pin] if pin >= 0 else largest
        if math.isinf(room):
            continue
        need, worst = unit_floor(graph, units, unit)
        if need > room:
            name = graph.names[worst]
            what = (f"op {name!r}" if len(ops) == 1 else
                    f"the group of {len(ops)} ops with {name!r} (colocation/forward pairs)")
            where = f"device {cluster.devices[pin].name!r}" if pin >= 0 else "the largest device"
            raise InfeasiblePlacement(
                f"{what} needs {need} bytes while {name!r} runs (persistent bytes, its inputs, "
                f"temp and output) but {where} holds {room}: {need - room} bytes missing",
                {"op": name, "missing_bytes": need - room, **_graph_needs(graph, cluster)},
            )
    persistent = sum(graph.persistent_bytes)
    if persistent > sum(limits):
        raise InfeasiblePlacement(
            f"the graph's persistent bytes alone ({persistent}) exceed the memory of all "
            f"{len(limits)} devices together ({sum(limits)}): {persistent - sum(limits)} "
            "bytes missing; add devices or memory",
            {"missing_bytes": persistent - sum(limits), **_graph_needs(graph, cluster)},
        )


def _raise_over_limit(
    graph: Graph, simulation: Simulation, cluster: Cluster, over: dict[int, int], algorithm: str
) -> None:
    d, excess = max(over.items(), key=lambda item: item[1])
    device = cluster.devices[d]
    needs = _graph_needs(graph, cluster)
    total = sum(dev.memory_bytes or 0 for dev in cluster.devices)
    raise InfeasiblePlacement(
        f"{algorithm}: no plan within memory found; the best one needs "
        f"{simulation.memory[d].peak} bytes on {device.name!r} ({excess} over its "
        f"{device.memory_bytes}); the whole graph needs {needs['graph_needs_bytes']} bytes on "
        f"one device ({needs['graph_persistent_bytes']} of them persistent), the cluster has "
        f"{total} in all",
        {"device": device.name, "missing_bytes": excess, **needs},
    )


def _prefer_single(
    graph: Graph, cluster: Cluster, options: Options, simulation: Simulation,
    stats: dict[str, Any],
) -> Simulation:
    """Return the single-device plan instead when it fits and is predicted faster."""
    estimate = simulation.estimate
    if not estimate.single_device_fits or estimate.single_device_us >= estimate.step_time_us:
        return simulation
    problem = Problem.of(graph, cluster, colocation_units(graph, cluster, options.forward_only))
    try:
        single = get_algorithm("single")(problem)
    except InfeasiblePlacement:
        return simulation
    candidate = replay(graph, cluster, single.device_of, single.orders)
    if candidate.estimate.step_time_us < estimate.step_time_us and candidate.estimate.memory_ok:
        stats["chose_single"] = True
        stats["algorithm_step_time_us"] = estimate.step_time_us
        return candidate
    return simulation


def _plan(
    graph: Graph, cluster: Cluster, cluster_json: dict[str, Any], algorithm: str,
    options: Options, simulation: Simulation, stats: dict[str, Any],
) -> Plan:
    names = [d.name for d in cluster.devices]
    placement = {graph.names[op]: names[d] for op, d in enumerate(simulation.device_of)}
    order = {names[d]: [graph.names[op] for op in ops] for d, ops in enumerate(simulation.orders)}
    return Plan(
        graph=GraphInfo(name=graph.name, sha256=graph.sha256, ops=len(graph)),
        request=PlanRequest(
            algorithm=algorithm, cluster=cluster_json, options=options.model_dump()
        ),
        placement=placement,
        order=order,
        estimate=simulation.estimate,
        stats=_finite(stats),
        engine={"version": __version__},
    )


def _finite(value: Any) -> Any:
    """Replace infinities (not JSON) by None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


__all__ = ["place"]
