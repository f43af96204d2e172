"""``auto``: never worse than its candidates, every plan valid and replayed, the deadline
honoured by every placer, and a plan whenever the whole graph fits on one device."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import DATA
from helpers import edge, graph_doc, op, two_devices
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_algorithms import check_plan, clusters, dags

from baechi import Cluster, InfeasiblePlacement, auto, load_graph, place, simulate
from baechi.algorithms import ALGORITHMS, sct
from baechi.algorithms.base import Problem
from baechi.auto import PORTFOLIO, Entry
from baechi.defaults import DEFAULT_ALGORITHM
from baechi.grouping import colocation_units
from baechi.options import Options
from baechi.placing import ORDERING_SHARE, Request, Run
from baechi.simulate import replay, single_device_run
from baechi.testing import GENERATORS, small_cases, small_cluster, with_memory

ROOT = Path(__file__).resolve().parents[1]
GNMT = ROOT / "examples" / "graphs" / "gnmt_baechi.json"  # bundled: the test never skips

#: The named algorithms ``auto`` runs, but ``exact``: its plan depends on the time it is
#: given (tests/test_exact.py covers it), the heuristics' plans do not.
IN_PORTFOLIO = sorted({e.algorithm for e in PORTFOLIO} & set(ALGORITHMS) - {"exact"}
                      | {"single"})


def test_auto_is_the_default() -> None:
    assert DEFAULT_ALGORITHM == "auto"
    doc = graph_doc([op("a", 5), op("b", 5)], [edge("a", "b")])
    assert place(doc, {"devices": {"count": 2}}).request.algorithm == "auto"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=dags(), cluster=clusters())
def test_auto_is_never_worse_than_a_named_algorithm(doc: dict, cluster: dict) -> None:
    """Every named heuristic of the portfolio, with and without the pipeline, and the
    single-device plan: ``auto``'s plan is at least as fast as each of them. (The
    heuristics take milliseconds here: all of them run well within the 2 s; ``exact`` and
    local search use the rest.)"""
    try:
        plan = place(doc, cluster, "auto", {"time_limit_s": 2})
    except InfeasiblePlacement:
        plan = None
    for algorithm in IN_PORTFOLIO:
        for pipeline in (True, False):
            options = {"co_placement": pipeline, "fusion": pipeline}
            try:
                named = place(doc, cluster, algorithm, options)
            except InfeasiblePlacement:
                continue
            assert plan is not None, f"{algorithm} found a plan, auto did not"
            # up to the rounding of float sums (a plan can end 1 ulp below the lower bound);
            # candidates compete under FIFO channels, then every plan found gets the
            # transfer-order post-pass, as the named one did
            assert _fifo_us(plan) <= _fifo_us(named) * (1 + 1e-12) or \
                plan.stats.transfer_order == "model-aware", (algorithm, pipeline)
            assert plan.estimate.step_time_us <= named.estimate.step_time_us * (1 + 1e-12), (
                algorithm, pipeline)
    if plan is None:
        return
    check_plan(doc, cluster, plan)
    stats = plan.stats
    assert stats.chosen is not None and stats.candidates
    steps = [c.step_time_us for c in stats.candidates if c.step_time_us is not None]
    assert plan.estimate.step_time_us <= min(steps)
    assert plan.estimate.step_time_us <= _fifo_us(plan)  # the transfer-order post-pass
    if not stats.chosen.local_search:
        assert any(c.algorithm == stats.chosen.algorithm and c.pipeline == stats.chosen.pipeline
                   and c.step_time_us == _fifo_us(plan) for c in stats.candidates)


def _fifo_us(plan) -> float:
    """A plan's step time with FIFO channels (before the model-aware transfer order)."""
    fifo = plan.stats.fifo_step_time_us
    return plan.estimate.step_time_us if fifo is None else fifo


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=dags(), cluster=clusters(), algorithm=st.sampled_from(["auto", *ALGORITHMS]),
       pipeline=st.booleans())
def test_a_plan_whenever_the_whole_graph_fits_on_one_device(
    doc: dict, cluster: dict, algorithm: str, pipeline: bool
) -> None:
    """No InfeasiblePlacement when one device holds the whole step (the canonical order's
    peak fits its memory), whatever the algorithm and options."""
    graph = load_graph(doc)
    parsed = Cluster.parse(cluster)
    fits = any(d.memory_bytes is None or single_device_run(graph, parsed, i)[1] <= d.memory_bytes
               for i, d in enumerate(parsed.devices))
    # a short deadline keeps the solver's examples quick (exact under tight memory on 10 ops
    # ran to the default 60 s without a proof); the last resort, m-fill, still runs past it
    options = {"co_placement": pipeline, "fusion": pipeline, "allow_single": pipeline,
               "time_limit_s": 0.5}
    try:
        plan = place(doc, cluster, algorithm, options)
    except InfeasiblePlacement:
        assert not fits, "the whole graph fits on one device, yet no plan"
        return
    check_plan(doc, cluster, plan)


def test_candidates_are_reported_and_the_fastest_kept() -> None:
    # fork-join with slow links: the lower bound (30 µs) is out of reach, so every candidate
    # runs; the best plan keeps everything on one device (40 µs)
    doc = graph_doc([op(n, 10) for n in ("s", "x1", "x2", "t")],
                    [edge("s", "x1"), edge("s", "x2"), edge("x1", "t"), edge("x2", "t")])
    plan = place(doc, {"devices": {"count": 2}, "network": {"latency_us": 100}})
    names = [(c.algorithm, c.pipeline) for c in plan.stats.candidates]
    assert names[0] == ("m-etf", True)  # the first plan is m-ETF's
    assert {(a, p) for a in ("m-etf", "m-topo", "m-sct", "m-fill") for p in (True, False)
            } <= set(names)
    assert ("single", False) in names
    assert plan.estimate.step_time_us == 40.0
    assert plan.stats.deadline_reached is False
    assert simulate(doc, plan) == plan.estimate


def test_auto_stops_at_the_lower_bound() -> None:
    """A plan that meets the lower bound is optimal: no other candidate runs after it."""
    doc = graph_doc([op(f"o{i}", 10) for i in range(4)])  # four independent ops
    plan = place(doc, {"devices": {"count": 4}}, "auto")
    assert plan.estimate.step_time_us == plan.estimate.lower_bound_us == 10.0
    ran = [c.algorithm for c in plan.stats.candidates]
    assert ran == ["m-etf", "single"]  # the rest skipped, no local search


def test_a_plan_above_the_bound_by_more_than_rounding_is_not_optimal() -> None:
    """Found by hypothesis: the pipeline puts an op of 2^-24 µs on the device of a 60 µs
    colocation group, 60.00000006 µs against the bound of 60. A relative slack of 1e-9 called
    that optimal and ``auto`` stopped there, slower than m-ETF unreduced's 60 µs."""
    doc = graph_doc([op("a", 0.0, colocation_group="g"), op("big", 60.0, colocation_group="g"),
                     op("tiny", 2.0**-24), op("c", 0.0, colocation_group="g")],
                    [edge("a", "c", control=True), edge("tiny", "c", control=True)])
    cluster = two_devices(latency=0, bandwidth=0.01)
    assert place(doc, cluster, "m-etf").estimate.step_time_us > 60.0
    plan = place(doc, cluster, "auto", {"time_limit_s": 2})
    assert plan.estimate.step_time_us == plan.estimate.lower_bound_us == 60.0
    assert plan.stats.optimal
    assert plan.stats.candidates[0].step_time_us > 60.0  # the pipeline's plan came first


def test_past_the_deadline_auto_returns_the_last_resorts_plan() -> None:
    """With no time left, the first candidate starts and stops at once; m-fill, the last
    resort (linear), always finishes and answers, then the single-device check; the plan
    says the deadline was reached."""
    ops = [op(f"{c}{i}", 10, output_bytes=100) for c in "ab" for i in range(4)]
    edges = [edge(f"{c}{i}", f"{c}{i + 1}", 100) for c in "ab" for i in range(3)]
    plan = place(graph_doc(ops, edges), {"devices": {"count": 2}}, "auto",
                 {"time_limit_s": 1e-9})
    candidates = plan.stats.candidates
    assert [(c.algorithm, c.pipeline) for c in candidates] == [
        ("m-etf", True), ("m-fill", False), ("single", False)]
    assert candidates[0].step_time_us is None
    assert candidates[0].note == "its share of the time ran out"
    assert plan.stats.chosen.algorithm == "m-fill"
    assert plan.stats.deadline_reached is True
    check_plan(graph_doc(ops, edges), {"devices": [{"name": f"/GPU:{i}"} for i in range(2)]},
               plan)


def test_no_plan_by_the_deadline_says_a_longer_limit_may_find_one() -> None:
    """gnmt_baechi on 4 devices of 600 MiB: m-fill, the last resort, fits no plan, the
    repairs that do were never reached, so the error says the time limit stopped the search
    (with time for them, a plan:
    test_when_no_cheap_entry_fits_m_cut_then_the_first_blind_start_runs_next)."""
    doc = json.loads(GNMT.read_text())
    cluster = {"devices": {"count": 4, "memory_bytes": "600MiB"}}
    with pytest.raises(InfeasiblePlacement, match="within the time limit of 1e-09 s") as info:
        place(doc, cluster, "auto", {"time_limit_s": 1e-9})
    assert info.value.details["deadline_reached"] is True


def test_with_no_plan_before_it_exact_searches_until_the_deadline() -> None:
    """A layered graph of 12 ops on 2 sequential devices at half its single-device peak: no
    heuristic and no repair fits, and CP-SAT neither finds a plan nor proves there is none in
    1 s. Nothing after it needs time, so ``exact`` gets all that is left, not
    :data:`~baechi.auto.EXACT_SHARE` of it (before: the refusal came at 0.69 s of the 0.9 s
    placement may take, saying nothing of the time limit)."""
    doc = with_memory(GENERATORS["layered"](seed=0, ops=12, ccr=1.0))
    peak = single_device_run(load_graph(doc), Cluster.uniform(1))[1]
    cluster = small_cluster(2, "sequential", memory_bytes=peak // 2)
    with pytest.raises(InfeasiblePlacement, match="a longer one may") as info:
        place(doc, cluster, "auto", {"time_limit_s": 1})
    assert info.value.details["deadline_reached"] is True


@pytest.mark.parametrize("algorithm", ["m-etf", "m-sct"])
def test_list_schedulers_stop_when_the_deadline_has_passed(algorithm: str) -> None:
    doc = graph_doc([op(f"o{i}", 10) for i in range(600)],
                    [edge(f"o{i}", f"o{i + 1}") for i in range(599)])
    graph = load_graph(doc)
    cluster = Cluster.uniform(2)
    units = colocation_units(graph, cluster)
    passed = Problem.of(graph, cluster, units, deadline=time.perf_counter() - 1)
    with pytest.raises(InfeasiblePlacement, match="time limit passed") as info:
        ALGORITHMS[algorithm](passed)
    assert info.value.details == {"deadline_reached": True}
    # without a deadline (the default) the same problem is placed
    assert len(ALGORITHMS[algorithm](Problem.of(graph, cluster, units)).device_of) == 600
    assert Problem.of(graph, cluster, units).deadline == math.inf


@pytest.mark.parametrize("algorithm", ["m-etf", "m-sct", "exact"])
def test_named_algorithms_stop_at_the_deadline(algorithm: str) -> None:
    """A named algorithm still placing at the deadline stops (only the last resort, m-fill,
    always finishes), so that the request answers by its deadline; with time it places."""
    ops = [op(f"{c}{i}", 10, output_bytes=100) for c in "ab" for i in range(4)]
    edges = [edge(f"{c}{i}", f"{c}{i + 1}", 100) for c in "ab" for i in range(3)]
    doc, cluster = graph_doc(ops, edges), {"devices": {"count": 2}}
    late = place(doc, cluster, algorithm, {"time_limit_s": 1e-9, "allow_single": False})
    assert late.stats.deadline_reached is True
    if algorithm == "exact":  # its warm start (m-fill's, m-ETF's stopped), not solved
        assert late.stats.solver_status == "NOT_RUN"
    else:
        assert late.stats.fallback == (f"{algorithm} was still placing at the deadline "
                                       "(time_limit_s 1e-09); placed with m-fill")
    assert late.estimate.step_time_us == 80.0  # both chains on one device
    with_time = place(doc, cluster, algorithm, {"allow_single": False})
    assert with_time.stats.fallback is None and with_time.stats.deadline_reached is False
    assert with_time.estimate.step_time_us == 40.0  # a chain per device
    for plan in (late, with_time):
        check_plan(doc, {"devices": [{"name": f"/GPU:{i}"} for i in range(2)]}, plan)


def test_retries_stop_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A placer whose plans never fit: with time, it is retried with tighter budgets on the
    reduced and the unreduced graph before m-fill; past the deadline the retries and the
    unreduced fallback are skipped and m-fill, the last resort, answers at once."""
    from baechi.algorithms.base import Assignment

    def everything_on_first_device(problem: Problem) -> Assignment:
        graph = problem.graph
        return Assignment([0] * len(graph), [list(graph.topo)] + [[] for _ in problem.budget[1:]])

    monkeypatch.setitem(ALGORITHMS, "all-on-0", everything_on_first_device)
    doc = graph_doc([op(f"o{i}", 10, persistent_bytes=600) for i in range(3)],
                    [edge("o0", "o1", 10), edge("o1", "o2", 10)])
    cluster = {"devices": {"count": 3, "memory_bytes": 1000}}
    with_time = place(doc, cluster, "all-on-0", {"time_limit_s": 60, "allow_single": False})
    assert with_time.stats.memory_retries == 8  # 4 on the reduced graph, 4 unreduced
    late = place(doc, cluster, "all-on-0", {"time_limit_s": 1e-9, "allow_single": False})
    assert late.stats.memory_retries == 0
    for plan in (with_time, late):
        assert "placed with m-fill" in (plan.stats.fallback or "")
        assert plan.estimate.memory_ok


def test_ten_thousand_ops_under_tight_memory_answer() -> None:
    """gnmt_baechi replicated 4 times (9,976 ops) on 4 devices at 1200 MiB: auto answers
    with a valid plan at least as fast as m-ETF's."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    from synthetic import replicate

    doc = replicate(json.loads(GNMT.read_text()), 4)
    assert len(doc["ops"]) == 9976
    cluster = {"devices": {"count": 4, "memory_bytes": "1200MiB"},
               "network": {"latency_us": 134, "bandwidth_gbps": 5.7}}
    etf = place(doc, cluster, "m-etf")
    plan = place(doc, cluster, "auto", {"time_limit_s": 3})
    assert plan.estimate.memory_ok
    assert _fifo_us(plan) <= _fifo_us(etf)  # candidates compete under FIFO channels
    assert plan.estimate.step_time_us <= _fifo_us(plan)
    assert simulate(doc, plan) == plan.estimate


def test_when_no_cheap_entry_fits_m_cut_then_the_first_blind_start_runs_next() -> None:
    """gnmt_baechi on 4 devices at 600 MiB (no network): m-ETF, m-TOPO and m-fill find no
    plan within memory. m-cut with the pipeline secures one first (memory first, in tenths of
    a second), then the repair of m-ETF's plan of the reduced graph placed as if memory were
    unlimited runs, before the costlier entries (m-ETF unreduced, m-SCT) take the time, and
    it keeps m-ETF's parallelism: faster than m-cut's plan and than one device."""
    cluster = {"devices": {"count": 4, "memory_bytes": "600MiB"}}
    plan = place(json.loads(GNMT.read_text()), cluster, "auto", {"time_limit_s": 5})
    ran = [(c.algorithm, c.pipeline, c.note) for c in plan.stats.candidates]
    cheap = [("m-etf", True), ("m-topo", True), ("m-topo", False), ("m-fill", False),
             ("m-fill", True)]
    assert [(a, p) for a, p, _ in ran[:5]] == cheap
    assert all(note == auto.NO_FIT for _, _, note in ran[:5])
    assert ran[5][:2] == ("m-cut", True)
    assert ran[6][:2] == ("repair", True)
    assert ran[6][2].startswith("from m-etf's plan placed as if memory were unlimited")
    assert [(a, p) for a, p, _ in ran].index(("m-etf", False)) > 6  # the costlier after it
    cut, repaired = plan.stats.candidates[5].step_time_us, plan.stats.candidates[6].step_time_us
    assert cut is not None and repaired is not None
    assert repaired < cut and repaired < plan.estimate.single_device_us
    assert plan.estimate.memory_ok and plan.estimate.step_time_us <= repaired


@pytest.mark.parametrize("name", ["layered_s0_n10_ccr0.5_d2", "fork_join_s0_n20_ccr1_d4"])
def test_auto_keeps_the_solvers_channel_order_and_its_proof(name: str) -> None:
    """Sequential mode: exact's plan is optimal only in its own channel order (FIFO replays
    it slower); auto, which compares candidates under FIFO, still returns it, proved. On the
    graph itself auto's ``exact`` solves the full model, as named ``exact`` does."""
    case = next(c for c in small_cases(seeds=1, ops=(10, 20), mode="sequential")
                if c.name == name)
    exact = place(case.graph, case.cluster, "exact",
                  {"allow_single": False, "co_placement": False, "fusion": False,
                   "time_limit_s": 10})
    assert exact.stats.optimal and exact.transfer_order is not None
    plan = place(case.graph, case.cluster, options={"time_limit_s": 10})
    assert plan.stats.optimal is True
    assert plan.estimate.step_time_us == exact.estimate.step_time_us
    assert next(c.note for c in plan.stats.candidates if c.algorithm == "exact") == ""
    assert simulate(case.graph, plan).step_time_us == plan.estimate.step_time_us


def test_relaxed_solver_run_is_followed_by_the_full_model(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A relaxed ``exact`` entry (auto's on a reduced graph) proves nothing in sequential
    mode, so a round on the full model follows it; the plan is replayed as returned."""
    monkeypatch.setattr(auto, "PORTFOLIO", (
        Entry("m-etf", True), Entry("exact", True, max_seconds=1, relaxed=True)))
    case = next(c for c in small_cases(seeds=1, ops=(20,), mode="sequential")
                if c.devices == 4 and c.ccr == 3)
    plan = place(case.graph, case.cluster, options={"time_limit_s": 5})
    notes = [c.note for c in plan.stats.candidates if c.algorithm == "exact"]
    assert notes[0] == "relaxed model (no channels)"  # no memory limit: copies count nowhere
    assert notes[1].startswith("again, from")
    assert simulate(case.graph, plan).step_time_us == plan.estimate.step_time_us


def test_exact_solves_the_reduced_graph_first_where_m_etfs_reduced_plan_leads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``if_reduced_leads`` entry runs exactly where the fastest plan so far is m-ETF's
    with the pipeline, ahead of the graph's own by ``REDUCED_LEAD``; it then comes before
    ``exact`` on the graph itself, and the plan returned is never slower than either."""
    monkeypatch.setattr(auto, "PORTFOLIO", (
        Entry("m-etf", True), Entry("m-etf", False),
        Entry("exact", True, max_seconds=0.2, if_reduced_leads=True),
        Entry("exact", False, max_seconds=0.2)))
    outcomes = set()
    for case in small_cases(seeds=1, ops=(20,), mode="sequential"):
        if case.devices != 4 or case.ccr < 1:
            continue
        plan = place(case.graph, case.cluster, options={"time_limit_s": 1})
        steps = {c.pipeline: c.step_time_us for c in plan.stats.candidates[:2]}
        solved = [c.pipeline for c in plan.stats.candidates if c.algorithm == "exact"]
        if not solved:  # a plan met the bound first
            continue
        leads = steps[True] < (1 - auto.REDUCED_LEAD) * steps[False]
        assert solved[0] is leads, case.name
        outcomes.add(leads)
        found = [c.step_time_us for c in plan.stats.candidates if c.step_time_us is not None]
        assert plan.estimate.step_time_us <= min(found)
        assert simulate(case.graph, plan).step_time_us == plan.estimate.step_time_us
    assert outcomes == {True, False}  # both branches seen


def test_a_candidates_own_fallback_is_in_its_note(monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate that placed with another algorithm says so (m-SCT whose LP did not finish
    within its share of the time: m-ETF's plan, which would otherwise pass for m-SCT's)."""
    monkeypatch.setattr(auto, "PORTFOLIO", (Entry("m-etf", True), Entry("m-sct", False)))
    monkeypatch.setattr(sct, "LP_SHARE", 1e-9)  # no time for the LP
    doc = json.loads((DATA / "graphs" / "bert24_training_layer.json").read_text())
    plan = place(doc, two_devices(), options={"time_limit_s": 2})
    note = next(c.note for c in plan.stats.candidates if c.algorithm == "m-sct")
    assert note.startswith("m-sct: LP not solved") and note.endswith("placed with m-etf")


def test_an_entry_is_skipped_where_the_reduction_leaves_more_nodes_than_its_cap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``max_nodes`` skips an entry on a reduction (known from an earlier candidate's) of
    more nodes than that, and runs it on one of as many."""
    doc = json.loads((DATA / "graphs" / "bert24_training_layer.json").read_text())
    nodes = place(doc, two_devices(), "m-etf").stats.nodes[-1].nodes
    assert nodes < len(doc["ops"])  # reduced
    for cap, runs in ((nodes - 1, False), (nodes, True)):
        monkeypatch.setattr(auto, "PORTFOLIO", (
            Entry("m-etf", True), Entry("m-cut", True, max_nodes=cap)))
        plan = place(doc, two_devices(), options={"time_limit_s": 1})
        assert any(c.algorithm == "m-cut" for c in plan.stats.candidates) is runs, cap


def test_time_left_goes_to_the_solver_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """When local search stagnates before the deadline and ``exact`` ran without a proof,
    auto runs it again: first from its own start, then from each faster plan; the plan
    returned is never slower than any of them and ends within the time limit."""
    # exact's share too short for any proof, so every round is unproven
    monkeypatch.setattr(auto, "PORTFOLIO", (
        Entry("m-etf", True), Entry("exact", False, max_seconds=0.01, hinted=True)))
    case = next(c for c in small_cases(seeds=1, ops=(40,), mode="sequential")
                if c.devices == 4 and c.ccr == 10)
    tick = time.perf_counter()
    plan = place(case.graph, case.cluster, options={"time_limit_s": 5})
    assert time.perf_counter() - tick < 5.5
    notes = [c.note for c in plan.stats.candidates if c.algorithm == "exact"]
    assert notes[0] == ""  # the portfolio's run, hinted with m-ETF's plan
    assert notes[1] == "again, from its own start"
    assert all(n in ("again, from its own start", "again, from the best plan") for n in notes[1:])
    steps = [c.step_time_us for c in plan.stats.candidates if c.step_time_us is not None]
    assert plan.stats.fifo_step_time_us <= min(steps)
    assert simulate(case.graph, plan).step_time_us == plan.estimate.step_time_us


def test_max_seconds_caps_an_entry_with_its_memory_retries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry's ``max_seconds`` bounds its whole run: a plan over memory is placed again
    with lower budgets, and each attempt used to get ``max_seconds`` anew (at 60 s, exact
    on pipedream_nasnetalarge reduced, PCIe, 50%: four attempts over memory, 39 s)."""
    granted: list[float] = []  # seconds until the deadline each exact run was given
    original = auto.run_algorithm

    def recording(request: Request, algorithm: str, options: Options, *args: Any,
                  **kwargs: Any) -> Run:
        if algorithm == "exact":
            granted.append(request.deadline - time.perf_counter())
        return original(request, algorithm, options, *args, **kwargs)

    monkeypatch.setattr(auto, "run_algorithm", recording)
    monkeypatch.setattr(auto, "PORTFOLIO", (
        Entry("m-etf", True), Entry("exact", False, max_seconds=0.2)))
    case = next(c for c in small_cases(seeds=1, ops=(40,), mode="sequential")
                if c.devices == 4 and c.ccr == 10)
    # 5 s: no long solve (it needs EXACT_LONG_MIN_S left and has no cap)
    place(case.graph, case.cluster, options={"time_limit_s": 5})
    assert granted and max(granted) <= 0.2


def test_time_left_after_the_rounds_goes_to_one_long_solve(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With at least ``EXACT_LONG_MIN_S`` left once the rounds and restarts are done,
    ``exact`` on the graph itself runs once more, uncapped, hinted with the best plan: until
    the deadline unless it proves the plan optimal. The plan is never slower than any
    candidate and ends within the time limit."""
    monkeypatch.setattr(auto, "EXACT_LONG_MIN_S", 1.0)
    monkeypatch.setattr(auto, "PORTFOLIO", (
        Entry("m-etf", True), Entry("exact", False, max_seconds=0.01, hinted=True)))
    # 64 ops on PCIe: CP-SAT proves no plan optimal within seconds
    doc = json.loads((DATA / "graphs" / "bert24_training_layer.json").read_text())
    cluster = {"devices": {"count": 4}, "network": {"latency_us": 134, "bandwidth_gbps": 5.7}}
    limit_s = 4.0
    tick = time.perf_counter()
    plan = place(doc, cluster, options={"time_limit_s": limit_s})
    elapsed = time.perf_counter() - tick
    assert elapsed < limit_s + 0.5
    exact = [c for c in plan.stats.candidates if c.algorithm == "exact"]
    assert [c.note for c in exact].count("with the time left, from the best plan") == 1
    assert exact[-1].note == "with the time left, from the best plan"
    # unproven (the premise: CP-SAT proves no plan of it within seconds), so the long solve
    # ran until placement's deadline, not capped
    assert not plan.stats.optimal, "premise: no plan of bert24 on PCIe is proved within 4 s"
    assert elapsed > (1 - ORDERING_SHARE) * limit_s - 0.25
    assert exact[-1].seconds > max(c.seconds for c in exact[:-1])
    # the transfer-order post-pass may pick the solver's plan for its own channel order
    steps = [c.step_time_us for c in plan.stats.candidates if c.step_time_us is not None]
    assert plan.estimate.step_time_us <= min(steps)
    assert simulate(load_graph(doc), plan).step_time_us == plan.estimate.step_time_us


def test_restarts_skip_plans_already_searched(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs with the same plan (a repair that needed no move gives m-ETF's) are one
    restart; a plan local search started from is none; the fastest come first."""
    monkeypatch.setattr(auto, "SEARCH_RESTARTS", 3)
    graph = load_graph(graph_doc([op("a", 4), op("b", 3), op("c", 2)],
                                 [edge("a", "b", 8), edge("a", "c", 8)]))
    cluster = Cluster.uniform(2, latency_us=1)

    def run(name: str, device_of: list[int]) -> Run:
        orders = [[v for v in (0, 1, 2) if device_of[v] == d] for d in (0, 1)]
        return Run(name, Options(), None, replay(graph, cluster, device_of, orders))

    same, twin, split, other = (run("m-etf", [0, 0, 0]), run("repair", [0, 0, 0]),
                                run("m-sct", [0, 0, 1]), run("m-fill", [0, 1, 1]))
    searched = {auto._signature(other.simulation)}
    chosen = auto._restarts([split, twin, same, other], searched)
    assert chosen == sorted([split, twin], key=_step)  # not ``same``: ``twin``'s plan
    assert len(searched) == 3  # the restarts are marked searched


def _step(run: Run) -> float:
    assert run.simulation is not None
    return run.simulation.estimate.step_time_us


def test_time_left_goes_to_a_finer_reduction(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``FINER_MIN_S`` left after the rounds and restarts, ``exact`` solves the graph
    reduced with a smaller merge cap (more, smaller nodes than the pipeline's); the plan is
    never slower than any candidate, replays as returned, and ends within the time limit."""
    monkeypatch.setattr(auto, "FINER_MIN_S", 0.5)
    monkeypatch.setattr(auto, "PORTFOLIO", (
        Entry("m-etf", True), Entry("exact", True, max_seconds=0.2, relaxed=True)))
    doc = json.loads((DATA / "graphs" / "bert24_training_layer.json").read_text())
    graph = load_graph(doc)
    peak = single_device_run(graph, Cluster.uniform(1))[1]
    cluster = {"devices": {"count": 4, "memory_bytes": peak // 2},
               "network": {"latency_us": 134, "bandwidth_gbps": 5.7}}
    request = Request.of(graph, Cluster.parse(cluster), Options(), 0.0, lambda *_: None)
    coarse = request.reduction(Options())[0].graph
    finer = request.reduction(Options(), auto.FINER_CAP_SCALE)[0].graph
    assert len(coarse) < len(finer) < len(graph)  # 16 < 24 < 64: the stage applies
    limit_s = 4.0
    tick = time.perf_counter()
    plan = place(doc, cluster, options={"time_limit_s": limit_s})
    assert time.perf_counter() - tick < limit_s + 0.5
    assert not plan.stats.optimal  # 140 ms against a 126 ms bound: the stage has to run
    notes = [c.note for c in plan.stats.candidates if c.algorithm == "exact"]
    assert notes[-1] == ("on a finer reduction (merge cap x0.5); relaxed model (no channels, "
                         "no received copies in memory)")
    steps = [c.step_time_us for c in plan.stats.candidates if c.step_time_us is not None]
    assert plan.estimate.step_time_us <= min(steps)
    assert simulate(graph, plan).step_time_us == plan.estimate.step_time_us


def test_when_m_etfs_plan_overshoots_its_blind_repair_runs_before_the_costlier_entries() -> None:
    """gnmt_baechi on 4 NVLink devices at 75% of its single-device peak: m-ETF's plan
    overshoots memory and only m-fill's fits among the cheap entries (contiguous segments,
    no parallelism). The repair of m-ETF's plan of the reduced graph placed as if memory
    were unlimited runs right after them, before m-cut, m-ETF unreduced and m-SCT take the
    time (on a slow machine they left it none), and beats m-fill's plan."""
    cluster = {"devices": {"count": 4, "memory_bytes": 688_269_312},
               "network": {"latency_us": 10, "bandwidth_gbps": 150}}
    plan = place(json.loads(GNMT.read_text()), cluster, "auto", {"time_limit_s": 5})
    ran = plan.stats.candidates
    assert [(c.algorithm, c.pipeline) for c in ran[:5]] == [
        ("m-etf", True), ("m-topo", True), ("m-topo", False), ("m-fill", False),
        ("m-fill", True)]
    assert ran[0].note == auto.NO_FIT
    fill = ran[3].step_time_us
    assert fill is not None
    assert (ran[5].algorithm, ran[5].pipeline) == ("repair", True)
    assert ran[5].note.startswith("from m-etf's plan placed as if memory were unlimited")
    assert (ran[6].algorithm, ran[6].pipeline) == ("m-cut", True)
    repaired = ran[5].step_time_us
    assert repaired is not None and repaired < fill
    assert plan.estimate.memory_ok and plan.estimate.step_time_us <= repaired


def test_a_candidate_whose_time_ran_out_says_so() -> None:
    """layered_s0_n20_ccr0.1_d3_m50: m-ETF's plan overshoots memory and its retry with less
    memory fits. With the time gone, m-ETF in ``auto`` stops at once and its note says that
    its share of the time ran out (not that nothing fits); m-fill, a last resort, still places
    the graph."""
    case = next(c for c in small_cases(seeds=1, ops=(20,), memory=True)
                if c.name == "layered_s0_n20_ccr0.1_d3_m50")
    assert place(case.graph, case.cluster, "m-etf").stats.memory_retries == 1
    plan = place(case.graph, case.cluster, "auto", {"time_limit_s": 1e-6})
    first, fill = plan.stats.candidates[:2]
    assert (first.algorithm, first.step_time_us) == ("m-etf", None)
    assert first.note == auto.SHARE_RAN_OUT
    assert fill.algorithm == "m-fill" and fill.step_time_us is not None
    assert plan.stats.deadline_reached and plan.estimate.memory_ok


def test_a_solver_run_counts_as_proved_only_when_its_plan_meets_the_bound() -> None:
    """A fork-join of 8 ops, sequential, 2 devices at 60% of its peak: CP-SAT proves its
    model's optimum at the devices' limits (259 µs), but that solution overshoots under the
    simulator and the plan exact returns within memory is slower. ``auto`` must give it
    another round (from the best plan, 345 µs at 2 s where the first run gave 365 µs), which
    it skipped while it read the solver's status as a proof."""
    from baechi.placing import run_algorithm
    from baechi.testing import GENERATORS, small_cluster, with_memory

    graph = load_graph(with_memory(GENERATORS["fork_join"](seed=1, ops=8, ccr=10.0)))
    peak = single_device_run(graph, Cluster.uniform(1))[1]
    cluster = Cluster.parse(small_cluster(2, "sequential", memory_bytes=int(0.6 * peak)))
    options = Options(co_placement=False, fusion=False, time_limit_s=10)
    request = Request.of(graph, cluster, options, time.perf_counter(), lambda *_: None)
    run = run_algorithm(request, "exact", options)
    assert run.algorithm_stats["solver_status"] == "OPTIMAL"
    assert run.simulation is not None and run.assignment is not None
    assert run.simulation.estimate.step_time_us > run.algorithm_stats["bound_us"]
    assert not auto._proved(run)
    unlimited = Request.of(graph, Cluster.parse(small_cluster(2)), options, time.perf_counter(),
                           lambda *_: None)
    proved = run_algorithm(unlimited, "exact", options)
    assert proved.algorithm_stats["optimal"] is True and auto._proved(proved)
