"""The step-time bound that counts forced transfers (baechi.bounds.step_bound_us): never above
the best plan (brute force on tiny graphs with memory limits and pins), tight on a chain that
memory must split, and what lets ``auto`` prove such a plan optimal."""

from __future__ import annotations

import math

import pytest
from helpers import edge, graph_doc, op
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from baechi import Cluster, load_graph, place
from baechi.bounds import step_bound_us
from baechi.costmodel import CostModel
from baechi.grouping import colocation_units
from baechi.testing import brute_force


def bound_of(doc: dict, cluster: Cluster) -> float:
    graph = load_graph(doc)
    return step_bound_us(graph, cluster, colocation_units(graph, cluster),
                         CostModel(graph, cluster))


@st.composite
def tight_cases(draw: st.DrawFn) -> tuple[dict, Cluster]:
    """2–5 ops, most of their bytes persistent, on 2 devices that hold about half of them."""
    n = draw(st.integers(2, 5))
    ops = []
    for i in range(n):
        fields: dict = {"persistent_bytes": draw(st.integers(0, 6)) * 10,
                        "output_bytes": draw(st.integers(0, 5)),
                        "temp_bytes": draw(st.integers(0, 5))}
        kind = draw(st.integers(0, 5))  # 1 in 6 pinned, 1 in 6 in the colocation group
        if kind == 0:
            fields["device"] = f"/GPU:{draw(st.integers(0, 1))}"
        elif kind == 1:
            fields["colocation_group"] = "g"
        ops.append(op(f"o{i}", draw(st.integers(0, 20)), **fields))
    edges = [edge(f"o{i}", f"o{j}", draw(st.integers(0, 5)))
             for j in range(1, n) for i in draw(st.sets(st.integers(0, j - 1), max_size=2))]
    mode = draw(st.sampled_from(["parallel", "sequential"]))
    memory = draw(st.integers(6, 15)) * 10
    cluster = Cluster.parse({"devices": {"count": 2, "memory_bytes": memory},
                             "network": {"latency_us": draw(st.integers(0, 3)),
                                         "bandwidth_gbps": 0.001, "mode": mode}})
    return graph_doc(ops, edges), cluster


def check_bound(doc: dict, cluster: Cluster) -> None:
    """The bound is at least DESIGN's and at most the best plan's step time (brute force)."""
    graph = load_graph(doc)
    units = colocation_units(graph, cluster)
    best, _, _ = brute_force(graph, cluster, units)
    bound = step_bound_us(graph, cluster, units, CostModel(graph, cluster))
    floor = CostModel(graph, cluster).lower_bound_us()
    assert bound >= floor
    assert bound <= best * (1 + 1e-9)  # inf when no plan fits: any bound holds
    event("feasible" if best < math.inf else "no plan fits")
    if best < math.inf:
        event("raised above DESIGN's bound" if bound > floor else "DESIGN's bound")
        event("tight" if bound == pytest.approx(best) else "below the optimum")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=tight_cases())
def test_no_plan_is_faster_than_the_bound(case: tuple[dict, Cluster]) -> None:
    check_bound(*case)


@st.composite
def split_chains(draw: st.DrawFn) -> tuple[dict, Cluster]:
    """A chain of 3–6 ops whose persistent bytes no one device holds: stretches must split."""
    n = draw(st.integers(3, 6))
    ops = [op(f"o{i}", draw(st.integers(0, 20)), persistent_bytes=draw(st.integers(0, 6)) * 10,
              output_bytes=draw(st.integers(0, 5))) for i in range(n)]
    edges = [edge(f"o{i}", f"o{i + 1}", draw(st.integers(0, 40))) for i in range(n - 1)]
    cluster = Cluster.parse({"devices": {"count": draw(st.integers(2, 3)),
                                         "memory_bytes": draw(st.integers(6, 12)) * 10},
                             "network": {"latency_us": draw(st.integers(0, 3)),
                                         "bandwidth_gbps": 0.001}})
    return graph_doc(ops, edges), cluster


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=split_chains())
def test_no_split_chain_is_faster_than_the_bound(case: tuple[dict, Cluster]) -> None:
    check_bound(*case)


@st.composite
def skip_chains(draw: st.DrawFn) -> tuple[dict, Cluster]:
    """A chain of 3–6 ops with skip edges (a residual block's shape) whose outputs, held
    until their last reader, are what no one device holds; zero-time ops included. An edge
    carries its producer's whole output, as in profiled graphs, or a few bytes."""
    n = draw(st.integers(3, 6))
    outputs = [draw(st.integers(0, 6)) * 10 for _ in range(n)]
    ops = [op(f"o{i}", draw(st.sampled_from([0, 5, 10, 20])),
              persistent_bytes=draw(st.integers(0, 1)) * 10, output_bytes=outputs[i])
           for i in range(n)]
    pairs = [(i, i + 1) for i in range(n - 1)] + sorted(draw(st.sets(
        st.tuples(st.integers(0, n - 3), st.integers(2, n - 1)).filter(
            lambda p: p[1] > p[0] + 1), min_size=1, max_size=3)))
    edges = [edge(f"o{i}", f"o{j}", draw(st.sampled_from([outputs[i], 1]))) for i, j in pairs]
    cluster = Cluster.parse({"devices": {"count": 2, "memory_bytes": draw(st.integers(4, 12)) * 10},
                             "network": {"latency_us": draw(st.integers(0, 3)),
                                         "bandwidth_gbps": 0.001,
                                         "mode": draw(st.sampled_from(["parallel",
                                                                       "sequential"]))}})
    return graph_doc(ops, edges), cluster


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=skip_chains())
def test_no_plan_of_a_chain_with_skips_is_faster_than_the_bound(
        case: tuple[dict, Cluster]) -> None:
    check_bound(*case)


MB = 10**6
CHAIN = graph_doc(
    [op("a", 10, persistent_bytes=60 * MB), op("b", 10, persistent_bytes=30 * MB),
     op("c", 10, persistent_bytes=30 * MB), op("d", 10, persistent_bytes=60 * MB)],
    [edge("a", "b", 1000), edge("b", "c", 100), edge("c", "d", 1000)])
#: 1 µs latency, 1000 bytes per µs: edges cost 2, 1.1 and 2 µs
NETWORK = {"latency_us": 1, "bandwidth_gbps": 1}


def test_a_stretch_no_device_holds_costs_its_cheapest_edge() -> None:
    # no two neighbours are apart, yet a, b, c (120 MB) fit no 100 MB device, nor b, c, d:
    # the cheapest edge splitting both stretches is b → c
    cluster = Cluster.parse({"devices": {"count": 2, "memory_bytes": 100 * MB},
                             "network": NETWORK})
    assert CostModel(load_graph(CHAIN), cluster).lower_bound_us() == 40
    assert bound_of(CHAIN, cluster) == pytest.approx(41.1)
    # 90 MB: a, b fit, so do c, d, but not a, b, c: still b → c
    assert bound_of(CHAIN, cluster.model_copy(update={"devices": [
        d.model_copy(update={"memory_bytes": 90 * MB}) for d in cluster.devices]})) \
        == pytest.approx(41.1)
    # 60 MB: a and d fit alone, b and c together: a → b and c → d cross
    tight = Cluster.parse({"devices": {"count": 4, "memory_bytes": 60 * MB}, "network": NETWORK})
    assert bound_of(CHAIN, tight) == pytest.approx(44)
    # one unlimited device: nothing is forced
    roomy = Cluster.parse({"devices": [{"name": "/GPU:0", "memory_bytes": 100 * MB},
                                       {"name": "/GPU:1"}], "network": NETWORK})
    assert bound_of(CHAIN, roomy) == 40


def test_an_output_held_through_a_stretch_forces_a_crossing() -> None:
    # a residual block: a's 50 MB output is held on its device until d reads it, so while c
    # runs (b's 40 MB in, its own 40 MB out) one device would hold 130 MB: a, b, c, d cannot
    # share a 100 MB device, though any three neighbours fit; the cheapest edge to cut is one
    # carrying 40 MB (1 µs + 40 µs at 1 TB/s)
    block = graph_doc([op("a", 10, output_bytes=50 * MB), op("b", 10, output_bytes=40 * MB),
                       op("c", 10, output_bytes=40 * MB), op("d", 10, output_bytes=1)],
                      [edge("a", "b", 50 * MB), edge("b", "c", 40 * MB),
                       edge("c", "d", 40 * MB), edge("a", "d", 50 * MB)])
    network = {"latency_us": 1, "bandwidth_gbps": 1000}
    cluster = Cluster.parse({"devices": {"count": 2, "memory_bytes": 100 * MB},
                             "network": network})
    assert CostModel(load_graph(block), cluster).lower_bound_us() == 40
    assert bound_of(block, cluster) == pytest.approx(81)
    best, _, _ = brute_force(load_graph(block), cluster,
                             colocation_units(load_graph(block), cluster))
    assert best >= 81
    # room for all three tensors: nothing is forced
    roomy = Cluster.parse({"devices": {"count": 2, "memory_bytes": 130 * MB},
                           "network": network})
    assert bound_of(block, roomy) == 40


def test_pins_force_a_crossing_without_memory_limits() -> None:
    doc = graph_doc([op("a", 10, device="/GPU:0"), op("b", 10), op("c", 10, device="/GPU:1")],
                    [edge("a", "b", 1000), edge("b", "c", 100)])
    assert bound_of(doc, Cluster.parse({"devices": {"count": 2}, "network": NETWORK})) \
        == pytest.approx(31.1)


def test_auto_proves_a_split_chain_optimal_by_the_bound() -> None:
    cluster = {"devices": {"count": 2, "memory_bytes": 100 * MB}, "network": NETWORK}
    plan = place(CHAIN, cluster, "auto", {"time_limit_s": 5})
    assert plan.estimate.lower_bound_us == 40  # DESIGN's bound, as the contract defines it
    assert plan.estimate.step_time_us == pytest.approx(41.1)
    assert plan.stats.bound_us == pytest.approx(41.1)
    assert plan.stats.optimal is True
