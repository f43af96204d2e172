"""Placement for the throughput objective (docs/format.md §10): minimise the busiest device's load.

Both placers solve one integer program with OR-Tools CP-SAT over the graph's units
(colocation groups and forward pairs, which never split). Variables: ``x[u][d]`` (unit ``u`` on
device ``d``, only where every op of ``u`` can run), and per tensor crossing units and per
non-host device ``send``/``recv`` flags with ``send[t][d] >= x[a][d] - x[b][d]`` and
``recv[t][d] >= x[b][d] - x[a][d]`` for the tensor's source unit ``a`` and each consumer unit
``b``: a device pays a tensor's transfer once when it sends it and once when it receives it,
as in :mod:`baechi.throughput`. ``load[d] <= T``, memory per device within its limit; minimise
``T``. Times are integers in nanoseconds.

- ``throughput-contiguous``: the optimal **contiguous** split (Tarnawski et al.'s DP over
  ideals solves the same problem): every device takes a stage, a position ``p[d]`` in the
  pipeline (all different), and every edge between forward ops goes from a stage to the same
  or a later one, so the stages' prefixes are ideals of the forward graph; backward ops follow
  their forward ops (they share units). Warm-started from :func:`_linear_split`, a DP over
  the topological cuts of two linear orders of the units.
- ``throughput-cpsat``: any split (non-contiguous), warm-started from the contiguous optimum.

Each reports ``stats.optimal`` (the solver proved it), ``stats.bound_us`` (its lower bound on
the time per sample), ``stats.time_per_sample_us`` and ``stats.solve_seconds``; the time limit
is the request's ``time_limit_s``. Times in the model use the cost model's nominal transfer time
(:meth:`~baechi.costmodel.CostModel.nominal_transfer_us`: the edge's ``transfer_us`` or the
default link); the plan's verdict is always :func:`baechi.throughput.throughput`.
"""

from __future__ import annotations

import math
import time
from typing import Any

from baechi.algorithms.base import Assignment, Problem
from baechi.cluster import Cluster
from baechi.errors import InfeasiblePlacement
from baechi.memory import persistent_bytes_by
from baechi.throughput import Throughput, is_backward, kept_activation_bytes, tensors, throughput

#: Model times are integer nanoseconds.
NS_PER_US = 1000

#: Share of the time limit the contiguous solve may use when it only warm-starts the other.
#: Measured with 10 s on the 16 throughput inputs (bench/throughput.py): 0.8 did not bring
#: bert_l-6 training to its contiguous optimum on a loaded machine (it needs ~9 s) and cost
#: Inception-V3 training 5% (124.65 against 118.32 ms per sample), so 0.6 stays.
CONTIGUOUS_SHARE = 0.6

#: The most blocks :func:`_cut`'s DP cuts an order into: it keeps block × block tables of
#: segment loads, so 10,000 single-unit blocks (a layered graph of ``baechi.testing``) took
#: 55 s and several GB at ``time_limit_s`` 1. The Tarnawski et al. inputs have at most 456
#: (bert_l-12 training), so their splits are unchanged.
CUT_BLOCKS = 1024

#: Building the CP-SAT model looks at the clock once per this many tensors: past the time
#: limit the warm start is the answer (the model of a 10,000-op layered graph on 4 devices
#: took about 15 s to build).
BUILD_CHECK_TENSORS = 512


def _ns(us: float) -> int:
    return round(us * NS_PER_US)


def place_contiguous(problem: Problem) -> Assignment:
    """The optimal contiguous split (see the module docstring)."""
    return _solve(problem, contiguous=True, time_limit_s=problem.time_limit_s, hint=None)


def place_split(problem: Problem) -> Assignment:
    """The best split, contiguous or not, warm-started from the contiguous optimum."""
    started = time.perf_counter()
    try:
        first: Assignment | None = _solve(
            problem, contiguous=True, time_limit_s=problem.time_limit_s * CONTIGUOUS_SHARE,
            hint=None)
    except InfeasiblePlacement:  # no contiguous split (in time): search from the cut
        first = None
    left = problem.time_limit_s - (time.perf_counter() - started)
    best, second = first, None
    if first is None or left > 0:  # else no time is left for the second model
        # without a contiguous split, the solver has at least half a second to find any
        second = _solve(problem, contiguous=False,
                        time_limit_s=left if first is not None else max(0.5, left),
                        hint=first.device_of if first is not None else None)
        if first is None or second.stats["time_per_sample_us"] <= first.stats[
                "time_per_sample_us"]:
            best = second
    assert best is not None
    bound_us = max(run.stats["bound_us"] for run in (first, second) if run is not None)
    best.stats = {**best.stats, "solve_seconds": time.perf_counter() - started,
                  "contiguous_us": first.stats["time_per_sample_us"] if first else None,
                  "contiguous_optimal": first.stats.get("contiguous_optimal", False)
                  if first else False,
                  "bound_us": bound_us,
                  "optimal": meets_throughput_bound(best.stats["time_per_sample_us"],
                                                    bound_us)}
    if best.stats["optimal"]:
        best.stats.pop("optimal_note", None)
    return best


def _components(successors: list[set[int]], nodes: list[int]) -> list[int]:
    """Strongly connected components of ``nodes`` (Kosaraju, iterative): a component id per
    node (-1 for nodes not listed). Forward edges between colocation units can cycle (a group
    holding ops of two layers); such units must share a stage."""
    n = len(successors)
    inside = [False] * n
    for u in nodes:
        inside[u] = True
    finished: list[int] = []
    seen = [False] * n
    for root in nodes:
        if seen[root]:
            continue
        seen[root] = True
        stack = [(root, iter(successors[root]))]
        while stack:
            u, children = stack[-1]
            for v in children:
                if inside[v] and not seen[v]:
                    seen[v] = True
                    stack.append((v, iter(successors[v])))
                    break
            else:
                stack.pop()
                finished.append(u)
    predecessors: list[list[int]] = [[] for _ in range(n)]
    for u in nodes:
        for v in successors[u]:
            if inside[v]:
                predecessors[v].append(u)
    comp = [-1] * n
    count = 0
    for root in reversed(finished):
        if comp[root] >= 0:
            continue
        comp[root] = count
        todo = [root]
        while todo:
            u = todo.pop()
            for v in predecessors[u]:
                if comp[v] < 0:
                    comp[v] = count
                    todo.append(v)
        count += 1
    return comp


def _unit_orders(problem: Problem) -> list[tuple[list[int], list[bool]]]:
    """Linear orders of the units whose cuts are contiguous splits, each with the positions a
    segment may start at: by first op in the canonical order (when that order is valid), and
    depth first (Kahn's algorithm with a stack over the components of the forward edges
    between units, so that a chain of ops stays together, which the canonical order breaks
    on operator graphs). Units of backward ops only follow the first unit they exchange
    tensors with; a component (units whose forward edges cycle) is never cut."""
    graph, units = problem.graph, problem.units
    first = [-1] * len(units)
    canonical: list[int] = []
    for op in graph.topo:
        u = units.unit_of[op]
        if first[u] < 0:
            first[u] = len(canonical)
            canonical.append(u)
    successors: list[set[int]] = [set() for _ in range(len(units))]
    neighbours: list[set[int]] = [set() for _ in range(len(units))]
    forward = [False] * len(units)
    for op in range(len(graph)):
        if not is_backward(graph, op):
            forward[units.unit_of[op]] = True
    for k in range(graph.num_edges):
        a, b = graph.edge_src[k], graph.edge_dst[k]
        ua, ub = units.unit_of[a], units.unit_of[b]
        if ua == ub:
            continue
        neighbours[ua].add(ub)
        neighbours[ub].add(ua)
        if not is_backward(graph, a) and not is_backward(graph, b):
            successors[ua].add(ub)
    forward_units = [u for u in canonical if forward[u]]
    comp = _components(successors, forward_units)
    members: dict[int, list[int]] = {}
    for u in forward_units:  # in canonical order
        members.setdefault(comp[u], []).append(u)
    comp_successors: dict[int, set[int]] = {c: set() for c in members}
    for u in forward_units:
        for v in successors[u]:
            if comp[v] != comp[u]:
                comp_successors[comp[u]].add(comp[v])
    indegree = dict.fromkeys(members, 0)
    for succ in comp_successors.values():
        for c in succ:
            indegree[c] += 1
    key = {c: first[ms[0]] for c, ms in members.items()}
    stack = sorted((c for c in members if not indegree[c]), key=lambda c: -key[c])
    depth_first: list[int] = []
    while stack:
        c = stack.pop()
        depth_first.extend(members[c])
        ready = []
        for d in comp_successors[c]:
            indegree[d] -= 1
            if not indegree[d]:
                ready.append(d)
        stack.extend(sorted(ready, key=lambda d: -key[d]))
    orders = []
    for base in (canonical, depth_first):
        order = _with_backward_units(base, forward, neighbours, first)
        starts = _segment_starts(order, comp, successors, forward)
        if starts is not None:
            orders.append((order, starts))
    return orders


def _with_backward_units(
    base: list[int], forward: list[bool], neighbours: list[set[int]], first: list[int]
) -> list[int]:
    """``base``'s forward units, each followed by the backward-only units anchored to it (the
    earliest unit they exchange tensors with; chains of them follow their anchor)."""
    forward_order = [u for u in base if forward[u]]
    rank = {u: i for i, u in enumerate(forward_order)}
    after: dict[int, list[int]] = {}
    pending = sorted((u for u in range(len(forward)) if not forward[u]), key=first.__getitem__)
    while pending:
        left = []
        for u in pending:
            placed = [rank[v] for v in neighbours[u] if v in rank]
            if placed:
                anchor = forward_order[min(placed)]
                after.setdefault(anchor, []).append(u)
                rank[u] = rank[anchor]
            else:
                left.append(u)
        if len(left) == len(pending):
            after.setdefault(forward_order[-1] if forward_order else -1, []).extend(left)
            break
        pending = left
    order: list[int] = list(after.get(-1, []))
    stack = list(reversed(forward_order))
    while stack:
        u = stack.pop()
        order.append(u)
        stack.extend(reversed(after.get(u, [])))
    return order


def _segment_starts(
    order: list[int], comp: list[int], successors: list[set[int]], forward: list[bool]
) -> list[bool] | None:
    """Where a segment of ``order`` may start so that every cut is a contiguous split: not
    inside a component; ``None`` when the order itself breaks a forward edge."""
    position = {u: i for i, u in enumerate(order)}
    for u in order:
        if forward[u]:
            for v in successors[u]:
                if comp[v] != comp[u] and position[v] < position[u]:
                    return None
    starts = [True] * (len(order) + 1)
    last_comp = -1
    seen_comps: set[int] = set()
    for i, u in enumerate(order):
        if not forward[u]:
            continue
        c = comp[u]
        if c == last_comp:
            # units between two members of a component stay with it
            j = i
            while j > 0 and (not forward[order[j - 1]] or comp[order[j - 1]] != c):
                starts[j] = False
                j -= 1
            starts[i] = False
        elif c in seen_comps:
            return None  # a component split by another one
        seen_comps.add(c)
        last_comp = c
    return starts


def _linear_split(problem: Problem, allowed: list[list[int]]) -> list[int] | None:
    """A contiguous first guess by a DP over topological cuts (PipeDream's linear split): the
    units, in each order of :func:`_unit_orders`, cut into one segment per device along each
    sequence of :func:`_stage_sequences`, minimising the largest segment load (compute on its
    device plus, unless a host, the tensors it sends and receives, as in the CP-SAT model);
    the best cut wins. Every
    segment's communication comes from 2-D difference arrays (O(n² + tensors)); the DP is
    vectorised. ``None`` when no cut respects the kinds and memory."""
    best: tuple[float, list[int]] | None = None
    for order, starts in _unit_orders(problem):
        for stages in _stage_sequences(problem.cluster):
            found = _cut(problem, allowed, order, starts, stages)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
    return best[1] if best is not None else None


def _stage_sequences(cluster: Cluster) -> list[list[int]]:
    """The device sequences a linear order is cut along: the accelerators in cluster order,
    and the host devices (which pay no transfer time, so cheap ops and those that run only
    there go to them) inserted together at each position of that sequence.

    Examples
    --------
    >>> c = Cluster.parse({"devices": [{"name": "a"}, {"name": "b"},
    ...                                {"name": "h", "kind": "cpu", "host": True}]})
    >>> _stage_sequences(c)
    [[0, 1], [2, 0, 1], [0, 2, 1], [0, 1, 2]]
    """
    accelerators = [d for d, dev in enumerate(cluster.devices) if not dev.host]
    hosts = [d for d, dev in enumerate(cluster.devices) if dev.host]
    sequences = [accelerators]
    if hosts:
        sequences += [accelerators[:i] + hosts + accelerators[i:]
                      for i in range(len(accelerators) + 1)]
    return sequences


def _blocks(problem: Problem, order: list[int], starts: list[bool]) -> list[int]:
    """Where the blocks :func:`_cut` places whole begin, and ``len(order)``: every position a
    segment may start at, or, past :data:`CUT_BLOCKS` blocks, those nearest to even shares of
    the compute (on each unit's fastest device; of the units where there is none)."""
    import numpy as np

    bounds = [i for i, ok in enumerate(starts) if ok]
    if len(bounds) - 1 <= CUT_BLOCKS:
        return bounds
    fastest = problem.cost.fastest_us
    work = np.concatenate([[0.0], np.cumsum(
        [sum(fastest[op] for op in problem.units.members[u]) for u in order])])[bounds]
    if work[-1] <= 0:
        work = np.arange(len(bounds), dtype=float)
    targets = np.linspace(0.0, work[-1], CUT_BLOCKS + 1)[1:-1]
    keep = {0, len(bounds) - 1, *np.searchsorted(work, targets).tolist()}
    return [bounds[i] for i in sorted(keep)]


def _cut(
    problem: Problem, allowed: list[list[int]], order: list[int], starts: list[bool],
    devices: list[int],
) -> tuple[float, list[int]] | None:
    """The best cut of ``order`` into segments on ``devices`` in that sequence (each may take
    none; see :func:`_linear_split`): (largest load, unit devices). Segments are runs of the
    blocks of :func:`_blocks`: exactly the segments ``starts`` allows while they are at most
    :data:`CUT_BLOCKS`."""
    import numpy as np

    graph, units, cost, cluster = problem.graph, problem.units, problem.cost, problem.cluster
    if not devices:
        return None
    bounds = _blocks(problem, order, starts)
    n = len(bounds) - 1  # blocks
    block = [0] * len(units)
    for b in range(n):
        for i in range(bounds[b], bounds[b + 1]):
            block[order[i]] = b
    diff = np.zeros((n + 1, n + 1))

    def rect(i0: int, i1: int, j0: int, j1: int, value: float) -> None:
        """Add ``value`` to comm[i][j] for i0 ≤ i ≤ i1, j0 ≤ j ≤ j1 (inclusive)."""
        if i0 > i1 or j0 > j1:
            return
        diff[i0, j0] += value
        diff[i1 + 1, j0] -= value
        diff[i0, j1 + 1] -= value
        diff[i1 + 1, j1 + 1] += value

    last = n - 1
    for (src, _), edges in tensors(graph).items():
        p = block[units.unit_of[src]]
        consumers = sorted({block[units.unit_of[graph.edge_dst[k]]] for k in edges} - {p})
        if not consumers:
            continue
        price = max(cost.nominal_transfer_us(k) for k in edges
                    if block[units.unit_of[graph.edge_dst[k]]] != p)
        # sent by a segment holding p unless it holds every consumer too
        rect(0, p, p, last, price)
        rect(0, min(consumers[0], p), max(consumers[-1], p), last, -price)
        # received by a segment without p that holds a consumer: c_k is the first in it
        previous = -1
        for c in consumers:
            rect(previous + 1, c, c, last, price)
            rect(previous + 1, min(c, p), max(c, p), last, -price)
            previous = c
    comm = diff.cumsum(axis=0).cumsum(axis=1)[:n, :n]
    upper = np.triu(np.ones((n, n), dtype=bool))
    unit_persistent = persistent_bytes_by(graph, units.unit_of, len(units))
    members = [order[bounds[b]:bounds[b + 1]] for b in range(n)]
    persistent = np.concatenate([[0], np.cumsum(
        [sum(unit_persistent[u] for u in units_of) for units_of in members])])
    best = np.full(n + 1, np.inf)
    best[0] = 0.0  # best[x]: the least largest load placing the first x blocks
    choices = []
    for d in devices:
        us = np.array([sum(cost.op_us[d][op] for u in units_of for op in units.members[u])
                       for units_of in members])
        runs = np.array([all(d in allowed[u] for u in units_of) for units_of in members])
        compute = np.concatenate([[0.0], np.cumsum(np.where(runs, us, 0.0))])
        blocked = np.concatenate([[0], np.cumsum(~runs)])
        load = compute[None, 1:] - compute[:-1, None]  # load[i][j] of blocks i..j
        if not cluster.devices[d].host:  # a host pays no transfer time
            load = load + comm
        bad = (blocked[None, 1:] - blocked[:-1, None]) > 0
        limit = cluster.devices[d].memory_bytes
        if limit is not None:
            bad |= (persistent[None, 1:] - persistent[:-1, None]) > limit
        load = np.where(upper & ~bad, load, np.inf)
        candidate = np.maximum(best[:-1, None], load)  # [i][j]: blocks i..j on d
        start = candidate.argmin(axis=0)
        value = candidate[start, np.arange(n)]
        skip = best[1:] <= value  # d takes nothing for this prefix
        new = best.copy()
        new[1:] = np.where(skip, best[1:], value)
        choices.append(np.where(skip, -1, start))
        best = new
    if not np.isfinite(best[n]):
        return None
    unit_device = [-1] * len(units)
    end = n
    for k in range(len(devices) - 1, -1, -1):
        if end == 0:
            break
        start = int(choices[k][end - 1])
        if start < 0:
            continue
        for b in range(start, end):
            for u in members[b]:
                unit_device[u] = devices[k]
        end = start
    return (float(best[n]), unit_device) if end == 0 else None


def _solve(
    problem: Problem, contiguous: bool, time_limit_s: float, hint: list[int] | None
) -> Assignment:
    from ortools.sat.python import cp_model

    started = time.perf_counter()
    graph, cluster, units, cost = problem.graph, problem.cluster, problem.units, problem.cost
    devices = cluster.devices
    n_dev, n_units = len(devices), len(units)
    allowed = [list(problem.devices_for(u)) for u in range(n_units)]
    name = "throughput-contiguous" if contiguous else "throughput-cpsat"
    # the warm start first: when building the model outlasts the limit, it is the answer
    start_guess = hint
    if start_guess is None:
        start_guess = _linear_split(problem, allowed)
    else:
        start_guess = [start_guess[units.members[u][0]] for u in range(n_units)]
    give_up = started + time_limit_s

    def warm_start(why: str, bound_us: float, status: str) -> Assignment:
        """The warm start's split, ``why`` saying why it is the answer, when it fits; else
        no plan (``status``: the solver's)."""
        if start_guess is not None:
            plan, verdict = _assignment(problem, start_guess, {
                "optimal": False, "bound_us": bound_us, "contiguous": contiguous,
                "solve_seconds": time.perf_counter() - started,
                "fallback": f"{why} within {time_limit_s:.3g} s: the warm start's split"})
            if verdict.memory_ok:
                return plan
        raise InfeasiblePlacement(f"{name}: no split found within {time_limit_s:.3g} s",
                                  {"status": status})

    def out_of_time() -> Assignment:
        return warm_start("the CP-SAT model was not built", 0.0, "NOT_BUILT")

    if time.perf_counter() > give_up:
        return out_of_time()
    model = cp_model.CpModel()
    x = [{d: model.NewBoolVar("") for d in allowed[u]} for u in range(n_units)]
    for u in range(n_units):
        model.AddExactlyOne(x[u].values())
    if time.perf_counter() > give_up:
        return out_of_time()
    # loads: compute, then communication
    load_terms: list[list[Any]] = [[] for _ in range(n_dev)]
    load_coeffs: list[list[int]] = [[] for _ in range(n_dev)]
    unit_us = [[0.0] * n_dev for _ in range(n_units)]
    for op in range(len(graph)):
        u = units.unit_of[op]
        for d in allowed[u]:
            unit_us[u][d] += cost.op_us[d][op]
    for u in range(n_units):
        for d, var in x[u].items():
            load_terms[d].append(var)
            load_coeffs[d].append(_ns(unit_us[u][d]))
    # (flag, is a send, source unit, consumer units, device): to complete a hint
    flags: list[tuple[Any, bool, int, list[int], int]] = []
    uneven_tensors = False  # a tensor whose edges cost differently: priced at the largest
    for count, ((src, _), edges) in enumerate(tensors(graph).items()):
        if not count % BUILD_CHECK_TENSORS and time.perf_counter() > give_up:
            return out_of_time()
        a = units.unit_of[src]
        consumers = sorted({units.unit_of[graph.edge_dst[k]] for k in edges} - {a})
        if not consumers:
            continue
        prices = [cost.nominal_transfer_us(k) for k in edges
                  if units.unit_of[graph.edge_dst[k]] != a]
        uneven_tensors = uneven_tensors or min(prices) != max(prices)
        price = _ns(max(prices))
        if price <= 0:
            continue
        for d in range(n_dev):
            if devices[d].host:
                continue
            on_a = x[a].get(d)
            ends = [(b, x[b].get(d)) for b in consumers]
            if on_a is not None and any(v is not on_a for _, v in ends):
                send = model.NewBoolVar("")
                for _, on_b in ends:
                    model.Add(send >= on_a - on_b if on_b is not None else send >= on_a)
                load_terms[d].append(send)
                load_coeffs[d].append(price)
                flags.append((send, True, a, consumers, d))
            if any(v is not None for _, v in ends):
                recv = model.NewBoolVar("")
                for _, on_b in ends:
                    if on_b is not None:
                        model.Add(recv >= on_b - on_a if on_a is not None else recv >= on_b)
                load_terms[d].append(recv)
                load_coeffs[d].append(price)
                flags.append((recv, False, a, consumers, d))
    horizon = max((sum(c) for c in load_coeffs), default=0) + 1
    period = model.NewIntVar(0, horizon, "T")
    for d in range(n_dev):
        if load_terms[d]:
            model.Add(sum(c * v for c, v in zip(load_coeffs[d], load_terms[d], strict=True))
                      <= period)
    # memory: persistent bytes, plus kept activations for as many micro-batches as stages
    kept = kept_activation_bytes(graph)
    stages = sum(1 for dev in devices if not dev.host) or 1
    unit_bytes = [0] * n_units
    for op in range(len(graph)):
        unit_bytes[units.unit_of[op]] += graph.persistent_bytes[op] + kept[op] * stages
    for d, dev in enumerate(devices):
        if dev.memory_bytes is not None:
            terms = [(unit_bytes[u], x[u][d]) for u in range(n_units) if d in x[u]
                     and unit_bytes[u]]
            if terms:
                model.Add(sum(b * v for b, v in terms) <= dev.memory_bytes)
    if not problem.allow_single and n_units > 1:
        for d in range(n_dev):
            if all(d in x[u] for u in range(n_units)):
                model.Add(sum(x[u][d] for u in range(n_units)) <= n_units - 1)
    order = _add_stage_order(model, problem, x) if contiguous else None
    model.Minimize(period)
    if time.perf_counter() > give_up:
        return out_of_time()
    if start_guess is not None:
        # a complete hint (every variable), so that CP-SAT takes it as its first solution
        for u in range(n_units):
            for d, var in x[u].items():
                model.AddHint(var, d == start_guess[u])
        flag_value = {}
        for var, sends, a, consumers, d in flags:
            if sends:
                value = start_guess[a] == d and any(start_guess[b] != d for b in consumers)
            else:
                value = start_guess[a] != d and any(start_guess[b] == d for b in consumers)
            model.AddHint(var, value)
            flag_value[var.Index()] = int(value)
        unit_of_var = {var.Index(): u for u in range(n_units) for var in x[u].values()}
        hinted = 0
        for d in range(n_dev):
            load = 0
            for c, v in zip(load_coeffs[d], load_terms[d], strict=True):
                index = v.Index()
                on = flag_value[index] if index in flag_value else \
                    int(start_guess[unit_of_var[index]] == d)
                load += c * on
            hinted = max(hinted, load)
        model.AddHint(period, min(hinted, horizon))
        if order is not None:  # the cut's stages follow the cluster order
            position, stage = order
            for d in range(n_dev):
                model.AddHint(position[d], d)
            for u in range(n_units):
                model.AddHint(stage[u], start_guess[u])
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, time_limit_s - (time.perf_counter()
                                                                      - started))
    solver.parameters.num_workers = 2
    status = solver.Solve(model)
    floor_us = _floor_us(unit_us, allowed, n_dev)
    # the model equals the verdict (so its bound holds for every plan) only without per-pair
    # links (it prices a tensor at the default link), with the memory rule exact (no kept
    # activations under a limit: the model keeps them for every stage on every device), with
    # times in whole nanoseconds, and over every split (not only contiguous ones)
    limited = any(dev.memory_bytes is not None for dev in devices)
    inexact = [why for why, holds in (
        ("only contiguous splits were searched", contiguous),
        ("transfers are priced at the default link, not each pair's", bool(
            cluster.network.links)),
        ("the model keeps activations for every stage on every device, more than the "
         "memory rule", limited and any(kept)),
        ("times were rounded to nanoseconds", not _whole_ns(unit_us)),
        ("a tensor's edges differ in cost; the model prices each at its largest",
         uneven_tensors),
    ) if holds]
    if status == cp_model.INFEASIBLE:
        if limited and any(kept):
            # the model's memory rule is stricter than the verdict's: try what it cut off
            found = _exact_rule_split(problem, start_guess, allowed, floor_us)
            if found is not None:
                return found
        raise InfeasiblePlacement(f"{name}: no split fits in memory",
                                  {"status": solver.StatusName(status)})
    bound_us = floor_us
    if not inexact:
        bound_us = max(bound_us, solver.BestObjectiveBound() / NS_PER_US)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        # CP-SAT had no time to take even the warm start (a loaded machine, a short limit):
        # the warm start is a valid split, better than no plan
        return warm_start("CP-SAT found no split", bound_us, solver.StatusName(status))
    unit_device = [next(d for d, v in x[u].items() if solver.Value(v)) for u in range(n_units)]
    stats: dict[str, Any] = {"bound_us": bound_us, "solver_status": solver.StatusName(status),
                             "solve_seconds": time.perf_counter() - started,
                             "contiguous": contiguous}
    if contiguous:
        stats["contiguous_optimal"] = status == cp_model.OPTIMAL and len(inexact) == 1
    if inexact:
        stats["optimal_note"] = "no proof for every plan: " + "; ".join(inexact)
    plan, verdict = _assignment(problem, unit_device, stats)
    plan.stats["optimal"] = meets_throughput_bound(verdict.time_per_sample_us, bound_us)
    return plan


def meets_throughput_bound(time_per_sample_us: float, bound_us: float) -> bool:
    """Whether a split's time per sample meets a bound of every split's (float rounding
    aside: a load is a sum of at most a few thousand terms)."""
    return time_per_sample_us <= bound_us * (1 + 1e-12)


def _floor_us(unit_us: list[list[float]], allowed: list[list[int]], n_dev: int) -> float:
    """A time per sample no split beats: the largest unit on its fastest device, and the
    work of every unit at its fastest spread evenly (transfers only add)."""
    fastest = [min(unit_us[u][d] for d in allowed[u]) for u in range(len(unit_us))]
    return max(max(fastest, default=0.0), sum(fastest) / max(1, n_dev))


def _whole_ns(unit_us: list[list[float]]) -> bool:
    """Whether every time the model rounds to nanoseconds was whole already."""
    return all(abs(t * NS_PER_US - round(t * NS_PER_US)) <= 1e-6
               for row in unit_us for t in row if math.isfinite(t))


def _exact_rule_split(problem: Problem, start_guess: list[int] | None,
                      allowed: list[list[int]], floor_us: float) -> Assignment | None:
    """The fastest of the warm start and each one-device split that fits the exact memory
    rule (:func:`baechi.throughput.throughput`), where the model's stricter rule found none."""
    n_units = len(problem.units)
    guesses = [] if start_guess is None else [start_guess]
    if problem.allow_single or n_units == 1:
        guesses += [[d] * n_units for d in range(len(problem.cluster.devices))
                    if all(d in allowed[u] for u in range(n_units))]
    best: tuple[Assignment, float] | None = None
    for guess in guesses:
        plan, verdict = _assignment(problem, guess, {
            "bound_us": floor_us, "solver_status": "INFEASIBLE",
            "optimal_note": "no proof: the model's memory rule (activations kept for every "
                            "stage on every device) admits no split; this one fits the "
                            "exact rule"})
        if verdict.memory_ok and (best is None or verdict.time_per_sample_us < best[1]):
            best = (plan, verdict.time_per_sample_us)
    if best is None:
        return None
    best[0].stats["optimal"] = meets_throughput_bound(best[1], floor_us)
    return best[0]


def _assignment(
    problem: Problem, unit_device: list[int], stats: dict[str, Any]
) -> tuple[Assignment, Throughput]:
    """The plan of a split of the units (ops in canonical order per device; ``stats`` with
    the objective and the time per sample), and the throughput model's verdict on it."""
    graph = problem.graph
    device_of = [unit_device[problem.units.unit_of[op]] for op in range(len(graph))]
    orders: list[list[int]] = [[] for _ in problem.cluster.devices]
    for op in graph.topo:
        orders[device_of[op]].append(op)
    verdict = throughput(graph, problem.cluster, device_of, problem.cost)
    return Assignment(device_of, orders, {
        "objective": "throughput", "time_per_sample_us": verdict.time_per_sample_us,
        **stats}), verdict


def _add_stage_order(
    model: Any, problem: Problem, x: list[dict[int, Any]]
) -> tuple[list[Any], list[Any]]:
    """Contiguity: each device a distinct stage; forward edges never go to an earlier stage.
    Returns the position variables of devices and the stage variables of units."""
    graph, units, cluster = problem.graph, problem.units, problem.cluster
    n_dev = len(cluster.devices)
    position = [model.NewIntVar(0, n_dev - 1, "") for _ in range(n_dev)]
    model.AddAllDifferent(position)
    # identical devices (same kind, speed, memory, host; no per-pair links) are
    # interchangeable: keep them in cluster order along the pipeline
    # (and every unit may go to both or to neither: a pin makes its device unlike the others)
    if not cluster.network.links:
        seen: dict[tuple[Any, ...], int] = {}
        for d, dev in enumerate(cluster.devices):
            may_hold = frozenset(u for u in range(len(units)) if d in x[u])
            key = (dev.kind, dev.speed, dev.memory_bytes, dev.host, may_hold)
            if key in seen:
                model.Add(position[seen[key]] < position[d])
            seen[key] = d
    stage = []
    for u in range(len(units)):
        p = model.NewIntVar(0, n_dev - 1, "")
        for d, var in x[u].items():
            model.Add(p == position[d]).OnlyEnforceIf(var)
        stage.append(p)
    pairs = set()
    for k in range(graph.num_edges):
        a, b = graph.edge_src[k], graph.edge_dst[k]
        if is_backward(graph, a) or is_backward(graph, b):
            continue
        ua, ub = units.unit_of[a], units.unit_of[b]
        if ua != ub and (ua, ub) not in pairs:
            pairs.add((ua, ub))
            model.Add(stage[ua] <= stage[ub])
    return position, stage
