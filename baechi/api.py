"""``place``: the whole job, from graph and cluster to a simulated plan (docs/format.md §6).

Steps: reject requests no plan can fit (memory floors, :mod:`baechi.bounds`), then either run
``auto`` (:mod:`baechi.auto`: a portfolio within the deadline) or one named algorithm
(:func:`baechi.placing.run_algorithm`: reduce, place, expand, replay, re-place with tighter
budgets while memory overshoots). A named algorithm that finds no plan within memory falls
back to the unreduced graph, then to m-fill, before :class:`InfeasiblePlacement`. With
``portfolio`` the unreduced graph and m-fill are tried anyway and the fastest plan kept.
Every plan, named algorithm or ``auto``, then goes through one post-pass,
:func:`_order_transfers`: the model-aware transfer order (:mod:`baechi.ordering`) when it
replays strictly faster. With ``allow_single`` a single-device plan faster than a named
algorithm's plan so ordered replaces it (``auto`` has it among its candidates).

The request's deadline is ``options.time_limit_s`` after ``place`` starts: no retry or
fallback starts after it (a last m-fill excepted while there is no plan), solvers get the time
left, and ``auto`` returns its best plan so far.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from baechi._version import __version__
from baechi.algorithms import DEFAULT_ALGORITHM, get_algorithm
from baechi.algorithms.base import Progress, no_progress
from baechi.algorithms.exact import EXACT_MAX_OPS
from baechi.auto import Outcome, candidate_fields, place_auto
from baechi.bounds import (
    PACKING_TIME_LIMIT_S,
    meets_bound,
    pack_units,
    settle_claims,
    unit_floor,
)
from baechi.cluster import Cluster
from baechi.costmodel import CostModel
from baechi.errors import InfeasiblePlacement, PlacementError
from baechi.graph import Graph, load_graph
from baechi.grouping import Units
from baechi.options import Options
from baechi.ordering import OrderOutcome, order_transfers
from baechi.placing import Request, Run, add_seconds, graph_needs, run_algorithm, single_plan
from baechi.plan import GraphInfo, Plan, PlanRequest, PlanStats
from baechi.simulate import Simulation, transfer_entries
from baechi.throughput import check_objective
from baechi.throughput_plan import place_for_throughput

#: Modules whose native runtime crashes OR-Tools' solvers in the same process (their protobuf
#: and absl copies clash): after TensorFlow has run a step, CP-SAT's solve segfaults (measured
#: with TF 2.21 and OR-Tools 9.x). ``place`` then runs in a fresh interpreter.
CONFLICTING_MODULES = ("tensorflow",)

#: The child's program: read the arguments, place, write back the plan or the error.
_CHILD = """
import pickle, sys
from baechi.api import place
from baechi.errors import PlacementError
args = pickle.load(sys.stdin.buffer)
try:
    result = place(*args)
except PlacementError as error:
    result = error
pickle.dump(result, sys.stdout.buffer)
"""

#: The name of the portfolio algorithm (the default, :data:`baechi.defaults.DEFAULT_ALGORITHM`).
AUTO = "auto"


@dataclass(frozen=True)
class _Result:
    """The returned plan's run, its final simulation (the run's, or a better one found after
    it), seconds per phase of everything run, the plan-level stats fields, and what the
    transfer-order post-pass found once it ran."""

    run: Run
    simulation: Simulation
    seconds: dict[str, float]
    fields: dict[str, Any] = field(default_factory=dict)
    ordering: OrderOutcome | None = None


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
        Devices and network (docs/format.md §3).
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
        possible, docs/format.md §10; ``auto`` then runs ``throughput-cpsat``, see
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
    if any(name in sys.modules for name in CONFLICTING_MODULES):
        return _place_in_fresh_process(graph, cluster, algorithm, options, objective)
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
    validate_s = time.perf_counter() - started
    if objective == "throughput":
        return place_for_throughput(graph, cluster, cluster_json, algorithm, options, report,
                                    __version__)
    request = Request.of(graph, cluster, options, started, report)
    check_units_fit(graph, cluster, request.units, request.cost)
    tick = time.perf_counter()
    _check_packing(request)
    validate_s += time.perf_counter() - tick
    if algorithm == AUTO:
        outcome = place_auto(request)
        result = _Result(outcome.run, outcome.simulation, outcome.seconds,
                         candidate_fields(outcome))
    else:
        outcome, result = None, _place_named(request, algorithm)
    report("order", 0.0)
    if outcome is not None:
        result = _order_portfolio(request, outcome, result)
    else:
        result = _order_transfers(request, result)
        if algorithm != "single" and options.allow_single:
            result = _single_if_faster(request, result)
    report("done", 1.0)
    return _plan(request, cluster_json, algorithm, result,
                 {"validate": validate_s, **result.seconds}, started)


def _order_transfers(request: Request, result: _Result, quick: bool = False,
                     resume: OrderOutcome | None = None) -> _Result:
    """The post-pass every plan goes through: keep the model-aware transfer order when it
    replays strictly faster than FIFO and fits memory (``options.transfer_order``), within the
    request's deadline (``quick``: its first candidate only, :data:`baechi.ordering.QUICK`;
    ``resume``: a quick pass of the same plan, not replayed again). Adds the ``order`` phase
    and the ``transfer_order`` stats fields."""
    tick = time.perf_counter()
    run = result.run
    # the placer's own channel order fits its own plan only
    proposed = run.transfer_order if result.simulation is run.simulation else None
    outcome = order_transfers(request.cost, result.simulation, request.end,
                              mode=request.options.transfer_order, proposed=proposed,
                              quick=quick, resume=resume)
    fields = {**result.fields, "transfer_order": outcome.kept,
              "fifo_step_time_us": outcome.fifo_step_time_us,
              "transfer_order_note": outcome.note}
    bound_us = result.fields.get("bound_us", run.algorithm_stats.get("bound_us"))
    if bound_us is not None and ("optimal" in result.fields or "optimal" in run.algorithm_stats):
        # proven optimal is a fact of the plan returned: its replay meets the proven bound
        fields["optimal"] = outcome.simulation.estimate.memory_ok and \
            meets_bound(outcome.simulation, bound_us)
    seconds = add_seconds(result.seconds, {"order": time.perf_counter() - tick})
    return dataclasses.replace(result, simulation=outcome.simulation, seconds=seconds,
                               fields=fields, ordering=outcome)


def _order_portfolio(request: Request, outcome: Outcome, result: _Result) -> _Result:
    """The post-pass of ``auto``'s plan (:func:`_order_transfers`), with the plans it passed
    over as rivals: ``auto`` compares its candidates under FIFO channels (a plan that fits
    memory only in its placer's channel order, in that order), and one it passed over may beat
    the chosen one once both keep their best transfer order (``auto`` is then never slower than
    a named algorithm, which gets the same post-pass). Each plan first gets the quick pass (a
    replay each of its placer's channel order and :data:`~baechi.ordering.QUICK`), the chosen
    one first, then the plan local search started from (its gain under FIFO may be less than
    ordering gives the start: inceptionv3_training_layer, PCIe, suggested memory, 561.1 ms
    searched, 549.5 ms for m-ETF's plan once ordered, 550.5 ms for the searched one), then plans
    with their placer's own channel order (``exact``'s: often the fastest once ordered), then
    the fastest under FIFO, each placement once; then the full pass, fastest once ordered first,
    each resumed from its quick pass (not replaying its candidates again; the quick candidate
    misses what only the others find: m-fill's plan of resnet50_training_operator, PCIe, 30%
    memory, 748.0 ms under FIFO and quick, 744.0 ms fully ordered, where the fastest quick one,
    746.0 ms, gains nothing). All until the request's end, like the post-pass itself. Quick
    passes first, because a full pass of the chosen plan alone took the 0.2 s left at
    ``time_limit_s`` 2 on 2,000 ops (20 replays), where m-SCT's plan, never ordered, was the
    fastest once ordered (a layered graph of ``baechi.testing``, 4 devices, CCR 0.3: 11,750 µs
    against 11,785)."""
    others = sorted(outcome.others, key=lambda other: (other[0] is not outcome.run,
                                                       other[0].transfer_order is None,
                                                       other[1].estimate.step_time_us))
    rivals = [(result.run, result.simulation, None), *others]
    placements: set[tuple[tuple[int, ...], ...]] = set()
    quick: list[tuple[_Result, _Result]] = []  # (the plan as placed, quick-ordered)
    seconds = result.seconds
    for run, simulation, chosen in rivals:
        if quick and time.perf_counter() >= request.end:
            break
        placement = (tuple(simulation.device_of), *map(tuple, simulation.orders))
        if placement in placements:
            continue
        placements.add(placement)
        fields = result.fields if chosen is None else {**result.fields, "chosen": chosen}
        placed = dataclasses.replace(result, run=run, simulation=simulation, seconds=seconds,
                                     fields=fields)
        ordered = _order_transfers(request, placed, quick=True)
        seconds = ordered.seconds
        quick.append((placed, ordered))
    quick.sort(key=lambda pair: pair[1].simulation.estimate.step_time_us)
    best = quick[0][1]
    for i, (placed, ordered) in enumerate(quick):
        if i and time.perf_counter() >= request.end:
            break
        full = _order_transfers(request, dataclasses.replace(placed, seconds=seconds),
                                resume=ordered.ordering)
        seconds = full.seconds
        if full.simulation.estimate.step_time_us < best.simulation.estimate.step_time_us:
            best = full
    return dataclasses.replace(best, seconds=seconds)


def _place_in_fresh_process(
    graph: Graph | dict[str, Any] | str, cluster: Cluster | dict[str, Any], algorithm: str,
    options: Options | dict[str, Any] | None, objective: str,
) -> Plan:
    """:func:`place` in a new interpreter (see :data:`CONFLICTING_MODULES`); the same plan, or
    the same :class:`~baechi.errors.PlacementError`. Progress is not reported from there. A
    subprocess, not multiprocessing: spawning would re-run the caller's script."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=pickle.dumps((graph, cluster, algorithm, options, None, objective)),
        capture_output=True, env=env, check=False)
    if done.returncode != 0:
        raise PlacementError("placement in a fresh interpreter failed: "
                             + done.stderr.decode(errors="replace")[-2000:])
    result = pickle.loads(done.stdout)
    if isinstance(result, Exception):
        raise result
    return result


def _place_named(request: Request, algorithm: str) -> _Result:
    """One named algorithm, its fallbacks, and the options' portfolio and single check."""
    options = request.options
    fields: dict[str, Any] = {}
    if algorithm == "exact" and len(request.graph) <= EXACT_MAX_OPS and (
            options.co_placement or options.fusion):
        # exact solves graphs of this size as they are, where its proof holds for the request
        options = options.without_pipeline()
        fields["pipeline_note"] = (
            f"exact placed the graph itself ({len(request.graph)} ops, at most "
            f"{EXACT_MAX_OPS}): no co-placement or fusion, so what it proves holds for the "
            "request")
    # When memory defeats the request, fall back to what gives the placer more freedom (the
    # unreduced graph), then to the memory-first placer; say so in the plan's stats.
    attempts = [(algorithm, options, None)]
    if options.co_placement or options.fusion:
        attempts.append((algorithm, options.without_pipeline(),
                         "the reduced graph did not fit in memory; placed the unreduced graph"))
    if algorithm not in ("single", "m-fill"):
        attempts.append(("m-fill", options.without_pipeline(),
                         f"{algorithm} found no plan within memory; placed with m-fill "
                         "(topological segments, each device filled to its memory)"))
    seconds: dict[str, float] = {}
    errors: list[InfeasiblePlacement] = []
    found: Run | None = None
    fallback: str | None = None
    retries = 0
    for i, (name, attempt_options, note) in enumerate(attempts):
        last = i == len(attempts) - 1
        if i and request.expired() and not last:
            continue  # past the deadline only the last resort (m-fill) still runs
        # only the last resort always finishes (m-fill: linear); the others stop at the
        # deadline, so that a request answers by it (a named m-SCT placed a 10,000-op graph in
        # 29 s at any time limit; m-ETF 30,000 ops under tight memory in 11 s at 2 s)
        run = run_algorithm(request, name, attempt_options, last_resort=last)
        seconds = add_seconds(seconds, run.seconds)
        retries += run.memory_retries
        if run.simulation is None:
            assert run.error is not None
            errors.append(run.error)
            continue
        if note is not None and errors[0].details.get("deadline_reached"):
            note = (f"{algorithm} was still placing at the deadline (time_limit_s "
                    f"{options.time_limit_s:g}); placed with {name}")
        found, fallback = run, note
        break
    if found is None:
        # the first reason, unless it only says that time ran out
        error = next((e for e in errors if not e.details.get("deadline_reached")), errors[0])
        if len(attempts) > 1:
            cut_short = (f"; {algorithm} was still placing at the deadline"
                         if error is not errors[0] else "")
            raise InfeasiblePlacement(
                f"{error.message} (no fallback found one either{cut_short})", error.details)
        raise error
    fields.update({"fallback": fallback, "memory_retries": retries,
                   "deadline_reached": request.expired()})
    if options.portfolio and fallback is None:
        found, portfolio_seconds, portfolio_fields = _portfolio(request, found)
        seconds = add_seconds(seconds, portfolio_seconds)
        fields.update(portfolio_fields)
    assert found.simulation is not None
    return _Result(found, found.simulation, seconds, fields)


def _portfolio(request: Request, reduced: Run) -> tuple[Run, dict[str, float], dict[str, Any]]:
    """Also place the unreduced graph, and with m-fill; keep the plan predicted fastest.

    Fused nodes are all-or-nothing in the placer's timing, which costs on graphs with much
    parallelism inside them (NASNet); under tight memory, m-fill's segments often beat the
    greedy schedulers' many transfers (gnmt_baechi at 768 MiB: 118.7 ms against m-ETF's 139.1).
    Returns the kept run, the seconds spent, and the ``portfolio_*`` stats fields.
    """
    unreduced = request.options.without_pipeline()
    variants = [("unreduced", reduced.algorithm, unreduced)]
    if reduced.algorithm != "m-fill":
        variants.append(("m-fill", "m-fill", unreduced))
    assert reduced.simulation is not None
    best, best_label = reduced, "reduced"
    times = {"reduced": reduced.simulation.estimate.step_time_us}
    seconds: dict[str, float] = {}
    for label, name, variant_options in variants:
        if request.expired():
            break
        run = run_algorithm(request, name, variant_options)
        seconds = add_seconds(seconds, run.seconds)
        if run.simulation is None:
            continue
        times[label] = run.simulation.estimate.step_time_us
        if times[label] < best.simulation.estimate.step_time_us:  # type: ignore[union-attr]
            best, best_label = run, label
    return best, seconds, {"portfolio_step_times_us": times, "portfolio_choice": best_label}


def _single_if_faster(request: Request, result: _Result) -> _Result:
    """``result`` (its transfers ordered), or the single-device plan when that fits and is
    faster (``chose_single``). After the post-pass, not before: a plan slower than one
    device under FIFO channels may beat it once ordered (m-ETF on ``layered(6, 16, 10.0)``,
    2 devices, sequential: 235 us under FIFO, 155 us ordered, one device 167 us)."""
    single = _faster_single(request, result.simulation)
    if single is None:
        return result
    fields = {**result.fields, "chose_single": True,
              "algorithm_step_time_us": result.simulation.estimate.step_time_us}
    return _order_transfers(request, dataclasses.replace(result, simulation=single,
                                                         fields=fields))


def _faster_single(request: Request, simulation: Simulation) -> Simulation | None:
    """The single-device plan when it fits and is predicted faster than ``simulation``."""
    estimate = simulation.estimate
    if not estimate.single_device_fits or estimate.single_device_us >= estimate.step_time_us:
        return None
    candidate = single_plan(request)
    if candidate is not None and candidate.estimate.step_time_us < estimate.step_time_us:
        return candidate
    return None


def check_units_fit(graph: Graph, cluster: Cluster, units: Units, cost: CostModel) -> None:
    """Fail fast, naming the op, when a unit cannot fit on any device it may use
    (:func:`~baechi.bounds.unit_floor`: no plan can use less on the unit's device)."""
    limits = [math.inf if d.memory_bytes is None else d.memory_bytes for d in cluster.devices]
    largest = max(limits)
    for unit, ops in enumerate(units.members):
        pin = units.pin[unit]
        room = limits[pin] if pin >= 0 else largest
        if math.isinf(room):
            continue
        need, worst = unit_floor(graph, units, unit, cost)
        if need > room:
            name = graph.names[worst]
            what = (f"op {name!r}" if len(ops) == 1 else
                    f"the group of {len(ops)} ops with {name!r} (colocation/forward pairs)")
            where = f"device {cluster.devices[pin].name!r}" if pin >= 0 else "the largest device"
            raise InfeasiblePlacement(
                f"{what} needs {need} bytes while {name!r} runs (persistent bytes, its inputs, "
                f"temp and output) but {where} holds {room}: {need - room} bytes missing",
                {"op": name, "missing_bytes": need - room, **graph_needs(graph, cost)},
            )
    persistent = sum(graph.persistent_bytes)
    if persistent > sum(limits):
        raise InfeasiblePlacement(
            f"the graph's persistent bytes alone ({persistent}) exceed the memory of all "
            f"{len(limits)} devices together ({sum(limits)}): {persistent - sum(limits)} "
            "bytes missing; add devices or memory",
            {"missing_bytes": persistent - sum(limits), **graph_needs(graph, cost)},
        )


def _check_packing(request: Request) -> None:
    """Fail fast when no split of the units over the devices fits memory
    (:func:`~baechi.bounds.pack_units`, given at most a tenth of the time limit): the weights
    may fit the cluster in sum, and each unit a device, but not all at once."""
    graph, cluster, units, cost = request.graph, request.cluster, request.units, request.cost
    if all(d.memory_bytes is None for d in cluster.devices):
        return
    limit_s = min(PACKING_TIME_LIMIT_S, request.options.time_limit_s / 10)
    packing = pack_units(graph, cluster, units, cost, limit_s)
    if packing.status != "impossible":
        return
    running = cost.op_running_bytes
    worst = max(range(len(graph)), key=running.__getitem__)
    limits = sorted({d.memory_bytes for d in cluster.devices if d.memory_bytes is not None})
    held = ", ".join(map(str, limits))
    raise InfeasiblePlacement(
        f"no split of the graph over the {len(cluster.devices)} devices fits memory: its "
        f"persistent bytes ({sum(graph.persistent_bytes)}, resident all step) cannot be shared "
        "out so that every device also holds the running bytes of the ops placed there "
        f"(op {graph.names[worst]!r} needs {running[worst]} while it runs; "
        f"devices hold {held} bytes), colocation groups and forward pairs kept together: "
        f"every device would need at least {packing.missing_bytes} bytes more (proved by "
        "CP-SAT); add devices or memory",
        {"op": graph.names[worst], "missing_bytes": packing.missing_bytes,
         **graph_needs(graph, cost)},
    )


def _plan(
    request: Request, cluster_json: dict[str, Any], algorithm: str, result: _Result,
    seconds: dict[str, float], started: float,
) -> Plan:
    graph, cluster, options = request.graph, request.cluster, request.options
    simulation, run = result.simulation, result.run
    names = [d.name for d in cluster.devices]
    placement = {graph.names[op]: names[d] for op, d in enumerate(simulation.device_of)}
    order = {names[d]: [graph.names[op] for op in ops] for d, ops in enumerate(simulation.orders)}
    transfer_order = (None if simulation.transfer_order is None
                      else transfer_entries(graph, cluster, simulation.transfer_order))
    reduction = run.reduction
    nodes = reduction.nodes if reduction is not None else []
    claimed = {**_finite(run.algorithm_stats),
               **{k: v for k, v in result.fields.items() if v is not None}}
    settle_claims(claimed, simulation, own_plan=simulation is run.simulation)
    stats = PlanStats.model_validate({
        "memory_retries": run.memory_retries,
        **claimed,
        "nodes": nodes,
        "nodes_placed": nodes[-1]["nodes"] if nodes else len(graph),
        "reduction": reduction.stats if reduction is not None else {},
        "phases": seconds,
        "deadline_reached": result.fields.get("deadline_reached", False),
        "largest_op": graph.largest_op(),
        "placement_seconds": time.perf_counter() - started,
    })
    return Plan(
        graph=GraphInfo(name=graph.name, sha256=graph.sha256, ops=len(graph)),
        request=PlanRequest(
            algorithm=algorithm, cluster=cluster_json, options=options.model_dump()
        ),
        placement=placement,
        order=order,
        transfer_order=transfer_order,
        estimate=simulation.estimate,
        stats=stats,
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


__all__ = ["check_units_fit", "place"]
