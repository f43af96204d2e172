"""``exact``: placement and per-device order chosen jointly on OR-Tools CP-SAT (Pesto's idea).

The model, for a graph small enough (:data:`EXACT_MAX_OPS`; ``auto`` calls it on small graphs):

- each unit (colocation group, forward pair, pin; :class:`~baechi.grouping.Units`) goes to
  exactly one device it may use;
- each op is an optional interval on every device its unit may go to, its length the op's
  time there (:class:`~baechi.costmodel.CostModel`); a device runs one op at a time;
- a message (one per tensor and destination device: docs/format.md §4 caching) delays every consumer
  on another device by its transfer time on that device pair; on the same device by nothing;
- sequential mode: each message is also an optional interval on the sender's and the
  receiver's channel, which carry one message at a time;
- the persistent bytes placed on a device fit its budget, and under a budget the bytes held
  over time too: persistent, temps while ops run, outputs until their last consumer on the
  device ends and their messages elsewhere arrive, received copies while their consumers
  there run and their transfer before (:meth:`_Model._memory`);
- minimise the makespan.

What is exact and what is not (details in ``docs/exact.md``). Every simulator run of any plan is
a solution of the model (the model is a relaxation), so CP-SAT's proven bound is a lower bound
of every plan's step time (``stats.bound_us``). With ``network.mode: "parallel"`` and no memory
limit the model is the simulator's cost model too: the replay of the solver's plan equals its
objective, and an OPTIMAL status is the best step time of any plan. In sequential mode the
simulator books channels first come, first served, which the solver's channel order may not
follow, and under memory limits the model holds each tensor for the least time the simulator
can (a relaxation) and the replay may start ops earlier than the solution (allocating
earlier): there the plan's step time and peak
are its replay. In sequential mode the plan also carries the solution's channel order
(``Assignment.transfer_order``: each channel's messages by their start in the solution), and
the replay books the channels in that order when that is faster than first come, first
served: replayed so, every op and message starts no later than in the solution, so the
replay meets the solver's objective wherever the channel model holds (every message takes
time, and each costs what its edges cost). In every mode ``stats.optimal`` is claimed only
when the returned plan fits memory and its replay meets the proven bound, so it is never
claimed falsely. Times are
integers: µs times ``scale`` (the smallest power of ten, up to 10**6, that makes every time
whole; else rounded, and then the bound is lowered by the largest relative rounding error).

A hint plan (``problem.hint``: the best heuristic plan, given by ``auto``; when none is given,
the better of m-ETF's and m-fill's plans: within memory first, then faster)
warm-starts the solver, and the plan returned is never slower than the hint
under the simulator (when both fit memory).

Examples
--------
>>> from baechi import Cluster, load_graph
>>> from baechi.algorithms.base import Problem
>>> from baechi.grouping import colocation_units
>>> g = load_graph({"format": "baechi.graph/v1",
...     "ops": [{"name": n, "compute_us": t} for n, t in zip("abcd", (2, 3, 4, 1))],
...     "edges": [{"src": "a", "dst": "b", "bytes": 0}, {"src": "a", "dst": "c", "bytes": 0},
...               {"src": "b", "dst": "d", "bytes": 0}, {"src": "c", "dst": "d", "bytes": 0}]})
>>> cluster = Cluster.uniform(2, latency_us=1, mode="parallel")
>>> result = place_exact(Problem.of(g, cluster, colocation_units(g, cluster), time_limit_s=5))
>>> result.stats["optimal"], result.stats["bound_us"], result.stats["model_step_us"]
(True, 8.0, 8.0)
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from baechi.algorithms.base import Assignment, Problem, Progress
from baechi.algorithms.etf import place_etf
from baechi.algorithms.fill import place_fill
from baechi.bounds import meets_bound, step_bound_us
from baechi.costmodel import CostModel
from baechi.errors import InfeasiblePlacement, InvalidPlan
from baechi.memory import persistent_bytes_by
from baechi.simulate import Simulation, TransferKey, replay

#: Largest graph (ops, after any reduction) that ``exact`` models: CP-SAT proved most of the
#: STG graphs (50–100 ops, 4 devices) optimal within seconds; beyond a few hundred ops the
#: model's no-overlap constraints grow quadratically and the proofs stop coming.
EXACT_MAX_OPS = 300

#: Largest number of message intervals (messages × device pairs) of the sequential-mode
#: channel model; beyond it the channels are left out (a weaker relaxation, still a bound).
MAX_CHANNEL_INTERVALS = 20_000

#: Where the model is not the simulator's, this many of the solver's last solutions are
#: replayed and the best replay kept.
REPLAYED_SOLUTIONS = 20

#: Above this many ops, or channel intervals, CP-SAT's presolve does not probe.
PROBING_MAX_OPS = 150
PROBING_MAX_INTERVALS = 1000

#: Least seconds between two progress reports while the solver finds better plans.
PROGRESS_EVERY_S = 0.5

#: Largest scale (integer time units per µs).
MAX_SCALE = 10**6

#: Largest scaled horizon: CP-SAT's integers are int64; stay far below.
MAX_HORIZON = 2**40

#: Largest capacity × horizon of a memory cumulative. CP-SAT's energy reasoning multiplies
#: demands by durations in int64: with 1.96 GB budgets and a 4.8e11-tick horizon (ResNet-50
#: operator graph at 50% memory, time scale 10^6) it overflowed and CP-SAT aborted the whole
#: process ("Check failed: threshold > 0"). Bytes are counted in coarser units above it.
MAX_MEMORY_ENERGY = 2**56

#: CP-SAT worker threads (this project's machines have 2 cores). 4 on 2 cores, ``auto`` at
#: ``time_limit_s`` 10 on the 24 settings at 50% memory of the graphs of up to 300 ops
#: (``python bench/compare.py --b baechi.algorithms.exact.WORKERS=4 --seconds 10``): geomean
#: step 1.0008, none faster, 2 slower. More cores than 2 are unmeasured.
WORKERS = 2

#: CP-SAT subsolvers left out when ``exact`` solves its relaxed model (``Problem.relaxed``:
#: what ``auto`` solves on a reduced graph, always from a hint). The violation local search
#: and the feasibility pump are built to reach feasible solutions, which the hint already
#: gives; on :data:`WORKERS` 2 they share the second worker with the large neighbourhood
#: searches, which then get it alone. ``auto`` at ``time_limit_s`` 2 on the 204
#: memory-limited settings of bench/run.py (``python bench/compare.py --a
#: 'baechi.algorithms.exact.RELAXED_IGNORED_SUBSOLVERS=[]'``): geomean 0.9986 (11 faster, 19
#: slower by at most 2.8%), on PCIe 0.9968, and again on PCIe 0.9978 (10 faster, 5 slower by
#: at most 1.1%); inceptionv3_training_layer, PCIe, suggested memory: 549.5 -> 518.4 and
#: 547.5 -> 517.2 ms; resnet50_training_layer, PCIe, 30%: 626.7 -> 553.7 ms (at 50%: 431.6 ->
#: 375.7). The relaxed solve alone at 1.2 s, three runs: inceptionv3_training_layer reduced
#: (52 nodes, PCIe, 30%) 663.6 ms each time against 670-793 ms; bert_l-12_inference_operator
#: reduced (29 nodes, PCIe, 50%) proved in 0.4 s against 0.8 s. Large neighbourhood search
#: alone (``use_lns_only``) found as fast plans but cannot prove: on small reduced graphs it
#: kept the time local search needed (resnet50_training_operator, NVLink, 75%: 613.5 -> 657.1
#: ms; geomean 0.9994 over the 204 settings). Named ``exact`` and ``exact`` on the graph itself
#: keep every subsolver (unmeasured without them).
RELAXED_IGNORED_SUBSOLVERS: tuple[str, ...] = ("ls", "feasibility_pump")

#: A time within this relative distance of a whole number of ticks is that number: float
#: noise of the scaling, no more, so that a model whose times were snapped stays within
#: float rounding of the simulator's (59.99999997 µs is no 60 µs: its model would be
#: stricter than the simulator and its bound above the plan).
FLOAT_SLACK = 1e-12


@dataclass
class _Solution:
    """What the model's plan is read from: device per op, per-device op orders, and in
    model ticks each channel interval's start (by message index and destination device) and
    each op's end."""

    device_of: list[int]
    orders: list[list[int]]
    sends: dict[tuple[int, int], int]
    end: list[int]


@dataclass
class Message:
    """One tensor of ``src`` (a cache key without its destination), the consumers in other
    units, and its transfer µs per (source device, destination device)."""

    key: tuple[Any, ...]
    src: int
    consumers: list[int]
    delays: dict[tuple[int, int], float]

    @property
    def least_us(self) -> float:
        """Its cheapest transfer: what it takes at least whenever it crosses devices."""
        return min(self.delays.values(), default=0.0)

    @property
    def nbytes(self) -> int:
        """The bytes of a copy of it (its key's last field; 0 for a control message)."""
        return self.key[-1]


def place_exact(problem: Problem) -> Assignment:
    """Solve placement and per-device order jointly on CP-SAT; see the module docstring.

    A graph of more than :data:`EXACT_MAX_OPS` ops gets the warm start's plan, with
    ``stats.fallback`` saying so.

    Raises
    ------
    InfeasiblePlacement
        No placement fits the devices' persistent-byte budgets (or CP-SAT found none in time
        and there is no hint).
    """
    began = time.perf_counter()
    graph, cluster, cost = problem.graph, problem.cluster, problem.cost
    n = len(graph)
    hint: Assignment | None = problem.hint
    hint_run: Simulation | None = None
    if hint is not None:
        hint_run = replay(graph, cluster, hint.device_of, hint.orders, cost)
    else:
        hint, hint_run = _own_hint(problem) or (None, None)
    floor_us = cost.lower_bound_us()  # the model's makespan holds it in every solution
    # every plan's, transfers that memory forces included: reported, not given to the model
    # (whose memory rule is not the bound's, so its solutions need not meet it)
    request_floor_us = step_bound_us(graph, cluster, problem.units, cost)
    if n > EXACT_MAX_OPS:
        if hint is None:
            raise InfeasiblePlacement(f"exact: m-ETF found no plan within memory for the "
                                      f"warm start, and the graph ({n} ops) is too large")
        return Assignment(hint.device_of, hint.orders, {
            "optimal": False, "bound_us": request_floor_us, "solver_status": "NOT_RUN",
            "fallback": f"exact models graphs of up to {EXACT_MAX_OPS} ops (this one has {n} "
                        "after the reduction pipeline): the warm start's plan"})
    horizon_us = _horizon_us(problem, cost, hint_run)
    messages, uniform = _messages(problem, cost)
    times = [t for row in cost.op_us for t in row if math.isfinite(t)]
    times += [t for m in messages for t in m.delays.values()]
    scale, rounding = _scale(times, horizon_us)
    if not rounding:
        # every time is a whole number of ticks, so is every plan's step time: round up
        floor_us = _whole_ticks_above(floor_us * scale) / scale
    hint_times = None
    if hint is not None and hint_run is not None:
        hint_times = _hint_times(problem, messages, scale, hint, hint_run)
        # the hint's times in ticks may end a few ticks after its step time rounded
        horizon_us = max(horizon_us, max(hint_times.end, default=0) / scale)
    try:
        _check_deadline(problem)
        built = _Model(problem, messages, scale, horizon_us, floor_us, rounding)
        _check_deadline(problem)
        if hint is not None and hint_run is not None and hint_times is not None:
            built.add_hint(hint, hint_run, hint_times)
            _check_deadline(problem)
    except _DeadlinePassed:
        # building a model of 177 ops on 14 devices took 0.8 s: past the deadline the
        # request would wait for it and a solver given no time
        if hint is None or hint_run is None:
            raise InfeasiblePlacement("exact: the deadline passed before the solver started",
                                      {"deadline_reached": True}) from None
        return _finish(hint, hint_run, {
            "solver_status": "NOT_RUN", "bound_us": max(floor_us, request_floor_us)},
            "the deadline passed before the solver started: the hint's")

    solver = _solver(max(0.01, problem.time_limit_s - (time.perf_counter() - began)),
                     probing=n <= PROBING_MAX_OPS
                     and built.channel_intervals <= PROBING_MAX_INTERVALS,
                     relaxed=problem.relaxed)
    collector = _Collector(built, problem.progress, solver.parameters.max_time_in_seconds)
    problem.progress("place", 0.0)
    status = solver.Solve(built.model, collector)
    problem.progress("place", 1.0)
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    # the bound holds for the request only while the model's budgets are the devices' limits
    # (a retry after an overshoot lowers them: plans the request allows are then cut off)
    at_limits = all(b >= (math.inf if d.memory_bytes is None else d.memory_bytes)
                    for b, d in zip(problem.budget, cluster.devices, strict=True))
    limited = any(d.memory_bytes is not None for d in cluster.devices)
    stats: dict[str, Any] = {
        "solver_status": solver.StatusName(status),
        "solve_seconds": solver.WallTime(),
        "scale": scale,
        # channels never delay messages that take no time: sequential mode is then parallel
        "model_exact": (not built.channel_intervals) and not limited and uniform
        and not rounding,
        "channels_modelled": built.channels,
    }
    proven = solver.BestObjectiveBound() / scale / (1 + rounding) if found else 0.0
    stats["bound_us"] = max(floor_us, request_floor_us, proven if at_limits else 0.0)
    if not found:
        if hint is None:
            raise InfeasiblePlacement(
                f"exact: CP-SAT found no plan ({solver.StatusName(status)}) within "
                f"{problem.time_limit_s:g} s")
        return _finish(hint, hint_run, stats, "the solver found no plan: the hint's")
    # the last solution is the model's best; in sequential mode or under memory limits the
    # simulator may rank the solutions differently, so replay the last few and keep the best
    solution = built.plan(solver)
    plan, run = built.replay(solution)
    stats["model_step_us"] = solver.ObjectiveValue() / scale
    if not stats["model_exact"]:
        for other_solution in collector.plans[-REPLAYED_SOLUTIONS:]:
            other_plan, other = built.replay(other_solution)
            if _better(other, run):
                plan, run = other_plan, other
    if hint is not None and hint_run is not None and _better(hint_run, run):
        return _finish(hint, hint_run, stats, "the hint plan replays faster than the solver's")
    return _finish(plan, run, stats, None)


def _solver(limit_s: float, *, probing: bool, relaxed: bool) -> cp_model.CpSolver:
    """CP-SAT for one solve: :data:`WORKERS` workers, stopping after ``limit_s`` seconds;
    without probing in presolve unless ``probing`` (on 300-op models it took the whole time
    limit, and CP-SAT returned no solution, not even the hint's; without it CP-SAT starts
    from the hint at once); without :data:`RELAXED_IGNORED_SUBSOLVERS` on a ``relaxed``
    model."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = limit_s
    solver.parameters.num_workers = WORKERS
    if not probing:
        solver.parameters.cp_model_probing_level = 0
    if relaxed:
        solver.parameters.ignore_subsolvers.extend(RELAXED_IGNORED_SUBSOLVERS)
    return solver


class _Collector(cp_model.CpSolverSolutionCallback):
    """Keeps every plan the solver finds, in the order found, and reports progress (the
    share of the time limit spent) at most every :data:`PROGRESS_EVERY_S` seconds."""

    def __init__(self, built: _Model, progress: Progress, limit_s: float) -> None:
        super().__init__()
        self.built = built
        self.progress = progress
        self.limit_s = limit_s
        self.reported = 0.0
        self.plans: list[_Solution] = []

    def on_solution_callback(self) -> None:
        self.plans.append(self.built.plan(self))
        now = self.WallTime()
        if now - self.reported >= PROGRESS_EVERY_S:
            self.reported = now
            self.progress("place", min(1.0, now / self.limit_s))


class _DeadlinePassed(Exception):
    """Raised while building the model once ``Problem.deadline`` has passed."""


def _check_deadline(problem: Problem) -> None:
    """Raise :class:`_DeadlinePassed` when ``problem``'s deadline has passed."""
    if time.perf_counter() >= problem.deadline:
        raise _DeadlinePassed


def _better(a: Simulation, b: Simulation) -> bool:
    """Whether plan ``a`` beats ``b``: fits memory when ``b`` does not, else is faster."""
    if a.estimate.memory_ok != b.estimate.memory_ok:
        return a.estimate.memory_ok
    return a.estimate.step_time_us < b.estimate.step_time_us


def _finish(plan: Assignment, run: Simulation, stats: dict[str, Any],
            note: str | None) -> Assignment:
    """``plan`` with ``stats``: optimal iff it fits and its replay meets the proven bound."""
    stats["optimal"] = run.estimate.memory_ok and meets_bound(run, stats["bound_us"])
    if note:
        stats["note"] = note
    return Assignment(plan.device_of, plan.orders, stats, plan.transfer_order)


def _memory_unit(capacity: int, horizon: int) -> int:
    """Bytes per unit of a memory cumulative, so that capacity × horizon (in units) stays
    within :data:`MAX_MEMORY_ENERGY`.

    Examples
    --------
    >>> _memory_unit(2**20, 2**20)
    1
    >>> _memory_unit(1_961_824_160, 480_917_259_562) > 1
    True
    """
    return max(1, -(-capacity * horizon // MAX_MEMORY_ENERGY))


class _Model:
    """The CP-SAT model of one problem (see the module docstring) and how to read its plan."""

    def __init__(self, problem: Problem, messages: list[Message], scale: int,
                 horizon_us: float, floor_us: float, rounding: float) -> None:
        self.problem = problem
        self.scale = scale
        graph, cost, units = problem.graph, problem.cost, problem.units
        n, n_dev, n_units = len(graph), len(problem.cluster.devices), len(units)
        model = self.model = cp_model.CpModel()
        horizon = self.horizon = self.ticks(horizon_us) + 1
        allowed = [list(problem.devices_for(u)) for u in range(n_units)]
        on = self.on = {(u, d): model.NewBoolVar(f"u{u}d{d}")
                        for u in range(n_units) for d in allowed[u]}
        for u in range(n_units):
            model.AddExactlyOne(on[u, d] for d in allowed[u])
        start = self.start = [model.NewIntVar(0, horizon, f"s{v}") for v in range(n)]
        end = self.end = [model.NewIntVar(0, horizon, f"e{v}") for v in range(n)]
        per_device: list[list[Any]] = [[] for _ in range(n_dev)]
        self.op_interval: dict[tuple[int, int], Any] = {}
        for v in range(n):
            u = units.unit_of[v]
            for d in allowed[u]:
                size = self.ticks(cost.op_us[d][v])
                interval = self.op_interval[v, d] = model.NewOptionalFixedSizeIntervalVar(
                    start[v], size, on[u, d], f"i{v}d{d}")
                per_device[d].append(interval)
                model.Add(end[v] == start[v] + size).OnlyEnforceIf(on[u, d])
        for intervals in per_device:
            model.AddNoOverlap(intervals)
        for k in range(graph.num_edges):
            model.Add(start[graph.edge_dst[k]] >= end[graph.edge_src[k]])
        self.same: dict[tuple[int, int], tuple[Any, dict[int, Any]]] = {}
        self._delays(messages, allowed)
        self.channel_intervals = _channel_intervals(messages, allowed) if cost.sequential \
            else 0
        self.channels = not problem.relaxed and \
            0 < self.channel_intervals <= MAX_CHANNEL_INTERVALS
        self.sends: dict[tuple[int, int], Any] = {}
        self.sent: dict[tuple[int, int, int], Any] = {}
        if self.channels:
            self._channels(messages, allowed, n_dev)
        persistent = persistent_bytes_by(graph, units.unit_of, len(units))
        for d in range(n_dev):
            if math.isfinite(problem.budget[d]):
                model.Add(sum(persistent[u] * on[u, d] for u in range(n_units)
                              if (u, d) in on) <= int(problem.budget[d]))
        self.life: dict[int, tuple[Any, dict[int, Any]]] = {}
        #: per (message index, device): whether a copy is held there, and its interval's
        #: start and end (:meth:`_memory`)
        self.copies: dict[tuple[int, int], tuple[Any, Any, Any, Any]] = {}
        if any(math.isfinite(b) for b in problem.budget):
            _check_deadline(problem)  # the memory model is the costliest part
            self._memory(messages, allowed, persistent)
        self.symmetric = _interchangeable(problem, cost)
        self.numbering: list[tuple[Any, Any]] = []
        if self.symmetric:
            self.numbering = _break_symmetry(model, on, n_units, n_dev)
        # the simulator's lower bound (critical path, total work / total speed) holds for
        # every plan; CP-SAT's own bound is weak on such scheduling models, so give it this
        low = math.floor(floor_us * scale / (1 + rounding)) if rounding else \
            round(floor_us * scale)  # whole ticks already (see place_exact)
        self.makespan = model.NewIntVar(min(horizon, low), horizon, "makespan")
        model.AddMaxEquality(self.makespan, end)
        model.Minimize(self.makespan)
        self.messages = messages
        #: message key (a transfer key without its destination) → index in ``messages``
        self.message_index = {m.key: i for i, m in enumerate(messages)}

    def ticks(self, us: float) -> int:
        """``us`` in the model's integer time units."""
        return _ticks(us, self.scale)

    def _delays(self, messages: list[Message], allowed: list[list[int]]) -> None:
        """A consumer on another device than its producer starts after the message arrives
        (in sequential mode at least its transfer time after the producer's end too)."""
        model, on, units = self.model, self.on, self.problem.units
        start, end = self.start, self.end
        for m in messages:
            unit_a = units.unit_of[m.src]
            least = m.least_us
            for dst in m.consumers:
                unit_b = units.unit_of[dst]
                # the cheapest link whenever the units are apart; a dearer link (per-pair
                # links, docs/format.md §10) when the units sit on its two devices
                model.Add(start[dst] >= end[m.src] + self.ticks(least)).OnlyEnforceIf(
                    self._same(m.src, dst, allowed).Not())
                for (a, b), delay in m.delays.items():
                    if delay > least and (unit_a, a) in on and (unit_b, b) in on:
                        model.Add(start[dst] >= end[m.src] + self.ticks(delay)).OnlyEnforceIf(
                            [on[unit_a, a], on[unit_b, b]])

    def _memory(self, messages: list[Message], allowed: list[list[int]],
                persistent: list[int]) -> None:
        """Memory over time on each device with a budget (a cumulative): the persistent bytes
        of its units throughout; an op's temp while it runs; its output from its start until
        its end, the end of every data consumer on the same device, and the earliest arrival
        of each of its messages sent elsewhere (the producer's end plus the message's
        cheapest transfer; with the channels modelled, each send's end); a received copy from
        the latest its transfer could start (its first consumer there starts at least the
        cheapest transfer after the copy's send starts; with the channels modelled, its send)
        until the last consumer there ends. Each is a part of what the simulator holds, so
        every plan is a solution (a relaxation). The relaxed model (``Problem.relaxed``)
        leaves out the copies and the outputs' wait for arrival."""
        problem, model, on = self.problem, self.model, self.on
        graph, units = problem.graph, problem.units
        unit_of = units.unit_of
        limited = [d for d, budget in enumerate(problem.budget) if math.isfinite(budget)]
        sent_from: dict[int, list[tuple[int, Message]]] = {}
        for i, m in enumerate(messages):
            sent_from.setdefault(m.src, []).append((i, m))
        # per message, its sends on the channels (sequential mode, the channels modelled):
        # whether each is present, and its arrival if so
        arrivals: dict[int, list[tuple[Any, Any]]] = {}
        for (i, a, dd), present in self.sent.items():
            arrivals.setdefault(i, []).append(
                (present, self.sends[i, dd] + self.ticks(messages[i].delays[a, dd])))
        for v in range(len(graph)):
            if not graph.output_bytes[v]:
                continue
            life = model.NewIntVar(0, self.horizon, f"life{v}")
            model.Add(life >= self.end[v])
            for k in graph.out_edges[v]:
                c = graph.edge_dst[k]
                if graph.edge_control[k]:
                    continue
                if unit_of[c] == unit_of[v]:
                    model.Add(life >= self.end[c])
                    continue
                model.Add(life >= self.end[c]).OnlyEnforceIf(self._same(v, c, allowed))
            for i, m in sent_from.get(v, ()) if not problem.relaxed else ():
                least = self.ticks(m.least_us)
                if least and m.nbytes:
                    for c in m.consumers:
                        model.Add(life >= self.end[v] + least).OnlyEnforceIf(
                            self._same(v, c, allowed).Not())
                    for present, arrival in arrivals.get(i, ()):
                        model.Add(life >= arrival).OnlyEnforceIf(present)
            sizes = {}
            for d in allowed[unit_of[v]]:
                if math.isfinite(problem.budget[d]):
                    sizes[d] = model.NewIntVar(0, self.horizon, f"held{v}d{d}")
            self.life[v] = (life, sizes)
        held: dict[int, list[tuple[Any, int]]] = {d: [] for d in limited}
        for i, m in enumerate(messages if not problem.relaxed else []):
            nbytes, source = m.nbytes, unit_of[m.src]
            least = self.ticks(m.least_us)
            for d in limited:
                takers = [c for c in m.consumers if (unit_of[c], d) in on]
                if not nbytes or not takers or allowed[source] == [d]:
                    continue
                present = model.NewBoolVar(f"c{i}d{d}")
                first = model.NewIntVar(0, self.horizon, f"cs{i}d{d}")
                last = model.NewIntVar(0, self.horizon, f"ce{i}d{d}")
                size = model.NewIntVar(0, self.horizon, f"cl{i}d{d}")
                there = on.get((source, d))
                if there is not None:
                    model.AddImplication(present, there.Not())
                for c in takers:
                    runs_there = on[unit_of[c], d]
                    model.AddBoolOr([*([] if there is None else [there]), runs_there.Not(),
                                     present])
                    model.Add(first <= self.start[c] - least).OnlyEnforceIf(
                        [runs_there, present])
                    model.Add(last >= self.end[c]).OnlyEnforceIf([runs_there, present])
                if (i, d) in self.sends:  # the channels modelled: held from its send
                    model.Add(first <= self.sends[i, d]).OnlyEnforceIf(present)
                self.copies[i, d] = (present, first, size, last)
                held[d].append((model.NewOptionalIntervalVar(first, size, last, present,
                                                             f"copy{i}d{d}"), nbytes))
        for d in limited:
            budget = problem.budget[d]
            intervals, demands = [], []
            for u in range(len(units)):
                if persistent[u] and (u, d) in on:
                    intervals.append(model.NewOptionalFixedSizeIntervalVar(
                        0, self.horizon, on[u, d], f"w{u}d{d}"))
                    demands.append(persistent[u])
            for (v, dev), interval in self.op_interval.items():
                if dev != d:
                    continue
                if graph.temp_bytes[v]:
                    intervals.append(interval)
                    demands.append(graph.temp_bytes[v])
                if v in self.life:
                    life, sizes = self.life[v]
                    intervals.append(model.NewOptionalIntervalVar(
                        self.start[v], sizes[d], life, on[unit_of[v], d], f"o{v}d{d}"))
                    demands.append(graph.output_bytes[v])
            for interval, nbytes in held[d]:
                intervals.append(interval)
                demands.append(nbytes)
            if intervals:
                unit = _memory_unit(int(budget), self.horizon)
                # floor both sides: a relaxation, so the proved bound still holds for every
                # plan; whether a plan fits is the simulator's verdict
                kept = [(i, b // unit) for i, b in zip(intervals, demands, strict=True)
                        if b // unit]
                if kept:
                    model.AddCumulative([i for i, _ in kept], [b for _, b in kept],
                                        int(budget) // unit)

    def _same(self, v: int, c: int, allowed: list[list[int]]) -> Any:
        """The boolean true iff ops ``v`` and ``c`` (of different units) share a device."""
        a, b = self.problem.units.unit_of[v], self.problem.units.unit_of[c]
        pair = (min(a, b), max(a, b))
        if pair not in self.same:
            self.same[pair] = _same_device(self.model, self.on, allowed, *pair)
        return self.same[pair][0]

    def _channels(self, messages: list[Message], allowed: list[list[int]],
                  n_dev: int) -> None:
        """Sequential mode: per message and destination device a send time; per source
        device an optional interval on both devices' channels, present iff the producer is
        there and a consumer on the destination; consumers there wait for its end."""
        model, on, units = self.model, self.on, self.problem.units
        channel: list[list[Any]] = [[] for _ in range(n_dev)]
        for i, m in enumerate(messages):
            if not any(m.delays.values()):
                continue  # takes no time: leaving it off the channels only relaxes the model
            unit_a = units.unit_of[m.src]
            for dd in range(n_dev):
                takers = [c for c in m.consumers if (units.unit_of[c], dd) in on]
                if not takers:
                    continue
                send = self.sends[i, dd] = model.NewIntVar(0, self.horizon, f"t{i}d{dd}")
                model.Add(send >= self.end[m.src])
                for a in allowed[unit_a]:
                    if a == dd:
                        continue
                    present = self.sent[i, a, dd] = model.NewBoolVar(f"p{i}a{a}d{dd}")
                    size = self.ticks(m.delays[a, dd])
                    interval = model.NewOptionalFixedSizeIntervalVar(send, size, present,
                                                                     f"m{i}a{a}d{dd}")
                    channel[a].append(interval)
                    channel[dd].append(interval)
                    model.AddImplication(present, on[unit_a, a])
                    model.AddBoolOr([on[units.unit_of[c], dd] for c in takers]).OnlyEnforceIf(
                        present)
                    for c in takers:
                        there = on[units.unit_of[c], dd]
                        model.AddBoolOr([on[unit_a, a].Not(), there.Not(), present])
                        model.Add(self.start[c] >= send + size).OnlyEnforceIf(
                            [on[unit_a, a], there])
        for intervals in channel:
            model.AddNoOverlap(intervals)

    def add_hint(self, hint: Assignment, run: Simulation, times: _HintTimes) -> None:
        """Warm start from the hint plan's placement, its replayed transfers, and its times in
        ticks (``times``, :func:`_hint_times`)."""
        problem, model = self.problem, self.model
        label = _labels(problem, hint.device_of) if self.symmetric else \
            list(range(len(problem.cluster.devices)))
        # a complete hint (every variable) lets CP-SAT start from it at once
        unit_device = [label[hint.device_of[members[0]]] for members in problem.units.members]
        for (u, d), var in self.on.items():
            model.AddHint(var, unit_device[u] == d)
        start, end = times.start, times.end
        for v in range(len(problem.graph)):
            model.AddHint(self.start[v], start[v])
            model.AddHint(self.end[v], end[v])
        model.AddHint(self.makespan, max(end, default=0))
        graph, ticks = problem.graph, self.ticks
        # the channels modelled: per (message, destination) the source and send of the
        # hint's transfer
        sent_at: dict[tuple[int, int], tuple[int, int]] = {}
        t = run.transfers
        for j, i in enumerate(times.message if self.channels else ()):
            if i is not None:
                sent_at[i, label[t.dst_device[j]]] = (label[t.src_device[j]], times.send[j])
        arrival: dict[int, int] = {}  # op -> the last arrival of its data on the channels
        for (i, dd), (a, at) in sent_at.items():
            m = self.messages[i]
            if m.nbytes and (i, a, dd) in self.sent:
                arrival[m.src] = max(arrival.get(m.src, 0), at + ticks(m.delays[a, dd]))
        # the least the model holds: what its constraints ask of the hint plan's times
        sent_elsewhere: dict[int, int] = {}  # op -> its longest cheapest transfer elsewhere
        for m in () if problem.relaxed else self.messages:
            if m.nbytes and any(hint.device_of[c] != hint.device_of[m.src]
                                for c in m.consumers):
                sent_elsewhere[m.src] = max(sent_elsewhere.get(m.src, 0), ticks(m.least_us))
        for v, (life, sizes) in self.life.items():
            d = hint.device_of[v]
            held = max([end[v] + sent_elsewhere.get(v, 0), arrival.get(v, 0)]
                       + [end[graph.edge_dst[k]] for k in graph.out_edges[v]
                          if not graph.edge_control[k]
                          and hint.device_of[graph.edge_dst[k]] == d])
            model.AddHint(life, held)
            for var in sizes.values():
                model.AddHint(var, held - start[v])
        for (i, d), (present, first, size, last) in self.copies.items():
            m = self.messages[i]
            takers = [c for c in m.consumers if label[hint.device_of[c]] == d]
            held_there = bool(takers) and label[hint.device_of[m.src]] != d
            least = ticks(m.least_us)
            begin = max(0, min(start[c] for c in takers) - least) if held_there else 0
            if held_there and (i, d) in self.sends:
                begin = min(begin, sent_at.get((i, d), (-1, begin))[1])
            finish = max(end[c] for c in takers) if held_there else 0
            model.AddHint(present, held_there)
            model.AddHint(first, begin)
            model.AddHint(last, finish)
            model.AddHint(size, finish - begin)
        for (a, b), (same, both) in self.same.items():
            model.AddHint(same, unit_device[a] == unit_device[b])
            for d, together in both.items():
                model.AddHint(together, unit_device[a] == d == unit_device[b])
        highest = -1
        for u, (device, used) in enumerate(self.numbering):
            highest = max(highest, unit_device[u])
            model.AddHint(device, unit_device[u])
            model.AddHint(used, highest)
        for (i, dd), var in self.sends.items():
            a, at = sent_at.get((i, dd), (-1, end[self.messages[i].src]))
            model.AddHint(var, at)
        for (i, a, dd), var in self.sent.items():
            model.AddHint(var, sent_at.get((i, dd), (-1, 0))[0] == a)

    def plan(self, solver: Any) -> _Solution:
        """The solution's device per op, each device's order (by start, end, topology), and
        the times its channel model gives."""
        problem = self.problem
        n = len(problem.graph)
        device_of = [-1] * n
        for (u, d), var in self.on.items():
            if solver.Value(var):
                for v in problem.units.members[u]:
                    device_of[v] = d
        position = problem.graph.topo_position
        end = [solver.Value(e) for e in self.end]
        start = [solver.Value(s) for s in self.start]
        orders: list[list[int]] = [[] for _ in problem.cluster.devices]
        for v in sorted(range(n), key=lambda v: (start[v], end[v], position[v])):
            orders[device_of[v]].append(v)
        sends = {key: solver.Value(var) for key, var in self.sends.items()} if self.channels \
            else {}
        return _Solution(device_of, orders, sends, end)

    def replay(self, solution: _Solution) -> tuple[Assignment, Simulation]:
        """The solution as a plan and its replay: with the solution's channel order when the
        channels are modelled and that replays faster, else first come, first served."""
        problem, cost = self.problem, self.problem.cost
        graph, cluster = problem.graph, problem.cluster
        fifo = replay(graph, cluster, solution.device_of, solution.orders, cost)
        plan = Assignment(solution.device_of, solution.orders)
        if not self.channels or len(fifo.transfers) < 2:
            return plan, fifo
        order = self._channel_order(solution, fifo)
        try:
            ordered = replay(graph, cluster, solution.device_of, solution.orders, cost, order,
                             name_cycle=False)
        except InvalidPlan:  # ties among messages that take no time can deadlock
            return plan, fifo
        if _better(ordered, fifo):
            return Assignment(solution.device_of, solution.orders,
                              transfer_order=order), ordered
        return plan, fifo

    def _channel_order(self, solution: _Solution, fifo: Simulation) -> list[list[TransferKey]]:
        """Each channel's messages (those of the plan's replay ``fifo``) by their start in the
        solution; a message off the channel model (it takes no time) by its producer's end;
        ties in FIFO's booking order."""
        index = self.message_index
        keys = fifo.transfers.key
        when = []
        for key in keys:
            i = index.get((key[0], *key[2:]))
            send = solution.sends.get((i, key[1])) if i is not None else None
            when.append(solution.end[key[0]] if send is None else send)
        lists: list[list[TransferKey]] = [[] for _ in self.problem.cluster.devices]
        t = fifo.transfers
        for j in sorted(range(len(keys)), key=lambda j: (when[j], j)):
            lists[t.src_device[j]].append(keys[j])
            lists[t.dst_device[j]].append(keys[j])
        return lists


def _ticks(us: float, scale: int) -> int:
    """``us`` in integer time units of ``scale`` per µs (the model's, and its hint's)."""
    return round(us * scale)


@dataclass
class _HintTimes:
    """A hint plan's times in model ticks: per op its start and end, per transfer of its
    replay (``run.transfers``) its send; and per transfer the index of its message in the
    model's list (``None``: the model has none)."""

    start: list[int]
    end: list[int]
    send: list[int]
    message: list[int | None]


def _hint_times(problem: Problem, messages: list[Message], scale: int, hint: Assignment,
                run: Simulation) -> _HintTimes:
    """The times of the hint plan's replay ``run`` in ticks (``scale`` per µs), each the
    replayed time rounded or later where the model's constraints in ticks ask for it: after
    its producers' ends and transfers, its device's previous op, its channels' previous
    messages (in the replay's order).

    Rounding each time by itself can leave a consumer a tick short of its producer's end
    plus the transfer (the durations are rounded on their own), and CP-SAT then repairs the
    hint instead of starting from it: ``bert_l-3_training_operator``, reduced, on 2 + 2 mixed
    devices (PCIe) at 80% and 50% of its peak, found its first solution after 1.9 s (the
    hint replays at 256.2 ms, the model's optimum at 122.7 ms). Each time is later than the
    rounded one by at most half a tick per constraint on its longest chain. With a cycle
    among the orders (ties of ops that take no time), the rounded times.

    Examples
    --------
    At 10 ticks per µs, an op of 0.16 µs and a transfer of 0.16 µs are 2 ticks each, but its
    consumer's start, 0.32 µs, rounds to 3 ticks: it starts at 4.

    >>> from baechi import Cluster, load_graph
    >>> from baechi.grouping import colocation_units
    >>> g = load_graph({"format": "baechi.graph/v1",
    ...     "ops": [{"name": "a", "compute_us": 0.16}, {"name": "b", "compute_us": 1}],
    ...     "edges": [{"src": "a", "dst": "b", "bytes": 0}]})
    >>> cluster = Cluster.uniform(2, latency_us=0.16, mode="parallel")
    >>> problem = Problem.of(g, cluster, colocation_units(g, cluster))
    >>> plan = Assignment([0, 1], [[0], [1]])
    >>> run = replay(g, cluster, plan.device_of, plan.orders, problem.cost)
    >>> times = _hint_times(problem, _messages(problem, problem.cost)[0], 10, plan, run)
    >>> run.start[1], times.start, times.end
    (0.32, [0, 4], [2, 14])
    """
    graph, cost, device_of = problem.graph, problem.cost, hint.device_of
    n, t = len(graph), run.transfers

    def ticks(us: float) -> int:
        return _ticks(us, scale)

    size = [ticks(cost.op_us[device_of[v]][v]) for v in range(n)]
    index = {m.key: i for i, m in enumerate(messages)}
    of_message = [index.get((t.src_op[j], None if t.control[j] else t.tensor[j], t.nbytes[j]))
                  for j in range(len(t))]
    # nodes: the ops, then the transfers; arcs (to, least distance of the starts)
    rounded = [ticks(x) for x in run.start] + [ticks(x) for x in t.start]
    earliest = rounded.copy()
    arcs: list[list[tuple[int, int]]] = [[] for _ in earliest]
    for k in range(graph.num_edges):
        arcs[graph.edge_src[k]].append((graph.edge_dst[k], size[graph.edge_src[k]]))
    for m in messages:
        a = device_of[m.src]
        for c in m.consumers:
            if device_of[c] != a:
                arcs[m.src].append((c, size[m.src] + ticks(m.delays[a, device_of[c]])))
    for order in hint.orders:
        for v, w in itertools.pairwise(order):
            arcs[v].append((w, size[v]))
    if cost.sequential and not problem.relaxed:
        on_channel: list[list[int]] = [[] for _ in problem.cluster.devices]
        for j, i in enumerate(of_message):
            if i is None:
                continue
            m, a, b = messages[i], t.src_device[j], t.dst_device[j]
            node, length = n + j, ticks(m.delays[a, b])
            arcs[m.src].append((node, size[m.src]))
            for c in m.consumers:
                if device_of[c] == b:
                    arcs[node].append((c, length))
            on_channel[a].append(j)
            on_channel[b].append(j)
        for booked in on_channel:
            booked.sort(key=lambda j: (t.start[j], j))
            for j, k in itertools.pairwise(booked):
                i = of_message[j]
                assert i is not None
                arcs[n + j].append((n + k, ticks(messages[i].delays[t.src_device[j],
                                                                    t.dst_device[j]])))
    waiting = [0] * len(earliest)
    for out in arcs:
        for w, _ in out:
            waiting[w] += 1
    ready = [v for v, count in enumerate(waiting) if count == 0]
    done = 0
    while ready:
        v = ready.pop()
        done += 1
        for w, gap in arcs[v]:
            earliest[w] = max(earliest[w], earliest[v] + gap)
            waiting[w] -= 1
            if waiting[w] == 0:
                ready.append(w)
    if done < len(earliest):  # a cycle: the times rounded, as the replay has them
        earliest = rounded
    start = earliest[:n]
    return _HintTimes(start, [s + z for s, z in zip(start, size, strict=True)], earliest[n:],
                      of_message)


def _own_hint(problem: Problem) -> tuple[Assignment, Simulation] | None:
    """The warm start when the caller gives none, with its replay: the better of m-ETF's
    and m-fill's plans (within memory first, then faster; ``None`` if neither finds a plan).
    A hint over memory is no solution of the model, and CP-SAT starts far from it (ResNet-50
    layer graph, PCIe, 50% memory: 825 ms after 1 s from m-ETF's refused plan). Where
    communication is dear m-ETF spreads what m-fill keeps together: stg50_rand0000 on 4 PCIe
    devices, m-ETF 2422 µs, m-fill 262 µs; from m-ETF's plan ``auto``'s first ``exact``
    spent 1.33 s to reach 1744 µs, from m-fill's 0.33 s to reach 249 µs."""
    best: tuple[Assignment, Simulation] | None = None
    for place_fn in (place_etf, place_fill):
        try:
            hint = place_fn(problem)
        except InfeasiblePlacement:
            continue
        run = replay(problem.graph, problem.cluster, hint.device_of, hint.orders, problem.cost)
        if best is None or _better(run, best[1]):
            best = (hint, run)
    return best


def _messages(problem: Problem, cost: CostModel) -> tuple[list[Message], bool]:
    """Every message and whether each one's edges all cost the same (else a message costs its
    cheapest edge: a relaxation, since the simulator sends the first one booked).

    A message's consumers are the ops in other units that read it; its delay per device
    pair is the transfer time of its edges there."""
    graph, unit_of = problem.graph, problem.units.unit_of
    n_dev = len(problem.cluster.devices)
    pairs = [(a, b) for a in range(n_dev) for b in range(n_dev) if a != b]
    found: dict[tuple[Any, ...], Message] = {}
    uniform = True
    for k in range(graph.num_edges):
        src, dst = graph.edge_src[k], graph.edge_dst[k]
        if unit_of[src] == unit_of[dst]:
            continue
        key = cost.transfer_key(k, 0)
        key = (key[0], *key[2:])
        delays = {pair: cost.transfer_us(k, *pair) for pair in pairs}
        m = found.get(key)
        if m is None:
            found[key] = Message(key, src, [dst], delays)
            continue
        if dst not in m.consumers:
            m.consumers.append(dst)
        if delays != m.delays:
            uniform = False
            m.delays = {pair: min(m.delays[pair], delays[pair]) for pair in pairs}
    return list(found.values()), uniform


def _channel_intervals(messages: list[Message], allowed: list[list[int]]) -> int:
    """An upper bound of the channel model's optional intervals (messages that take no time
    stay off the channels)."""
    n_dev = max((max(a, default=0) for a in allowed), default=0) + 1
    timed = sum(1 for m in messages if any(m.delays.values()))
    return timed * n_dev * max(n_dev - 1, 0)


def _same_device(model: cp_model.CpModel, on: dict[tuple[int, int], Any],
                 allowed: list[list[int]], a: int, b: int) -> tuple[Any, dict[int, Any]]:
    """A boolean true iff units ``a`` and ``b`` are on one device, and per device they may
    share a boolean true iff both are there."""
    same = model.NewBoolVar(f"same{a}_{b}")
    both = {}
    for d in sorted(set(allowed[a]) & set(allowed[b])):
        together = model.NewBoolVar(f"on{a}_{b}d{d}")
        model.AddBoolAnd([on[a, d], on[b, d]]).OnlyEnforceIf(together)
        model.AddBoolOr([on[a, d].Not(), on[b, d].Not()]).OnlyEnforceIf(together.Not())
        both[d] = together
    if both:
        model.AddMaxEquality(same, list(both.values()))
    else:
        model.Add(same == 0)
    return same, both


def _interchangeable(problem: Problem, cost: CostModel) -> bool:
    """Whether every device is interchangeable: same op times, same budget, no pins (then any
    relabelling of a plan's devices is the same plan)."""
    return (cost.same_op_times and len(set(problem.budget)) == 1
            and all(p < 0 for p in problem.units.pin) and _uniform_links(problem, cost))


def _uniform_links(problem: Problem, cost: CostModel) -> bool:
    """Whether every message costs the same between any two devices."""
    n_dev = len(problem.cluster.devices)
    return all(len({cost.transfer_us(k, a, b) for a in range(n_dev) for b in range(n_dev)
                    if a != b}) <= 1 for k in range(problem.graph.num_edges))


def _break_symmetry(model: cp_model.CpModel, on: dict[tuple[int, int], Any], n_units: int,
                    n_dev: int) -> list[tuple[Any, Any]]:
    """Interchangeable devices: number them in the order units first use them (unit 0 on
    device 0; each unit on a device already used or the next one). Returns per unit its
    device's number and the highest number used so far (for hints)."""
    numbering = []
    used = model.NewConstant(-1)
    for u in range(n_units):
        device = model.NewIntVar(0, n_dev - 1, f"dev{u}")
        model.Add(device == sum(d * on[u, d] for d in range(n_dev)))
        model.Add(device <= used + 1)
        highest = model.NewIntVar(0, n_dev - 1, f"used{u}")
        model.AddMaxEquality(highest, [used, device])
        numbering.append((device, highest))
        used = highest
    return numbering


def _labels(problem: Problem, device_of: list[int]) -> list[int]:
    """Device → its number when devices are numbered in the order units first use them
    (unused devices after, in cluster order)."""
    label: dict[int, int] = {}
    for members in problem.units.members:
        label.setdefault(device_of[members[0]], len(label))
    for d in range(len(problem.cluster.devices)):
        label.setdefault(d, len(label))
    return [label[d] for d in range(len(problem.cluster.devices))]


def _horizon_us(problem: Problem, cost: CostModel, hint_run: Simulation | None) -> float:
    """An upper bound on the optimal makespan: the hint's replay when it fits memory (else
    plans slower than the hint, but within memory, would be cut off), else everything
    serialised (every op at its slowest, every message sent one after another)."""
    if hint_run is not None and hint_run.estimate.memory_ok:
        return hint_run.estimate.step_time_us
    graph, n_dev = problem.graph, len(problem.cluster.devices)
    slowest = sum(max((t for d in range(n_dev) if math.isfinite(t := cost.op_us[d][v])),
                      default=0.0) for v in range(len(graph)))
    transfers = sum(max((cost.transfer_us(k, a, b) for a in range(n_dev)
                         for b in range(n_dev) if a != b), default=0.0)
                    for k in range(graph.num_edges))
    return slowest + transfers


def _whole_ticks_above(ticks: float) -> int:
    """The least whole number of ticks not below ``ticks`` (a float within float noise of a
    whole number is that number)."""
    nearest = round(ticks)
    if abs(ticks - nearest) <= FLOAT_SLACK * max(1.0, abs(ticks)):
        return nearest
    return math.ceil(ticks)


def _scale(times: list[float], horizon_us: float) -> tuple[int, float]:
    """(integer units per µs, the largest relative rounding error): the smallest power of ten
    that makes every time whole (to float precision), else the largest the horizon allows."""
    limit = MAX_SCALE
    while limit > 1 and horizon_us * limit > MAX_HORIZON:
        limit //= 10

    def error(scale: int) -> float:
        worst = max((abs(round(t * scale) - t * scale) / (t * scale) for t in times if t > 0),
                    default=0.0)
        return 0.0 if worst <= FLOAT_SLACK else worst

    scale = 1
    while scale < limit and error(scale):
        scale *= 10
    return scale, error(scale)


__all__ = ["EXACT_MAX_OPS", "place_exact"]
