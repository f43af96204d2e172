"""Transfer order (issue 11): the simulator books channels in a plan's order; model-aware
ordering never makes a plan slower than first come, first served (FIFO)."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from helpers import edge, graph_doc, op, plan_doc, two_devices
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_algorithms import clusters, dags

from baechi import (
    Cluster,
    InfeasiblePlacement,
    InvalidPlan,
    api,
    load_graph,
    ordering,
    place,
    simulate,
    simulate_plan,
)
from baechi.cli import main
from baechi.costmodel import CostModel
from baechi.errors import InvalidRequest
from baechi.graph import Graph
from baechi.ordering import QUICK, OrderOutcome, order_transfers
from baechi.plan import Plan
from baechi.simulate import (
    Simulation,
    index_plan,
    plan_transfers,
    replay,
    schedule_graph,
    topological_nodes,
    transfer_entries,
)
from baechi.testing import GENERATORS, layered, small_cluster

# 0 µs latency, 1 GB/s: a transfer of b bytes takes b / 1000 µs
ONE_GBPS = two_devices(latency=0, bandwidth=1)


def _two_senders() -> tuple[dict, dict]:
    """p1 and p2 on GPU:0 each send a tensor to GPU:1: p1's (50 µs) feeds the short op y,
    p2's (10 µs) feeds the long op x, which GPU:1 runs first."""
    graph = graph_doc(
        [op("p1", 10), op("p2", 10), op("x", 100), op("y", 1)],
        [edge("p1", "y", 50_000), edge("p2", "x", 10_000)])
    plan = plan_doc(ONE_GBPS, {"p1": "/GPU:0", "p2": "/GPU:0", "x": "/GPU:1", "y": "/GPU:1"},
                    {"/GPU:0": ["p1", "p2"], "/GPU:1": ["x", "y"]})
    return graph, plan


P1 = {"src": "p1", "tensor": "p1", "bytes": 50_000, "dst": "/GPU:1"}
P2 = {"src": "p2", "tensor": "p2", "bytes": 10_000, "dst": "/GPU:1"}


def test_fifo_books_in_issue_order() -> None:
    graph, plan = _two_senders()
    sim = simulate_plan(graph, plan)
    # p1 ends at 10: its tensor holds both channels over [10, 60]; p2's waits until 60 -> 70;
    # x runs [70, 170], y [170, 171]
    assert (sim.transfers.start, sim.transfers.end) == ([10.0, 60.0], [60.0, 70.0])
    assert sim.estimate.step_time_us == 171.0
    assert sim.transfer_order is None


def test_reordered_transfer_lets_the_critical_op_start_earlier() -> None:
    graph, plan = _two_senders()
    plan["transfer_order"] = {"/GPU:0": [P2, P1], "/GPU:1": [P2, P1]}
    sim = simulate_plan(graph, plan)
    # p2's tensor goes first when p2 ends: [20, 30], p1's waits for it: [30, 80];
    # x runs [30, 130], y [130, 131]
    by_src = dict(zip(sim.transfers.src_op, zip(sim.transfers.start, sim.transfers.end,
                                                strict=True), strict=True))
    assert by_src == {1: (20.0, 30.0), 0: (30.0, 80.0)}
    assert (sim.start[2], sim.end[2], sim.start[3], sim.end[3]) == (30.0, 130.0, 130.0, 131.0)
    assert sim.estimate.step_time_us == 131.0
    # the order the channels were booked in is the one given
    assert sim.booked_order() == sim.transfer_order


def test_fifo_order_written_out_replays_identically() -> None:
    graph, plan = _two_senders()
    plan["transfer_order"] = {"/GPU:0": [P1, P2], "/GPU:1": [P1, P2]}
    fifo = simulate_plan(graph, {k: v for k, v in plan.items() if k != "transfer_order"})
    listed = simulate_plan(graph, plan)
    assert listed.estimate == fifo.estimate
    assert (listed.start, listed.end) == (fifo.start, fifo.end)


def _round_trip() -> tuple[dict, dict]:
    """a on GPU:0 -> b on GPU:1 -> c on GPU:0: b's result can only go after a's tensor."""
    graph = graph_doc([op("a", 5), op("b", 5), op("c", 5)],
                      [edge("a", "b", 1000), edge("b", "c", 2000, tensor="b:0")])
    plan = plan_doc(ONE_GBPS, {"a": "/GPU:0", "b": "/GPU:1", "c": "/GPU:0"},
                    {"/GPU:0": ["a", "c"], "/GPU:1": ["b"]})
    return graph, plan


A = {"src": "a", "tensor": "a", "bytes": 1000, "dst": "/GPU:1"}
B = {"src": "b", "tensor": "b:0", "bytes": 2000, "dst": "/GPU:0"}


def test_deadlocking_order_is_rejected_naming_the_cycle() -> None:
    graph, plan = _round_trip()
    plan["transfer_order"] = {"/GPU:0": [B, A], "/GPU:1": [B, A]}
    with pytest.raises(InvalidPlan, match="deadlocks") as info:
        simulate(graph, plan)
    cycle = info.value.details["cycle"]
    assert "'b'" in cycle
    assert "transfer of 'a' (1000 bytes) from 'a' to '/GPU:1'" in cycle
    assert "transfer of 'b:0' (2000 bytes) from 'b' to '/GPU:0'" in cycle


def test_valid_round_trip_order_replays() -> None:
    graph, plan = _round_trip()
    plan["transfer_order"] = {"/GPU:0": [A, B], "/GPU:1": [A, B]}
    # a [0, 5], a's tensor [5, 6], b [6, 11], b's tensor [11, 13], c [13, 18]
    assert simulate(graph, plan).step_time_us == 18.0


@pytest.mark.parametrize(("order", "message"), [
    ({"/GPU:0": [A, B]}, r"transfer_order\['/GPU:1'\]: the transfer of 'a' .* is missing"),
    ({"/GPU:0": [A, B, A], "/GPU:1": [A, B]}, r"\['/GPU:0'\]\[2\]: .* appears twice"),
    ({"/GPU:0": [A, B, {**A, "bytes": 7}], "/GPU:1": [A, B]},
     r"\['/GPU:0'\]\[2\]: the plan makes no transfer of 'a' \(7 bytes\)"),
    ({"/GPU:0": [A, B, {"src": "a", "dst": "/GPU:1", "control": True}], "/GPU:1": [A, B]},
     r"the plan makes no control message from 'a' to '/GPU:1'"),
    ({"/GPU:0": [A, B], "/GPU:1": [A, B], "/GPU:7": []}, r"unknown device '/GPU:7'"),
    ({"/GPU:0": [A, {**B, "src": "zz"}], "/GPU:1": [A, B]}, r"op 'zz' is not in the graph"),
    ({"/GPU:0": [A, B], "/GPU:1": [A, {"src": "b", "dst": "/GPU:0"}]}, r"needs 'bytes'"),
])
def test_incomplete_or_unknown_entries_are_rejected(order: dict, message: str) -> None:
    graph, plan = _round_trip()
    plan["transfer_order"] = order
    with pytest.raises(InvalidPlan, match=message):
        simulate(graph, plan)


def test_entry_on_a_channel_the_transfer_does_not_use_is_rejected() -> None:
    graph = graph_doc([op("a", 5), op("b", 5)], [edge("a", "b", 1000)])
    plan = plan_doc(two_devices(latency=0, bandwidth=1, count=3),
                    {"a": "/GPU:0", "b": "/GPU:1"}, {"/GPU:0": ["a"], "/GPU:1": ["b"]})
    plan["transfer_order"] = {"/GPU:0": [A], "/GPU:1": [A], "/GPU:2": [A]}
    with pytest.raises(InvalidPlan, match=r"does not use '/GPU:2'"):
        simulate(graph, plan)


def test_parallel_mode_ignores_the_order() -> None:
    graph, plan = _two_senders()
    plan["request"]["cluster"] = two_devices(latency=0, bandwidth=1, mode="parallel")
    without = simulate(graph, plan)
    plan["transfer_order"] = {"/GPU:0": [P2, P1], "/GPU:1": [P2, P1]}
    assert simulate(graph, plan) == without


def test_plan_json_round_trip_keeps_the_order() -> None:
    graph, plan = _two_senders()
    plan["transfer_order"] = {"/GPU:0": [P2, P1], "/GPU:1": [P2, P1]}
    parsed = Plan.parse(plan)
    again = Plan.parse(parsed.model_dump(mode="json"))
    assert again.model_dump(mode="json")["transfer_order"] == plan["transfer_order"]
    assert "transfer_order" not in Plan.parse(_two_senders()[1]).model_dump(mode="json")
    assert simulate(graph, again).step_time_us == 131.0


# ---------------------------------------------------------------- the model-aware post-pass

def _latency_bound() -> tuple[dict, dict]:
    """p1's message (latency only, 50 µs) feeds y; p2's (60 µs) feeds the long op x. GPU:1
    first runs z, whose 100000 temp bytes are held over [0, 50]."""
    graph = graph_doc(
        [op("p1", 10), op("p2", 20), op("z", 50, temp_bytes=100_000), op("x", 100),
         op("y", 1)],
        [edge("p1", "y", 0), edge("p2", "x", 10_000)])
    cluster = two_devices(latency=50, bandwidth=1)
    plan = plan_doc(cluster, {"p1": "/GPU:0", "p2": "/GPU:0", "z": "/GPU:1", "x": "/GPU:1",
                              "y": "/GPU:1"},
                    {"/GPU:0": ["p1", "p2"], "/GPU:1": ["z", "x", "y"]})
    return graph, plan


def _outcome(graph: dict, plan: dict, deadline: float = math.inf):
    g = load_graph(graph)
    cluster = Cluster.parse(plan["request"]["cluster"])
    cost = CostModel(g, cluster)
    fifo = simulate_plan(graph, plan)
    return fifo, order_transfers(cost, fifo, deadline)


def test_model_aware_order_is_kept_when_strictly_faster() -> None:
    graph, plan = _latency_bound()
    fifo, outcome = _outcome(graph, plan)
    # FIFO: p1's message [10, 60], p2's [60, 120]; x [120, 220], y [220, 221]
    assert fifo.estimate.step_time_us == 221.0
    # model-aware: p2's message first when p2 ends [30, 90], p1's [90, 140]; x [90, 190],
    # y [190, 191]
    assert outcome.kept == "model-aware"
    assert outcome.simulation.estimate.step_time_us == 191.0
    assert outcome.fifo_step_time_us == 221.0
    assert fifo.estimate.peak_memory_bytes["/GPU:1"] == 100_000
    # p2's copy now arrives while z holds its temp
    assert outcome.simulation.estimate.peak_memory_bytes["/GPU:1"] == 110_000


def test_model_aware_order_that_breaks_memory_is_rejected() -> None:
    graph, plan = _latency_bound()
    plan["request"]["cluster"]["devices"]["memory_bytes"] = 105_000
    fifo, outcome = _outcome(graph, plan)
    assert fifo.estimate.memory_ok
    assert outcome.kept == "fifo" and outcome.simulation is fifo
    # the 191 µs order was tried and refused for memory; nothing else beat FIFO
    assert outcome.candidates["latest-start"] is None
    assert all(v is None or v >= 221.0 for v in outcome.candidates.values())


def test_fifo_kept_when_no_candidate_is_strictly_faster() -> None:
    graph, plan = _round_trip()  # one message per channel direction: nothing to reorder
    graph["ops"].append(op("d", 1))
    graph["edges"].append(edge("a", "d", 10))
    plan["placement"]["d"] = "/GPU:1"
    plan["order"]["/GPU:1"].append("d")
    fifo, outcome = _outcome(graph, plan)
    assert outcome.kept == "fifo" and outcome.simulation is fifo
    assert all(v is None or v >= fifo.estimate.step_time_us
               for v in outcome.candidates.values())


def test_no_replay_starts_after_the_deadline() -> None:
    graph, plan = _latency_bound()
    fifo, outcome = _outcome(graph, plan, deadline=0.0)  # long passed
    assert outcome.kept == "fifo" and outcome.simulation is fifo
    assert outcome.candidates == {}
    assert "deadline" in (outcome.note or "")


def test_quick_pass_tries_the_placers_order_and_one_candidate() -> None:
    graph, plan = _latency_bound()
    fifo, full = _outcome(graph, plan)
    cost = CostModel(load_graph(graph), Cluster.parse(plan["request"]["cluster"]))
    quick = order_transfers(cost, fifo, math.inf, quick=True)
    assert set(quick.candidates) == {QUICK}
    # here only the sorted candidates find the faster order (191 µs): the full pass
    assert full.simulation.estimate.step_time_us < quick.simulation.estimate.step_time_us == \
        fifo.estimate.step_time_us
    placers = order_transfers(cost, fifo, math.inf, proposed=full.simulation.transfer_order,
                              quick=True)
    assert set(placers.candidates) == {"placer", QUICK}
    assert placers.simulation.estimate == full.simulation.estimate


def test_full_pass_resumed_from_a_quick_one_replays_none_of_its_candidates_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A full pass resumed from a quick pass of the same plan starts from its order and
    replays neither the placer's order nor the quick candidate (a dispatch replay) again."""
    graph, plan = _latency_bound()
    fifo, full = _outcome(graph, plan)
    cost = CostModel(load_graph(graph), Cluster.parse(plan["request"]["cluster"]))
    proposed = full.simulation.transfer_order
    quick = order_transfers(cost, fifo, math.inf, proposed=proposed, quick=True)
    replays: list[bool] = []  # dispatched or not, per replay

    def counted(*args: Any, **kwargs: Any) -> Simulation:
        replays.append(kwargs.get("priority") is not None)
        return replay(*args, **kwargs)

    monkeypatch.setattr(ordering, "replay", counted)
    order_transfers(cost, fifo, math.inf, proposed=proposed)
    from_scratch = list(replays)
    replays.clear()
    resumed = order_transfers(cost, fifo, math.inf, proposed=proposed, resume=quick)
    assert sum(from_scratch) == 2 and sum(replays) == 1  # dispatch/consumer-start only
    assert len(replays) == len(from_scratch) - 2  # nor the placer's order
    assert set(quick.candidates) < set(resumed.candidates)
    assert resumed.simulation.estimate == full.simulation.estimate
    assert resumed.kept == "model-aware"


# ---------------------------------------------------------------- through place and the CLI

GAINS = layered(0, 12, 2.0)  # m-ETF on 2 devices: FIFO 117 µs, model-aware 107 µs


def test_place_keeps_the_model_aware_order_and_says_so() -> None:
    cluster = small_cluster(2, "sequential")
    plan = place(GAINS, cluster, "m-etf", {"allow_single": False})
    fifo = place(GAINS, cluster, "m-etf", {"allow_single": False, "transfer_order": "fifo"})
    assert plan.stats.transfer_order == "model-aware" and plan.transfer_order is not None
    assert fifo.stats.transfer_order == "fifo" and fifo.transfer_order is None
    assert plan.stats.fifo_step_time_us == fifo.estimate.step_time_us
    assert plan.estimate.step_time_us < fifo.estimate.step_time_us
    assert plan.placement == fifo.placement and plan.order == fifo.order
    # the plan is self-describing: its JSON replays to its estimate
    assert simulate(GAINS, json.loads(plan.model_dump_json())) == plan.estimate
    assert "order" in plan.stats.phases


def test_one_device_replaces_a_plan_only_when_it_beats_the_plan_ordered() -> None:
    """m-ETF on 2 devices: 235 µs under FIFO channels, 155 µs ordered; one device 167 µs.
    The single-device check comes after the post-pass, so the ordered plan is kept."""
    doc, cluster = layered(6, 16, 10.0), small_cluster(2, "sequential")
    plan = place(doc, cluster, "m-etf")
    assert not plan.stats.chose_single and plan.stats.transfer_order == "model-aware"
    assert plan.estimate.step_time_us == 155.0 < plan.estimate.single_device_us == 167.0
    assert plan.stats.fifo_step_time_us == 235.0
    fifo = place(doc, cluster, "m-etf", {"transfer_order": "fifo"})
    assert fifo.stats.chose_single and fifo.stats.algorithm_step_time_us == 235.0
    assert fifo.estimate.step_time_us == 167.0


def test_parallel_mode_has_nothing_to_order() -> None:
    plan = place(GAINS, small_cluster(2, "parallel"), "m-etf", {"allow_single": False})
    assert plan.transfer_order is None and plan.stats.transfer_order is None


def test_bad_transfer_order_option_is_rejected() -> None:
    with pytest.raises(InvalidRequest, match="transfer_order"):
        place(GAINS, small_cluster(2, "sequential"), "m-etf", {"transfer_order": "lifo"})


def test_cli_places_with_either_order_and_simulate_replays_the_plan(tmp_path: Path,
                                                                    capsys) -> None:
    graph_path = tmp_path / "g.json"
    graph_path.write_text(json.dumps(GAINS))
    cluster_path = tmp_path / "c.json"
    cluster_path.write_text(json.dumps(small_cluster(2, "sequential")))
    steps = {}
    for order in ("model-aware", "fifo"):
        plan_path = tmp_path / f"{order}.json"
        assert main(["place", str(graph_path), "--cluster", str(cluster_path), "-a", "m-etf",
                     "--no-single", "--transfer-order", order, "-o", str(plan_path)]) == 0
        placed = capsys.readouterr().out
        assert main(["simulate", str(graph_path), str(plan_path)]) == 0
        replayed = capsys.readouterr().out
        step = next(line for line in placed.splitlines() if line.startswith("step time"))
        assert step in replayed  # the written plan replays to the step time placed
        written = json.loads(plan_path.read_text())
        assert ("transfer_order" in written) == (order == "model-aware")
        steps[order] = written["estimate"]["step_time_us"]
        if order == "model-aware":
            fifo_ms = written["stats"]["fifo_step_time_us"] / 1000
            assert f"transfer order model-aware (the plan's transfer_order); FIFO would take " \
                   f"{fifo_ms:.3f} ms" in placed
        else:
            assert "transfer order FIFO (first come, first served)" in placed
    assert steps["model-aware"] < steps["fifo"]


# ---------------------------------------------------------------- properties on random DAGs

def _sequential(cluster: dict, memory: bool = True) -> dict:
    devices = cluster["devices"] if memory else [
        {k: v for k, v in d.items() if k != "memory_bytes"} for d in cluster["devices"]]
    return {"devices": devices, "network": {**cluster["network"], "mode": "sequential"}}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=dags(), cluster=clusters())
def test_fifo_written_out_replays_identically(doc: dict, cluster: dict) -> None:
    cluster = _sequential(cluster, memory=False)
    plan = place(doc, cluster, "m-etf",
                 {"allow_single": False, "transfer_order": "fifo", "forward_only": False})
    g, c = load_graph(doc), Cluster.parse(cluster)
    cost = CostModel(g, c)
    device_of, orders = index_plan(g, plan, c)
    fifo = replay(g, c, device_of, orders, cost)
    listed = replay(g, c, device_of, orders, cost, fifo.booked_order())
    assert listed.estimate == fifo.estimate
    assert (listed.start, listed.end) == (fifo.start, fifo.end)
    assert listed.booked_order() == fifo.booked_order()
    # and through the plan's JSON
    data = plan.model_dump(mode="json")
    data["transfer_order"] = {
        name: [e.model_dump() for e in entries]
        for name, entries in transfer_entries(g, c, fifo.booked_order()).items()}
    assert simulate(doc, data) == fifo.estimate


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=dags(), cluster=clusters(), seed=st.integers(0, 2**32 - 1))
def test_any_channel_order_replays_or_is_rejected_as_a_cycle(doc: dict, cluster: dict,
                                                             seed: int) -> None:
    """Shuffled channel lists: the replay deadlocks exactly when the schedule graph with the
    channel order has a cycle; otherwise each channel is booked in the given order."""
    cluster = _sequential(cluster, memory=False)
    plan = place(doc, cluster, "m-topo",
                 {"allow_single": False, "transfer_order": "fifo", "forward_only": False})
    g, c = load_graph(doc), Cluster.parse(cluster)
    cost = CostModel(g, c)
    device_of, orders = index_plan(g, plan, c)
    rng = random.Random(seed)
    # half the channels follow one random rank of every message (acyclic across channels
    # only by luck), the others are shuffled on their own
    rank = {key: rng.random() for key in plan_transfers(cost, device_of)}
    fifo = replay(g, c, device_of, orders, cost)
    shuffled = [sorted(channel, key=rank.__getitem__) if rng.random() < 0.5
                else rng.sample(channel, len(channel)) for channel in fifo.booked_order()]
    _, successors = schedule_graph(cost, device_of, orders, shuffled)
    acyclic = len(topological_nodes(successors)) == len(successors)
    if acyclic:
        sim = replay(g, c, device_of, orders, cost, shuffled)
        assert sim.booked_order() == shuffled
    else:
        with pytest.raises(InvalidPlan, match="deadlocks") as named:
            replay(g, c, device_of, orders, cost, shuffled)
        assert named.value.details["cycle"]
    # without naming a cycle, the same verdict
    try:
        replay(g, c, device_of, orders, cost, shuffled, name_cycle=False)
    except InvalidPlan as unnamed:
        assert not acyclic and "cycle" not in unnamed.details
    else:
        assert acyclic


@st.composite
def generated(draw: st.DrawFn) -> tuple[dict, dict]:
    """A graph of :mod:`baechi.testing`'s shapes on 2–3 devices, sequential, memory limited
    or not: where transfers queue on channels (tiny random DAGs rarely make them queue)."""
    shape = draw(st.sampled_from(sorted(GENERATORS)))
    doc = GENERATORS[shape](draw(st.integers(0, 50)), draw(st.integers(8, 30)),
                            draw(st.sampled_from([0.5, 1.0, 2.0])))
    for entry in doc["ops"]:
        entry["output_bytes"] = draw(st.sampled_from([0, 100, 400]))
    cluster = small_cluster(draw(st.integers(2, 3)), "sequential",
                            draw(st.sampled_from([None, None, 2000, 4000])))
    return doc, cluster


@pytest.mark.parametrize("algorithm", ["m-topo", "m-etf", "m-sct", "m-fill"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.one_of(st.tuples(dags(), clusters().map(_sequential)), generated()),
       allow_single=st.booleans())
def test_model_aware_is_never_slower_than_fifo_and_fits_memory(
        algorithm: str, case: tuple[dict, dict], allow_single: bool) -> None:
    doc, cluster = case
    results = []
    for order in ("model-aware", "fifo"):
        try:
            results.append(place(doc, cluster, algorithm,
                                 {"transfer_order": order, "forward_only": False,
                                  "allow_single": allow_single}))
        except InfeasiblePlacement:
            results.append(None)
    aware, fifo = results
    assert (aware is None) == (fifo is None)
    if aware is None or fifo is None:
        return
    assert aware.estimate.step_time_us <= fifo.estimate.step_time_us
    fifo_us = fifo.estimate.step_time_us  # the placement's FIFO replay
    if fifo.stats.chose_single and not aware.stats.chose_single:
        # one device beat the plan under FIFO channels, not once ordered
        fifo_us = fifo.stats.algorithm_step_time_us
    assert aware.stats.fifo_step_time_us == fifo_us
    assert aware.estimate.memory_ok
    assert (aware.transfer_order is not None) == (aware.estimate.step_time_us < fifo_us)
    # a plan with a transfer order replays to its estimate, from its JSON
    assert simulate(doc, aware.model_dump(mode="json")) == aware.estimate


@pytest.mark.parametrize("algorithm", ["single", "exact", "auto"])
def test_every_placer_goes_through_the_post_pass(algorithm: str) -> None:
    """The time-bounded placers' placements depend on the clock, so they are compared with
    FIFO on their own placement (``stats.fifo_step_time_us``)."""
    cluster = small_cluster(2, "sequential")
    plan = place(GAINS, cluster, algorithm, {"allow_single": False, "time_limit_s": 1})
    stats = plan.stats
    assert stats.transfer_order in ("fifo", "model-aware")
    assert stats.fifo_step_time_us is not None
    assert plan.estimate.step_time_us <= stats.fifo_step_time_us
    assert (plan.transfer_order is not None) == (stats.transfer_order == "model-aware")
    assert simulate(GAINS, plan.model_dump(mode="json")) == plan.estimate


def test_auto_orders_each_of_its_plans_quickly_then_fully_fastest_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` compares its candidates under FIFO channels; the post-pass gives every plan it
    ran (each placement once) the quick pass, then the full pass, the fastest once quickly
    ordered first, and returns the fastest of all: never slower than a plan it ran, ordered."""
    passes: list[tuple[Simulation, bool, float]] = []
    resumed: list[OrderOutcome | None] = []  # what each pass resumed from
    outcomes: list[OrderOutcome] = []  # what each pass returned

    def recorded(cost: CostModel, simulation: Simulation, deadline: float, *, mode: Any,
                 proposed: Any = None, quick: bool = False,
                 resume: OrderOutcome | None = None) -> OrderOutcome:
        outcome = order_transfers(cost, simulation, deadline, mode=mode, proposed=proposed,
                                  quick=quick, resume=resume)
        passes.append((simulation, quick, outcome.simulation.estimate.step_time_us))
        resumed.append(resume)
        outcomes.append(outcome)
        return outcome

    monkeypatch.setattr(api, "order_transfers", recorded)
    doc = layered(1, 40, 3.0)
    plan = place(doc, small_cluster(4, "sequential"), options={"time_limit_s": 2})
    kinds = [quick for _, quick, _ in passes]
    quick, full = passes[:kinds.index(False)], passes[kinds.index(False):]
    assert not any(q for _, q, _ in full)  # every quick pass before the first full one
    placed = [(tuple(sim.device_of), *map(tuple, sim.orders)) for sim, _, _ in quick]
    assert len(placed) == len(set(placed)) >= 2  # the plans it passed over too
    # plenty of time on 40 ops: every plan is then fully ordered, fastest quick one first
    fastest_first = sorted(range(len(quick)), key=lambda i: quick[i][2])
    assert [sim for sim, _, _ in full] == [quick[i][0] for i in fastest_first]
    # each full pass resumes from its plan's quick pass
    assert [id(r) for r in resumed[len(quick):]] == \
        [id(outcomes[i]) for i in fastest_first]
    assert plan.estimate.step_time_us == min(step for _, _, step in passes)


def _fifo_plan(case: tuple[dict, dict]) -> tuple[Graph, Cluster, CostModel, list[int],
                                                list[list[int]]]:
    """m-ETF's FIFO plan of ``case`` on its cluster without memory limits: graph, cluster,
    cost model, device per op, order per device."""
    doc, cluster = case
    devices = cluster["devices"]
    if isinstance(devices, list):
        devices = [{k: v for k, v in d.items() if k != "memory_bytes"} for d in devices]
    else:
        devices = {"count": devices["count"]}
    plan = place(doc, {**cluster, "devices": devices}, "m-etf",
                 {"allow_single": False, "transfer_order": "fifo", "forward_only": False})
    g, c = load_graph(doc), Cluster.parse({**cluster, "devices": devices})
    return (g, c, CostModel(g, c), *index_plan(g, plan, c))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.one_of(st.tuples(dags(), clusters().map(_sequential)), generated()),
       seed=st.integers(0, 2**32 - 1))
def test_dispatch_books_an_order_that_replays_to_the_same_times(case: tuple[dict, dict],
                                                                seed: int) -> None:
    """The heuristic's dispatch (urgent first when channels are free) finds an order; written
    out as a transfer order it replays to the very same times. Between two messages of one
    sender and receiver, where the one booked later was issued before the other started, the
    one booked first is the more urgent (on a tie, the one issued first)."""
    g, c, cost, device_of, orders = _fifo_plan(case)
    rng = random.Random(seed)
    urgency = {key: rng.choice([0.0, 1.0, rng.random()]) for key in plan_transfers(cost,
                                                                                 device_of)}
    dispatched = replay(g, c, device_of, orders, cost, priority=urgency)
    listed = replay(g, c, device_of, orders, cost, dispatched.booked_order())
    assert listed.estimate == dispatched.estimate
    assert (listed.start, listed.end) == (dispatched.start, dispatched.end)
    booked = dispatched.transfers
    issued = {key: dispatched.end[key[0]] for key in booked.key}
    for a, b in itertools.combinations(range(len(booked)), 2):  # a booked before b
        first, then = booked.key[a], booked.key[b]
        same_pair = (booked.src_device[a], booked.dst_device[a]) == \
            (booked.src_device[b], booked.dst_device[b])
        if same_pair and issued[then] < booked.start[a]:
            assert (urgency[first], issued[first]) <= (urgency[then], issued[then])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.one_of(st.tuples(dags(), clusters().map(_sequential)), generated()))
def test_no_message_is_issued_after_its_latest_start_in_the_fifo_replay(
        case: tuple[dict, dict]) -> None:
    """Why the full pass has no sort by the later of issue and latest start: in the FIFO
    replay a message starts after its issue and no later than its latest start (step time −
    its bottom level), so that sort is the ``latest-start`` one."""
    g, c, cost, device_of, orders = _fifo_plan(case)
    fifo = replay(g, c, device_of, orders, cost)
    search = ordering._Search(cost, fifo, math.inf)
    bottom = search._bottom_levels(fifo)
    step = fifo.estimate.step_time_us
    starts = dict(zip(fifo.transfers.key, fifo.transfers.start, strict=True))
    for j, key in enumerate(search.keys):
        issued = fifo.end[key[0]]
        assert issued <= starts[key] <= step - bottom[search.n + j] + 1e-9 * max(step, 1.0)
