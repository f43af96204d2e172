"""The step-time bound that counts forced transfers (baechi.bounds.step_bound_us): never above
the best plan (brute force on tiny graphs with memory limits and pins), tight on a chain that
memory must split, and what lets ``auto`` prove such a plan optimal. The packing of units
(baechi.bounds.pack_units): never "impossible" where brute force finds a plan, and what lets a
request fail fast."""

from __future__ import annotations

import json
import math

import pytest
from conftest import SHARED, needs_shared
from helpers import edge, graph_doc, op
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from baechi import Cluster, load_graph, place
from baechi.bounds import pack_units, step_bound_us
from baechi.costmodel import CostModel, running_bytes
from baechi.errors import InfeasiblePlacement
from baechi.graph import Graph
from baechi.grouping import colocation_units
from baechi.memory import persistent_bytes_by
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
    """The bound is at least the format's and at most the best plan's step time (brute force)."""
    graph = load_graph(doc)
    units = colocation_units(graph, cluster)
    best, _, _ = brute_force(graph, cluster, units)
    bound = step_bound_us(graph, cluster, units, CostModel(graph, cluster))
    floor = CostModel(graph, cluster).lower_bound_us()
    assert bound >= floor
    assert bound <= best * (1 + 1e-9)  # inf when no plan fits: any bound holds
    event("feasible" if best < math.inf else "no plan fits")
    check_packing(graph, cluster, best)
    if best < math.inf:
        event("raised above the format's lower bound" if bound > floor else "the format's lower bound")
        event("tight" if bound == pytest.approx(best) else "below the optimum")


def check_packing(graph: Graph, cluster: Cluster, best: float) -> None:
    """:func:`pack_units` decides these tiny cases, never calls one with a plan impossible,
    and every packing it returns keeps pins and fits each device."""
    units = colocation_units(graph, cluster)
    cost = CostModel(graph, cluster)
    packing = pack_units(graph, cluster, units, cost)
    event(f"packing {packing.status}")
    assert packing.status != "unknown"
    if packing.status == "impossible":
        assert best == math.inf
        return
    assert packing.unit_device is not None
    device_of = [packing.unit_device[unit] for unit in units.unit_of]
    held = persistent_bytes_by(graph, device_of, len(cluster.devices))
    peak = [0] * len(cluster.devices)
    for u, d in enumerate(packing.unit_device):
        assert units.pin[u] in (-1, d)
        for v in units.members[u]:
            peak[d] = max(peak[d], running_bytes(graph, v, cost))
    for d, device in enumerate(cluster.devices):
        assert held[d] + peak[d] <= device.memory_bytes


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
    assert plan.estimate.lower_bound_us == 40  # the format's lower bound, as the contract defines it
    assert plan.estimate.step_time_us == pytest.approx(41.1)
    assert plan.stats.bound_us == pytest.approx(41.1)
    assert plan.stats.optimal is True


# ---------------------------------------------------------------------------- packing

#: Weights of 4, 4, 3, 3 and 2 MB on two 8 MB devices: they fit only as {4, 4} and {3, 3, 2},
#: which first-fit decreasing misses (4 | 4, 3 | 3, then 2 fits neither).
WEIGHTS = graph_doc([op(f"w{i}", 1, persistent_bytes=size * MB)
                     for i, size in enumerate([4, 4, 3, 3, 2])], [])


def test_cp_sat_packs_what_first_fit_decreasing_misses() -> None:
    graph = load_graph(WEIGHTS)
    cluster = Cluster.parse({"devices": {"count": 2, "memory_bytes": 8 * MB}})
    units = colocation_units(graph, cluster)
    packing = pack_units(graph, cluster, units, CostModel(graph, cluster))
    assert packing.status == "packed"
    assert packing.unit_device is not None
    pairs = {tuple(u for u, d in enumerate(packing.unit_device) if d == device)
             for device in (0, 1)}
    assert pairs == {(0, 1), (2, 3, 4)}
    place(WEIGHTS, cluster, "m-etf")  # and a plan exists


def test_a_request_no_split_fits_fails_fast_naming_the_cause() -> None:
    # 16 MB of weights in 17.6 MB, each under a device's 8.8 MB: every check of one unit or
    # of the total passes, yet no split of 4, 4, 3, 3, 2 leaves 0.8 MB for the 1 MB output
    doc = graph_doc([*WEIGHTS["ops"], op("out", 1, output_bytes=1 * MB)], [])
    cluster = {"devices": {"count": 2, "memory_bytes": 8 * MB + 800_000}}
    for algorithm in ("auto", "m-etf", "m-fill"):
        with pytest.raises(InfeasiblePlacement, match="no split of the graph over the 2 devices"
                           r".*op 'out' needs 1000000 while it runs") as error:
            place(doc, cluster, algorithm, {"time_limit_s": 5})
        # the best splits, {4, 4} or {3, 3, 2} with the output, are 0.2 MB over
        assert error.value.details["op"] == "out"
        assert 180_000 <= error.value.details["missing_bytes"] <= 200_000
    # with room for the output on one device, the weights split as {4, 4} and {3, 3, 2} +
    # output: a plan
    plan = place(doc, {"devices": {"count": 2, "memory_bytes": 9 * MB}}, "auto",
                 {"time_limit_s": 5})
    assert plan.estimate.memory_ok


def test_the_unit_check_counts_an_op_zero_time_on_the_cluster_as_instant() -> None:
    # b takes 10 µs at speed 1 but no time on a gpu: it frees a's 600 bytes before it
    # allocates its own 10, so the gpu holds 600 at most. The check of single units once
    # judged b by compute_us alone (610 bytes while it runs) and refused this request.
    doc = graph_doc(
        [op("a", 10, output_bytes=600),
         op("b", 10, output_bytes=10, compute_us_by_kind={"gpu": 0}), op("c", 10)],
        [edge("a", "b", 600), edge("b", "c", 10)])
    cluster = {"devices": {"count": 2, "memory_bytes": 605}}
    for algorithm in ("auto", "m-etf"):
        plan = place(doc, cluster, algorithm, {"time_limit_s": 2})
        assert plan.estimate.memory_ok
        assert max(plan.estimate.peak_memory_bytes.values()) == 600
    cluster = {"devices": {"count": 2, "memory_bytes": 599}}
    with pytest.raises(InfeasiblePlacement, match="op 'a' needs 600 bytes"):
        place(doc, cluster, "m-etf")


@needs_shared
def test_bert_inference_at_30_percent_is_proved_infeasible() -> None:
    # bert_l-6_inference_operator at 30% of its single-device peak on 4 devices: its 2.23 GB
    # of weights fit the 3.15 GB in sum and each colocation group fits a device, but no
    # split does (two groups of 375 MB and the ops that need 392 MB while they run); before
    # the packing check every placer searched its whole time limit for a plan
    path = SHARED / "graphs" / "dnn-partitioning" / "latency-inputs" / \
        "bert_l-6_inference_operator.json"
    doc = json.loads(path.read_text())
    cluster = {"devices": {"count": 4, "memory_bytes": 787_011_564}}
    with pytest.raises(InfeasiblePlacement, match="no split of the graph over the 4 devices"):
        place(doc, cluster, "auto", {"time_limit_s": 30})
