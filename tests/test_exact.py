"""``exact`` (CP-SAT): optimal against brute force on tiny graphs, never claims an optimum it
does not have, never slower than its warm start, and every plan is valid and replayed."""

from __future__ import annotations

import itertools
import math

import pytest
from helpers import edge, graph_doc, op
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baechi import Cluster, load_graph, place, simulate
from baechi.algorithms.base import Assignment, Problem
from baechi.algorithms.exact import EXACT_MAX_OPS, place_exact
from baechi.grouping import colocation_units
from baechi.simulate import replay

NO_PIPELINE = {"co_placement": False, "fusion": False, "allow_single": False}


def brute_force_us(doc: dict, cluster: Cluster) -> float:
    """The best step time of any plan: every placement × every linear extension (each
    device's order is its subsequence; every consistent set of orders arises so, and the
    simulator's replay of orders is their earliest schedule)."""
    graph = load_graph(doc)
    n, n_dev = len(graph), len(cluster.devices)
    best = math.inf
    extensions = [order for order in itertools.permutations(range(n))
                  if all(order.index(graph.edge_src[k]) < order.index(graph.edge_dst[k])
                         for k in range(graph.num_edges))]
    for device_of in itertools.product(range(n_dev), repeat=n):
        for order in extensions:
            orders = [[v for v in order if device_of[v] == d] for d in range(n_dev)]
            best = min(best, replay(graph, cluster, list(device_of), orders).estimate
                       .step_time_us)
    return best


@st.composite
def tiny_dags(draw: st.DrawFn) -> dict:
    n = draw(st.integers(2, 4))
    ops = [op(f"o{i}", draw(st.integers(0, 20))) for i in range(n)]
    edges = [edge(f"o{i}", f"o{j}", draw(st.integers(0, 3)) * 1000)
             for j in range(1, n) for i in draw(st.sets(st.integers(0, j - 1), max_size=2))]
    return graph_doc(ops, edges)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=tiny_dags(), mode=st.sampled_from(["parallel", "sequential"]),
       devices=st.integers(2, 3))  # 4 ops on 3 devices: 81 placements × ≤ 24 orders
def test_optimal_claims_match_brute_force(doc: dict, mode: str, devices: int) -> None:
    cluster = Cluster.uniform(devices, latency_us=2, bandwidth_gbps=1, mode=mode)
    plan = place(doc, cluster, "exact", {**NO_PIPELINE, "time_limit_s": 10})
    best = brute_force_us(doc, cluster)
    step = plan.estimate.step_time_us
    assert step >= best * (1 - 1e-9)
    assert plan.stats.bound_us <= best * (1 + 1e-9)  # a proven bound is a bound
    if plan.stats.optimal:
        assert step == pytest.approx(best, rel=1e-9)
    if mode == "parallel":  # the model is the simulator's: CP-SAT proves the optimum
        assert plan.stats.optimal, plan.stats
    assert simulate(doc, plan.model_dump()) == plan.estimate


def test_hand_computed_optimum_splits_the_fork() -> None:
    # a(2) -> b(3), a -> c(4), b -> d(1), c -> d; 1 µs per message: a, c on one device and
    # b, d on the other end at 8 (b 3..6, c 2..6, d waits for c's message: 7..8)
    doc = graph_doc([op("a", 2), op("b", 3), op("c", 4), op("d", 1)],
                    [edge("a", "b", 0), edge("a", "c", 0), edge("b", "d", 0),
                     edge("c", "d", 0)])
    cluster = Cluster.uniform(2, latency_us=1, mode="parallel")
    plan = place(doc, cluster, "exact", NO_PIPELINE)
    assert plan.estimate.step_time_us == 8.0
    assert plan.stats.optimal and plan.stats.bound_us == 8.0
    assert plan.placement["a"] == plan.placement["c"] != plan.placement["b"]


def test_never_slower_than_its_hint() -> None:
    doc = graph_doc([op(f"o{i}", 10 + i) for i in range(12)],
                    [edge(f"o{i}", f"o{i + 1}", 5000) for i in range(11)])
    graph = load_graph(doc)
    cluster = Cluster.uniform(3, latency_us=50, bandwidth_gbps=1)
    units = colocation_units(graph, cluster)
    hint = Assignment([0] * 12, [list(range(12)), [], []])
    hint_us = replay(graph, cluster, hint.device_of, hint.orders).estimate.step_time_us
    result = place_exact(Problem.of(graph, cluster, units, time_limit_s=5, hint=hint))
    step = replay(graph, cluster, result.device_of, result.orders).estimate.step_time_us
    assert step <= hint_us
    assert result.stats["optimal"]  # a chain: one device, no message, meets the bound


def test_memory_budgets_are_respected() -> None:
    doc = graph_doc([op(f"o{i}", 10, persistent_bytes=600) for i in range(4)])
    plan = place(doc, {"devices": {"count": 4, "memory_bytes": 1000}}, "exact", NO_PIPELINE)
    assert len(set(plan.placement.values())) == 4
    assert plan.estimate.memory_ok and plan.estimate.step_time_us == 10.0


def test_an_optimum_of_the_reduced_graph_is_not_claimed_for_the_request() -> None:
    # co-placement merges each op with its only consumer: the reduced problem's optimum is
    # not the request's, whose units are the single ops
    doc = graph_doc([op(n, 10, output_bytes=100) for n in "abcd"],
                    [edge("a", "b", 100), edge("b", "c", 100), edge("a", "d", 100)])
    plan = place(doc, {"devices": {"count": 2, "memory_bytes": "1GiB"}}, "exact",
                 {"allow_single": False})
    stats = plan.stats.model_dump()
    assert [step["units"] for step in stats["nodes"]][-1] < 4  # co-placement merged some
    assert stats["optimal"] is False and "reduced_bound_us" in stats
    assert "reduced graph only" in stats["optimal_note"]


def test_large_graphs_fall_back_to_m_etf_and_say_so() -> None:
    n = EXACT_MAX_OPS + 1
    doc = graph_doc([op(f"o{i}", 1) for i in range(n)])
    plan = place(doc, {"devices": {"count": 2}}, "exact", NO_PIPELINE)
    assert "exact models graphs of up to" in plan.stats.fallback
    assert plan.stats.optimal is False
