"""Repair of plans over memory: every repaired plan fits, keeps its units and pins, and is
consistent; ``auto`` uses it where every named algorithm fails."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import edge, graph_doc, op
from hypothesis import HealthCheck, given, settings
from test_algorithms import clusters, dags

from baechi import Cluster, InfeasiblePlacement, load_graph, place
from baechi.grouping import colocation_units
from baechi.repair import repair
from baechi.simulate import check_constraints, check_orders, replay, single_device_run

ROOT = Path(__file__).resolve().parents[1]
RESNET101 = ROOT.parent / "shared" / "graphs" / "pipedream" / "pipedream_resnet101.json"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=dags(), cluster=clusters())
def test_a_repaired_plan_fits_and_keeps_every_rule(doc: dict, cluster: dict) -> None:
    graph, parsed = load_graph(doc), Cluster.parse(cluster)
    if all(d.memory_bytes is None for d in parsed.devices):
        return
    units = colocation_units(graph, parsed)
    start = [0] * len(graph)  # everything on the first device: over memory when it binds
    orders = [list(graph.topo)] + [[] for _ in parsed.devices[1:]]
    fixed = repair(graph, parsed, start, orders, units=units, deadline=math.inf)
    if fixed is None:
        return
    device_of, orders = fixed
    check_constraints(graph, parsed, device_of)
    check_orders(graph, orders)
    assert sorted(op for order in orders for op in order) == list(range(len(graph)))
    assert replay(graph, parsed, device_of, orders).estimate.memory_ok


def test_pinned_units_stay_and_a_stuck_repair_says_none() -> None:
    doc = graph_doc([op("w0", 10, persistent_bytes=600, device="/GPU:0"),
                     op("w1", 10, persistent_bytes=600), op("w2", 10, persistent_bytes=600)],
                    [edge("w0", "w1"), edge("w1", "w2")])
    graph, cluster = load_graph(doc), Cluster.uniform(2, memory_bytes=1000)
    units = colocation_units(graph, cluster)
    fixed = repair(graph, cluster, [0, 0, 0], [[0, 1, 2], []], units=units, deadline=math.inf)
    assert fixed is None  # three 600-byte ops, two 1000-byte devices: no plan exists
    cluster = Cluster.uniform(3, memory_bytes=1000)
    fixed = repair(graph, cluster, [0, 0, 0], [[0, 1, 2], [], []],
                   units=colocation_units(graph, cluster), deadline=math.inf)
    assert fixed is not None
    device_of, _ = fixed
    assert device_of[0] == 0 and sorted(device_of) == [0, 1, 2]


def test_no_step_starts_after_the_deadline() -> None:
    doc = graph_doc([op(f"o{i}", 10, persistent_bytes=600) for i in range(3)])
    graph, cluster = load_graph(doc), Cluster.uniform(3, memory_bytes=1000)
    units = colocation_units(graph, cluster)
    assert repair(graph, cluster, [0, 0, 0], [[0, 1, 2], [], []], units=units,
                  deadline=-math.inf) is None


@pytest.mark.shared
def test_auto_repairs_where_every_named_algorithm_fails() -> None:
    """PipeDream ResNet-101 on 4 devices at 75% of its single-device peak (PCIe): m-TOPO,
    m-ETF, m-SCT and m-fill find no plan within memory, with or without the pipeline;
    ``auto`` repairs m-ETF's plan."""
    if not RESNET101.exists():
        pytest.skip(f"{RESNET101} is absent (the shared graphs)")
    doc = json.loads(RESNET101.read_text())
    graph = load_graph(doc)
    peak = single_device_run(graph, Cluster.uniform(1))[1]
    cluster = {"devices": {"count": 4, "memory_bytes": int(peak * 0.75)},
               "network": {"latency_us": 134, "bandwidth_gbps": 5.7}}
    for algorithm in ("m-topo", "m-etf", "m-fill"):
        with pytest.raises(InfeasiblePlacement):
            place(graph, cluster, algorithm)
    plan = place(graph, cluster, "auto", {"time_limit_s": 10})
    assert plan.estimate.memory_ok
    assert any(c.algorithm == "repair" and c.step_time_us is not None
               for c in plan.stats.candidates)
