"""m-SCT: the favourite-child LP on graphs whose answer is known by hand, and STG optima."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import DATA, ROOT, SHARED, needs_shared, needs_tensorflow
from helpers import edge, graph_doc, op

from baechi import Cluster, load_graph, place
from baechi.algorithms.base import Problem
from baechi.algorithms.etf import place_etf
from baechi.algorithms.sct import favourite_children, place_sct
from baechi.grouping import colocation_units


def _favourites(doc: dict, cluster: Cluster) -> list[str | None]:
    g = load_graph(doc)
    favourite, stats = favourite_children(Problem.of(g, cluster, colocation_units(g, cluster)))
    assert stats["lp_variables"] == g.num_edges + len(g) + 1
    return [g.names[f] if f >= 0 else None for f in favourite]


def test_fork_favours_the_child_behind_the_expensive_edge() -> None:
    doc = graph_doc([op("a"), op("b"), op("c")],
                    [edge("a", "b", 10**6), edge("a", "c", 10)])
    assert _favourites(doc, Cluster.uniform(2, latency_us=1, bandwidth_gbps=1)) == ["b", None, None]


def test_join_gives_a_child_one_favourite_parent() -> None:
    # b and c both feed d; only one of them can keep d as its favourite child
    doc = graph_doc([op("b"), op("c"), op("d")], [edge("b", "d", 10**6), edge("c", "d", 10**3)])
    fav = _favourites(doc, Cluster.uniform(2, latency_us=1, bandwidth_gbps=1))
    assert fav == ["d", None, None]


def test_chain_is_all_favourites() -> None:
    doc = graph_doc([op(n) for n in "abcd"], [edge("a", "b", 100), edge("b", "c", 100),
                                              edge("c", "d", 100)])
    assert _favourites(doc, Cluster.uniform(2, latency_us=5)) == ["b", "c", "d", None]


def test_chain_stays_on_one_device_under_sct() -> None:
    doc = graph_doc([op(n, 10) for n in "abcd"], [edge("a", "b", 10**6), edge("b", "c", 10**6),
                                                  edge("c", "d", 10**6)])
    plan = place(doc, {"devices": {"count": 4}, "network": {"latency_us": 50}}, "m-sct",
                 {"allow_single": False, "co_placement": False, "fusion": False})
    assert len(set(plan.placement.values())) == 1
    assert plan.stats.favourite_children == 3


def test_lp_timeout_falls_back_to_etf_and_says_so() -> None:
    """An LP not solved within LP_SHARE of the time limit: m-ETF places (no deadline here,
    so that it finishes; a request's deadline would stop it, as in test_auto)."""
    graph = load_graph(json.loads((DATA / "graphs" / "stg50_rand0000.json").read_text()))
    cluster = Cluster.uniform(4)
    problem = Problem.of(graph, cluster, colocation_units(graph, cluster), time_limit_s=1e-9)
    assignment = place_sct(problem)
    assert "placed with m-etf" in assignment.stats["fallback"]
    assert assignment.device_of == place_etf(Problem.of(
        graph, cluster, colocation_units(graph, cluster))).device_of


def test_memory_retries_solve_the_lp_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The LP does not depend on the memory budgets: a retry with tighter ones reuses the
    favourite children (Problem.memo), and the plan carries the LP's figures."""
    from baechi.algorithms import sct
    from baechi.testing import GENERATORS, with_memory

    solved = []

    def counted(problem: Problem, time_limit_s: float | None = None):
        solved.append(time_limit_s)
        return favourite_children(problem, time_limit_s)

    monkeypatch.setattr(sct, "favourite_children", counted)
    doc = with_memory(GENERATORS["layered"](1, 40, 1.0))
    peak = place(doc, {"devices": {"count": 1}}, "single").estimate.peak_memory_bytes["/GPU:0"]
    plan = place(doc, {"devices": {"count": 3, "memory_bytes": int(0.4 * peak)}}, "m-sct",
                 {"allow_single": False, "co_placement": False, "fusion": False})
    assert plan.stats.memory_retries == 2 and plan.stats.fallback is None
    assert plan.estimate.memory_ok and plan.stats.lp_variables > 0
    # once, with its share of what was left of the default limit (60 s)
    assert len(solved) == 1 and sct.LP_SHARE * 50 < solved[0] <= sct.LP_SHARE * 60


def test_a_timed_out_lp_is_solved_again_only_within_a_longer_limit() -> None:
    """A problem of the same graph and units (the memo shared) places with m-ETF at once
    where the LP timed out within as long a limit, and solves it where its limit is longer;
    once solved, the favourite children serve every later problem."""
    graph = load_graph(json.loads((DATA / "graphs" / "stg50_rand0000.json").read_text()))
    cluster = Cluster.uniform(4)
    first = Problem.of(graph, cluster, colocation_units(graph, cluster), time_limit_s=1e-9)
    assert "placed with m-etf" in place_sct(first).stats["fallback"]
    again = place_sct(dataclasses.replace(first, time_limit_s=1e-10))
    assert "placed with m-etf" in again.stats["fallback"] and "lp_variables" not in again.stats
    longer = place_sct(dataclasses.replace(first, time_limit_s=60))
    assert "fallback" not in longer.stats and longer.stats["lp_variables"] > 0
    shorter = place_sct(dataclasses.replace(first, time_limit_s=1e-9))
    assert "fallback" not in shorter.stats and shorter.device_of == longer.device_of


def test_a_requests_problems_of_one_graph_solve_the_lp_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """m-SCT's run within memory and its plan placed as if memory were unlimited (a start
    for auto's repair) place one graph: the second reuses the first's LP (the reduction's
    memo, Request.problem)."""
    from baechi.algorithms import sct
    from baechi.options import Options
    from baechi.placing import Request, memory_blind_replay, run_algorithm
    from baechi.testing import GENERATORS, with_memory

    solved = []

    def counted(problem: Problem, time_limit_s: float | None = None):
        solved.append(len(problem.graph))
        return favourite_children(problem, time_limit_s)

    monkeypatch.setattr(sct, "favourite_children", counted)
    graph = load_graph(with_memory(GENERATORS["layered"](1, 40, 1.0)))
    cluster = Cluster.parse({"devices": {"count": 3, "memory_bytes": 10**9}})
    options = Options().without_pipeline()
    request = Request.of(graph, cluster, options, time.perf_counter(), lambda *_: None)
    run = run_algorithm(request, "m-sct", options)
    blind = memory_blind_replay(request, "m-sct")
    assert solved == [len(graph)]
    assert run.simulation is not None and blind is not None
    assert blind.device_of == run.simulation.device_of  # no budget binds at 1 GB


def _stg_cases() -> list[tuple[str, int, float]]:
    folder = SHARED / "graphs" / "stg"
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else [DATA / "graphs" /
                                                                   "stg50_rand0000.json"]
    cases = []
    for path in paths:
        meta = json.loads(path.read_text())["meta"]["optimal_makespan_us"]
        for count, best in meta.items():
            cases.append((str(path), int(count), float(best[0])))
    return cases


@pytest.mark.parametrize("algorithm", ["m-etf", "m-sct"])
@pytest.mark.parametrize(("path", "count", "optimum"), _stg_cases())
def test_stg_within_a_few_percent_of_the_optimum(algorithm, path, count, optimum) -> None:
    doc = json.loads(Path(path).read_text())
    plan = place(doc, {"devices": {"count": count}}, algorithm,
                 {"allow_single": False, "co_placement": False, "fusion": False})
    step = plan.estimate.step_time_us
    assert step >= optimum * (1 - 1e-9), "below a proven lower bound: the simulator is wrong"
    assert step <= optimum * 1.03


@needs_shared
def test_all_stg_graphs_are_used() -> None:
    assert len(_stg_cases()) == 80


@pytest.mark.tf
@needs_tensorflow
def test_m_sct_runs_in_a_process_that_imported_tensorflow_first() -> None:
    """A training script imports TensorFlow, then places in-process: GLOP's text-format
    parameters parsed a protobuf and segfaulted there (TensorFlow's protobuf runtime); the
    LP now takes generic solver parameters. In a child, so a crash fails this test only."""
    code = ("import tensorflow\n"
            "import baechi\n"
            f"plan = baechi.place({str(ROOT / 'examples/graphs/gnmt_baechi.json')!r}, {{'devices': {{'count': 4}}}}, 'm-sct')\n"
            "print('step', plan.estimate.step_time_us)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("step")


@pytest.mark.tf
@needs_tensorflow
def test_place_after_tensorflow_ran_a_step() -> None:
    """Once TensorFlow has run, CP-SAT's solve segfaults in the same process (their native
    runtimes clash): ``place`` then runs in a fresh interpreter and returns the same plan, or
    raises the same error."""
    code = """
import tensorflow as tf
import baechi
from baechi.errors import InfeasiblePlacement
tf.reduce_sum(tf.ones((4, 4))).numpy()
ops = [{"name": f"o{i}", "compute_us": 10 + i, "output_bytes": 1000} for i in range(12)]
edges = [{"src": f"o{i}", "dst": f"o{j}", "bytes": 1000}
         for i in range(12) for j in (i + 1, i + 4) if j < 12]
doc = {"format": "baechi.graph/v1", "ops": ops, "edges": edges}
cluster = {"devices": {"count": 3}, "network": {"latency_us": 1, "bandwidth_gbps": 10}}
plan = baechi.place(doc, cluster, "exact", {"time_limit_s": 5})
assert plan.stats.optimal is not None
try:
    baechi.place(doc, {"devices": {"count": 2, "memory_bytes": 10}}, "m-etf")
except InfeasiblePlacement as error:
    assert error.details, error
    print("step", plan.estimate.step_time_us)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("step")
