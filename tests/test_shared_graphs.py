"""Every graph in ../shared/graphs placed with each algorithm: a valid plan or a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SHARED, needs_shared

from baechi import InfeasiblePlacement, place, simulate
from baechi.algorithms import ALGORITHMS

# dnn-partitioning/original/ holds the source files of the conversions, not baechi.graph/v1
GRAPHS = sorted(p for p in (SHARED / "graphs").rglob("*.json") if "original" not in p.parts)
PCIE = {"latency_us": 134, "bandwidth_gbps": 5.7}


@needs_shared
def test_shared_graphs_are_found() -> None:
    assert len(GRAPHS) >= 50


@needs_shared
@pytest.mark.parametrize("algorithm", ["auto", *ALGORITHMS])
@pytest.mark.parametrize("path", GRAPHS, ids=[p.stem for p in GRAPHS])
def test_shared_graph_places(path: Path, algorithm: str) -> None:
    doc = json.loads(path.read_text())
    memory = doc.get("meta", {}).get("suggested_memory_bytes")
    devices = {"count": 4, **({"memory_bytes": memory} if memory else {})}
    cluster = {"devices": devices, "network": PCIE}
    try:
        plan = place(doc, cluster, algorithm, {"time_limit_s": 1})
    except InfeasiblePlacement as exc:
        assert memory, "only a memory limit can make placement infeasible"
        assert "bytes" in exc.message and exc.details["missing_bytes"] > 0
        return
    assert len(plan.placement) == len(doc["ops"])
    assert plan.estimate.memory_ok
    assert plan.estimate.step_time_us >= plan.estimate.lower_bound_us * (1 - 1e-9)
    assert simulate(doc, plan.model_dump()) == plan.estimate
