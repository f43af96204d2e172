"""Local search (baechi.search) and its evaluator (baechi.evaluator).

The evaluator must agree with the simulator exactly (fresh replays and replays resumed from a
checkpoint); the search must never return a worse plan, must keep every plan rule, and must
find the better plan where one move suffices.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import time

import pytest
from conftest import SHARED, needs_shared
from helpers import edge, graph_doc, op
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_algorithms import clusters, dags
from test_hetero import _hetero_graphs

from baechi import Cluster, InfeasiblePlacement, load_graph, place
from baechi import search as search_module
from baechi.errors import InvalidPlan
from baechi.evaluator import PlanEvaluator
from baechi.grouping import colocation_units
from baechi.search import _common_suffix, _first_difference, _rank_of_plan, _Search, improve
from baechi.simulate import (
    check_constraints,
    check_orders,
    index_plan,
    replay,
    single_device_run,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def start_plan(doc: dict, cluster: dict, seed: int) -> tuple[list[int], list[list[int]]] | None:
    """A heuristic's plan within memory (m-ETF, or m-fill), or None when none is found."""
    for algorithm in ("m-etf", "m-fill", "single"):
        try:
            plan = place(doc, cluster, algorithm, {"allow_single": False,
                                                  "co_placement": bool(seed % 2),
                                                  "fusion": bool(seed % 2)})
        except InfeasiblePlacement:
            continue
        graph, parsed = load_graph(doc), Cluster.parse(cluster)
        return index_plan(graph, plan, parsed)
    return None


def random_plan(graph, cluster: Cluster, rng: random.Random
                ) -> tuple[list[int], list[list[int]]]:
    """Random devices per unit (pins kept), orders from a random topological order."""
    n_dev = len(cluster.devices)
    units = colocation_units(graph, cluster)
    unit_device = [pin if pin >= 0 else rng.randrange(n_dev) for pin in units.pin]
    device_of = [unit_device[u] for u in units.unit_of]
    indegree = [len(ins) for ins in graph.in_edges]
    ready = [i for i, d in enumerate(indegree) if d == 0]
    orders: list[list[int]] = [[] for _ in range(n_dev)]
    while ready:
        op_ = ready.pop(rng.randrange(len(ready)))
        orders[device_of[op_]].append(op_)
        for k in graph.out_edges[op_]:
            dst = graph.edge_dst[k]
            indegree[dst] -= 1
            if not indegree[dst]:
                ready.append(dst)
    return device_of, orders


# ---------------------------------------------------------------------------- evaluator


@SETTINGS
@given(doc=dags(), cluster=clusters(), seed=st.integers(0, 2**16))
def test_evaluator_equals_replay(doc: dict, cluster: dict, seed: int) -> None:
    graph, parsed = load_graph(doc), Cluster.parse(cluster)
    device_of, orders = random_plan(graph, parsed, random.Random(seed))
    sim = replay(graph, parsed, device_of, orders)
    result = PlanEvaluator(graph, parsed).run(device_of, orders)
    assert result is not None
    assert result.step_us == sim.estimate.step_time_us
    assert result.start == sim.start and result.end == sim.end
    if result.peaks is not None:
        assert result.peaks == [m.peak for m in sim.memory]
        assert result.memory_ok == sim.estimate.memory_ok


@SETTINGS
@given(doc=dags(), cluster=clusters(), seed=st.integers(0, 2**16))
def test_resumed_candidates_equal_fresh_replays(doc: dict, cluster: dict, seed: int) -> None:
    """Every candidate the search builds, replayed from the base's checkpoint at its
    divergence instant, gives the simulator's result."""
    graph, parsed = load_graph(doc), Cluster.parse(cluster)
    rng = random.Random(seed)
    device_of, orders = random_plan(graph, parsed, rng)
    evaluator = PlanEvaluator(graph, parsed, checkpoints=max(1, len(graph) // 2))
    base = evaluator.run(device_of, orders, keep=True)
    assert base is not None
    units = colocation_units(graph, parsed)
    search = _Search(graph, parsed, units, evaluator.cost, evaluator, rng, device_of,
                     _rank_of_plan(graph, orders, base), base)
    assert search.orders_of(device_of, search.rank) == orders  # the rank keeps the plan
    moves = list(search.candidates()) + list(search.collapses())
    moves += [m for m in (search.random_move() for _ in range(5)) if m is not None]
    # each move twice: its device orders edited in place, and re-sorted (as large moves are)
    for move, small_move in itertools.product(moves, (search_module.SMALL_MOVE, 0)):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(search_module, "SMALL_MOVE", small_move)
            built = search.apply(move)
        if built is None:
            continue
        cand_device_of, cand_orders, rank, since, estimate = built
        assert not math.isnan(estimate)
        check_orders(graph, cand_orders)
        assert search.orders_of(cand_device_of, rank) == cand_orders
        resumed = evaluator.run(cand_device_of, cand_orders, base=base, since=since)
        sim = replay(graph, parsed, cand_device_of, cand_orders)
        assert resumed is not None
        assert resumed.step_us == sim.estimate.step_time_us
        assert resumed.end == sim.end
        if resumed.peaks is not None:
            assert resumed.peaks == [m.peak for m in sim.memory]


def test_evaluator_prunes_plans_that_cannot_win() -> None:
    graph = load_graph(graph_doc([op("a", 10), op("b", 10)], [edge("a", "b", 1000)]))
    cluster = Cluster.uniform(2, latency_us=10, bandwidth_gbps=1)
    evaluator = PlanEvaluator(graph, cluster)
    assert evaluator.run([0, 1], [[0], [1]]).step_us == 31.0
    assert evaluator.run([0, 1], [[0], [1]], bound=31.0) is None  # not strictly better
    assert evaluator.run([0, 0], [[0, 1], []], bound=31.0).step_us == 20.0


# ---------------------------------------------------------------------------- search


def check_improved(graph, cluster: Cluster, units, start, result) -> None:
    """Every rule a returned plan keeps, and never worse than the start."""
    device_of, orders, stats = result
    assert sorted(op_ for order in orders for op_ in order) == list(range(len(graph)))
    for d, order in enumerate(orders):
        assert all(device_of[op_] == d for op_ in order)
    check_orders(graph, orders)
    check_constraints(graph, cluster, device_of)
    for members in units.members:  # units never split
        assert len({device_of[op_] for op_ in members}) == 1
    for unit, pin in enumerate(units.pin):
        if pin >= 0:
            assert device_of[units.members[unit][0]] == pin
    sim = replay(graph, cluster, device_of, orders)
    start_sim = replay(graph, cluster, *start)
    assert stats.step_us == sim.estimate.step_time_us
    assert stats.start_step_us == start_sim.estimate.step_time_us
    assert sim.estimate.step_time_us <= start_sim.estimate.step_time_us
    assert sim.estimate.memory_ok


@SETTINGS
@given(doc=dags(), cluster=clusters(), seed=st.integers(0, 2**16))
def test_never_worse_and_keeps_every_rule(doc: dict, cluster: dict, seed: int) -> None:
    start = start_plan(doc, cluster, seed)
    if start is None:
        return  # no heuristic found a plan within memory: nothing to start from
    graph, parsed = load_graph(doc), Cluster.parse(cluster)
    units = colocation_units(graph, parsed)
    result = improve(graph, parsed, *start, units=units,
                     deadline=time.perf_counter() + 0.05, seed=seed)
    check_improved(graph, parsed, units, start, result)


@SETTINGS
@given(doc=dags(), cluster=clusters(), seed=st.integers(0, 2**16))
def test_improves_random_plans_without_breaking_rules(doc: dict, cluster: dict,
                                                      seed: int) -> None:
    """From random (often poor) plans with no memory limit the search has room to move."""
    cluster = {**cluster, "devices": [{k: v for k, v in d.items() if k != "memory_bytes"}
                                      for d in cluster["devices"]]}
    graph, parsed = load_graph(doc), Cluster.parse(cluster)
    units = colocation_units(graph, parsed)
    device_of, _ = random_plan(graph, parsed, random.Random(seed))
    for members in units.members:  # a random plan that keeps the units together
        for op_ in members:
            device_of[op_] = device_of[members[0]]
    orders = [[o for o in graph.topo if device_of[o] == d] for d in range(len(parsed.devices))]
    result = improve(graph, parsed, device_of, orders, units=units,
                     deadline=time.perf_counter() + 0.05, seed=seed)
    check_improved(graph, parsed, units, (device_of, orders), result)


def fork(latency: float) -> tuple:
    """a → (b, c) → d, all 10 µs; two devices."""
    doc = graph_doc([op(n, 10) for n in "abcd"],
                    [edge("a", "b"), edge("a", "c"), edge("b", "d"), edge("c", "d")])
    return load_graph(doc), Cluster.uniform(2, latency_us=latency)


def test_one_move_finds_the_optimum() -> None:
    graph, cluster = fork(latency=1)
    units = colocation_units(graph, cluster)
    reported: list[float] = []
    device_of, orders, stats = improve(graph, cluster, [0, 0, 0, 0], [[0, 1, 2, 3], []],
                                       units=units, deadline=time.perf_counter() + 0.5,
                                       on_better=reported.append)
    # b or c (with d) beside the other branch: 10 + 1 + 10 + 10 = 31
    assert stats.start_step_us == 40.0 and stats.step_us == 31.0
    assert replay(graph, cluster, device_of, orders).estimate.step_time_us == 31.0
    assert stats.moves_accepted >= 1
    assert reported and reported[-1] == 31.0 and reported == sorted(reported, reverse=True)


def test_moves_a_branch_where_no_single_op_move_pays(monkeypatch: pytest.MonkeyPatch) -> None:
    """s feeds two chains x1-x2-x3 and y1-y2-y3 that join in t, all on one device; inside a
    chain each tensor takes 101 µs to send, at its ends 1 µs. Moving one op splits a chain
    (+101 µs at least); moving a whole chain runs the two side by side, and t then joins
    the chain that ends last: 1 + 1 + 30 + 1 = 33 µs instead of 62. Without perturbations
    only a branch move gets there (without one the search stays at 62 µs)."""
    monkeypatch.setattr(search_module, "PERTURB_MOVES", 0)
    big = 100_000  # bytes: 100 µs at 1 GB/s
    doc = graph_doc([op(n, 1 if n in "st" else 10)
                     for n in ("s", "x1", "x2", "x3", "y1", "y2", "y3", "t")],
                    [edge("s", "x1"), edge("x1", "x2", big), edge("x2", "x3", big),
                     edge("x3", "t"), edge("s", "y1"), edge("y1", "y2", big),
                     edge("y2", "y3", big), edge("y3", "t")])
    graph = load_graph(doc)
    cluster = Cluster.uniform(2, latency_us=1, bandwidth_gbps=1)
    units = colocation_units(graph, cluster)
    start = ([0] * 8, [list(range(8)), []])
    result = improve(graph, cluster, *start, units=units, deadline=time.perf_counter() + 0.5)
    check_improved(graph, cluster, units, start, result)
    device_of, _, stats = result
    assert stats.start_step_us == 62.0 and stats.step_us == 33.0
    assert device_of[1] == device_of[2] == device_of[3] != device_of[4] == device_of[5]


def test_keeps_the_start_when_moving_cannot_pay() -> None:
    graph, cluster = fork(latency=1000)  # any transfer costs more than the whole step
    units = colocation_units(graph, cluster)
    device_of, orders, stats = improve(graph, cluster, [0, 0, 0, 0], [[0, 1, 2, 3], []],
                                       units=units, deadline=time.perf_counter() + 0.2)
    assert (device_of, orders) == ([0, 0, 0, 0], [[0, 1, 2, 3], []])
    assert stats.step_us == stats.start_step_us == 40.0
    assert stats.moves_evaluated > 0 and stats.perturbations > 0  # it did search


def test_reorders_a_device_when_that_suffices() -> None:
    """One device, b waits behind a long independent op x: running b first lets c (on the
    other device, pinned) start early."""
    doc = graph_doc([op("a", 1), op("x", 50), op("b", 1), op("c", 50, device="/GPU:1")],
                    [edge("a", "b"), edge("b", "c")])
    graph = load_graph(doc)
    cluster = Cluster.uniform(2, latency_us=0)
    units = colocation_units(graph, cluster)
    units.pin[:] = [0 if pin < 0 else pin for pin in units.pin]  # only the order may change
    start = ([0, 0, 0, 1], [[0, 1, 2], [3]])
    result = improve(graph, cluster, *start, units=units, deadline=time.perf_counter() + 0.5)
    check_improved(graph, cluster, units, start, result)
    assert result[1] == [[0, 2, 1], [3]] and result[2].step_us == 52.0


def test_units_move_together_and_pins_stay() -> None:
    """a and b share a colocation group; p is pinned: moving the group is the only win."""
    doc = graph_doc([op("p", 10, device="/GPU:0"), op("a", 10, colocation_group="g"),
                     op("b", 10, colocation_group="g"), op("q", 10)],
                    [edge("p", "q"), edge("a", "b")])
    graph = load_graph(doc)
    cluster = Cluster.uniform(2, latency_us=1)
    units = colocation_units(graph, cluster)
    start = ([0, 0, 0, 0], [[0, 1, 2, 3], []])
    result = improve(graph, cluster, *start, units=units, deadline=time.perf_counter() + 0.5)
    check_improved(graph, cluster, units, start, result)
    assert result[2].step_us == 20.0
    assert result[0][0] == 0 and result[0][1] == result[0][2] == 1


def test_respects_memory_limits() -> None:
    """Two heavy independent chains would run fastest apart, but device 1 holds only one op's
    persistent bytes: whatever the search does, peaks stay within limits."""
    doc = graph_doc([op(f"{c}{i}", 10, persistent_bytes=100) for c in "xy" for i in range(3)],
                    [edge("x0", "x1"), edge("x1", "x2"), edge("y0", "y1"), edge("y1", "y2")])
    graph = load_graph(doc)
    cluster = Cluster.parse({"devices": [{"name": "/GPU:0"},
                                         {"name": "/GPU:1", "memory_bytes": 100}]})
    units = colocation_units(graph, cluster)
    start = ([0] * 6, [list(range(6)), []])
    result = improve(graph, cluster, *start, units=units, deadline=time.perf_counter() + 0.3)
    check_improved(graph, cluster, units, start, result)
    assert sum(d == 1 for d in result[0]) <= 1
    assert result[2].step_us == 50.0  # one op moved off the critical device


def test_never_places_an_op_where_it_cannot_run() -> None:
    graph, cluster = fork(latency=1)
    units = colocation_units(graph, cluster)
    search_cost = PlanEvaluator(graph, cluster).cost
    search_cost.op_us[1] = [math.inf] * len(graph)  # nothing can run on device 1
    result = improve(graph, cluster, [0, 0, 0, 0], [[0, 1, 2, 3], []], units=units,
                     deadline=time.perf_counter() + 0.2, cost=search_cost)
    assert result[0] == [0, 0, 0, 0]


def test_stops_at_its_deadline() -> None:
    """An already-passed deadline: the search returns (the start plan) instead of running."""
    graph, cluster = fork(latency=1)
    units = colocation_units(graph, cluster)
    result = improve(graph, cluster, [0, 0, 0, 0], [[0, 1, 2, 3], []], units=units,
                     deadline=time.perf_counter() - 1)
    assert result[0] == [0, 0, 0, 0] and result[2].moves_evaluated == 0


def test_rejects_bad_start_plans() -> None:
    graph, cluster = fork(latency=1)
    units = colocation_units(graph, cluster)
    with pytest.raises(InvalidPlan, match="cycle"):
        improve(graph, cluster, [0, 0, 0, 0], [[3, 0, 1, 2], []], units=units,
                deadline=time.perf_counter() + 0.1)
    doc = graph_doc([op("a", 1, colocation_group="g"), op("b", 1, colocation_group="g")])
    graph = load_graph(doc)
    with pytest.raises(InvalidPlan, match="splits a unit"):
        improve(graph, cluster, [0, 1], [[0], [1]], units=colocation_units(graph, cluster),
                deadline=time.perf_counter() + 0.1)


def test_empties_a_device_when_one_device_is_best() -> None:
    """A chain split over two devices with a slow link: every op together is optimal."""
    doc = graph_doc([op(n, 10) for n in "abcd"], [edge("a", "b"), edge("b", "c"),
                                                   edge("c", "d")])
    graph = load_graph(doc)
    cluster = Cluster.uniform(2, latency_us=100)
    units = colocation_units(graph, cluster)
    start = ([0, 1, 0, 1], [[0, 2], [1, 3]])
    result = improve(graph, cluster, *start, units=units, deadline=time.perf_counter() + 0.5)
    check_improved(graph, cluster, units, start, result)
    assert result[2].start_step_us == 340.0 and result[2].step_us == 40.0


def test_rejects_a_start_plan_of_another_graph() -> None:
    graph, cluster = fork(latency=1)
    units = colocation_units(graph, cluster)
    with pytest.raises(InvalidPlan, match="the graph has 4"):
        improve(graph, cluster, [0, 0, 0], [[0, 1, 2], []], units=units,
                deadline=time.perf_counter() + 0.1)
    with pytest.raises(InvalidPlan, match="not an op placed on that device"):
        improve(graph, cluster, [0, 0, 0, 0], [[0, 1, 2], [3]], units=units,
                deadline=time.perf_counter() + 0.1)


@needs_shared
@pytest.mark.parametrize("memory", [None, 0.75])
def test_shared_gnmt_on_pcie_beats_m_etf(memory: float | None) -> None:
    """m-ETF's PCIe plan of gnmt_baechi leaves room (it is slower than one device): the
    search finds a faster plan that keeps every rule, within memory."""
    doc = json.loads((SHARED / "graphs" / "baechi" / "gnmt_baechi.json").read_text())
    graph = load_graph(doc)
    devices: dict = {"count": 4}
    if memory is not None:
        devices["memory_bytes"] = int(single_device_run(graph, Cluster.uniform(1))[1] * memory)
    cluster = Cluster.parse({"devices": devices,
                             "network": {"latency_us": 134, "bandwidth_gbps": 5.7}})
    # the search times plans with FIFO channels: compare it with m-ETF's FIFO plan
    plan = place(graph, cluster, "m-etf", {"allow_single": False, "transfer_order": "fifo"})
    start = index_plan(graph, plan, cluster)
    units = colocation_units(graph, cluster)
    result = improve(graph, cluster, *start, units=units, deadline=time.perf_counter() + 5)
    check_improved(graph, cluster, units, start, result)
    assert result[2].step_us < plan.estimate.step_time_us


@given(a=st.lists(st.integers(0, 2), max_size=12), b=st.lists(st.integers(0, 2), max_size=12),
       prefix=st.booleans(), suffix=st.booleans())
def test_first_difference_and_common_suffix(a: list[int], b: list[int], prefix: bool,
                                            suffix: bool) -> None:
    b = (a[:len(a) // 2] if prefix else []) + b + (a[len(a) // 2:] if suffix else [])
    pairs = enumerate(zip(a, b, strict=False))
    first = next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))
    assert _first_difference(a, b) == first
    common = 0
    while common < min(len(a), len(b)) and a[-1 - common] == b[-1 - common]:
        common += 1
    assert _common_suffix(a, b) == common


@SETTINGS
@given(doc=_hetero_graphs(), seed=st.integers(0, 2**16), mode=st.sampled_from(
    ["sequential", "parallel"]))
def test_heterogeneous_clusters(doc: dict, seed: int, mode: str) -> None:
    """Device kinds (ops that cannot run on one), per-pair links and measured transfer times:
    the evaluator agrees with the simulator and no op is moved where it cannot run."""
    cluster = Cluster.parse({
        "devices": [{"name": "g0"}, {"name": "g1", "speed": 2.0},
                    {"name": "c0", "kind": "cpu", "host": True}],
        "network": {"latency_us": 2, "bandwidth_gbps": 1, "mode": mode,
                    "links": [{"devices": ["g0", "g1"], "bandwidth_gbps": 50}]}})
    graph = load_graph(doc)
    try:
        plan = place(graph, cluster, "m-etf", {"allow_single": False, "co_placement": False,
                                              "fusion": False})
    except InfeasiblePlacement:
        return  # some unit can run nowhere
    start = index_plan(graph, plan, cluster)
    units = colocation_units(graph, cluster)
    result = improve(graph, cluster, *start, units=units,
                     deadline=time.perf_counter() + 0.05, seed=seed)
    assert "disagree" not in result[2].note
    check_improved(graph, cluster, units, start, result)  # check_constraints checks kinds
    evaluator = PlanEvaluator(graph, cluster)
    rng = random.Random(seed)
    device_of = list(result[0])
    for members in units.members:  # a random plan where every unit can run
        d = rng.choice(evaluator.cost.devices_for(members))
        for op_ in members:
            device_of[op_] = d
    orders = [[o for o in graph.topo if device_of[o] == d] for d in range(3)]
    assert evaluator.run(device_of, orders).end == replay(graph, cluster, device_of,
                                                          orders).end
