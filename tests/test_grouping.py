"""Units of placement (docs/format.md §6 steps 1–2): colocation, forward pairs, pins, co-placement."""

from __future__ import annotations

import math

import pytest
from conftest import SHARED, needs_shared
from helpers import edge, graph_doc, op
from hypothesis import given, settings
from hypothesis import strategies as st

from baechi import InvalidRequest
from baechi.cluster import Cluster
from baechi.graph import Graph, load_graph
from baechi.grouping import (
    DisjointSets,
    co_place,
    colocation_units,
    graph_memory,
    merge_cap,
    single_consumers,
    unit_memory,
)
from baechi.simulate import single_device_run

RESNET50_TRAINING = (
    SHARED / "graphs/dnn-partitioning/throughput-inputs/resnet50_training_operator.json"
)


def _units(graph: Graph, units: object) -> list[list[str]]:
    return [[graph.names[o] for o in ms] for ms in units.members]  # type: ignore[attr-defined]


def _chain(n: int, nbytes: int = 10) -> Graph:
    ops = [op(f"o{i}", output_bytes=nbytes) for i in range(n)]
    return load_graph(graph_doc(ops, [edge(f"o{i}", f"o{i + 1}", nbytes) for i in range(n - 1)]))


# ---------------------------------------------------------------------------- union-find


def test_disjoint_sets_union_by_size_and_find() -> None:
    sets = DisjointSets(6)
    for a, b in [(0, 1), (2, 3), (1, 3), (4, 5)]:
        sets.union(a, b)
    assert len({sets.find(x) for x in range(4)}) == 1
    assert sets.find(4) == sets.find(5) != sets.find(0)
    assert sets.union(0, 3) == sets.find(2)  # already joined: returns the root


# ---------------------------------------------------------------------------- hard units


def test_colocation_groups_and_forward_pairs_form_units() -> None:
    g = load_graph(graph_doc([
        op("w", colocation_group="v"), op("x"), op("gx", forward_op="x"),
        op("r", colocation_group="v"), op("gw", forward_op="w"),
    ]))
    c = Cluster.uniform(2)
    assert _units(g, colocation_units(g, c)) == [["w", "r", "gw"], ["x", "gx"]]
    assert _units(g, colocation_units(g, c, forward_only=False)) == [
        ["w", "r"], ["x"], ["gx"], ["gw"]]


def test_unit_takes_a_members_pin_and_conflicting_pins_are_an_error() -> None:
    c = Cluster.uniform(2)
    g = load_graph(graph_doc([op("a", colocation_group="g"),
                              op("b", colocation_group="g", device="/GPU:1")]))
    assert colocation_units(g, c).pin == [1]
    # one colocation group pinned twice is refused when the graph loads (test_input_bounds);
    # a backward op pinned away from its forward op only when pairs form units
    bad = load_graph(graph_doc([op("a", device="/GPU:0"),
                                op("b", forward_op="a", device="/GPU:1")]))
    with pytest.raises(InvalidRequest, match="'b'.*/GPU:1.*'a'"):
        colocation_units(bad, c)
    with pytest.raises(InvalidRequest, match="not a device"):
        colocation_units(load_graph(graph_doc([op("a", device="/TPU:9")])), c)


# ---------------------------------------------------------------------------- memory proxy


def test_unit_memory_is_persistent_plus_outputs_plus_largest_temp() -> None:
    g = load_graph(graph_doc([
        op("a", output_bytes=10, temp_bytes=7, persistent_bytes=1, colocation_group="g"),
        op("b", output_bytes=5, temp_bytes=9, persistent_bytes=2, colocation_group="g"),
    ]))
    assert unit_memory(g, colocation_units(g, Cluster.uniform(1))) == [1 + 2 + 10 + 5 + 9]
    assert graph_memory(g) == 27


def test_merge_cap_is_the_smaller_of_half_a_device_and_a_share() -> None:
    g = _chain(4, nbytes=100)  # graph memory 400
    assert merge_cap(g, Cluster.uniform(4)) == 100
    assert merge_cap(g, Cluster.uniform(2, memory_bytes=300)) == 150
    assert merge_cap(g, Cluster.uniform(1)) == math.inf
    assert merge_cap(g, Cluster.uniform(1, memory_bytes=120)) == 60
    mixed = Cluster.parse({"devices": [{"name": "a", "memory_bytes": 180}, {"name": "b"}]})
    assert merge_cap(g, mixed) == 90  # the smallest device bounds every unit


# ---------------------------------------------------------------------------- co-placement


def test_single_consumer_counts_data_consumers_not_control_edges() -> None:
    g = load_graph(graph_doc(
        [op(n) for n in "abcdef"],
        [edge("a", "b", 8), edge("a", "b", 4, tensor="a:1"),  # two tensors, one consumer
         edge("a", "c", 0, control=True),                     # control: ignored
         edge("b", "c", 1), edge("b", "d", 1),                # two consumers
         edge("e", "f", 0, control=True)],                    # only a control successor
    ))
    consumer, weight = single_consumers(g)
    assert consumer == [1, -1, -1, -1, 5, -1]
    assert weight[0] == 12


def test_co_placement_follows_single_consumers_to_a_fixed_point() -> None:
    # a -> b -> c, d -> c, c -> {e, f}: a, b, d join c; e, f have no consumer
    g = load_graph(graph_doc(
        [op(n) for n in "abcdef"],
        [edge("a", "b"), edge("b", "c"), edge("d", "c"), edge("c", "e"), edge("c", "f")],
    ))
    c = Cluster.uniform(2)
    units = co_place(g, c, colocation_units(g, c), cap=math.inf)
    assert _units(g, units) == [["a", "b", "c", "d"], ["e"], ["f"]]


def test_co_placement_stops_at_the_memory_cap_heaviest_tensor_first() -> None:
    g = load_graph(graph_doc(
        [op(n, output_bytes=10) for n in "abcd"],
        [edge("a", "b", 1), edge("b", "c", 100), edge("c", "d", 1)],
    ))
    c = Cluster.uniform(2)
    units = co_place(g, c, colocation_units(g, c), cap=20)
    assert _units(g, units) == [["a"], ["b", "c"], ["d"]]  # the 100-byte edge won


def test_co_placement_never_joins_units_pinned_to_different_devices() -> None:
    g = load_graph(graph_doc([op("a", device="/GPU:0"), op("b", device="/GPU:1"), op("c")],
                             [edge("a", "b"), edge("c", "b")]))
    c = Cluster.uniform(2)
    units = co_place(g, c, colocation_units(g, c), cap=math.inf)
    assert _units(g, units) == [["a"], ["b", "c"]]
    assert units.pin == [0, 1]


def test_co_placement_keeps_oversized_hard_units_but_adds_nothing_to_them() -> None:
    g = load_graph(graph_doc(
        [op("a", output_bytes=50, colocation_group="big"), op("b", colocation_group="big"),
         op("c", output_bytes=1)],
        [edge("c", "b", 1)],
    ))
    c = Cluster.uniform(2, memory_bytes=80)  # cap 40 < the group's 50
    assert _units(g, co_place(g, c, colocation_units(g, c))) == [["a", "b"], ["c"]]


@st.composite
def grouped_dags(draw: st.DrawFn) -> Graph:
    """Random DAGs with random colocation groups, forward pairs, sizes and control edges."""
    n = draw(st.integers(2, 24))
    ops = []
    for i in range(n):
        spec = op(f"o{i}", output_bytes=draw(st.integers(0, 100)),
                  temp_bytes=draw(st.integers(0, 50)),
                  persistent_bytes=draw(st.sampled_from([0, 0, 30])))
        group = draw(st.sampled_from([None, None, None, "g0", "g1", "g2"]))
        if group:
            spec["colocation_group"] = group
        if i and draw(st.integers(0, 5)) == 0:
            spec["forward_op"] = f"o{draw(st.integers(0, i - 1))}"
        ops.append(spec)
    pairs = draw(st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    edges = [edge(f"o{a}", f"o{b}", draw(st.integers(0, 100)),
                  control=draw(st.sampled_from([False, False, False, True])))
             for a, b in sorted(pairs) if a < b]
    return load_graph(graph_doc(ops, edges))


@settings(max_examples=150, deadline=None)
@given(graph=grouped_dags(), devices=st.integers(1, 4), limit=st.sampled_from([None, 60, 300]))
def test_co_placement_respects_hard_units_and_the_cap(
    graph: Graph, devices: int, limit: int | None
) -> None:
    cluster = Cluster.uniform(devices, memory_bytes=limit)
    hard = colocation_units(graph, cluster)
    cap = merge_cap(graph, cluster)
    units = co_place(graph, cluster, hard, cap)
    # a partition of the ops that never splits a hard unit
    assert sorted(op for ms in units.members for op in ms) == list(range(len(graph)))
    for ms in hard.members:
        assert len({units.unit_of[op] for op in ms}) == 1
    # a merged unit fits the cap; a unit over it is a hard unit left alone
    hard_count = [len({hard.unit_of[op] for op in ms}) for ms in units.members]
    for size, count in zip(unit_memory(graph, units), hard_count, strict=True):
        assert size <= cap or count == 1
    # every op that joined another unit did so through its single consumer
    consumer, _ = single_consumers(graph)
    for ms in units.members:
        parts = {hard.unit_of[op] for op in ms}
        if len(parts) > 1:
            assert any(consumer[op] >= 0 and units.unit_of[consumer[op]] == units.unit_of[op]
                       for op in ms)


# ---------------------------------------------------------------------------- ResNet-50


@needs_shared
def test_resnet50_training_stays_split_where_baechis_co_placement_collapses_it() -> None:
    g = load_graph(RESNET50_TRAINING)
    cluster = Cluster.uniform(4)
    hard = colocation_units(g, cluster)
    # Baechi's rule without a cap: one group (the collapse issue 3 describes)
    assert len(co_place(g, cluster, hard, cap=math.inf)) == 1
    # ours, unconstrained memory: no unit outgrows a device's share
    units = co_place(g, cluster, hard)
    assert len(units) >= 4
    assert max(unit_memory(g, units)) <= graph_memory(g) / 4
    # ours at half the single-device peak: many units, each within half a device
    peak = single_device_run(g, Cluster.uniform(1))[1]
    limited = Cluster.uniform(4, memory_bytes=peak // 2)
    units = co_place(g, limited, colocation_units(g, limited))
    assert len(units) >= 16
    assert max(unit_memory(g, units)) <= peak // 4
    assert single_device_run(g, limited)[1] > peak // 2  # the limit really binds
