"""Placement algorithms: invariants on random DAGs (hypothesis) and hand-checked cases."""

from __future__ import annotations

import itertools
import math
import time

import pytest
from helpers import edge, graph_doc, op, two_devices
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baechi import Cluster, InfeasiblePlacement, InvalidRequest, load_graph, place, simulate
from baechi.algorithms import ALGORITHMS
from baechi.algorithms.base import Problem
from baechi.algorithms.etf import ListScheduler, place_eft, place_etf, remaining_path
from baechi.costmodel import CostModel
from baechi.graph import Graph
from baechi.grouping import colocation_units
from baechi.simulate import single_device_run
from baechi.testing import GENERATORS

PLACERS = ["auto", *ALGORITHMS]  # the step-time objective's placers


@st.composite
def dags(draw: st.DrawFn) -> dict:
    n = draw(st.integers(1, 24))
    groups = draw(st.integers(0, 3))
    ops = []
    for i in range(n):
        fields = {
            "output_bytes": draw(st.integers(0, 4000)),
            "temp_bytes": draw(st.sampled_from([0, 0, 500])),
            "persistent_bytes": draw(st.sampled_from([0, 0, 1000, 3000])),
        }
        if groups and draw(st.integers(0, 3)) == 0:
            fields["colocation_group"] = f"g{draw(st.integers(0, groups - 1))}"
        # subnormal times (< 1e-307 µs) only exercise float underflow in the bounds
        ops.append(op(f"o{i}", draw(st.floats(0, 100, allow_nan=False, allow_subnormal=False)),
                      **fields))
    edges = []
    for j in range(1, n):
        for i in draw(st.sets(st.integers(0, j - 1), max_size=3)):
            control = draw(st.integers(0, 5)) == 0
            edges.append(edge(f"o{i}", f"o{j}", 0 if control else draw(st.integers(0, 6000)),
                              control=control, tensor=f"o{i}:{draw(st.integers(0, 1))}"))
    return graph_doc(ops, edges)


@st.composite
def clusters(draw: st.DrawFn) -> dict:
    count = draw(st.integers(1, 4))
    memory = draw(st.sampled_from([None, 6000, 15000, 40000]))
    devices = [{"name": f"/GPU:{i}", "speed": draw(st.sampled_from([1.0, 1.0, 2.0])),
                **({"memory_bytes": memory} if memory else {})} for i in range(count)]
    network = {"latency_us": draw(st.sampled_from([0, 5, 134])),
               "bandwidth_gbps": draw(st.sampled_from([0.01, 5.7, 150])),
               "mode": draw(st.sampled_from(["sequential", "parallel"]))}
    return {"devices": devices, "network": network}


def check_plan(doc: dict, cluster: dict, plan) -> None:
    """Every invariant a returned plan must satisfy."""
    names = {o["name"] for o in doc["ops"]}
    assert set(plan.placement) == names
    assert sorted(n for order in plan.order.values() for n in order) == sorted(names)
    est = plan.estimate
    assert est.memory_ok
    for device in cluster["devices"]:
        limit = device.get("memory_bytes")
        assert limit is None or est.peak_memory_bytes[device["name"]] <= limit
    group_device: dict[str, str] = {}
    for o in doc["ops"]:
        if "colocation_group" in o:
            d = group_device.setdefault(o["colocation_group"], plan.placement[o["name"]])
            assert plan.placement[o["name"]] == d
    assert est.step_time_us >= est.lower_bound_us * (1 - 1e-9)
    assert simulate(doc, plan.model_dump()) == est  # the reported estimate IS the replay
    # the memory floor used to reject requests up front is a true lower bound of every peak
    graph = load_graph(doc)
    running = CostModel(graph, Cluster.parse(cluster)).op_running_bytes
    for device, peak in est.peak_memory_bytes.items():
        ops = [i for i, name in enumerate(graph.names) if plan.placement[name] == device]
        persistent = sum(graph.persistent_bytes[i] for i in ops)
        assert peak >= persistent + max((running[i] for i in ops), default=0)


@pytest.mark.parametrize("algorithm", PLACERS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=dags(), cluster=clusters(), pipeline=st.booleans())
def test_plans_respect_every_invariant(algorithm: str, doc: dict, cluster: dict,
                                       pipeline: bool) -> None:
    # a short deadline keeps the solver's and local search's examples quick
    options = {"allow_single": False, "co_placement": pipeline, "fusion": pipeline,
               "time_limit_s": 0.5}
    unlimited = all("memory_bytes" not in d for d in cluster["devices"])
    try:
        plan = place(doc, cluster, algorithm, options)
    except InfeasiblePlacement as exc:
        assert not unlimited, "with unlimited memory a plan always exists"
        assert "bytes" in exc.message
        # and never when one device holds the whole step (tests/test_auto.py, every option)
        graph, parsed = load_graph(doc), Cluster.parse(cluster)
        assert all(single_device_run(graph, parsed, i)[1] > (d.memory_bytes or math.inf)
                   for i, d in enumerate(parsed.devices))
        return
    check_plan(doc, cluster, plan)


def etf_by_definition(graph: Graph, cluster: Cluster, *, earliest_finish: bool = False
                      ) -> tuple[list[int], list[list[int]]]:
    """m-ETF without memory limits as its definition reads, with no heaps and no lazy keys:
    at each step, of every ready op on every device it may go to (its unit's once placed),
    the earliest start (the device free and every input there, the channels as they are
    now), then the longest remaining path, the canonical order, the device; then its
    messages are booked one after another and it runs. ``earliest_finish``: m-EFT, which
    takes each device's pair so chosen and, of those, the one that finishes first."""
    units = colocation_units(graph, cluster)
    problem = Problem.of(graph, cluster, units)
    cost, rank, topo = problem.cost, remaining_path(problem), graph.topo_position
    n, devices = len(graph), len(cluster.devices)
    device_of, end, done = [-1] * n, [0.0] * n, [False] * n
    free, channel = [0.0] * devices, [0.0] * devices
    sent: dict = {}
    unit_device = list(units.pin)
    orders: list[list[int]] = [[] for _ in range(devices)]

    def arrival(k: int, d: int, book: bool) -> float:
        src = graph.edge_src[k]
        sd = device_of[src]
        if sd == d:
            return end[src]
        key = cost.transfer_key(k, d)
        if key in sent:
            return sent[key]
        begin = end[src]
        if cost.sequential:
            begin = max(begin, channel[sd], channel[d])
        arrives = begin + cost.transfer_us(k, sd, d)
        if book:
            sent[key] = arrives
            if cost.sequential:
                channel[sd] = channel[d] = arrives
        return arrives

    for _ in range(n):
        ready = [op for op in range(n) if not done[op]
                 and all(done[graph.edge_src[k]] for k in graph.in_edges[op])]
        pairs = [(max([free[d], *(arrival(k, d, False) for k in graph.in_edges[op])]),
                  -rank[op], topo[op], d, op)
                 for op in ready
                 for d in ([unit_device[units.unit_of[op]]] if unit_device[units.unit_of[op]] >= 0
                           else problem.devices_for(units.unit_of[op]))]
        if earliest_finish:
            bests = [min(p for p in pairs if p[3] == d) for d in {p[3] for p in pairs}]
            _, _, _, d, op = min(bests, key=lambda p: (p[0] + cost.op_us[p[3]][p[4]], p))
        else:
            _, _, _, d, op = min(pairs)
        start = max([free[d], *(arrival(k, d, True) for k in graph.in_edges[op])])
        unit_device[units.unit_of[op]] = device_of[op] = d
        end[op] = free[d] = start + cost.op_us[d][op]
        done[op] = True
        orders[d].append(op)
    return device_of, orders


@settings(max_examples=80, deadline=None)
@given(doc=dags(), cluster=clusters())
def test_etf_chooses_as_its_definition(doc: dict, cluster: dict) -> None:
    # the heaps, lazy re-keys and channel-bound entries choose what the definition chooses
    cluster = {"devices": [{k: v for k, v in d.items() if k != "memory_bytes"}
                           for d in cluster["devices"]], "network": cluster["network"]}
    graph, parsed = load_graph(doc), Cluster.parse(cluster)
    placed = place_etf(Problem.of(graph, parsed, colocation_units(graph, parsed)))
    assert (placed.device_of, placed.orders) == etf_by_definition(graph, parsed)


@settings(max_examples=80, deadline=None)
@given(doc=dags(), cluster=clusters(), speeds=st.lists(st.sampled_from([0.25, 0.5, 1.0, 2.0]),
                                                       min_size=4, max_size=4))
def test_eft_chooses_as_its_definition(doc: dict, cluster: dict, speeds: list[float]) -> None:
    # m-EFT on the same heaps: each device's m-ETF choice, the one finishing first
    cluster = {"devices": [{**{k: v for k, v in d.items() if k != "memory_bytes"},
                            "speed": speeds[i]} for i, d in enumerate(cluster["devices"])],
               "network": cluster["network"]}
    graph, parsed = load_graph(doc), Cluster.parse(cluster)
    placed = place_eft(Problem.of(graph, parsed, colocation_units(graph, parsed)))
    assert (placed.device_of, placed.orders) == etf_by_definition(graph, parsed,
                                                                  earliest_finish=True)


@pytest.mark.parametrize(("seed", "ops", "devices"), [(16, 20, 3), (2, 40, 2), (7, 300, 4)])
def test_etf_follows_busy_channels_as_its_definition(seed: int, ops: int, devices: int) -> None:
    # ready sinks wait for busy channels (layered graphs, PCIe): they go to the
    # channel-bound heaps, which choose as the definition does; on the two small graphs,
    # only while a message sent for another reader re-keys the ops that wait for it
    graph = load_graph(GENERATORS["layered"](seed, ops, 0.3))
    cluster = Cluster.uniform(devices, latency_us=134, bandwidth_gbps=5.7)
    scheduler = ListScheduler(Problem.of(graph, cluster, colocation_units(graph, cluster)))
    placed = scheduler.run()
    assert scheduler.serials > 0  # the channel-bound heaps took entries
    assert (placed.device_of, placed.orders) == etf_by_definition(graph, cluster)


@settings(max_examples=60, deadline=None)
@given(doc=dags(), cluster=clusters())
def test_etf_schedule_is_the_simulators_in_parallel_mode(doc: dict, cluster: dict) -> None:
    cluster = {"devices": [{k: v for k, v in d.items() if k != "memory_bytes"}
                           for d in cluster["devices"]],
               "network": {**cluster["network"], "mode": "parallel"}}
    options = {"allow_single": False, "co_placement": False, "fusion": False}
    plan = place(doc, cluster, "m-etf", options)
    assert plan.stats.placer_step_time_us == pytest.approx(plan.estimate.step_time_us,
                                                              rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(doc=dags(), cluster=clusters())
def test_never_worse_than_one_device(doc: dict, cluster: dict) -> None:
    try:
        plan = place(doc, cluster, "m-etf")
    except InfeasiblePlacement:
        return
    est = plan.estimate
    if est.single_device_fits:
        assert est.step_time_us <= est.single_device_us * (1 + 1e-12)


def test_independent_ops_spread_over_devices() -> None:
    doc = graph_doc([op(f"o{i}", 100) for i in range(4)])
    plan = place(doc, two_devices(count=4), "m-etf")
    assert sorted(plan.placement.values()) == ["/GPU:0", "/GPU:1", "/GPU:2", "/GPU:3"]
    assert plan.estimate.step_time_us == 100


def test_etf_breaks_ties_by_longest_remaining_path() -> None:
    # one device: at t=0 both a and b are ready; b heads the longer chain so it goes first
    doc = graph_doc([op("a", 10), op("b", 10), op("c", 50)], [edge("b", "c")])
    plan = place(doc, {"devices": {"count": 1}}, "m-etf")
    assert plan.order["/GPU:0"] == ["b", "a", "c"] or plan.order["/GPU:0"] == ["b", "c", "a"]
    assert plan.order["/GPU:0"][0] == "b"


def test_memory_limits_force_a_split() -> None:
    # each op holds 600 bytes of weights; one device holds 1000
    doc = graph_doc([op(f"o{i}", 10, persistent_bytes=600) for i in range(3)],
                    [edge("o0", "o1", 10), edge("o1", "o2", 10)])
    for algorithm in ("m-topo", "m-etf"):
        plan = place(doc, two_devices(count=3, memory=1000), algorithm)
        assert len(set(plan.placement.values())) == 3
        assert plan.estimate.memory_ok


def test_infeasible_says_what_does_not_fit() -> None:
    doc = graph_doc([op("big", 10, persistent_bytes=5000), op("small", 1)])
    with pytest.raises(InfeasiblePlacement) as info:
        place(doc, two_devices(memory=1000), "m-etf")
    assert "'big'" in info.value.message
    assert info.value.details["missing_bytes"] == 4000
    assert info.value.details["graph_needs_bytes"] >= 5000


def test_pins_are_honoured_and_checked() -> None:
    doc = graph_doc([op("a", 10, device="/GPU:1"), op("b", 10)], [edge("a", "b", 1)])
    for algorithm in PLACERS:
        assert place(doc, two_devices(), algorithm).placement["a"] == "/GPU:1"
    with pytest.raises(InvalidRequest, match="'a'.device: pinned to '/GPU:7'"):
        place(graph_doc([op("a", device="/GPU:7")]), two_devices(), "m-etf")


def test_unknown_algorithm_and_options() -> None:
    doc = graph_doc([op("a")])
    with pytest.raises(InvalidRequest, match="unknown algorithm 'magic'"):
        place(doc, two_devices(), "magic")
    with pytest.raises(InvalidRequest, match="options: turbo"):
        place(doc, two_devices(), "m-etf", {"turbo": True})


def test_empty_graph() -> None:
    plan = place(graph_doc([]), two_devices(), "m-etf")
    assert plan.placement == {} and plan.estimate.step_time_us == 0
    assert not math.isnan(plan.estimate.lower_bound_us)


@settings(max_examples=30, deadline=None)
@given(doc=dags(), cluster=clusters())
def test_portfolio_keeps_the_fastest_candidate(doc: dict, cluster: dict) -> None:
    unreduced = {"co_placement": False, "fusion": False}
    plans = []
    for algorithm, options in (("m-etf", {}), ("m-etf", unreduced), ("m-fill", unreduced),
                               ("m-etf", {"portfolio": True})):
        try:
            plans.append(place(doc, cluster, algorithm, {"allow_single": False, **options}))
        except InfeasiblePlacement:
            return
    if any(p.stats.fallback for p in plans):
        return
    # the portfolio compares FIFO step times; the transfer order comes after
    *candidates, portfolio = (p.estimate.step_time_us if p.stats.fifo_step_time_us is None
                              else p.stats.fifo_step_time_us for p in plans)
    assert portfolio == min(candidates)
    assert plans[-1].estimate.step_time_us <= portfolio
    assert plans[-1].stats.portfolio_step_times_us["reduced"] == candidates[0]


def test_persistent_bytes_over_the_whole_cluster_fail_fast() -> None:
    doc = graph_doc([op(f"w{i}", 1, persistent_bytes=600) for i in range(4)])
    with pytest.raises(InfeasiblePlacement, match="exceed the memory of all 2 devices") as info:
        place(doc, two_devices(memory=1000), "m-etf")
    assert info.value.details["missing_bytes"] == 400


def test_fill_packs_a_chain_that_fits_only_in_segments() -> None:
    # 600 bytes of weights per op, 1000 per device: two ops never share a device
    doc = graph_doc([op(f"o{i}", 10, persistent_bytes=600) for i in range(3)],
                    [edge("o0", "o1", 10), edge("o1", "o2", 10)])
    plan = place(doc, two_devices(count=3, memory=1000), "m-fill")
    assert [plan.placement[f"o{i}"] for i in range(3)] == ["/GPU:0", "/GPU:1", "/GPU:2"]


def test_fill_walks_past_an_op_that_fits_nowhere_and_hands_over_its_plan() -> None:
    """o2's 600 bytes of weights fit on neither device (o0's weights on one, o1's 500-byte
    output held for o2 on the other): m-fill names it, puts it where it is least short, and
    the error carries the plan, which ``run_algorithm`` replays as the run's refused plan (a
    start for repair)."""
    from baechi.algorithms.base import Problem
    from baechi.algorithms.fill import place_fill
    from baechi.grouping import colocation_units
    from baechi.options import Options
    from baechi.placing import Request, run_algorithm

    doc = graph_doc([op("o0", 10, persistent_bytes=600), op("o1", 10, output_bytes=500),
                     op("o2", 10, persistent_bytes=600)],
                    [edge("o0", "o1", 10), edge("o1", "o2", 500)])
    graph, cluster = load_graph(doc), Cluster.parse(two_devices(memory=1000))
    with pytest.raises(InfeasiblePlacement, match="op 'o2' fits on no device") as info:
        place_fill(Problem.of(graph, cluster, colocation_units(graph, cluster)))
    plan = info.value.plan
    assert plan is not None and sorted(op for order in plan.orders for op in order) == [0, 1, 2]
    # 600 + the peak while o1 ran there (its 10-byte input and 500-byte output) - 1000
    assert info.value.details == {"op": "o2", "missing_bytes": 110}
    assert plan.device_of == [0, 1, 1]
    assert "plan" not in info.value.to_dict()
    request = Request.of(graph, cluster, Options(), time.perf_counter(), lambda *_: None)
    run = run_algorithm(request, "m-fill", request.options.without_pipeline())
    assert run.simulation is None and run.error is not None
    assert run.error.message.startswith("m-fill: op 'o2' fits on no device")
    assert run.memory_retries == 0  # a plan its placer knew to overshoot is not placed again
    assert run.refused is run.first_refused is not None
    assert not run.refused.estimate.memory_ok


def test_a_last_resort_retries_memory_past_the_deadline() -> None:
    """m-fill's first plan of this fork-join overshoots a device by 150 bytes and its retry
    with a lower budget fits. As the last resort it runs past the deadline, and so does the
    retry: a request must have a plan when one fits (the retry used to be skipped, and named
    ``exact`` at 2 s had no plan here)."""
    from baechi.options import Options
    from baechi.placing import Request, run_algorithm
    from baechi.testing import small_cluster, with_memory

    graph = load_graph(with_memory(GENERATORS["fork_join"](seed=1, ops=6, ccr=10.0)))
    peak = single_device_run(graph, Cluster.uniform(1))[1]
    cluster = Cluster.parse(small_cluster(2, "sequential", memory_bytes=int(0.6 * peak)))
    options = Options(co_placement=False, fusion=False, time_limit_s=0.001)
    request = Request.of(graph, cluster, options, time.perf_counter() - 1, lambda *_: None)
    assert request.expired()
    past = run_algorithm(request, "m-fill", options)
    assert past.simulation is None and past.memory_retries == 0  # no retry past it...
    run = run_algorithm(request, "m-fill", options, last_resort=True)
    assert run.memory_retries == 1 and run.simulation is not None  # ...but the last resort's
    assert run.simulation.estimate.memory_ok


def test_fallback_chain_ends_with_m_fill_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A placer whose plans never fit: place() tries the unreduced graph, then m-fill."""
    from baechi.algorithms import ALGORITHMS as registry
    from baechi.algorithms.base import Assignment

    def everything_on_first_device(problem):  # type: ignore[no-untyped-def]
        graph = problem.graph
        return Assignment([0] * len(graph), [list(graph.topo)] + [[] for _ in problem.budget[1:]])

    monkeypatch.setitem(registry, "all-on-0", everything_on_first_device)
    doc = graph_doc([op(f"o{i}", 10, persistent_bytes=600) for i in range(3)],
                    [edge("o0", "o1", 10), edge("o1", "o2", 10)])
    plan = place(doc, two_devices(count=3, memory=1000), "all-on-0", {"allow_single": False})
    assert "placed with m-fill" in plan.stats.fallback
    assert plan.estimate.memory_ok and len(set(plan.placement.values())) == 3
    # a fork-join on two 1000-byte devices: every op fits one (o0: 600 persistent + 400
    # output), the weights split (o0 | o1), yet no plan fits (brute force): no bound catches
    # it, no placer can place it
    fork_join = graph_doc(
        [op("o0", 10, persistent_bytes=600, output_bytes=400),
         op("o1", 10, persistent_bytes=300, output_bytes=200),
         op("o2", 10, output_bytes=200), op("o3", 10, output_bytes=200)],
        [edge("o0", "o1", 400), edge("o0", "o2", 400), edge("o1", "o3", 200),
         edge("o2", "o3", 200)])
    with pytest.raises(InfeasiblePlacement, match="no fallback found one either"):
        place(fork_join, two_devices(count=2, memory=1000), "all-on-0", {"allow_single": False})


def _cut_us(problem, device_of: list[int]) -> float:  # type: ignore[no-untyped-def]
    """What m-cut minimises for a contiguous plan: at each change of device along the
    canonical order, the dearest transfer of every earlier op that a later op reads."""
    graph, cost = problem.graph, problem.cost
    position = {op: p for p, op in enumerate(graph.topo)}
    total = 0.0
    for p in range(1, len(graph)):
        if device_of[graph.topo[p]] == device_of[graph.topo[p - 1]]:
            continue
        for src in graph.topo[:p]:
            crossing = [cost.nominal_transfer_us(k) for k in graph.out_edges[src]
                        if not graph.edge_control[k] and position[graph.edge_dst[k]] >= p]
            total += max(crossing, default=0.0)
    return total


@settings(max_examples=150, deadline=None)
@given(doc=dags(), count=st.integers(2, 4), memory=st.sampled_from([6000, 9000, 15000]))
def test_cut_finds_cuts_no_dearer_than_fills_segments(doc: dict, count: int,
                                                      memory: int) -> None:
    """Where m-fill's plan is contiguous, m-cut (whose every split it could choose) finds a
    plan whose cuts cost no more; and it places every op, each device one stretch."""
    from unittest.mock import patch

    from hypothesis import assume

    from baechi.algorithms import cut as cut_module
    from baechi.algorithms.base import Problem
    from baechi.algorithms.cut import place_cut
    from baechi.algorithms.fill import place_fill
    from baechi.grouping import colocation_units

    for o in doc["ops"]:
        o.pop("colocation_group", None)  # one op per unit: a stretch holds whole units
        o["compute_us"] = max(o["compute_us"], 1.0)  # no zero-time op: same accounting
    graph = load_graph(doc)
    cluster = Cluster.parse(two_devices(count=count, memory=memory))
    problem = Problem.of(graph, cluster, colocation_units(graph, cluster))
    try:
        fill = place_fill(problem)
    except InfeasiblePlacement:
        fill = None
    assume(fill is not None and all(
        fill.device_of[a] <= fill.device_of[b] for a, b in itertools.pairwise(graph.topo)))
    # every start position, and on larger graphs a few of them (m-fill's among them)
    for starts in (cut_module.CUT_STARTS, 1):
        with patch.object(cut_module, "CUT_STARTS", starts):
            cut = place_cut(problem)
        devices = [cut.device_of[op] for op in graph.topo]
        assert devices == sorted(devices)  # one stretch per device, in cluster order
        assert sorted(op for order in cut.orders for op in order) == list(range(len(graph)))
        assert _cut_us(problem, cut.device_of) <= _cut_us(problem, fill.device_of) + 1e-6


def _stretch_need(problem, device_of: list[int], d: int) -> int:  # type: ignore[no-untyped-def]
    """What m-cut's accounting says device ``d`` needs for the ops ``device_of`` puts there,
    computed from scratch: its units' persistent bytes, and at each position of the canonical
    order the bytes held while that op would run: every op's temp and output while it runs,
    its output until its last reader, and a received copy from the first reader on ``d``
    until the last reader of its producer's output."""
    graph, cost = problem.graph, problem.cost
    position = {op: p for p, op in enumerate(graph.topo)}
    last = [max([position[graph.edge_dst[k]] for k in graph.out_edges[v]
                 if not graph.edge_control[k]], default=position[v]) for v in range(len(graph))]
    held = [0] * len(graph)
    received: dict[tuple, tuple[int, int, int]] = {}  # message -> (first reader, last, bytes)
    for p, v in enumerate(graph.topo):
        if device_of[v] != d:
            continue
        held[p] += graph.temp_bytes[v] + graph.output_bytes[v]
        for q in range(p + 1, last[v] + 1):
            held[q] += graph.output_bytes[v]
        for k in graph.in_edges[v]:
            src = graph.edge_src[k]
            if not graph.edge_control[k] and device_of[src] != d:
                received.setdefault(cost.transfer_key(k, 0), (p, last[src], graph.edge_bytes[k]))
    for first_reader, until, nbytes in received.values():
        for q in range(first_reader, until + 1):
            held[q] += nbytes
    persistent = sum(graph.persistent_bytes[v] for v in range(len(graph)) if device_of[v] == d)
    return persistent + max(held, default=0)


@settings(max_examples=150, deadline=None)
@given(doc=dags(), count=st.integers(2, 4), memory=st.sampled_from([6000, 9000, 15000, 40000]))
def test_cut_plans_fit_their_accounting_with_whole_units(doc: dict, count: int,
                                                         memory: int) -> None:
    """A unit goes where its first op is, with all its ops (a colocation group's, a forward
    op's backward op): each device's whole share of the plan fits its budget under m-cut's
    accounting, computed from scratch here; each device runs one stretch of the units'
    first positions."""
    from baechi.algorithms.base import Problem
    from baechi.algorithms.cut import place_cut
    from baechi.grouping import colocation_units

    ops = doc["ops"]
    for o in ops:
        o["compute_us"] = max(o["compute_us"], 1.0)  # no zero-time op: one accounting
    for i in range(len(ops) // 4):  # units that span the order, as forward/backward pairs do
        ops[i]["colocation_group"] = ops[-1 - i]["colocation_group"] = f"pair{i}"
    graph = load_graph(doc)
    cluster = Cluster.parse(two_devices(count=count, memory=memory))
    units = colocation_units(graph, cluster)
    problem = Problem.of(graph, cluster, units)
    try:
        plan = place_cut(problem)
    except InfeasiblePlacement:
        return
    for d in range(count):
        assert _stretch_need(problem, plan.device_of, d) <= memory
    firsts = sorted((min(graph.topo.index(v) for v in members), u)
                    for u, members in enumerate(units.members))
    devices = [plan.device_of[units.members[u][0]] for _, u in firsts]
    assert devices == sorted(devices)
    assert all(len({plan.device_of[v] for v in members}) == 1 for members in units.members)


@settings(max_examples=100, deadline=None)
@given(doc=dags(), count=st.integers(2, 4),
       memories=st.lists(st.sampled_from([4000, 6000, 9000, 15000]), min_size=2, max_size=4))
def test_cut_reuses_its_walks_across_budgets(doc: dict, count: int, memories: list[int]) -> None:
    """m-cut keeps its walks in ``Problem.memo`` for the memory retries: placing the same
    problem with other budgets, tighter or looser, in any order, gives the plan (or the
    refusal) that a problem of its own gives."""
    import dataclasses

    from baechi.algorithms.base import Problem
    from baechi.algorithms.cut import MEMO_KEY, place_cut
    from baechi.grouping import colocation_units

    graph = load_graph(doc)
    cluster = Cluster.parse(two_devices(count=count, memory=memories[0]))
    units = colocation_units(graph, cluster)
    kept = Problem.of(graph, cluster, units)

    def outcome(problem: Problem) -> object:
        try:
            plan = place_cut(problem)
        except InfeasiblePlacement as exc:
            return exc.message, exc.details
        return plan.device_of, plan.orders

    for memory in memories:
        kept = dataclasses.replace(kept, budget=[float(memory)] * count)
        fresh = Problem.of(graph, Cluster.parse(two_devices(count=count, memory=memory)),
                           units)
        assert outcome(kept) == outcome(fresh)
    assert MEMO_KEY in kept.memo and not fresh.memo.keys() - {MEMO_KEY}
