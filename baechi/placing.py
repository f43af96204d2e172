"""One run of one algorithm on one request: reduce, place, expand, replay (docs/format.md §6).

A :class:`Request` holds what depends only on the graph, the cluster and the options: the
request's :class:`~baechi.costmodel.CostModel` (built once, passed to every replay), the
colocation units, the progress callback and the deadline. :func:`run_algorithm` places with
one algorithm and returns a :class:`Run`; when the plan's simulated peak exceeds a device's
memory the placer runs again on a copy of the problem with that device's budget lowered (a
few times, never after the deadline). Nothing is mutated for the caller: each run returns its
plan, its figures and its seconds per phase.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from dataclasses import dataclass, field
from typing import Any

from baechi.algorithms import get_algorithm
from baechi.algorithms.base import Assignment, Problem, Progress
from baechi.bounds import meets_bound, step_bound_us
from baechi.cluster import Cluster
from baechi.costmodel import CostModel
from baechi.errors import InfeasiblePlacement, InvalidPlan
from baechi.graph import Graph
from baechi.grouping import Units, colocation_units
from baechi.memory import persistent_bytes_by
from baechi.options import Options
from baechi.pipeline import Reduction, reduce_graph
from baechi.simulate import Simulation, TransferKey, replay, single_device_run_of

#: How many times the placer is re-run with tighter budgets after a plan overshoots memory.
MEMORY_RETRIES = 4

#: Share of a request's time limit kept for the transfer-order post-pass (model-aware
#: ordering, :mod:`baechi.ordering`, after every placement): placers and ``auto`` stop that
#: much earlier. Measured (bench/fragments/ordering.md): at most 0.095 s per plan on the
#: shared graphs, 0.24 s on 12.5k ops and 0.56 s on 30k ops. ``auto`` orders two plans at
#: least (the chosen one and the one local search started from), so 10% of the benchmarks'
#: 2 s limit lets both finish (at 5%, inceptionv3_training_layer on NVLink returned 292.1 ms
#: where m-SCT's plan, ordered, takes 291.1 ms); within 10% of the default 60 s on 30k ops.
ORDERING_SHARE = 0.1

#: The shortest time limit a placer is given, even when the deadline has passed (s): a solver
#: then stops at once with the best it has.
MIN_TIME_LIMIT_S = 0.01


@dataclass(frozen=True)
class Request:
    """What one ``place`` call computes once and every run shares.

    ``end`` is the request's deadline, a :func:`time.perf_counter` value: ``started +
    options.time_limit_s``. ``deadline``, placement's, is :data:`ORDERING_SHARE` of the time
    limit earlier when model-aware transfer ordering runs after it (sequential mode), else
    ``end``. Copies made with :func:`dataclasses.replace` (a shorter deadline for one
    candidate) share the reductions computed so far.
    """

    graph: Graph
    cluster: Cluster
    options: Options
    cost: CostModel
    units: Units
    deadline: float
    progress: Progress
    end: float = math.inf
    #: The reductions computed so far, by the switches and merge-cap scale they depend on
    #: (:meth:`reduction`).
    reductions: dict[tuple[bool, bool, bool, float], Reduction] = field(
        default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, graph: Graph, cluster: Cluster, options: Options, started: float,
           progress: Progress) -> Request:
        cost = CostModel(graph, cluster)
        limit = options.time_limit_s
        ordering = options.transfer_order == "model-aware" and cost.sequential
        reserve = ORDERING_SHARE * limit if ordering else 0.0
        return cls(graph, cluster, options, cost,
                   colocation_units(graph, cluster, options.forward_only),
                   started + limit - reserve, progress, started + limit)

    def seconds_left(self) -> float:
        """Seconds until the deadline (negative once it has passed)."""
        return self.deadline - time.perf_counter()

    def expired(self) -> bool:
        """Whether the deadline has passed."""
        return time.perf_counter() >= self.deadline

    @functools.cached_property
    def bound_us(self) -> float:
        """A lower bound of every plan's step time for this request, transfers that memory
        or pins force included (:func:`baechi.bounds.step_bound_us`). Computed once."""
        return step_bound_us(self.graph, self.cluster, self.units, self.cost)

    def reduction(self, options: Options, cap_scale: float = 1.0
                  ) -> tuple[Reduction, dict[str, float]]:
        """The reduction ``options`` switch on (:func:`~baechi.pipeline.reduce_graph`, its
        merge cap scaled by ``cap_scale``), computed once per request, and the seconds this
        call spent on it per phase: the reduction's own the first time, none after (each
        pipelined candidate of ``auto`` places the same reduced graph; on 30k ops a
        reduction takes 0.25 s)."""
        key = (options.forward_only, options.co_placement, options.fusion, cap_scale)
        cached = self.reductions.get(key)
        if cached is not None:
            return cached, {}
        reduction = self.reductions[key] = reduce_graph(self.graph, self.cluster, options,
                                                        cap_scale)
        return reduction, dict(reduction.seconds)

    @property
    def unreduced(self) -> Reduction:
        """The reduction that keeps every op (for plans made on the graph itself)."""
        return self.reduction(self.options.without_pipeline())[0]

    def problem(self, reduction: Reduction, **kwargs: Any) -> Problem:
        """The problem of placing ``reduction``'s graph on the request's cluster (``kwargs``:
        :class:`~baechi.algorithms.base.Problem`'s other fields), with the reduction's memo
        and, for the graph itself, the request's cost model (a reduced graph gets its own)."""
        if reduction.graph is self.graph:
            kwargs["cost"] = self.cost
        return Problem.of(reduction.graph, self.cluster, reduction.units, memo=reduction.memo,
                          **kwargs)

    def replay(self, device_of: list[int], orders: list[list[int]],
               transfer_order: list[list[TransferKey]] | None = None) -> Simulation:
        """The simulator's replay of a plan of this request's graph (the judge), with FIFO
        channels unless a ``transfer_order`` is given."""
        return replay(self.graph, self.cluster, device_of, orders, self.cost, transfer_order)


@dataclass(frozen=True)
class Run:
    """What one run of an algorithm gave: a plan within memory (``simulation``) or the
    reason there is none (``error``), and the seconds per phase it spent either way."""

    algorithm: str
    options: Options
    reduction: Reduction | None
    simulation: Simulation | None = None
    error: InfeasiblePlacement | None = None
    memory_retries: int = 0
    #: The algorithm's own figures (``Assignment.stats``).
    algorithm_stats: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    #: The algorithm's assignment of the reduced graph (a warm start for solvers).
    assignment: Assignment | None = None
    #: Without a plan within memory: the replay that overshot least (a start for repair).
    refused: Simulation | None = None
    #: Without a plan within memory: the first attempt's replay, placed within the devices'
    #: true limits (the retries' lowered budgets distort a plan as they shrink its overshoot).
    first_refused: Simulation | None = None

    @property
    def pipeline(self) -> bool:
        """Whether the reduction pipeline ran (co-placement or fusion)."""
        return self.options.co_placement or self.options.fusion

    @property
    def step_time_us(self) -> float | None:
        """The plan's replayed step time, ``None`` without a plan."""
        return None if self.simulation is None else self.simulation.estimate.step_time_us

    @property
    def transfer_order(self) -> list[list[TransferKey]] | None:
        """The channel order the placer scheduled in (``Assignment.transfer_order``), when it
        placed the request's own ops: a fused graph's messages are not the request's."""
        if self.assignment is None or self.reduction is None or \
                self.reduction.members is not None:
            return None
        return self.assignment.transfer_order


def add_seconds(total: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    """``total`` with ``more``'s seconds added phase by phase (a new dict)."""
    merged = dict(total)
    for phase, seconds in more.items():
        merged[phase] = merged.get(phase, 0.0) + seconds
    return merged


def run_algorithm(
    request: Request, algorithm: str, options: Options, hint: Assignment | None = None,
    *, last_resort: bool = False, relaxed: bool = False, cap_scale: float = 1.0,
) -> Run:
    """Reduce, place with ``algorithm``, expand and replay; re-place with tighter budgets
    while the plan overshoots memory (at most :data:`MEMORY_RETRIES` times, none started
    after the deadline but a last resort's). The placer's time limit is what is left until
    the deadline.

    ``hint`` (an assignment of the same reduction) is passed as ``Problem.hint``, and
    ``relaxed`` as ``Problem.relaxed``; ``cap_scale`` scales the reduction's merge cap
    (:meth:`Request.reduction`). The placer stops at the deadline
    (``Problem.deadline``), except a ``last_resort`` (m-fill, linear, while a request has no
    plan), whose placements and memory retries always complete so that a request has a plan
    to return (``exact`` named at ``time_limit_s`` 2 on a 6-op fork-join, sequential, 2
    devices at 60% of its peak, spent the time on its own retries; m-fill's first plan
    overshot and its retry, which fits, was not started).

    Returns a :class:`Run` whose ``simulation`` fits every device, or whose ``error`` says
    by how much the last plan did not. A plan is judged under FIFO channels. One that fits
    only in its placer's channel order (:func:`_in_placer_order`; the simulation then
    carries that order) is held while the retries look for a faster one that fits under FIFO
    (at once returned when it meets the proved bound), and returned unless they find one.
    Its stats' ``bound_us`` is the highest any attempt proved: a retry's lower budgets cut
    off plans the request allows, so what a solver proves there holds for fewer plans
    (``exact`` on a fork-join of 8 ops, 2 devices at 60% of its peak: 111 µs proved at the
    limits, 104 µs after the retry).
    """
    cluster = request.cluster
    reduction, seconds = request.reduction(options, cap_scale)
    extra: dict[str, Any] = {} if hint is None else {"hint": hint}
    problem = request.problem(
        reduction, time_limit_s=_time_limit(request, options), progress=request.progress,
        deadline=math.inf if last_resort else request.deadline, relaxed=relaxed, **extra)
    place_fn = get_algorithm(algorithm)
    over_error: InfeasiblePlacement | None = None  # why the last plan was refused
    refused: Simulation | None = None  # the refused plan that overshot least
    first_refused: Simulation | None = None  # the plan placed within the true limits
    bound_us = 0.0  # the highest bound an attempt proved (stats' bound_us)
    held: Run | None = None  # the fastest plan that fits only in its placer's channel order
    held_us = math.inf  # its step time

    def end(run: Run) -> Run:
        """``run``, or the held plan when ``run`` has none or a slower one (with the highest
        bound proved)."""
        if held is None or (run.simulation is not None and
                            run.simulation.estimate.step_time_us <= held_us):
            return run
        proved = for_the_request({"bound_us": bound_us} if bound_us else {}, reduction)
        return dataclasses.replace(held, memory_retries=run.memory_retries,
                                   algorithm_stats={**held.algorithm_stats, **proved})

    for attempt in range(MEMORY_RETRIES + 1):
        tick = time.perf_counter()
        short: InfeasiblePlacement | None = None  # the placer's own refusal, with its plan
        try:
            assignment = place_fn(problem)
        except InfeasiblePlacement as exc:
            seconds["place"] = seconds.get("place", 0.0) + time.perf_counter() - tick
            if exc.details.get("deadline_reached"):
                # a retry cut short says less than the overshoot that caused it
                exc = over_error or InfeasiblePlacement(f"{algorithm}: {exc.message}",
                                                        exc.details)
            if exc.plan is None:
                proved = {"bound_us": bound_us} if bound_us else {}
                return end(Run(algorithm, options, reduction, None, exc, attempt,
                               for_the_request(proved, reduction), seconds, refused=refused,
                               first_refused=first_refused))
            short, assignment = exc, exc.plan
        if "bound_us" in assignment.stats:
            bound_us = assignment.stats["bound_us"] = max(bound_us, assignment.stats["bound_us"])
        seconds["place"] = seconds.get("place", 0.0) + time.perf_counter() - tick
        tick = time.perf_counter()
        device_of, orders = reduction.expand(assignment.device_of, assignment.orders)
        simulation = request.replay(device_of, orders)
        over = overshoot(simulation, cluster)
        ordered = _in_placer_order(request, options, reduction, assignment) if over else None
        seconds["simulate"] = seconds.get("simulate", 0.0) + time.perf_counter() - tick
        stats = for_the_request(assignment.stats, reduction)
        if not over:
            return end(Run(algorithm, options, reduction, simulation, None, attempt, stats,
                           seconds, assignment))
        if ordered is not None and not overshoot(ordered, cluster) and \
                ordered.estimate.step_time_us < held_us:
            held = Run(algorithm, options, reduction, ordered, None, attempt, stats, seconds,
                       assignment)
            held_us = ordered.estimate.step_time_us
            if meets_bound(ordered, bound_us):  # a retry cannot find a faster plan
                return end(held)
        over_error = short or over_limit_error(request, simulation, over, algorithm)
        if refused is None or sum(over.values()) < sum(overshoot(refused, cluster).values()):
            refused = simulation
        if first_refused is None:
            first_refused = simulation
        # a plan its placer knew to overshoot is not placed again with less memory
        if short is not None or attempt == MEMORY_RETRIES or (
                request.expired() and not last_resort):
            return end(Run(algorithm, options, reduction, None, over_error, attempt, stats,
                           seconds, refused=refused, first_refused=first_refused))
        budget = list(problem.budget)
        for d, excess in over.items():
            # the placer's memory model can be off by more than the overshoot it was told
            limit = cluster.devices[d].memory_bytes or 0
            budget[d] -= max(excess * 1.05, 0.02 * limit)
        problem = dataclasses.replace(problem, budget=budget,
                                      time_limit_s=_time_limit(request, options))
        request.progress("place", 0.0)
    raise AssertionError("unreachable")


def _in_placer_order(request: Request, options: Options, reduction: Reduction,
                     assignment: Assignment) -> Simulation | None:
    """The replay of ``assignment`` in the channel order its placer scheduled (``exact``'s),
    where the options let a plan keep one: a plan may fit memory in that order only (a
    received copy is held from its transfer's start). ``None`` where there is no such order
    (FIFO wanted, parallel mode, a reduction that merged ops) or the simulator rejects it."""
    if options.transfer_order != "model-aware" or not request.cost.sequential or \
            reduction.members is not None or assignment.transfer_order is None:
        return None
    try:
        return request.replay(assignment.device_of, assignment.orders,
                              assignment.transfer_order)
    except InvalidPlan:  # an order that deadlocks is no plan
        return None


def for_the_request(algorithm_stats: dict[str, Any], reduction: Reduction) -> dict[str, Any]:
    """An algorithm's figures as they hold for the request: an optimum proved on a reduced
    graph is not one for the request, nor its bound a bound of every plan, when the reduction
    merged units beyond what the request itself groups (co-placement) or fused ops into one
    node (a fused node runs its ops back to back and sends at its end, stricter than the
    simulator even inside one colocation group)."""
    units = {entry["phase"]: entry.get("units", entry["nodes"]) for entry in reduction.nodes}
    stats = dict(algorithm_stats)
    fused = reduction.members is not None and len(reduction.members) < len(reduction.original)
    if units.get("grouping") == min(units.values(), default=0) and not fused:
        return stats
    if "optimal" in stats:
        stats["optimal"] = False
        stats["optimal_note"] = ("proved for the reduced graph only (co-placement or fusion "
                                 "merged ops); place with the pipeline off for a proof on "
                                 "every op")
    if "bound_us" in stats:
        stats["reduced_bound_us"] = stats.pop("bound_us")
    return stats


def _time_limit(request: Request, options: Options) -> float:
    """A placer's time limit: what is left until the deadline, at least
    :data:`MIN_TIME_LIMIT_S`, at most the options' own limit."""
    return min(options.time_limit_s, max(MIN_TIME_LIMIT_S, request.seconds_left()))


def single_plan(request: Request) -> Simulation | None:
    """The single-device plan's replay, or ``None`` when it does not fit."""
    problem = Problem.of(request.graph, request.cluster, request.units, cost=request.cost)
    try:
        single = get_algorithm("single")(problem)
    except InfeasiblePlacement:
        return None
    candidate = request.replay(single.device_of, single.orders)
    return candidate if candidate.estimate.memory_ok else None


def memory_blind_replay(request: Request, algorithm: str, *, pipeline: bool = False
                        ) -> Simulation | None:
    """The replay of ``algorithm``'s plan placed as if no device had a memory limit, in
    memory or not: a start for repair that keeps the parallelism memory-aware choices give up.
    With ``pipeline``, the algorithm places the graph the request's options reduce (its plan
    expanded to every op), else the graph itself. ``None`` when the algorithm finds no plan
    (for ``single``: pins on two devices, or no device runs every op) or the deadline
    passed."""
    reduction = request.reduction(request.options)[0] if pipeline else request.unreduced
    problem = request.problem(reduction, deadline=request.deadline,
                              time_limit_s=max(0.0, request.seconds_left()))
    blind = dataclasses.replace(problem, budget=[math.inf] * len(problem.budget))
    try:
        assignment = get_algorithm(algorithm)(blind)
    except InfeasiblePlacement:
        return None
    return request.replay(*reduction.expand(assignment.device_of, assignment.orders))


def spread_plan(request: Request) -> Simulation | None:
    """The replay of a plan that spreads the persistent bytes evenly: units by persistent
    bytes, largest first, each on the device that holds the fewest so far among those where
    it can run (pins kept); each device runs its ops in canonical order. A start for repair
    where weights fill most of the memory and every placer's plan overflows a device (the
    persistent bytes of contiguous segments differ widely). ``None`` when a unit can run on
    no device.
    """
    graph, units, cost = request.graph, request.units, request.cost
    held = [0] * len(request.cluster.devices)
    allowed = cost.unit_devices(units)
    if not all(allowed):
        return None
    unit_device = [0] * len(units)
    weight = persistent_bytes_by(graph, units.unit_of, len(units))
    for unit in sorted(range(len(units)), key=lambda u: -weight[u]):
        unit_device[unit] = min(allowed[unit], key=held.__getitem__)
        held[unit_device[unit]] += weight[unit]
    device_of = [unit_device[units.unit_of[op]] for op in range(len(graph))]
    orders: list[list[int]] = [[] for _ in held]
    for op in graph.topo:
        orders[device_of[op]].append(op)
    return request.replay(device_of, orders)


def overshoot(simulation: Simulation, cluster: Cluster) -> dict[int, int]:
    """Device index → bytes over its limit, for devices whose simulated peak exceeds it."""
    over = {}
    for d, device in enumerate(cluster.devices):
        peak = simulation.memory[d].peak
        if device.memory_bytes is not None and peak > device.memory_bytes:
            over[d] = peak - device.memory_bytes
    return over


def graph_needs(graph: Graph, cost: CostModel) -> dict[str, int]:
    """What the whole graph needs: its single-device peak and its persistent bytes."""
    peak = single_device_run_of(cost)[1]
    return {"graph_needs_bytes": peak, "graph_persistent_bytes": sum(graph.persistent_bytes)}


def over_limit_error(
    request: Request, simulation: Simulation, over: dict[int, int], algorithm: str
) -> InfeasiblePlacement:
    """The error of a run whose best plan still overshoots ``over`` (device → bytes)."""
    graph, cluster = request.graph, request.cluster
    d, excess = max(over.items(), key=lambda item: item[1])
    device = cluster.devices[d]
    needs = graph_needs(graph, request.cost)
    total = sum(dev.memory_bytes or 0 for dev in cluster.devices)
    return InfeasiblePlacement(
        f"{algorithm}: no plan within memory found; the best one needs "
        f"{simulation.memory[d].peak} bytes on {device.name!r} ({excess} over its "
        f"{device.memory_bytes}); the whole graph needs {needs['graph_needs_bytes']} bytes on "
        f"one device ({needs['graph_persistent_bytes']} of them persistent), the cluster has "
        f"{total} in all",
        {"device": device.name, "missing_bytes": excess, **needs},
    )


__all__ = [
    "MEMORY_RETRIES",
    "ORDERING_SHARE",
    "Request",
    "Run",
    "add_seconds",
    "graph_needs",
    "memory_blind_replay",
    "over_limit_error",
    "overshoot",
    "run_algorithm",
    "single_plan",
    "spread_plan",
]
