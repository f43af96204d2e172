"""TensorFlow: ``apply_plan(..., enforce_order=True)`` and ``client.measure`` (issue 11).

TensorFlow runs on the CPU split into 4 logical devices (docs/format.md §8), oneDNN off so placed and
unplaced steps compute the same numbers. Plans are hand-written in the plan format (with a
hand-written ``transfer_order`` in the format of docs/format.md §10) for a tiny
two-branch model, plus one engine plan for the bundled CNN. Few steps each: these tests
check what was run, not how fast.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from conftest import TF_DEVICES

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

pytestmark = pytest.mark.tf

DEVICES = TF_DEVICES
STEPS = 2


class Tiny:
    """A two-branch model (two dense branches added, then a head), profiled once."""

    def __init__(self) -> None:
        import keras
        from keras import layers

        from baechi import client

        keras.utils.set_random_seed(1)
        inputs = keras.Input((6,))
        left = layers.Dense(5, activation="relu", name="left")(inputs)
        right = layers.Dense(5, activation="tanh", name="right")(inputs)
        joined = layers.Add(name="join")([left, right])
        outputs = layers.Dense(2, name="head")(joined)
        self.model = keras.Model(inputs, outputs, name="tiny")
        rng = np.random.default_rng(1)
        self.x = rng.standard_normal((4, 6), dtype=np.float32)
        self.y = rng.standard_normal((4, 2), dtype=np.float32)
        self.loss = keras.losses.MeanSquaredError()
        self.optimizer = keras.optimizers.Adam(1e-2)
        self.graph = client.profile(self.model, self.x, self.y, self.loss, self.optimizer,
                                    steps=1, warmup=0)
        self.initial = [v.numpy() for v in self.variables()]

    def variables(self) -> list[Any]:
        return [*self.model.variables, *self.optimizer.variables]

    def restore(self) -> None:
        for variable, value in zip(self.variables(), self.initial, strict=True):
            variable.assign(value)

    def losses(self, step: Any, steps: int = 3) -> list[float]:
        return [float(step(self.x, self.y)) for _ in range(steps)]

    def unplaced_losses(self) -> list[float]:
        import tensorflow as tf

        from baechi.client.tf.train_step import make_train_step

        self.restore()
        return self.losses(tf.function(make_train_step(self.model, self.loss, self.optimizer)))


@pytest.fixture(scope="module")
def tiny(tf: Any) -> Tiny:
    return Tiny()


# ------------------------------------------------------------------ hand-written plans
def device_of(op: dict[str, Any]) -> str:
    """The right branch (its ops, gradients and optimizer slots) on /GPU:1, the rest on 0."""
    names = [op["name"], op.get("colocation_group") or ""]
    return "/GPU:1" if any("right" in name for name in names) else "/GPU:0"


def topological(graph: dict[str, Any], pick_last: bool) -> list[str]:
    """A topological order of the graph: among ready ops, the first or the last made ready."""
    successors: dict[str, list[str]] = defaultdict(list)
    indegree = {op["name"]: 0 for op in graph["ops"]}
    for edge in graph["edges"]:
        successors[edge["src"]].append(edge["dst"])
        indegree[edge["dst"]] += 1
    ready = [name for name, degree in indegree.items() if degree == 0]
    order = []
    while ready:
        name = ready.pop() if pick_last else ready.pop(0)
        order.append(name)
        for target in successors[name]:
            indegree[target] -= 1
            if indegree[target] == 0:
                ready.append(target)
    assert len(order) == len(indegree), "the profiled graph has a cycle"
    return order


def hand_plan(graph: dict[str, Any], pick_last: bool = False,
              transfers: bool = False) -> dict[str, Any]:
    """A two-device plan whose device orders follow one topological order of the graph."""
    placement = {op["name"]: device_of(op) for op in graph["ops"]}
    order: dict[str, list[str]] = {"/GPU:0": [], "/GPU:1": []}
    position = {}
    for i, name in enumerate(topological(graph, pick_last)):
        order[placement[name]].append(name)
        position[name] = i
    plan = {"format": "baechi.plan/v1", "placement": placement, "order": order,
            "request": {"algorithm": "hand", "cluster": {"devices": {"count": 2}}},
            "estimate": {"step_time_us": 1234.5}}
    if transfers:
        plan["transfer_order"] = transfer_order(graph, placement, position)
    return plan


def transfer_order(graph: dict[str, Any], placement: dict[str, str],
                   position: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
    """Every cross-device data tensor once per receiving device, in its producer's order,
    listed on the sender's and on the receiver's channel (docs/format.md §10)."""
    kinds = {op["name"]: op["type"] for op in graph["ops"]}
    messages = {}
    for edge in graph["edges"]:
        src, dst = edge["src"], edge["dst"]
        if edge.get("control") or placement[src] == placement[dst]:
            continue
        if kinds[src] == "VarHandleOp":
            continue  # a variable's handle: colocated readers, not a transfer of data
        key = (edge["tensor"], placement[dst])
        messages[key] = {"src": src, "tensor": edge["tensor"], "bytes": edge["bytes"],
                         "dst": placement[dst]}
    channels: dict[str, list[dict[str, Any]]] = {"/GPU:0": [], "/GPU:1": []}
    for message in sorted(messages.values(), key=lambda m: position[m["src"]]):
        channels[placement[message["src"]]].append(message)
        channels[message["dst"]].append(message)
    return channels


def placed_losses(t: Tiny, plan: Any, **kwargs: Any) -> tuple[list[float], Any]:
    from baechi import client

    t.restore()
    applied = client.apply_plan(t.model, plan, optimizer=t.optimizer, **kwargs)
    return t.losses(applied.train_step(t.loss)), applied


# ---------------------------------------------------------------------------- apply_plan
def test_enforced_order_same_losses_and_edges(tiny: Tiny) -> None:
    base = tiny.unplaced_losses()
    plan = hand_plan(tiny.graph, transfers=True)
    placed, applied = placed_losses(tiny, plan)
    assert placed == base  # bit-identical
    report = applied.enforcement
    assert report is not None and report.order_edges > 0
    assert report.order_edges_skipped == report.transfer_edges_skipped == 0
    # Every consecutive pair of ordered ops is ordered, by a new or an existing edge. Absent
    # ops are the variables (captured, not created by the step); constants are left free.
    assert (report.order_edges + report.order_edges_present + report.order_edges_merged
            == report.ops_ordered - 2)
    variables = sum(1 for op in tiny.graph["ops"] if op["type"] == "VarHandleOp")
    assert report.ops_absent >= variables
    constants = {op["name"] for op in tiny.graph["ops"] if op["type"] == "Const"}
    assert constants and constants <= report.foldable
    assert report.ops_ordered + report.ops_absent + len(report.foldable) >= len(plan["placement"])
    # Each listed transfer crossing the devices is routed through an identity on its receiver.
    listed = {(e["tensor"], e["dst"]) for c in plan["transfer_order"].values() for e in c}
    assert report.transfers_routed == len(listed) - len(report.transfers_absent) > 0
    assert report.transfer_edges > 0


def test_enforcement_off_adds_nothing(tiny: Tiny) -> None:
    plan = hand_plan(tiny.graph, transfers=True)
    _, applied = placed_losses(tiny, plan, enforce_order=False)
    assert applied.enforcement is None
    assert applied.order is not None  # still known, for measure


def test_an_order_against_the_data_flow_is_skipped_not_deadlocked(tiny: Tiny) -> None:
    base = tiny.unplaced_losses()
    plan = hand_plan(tiny.graph)
    plan["order"] = {device: ops[::-1] for device, ops in plan["order"].items()}
    placed, applied = placed_losses(tiny, plan)
    assert placed == base
    report = applied.enforcement
    assert report.order_edges_skipped > 0
    assert report.skipped  # named, for diagnosis


def test_plan_order_errors_name_the_op(tiny: Tiny) -> None:
    from baechi import client

    plan = hand_plan(tiny.graph)
    op = plan["order"]["/GPU:1"][0]
    plan["order"]["/GPU:0"].append(op)
    with pytest.raises(client.InvalidInput, match=f"order of '/GPU:0' lists '{op}'"):
        client.apply_plan(tiny.model, plan, optimizer=tiny.optimizer)
    plan = hand_plan(tiny.graph, transfers=True)
    plan["transfer_order"]["/GPU:0"].append({"src": "no/such/op", "dst": "/GPU:1"})
    with pytest.raises(client.InvalidInput, match="no/such/op"):
        client.apply_plan(tiny.model, plan, optimizer=tiny.optimizer)
    plan["transfer_order"] = {"/GPU:0": [{"dst": "/GPU:1"}]}
    with pytest.raises(client.InvalidInput, match=r"transfer_order\['/GPU:0'\]\[0\]"):
        client.apply_plan(tiny.model, plan, optimizer=tiny.optimizer)


# ------------------------------------------------------------------------------- measure
def test_measure_reports_against_a_hand_plan(tiny: Tiny) -> None:
    from baechi import client

    plan = hand_plan(tiny.graph, transfers=True)
    before = [v.numpy() for v in tiny.variables()]
    devices_before = [v.value.device for v in tiny.variables()]
    report = client.measure(tiny.model, tiny.x, tiny.y, plan, steps=STEPS, loss=tiny.loss,
                            optimizer=tiny.optimizer)
    # measure runs copies: the model's values and devices are as they were.
    for a, b in zip(before, [v.numpy() for v in tiny.variables()], strict=True):
        np.testing.assert_array_equal(a, b)
    assert devices_before == [v.value.device for v in tiny.variables()]

    assert report.enforce_order and report.steps == STEPS
    assert report.predicted_step_us == 1234.5
    computed = {op["name"] for op in tiny.graph["ops"] if op["type"] != "VarHandleOp"}
    assert 0 < report.ops_planned <= len(computed)
    # Rewrites are off: every planned op of the trace executes, on its planned device.
    assert report.ops_observed == STEPS * report.ops_planned
    assert report.ops_observed_on_planned_device == report.ops_observed
    assert report.ops_on_planned_device == 1.0 and not report.off_device
    # One pair per consecutive ordered ops of each of the 2 devices, per step.
    assert 0 < report.ops_unordered < report.ops_planned
    assert report.pairs == STEPS * (report.ops_planned - report.ops_unordered - 2)
    assert report.pairs_in_order == report.pairs and report.order_agreement == 1.0
    assert set(report.device_busy_us) >= {"/GPU:0", "/GPU:1"}
    assert all(us > 0 for us in report.device_busy_us.values())
    assert report.measured_step_us > max(report.device_busy_us.values()) * 0.5
    assert report.transfers_routed > 0 and report.transfer_edges > 0
    assert report.order_edges > 0 and report.order_edges_skipped == 0

    free = report.compared
    assert free is not None and not free.enforce_order
    assert free.order_edges == free.transfers_routed == 0
    assert free.ops_planned == report.ops_planned and free.pairs == report.pairs
    assert free.ops_on_planned_device == 1.0
    text = report.table()
    assert "consecutive pairs in plan order" in text and "100.0%" in text


def test_enforcement_imposes_an_unusual_order(tiny: Tiny) -> None:
    """A valid order TensorFlow would not pick by itself is followed only when enforced.

    TensorFlow's executor runs the op made ready last first (inline, depth-first); a
    breadth-first topological order (the first made ready first) disagrees with it on most
    consecutive pairs (about 3 in 4 on this model).
    """
    from baechi import client

    plan = hand_plan(tiny.graph, pick_last=False)
    report = client.measure(tiny.model, tiny.x, tiny.y, plan, steps=1, loss=tiny.loss,
                            optimizer=tiny.optimizer)
    assert report.order_agreement == 1.0, report.out_of_order
    free = report.compared
    assert free.pairs == report.pairs > 50
    assert free.order_agreement < 0.75, free.order_agreement
    assert free.out_of_order


def test_measure_rejects_bad_input(tiny: Tiny) -> None:
    from baechi import client

    plan = hand_plan(tiny.graph)
    with pytest.raises(client.InvalidInput, match="steps must be"):
        client.measure(tiny.model, tiny.x, tiny.y, plan, steps=0, loss=tiny.loss,
                       optimizer=tiny.optimizer)
    with pytest.raises(client.InvalidInput, match="needs a loss and an optimizer"):
        client.measure(tiny.model, tiny.x, tiny.y, plan)
    with pytest.raises(client.InvalidInput, match="cannot read plan"):
        client.measure(tiny.model, tiny.x, tiny.y, "/no/such/plan.json", loss=tiny.loss,
                       optimizer=tiny.optimizer)


# ----------------------------------------------------------- an engine plan, and the CLI
def test_engine_plan_enforced_same_losses(tf: Any) -> None:
    import baechi
    from baechi import client
    from baechi.client.tf.train_step import make_train_step
    from baechi.examples.keras_models import EXAMPLES

    model, x, y, loss, optimizer = EXAMPLES["cnn"].make(4)
    graph = client.profile(model, x, y, loss, optimizer, steps=1, warmup=0)
    # m-etf, as tests/test_tf_models.py uses: quick, and its order is the engine's.
    plan = baechi.place(graph, {"devices": {"count": DEVICES}}, "m-etf")
    assert len(set(plan.placement.values())) > 1
    initial = [v.numpy() for v in [*model.variables, *optimizer.variables]]
    base = [float(tf.function(make_train_step(model, loss, optimizer))(x, y))
            for _ in range(2)]
    for variable, value in zip([*model.variables, *optimizer.variables], initial,
                               strict=True):
        variable.assign(value)
    applied = client.apply_plan(model, plan, optimizer=optimizer)
    step = applied.train_step(loss)
    with applied.check() as where:
        placed = [float(step(x, y)) for _ in range(2)]
    assert placed == base
    assert where.fraction >= 0.99
    assert applied.enforcement.order_edges_skipped == 0
    assert applied.enforcement.order_edges > 0


def test_measure_cli_verb(tf: Any, capsys: Any) -> None:
    import argparse

    from baechi.client.cli import cmd_measure

    args = argparse.Namespace(model="lstm", batch=4, steps=1, devices=DEVICES, algorithm="auto",
                              time_limit=1.0, plan=None, json=False)
    assert cmd_measure(args) == 0
    out = capsys.readouterr().out
    assert "consecutive pairs in plan order" in out and "ops on planned device" in out
    assert "predicted step (ms)" in out
