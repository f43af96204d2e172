"""The cost model in one place: placers count what the simulator counts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baechi import Cluster, load_graph
from baechi.algorithms import ALGORITHMS, Problem
from baechi.algorithms.etf import remaining_path
from baechi.algorithms.fill import place_fill
from baechi.algorithms.sct import favourite_children
from baechi.costmodel import CostModel, running_bytes
from baechi.grouping import DisjointSets, colocation_units, graph_memory, unit_memory
from baechi.memory import MemoryProxy, memory_proxy
from baechi.simulate import replay, single_device_run_of


def _cluster(*memories: int, speed: float = 1.0) -> Cluster:
    return Cluster.parse({"devices": [
        {"name": f"/GPU:{i}", "memory_bytes": m, "speed": speed} for i, m in enumerate(memories)]})


def test_fill_counts_one_copy_per_message_as_the_simulator_does() -> None:
    """``a`` sends tensor ``t`` to ``b`` and ``c`` at two sizes: the simulator sends two
    messages (the key includes the bytes). m-fill used to key copies by (src, tensor, device),
    counted one copy, put ``c`` beside ``b`` on /GPU:1 and overflowed it (162 > 150 bytes)."""
    g = load_graph({"format": "baechi.graph/v1", "ops": [
        {"name": "a", "compute_us": 1, "persistent_bytes": 100, "output_bytes": 100},
        {"name": "b", "compute_us": 1, "persistent_bytes": 1},
        {"name": "c", "compute_us": 1, "persistent_bytes": 1}], "edges": [
        {"src": "a", "dst": "b", "bytes": 100, "tensor": "t"},
        {"src": "a", "dst": "c", "bytes": 60, "tensor": "t"}]})
    cluster = _cluster(200, 150, 150)
    assignment = place_fill(Problem.of(g, cluster, colocation_units(g, cluster)))
    assert assignment.device_of == [0, 1, 2]
    estimate = replay(g, cluster, assignment.device_of, assignment.orders).estimate
    assert estimate.memory_ok
    assert estimate.peak_memory_bytes == {"/GPU:0": 200, "/GPU:1": 101, "/GPU:2": 61}


def test_zero_time_rule_is_per_device() -> None:
    """An op of 1.5e-6 µs runs in 0.75e-6 µs on a device of speed 2: instant there (it frees
    its input before allocating), not on a device of speed 1."""
    g = load_graph({"format": "baechi.graph/v1", "ops": [
        {"name": "a", "compute_us": 1, "output_bytes": 100},
        {"name": "b", "compute_us": 1.5e-6, "output_bytes": 100}],
        "edges": [{"src": "a", "dst": "b", "bytes": 100}]})
    slow = CostModel(g, _cluster(1000))
    fast = CostModel(g, _cluster(1000, speed=2.0))
    assert not slow.is_instant(1, 0) and fast.is_instant(1, 0)
    # the plan-independent bound counts only b's own bytes where b may be instant
    assert running_bytes(g, 1, slow) == 200 and running_bytes(g, 1, fast) == 100


def test_every_placer_takes_times_from_the_cost_model() -> None:
    """A cost model whose op times differ from ``compute_us / speed`` changes what the list
    schedulers and m-SCT's LP see: they compute no time themselves."""
    g = load_graph({"format": "baechi.graph/v1", "ops": [
        {"name": n, "compute_us": 10} for n in "abcd"], "edges": [
        {"src": "a", "dst": "b", "bytes": 10}, {"src": "a", "dst": "c", "bytes": 10},
        {"src": "b", "dst": "d", "bytes": 10}, {"src": "c", "dst": "d", "bytes": 10}]})
    cluster = Cluster.uniform(2, latency_us=1)
    cost = CostModel(g, cluster)
    cost.op_us[1] = [1.0] * len(g)  # device 1 ten times faster than its speed says
    cost.fastest_us[:] = [1.0] * len(g)
    problem = Problem.of(g, cluster, colocation_units(g, cluster), cost=cost)
    assert remaining_path(problem) == [3.0, 2.0, 2.0, 1.0]
    assert favourite_children(problem)[1]["lp_makespan_us"] == pytest.approx(4.0)  # + 1 latency
    default = Problem.of(g, cluster, colocation_units(g, cluster))
    assert remaining_path(default) == [30.0, 20.0, 20.0, 10.0]
    assert favourite_children(default)[1]["lp_makespan_us"] == pytest.approx(31.0)
    assert ALGORITHMS["m-etf"](problem).device_of != ALGORITHMS["m-etf"](default).device_of


def test_memory_proxy_is_one_rule() -> None:
    g = load_graph({"format": "baechi.graph/v1", "ops": [
        {"name": "a", "compute_us": 1, "output_bytes": 10, "temp_bytes": 7},
        {"name": "b", "compute_us": 1, "persistent_bytes": 5, "temp_bytes": 3,
         "colocation_group": "g"},
        {"name": "c", "compute_us": 1, "output_bytes": 1, "colocation_group": "g"}]})
    units = colocation_units(g, Cluster.uniform(1))
    assert unit_memory(g, units) == [memory_proxy(g, ms) for ms in units.members] == [17, 9]
    assert graph_memory(g) == memory_proxy(g, range(3)) == 23
    proxy = MemoryProxy(g)
    assert proxy.merged(1, 2) == 9
    proxy.merge(1, 2)
    assert proxy.of(1) == 9 and proxy.merged(0, 1) == 23


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=20))
def test_disjoint_sets_attach_keeps_the_chosen_root(pairs: list[tuple[int, int]]) -> None:
    sets = DisjointSets(10)
    label = list(range(10))  # a naive partition to compare with
    for a, b in pairs:
        ra, rb = sets.find(a), sets.find(b)
        if ra != rb:
            sets.attach(ra, rb)
            assert sets.find(b) == ra
            la, lb = label[a], label[b]
            label = [la if x == lb else x for x in label]
    assert all((sets.find(i) == sets.find(j)) == (label[i] == label[j])
               for i in range(10) for j in range(10))


def test_topo_position_inverts_topo() -> None:
    g = load_graph({"format": "baechi.graph/v1", "ops": [
        {"name": n, "compute_us": 1} for n in "cba"],
        "edges": [{"src": "a", "dst": "b", "bytes": 0}, {"src": "b", "dst": "c", "bytes": 0}]})
    assert g.topo == [2, 1, 0]
    assert g.topo_position == [2, 1, 0]
    assert all(g.topo[g.topo_position[op]] == op for op in range(3))


@pytest.mark.parametrize("count", [1, 2])
def test_single_device_run_is_computed_once_per_cost_model(count: int) -> None:
    g = load_graph({"format": "baechi.graph/v1", "ops": [{"name": "a", "compute_us": 3}]})
    cluster = Cluster.uniform(count)
    cost = CostModel(g, cluster)
    first = single_device_run_of(cost)
    assert first == (3.0, 0) and single_device_run_of(cost) is first
    estimate = replay(g, cluster, [0], [[0]] + [[]] * (count - 1), cost).estimate
    assert estimate.single_device_us == 3.0
