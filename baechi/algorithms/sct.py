"""m-SCT: small-communication-time scheduling with favourite children (Baechi, docs/format.md §6).

The favourite-child LP (Hanen & Munier's relaxation) picks, for each op, at most one child
whose data should stay on the same device; it is solved with OR-Tools' GLOP. The schedule
is then m-ETF in which a device that just finished an op waits for that op's favourite
child unless an urgent op is ready (:class:`~baechi.algorithms.etf.ListScheduler`).

LP over the graph's op pairs (parallel edges between two ops are one pair)::

    minimise w  subject to
      s_u + p_u + c_uv * x_uv <= s_v      for each pair u -> v
      sum_children x_uv >= outdeg(u) - 1  for each op u
      sum_parents  x_uv >= indeg(v) - 1   for each op v
      s_v + p_v <= w,  0 <= x <= 1,  s >= 0

``x_uv = 0`` marks ``v`` as ``u``'s favourite child. ``p`` is compute on the fastest device,
``c`` the transfer time of the pair's tensors (summed in sequential mode, where they queue on
one channel; the largest in parallel mode).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from baechi.algorithms.base import Assignment, Problem
from baechi.algorithms.etf import ListScheduler, place_etf

#: GLOP's algorithm ("dual" or "primal" simplex; ``None``: the solver's default, for
#: bench/lp_solvers.py's PDLP row). Measured on gnmt_baechi: dual simplex 0.3 s, primal
#: 1.5 s, PDLP 31 s.
LP_ALGORITHM: str | None = "dual"


#: x at or below this is rounded to "favourite".
FAVOURITE_THRESHOLD = 0.5

#: The share of the placer's time limit that building and solving the LP may take: the
#: schedule (m-SCT's, or m-ETF's when the LP did not finish) needs the rest. A layered graph
#: of ``baechi.testing`` (10,000 ops, 4 PCIe devices, unreduced): LP 25 s, schedule 9 s;
#: with the whole limit the LP left the m-ETF fallback no time at ``time_limit_s`` 10.
LP_SHARE = 0.5

#: The key of :attr:`Problem.memo <baechi.algorithms.base.Problem.memo>` under which m-SCT
#: keeps its favourite children and the LP's stats (or why the LP was not solved): the LP
#: does not depend on the memory budgets, so a memory retry, and every other problem of the
#: request's graph (:meth:`baechi.placing.Request.problem`), reuses them.
MEMO_KEY = "m-sct"


def op_pairs(problem: Problem) -> tuple[list[int], list[int], list[float]]:
    """Distinct (src, dst) pairs of the graph and the transfer time of each (on the default
    link: :meth:`~baechi.costmodel.CostModel.nominal_transfer_us`)."""
    graph, model = problem.graph, problem.cost
    sequential = model.sequential
    index: dict[tuple[int, int], int] = {}
    src: list[int] = []
    dst: list[int] = []
    cost: list[float] = []
    for k in range(graph.num_edges):
        pair = (graph.edge_src[k], graph.edge_dst[k])
        c = model.nominal_transfer_us(k)
        i = index.get(pair)
        if i is None:
            index[pair] = len(src)
            src.append(pair[0])
            dst.append(pair[1])
            cost.append(c)
        else:
            cost[i] = cost[i] + c if sequential else max(cost[i], c)
    return src, dst, cost


def favourite_children(
    problem: Problem, time_limit_s: float | None = None
) -> tuple[list[int], dict[str, Any]]:
    """Solve the favourite-child LP; return each op's favourite child (-1: none) and stats.

    Raises ``TimeoutError`` when building and solving take longer than ``time_limit_s``
    (default ``problem.time_limit_s``).

    Examples
    --------
    >>> from baechi import Cluster, load_graph
    >>> from baechi.grouping import colocation_units
    >>> g = load_graph({"format": "baechi.graph/v1",
    ...     "ops": [{"name": n, "compute_us": 10} for n in "abc"],
    ...     "edges": [{"src": "a", "dst": "b", "bytes": 10**6},
    ...               {"src": "a", "dst": "c", "bytes": 10}]})
    >>> c = Cluster.uniform(2, latency_us=1, bandwidth_gbps=1)
    >>> favourite_children(Problem.of(g, c, colocation_units(g, c)))[0]
    [1, -1, -1]
    """
    from ortools.linear_solver import pywraplp

    limit_s = problem.time_limit_s if time_limit_s is None else time_limit_s
    graph = problem.graph
    n = len(graph)
    src, dst, cost = op_pairs(problem)
    tick = time.perf_counter()
    solver = pywraplp.Solver.CreateSolver("GLOP")
    # Generic parameters, not GLOP's text format: parsing that protobuf text segfaults in a
    # process that imported TensorFlow first (their protobuf runtimes clash).
    parameters = pywraplp.MPSolverParameters()
    if LP_ALGORITHM is not None:
        parameters.SetIntegerParam(parameters.LP_ALGORITHM, {
            "dual": parameters.DUAL, "primal": parameters.PRIMAL}[LP_ALGORITHM])
    inf = solver.infinity()
    start = [solver.NumVar(0, inf, "") for _ in range(n)]
    x = [solver.NumVar(0, 1, "") for _ in range(len(src))]
    makespan = solver.NumVar(0, inf, "w")
    compute = problem.cost.fastest_us
    children: list[list[int]] = [[] for _ in range(n)]
    parents: list[list[int]] = [[] for _ in range(n)]
    for i, (u, v) in enumerate(zip(src, dst, strict=True)):
        # s_v - s_u - c x >= p_u
        constraint = solver.Constraint(compute[u], inf)
        constraint.SetCoefficient(start[v], 1)
        constraint.SetCoefficient(start[u], -1)
        constraint.SetCoefficient(x[i], -cost[i])
        children[u].append(i)
        parents[v].append(i)
    for op in range(n):
        for pairs in (children[op], parents[op]):
            if len(pairs) > 1:
                constraint = solver.Constraint(len(pairs) - 1, inf)
                for i in pairs:
                    constraint.SetCoefficient(x[i], 1)
        if not children[op]:
            constraint = solver.Constraint(compute[op], inf)
            constraint.SetCoefficient(makespan, 1)
            constraint.SetCoefficient(start[op], -1)
    solver.Minimize(makespan)
    built = time.perf_counter()
    remaining = limit_s - (built - tick)
    if remaining <= 0:
        raise TimeoutError(f"building the LP took {built - tick:.3g} s, the whole time limit")
    solver.SetTimeLimit(max(1, int(remaining * 1000)))
    status = solver.Solve(parameters)
    remaining = limit_s - (time.perf_counter() - tick)
    if status == pywraplp.Solver.ABNORMAL and remaining > 0:
        # GLOP's presolve gives up on some LPs (gnmt_baechi after fusion); without it they
        # solve. Within what is left of the limit: a layered graph of 10,000 ops at 2 s took
        # 3.3 s in two solves when the second had the whole limit again
        parameters.SetIntegerParam(parameters.PRESOLVE, parameters.PRESOLVE_OFF)
        solver.SetTimeLimit(max(1, int(remaining * 1000)))
        status = solver.Solve(parameters)
    solved = time.perf_counter()
    if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        raise TimeoutError(f"GLOP status {status} after {solved - built:.1f} s")
    values = [var.solution_value() for var in x]
    favourite = [-1] * n
    has_parent = [False] * n
    for i in sorted(range(len(src)), key=lambda i: values[i]):
        if values[i] > FAVOURITE_THRESHOLD:
            break
        u, v = src[i], dst[i]
        if favourite[u] < 0 and not has_parent[v]:
            favourite[u] = v
            has_parent[v] = True
    stats = {
        "lp_variables": solver.NumVariables(),
        "lp_constraints": solver.NumConstraints(),
        "lp_build_seconds": built - tick,
        "lp_solve_seconds": solved - built,
        "lp_makespan_us": makespan.solution_value(),
        "favourite_children": sum(1 for f in favourite if f >= 0),
    }
    return favourite, stats


@dataclass(frozen=True)
class _Unsolved:
    """Why the LP was not solved, and within what limit (s): a memory retry, or another
    problem of the same graph and units with no longer a limit, places with m-ETF at once."""

    message: str
    limit_s: float


def place_sct(problem: Problem) -> Assignment:
    """m-SCT on ``problem``; falls back to m-ETF (said in the stats) if the LP does not
    finish within :data:`LP_SHARE` of the time limit."""
    problem.progress("lp", 0.0)
    limit_s = LP_SHARE * problem.time_limit_s
    solved = problem.memo.get(MEMO_KEY)
    if solved is None or (isinstance(solved, _Unsolved) and solved.limit_s < limit_s):
        try:
            solved = favourite_children(problem, limit_s)
        except TimeoutError as exc:  # said once, not solved again within no longer a limit
            solved = _Unsolved(f"m-sct: LP not solved ({exc}); placed with m-etf", limit_s)
        problem.memo[MEMO_KEY] = solved
    if isinstance(solved, _Unsolved):
        assignment = place_etf(problem)
        assignment.stats["fallback"] = solved.message
        return assignment
    favourite, stats = solved
    problem.progress("lp", 1.0)
    assignment = ListScheduler(problem, favourite_child=favourite).run()
    assignment.stats.update(stats)
    return assignment
