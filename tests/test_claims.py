"""Every claim a plan makes holds for the request, not for a model of it.

Random tiny requests (:func:`baechi.testing.tiny_request`: colocation groups, pins,
forward/backward pairs, memory limits, devices of two speeds, both network modes), placed
with the default options (the reduction pipeline on) by every algorithm that claims something
and by the others, checked by :func:`baechi.testing.claim_violations` against brute force:
the plan is valid and replays to its estimate, no plan beats brute force, ``bound_us`` is a
bound of every valid plan, ``optimal`` only where the plan is the best. ``bench/claims.py``
runs the same check over 10,000 requests.
"""

from __future__ import annotations

import random

import pytest
from helpers import edge, graph_doc, op
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baechi import InvalidRequest, place
from baechi.errors import InfeasiblePlacement
from baechi.testing import claim_violations, tiny_request

STEP_TIME_ALGORITHMS = ("exact", "auto", "m-etf", "m-sct", "m-topo", "m-fill", "single")
THROUGHPUT_ALGORITHMS = ("throughput-cpsat", "throughput-contiguous")


def placed(doc: dict, cluster: dict, algorithm: str, objective: str = "step_time"):
    """The plan, or ``None`` when the placer found none within memory (no claim made)."""
    try:
        return place(doc, cluster, algorithm, {"time_limit_s": 2}, objective=objective)
    except InfeasiblePlacement:
        return None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), algorithm=st.sampled_from(STEP_TIME_ALGORITHMS))
def test_step_time_claims_hold_against_brute_force(seed: int, algorithm: str) -> None:
    doc, cluster = tiny_request(random.Random(seed))
    plan = placed(doc, cluster, algorithm)
    if plan is not None:
        assert claim_violations(doc, cluster, plan) == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), algorithm=st.sampled_from(THROUGHPUT_ALGORITHMS))
def test_throughput_claims_hold_against_brute_force(seed: int, algorithm: str) -> None:
    doc, cluster = tiny_request(random.Random(seed))
    plan = placed(doc, cluster, algorithm, "throughput")
    if plan is not None:
        assert claim_violations(doc, cluster, plan, "throughput") == []


def test_named_exact_proves_small_graphs_with_default_options() -> None:
    """Below its size limit, named ``exact`` places the graph itself: a proof for every op."""
    proved = 0
    for seed in range(12):
        doc, cluster = tiny_request(random.Random(seed))
        cluster["network"]["mode"] = "parallel"  # the model is the simulator's there
        for device in cluster["devices"]:
            device["memory_bytes"] = None
        plan = place(doc, cluster, "exact", {"time_limit_s": 10})
        assert "graph itself" in plan.stats.pipeline_note
        assert claim_violations(doc, cluster, plan) == []
        proved += bool(plan.stats.optimal)
    assert proved == 12


def test_pins_break_the_symmetry_of_devices_alike() -> None:
    """a pinned to /GPU:1 makes /GPU:1 unlike /GPU:0: the contiguous split {a, b} | {c, d}
    must stay reachable (it was cut off, and 40 us claimed optimal)."""
    doc = graph_doc([op("a", 10, device="/GPU:1"), op("b", 10), op("c", 10), op("d", 10)],
                    [edge("a", "b", 10), edge("b", "c", 10), edge("c", "d", 10)])
    cluster = {"devices": {"count": 2}, "network": {"latency_us": 0, "bandwidth_gbps": 10}}
    plan = place(doc, cluster, "throughput-contiguous", objective="throughput")
    assert plan.estimate.time_per_sample_us == pytest.approx(20.001)
    assert plan.stats.contiguous_optimal
    assert claim_violations(doc, cluster, plan, "throughput") == []


def test_a_split_the_exact_memory_rule_admits_is_found() -> None:
    """The solver's memory model keeps f's output for two micro-batches on every device
    (200 B > 150 B); the exact rule keeps it for one on a single stage (101 B fits)."""
    doc = graph_doc([op("f", 1, output_bytes=100), op("l", 1, output_bytes=1),
                     op("b", 1, forward_op="f")],
                    [edge("f", "l", 100), edge("l", "b", 1), edge("f", "b", 100)])
    cluster = {"devices": {"count": 2, "memory_bytes": 150},
               "network": {"latency_us": 1, "bandwidth_gbps": 1}}
    for algorithm in ("throughput-contiguous", "throughput-cpsat", "auto"):
        plan = place(doc, cluster, algorithm, objective="throughput")
        assert plan.stats.throughput_memory_ok
        assert plan.estimate.time_per_sample_us == 3.0
        assert claim_violations(doc, cluster, plan, "throughput") == []


def test_rounding_never_puts_the_bound_above_the_plan() -> None:
    doc = graph_doc([op("a", 59.99999997), op("b", 1)], [])
    plan = place(doc, {"devices": {"count": 2}}, "exact")
    assert plan.stats.bound_us <= plan.estimate.step_time_us == 59.99999997
    assert plan.stats.optimal


def test_auto_honours_allow_single() -> None:
    """With ``allow_single`` off, ``auto`` neither tries the single-device plan nor the
    "single" blind start (a repair of it under memory limits)."""
    doc = graph_doc([op(n, 10, output_bytes=100) for n in "abcd"],
                    [edge("a", "b", 100), edge("b", "c", 100), edge("a", "d", 100)])
    for memory in (None, 350):
        cluster = {"devices": {"count": 2, "memory_bytes": memory},
                   "network": {"latency_us": 1, "bandwidth_gbps": 1}}
        default = place(doc, cluster, options={"time_limit_s": 2})
        off = place(doc, cluster, options={"time_limit_s": 2, "allow_single": False})
        if memory is None:
            assert any(c.algorithm == "single" for c in default.stats.candidates)
        assert all(c.algorithm != "single" and not c.note.startswith("single")
                   for c in off.stats.candidates)
        assert off.stats.chosen.algorithm != "single"
        assert claim_violations(doc, cluster, off) == []


def test_the_throughput_objective_refuses_step_time_options() -> None:
    """portfolio (a step-time portfolio) is refused; the reduction and transfer-order
    switches pass at their defaults (which do not apply: the objective places the units as
    they are) and at what the objective does."""
    doc = graph_doc([op("a", 1), op("b", 1)], [edge("a", "b", 1)])
    with pytest.raises(InvalidRequest, match="options.portfolio: .* objective 'step_time'"):
        place(doc, {"devices": {"count": 2}}, options={"portfolio": True},
              objective="throughput")
    for options in ({"fusion": True, "co_placement": True, "transfer_order": "model-aware"},
                    {"fusion": False, "co_placement": False, "transfer_order": "fifo",
                     "portfolio": False}):
        plan = place(doc, {"devices": {"count": 2}}, options=options, objective="throughput")
        assert plan.stats.deadline_reached is False and "place" in plan.stats.phases


def test_the_throughput_objective_honours_allow_single() -> None:
    doc = graph_doc([op("a", 10, output_bytes=10**6), op("b", 10)], [edge("a", "b", 10**6)])
    cluster = {"devices": {"count": 2}, "network": {"latency_us": 100, "bandwidth_gbps": 1}}
    together = place(doc, cluster, objective="throughput")
    assert len(set(together.placement.values())) == 1  # one device is fastest here
    apart = place(doc, cluster, options={"allow_single": False}, objective="throughput")
    assert len(set(apart.placement.values())) == 2
    assert claim_violations(doc, cluster, apart, "throughput") == []
