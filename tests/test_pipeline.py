"""The reduction pipeline (docs/format.md §6): phases, fusion acyclicity, memory model, expansion."""

from __future__ import annotations

import random

import pytest
from conftest import SHARED, needs_shared
from helpers import edge, graph_doc, op
from hypothesis import given, settings
from hypothesis import strategies as st
from test_grouping import grouped_dags

import baechi
from baechi.algorithms import ALGORITHMS
from baechi.algorithms.base import Assignment
from baechi.cluster import Cluster
from baechi.fusion import contract, fuse, fusion_partition
from baechi.graph import Graph, load_graph
from baechi.grouping import co_place, colocation_units, merge_cap, unit_memory
from baechi.memory import memory_proxy
from baechi.options import Options
from baechi.pipeline import Reduction, reduce_graph
from baechi.simulate import check_constraints, check_orders, replay, single_device_run

GNMT = SHARED / "graphs/baechi/gnmt_baechi.json"
TRAINING = sorted((SHARED / "graphs/dnn-partitioning/throughput-inputs").glob("*training*.json"))
PIPEDREAM = sorted((SHARED / "graphs/pipedream").glob("*.json"))


def _reduce(graph: Graph, cluster: Cluster, **options: bool) -> Reduction:
    return reduce_graph(graph, cluster, Options(**options))


def _random_assignment(reduction: Reduction, cluster: Cluster, seed: int) -> Assignment:
    """A consistent assignment of the reduced nodes: a device per unit (pins kept) and a
    random linear extension of the reduced graph cut into per-device orders."""
    rnd = random.Random(seed)
    graph, units = reduction.graph, reduction.units
    unit_device = [p if p >= 0 else rnd.randrange(len(cluster.devices)) for p in units.pin]
    device_of = [unit_device[units.unit_of[node]] for node in range(len(graph))]
    indegree = [len(ins) for ins in graph.in_edges]
    ready = [v for v in range(len(graph)) if indegree[v] == 0]
    orders: list[list[int]] = [[] for _ in cluster.devices]
    while ready:
        v = ready.pop(rnd.randrange(len(ready)))
        orders[device_of[v]].append(v)
        for k in graph.out_edges[v]:
            w = graph.edge_dst[k]
            indegree[w] -= 1
            if indegree[w] == 0:
                ready.append(w)
    assert sum(map(len, orders)) == len(graph)
    return Assignment(device_of, orders)


def _check_reduction(
    graph: Graph, cluster: Cluster, reduction: Reduction, forward_pairs: bool = True
) -> None:
    """Every invariant of a reduction (see the pipeline and fusion docstrings)."""
    reduced, units = reduction.graph, reduction.units
    if reduction.members is None:
        assert reduced is graph
    else:
        members = reduction.members
        # each op in exactly one node, listed in canonical order
        assert sorted(op for ms in members for op in ms) == list(range(len(graph)))
        position = {op: i for i, op in enumerate(graph.topo)}
        for ms in members:
            assert [position[o] for o in ms] == sorted(position[o] for o in ms)
            # a node never spans two units of the original graph
            assert len({reduction.node_of[o] for o in ms}) == 1  # type: ignore[index]
        # acyclic: nodes are numbered topologically and the canonical order confirms it
        assert all(s < d for s, d in zip(reduced.edge_src, reduced.edge_dst, strict=True))
        assert reduced.topo == list(range(len(reduced)))
        # a valid graph document: it reloads through full validation
        again = load_graph(reduced.to_dict())
        assert again.names == reduced.names and again.num_edges == reduced.num_edges
        # every original edge between two nodes is still there, once per tensor
        cross = {(reduction.node_of[s], reduction.node_of[d])  # type: ignore[index]
                 for s, d in zip(graph.edge_src, graph.edge_dst, strict=True)}
        kept = set(zip(reduced.edge_src, reduced.edge_dst, strict=True))
        assert kept == {(a, b) for a, b in cross if a != b}
        # compute and persistent bytes are conserved
        assert sum(reduced.compute_us) == pytest.approx(sum(graph.compute_us))
        assert sum(reduced.persistent_bytes) == sum(graph.persistent_bytes)
    # units of the placed graph: a partition with consistent pins
    assert sorted(v for ms in units.members for v in ms) == list(range(len(reduced)))
    # expansion of any consistent assignment is a valid plan of the original graph
    for seed in range(3):
        assignment = _random_assignment(reduction, cluster, seed)
        device_of, orders = reduction.expand(assignment.device_of, assignment.orders)
        assert sorted(op for order in orders for op in order) == list(range(len(graph)))
        assert all(device_of[op] == d for d, order in enumerate(orders) for op in order)
        check_orders(graph, orders)
        check_constraints(graph, cluster, device_of, forward_pairs)
        replay(graph, cluster, device_of, orders)


# ---------------------------------------------------------------------------- phases


def test_nodes_and_units_after_each_phase() -> None:
    # two colocated ops, a chain into them, one op with two consumers
    g = load_graph(graph_doc(
        [op("a"), op("b"), op("w", colocation_group="v"), op("r", colocation_group="v"),
         op("x"), op("y"), op("z")],
        [edge("a", "b"), edge("b", "w"), edge("w", "r"), edge("r", "x"), edge("r", "y"),
         edge("x", "z"), edge("y", "z")],
    ))
    r = reduce_graph(g, Cluster.uniform(2), Options())
    assert [(p["phase"], p["nodes"], p["units"]) for p in r.nodes] == [
        ("input", 7, 7), ("grouping", 7, 6), ("co_placement", 7, 2), ("fusion", 2, 2)]
    assert set(r.seconds) == {"grouping", "co_placement", "fusion"}
    assert [[g.names[o] for o in ms] for ms in r.members] == [  # type: ignore[union-attr]
        ["a", "b", "w", "r"], ["x", "y", "z"]]


def test_each_option_switches_its_step_off() -> None:
    g = load_graph(graph_doc(
        [op("a"), op("b", colocation_group="g"), op("c", colocation_group="g"),
         op("gb", forward_op="b")],
        [edge("a", "b"), edge("b", "c"), edge("c", "gb")],
    ))
    c = Cluster.uniform(2)

    def units(r: Reduction) -> list[list[str]]:
        nodes = r.members or [[v] for v in range(len(g))]
        return sorted(sorted(g.names[o] for v in ms for o in nodes[v]) for ms in r.units.members)

    every = _reduce(g, c)
    assert [p["phase"] for p in every.nodes] == ["input", "grouping", "co_placement", "fusion"]
    assert units(every) == [["a", "b", "c", "gb"]]

    no_co = _reduce(g, c, co_placement=False)
    assert [p["phase"] for p in no_co.nodes] == ["input", "grouping", "fusion"]
    assert units(no_co) == [["a"], ["b", "c", "gb"]]

    no_fusion = _reduce(g, c, fusion=False)
    assert no_fusion.graph is g and no_fusion.members is None
    assert [p["phase"] for p in no_fusion.nodes] == ["input", "grouping", "co_placement"]
    assert units(no_fusion) == [["a", "b", "c", "gb"]]

    no_forward = _reduce(g, c, co_placement=False, forward_only=False)
    assert units(no_forward) == [["a"], ["b", "c"], ["gb"]]

    none = _reduce(g, c, co_placement=False, fusion=False, forward_only=False)
    assert none.graph is g and len(none.units) == 3 and len(none.nodes) == 2


def test_a_request_reduces_once_per_set_of_switches() -> None:
    """``auto``'s pipelined candidates share one reduction: the first run spends its
    seconds, the next ones none, and a copy with a shorter deadline shares the cache."""
    import dataclasses
    import time

    from baechi.algorithms.base import no_progress
    from baechi.placing import Request, run_algorithm

    doc = graph_doc([op(n, 5, output_bytes=10) for n in "abcd"],
                    [edge("a", "b", 10), edge("b", "c", 10), edge("c", "d", 10)])
    graph, cluster = load_graph(doc), Cluster.uniform(2)
    request = Request.of(graph, cluster, Options(), time.perf_counter(), no_progress)
    first = run_algorithm(request, "m-etf", request.options)
    shorter = dataclasses.replace(request, deadline=request.deadline - 1)
    second = run_algorithm(shorter, "m-topo", request.options)
    assert second.reduction is first.reduction
    assert {"grouping", "co_placement", "fusion"} <= set(first.seconds)
    assert not {"grouping", "co_placement", "fusion"} & set(second.seconds)
    unreduced = request.options.without_pipeline()
    assert run_algorithm(request, "m-etf", unreduced).reduction is request.unreduced
    assert len(request.reductions) == 2


def test_expand_without_fusion_is_the_identity() -> None:
    g = load_graph(graph_doc([op("a"), op("b")], [edge("a", "b")]))
    r = _reduce(g, Cluster.uniform(2), fusion=False)
    assert r.expand([1, 0], [[1], [0]]) == ([1, 0], [[1], [0]])


# ---------------------------------------------------------------------------- fusion


def test_fusion_never_contracts_an_edge_with_a_detour() -> None:
    # a -> b -> d and a -> c -> d; a, d in one unit, b and c elsewhere: {a, d} would be a cycle
    g = load_graph(graph_doc(
        [op("a", colocation_group="g"), op("b"), op("c"), op("d", colocation_group="g")],
        [edge("a", "b"), edge("a", "c"), edge("b", "d"), edge("c", "d"), edge("a", "d")],
    ))
    c = Cluster.uniform(2)
    f = fuse(g, c, colocation_units(g, c))
    assert len(f.graph) == 4 and len(f.units) == 3
    assert f.stats["cycles_avoided"] >= 1


def test_exact_check_contracts_what_baechis_rule_refuses() -> None:
    # u -> v with out(u) = 2 and in(v) = 2, no detour: Baechi's rule skips it, ours does not
    g = load_graph(graph_doc(
        [op("p"), op("u", colocation_group="g"), op("v", colocation_group="g"), op("s"),
         op("t")],
        [edge("p", "v"), edge("u", "v"), edge("u", "s"), edge("p", "t"), edge("s", "t"),
         edge("v", "t")],
    ))
    c = Cluster.uniform(2)
    f = fuse(g, c, colocation_units(g, c))
    assert f.node_of[g.index["u"]] == f.node_of[g.index["v"]]
    assert len(f.graph) == 4


def test_exact_check_reorders_ranks_pearce_kelly_style() -> None:
    # u's other successor s comes before v, v's other predecessor p after u: only the
    # search decides, and the merged node needs p before it and s after it
    g = load_graph(graph_doc(
        [op("u", colocation_group="g"), op("s"), op("p"), op("v", colocation_group="g"),
         op("t")],
        [edge("u", "s"), edge("u", "v"), edge("p", "v"), edge("s", "t"), edge("v", "t")],
    ))
    stats: dict[str, int] = {}
    node_of, count = fusion_partition(g, colocation_units(g, Cluster.uniform(2)).unit_of,
                                      stats=stats)
    assert stats["reordered"] == 1 and count == 4
    f = contract(g, Cluster.uniform(2), colocation_units(g, Cluster.uniform(2)), node_of, count)
    assert all(s < d for s, d in zip(f.graph.edge_src, f.graph.edge_dst, strict=True))


def test_fused_node_memory_counts_outputs_that_leave_and_the_internal_peak() -> None:
    # a (8 B, used by b only) -> b (4 B, sent out) -> c elsewhere; x: a sink inside the node
    g = load_graph(graph_doc(
        [op("a", output_bytes=8, temp_bytes=2, persistent_bytes=1, colocation_group="g"),
         op("b", output_bytes=4, temp_bytes=1, colocation_group="g"),
         op("x", output_bytes=16, colocation_group="g"), op("c")],
        [edge("a", "b", 8), edge("b", "c", 4), edge("b", "x", 4)],
    ))
    c = Cluster.uniform(2)
    f = fuse(g, c, colocation_units(g, c))
    node = f.node_of[0]
    assert f.members[node] == [0, 1, 2]
    assert f.graph.output_bytes[node] == 4  # only b's output leaves the node
    # a: 2 + 8 = 10; b: 8 (a's output, still needed) + 1 = 9; x: 16 (its own output) = 16
    assert f.graph.temp_bytes[node] == 16
    assert f.graph.persistent_bytes[node] == 1
    assert f.graph.compute_us[node] == 30


def test_reduced_edges_keep_each_tensor_distinct() -> None:
    # a and b fuse; both send a tensor named "t" to c, and a sends "t" twice to one node
    g = load_graph(graph_doc(
        [op("a", colocation_group="g"), op("b", colocation_group="g"),
         op("c", colocation_group="h"), op("d", colocation_group="h")],
        [edge("a", "b", 1), edge("a", "c", 5, tensor="t"), edge("b", "c", 6, tensor="t"),
         edge("a", "d", 5, tensor="t"), edge("c", "d", 1), edge("a", "c", 0, control=True),
         edge("b", "d", 0, control=True)],
    ))
    c = Cluster.uniform(2)
    f = fuse(g, c, colocation_units(g, c))
    assert len(f.graph) == 2
    data = sorted((t, b) for t, b, ctl in zip(f.graph.edge_tensor, f.graph.edge_bytes,
                                              f.graph.edge_control, strict=True) if not ctl)
    assert data == [("0:t", 5), ("1:t", 6)]  # a's "t" once (cached per device), b's "t"
    assert sum(f.graph.edge_control) == 1


def test_one_tensor_sent_with_two_sizes_stays_two_transfers() -> None:
    g = load_graph(graph_doc(
        [op("a"), op("c", colocation_group="h"), op("d", colocation_group="h")],
        [edge("a", "c", 5, tensor="t"), edge("a", "d", 7, tensor="t"), edge("c", "d")],
    ))
    c = Cluster.uniform(2)
    f = fuse(g, c, colocation_units(g, c))
    assert sorted(f.graph.edge_tensor) == ["0:t:5", "0:t:7"]
    load_graph(f.graph.to_dict())  # still a valid document


def test_pins_survive_reduction_and_expansion() -> None:
    g = load_graph(graph_doc(
        [op("a"), op("b", device="/GPU:1"), op("c"), op("d", device="/GPU:0"), op("e")],
        [edge("a", "b", 5), edge("b", "c", 5), edge("c", "e", 5), edge("d", "e", 5)],
    ))
    cluster = Cluster.uniform(2)
    r = _reduce(g, cluster)
    pinned = {r.graph.names[v]: r.graph.pin[v] for v in range(len(r.graph)) if r.graph.pin[v]}
    assert pinned["a"] == "/GPU:1"  # a, b, c fused with b's pin
    assert r.units.pin[r.units.unit_of[r.node_of[g.index["d"]]]] == 0  # type: ignore[index]
    _check_reduction(g, cluster, r)
    plan = baechi.place(g, {"devices": {"count": 2}}, "m-etf", {"allow_single": False})
    assert plan.placement["b"] == "/GPU:1" and plan.placement["d"] == "/GPU:0"


def test_fused_graph_is_a_document_again() -> None:
    g = load_graph(graph_doc([op("a", colocation_group="g"), op("b", colocation_group="g")],
                             [edge("a", "b", 3)]))
    c = Cluster.uniform(2)
    reduced = fuse(g, c, colocation_units(g, c)).graph
    again = load_graph(reduced.to_dict())
    assert again.names == reduced.names and again.sha256 == reduced.sha256


@settings(max_examples=200, deadline=None)
@given(graph=grouped_dags(), devices=st.integers(1, 3),
       limit=st.sampled_from([None, 80, 400]), switches=st.integers(0, 7),
       budget=st.sampled_from([0, 4, 128]), cap_scale=st.sampled_from([1.0, 0.5, 0.1]))
def test_pipeline_invariants_on_random_dags(
    graph: Graph, devices: int, limit: int | None, switches: int, budget: int,
    cap_scale: float,
) -> None:
    cluster = Cluster.uniform(devices, memory_bytes=limit)
    options = Options(co_placement=bool(switches & 1), fusion=bool(switches & 2),
                      forward_only=bool(switches & 4))
    reduction = reduce_graph(graph, cluster, options, cap_scale)
    assert reduction.cap_scale == cap_scale
    _check_reduction(graph, cluster, reduction, options.forward_only)
    # a tiny search budget falls back to the cheap rules and must stay acyclic too
    f = fuse(graph, cluster, colocation_units(graph, cluster), max_visits=budget)
    assert all(s < d for s, d in zip(f.graph.edge_src, f.graph.edge_dst, strict=True))


def test_a_smaller_merge_cap_leaves_smaller_nodes() -> None:
    """``cap_scale`` scales the merge cap: each node's memory proxy stays within the scaled
    cap, so halving it splits what the full cap merges (auto's finer reduction)."""
    chain = [op(f"o{i}", 1, output_bytes=100) for i in range(8)]
    g = load_graph(graph_doc(chain, [edge(f"o{i}", f"o{i + 1}", 100) for i in range(7)]))
    cluster = Cluster.uniform(2, memory_bytes=400)  # cap: half a device, 200 bytes
    full, half = (reduce_graph(g, cluster, Options(), scale) for scale in (1.0, 0.5))
    assert merge_cap(g, cluster) == 200
    assert (len(full.graph), len(half.graph)) == (4, 8)  # pairs; every op alone
    for reduction, cap in ((full, 200), (half, 100)):
        assert reduction.members is not None
        assert max(memory_proxy(g, ms) for ms in reduction.members) <= cap
        _check_reduction(g, cluster, reduction)


@settings(max_examples=100, deadline=None)
@given(graph=grouped_dags())
def test_fusion_never_hides_memory_on_one_device(graph: Graph) -> None:
    """On one device the reduced graph's peak bounds the original's in the expanded order."""
    cluster = Cluster.uniform(1)
    reduction = _reduce(graph, cluster)
    if reduction.members is None:
        return
    reduced = reduction.graph
    reduced_peak = single_device_run(reduced, cluster)[1]
    device_of, orders = reduction.expand([0] * len(reduced), [reduced.topo])
    assert replay(graph, cluster, device_of, orders).memory[0].peak <= reduced_peak


# ---------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("algorithm", sorted(set(ALGORITHMS) & {"single", "m-topo", "m-etf",
                                                                 "m-sct"}))
def test_place_end_to_end_names_every_op(algorithm: str) -> None:
    g = load_graph(graph_doc(
        [op("x", 50, output_bytes=100), op("w1", 5, persistent_bytes=10, colocation_group="l1"),
         op("m1", 40, colocation_group="l1"), op("r1", 3), op("m2", 40), op("r2", 3),
         op("loss", 10), op("g2", 30, forward_op="m2"), op("g1", 30, forward_op="m1")],
        [edge("x", "m1", 100), edge("w1", "m1", 10), edge("m1", "r1", 50), edge("x", "m2", 100),
         edge("m2", "r2", 50), edge("r1", "loss", 50), edge("r2", "loss", 50),
         edge("loss", "g2", 4), edge("loss", "g1", 4), edge("m2", "g2", 50),
         edge("m1", "g1", 50)],
    ))
    cluster = {"devices": {"count": 2},
               "network": {"latency_us": 1, "bandwidth_gbps": 10}}
    plan = baechi.place(g, cluster, algorithm, {"allow_single": False})
    assert set(plan.placement) == set(g.names)
    assert sorted(n for order in plan.order.values() for n in order) == sorted(g.names)
    assert plan.placement["g1"] == plan.placement["m1"] == plan.placement["w1"]
    assert plan.placement["g2"] == plan.placement["m2"]
    phases = [p.phase for p in plan.stats.nodes]
    assert phases[0] == "input"
    assert baechi.simulate(g, plan).step_time_us == pytest.approx(plan.estimate.step_time_us)


# ---------------------------------------------------------------------------- shared graphs


@needs_shared
def test_gnmt_reduces_like_baechi() -> None:
    # its reduction time is measured in bench/speed.py
    g = load_graph(GNMT)
    cluster = Cluster.uniform(4, latency_us=134, bandwidth_gbps=5.701)
    reduction = _reduce(g, cluster)
    counts = {p["phase"]: p for p in reduction.nodes}
    assert counts["grouping"]["units"] == 1617
    assert 500 <= counts["fusion"]["nodes"] <= 650  # Baechi: 576 nodes
    _check_reduction(g, cluster, reduction)


@needs_shared
@pytest.mark.parametrize("path", [*TRAINING, *PIPEDREAM], ids=lambda p: p.stem)
def test_shared_graphs_reduce_within_memory_and_expand(path: object) -> None:
    g = load_graph(path)  # type: ignore[arg-type]
    peak = single_device_run(g, Cluster.uniform(1))[1]
    for memory in (None, peak // 2):
        cluster = Cluster.uniform(4, memory_bytes=memory, latency_us=134, bandwidth_gbps=5.7)
        reduction = _reduce(g, cluster)
        _check_reduction(g, cluster, reduction)
        # a unit bigger than the cap can only be a hard unit (colocation group, forward pair)
        hard = colocation_units(g, cluster)
        co = co_place(g, cluster, hard)
        cap = merge_cap(g, cluster)
        for ms, size in zip(co.members, unit_memory(g, co), strict=True):
            assert size <= cap or len({hard.unit_of[o] for o in ms}) == 1
        assert reduction.nodes[-1]["nodes"] < len(g)
