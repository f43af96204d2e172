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
from baechi.search import improve
from baechi.simulate import Simulation, replay, single_device_run
from baechi.throughput import check_objective
from baechi.throughput_plan import place_for_throughput

#: How many times the placer is re-run with tighter budgets after a plan overshoots memory.
MEMORY_RETRIES = 4

#: The name of the portfolio algorithm (the default, :data:`baechi.defaults.DEFAULT_ALGORITHM`).
AUTO = "auto"

#: ``auto`` runs m-SCT only on graphs up to this many ops: its LP grows super-linearly
#: (26 s on 30k ops with GLOP) and on the shared graphs it never beat m-ETF by much.
AUTO_SCT_MAX_OPS = 5000

#: Local search in ``auto`` runs in slices of at least this many seconds (more for large
#: graphs, :data:`SEARCH_SLICE_S_PER_OP`); it stops after :data:`SEARCH_PATIENCE` slices in a
#: row that improved the step time by less than :data:`SEARCH_MIN_GAIN`, or at the deadline.
SEARCH_SLICE_S = 0.1

#: Seconds of local search per op in one slice (10k ops: 1 s).
SEARCH_SLICE_S_PER_OP = 1e-4

#: Relative gain below which a slice of local search counts as stagnant.
SEARCH_MIN_GAIN = 1e-3

#: Local search stops after this many stagnant slices in a row.
SEARCH_PATIENCE = 2


def place(
    graph: Graph | dict[str, Any] | str,
    cluster: Cluster | dict[str, Any],
    algorithm: str = DEFAULT_ALGORITHM,
    options: Options | dict[str, Any] | None = None,
    progress: Progress | None = None,
    objective: str = "step_time",
) -> Plan:
    """Place ``graph`` on ``cluster`` and return the simulated plan.

    Parameters
    ----------
    graph : Graph, dict, or path
        A ``baechi.graph/v1`` document (see :func:`baechi.load_graph`).
    cluster : Cluster or dict
        Devices and network (DESIGN §3).
    algorithm : str
        ``auto`` (the default: the best plan of a portfolio, see :func:`_auto`) or a name of
        :data:`baechi.algorithms.ALGORITHMS`: ``single``, ``m-topo``, ``m-etf``, ``m-sct``,
        ``m-fill``.
    options : Options or dict, optional
        Pipeline switches and time limit; every step on by default.
    progress : callable, optional
        ``progress(phase, fraction)``, called a few times per phase.
    objective : str
        ``step_time`` (the default: one training step as short as possible) or
        ``throughput`` (pipelined micro-batches: the busiest device's load as small as
        possible, DESIGN §10; ``auto`` then runs ``throughput-cpsat``, see
        :mod:`baechi.throughput_plan`).

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
    objective = check_objective(objective)
    if algorithm != AUTO:
        get_algorithm(algorithm, objective)  # an unknown name fails before any work
    report("validate", 0.0)
    graph = load_graph(graph)
    phases: dict[str, float] = {"validate": time.perf_counter() - started}
    if objective == "throughput":
        return place_for_throughput(graph, cluster, cluster_json, algorithm, options, report,
                                    __version__)

    _check_units_fit(graph, cluster, colocation_units(graph, cluster, options.forward_only))
    if algorithm == AUTO:
        reduction, simulation, stats = _auto(graph, cluster, options, report, phases,
                                             started + options.time_limit_s)
        return _finish(graph, cluster, cluster_json, algorithm, options, reduction, simulation,
                       stats, phases, started, report)
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
    if algorithm != "single" and options.allow_single:
        simulation = _prefer_single(graph, cluster, options, simulation, stats)
    return _finish(graph, cluster, cluster_json, algorithm, options, reduction, simulation,
                   stats, phases, started, report)


def _finish(
    graph: Graph, cluster: Cluster, cluster_json: dict[str, Any], algorithm: str,
    options: Options, reduction: Reduction, simulation: Simulation, stats: dict[str, Any],
    phases: dict[str, float], started: float, report: Progress,
) -> Plan:
    stats["nodes"] = reduction.nodes
    stats["reduction"] = reduction.stats
    stats["placement_seconds"] = time.perf_counter() - started
    stats["phases"] = phases
    stats["nodes_placed"] = reduction.nodes[-1]["nodes"] if reduction.nodes else len(graph)
    report("done", 1.0)
    return _plan(graph, cluster, cluster_json, algorithm, options, simulation, stats)


def _auto(
    graph: Graph, cluster: Cluster, options: Options, report: Progress,
    phases: dict[str, float], deadline: float,
) -> tuple[Reduction, Simulation, dict[str, Any]]:
    """The best plan of a portfolio, found before ``deadline`` (anytime).

    Candidates, cheapest first: m-ETF with the reduction pipeline (the first plan, as fast
    as m-ETF alone), m-ETF on the unreduced graph (the pipeline fuses away the parallelism
    of small graphs), m-TOPO, m-SCT on both (graphs up to :data:`AUTO_SCT_MAX_OPS` ops),
    m-fill (memory first), and the single-device plan. Then local search
    (:func:`baechi.search.improve`) from the best of them, on the unreduced graph's units,
    in slices until it stagnates (:data:`SEARCH_PATIENCE`) or the deadline passes.
    Every candidate's plan is replayed by the simulator and within memory; the fastest wins.
    """
    unreduced = options.without_pipeline()
    runs: list[tuple[str, Options]] = [("m-etf", options), ("m-etf", unreduced),
                                       ("m-topo", options), ("m-topo", unreduced)]
    if len(graph) <= AUTO_SCT_MAX_OPS:
        runs += [("m-sct", options), ("m-sct", unreduced)]
    runs.append(("m-fill", unreduced))
    seen: set[tuple[str, bool, bool]] = set()
    candidates: list[dict[str, Any]] = []
    best: tuple[Reduction, Simulation, dict[str, Any]] | None = None
    first_error: InfeasiblePlacement | None = None
    for i, (name, run_options) in enumerate(runs):
        key = (name, run_options.co_placement, run_options.fusion)
        if key in seen or (best is not None and time.perf_counter() >= deadline):
            continue
        seen.add(key)
        report("auto", i / (len(runs) + 2))
        tick = time.perf_counter()
        entry: dict[str, Any] = {"algorithm": name,
                                 "pipeline": run_options.co_placement or run_options.fusion}
        run_stats: dict[str, Any] = {"memory_retries": 0}
        try:
            reduction, simulation = _place_reduced(graph, cluster, name, run_options, report,
                                                   phases, run_stats, deadline)
        except InfeasiblePlacement as exc:
            first_error = first_error or exc
            entry.update(step_time_us=None, note="no plan within memory")
        else:
            entry["step_time_us"] = simulation.estimate.step_time_us
            if best is None or entry["step_time_us"] < best[1].estimate.step_time_us:
                best = (reduction, simulation, run_stats)
        entry["seconds"] = time.perf_counter() - tick
        candidates.append(entry)
    single = _single_plan(graph, cluster, options)
    if single is not None:
        candidates.append({"algorithm": "single", "pipeline": False,
                           "step_time_us": single.estimate.step_time_us, "seconds": 0.0})
        if best is None or single.estimate.step_time_us < best[1].estimate.step_time_us:
            best = (_unreduced(graph, cluster, options), single, {})
    if best is None:
        assert first_error is not None
        first_error.message += " (no algorithm of the portfolio found one)"
        first_error.args = (first_error.message,)
        raise first_error
    chosen = min((c for c in candidates if c["step_time_us"] is not None),
                 key=lambda c: c["step_time_us"])
    reduction, simulation, stats = best
    simulation = _search(graph, cluster, options, simulation, deadline, report, phases,
                         candidates)
    searched = candidates[-1]["algorithm"] == "local-search" and candidates[-1]["improved"]
    stats = {**stats, "candidates": candidates,
             "chosen": {"algorithm": chosen["algorithm"], "pipeline": chosen["pipeline"],
                        "local_search": searched}}
    return reduction, simulation, stats


def _search(
    graph: Graph, cluster: Cluster, options: Options, simulation: Simulation, deadline: float,
    report: Progress, phases: dict[str, float], candidates: list[dict[str, Any]],
) -> Simulation:
    """Local search from ``simulation``'s plan in slices (see :func:`_auto`)."""
    estimate = simulation.estimate
    if estimate.step_time_us <= estimate.lower_bound_us * (1 + 1e-9) or len(cluster.devices) < 2:
        return simulation  # optimal already, or nothing to move
    units = colocation_units(graph, cluster, options.forward_only)
    tick = time.perf_counter()
    device_of, orders = simulation.device_of, simulation.orders
    start_us = step_us = estimate.step_time_us
    slice_s = max(SEARCH_SLICE_S, SEARCH_SLICE_S_PER_OP * len(graph))
    evaluated = 0
    seed = 0
    stagnant = 0
    while time.perf_counter() < deadline and stagnant < SEARCH_PATIENCE:
        report("search", 1 - step_us / start_us)
        device_of, orders, found = improve(
            graph, cluster, device_of, orders, units=units, seed=seed,
            deadline=min(deadline, time.perf_counter() + slice_s))
        seed += 1
        evaluated += found.moves_evaluated
        gain = 1 - found.step_us / step_us if step_us > 0 else 0.0
        step_us = found.step_us
        if found.note:
            break
        stagnant = stagnant + 1 if gain < SEARCH_MIN_GAIN else 0
    seconds = time.perf_counter() - tick
    phases["search"] = phases.get("search", 0.0) + seconds
    improved = step_us < start_us
    candidates.append({"algorithm": "local-search", "pipeline": False, "step_time_us": step_us,
                       "seconds": seconds, "improved": improved,
                       "moves_evaluated": evaluated})
    if not improved:
        return simulation
    return replay(graph, cluster, device_of, orders)


def _single_plan(graph: Graph, cluster: Cluster, options: Options) -> Simulation | None:
    """The single-device plan's replay, or ``None`` when it does not fit."""
    problem = Problem.of(graph, cluster, colocation_units(graph, cluster, options.forward_only))
    try:
        single = get_algorithm("single")(problem)
    except InfeasiblePlacement:
        return None
    candidate = replay(graph, cluster, single.device_of, single.orders)
    return candidate if candidate.estimate.memory_ok else None


def _unreduced(graph: Graph, cluster: Cluster, options: Options) -> Reduction:
    """The reduction that keeps every op (for plans made on the graph itself)."""
    return reduce_graph(graph, cluster, options.without_pipeline(), {})


def _place_reduced(
    graph: Graph, cluster: Cluster, algorithm: str, options: Options, report: Progress,
    phases: dict[str, float], stats: dict[str, Any], deadline: float | None = None,
) -> tuple[Reduction, Simulation]:
    """Reduce, place and simulate; re-place with tighter budgets while memory overshoots.

    ``deadline`` (a :func:`time.perf_counter` value) bounds the solver's time limit and the
    retries: none starts after it.
    """
    reduction = reduce_graph(graph, cluster, options, phases)
    time_limit_s = options.time_limit_s
    if deadline is not None:
        time_limit_s = max(0.01, min(time_limit_s, deadline - time.perf_counter()))
    problem = Problem.of(
        reduction.graph, cluster, reduction.units, time_limit_s=time_limit_s, progress=report,
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
        if attempt == MEMORY_RETRIES or (deadline is not None and time.perf_counter() > deadline):
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
    candidate = _single_plan(graph, cluster, options)
    if candidate is not None and candidate.estimate.step_time_us < estimate.step_time_us:
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
