"""``exact``'s claims as properties: on random tiny graphs its plan is never below brute force,
its bound is a bound and ``stats.optimal`` holds; an optimum of a reduced graph is not claimed
for the request. (Hand-made cases and generated families: tests/test_exact.py.)"""

from __future__ import annotations

import itertools
import math
import time

import pytest
from helpers import edge, graph_doc, op
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baechi import Cluster, load_graph, place, simulate
from baechi.algorithms import ALGORITHMS
from baechi.algorithms.base import Assignment, Problem, no_progress
from baechi.options import Options
from baechi.placing import Request, run_algorithm
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


def test_an_optimum_of_the_reduced_graph_is_not_claimed_for_the_request() -> None:
    # co-placement merges each op with its only consumer: the reduced problem's optimum is
    # not the request's, whose units are the single ops
    doc = graph_doc([op(n, 10, output_bytes=100) for n in "abcd"],
                    [edge("a", "b", 100), edge("b", "c", 100), edge("a", "d", 100)])
    request = Request.of(load_graph(doc), Cluster.parse(
        {"devices": {"count": 2, "memory_bytes": "1GiB"}}), Options(), time.perf_counter(),
        no_progress)
    run = run_algorithm(request, "exact", Options(allow_single=False))
    assert [step["units"] for step in run.reduction.nodes][-1] < 4  # co-placement merged some
    assert run.algorithm_stats["optimal"] is False
    assert "bound_us" not in run.algorithm_stats and "reduced_bound_us" in run.algorithm_stats
    assert "reduced graph only" in run.algorithm_stats["optimal_note"]


def test_fusion_inside_a_colocation_group_keeps_no_proof() -> None:
    """Fusing a and b (one group) runs them back to back and sends a's output after b: a
    model stricter than the simulator, whose "optimum" (21 us) is not the request's (12 us:
    a and b on one device, c on the other, as the pipeline off finds)."""
    doc = graph_doc([op("a", 1, colocation_group="u"), op("b", 10, colocation_group="u"),
                     op("c", 10)], [edge("a", "b", 0), edge("a", "c", 0)])
    cluster = Cluster.uniform(2, latency_us=1, bandwidth_gbps=1, mode="parallel")
    request = Request.of(load_graph(doc), cluster, Options(), time.perf_counter(), no_progress)
    fused = run_algorithm(request, "exact", Options())
    assert fused.reduction.members is not None  # fusion merged a and b
    assert fused.algorithm_stats["optimal"] is False
    assert "bound_us" not in fused.algorithm_stats
    plan = place(doc, cluster, "exact")  # named exact: the graph itself, below its size limit
    assert plan.estimate.step_time_us == 12.0 == plan.stats.bound_us
    assert plan.stats.optimal is True and "graph itself" in plan.stats.pipeline_note


def test_a_refused_plan_of_a_reduced_graph_keeps_no_bound(monkeypatch: pytest.MonkeyPatch,
                                                           ) -> None:
    # a placer's plan of the reduced graph that overshoots memory is refused after every
    # retry; the bound it reports holds for the reduced graph only, and must not reach auto
    # (which took such a bound as every plan's: 310.0 ms over a 245.7 ms plan found later)
    def overclaiming(problem: Problem) -> Assignment:
        n = len(problem.graph)
        return Assignment([0] * n, [list(problem.graph.topo), []],
                          {"optimal": True, "bound_us": 1e9})

    monkeypatch.setitem(ALGORITHMS, "overclaiming", overclaiming)
    # fusion merges each x_i with y_i; six y outputs live until z: 1.2 GB on one device
    size = 2 * 10**8
    doc = graph_doc([op(f"{c}{i}", 10, output_bytes=size) for c in "xy" for i in range(6)]
                    + [op("z", 10)],
                    [edge(f"x{i}", f"y{i}", size) for i in range(6)]
                    + [edge(f"y{i}", "z", size) for i in range(6)])
    graph = load_graph(doc)
    cluster = Cluster.uniform(2, memory_bytes=2**30)
    request = Request.of(graph, cluster, Options(), time.perf_counter(), no_progress)
    run = run_algorithm(request, "overclaiming", Options())
    assert run.simulation is None and run.refused is not None  # over memory, every retry
    assert run.reduction is not None and run.reduction.members is not None  # units merged
    assert "bound_us" not in run.algorithm_stats and run.algorithm_stats["optimal"] is False
