"""Heterogeneous clusters (docs/format.md §10): device kinds, ``compute_us_by_kind``, edge
``transfer_us``, per-pair ``links``; old documents keep their meaning."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from conftest import DATA, HAVE_SHARED, SHARED
from helpers import edge, graph_doc, op
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baechi import Cluster, auto, load_graph, place, simulate
from baechi.algorithms import ALGORITHMS
from baechi.auto import Entry
from baechi.costmodel import CostModel
from baechi.errors import InfeasiblePlacement, InvalidCluster, InvalidGraph, InvalidPlan
from baechi.fusion import fuse
from baechi.grouping import colocation_units
from baechi.simulate import replay, single_device_run_of

KINDS = {"g0": "gpu", "g1": "gpu", "c0": "cpu"}


def _graph(ops: list[dict[str, Any]], edges: list[dict[str, Any]] | None = None) -> Any:
    return load_graph({"format": "baechi.graph/v1", "ops": ops, "edges": edges or []})


def _cluster(**network: Any) -> Cluster:
    return Cluster.parse({"devices": [{"name": "g0"}, {"name": "g1", "speed": 2.0},
                                      {"name": "c0", "kind": "cpu", "host": True}],
                          "network": {"latency_us": 10, "bandwidth_gbps": 1, **network}})


def test_op_times_follow_the_device_kind() -> None:
    g = _graph([{"name": "a", "compute_us": 8, "compute_us_by_kind": {"cpu": 50}},
                {"name": "b", "compute_us": 8, "compute_us_by_kind": {"gpu": None}},
                {"name": "c", "compute_us": 8, "compute_us_by_kind": {"tpu": 1}}])
    cost = CostModel(g, _cluster())
    # g0 (gpu, speed 1), g1 (gpu, speed 2), c0 (cpu): the kind's time overrides compute / speed
    assert [cost.op_us[d][0] for d in range(3)] == [8.0, 4.0, 50.0]
    assert [cost.op_us[d][1] for d in range(3)] == [math.inf, math.inf, 8.0]
    assert [cost.op_us[d][2] for d in range(3)] == [8.0, 4.0, 8.0]
    assert cost.fastest_us == [4.0, 8.0, 4.0]
    assert [cost.can_run(1, d) for d in range(3)] == [False, False, True]


def test_measured_transfer_time_and_links_override_the_formula() -> None:
    g = _graph([{"name": n, "compute_us": 1} for n in "abc"],
               [{"src": "a", "dst": "b", "bytes": 1000},
                {"src": "a", "dst": "c", "bytes": 1000, "transfer_us": 3.5}])
    cluster = _cluster(links=[{"devices": ["g1", "g0"], "latency_us": 1, "bandwidth_gbps": 100}])
    cost = CostModel(g, cluster)
    assert cost.transfer_us(0, 0, 2) == 10 + 1000 / 1000  # default link
    assert cost.transfer_us(0, 0, 1) == cost.transfer_us(0, 1, 0) == 1 + 1000 / 100_000
    assert cost.transfer_us(1, 0, 1) == cost.transfer_us(1, 0, 2) == 3.5  # measured
    assert cost.nominal_transfer_us(0) == 11.0 and cost.nominal_transfer_us(1) == 3.5
    # the simulator uses them: a on g0 (1 µs), b on g1 (0.5 µs after 1.01 µs), c on c0
    sim = replay(g, cluster, [0, 1, 2], [[0], [1], [2]])
    assert sim.end[1] == pytest.approx(1 + 1.01 + 0.5)
    # sequential: a→c waits for a→b on g0's channel, then c runs 1 µs on c0
    assert sim.end[2] == pytest.approx(1 + 1.01 + 3.5 + 1)


def test_a_plan_may_not_put_an_op_where_it_cannot_run() -> None:
    g = _graph([{"name": "a", "compute_us": 1, "compute_us_by_kind": {"gpu": None}}])
    cluster = _cluster()
    plan = {"request": {"cluster": cluster.to_json()}, "placement": {"a": "g0"},
            "order": {"g0": ["a"]}}
    with pytest.raises(InvalidPlan, match="'a' is placed on 'g0' of kind 'gpu'.*null"):
        simulate(g, plan)
    plan = {**plan, "placement": {"a": "c0"}, "order": {"c0": ["a"]}}
    assert simulate(g, plan).step_time_us == 1.0


def test_an_op_that_can_run_nowhere_is_named() -> None:
    g = {"format": "baechi.graph/v1", "ops": [
        {"name": "ok", "compute_us": 1},
        {"name": "stuck", "compute_us": 1, "compute_us_by_kind": {"gpu": None, "cpu": None}}]}
    for algorithm in ("auto", *ALGORITHMS):
        with pytest.raises(InfeasiblePlacement, match="'stuck'"):
            place(g, _cluster().to_json(), algorithm)


def test_colocated_ops_whose_kinds_exclude_each_other_are_named() -> None:
    g = {"format": "baechi.graph/v1", "ops": [
        {"name": "x", "compute_us": 1, "colocation_group": "v",
         "compute_us_by_kind": {"gpu": None}},
        {"name": "y", "compute_us": 1, "colocation_group": "v",
         "compute_us_by_kind": {"cpu": None}}]}
    with pytest.raises(InfeasiblePlacement, match="'x'.*no device kind"):
        place(g, _cluster().to_json(), "m-etf")


def test_single_device_is_the_fastest_that_runs_everything() -> None:
    g = _graph([{"name": "a", "compute_us": 8, "compute_us_by_kind": {"cpu": 2}},
                {"name": "b", "compute_us": 8, "compute_us_by_kind": {"cpu": 2}}],
               [{"src": "a", "dst": "b", "bytes": 0}])
    cost = CostModel(g, _cluster())
    assert cost.single_device() == 2 and single_device_run_of(cost)[0] == 4.0
    nowhere = _graph([{"name": "a", "compute_us": 1, "compute_us_by_kind": {"cpu": None}},
                      {"name": "b", "compute_us": 1, "compute_us_by_kind": {"gpu": None}}])
    estimate = replay(nowhere, _cluster(), [0, 2], [[0], [], [1]]).estimate
    assert estimate.single_device_us == math.inf and not estimate.single_device_fits
    assert '"single_device_us":null' in estimate.model_dump_json()


def test_fusion_sums_times_per_kind() -> None:
    g = _graph([{"name": "a", "compute_us": 1, "compute_us_by_kind": {"cpu": 5, "gpu": None}},
                {"name": "b", "compute_us": 2, "compute_us_by_kind": {"cpu": 7}},
                {"name": "c", "compute_us": 4}],
               [{"src": "a", "dst": "b", "bytes": 10, "transfer_us": 2.5},
                {"src": "b", "dst": "c", "bytes": 10, "transfer_us": 1.5}])
    cluster = _cluster()
    units = colocation_units(g, cluster)
    units.unit_of[:] = [0, 0, 0]
    units.members[:] = [[0, 1, 2]]
    units.pin[:] = [-1]
    fused = fuse(g, cluster, units).graph
    # a and b are timed on cpu: one node; c is not (it would mix two rules): its own node
    assert fused.compute_us_by_kind == [{"cpu": 12.0, "gpu": None}, {}]
    assert fused.edge_transfer_us == [1.5]


def test_old_documents_keep_their_form() -> None:
    doc = {"devices": {"count": 2, "memory_bytes": 1024}, "network": {"latency_us": 3}}
    cluster = Cluster.parse(doc)
    assert [d.kind for d in cluster.devices] == ["gpu", "gpu"]
    assert cluster.to_json() == {
        "devices": [{"name": "/GPU:0", "memory_bytes": 1024, "speed": 1.0},
                    {"name": "/GPU:1", "memory_bytes": 1024, "speed": 1.0}],
        "network": {"latency_us": 3.0, "mode": "sequential"}}
    g = _graph([{"name": "a", "compute_us": 1}])
    assert g.compute_us_by_kind is None and g.edge_transfer_us is None


def test_new_fields_round_trip() -> None:
    doc = {"devices": [{"name": "g0"}, {"name": "c0", "kind": "cpu", "host": True}],
           "network": {"latency_us": 1.0, "mode": "sequential",
                       "links": [{"devices": ["g0", "c0"], "bandwidth_gbps": 2.0}]}}
    assert Cluster.parse(Cluster.parse(doc).to_json()) == Cluster.parse(doc)


@pytest.mark.parametrize(("network", "message"), [
    ({"links": [{"devices": ["g0", "zz"]}]}, "'zz' is not a device"),
    ({"links": [{"devices": ["g0", "g0"]}]}, "two different devices"),
    ({"links": [{"devices": ["g0", "g1"]}, {"devices": ["g1", "g0"]}]}, "a second link"),
    ({"links": [{"devices": ["g0", "g1"], "latency_us": -1}]}, "latency_us"),
    ({"links": [{"devices": ["g0", "g1"], "bandwidth_gbps": True}]}, "boolean"),
])
def test_bad_links_are_named(network: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidCluster, match=message):
        Cluster.parse({"devices": [{"name": "g0"}, {"name": "g1"}], "network": network})


@pytest.mark.parametrize(("field", "value", "message"), [
    ("compute_us_by_kind", {"cpu": -1}, "compute_us_by_kind.cpu"),
    ("compute_us_by_kind", {"cpu": "fast"}, "compute_us_by_kind.cpu"),
    ("compute_us_by_kind", [1], "compute_us_by_kind"),
])
def test_bad_kind_times_are_named(field: str, value: Any, message: str) -> None:
    with pytest.raises(InvalidGraph, match=message):
        _graph([{"name": "a", "compute_us": 1, field: value}])


def test_bad_measured_transfer_is_named() -> None:
    with pytest.raises(InvalidGraph, match=r"edges\[0\]\)\.transfer_us"):
        _graph([{"name": "a", "compute_us": 1}, {"name": "b", "compute_us": 1}],
               [{"src": "a", "dst": "b", "bytes": 1, "transfer_us": math.inf}])


@st.composite
def _hetero_graphs(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 14))
    ops = []
    for i in range(n):
        op: dict[str, Any] = {"name": f"o{i}", "compute_us": draw(st.integers(0, 30)),
                              "output_bytes": draw(st.integers(0, 50))}
        rule = draw(st.sampled_from(["none", "no-gpu", "no-cpu", "cpu-time"]))
        if rule == "no-gpu":
            op["compute_us_by_kind"] = {"gpu": None, "cpu": draw(st.integers(0, 60))}
        elif rule == "no-cpu":
            op["compute_us_by_kind"] = {"cpu": None}
        elif rule == "cpu-time":
            op["compute_us_by_kind"] = {"cpu": draw(st.integers(0, 60))}
        if i and draw(st.booleans()):
            op["colocation_group"] = draw(st.sampled_from(["p", "q"]))
        ops.append(op)
    edges = []
    for i in range(1, n):
        for j in sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=2)))):
            edge: dict[str, Any] = {"src": f"o{j}", "dst": f"o{i}",
                                    "bytes": draw(st.integers(0, 10**5))}
            if draw(st.booleans()):
                edge["transfer_us"] = draw(st.integers(0, 20))
            edges.append(edge)
    return {"format": "baechi.graph/v1", "ops": ops, "edges": edges}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_hetero_graphs(), algorithm=st.sampled_from(["auto", *ALGORITHMS]),
       memory=st.sampled_from([None, 400]))
def test_no_algorithm_puts_an_op_where_it_cannot_run(
    doc: dict[str, Any], algorithm: str, memory: int | None
) -> None:
    cluster = {"devices": [{"name": "g0", "memory_bytes": memory},
                           {"name": "g1", "speed": 2.0, "memory_bytes": memory},
                           {"name": "c0", "kind": "cpu", "host": True}],
               "network": {"latency_us": 2, "bandwidth_gbps": 1,
                           "links": [{"devices": ["g0", "g1"], "bandwidth_gbps": 50}]}}
    try:
        plan = place(doc, cluster, algorithm, {"time_limit_s": 5})
    except InfeasiblePlacement as exc:
        # only when some unit really has no device, or memory is limited
        assert "compute_us_by_kind" in str(exc) or memory is not None or algorithm == "single"
        return
    for op_doc in doc["ops"]:
        kind = KINDS[plan.placement[op_doc["name"]]]
        assert op_doc.get("compute_us_by_kind", {}).get(kind, 0) is not None, (op_doc, kind)
    assert simulate(doc, plan) == plan.estimate  # the judge agrees, kinds checked


def test_knowing_the_cluster_beats_placing_as_if_uniform() -> None:
    """Four independent 10 µs ops on a fast (speed 2) and a slow device: m-ETF placed on the
    uniform view splits them 2 + 2 (20 µs on the slow device); knowing the speeds it gives
    the fast device three (15 µs)."""
    doc = {"format": "baechi.graph/v1", "ops": [{"name": f"o{i}", "compute_us": 10}
                                                for i in range(4)]}
    real = {"devices": [{"name": "fast", "speed": 2.0}, {"name": "slow"}]}
    uniform = {"devices": [{"name": "fast"}, {"name": "slow"}]}
    options = {"allow_single": False}
    aware = place(doc, real, "m-etf", options)
    blind = place(doc, uniform, "m-etf", options)
    assert aware.estimate.step_time_us == 15.0
    assert simulate(doc, blind, real).step_time_us == 20.0


def test_m_eft_leaves_an_idle_slow_device_idle() -> None:
    """Layers of four 10 µs ops on a device of speed 1 and two of speed 0.2: m-ETF starts
    ops on the idle slow devices (50 µs each), which delay the next layer; m-EFT gives each
    op the device that finishes it first."""
    doc = graph_doc([op(f"l{layer}_{i}") for layer in range(3) for i in range(4)],
                    [edge(f"l{layer}_{i}", f"l{layer + 1}_{j}")
                     for layer in range(2) for i in range(4) for j in range(4)])
    cluster = {"devices": [{"name": "fast"}, {"name": "slow0", "speed": 0.2},
                           {"name": "slow1", "speed": 0.2}]}
    options = {"allow_single": False, "co_placement": False, "fusion": False}
    etf = place(doc, cluster, "m-etf", options)
    eft = place(doc, cluster, "m-eft", options)
    assert eft.estimate.step_time_us == 120.0  # all on the fast device: 12 x 10 µs
    assert etf.estimate.step_time_us > eft.estimate.step_time_us
    assert simulate(doc, eft, cluster) == eft.estimate


@pytest.mark.parametrize("speeds", [(1.0, 1.0), (1.0, 0.5)])
def test_auto_runs_m_eft_in_order_where_devices_differ_else_late(
        speeds: tuple[float, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Where devices differ, m-EFT runs both ways among the candidates, before local search;
    on devices alike, after it, with time left (``LATE_MIN_S``). Either way the plan is no
    slower than m-EFT's."""
    monkeypatch.setattr(auto, "PORTFOLIO", (
        Entry("m-etf", True), Entry("m-eft", False, mixed_speeds=True),
        Entry("m-eft", True, mixed_speeds=True)))
    # fork-join with slow links: no plan meets the lower bound, so every stage runs
    doc = graph_doc([op(n) for n in ("s", "x1", "x2", "t")],
                    [edge("s", "x1"), edge("s", "x2"), edge("x1", "t"), edge("x2", "t")])
    cluster = {"devices": [{"name": f"d{i}", "speed": v} for i, v in enumerate(speeds)],
               "network": {"latency_us": 100}}
    plan = place(doc, cluster, "auto", {"time_limit_s": 3})
    names = [c.algorithm for c in plan.stats.candidates]
    eft = [i for i, name in enumerate(names) if name == "m-eft"]
    assert {plan.stats.candidates[i].pipeline for i in eft} == {True, False}
    alike = len(set(speeds)) == 1
    assert (min(eft) > names.index("local-search")) == alike
    assert all((plan.stats.candidates[i].note == "with time left (devices alike)") == alike
               for i in eft)
    assert all(plan.estimate.step_time_us <= plan.stats.candidates[i].step_time_us
               for i in eft)


def _explicit_defaults(case: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The case with docs/format.md §10's fields written out at values that change nothing: kinds and
    host at their defaults, a link per device pair equal to the default link, a time for a
    kind the cluster does not have."""
    cluster = Cluster.parse(case["plan"]["request"]["cluster"]).to_json()
    names = [d["name"] for d in cluster["devices"]]
    for device in cluster["devices"]:
        device.update(kind="gpu", host=False)
    network = cluster["network"]
    network["links"] = [{"devices": [a, b], "latency_us": network["latency_us"],
                         **({"bandwidth_gbps": network["bandwidth_gbps"]}
                            if "bandwidth_gbps" in network else {})}
                        for i, a in enumerate(names) for b in names[i + 1:]]
    graph = {**case["graph"], "ops": [{**o, "compute_us_by_kind": {"tpu": 1.0}}
                                      for o in case["graph"]["ops"]]}
    plan = {**case["plan"], "request": {**case["plan"]["request"], "cluster": cluster}}
    return graph, plan


CONFORMANCE_CASES = sorted(
    (SHARED if HAVE_SHARED else DATA).joinpath("conformance").glob("case*.json"))


@pytest.mark.parametrize("path", CONFORMANCE_CASES, ids=[p.stem for p in CONFORMANCE_CASES])
def test_conformance_unchanged_with_the_new_fields_at_neutral_values(path: Any) -> None:
    case = json.loads(path.read_text())
    if not case["expect"]["valid"]:
        return
    graph, plan = _explicit_defaults(case)
    assert simulate(graph, plan) == simulate(case["graph"], case["plan"])


def test_cut_without_memory_limits_ends_a_stretch_where_an_op_cannot_run() -> None:
    """m-cut with unlimited memory: no device runs every op (``a`` on GPUs only, ``b`` on CPUs
    only), so the GPU's stretch ends before ``b`` (found by the property test above)."""
    doc = {"format": "baechi.graph/v1",
           "ops": [{"name": "a", "compute_us": 5, "compute_us_by_kind": {"cpu": None}},
                   {"name": "b", "compute_us": 5, "compute_us_by_kind": {"gpu": None, "cpu": 5}},
                   {"name": "c", "compute_us": 5}],
           "edges": [{"src": "a", "dst": "b", "bytes": 10}, {"src": "b", "dst": "c", "bytes": 10}]}
    cluster = {"devices": [{"name": "g0"}, {"name": "c0", "kind": "cpu", "host": True}]}
    plan = place(doc, cluster, "m-cut", {"allow_single": False, "co_placement": False,
                                         "fusion": False})
    assert plan.placement == {"a": "g0", "b": "c0", "c": "c0"}
