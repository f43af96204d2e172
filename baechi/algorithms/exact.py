"""``exact``: placement and per-device order chosen jointly on OR-Tools CP-SAT (Pesto's idea).

The model, for a graph small enough (:data:`EXACT_MAX_OPS`; ``auto`` calls it on small graphs):

- each unit (colocation group, forward pair, pin; :class:`~baechi.grouping.Units`) goes to
  exactly one device it may use;
- each op is an optional interval on every device its unit may go to, its length the op's
  time there (:class:`~baechi.costmodel.CostModel`); a device runs one op at a time;
- an edge between units on different devices delays its consumer by the message's transfer
  time; on the same device by nothing;
- the persistent bytes placed on a device fit its budget;
- minimise the makespan.

What is exact and what is not. With ``network.mode: "parallel"`` and no memory limit the model
is the simulator's cost model: a transfer starts when its producer ends and a cached tensor
arrives at the same time for every consumer on a device, so the model's optimum is the best
step time of any plan, and ``stats.optimal`` says CP-SAT proved it. In sequential mode the
model leaves out channel contention, and under memory limits it counts only persistent bytes:
both are relaxations, so ``stats.bound_us`` (CP-SAT's proven bound) is still a lower bound on
every plan's step time, but the plan's step time is the simulator's replay and
``stats.optimal`` is claimed only when that replay meets the bound. Times are integers: µs
times ``scale`` (the smallest power of ten, up to 10**6, that makes every time whole; else
rounded, and then the bound is lowered by the largest relative rounding error).

A hint plan (``problem.hint``: the best heuristic plan, given by ``auto``; m-ETF's plan when
none is given) warm-starts the solver, and the plan returned is never slower than the hint
under the simulator.

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

import math
import time
from typing import Any

from ortools.sat.python import cp_model

from baechi.algorithms.base import Assignment, Problem
from baechi.algorithms.etf import place_etf
from baechi.costmodel import CostModel
from baechi.errors import InfeasiblePlacement
from baechi.simulate import replay

#: Largest graph (ops, after any reduction) that ``exact`` models: CP-SAT proved most of the
#: STG graphs (50–100 ops, 4 devices) optimal within seconds; beyond a few hundred ops the
#: model's no-overlap constraints grow quadratically and the proofs stop coming.
EXACT_MAX_OPS = 300

#: Largest scale (integer time units per µs).
MAX_SCALE = 10**6

#: Largest scaled horizon: CP-SAT's integers are int64; stay far below.
MAX_HORIZON = 2**40

#: CP-SAT worker threads (this project's machines have 2 cores).
WORKERS = 2

#: Relative differences below this are float noise (the simulator adds floats too).
FLOAT_SLACK = 1e-9


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
    graph, cluster, units = problem.graph, problem.cluster, problem.units
    n, n_dev = len(graph), len(cluster.devices)
    cost = problem.cost
    hint = problem.hint or _etf_hint(problem)
    if n > EXACT_MAX_OPS:
        if hint is None:
            raise InfeasiblePlacement(f"exact: m-ETF found no plan within memory for the "
                                      f"warm start, and the graph ({n} ops) is too large")
        return Assignment(hint.device_of, hint.orders, {
            "optimal": False, "bound_us": cost.lower_bound_us(),
            "fallback": f"exact models graphs of up to {EXACT_MAX_OPS} ops (this one has {n} "
                        "after the reduction pipeline): m-ETF's plan"})
    allowed = [list(problem.devices_for(u)) for u in range(len(units))]
    edges = _unit_edges(problem, cost)
    times = [t for d in range(n_dev) for t in cost.op_us[d] if math.isfinite(t)]
    times += [t for *_, delays in edges for t in delays.values()]
    scale, rounding = _scale(times, _horizon_us(problem, cost, hint))

    def ticks(us: float) -> int:
        return round(us * scale)

    model = cp_model.CpModel()
    horizon = ticks(_horizon_us(problem, cost, hint)) + 1
    on = {(u, d): model.NewBoolVar(f"u{u}d{d}") for u in range(len(units)) for d in allowed[u]}
    for u in range(len(units)):
        model.AddExactlyOne(on[u, d] for d in allowed[u])
    start = [model.NewIntVar(0, horizon, f"s{v}") for v in range(n)]
    end = [model.NewIntVar(0, horizon, f"e{v}") for v in range(n)]
    per_device: list[list[Any]] = [[] for _ in range(n_dev)]
    for v in range(n):
        u = units.unit_of[v]
        for d in allowed[u]:
            interval = model.NewOptionalFixedSizeIntervalVar(
                start[v], ticks(cost.op_us[d][v]), on[u, d], f"i{v}d{d}")
            per_device[d].append(interval)
            model.Add(end[v] == start[v] + ticks(cost.op_us[d][v])).OnlyEnforceIf(on[u, d])
    for intervals in per_device:
        model.AddNoOverlap(intervals)
    same: dict[tuple[int, int], Any] = {}
    for src, dst, unit_a, unit_b, delays in edges:
        model.Add(start[dst] >= end[src])
        if unit_a == unit_b:
            continue
        pair = (min(unit_a, unit_b), max(unit_a, unit_b))
        if pair not in same:
            same[pair] = _same_device(model, on, allowed, *pair)
        # the cheapest link whenever the units are apart; a dearer link (per-pair links,
        # DESIGN §10) when the units sit on its two devices
        least = min(delays.values(), default=0.0)
        model.Add(start[dst] >= end[src] + ticks(least)).OnlyEnforceIf(same[pair].Not())
        for (a, b), delay in delays.items():
            if delay > least and (unit_a, a) in on and (unit_b, b) in on:
                model.Add(start[dst] >= end[src] + ticks(delay)).OnlyEnforceIf(
                    [on[unit_a, a], on[unit_b, b]])
    persistent = [sum(graph.persistent_bytes[v] for v in members) for members in units.members]
    for d in range(n_dev):
        if math.isfinite(problem.budget[d]):
            model.Add(sum(persistent[u] * on[u, d] for u in range(len(units))
                          if (u, d) in on) <= int(problem.budget[d]))
    symmetric = _interchangeable(problem, cost)
    if symmetric:
        _break_symmetry(model, on, len(units), n_dev)
    # the simulator's lower bound (critical path, total work / total speed) holds for every
    # plan; CP-SAT's own bound is weak on such scheduling models, so give it this one too
    floor_us = cost.lower_bound_us()
    makespan = model.NewIntVar(min(horizon, math.floor(floor_us * scale / (1 + rounding))),
                               horizon, "makespan")
    model.AddMaxEquality(makespan, end)
    model.Minimize(makespan)
    if hint is not None:
        _add_hint(model, problem, cost, hint, on, start, end, ticks, symmetric)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, problem.time_limit_s
                                                - (time.perf_counter() - began))
    solver.parameters.num_workers = WORKERS
    status = solver.Solve(model)
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    stats: dict[str, Any] = {
        "solver_status": solver.StatusName(status),
        "solve_seconds": solver.WallTime(),
        "scale": scale,
    }
    bound_us = max(floor_us, solver.BestObjectiveBound() / scale / (1 + rounding)
                   if found else 0.0)
    stats["bound_us"] = bound_us
    if not found:
        if hint is None:
            raise InfeasiblePlacement(
                f"exact: CP-SAT found no plan ({solver.StatusName(status)}) within "
                f"{problem.time_limit_s:g} s")
        return Assignment(hint.device_of, hint.orders, {**stats, "optimal": False,
                                                        "note": "kept the hint plan"})
    device_of = [-1] * n
    for (u, d), var in on.items():
        if solver.Value(var):
            for v in units.members[u]:
                device_of[v] = d
    position = {v: i for i, v in enumerate(graph.topo)}
    orders: list[list[int]] = [[] for _ in range(n_dev)]
    for v in sorted(range(n), key=lambda v: (solver.Value(start[v]), solver.Value(end[v]),
                                             position[v])):
        orders[device_of[v]].append(v)
    step_us = replay(graph, cluster, device_of, orders, cost).estimate.step_time_us
    if hint is not None:
        hint_us = replay(graph, cluster, hint.device_of, hint.orders, cost).estimate.step_time_us
        if hint_us < step_us:
            return Assignment(hint.device_of, hint.orders, {
                **stats, "optimal": hint_us <= bound_us * (1 + FLOAT_SLACK),
                "note": "the hint plan replays faster than the solver's"})
    # the model relaxes the simulator (no channel contention, persistent bytes only), so its
    # bound holds for every plan: a plan that meets it is optimal, whatever the mode
    stats["optimal"] = step_us <= bound_us * (1 + FLOAT_SLACK)
    stats["model_step_us"] = solver.ObjectiveValue() / scale
    return Assignment(device_of, orders, stats)


def _etf_hint(problem: Problem) -> Assignment | None:
    """m-ETF's plan, the warm start when the caller gives none (``None`` if it finds none)."""
    try:
        return place_etf(problem)
    except InfeasiblePlacement:
        return None


def _unit_edges(
    problem: Problem, cost: CostModel
) -> list[tuple[int, int, int, int, dict[tuple[int, int], float]]]:
    """(src op, dst op, src unit, dst unit, transfer µs per device pair) per op pair, parallel
    edges merged (the consumer waits for the slowest of their messages)."""
    graph, unit_of = problem.graph, problem.units.unit_of
    n_dev = len(problem.cluster.devices)
    pairs = [(a, b) for a in range(n_dev) for b in range(n_dev) if a != b]
    worst: dict[tuple[int, int], dict[tuple[int, int], float]] = {}
    for k in range(graph.num_edges):
        delays = worst.setdefault((graph.edge_src[k], graph.edge_dst[k]), {})
        for a, b in pairs:
            delays[a, b] = max(delays.get((a, b), 0.0), cost.transfer_us(k, a, b))
    return [(s, t, unit_of[s], unit_of[t], delays) for (s, t), delays in worst.items()]


def _same_device(model: cp_model.CpModel, on: dict[tuple[int, int], Any],
                 allowed: list[list[int]], a: int, b: int) -> Any:
    """A boolean true iff units ``a`` and ``b`` are on one device."""
    same = model.NewBoolVar(f"same{a}_{b}")
    both = []
    for d in set(allowed[a]) & set(allowed[b]):
        together = model.NewBoolVar(f"on{a}_{b}d{d}")
        model.AddBoolAnd([on[a, d], on[b, d]]).OnlyEnforceIf(together)
        model.AddBoolOr([on[a, d].Not(), on[b, d].Not()]).OnlyEnforceIf(together.Not())
        both.append(together)
    if both:
        model.AddMaxEquality(same, both)
    else:
        model.Add(same == 0)
    return same


def _interchangeable(problem: Problem, cost: CostModel) -> bool:
    """Whether every device is interchangeable: same op times, same budget, no pins (then any
    relabelling of a plan's devices is the same plan)."""
    first = cost.op_us[0]
    return (all(row == first for row in cost.op_us)
            and len(set(problem.budget)) == 1 and all(p < 0 for p in problem.units.pin)
            and _uniform_links(problem, cost))


def _uniform_links(problem: Problem, cost: CostModel) -> bool:
    """Whether every message costs the same between any two devices."""
    n_dev = len(problem.cluster.devices)
    return all(len({cost.transfer_us(k, a, b) for a in range(n_dev) for b in range(n_dev)
                    if a != b}) <= 1 for k in range(problem.graph.num_edges))


def _break_symmetry(model: cp_model.CpModel, on: dict[tuple[int, int], Any], n_units: int,
                    n_dev: int) -> None:
    """Interchangeable devices: number them in the order units first use them (unit 0 on
    device 0; each unit on a device already used or the next one)."""
    used = model.NewConstant(-1)
    for u in range(n_units):
        device = model.NewIntVar(0, n_dev - 1, f"dev{u}")
        model.Add(device == sum(d * on[u, d] for d in range(n_dev)))
        model.Add(device <= used + 1)
        highest = model.NewIntVar(0, n_dev - 1, f"used{u}")
        model.AddMaxEquality(highest, [used, device])
        used = highest


def _relabel(problem: Problem, device_of: list[int]) -> list[int]:
    """The same placement with devices numbered in the order units first use them."""
    label: dict[int, int] = {}
    for members in problem.units.members:
        label.setdefault(device_of[members[0]], len(label))
    return [label[d] for d in device_of]


def _horizon_us(problem: Problem, cost: CostModel, hint: Assignment | None) -> float:
    """An upper bound on the optimal makespan: the hint's replay, else everything serialised."""
    if hint is not None:
        return replay(problem.graph, problem.cluster, hint.device_of, hint.orders,
                      cost).estimate.step_time_us
    graph, n_dev = problem.graph, len(problem.cluster.devices)
    slowest = sum(max((t for d in range(n_dev) if math.isfinite(t := cost.op_us[d][v])),
                      default=0.0) for v in range(len(graph)))
    transfers = sum(max((cost.transfer_us(k, a, b) for a in range(n_dev)
                         for b in range(n_dev) if a != b), default=0.0)
                    for k in range(graph.num_edges))
    return slowest + transfers


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


def _add_hint(model: cp_model.CpModel, problem: Problem, cost: CostModel, hint: Assignment,
              on: dict[tuple[int, int], Any], start: list[Any], end: list[Any],
              ticks: Any, symmetric: bool) -> None:
    """Warm start from the hint plan's placement and its replayed times."""
    simulation = replay(problem.graph, problem.cluster, hint.device_of, hint.orders, cost)
    device_of = _relabel(problem, hint.device_of) if symmetric else hint.device_of
    for (u, d), var in on.items():
        model.AddHint(var, device_of[problem.units.members[u][0]] == d)
    for v in range(len(problem.graph)):
        model.AddHint(start[v], ticks(simulation.start[v]))
        model.AddHint(end[v], ticks(simulation.end[v]))


__all__ = ["EXACT_MAX_OPS", "place_exact"]
