"""The throughput objective (docs/format.md §10): the model, its placers and the request field."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import DATA, SHARED, needs_shared
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baechi import Cluster, InvalidRequest, load_graph, place
from baechi.algorithms import Problem
from baechi.algorithms.throughput import _linear_split, place_contiguous, place_split
from baechi.errors import InfeasiblePlacement
from baechi.grouping import colocation_units
from baechi.importers import import_graph
from baechi.throughput import is_backward, throughput

ORIGINALS = DATA / "importers" / "dnn-partitioning"


def _graph(ops: list[dict[str, Any]], edges: list[dict[str, Any]]) -> Any:
    return load_graph({"format": "baechi.graph/v1", "ops": ops, "edges": edges})


HETERO = Cluster.parse({"devices": [{"name": "g0"}, {"name": "g1"},
                                    {"name": "cpu", "kind": "cpu", "host": True}]})


def test_loads_by_hand() -> None:
    """a sends tensor t to b (g1) and c (cpu host) and tensor u to d (g1): a pays t once and u
    once; g1 pays t once (two consumers there) and u once; the host pays nothing."""
    g = _graph([{"name": "a", "compute_us": 10}, {"name": "b", "compute_us": 4},
                {"name": "b2", "compute_us": 1}, {"name": "c", "compute_us": 50,
                                                  "compute_us_by_kind": {"cpu": 7}},
                {"name": "d", "compute_us": 2}],
               [{"src": "a", "dst": "b", "bytes": 0, "tensor": "t", "transfer_us": 3},
                {"src": "a", "dst": "b2", "bytes": 0, "tensor": "t", "transfer_us": 3},
                {"src": "a", "dst": "c", "bytes": 0, "tensor": "t", "transfer_us": 3},
                {"src": "a", "dst": "d", "bytes": 0, "tensor": "u", "transfer_us": 5}])
    t = throughput(g, HETERO, [0, 1, 1, 2, 1])
    assert t.compute_us == [10.0, 7.0, 7.0]
    assert t.communication_us == [3 + 5, 3 + 5, 0.0]
    assert t.device_load_us == [18.0, 15.0, 7.0]
    assert t.time_per_sample_us == 18.0
    # a tensor sent to two devices counts once at the sender and once at each receiver
    two = throughput(g, Cluster.uniform(3), [0, 1, 1, 2, 0])
    assert two.communication_us == [3.0, 3.0, 3.0]


def test_memory_counts_activations_in_flight_under_1f1b() -> None:
    """Two stages: the first keeps its activation for 2 micro-batches in flight, the second
    for 1; persistent bytes once."""
    g = _graph([{"name": "f1", "compute_us": 1, "output_bytes": 100, "persistent_bytes": 7},
                {"name": "f2", "compute_us": 1, "output_bytes": 30},
                {"name": "b2", "compute_us": 1, "forward_op": "f2"},
                {"name": "b1", "compute_us": 1, "forward_op": "f1"}],
               [{"src": "f1", "dst": "f2", "bytes": 100}, {"src": "f2", "dst": "b2", "bytes": 30},
                {"src": "f1", "dst": "b1", "bytes": 100}, {"src": "b2", "dst": "b1", "bytes": 8}])
    assert is_backward(g, 2) and not is_backward(g, 0)
    t = throughput(g, Cluster.uniform(2, memory_bytes=200), [0, 1, 1, 0])
    assert t.memory_bytes == [7 + 2 * 100, 1 * 30]
    assert not t.memory_ok


def _their_max_load(original: dict[str, Any], group_of: dict[int, int]) -> float:
    """Tarnawski et al.'s max-load of a split (ids → 0 for the CPU, 1.. for accelerators),
    written from their paper's definition, in their milliseconds."""
    cost = {e["sourceId"]: e["cost"] for e in original["edges"]}
    latency: dict[int, float] = {}
    for node in original["nodes"]:
        group = group_of[node["id"]]
        latency[group] = latency.get(group, 0.0) + (
            node["cpuLatency"] if group == 0 else node["fpgaLatency"])
    receivers: dict[int, set[int]] = {}
    for e in original["edges"]:
        if group_of[e["sourceId"]] != group_of[e["destId"]]:
            receivers.setdefault(e["sourceId"], set()).add(group_of[e["destId"]])
    comm: dict[int, float] = {}
    for src, groups in receivers.items():
        comm[group_of[src]] = comm.get(group_of[src], 0.0) + cost[src]
        for group in groups:
            comm[group] = comm.get(group, 0.0) + cost[src]
    return max(load + (comm.get(group, 0.0) if group else 0.0)
               for group, load in latency.items())


def _expert_split(original: dict[str, Any], expert: dict[str, Any]) -> dict[int, int]:
    """Their human-expert split, backward nodes with their colour class (as their tool does)."""
    group_of = {i: 0 for machine in expert["cpus"] for i in machine["nodes"]}
    for g, machine in enumerate(expert["fpgas"], start=1):
        group_of.update({i: g for i in machine["nodes"]})
    colour = {n["id"]: n["colorClass"] for n in original["nodes"]}
    by_colour = {colour[i]: g for i, g in group_of.items()}
    return {n["id"]: group_of.get(n["id"], by_colour.get(n["colorClass"], 1))
            for n in original["nodes"]}


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_model_reproduces_their_max_load(mode: str) -> None:
    path = ORIGINALS / f"throughput-inputs/LayerGraphs/bert24_{mode}.json"
    original = json.loads(path.read_text())
    document = import_graph("dnn-partitioning", path)
    graph = load_graph(document)
    cluster = Cluster.parse(document["meta"]["suggested_cluster"])
    ids = [graph.attrs[op]["id"] for op in range(len(graph))]
    # all on one accelerator: the "one device" column
    one = throughput(graph, cluster, [0] * len(graph)).time_per_sample_us
    assert one / 1000 == pytest.approx(_their_max_load(original, dict.fromkeys(ids, 1)))
    assert round(one / 1000, 2) == {"inference": 92.41, "training": 217.81}[mode]
    # the human experts' split, and a scrambled one using the host CPU
    expert = json.loads((ORIGINALS / f"human-experts/bert24_{mode}_expert.json").read_text())
    splits = [_expert_split(original, expert),
              {i: (i * 7919) % 8 % 7 for i in ids}]
    for split in splits:
        device_of = [split[i] - 1 if split[i] else 6 for i in ids]  # 0 = CPU = /CPU:0
        ours = throughput(graph, cluster, device_of).time_per_sample_us / 1000
        assert ours == pytest.approx(_their_max_load(original, split), rel=1e-9, abs=1e-6)


@pytest.mark.parametrize(("mode", "optimum"), [("inference", 17.79), ("training", 41.75)])
def test_contiguous_optimum_is_their_dp_optimum(mode: str, optimum: float) -> None:
    document = import_graph(
        "dnn-partitioning", ORIGINALS / f"throughput-inputs/LayerGraphs/bert24_{mode}.json")
    plan = place(document, document["meta"]["suggested_cluster"], "throughput-contiguous",
                 {"time_limit_s": 30}, objective="throughput")
    # optimal among contiguous splits; a claim for every split is not this placer's to make
    assert plan.stats.contiguous_optimal and not plan.stats.optimal
    assert plan.stats.bound_us <= plan.estimate.time_per_sample_us
    assert round(plan.estimate.time_per_sample_us / 1000, 2) == optimum


@st.composite
def _small_problems(draw: st.DrawFn) -> tuple[Any, Cluster]:
    n = draw(st.integers(1, 6))
    ops = []
    for i in range(n):
        op: dict[str, Any] = {"name": f"o{i}", "compute_us": draw(st.integers(0, 20)),
                              "persistent_bytes": draw(st.integers(0, 4))}
        if draw(st.booleans()):
            op["compute_us_by_kind"] = {"cpu": draw(st.integers(0, 40))}
        if draw(st.integers(0, 5)) == 0:
            op["compute_us_by_kind"] = {"gpu": None}
        ops.append(op)
    # one transfer time per tensor (per source op), as the placers' model prices it
    sends = [draw(st.integers(0, 9)) for _ in range(n)]
    edges = [{"src": f"o{j}", "dst": f"o{i}", "bytes": 0, "transfer_us": sends[j]}
             for i in range(1, n) for j in range(i) if draw(st.integers(0, 2)) == 0]
    memory = draw(st.sampled_from([None, 6]))
    cluster = Cluster.parse({"devices": [
        {"name": "g0", "memory_bytes": memory}, {"name": "g1", "memory_bytes": memory},
        {"name": "c", "kind": "cpu", "host": True}]})
    return _graph(ops, edges), cluster


def _contiguous(graph: Any, device_of: list[int], n_dev: int) -> bool:
    """Some order of the devices makes every edge go to the same or a later device."""
    for order in itertools.permutations(range(n_dev)):
        position = {d: i for i, d in enumerate(order)}
        if all(position[device_of[graph.edge_src[k]]] <= position[device_of[graph.edge_dst[k]]]
               for k in range(graph.num_edges)):
            return True
    return False


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_small_problems())
def test_placers_are_optimal_against_brute_force(case: tuple[Any, Cluster]) -> None:
    graph, cluster = case
    n_dev = len(cluster.devices)
    best = {True: math.inf, False: math.inf}
    for device_of in itertools.product(range(n_dev), repeat=len(graph)):
        verdict = throughput(graph, cluster, list(device_of))
        if not all(map(math.isfinite, verdict.compute_us)) or not verdict.memory_ok:
            continue
        best[False] = min(best[False], verdict.time_per_sample_us)
        if _contiguous(graph, list(device_of), n_dev):
            best[True] = min(best[True], verdict.time_per_sample_us)
    problem = Problem.of(graph, cluster, colocation_units(graph, cluster), time_limit_s=20)
    for contiguous, placer in ((True, place_contiguous), (False, place_split)):
        if math.isinf(best[contiguous]):
            with pytest.raises(InfeasiblePlacement):  # kinds or memory
                placer(problem)
            continue
        assignment = placer(problem)
        found = throughput(graph, cluster, assignment.device_of).time_per_sample_us
        assert found == pytest.approx(best[contiguous], abs=1e-3), contiguous
        stats = assignment.stats
        # every claim holds for every split: the bound, and optimal (contiguous or not)
        assert stats["bound_us"] <= best[False] * (1 + 1e-9) + 1e-9
        assert not stats["optimal"] or found == pytest.approx(best[False], abs=1e-3)
        # here the model is the verdict (no kept activations, no links, whole times): the
        # best split is proved optimal, the contiguous one among contiguous splits
        assert stats["contiguous_optimal"] if contiguous else stats["optimal"]
        if contiguous:
            assert _contiguous(graph, assignment.device_of, n_dev)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 60), st.integers(0, 9)),
                min_size=1, max_size=7))
def test_warm_start_dp_is_the_contiguous_optimum_on_chains(
        layers: list[tuple[int, int, int]]) -> None:
    """On a chain every contiguous split is a cut of the one order, host stages included
    (a host pays no transfer time, so cheap ops may go to it first, last or between): the DP
    alone must find the brute-force optimum, as Tarnawski et al.'s does."""
    ops = [{"name": f"o{i}", "compute_us": gpu, "compute_us_by_kind": {"cpu": cpu}}
           for i, (gpu, cpu, _) in enumerate(layers)]
    edges = [{"src": f"o{i}", "dst": f"o{i + 1}", "bytes": 0, "transfer_us": send}
             for i, (_, _, send) in enumerate(layers[:-1])]
    graph = _graph(ops, edges)
    problem = Problem.of(graph, HETERO, colocation_units(graph, HETERO))
    allowed = [list(problem.devices_for(u)) for u in range(len(problem.units))]
    best = min(
        throughput(graph, HETERO, list(device_of)).time_per_sample_us
        for device_of in itertools.product(range(3), repeat=len(graph))
        if _contiguous(graph, list(device_of), 3))
    split = _linear_split(problem, allowed)
    assert split is not None
    device_of = [split[problem.units.unit_of[op]] for op in range(len(graph))]
    assert _contiguous(graph, device_of, 3)
    assert throughput(graph, HETERO, device_of).time_per_sample_us == pytest.approx(best)


@pytest.mark.parametrize("blocks", [1, 3, 16, 10_000])
def test_the_dp_cuts_at_most_cut_blocks_blocks(monkeypatch: pytest.MonkeyPatch,
                                               blocks: int) -> None:
    """Past CUT_BLOCKS segment starts, the DP cuts at some of them only (its tables are
    blocks × blocks): its split stays contiguous, and with room for every start it is the
    split of the DP over every start, whose load no coarser cut beats."""
    from baechi.algorithms import throughput as module
    from baechi.testing import GENERATORS

    graph = load_graph(GENERATORS["layered"](3, 60, 1.0))
    cluster = Cluster.uniform(3, latency_us=5, bandwidth_gbps=1)
    problem = Problem.of(graph, cluster, colocation_units(graph, cluster))
    allowed = [list(problem.devices_for(u)) for u in range(len(problem.units))]
    order, starts = next(iter(module._unit_orders(problem)))
    monkeypatch.setattr(module, "CUT_BLOCKS", blocks)
    bounds = module._blocks(problem, order, starts)
    assert bounds[0] == 0 and bounds[-1] == len(order) and bounds == sorted(set(bounds))
    assert len(bounds) - 1 <= blocks and all(starts[b] for b in bounds)
    split = module._linear_split(problem, allowed)
    assert split is not None
    device_of = [split[problem.units.unit_of[op]] for op in range(len(graph))]
    assert _contiguous(graph, device_of, 3)
    monkeypatch.setattr(module, "CUT_BLOCKS", 10_000)
    finest = module._linear_split(problem, allowed)
    assert finest is not None
    if blocks >= sum(starts):
        assert split == finest
    load = throughput(graph, cluster, device_of).time_per_sample_us
    assert throughput(graph, cluster, [finest[problem.units.unit_of[op]] for op in range(
        len(graph))]).time_per_sample_us <= load


def test_a_model_not_built_in_time_gives_the_warm_start() -> None:
    """Building the CP-SAT model of 10,000 units took longer than the whole limit: past the
    limit the solve answers with the DP's split, and says so."""
    from baechi.algorithms import throughput as module
    from baechi.testing import GENERATORS

    graph = load_graph(GENERATORS["layered"](3, 60, 1.0))
    cluster = Cluster.uniform(4, latency_us=5, bandwidth_gbps=1)
    problem = Problem.of(graph, cluster, colocation_units(graph, cluster))
    allowed = [list(problem.devices_for(u)) for u in range(len(problem.units))]
    for contiguous in (True, False):
        plan = module._solve(problem, contiguous, time_limit_s=0.0, hint=None)
        assert plan.stats["fallback"] == ("the CP-SAT model was not built within 0 s: the warm "
                                          "start's split")
        assert plan.stats["optimal"] is False
        split = module._linear_split(problem, allowed)
        assert split is not None
        assert plan.device_of == [split[problem.units.unit_of[op]] for op in range(len(graph))]
    with_time = module._solve(problem, True, time_limit_s=2.0, hint=None)
    assert "not built" not in with_time.stats.get("fallback", "")
    assert with_time.stats["time_per_sample_us"] <= plan.stats["time_per_sample_us"]


def test_objective_in_the_plan(tmp_path: Path) -> None:
    g = {"format": "baechi.graph/v1",
         "ops": [{"name": n, "compute_us": 10} for n in "abcd"],
         "edges": [{"src": "a", "dst": "b", "bytes": 0, "transfer_us": 1},
                   {"src": "b", "dst": "c", "bytes": 0, "transfer_us": 1},
                   {"src": "c", "dst": "d", "bytes": 0, "transfer_us": 1}]}
    plan = place(g, {"devices": {"count": 2}}, objective="throughput")
    assert plan.estimate.time_per_sample_us == 21.0
    assert plan.estimate.device_load_us == {"/GPU:0": 21.0, "/GPU:1": 21.0}
    assert plan.request.model_dump()["objective"] == "throughput"
    assert plan.stats.optimal is True
    data = json.loads(plan.model_dump_json())
    assert data["estimate"]["time_per_sample_us"] == 21.0
    step = json.loads(place(g, {"devices": {"count": 2}}, "m-etf").model_dump_json())
    assert "time_per_sample_us" not in step["estimate"] and "device_load_us" not in step["estimate"]
    assert "objective" not in step["request"]
    with pytest.raises(InvalidRequest, match="'throughput-cpsat' places for objective"):
        place(g, {"devices": {"count": 2}}, "throughput-cpsat")
    with pytest.raises(InvalidRequest, match="objective: unknown objective 'speed'"):
        place(g, {"devices": {"count": 2}}, objective="speed")


def test_a_step_time_plan_over_the_pipelines_memory_gives_way() -> None:
    """m-ETF knows one step's memory, not the activations a pipeline keeps for micro-batches
    in flight: its plan here overshoots them (a random request found it returned as it was),
    so throughput-cpsat places and ``stats.fallback`` says why; with less memory, none fits
    and the request fails naming the device."""
    from baechi import InfeasiblePlacement
    from baechi.testing import GENERATORS, with_memory

    doc = with_memory(GENERATORS["fork_join"](0, 12, 1.0))
    cluster: dict[str, Any] = {"devices": [{"name": f"/GPU:{i}", "memory_bytes": 91}
                                           for i in range(3)], "network": {"latency_us": 1}}
    plan = place(doc, cluster, "m-etf", objective="throughput")
    assert plan.stats.fallback is not None and plan.stats.fallback.startswith(
        "m-etf's plan needs ") and plan.stats.fallback.endswith("placed with throughput-cpsat")
    assert plan.stats.algorithm_run == "throughput-cpsat"
    assert plan.stats.throughput_memory_ok is True
    assert all(used <= 91 for used in plan.stats.throughput_memory_bytes.values())
    for device in cluster["devices"]:
        device["memory_bytes"] = 60
    with pytest.raises(InfeasiblePlacement, match=r"m-etf's plan needs \d+ bytes on '/GPU:\d'.*"
                       "throughput-cpsat: no split fits in memory"):
        place(doc, cluster, "m-etf", objective="throughput")


@needs_shared
@pytest.mark.parametrize("algorithm", ["throughput-contiguous", "throughput-cpsat"])
def test_a_deadline_too_short_for_cp_sat_still_gives_the_warm_start_split(algorithm: str) -> None:
    # 2,012 ops in 0.1 s: CP-SAT often cannot even take its hint; a loaded machine made
    # bert_l-12 answer "no split found" with a valid split at hand
    from baechi.importers import import_graph

    path = (SHARED / "graphs/dnn-partitioning/original/throughput-inputs/OperatorGraphs"
            / "bert_L-12_training.json")
    document = import_graph("dnn-partitioning", path)
    plan = place(document, document["meta"]["suggested_cluster"], algorithm,
                 {"time_limit_s": 0.01}, objective="throughput")
    assert plan.estimate.time_per_sample_us > 0
    stats = plan.stats.model_dump()
    if stats.get("fallback"):
        assert "the warm start's split" in stats["fallback"] and stats["optimal"] is False
