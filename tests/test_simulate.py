"""The cost model of docs/format.md §4: conformance cases and one hand-computed case per rule."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import DATA, HAVE_SHARED, SHARED
from helpers import edge, graph_doc, op, plan_doc, two_devices

from baechi import InvalidPlan, simulate, simulate_plan

CONFORMANCE = (SHARED if HAVE_SHARED else DATA) / "conformance"
CASES = sorted(CONFORMANCE.glob("case*.json"))


def test_conformance_cases_are_found() -> None:
    assert len(CASES) >= 90, f"conformance cases missing in {CONFORMANCE}"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_conformance(path: Path) -> None:
    case = json.loads(path.read_text())
    expect = case["expect"]
    if not expect["valid"]:
        with pytest.raises(InvalidPlan):
            simulate(case["graph"], case["plan"])
        return
    estimate = simulate(case["graph"], case["plan"])
    for key in ("step_time_us", "lower_bound_us", "single_device_us"):
        assert math.isclose(getattr(estimate, key), expect[key], rel_tol=1e-9), key
    for key in ("peak_memory_bytes", "transfers", "transfer_bytes", "memory_ok",
                "single_device_fits"):
        assert getattr(estimate, key) == expect[key], key


def _chain(mode: str = "sequential", nbytes: int = 5700) -> tuple[dict, dict]:
    graph = graph_doc([op("a", 10), op("b", 20)], [edge("a", "b", nbytes)])
    plan = plan_doc(two_devices(mode=mode), {"a": "/GPU:0", "b": "/GPU:1"},
                    {"/GPU:0": ["a"], "/GPU:1": ["b"]})
    return graph, plan


def test_transfer_costs_latency_plus_bytes_over_bandwidth() -> None:
    graph, plan = _chain()
    estimate = simulate(graph, plan)
    # 134 µs + 5700 B / (5.7 GB/s * 1000) = 135 µs between a's end (10) and b's start
    assert estimate.step_time_us == pytest.approx(10 + 135 + 20)
    assert (estimate.transfers, estimate.transfer_bytes) == (1, 5700)


def test_control_edge_costs_latency_only_and_holds_no_memory() -> None:
    graph = graph_doc([op("a", 10, output_bytes=100), op("b", 20)],
                      [edge("a", "b", 0, control=True)])
    plan = plan_doc(two_devices(), {"a": "/GPU:0", "b": "/GPU:1"},
                    {"/GPU:0": ["a"], "/GPU:1": ["b"]})
    estimate = simulate(graph, plan)
    assert estimate.step_time_us == pytest.approx(10 + 134 + 20)
    assert estimate.peak_memory_bytes == {"/GPU:0": 100, "/GPU:1": 0}
    assert (estimate.transfers, estimate.transfer_bytes) == (1, 0)


def test_same_device_is_free() -> None:
    graph, _ = _chain()
    plan = plan_doc(two_devices(), {"a": "/GPU:0", "b": "/GPU:0"}, {"/GPU:0": ["a", "b"]})
    estimate = simulate(graph, plan)
    assert estimate.step_time_us == 30
    assert estimate.transfers == 0


def test_a_tensor_goes_to_a_device_once() -> None:
    ops = [op("a", 10), op("b", 20), op("c", 20)]
    same = graph_doc(ops, [edge("a", "b", 5700, tensor="a:0"), edge("a", "c", 5700, tensor="a:0")])
    other = graph_doc(ops, [edge("a", "b", 5700, tensor="a:0"), edge("a", "c", 5700, tensor="a:1")])
    plan = plan_doc(two_devices(), {"a": "/GPU:0", "b": "/GPU:1", "c": "/GPU:1"},
                    {"/GPU:0": ["a"], "/GPU:1": ["b", "c"]})
    assert simulate(same, plan).transfers == 1
    assert simulate(other, plan).transfers == 2
    # the second tensor waits for the first on the shared channels: 10 + 135 + 135, then c
    assert simulate(other, plan).step_time_us == pytest.approx(10 + 135 + 135 + 20)


@pytest.mark.parametrize(("mode", "c_start"), [("sequential", 10 + 135 + 135),
                                               ("parallel", 10 + 135)])
def test_channel_contention(mode: str, c_start: float) -> None:
    graph = graph_doc([op("a", 10), op("b", 20), op("c", 20)],
                      [edge("a", "b", 5700), edge("a", "c", 5700, tensor="a:1")])
    plan = plan_doc(two_devices(mode=mode, count=3),
                    {"a": "/GPU:0", "b": "/GPU:1", "c": "/GPU:2"},
                    {"/GPU:0": ["a"], "/GPU:1": ["b"], "/GPU:2": ["c"]})
    simulation = simulate_plan(graph, plan)
    assert simulation.start[2] == pytest.approx(c_start)


def test_memory_counts_outputs_until_sent_and_received_copies() -> None:
    graph = graph_doc(
        [op("a", 10, output_bytes=1000, persistent_bytes=7), op("b", 20, temp_bytes=50)],
        [edge("a", "b", 1000)],
    )
    plan = plan_doc(two_devices(), {"a": "/GPU:0", "b": "/GPU:1"},
                    {"/GPU:0": ["a"], "/GPU:1": ["b"]})
    estimate = simulate(graph, plan)
    # /GPU:0: persistent 7 + a's output 1000 until the transfer arrives
    # /GPU:1: the received copy 1000 (from the transfer's start) + b's temp 50
    assert estimate.peak_memory_bytes == {"/GPU:0": 1007, "/GPU:1": 1050}
    assert estimate.memory_ok


def test_memory_limit_is_reported() -> None:
    graph = graph_doc([op("a", 10, output_bytes=1000), op("b", 20)], [edge("a", "b", 1000)])
    plan = plan_doc(two_devices(memory=999), {"a": "/GPU:0", "b": "/GPU:1"},
                    {"/GPU:0": ["a"], "/GPU:1": ["b"]})
    estimate = simulate(graph, plan)
    assert not estimate.memory_ok
    assert not estimate.single_device_fits


def test_frees_come_before_allocations_at_an_instant() -> None:
    # a's output is freed when b ends (t=30); c allocates at 30: they never overlap
    graph = graph_doc([op("a", 10, output_bytes=100), op("b", 20), op("c", 5, output_bytes=100)],
                      [edge("a", "b", 100), edge("b", "c", 0, control=True)])
    plan = plan_doc(two_devices(), {n: "/GPU:0" for n in "abc"}, {"/GPU:0": ["a", "b", "c"]})
    assert simulate(graph, plan).peak_memory_bytes["/GPU:0"] == 100


def test_inconsistent_order_is_rejected_naming_the_cycle() -> None:
    graph, _ = _chain()
    plan = plan_doc(two_devices(), {"a": "/GPU:0", "b": "/GPU:0"}, {"/GPU:0": ["b", "a"]})
    with pytest.raises(InvalidPlan, match="'a'.*'b'|'b'.*'a'"):
        simulate(graph, plan)


def test_split_colocation_group_is_rejected() -> None:
    graph = graph_doc([op("a", colocation_group="g"), op("b", colocation_group="g")])
    plan = plan_doc(two_devices(), {"a": "/GPU:0", "b": "/GPU:1"},
                    {"/GPU:0": ["a"], "/GPU:1": ["b"]})
    with pytest.raises(InvalidPlan, match="colocation group 'g' is split"):
        simulate(graph, plan)


def test_pin_and_forward_pair_are_enforced() -> None:
    pinned = graph_doc([op("a", device="/GPU:1")])
    plan = plan_doc(two_devices(), {"a": "/GPU:0"}, {"/GPU:0": ["a"]})
    with pytest.raises(InvalidPlan, match="pinned"):
        simulate(pinned, plan)
    paired = graph_doc([op("f"), op("g", forward_op="f")], [edge("f", "g", 8)])
    split = {"f": "/GPU:0", "g": "/GPU:1"}
    order = {"/GPU:0": ["f"], "/GPU:1": ["g"]}
    with pytest.raises(InvalidPlan, match="forward op"):
        simulate(paired, plan_doc(two_devices(), split, order))
    # without forward_only the pairing is a hint, not a rule
    free = plan_doc(two_devices(), split, order, {"forward_only": False})
    assert simulate(paired, free).transfers == 1


@pytest.mark.parametrize(("placement", "order", "message"), [
    ({"a": "/GPU:0"}, {"/GPU:0": ["a"]}, "not placed"),
    ({"a": "/GPU:0", "b": "/GPU:9"}, {"/GPU:0": ["a", "b"]}, "unknown device"),
    ({"a": "/GPU:0", "b": "/GPU:0"}, {"/GPU:0": ["a"]}, "missing from"),
    ({"a": "/GPU:0", "b": "/GPU:0"}, {"/GPU:0": ["a", "b", "a"]}, "twice"),
    ({"a": "/GPU:0", "b": "/GPU:1"}, {"/GPU:0": ["a", "b"]}, "placed on"),
])
def test_malformed_plans_name_the_problem(placement, order, message) -> None:
    graph, _ = _chain()
    with pytest.raises(InvalidPlan, match=message):
        simulate(graph, plan_doc(two_devices(), placement, order))


def test_lower_bound_and_single_device() -> None:
    graph = graph_doc([op("a", 10), op("b", 30), op("c", 20)], [edge("a", "b")])
    cluster = {"devices": [{"name": "x", "speed": 1.0}, {"name": "y", "speed": 2.0}]}
    plan = plan_doc(cluster, {"a": "y", "b": "y", "c": "x"}, {"y": ["a", "b"], "x": ["c"]})
    estimate = simulate(graph, plan)
    # critical path a->b = 40 on the 2x device = 20; total 60 / total speed 3 = 20
    assert estimate.lower_bound_us == pytest.approx(20)
    assert estimate.single_device_us == pytest.approx(30)
    assert estimate.step_time_us == pytest.approx(20)
