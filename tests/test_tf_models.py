"""TensorFlow end to end: ``client.profile`` and ``client.apply_plan`` on real Keras models.

Runs TensorFlow on the CPU, split into 4 logical devices standing in for 4 GPUs (docs/format.md §8),
with oneDNN off so that placed and unplaced steps compute bit-identical numbers. Models: a
small CNN, a two-layer LSTM and ResNet-50 (random weights, 32x32 images, batch 2).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import pytest
from conftest import TF_DEVICES

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

pytestmark = pytest.mark.tf

DEVICES = TF_DEVICES
MODELS = ["cnn", "lstm", "resnet50"]
#: Ops whose time TF does not measure on its own (inputs, variables, constants, no-ops).
NOT_COMPUTE = {"Placeholder", "NoOp", "VarHandleOp", "Const"}


# ---------------------------------------------------------------------------- fixtures
class Profiled:
    """A bundled example, its profile, and the state to restore before each run."""

    def __init__(self, name: str) -> None:
        from baechi.examples.keras_models import EXAMPLES

        self.example = EXAMPLES[name]
        self.model, self.x, self.y, self.loss, self.optimizer = self.example.make()
        started = time.perf_counter()
        from baechi import client

        self.graph = client.profile(self.model, self.x, self.y, self.loss, self.optimizer,
                                    steps=3 if name != "resnet50" else 2)
        self.seconds = time.perf_counter() - started
        self.initial = self.snapshot()

    def variables(self) -> list[Any]:
        return [*self.model.variables, *self.optimizer.variables]

    def snapshot(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.variables()]

    def restore(self) -> None:
        for variable, value in zip(self.variables(), self.initial, strict=True):
            variable.assign(value)


@pytest.fixture(scope="module")
def profiled(tf: Any) -> dict[str, Profiled]:
    return {}


def get(profiled: dict[str, Profiled], name: str) -> Profiled:
    if name not in profiled:
        profiled[name] = Profiled(name)
    return profiled[name]


def striped_plan(graph: dict[str, Any], devices: int = DEVICES) -> dict[str, Any]:
    """A plan spreading the layers over the devices, keeping colocation groups together."""
    placement: dict[str, str] = {}
    group_device: dict[str, str] = {}
    layers: dict[str, str] = {}
    for op in graph["ops"]:
        group = op.get("colocation_group")
        if group in group_device:
            placement[op["name"]] = group_device[group]
            continue
        key = (group or op["name"]).removeprefix("gradient_tape/")
        parts = key.split("/")
        layer = parts[1] if len(parts) > 2 else parts[0]
        device = layers.setdefault(layer, f"/GPU:{len(layers) % devices}")
        placement[op["name"]] = device
        if group:
            group_device[group] = device
    return {"format": "baechi.plan/v1", "placement": placement,
            "request": {"cluster": {"devices": {"count": devices}}}}


def engine_plan(graph: dict[str, Any]) -> Any:
    """A plan by the engine: m-etf when it is registered, else single."""
    import baechi
    from baechi.algorithms import ALGORITHMS

    algorithm = "m-etf" if "m-etf" in ALGORITHMS else "single"
    cluster = {"devices": {"count": DEVICES}, "network": {"latency_us": 5, "bandwidth_gbps": 20}}
    return baechi.place(graph, cluster, algorithm)


def run_steps(step: Any, x: Any, y: Any, n: int) -> list[float]:
    return [float(step(x, y)) for _ in range(n)]


# ------------------------------------------------------------------------------ profile
@pytest.mark.parametrize("name", MODELS)
def test_profile_exports_a_valid_measured_graph(profiled: dict[str, Profiled], name: str) -> None:
    import baechi

    p = get(profiled, name)
    graph = baechi.load_graph(p.graph)
    ops = p.graph["ops"]
    assert len(graph) == len(ops) > 50
    compute = [op for op in ops if op["type"] not in NOT_COMPUTE]
    timed = [op for op in compute if op["attrs"]["measured"]]
    assert len(timed) >= 0.9 * len(compute)
    assert sum(op["compute_us"] for op in timed) > 0
    assert p.graph["meta"]["measured_fraction"] == pytest.approx(len(timed) / len(compute))

    # Σ persistent bytes = the model's and the optimizer's variables, one op per variable.
    persistent = sum(op.get("persistent_bytes", 0) for op in ops)
    assert persistent == sum(v.numpy().nbytes for v in p.variables())
    variable_ops = {op["name"] for op in ops if op["type"] == "VarHandleOp"}
    assert variable_ops == {v.path for v in p.variables()}

    # The whole step is there: forward, gradients paired with forward ops, optimizer update.
    names = {op["name"] for op in ops}
    backward = [op for op in ops if op["name"].startswith("gradient_tape/")]
    assert len(backward) > 10
    assert sum(1 for op in backward if op.get("forward_op")) >= 0.9 * len(backward)
    for op in backward:
        if op.get("forward_op"):
            assert op["forward_op"] in names and not op["forward_op"].startswith("gradient_tape/")
    prefix = p.optimizer.name + "/"
    assert any(op["type"].startswith("Assign") and op["name"].startswith(prefix) for op in ops)
    # Each variable is colocated with the ops that read or update it.
    edges_from = {}
    for edge in p.graph["edges"]:
        edges_from.setdefault(edge["src"], []).append(edge)
    by_name = {op["name"]: op for op in ops}
    for variable in variable_ops:
        for edge in edges_from.get(variable, []):
            consumer = by_name[edge["dst"]]
            if consumer["type"] in ("ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp",
                                    "AssignSubVariableOp"):
                assert consumer["colocation_group"] == by_name[variable]["colocation_group"]


def test_profile_bytes_come_from_shapes(profiled: dict[str, Profiled]) -> None:
    p = get(profiled, "cnn")
    by_name = {op["name"]: op for op in p.graph["ops"]}
    batch = p.x.shape[0]
    logits = [op for op in p.graph["ops"]
              if op["type"] == "BiasAdd" and op["name"].split("/")[1].startswith("logits")]
    assert logits and logits[0]["output_bytes"] == batch * 10 * 4
    kernel = by_name["small_cnn/conv1/kernel"]
    assert kernel["persistent_bytes"] == 3 * 3 * 3 * 16 * 4
    data_edges = [e for e in p.graph["edges"] if not e.get("control")]
    control_edges = [e for e in p.graph["edges"] if e.get("control")]
    assert control_edges and all(e["bytes"] == 0 for e in control_edges)
    for edge in data_edges:
        if by_name[edge["src"]]["type"] != "VarHandleOp" and edge["tensor"].endswith(":0"):
            assert edge["bytes"] <= by_name[edge["src"]].get("output_bytes", 0)


def test_profile_leaves_the_model_untouched(tf: Any) -> None:
    from baechi import client
    from baechi.examples.keras_models import EXAMPLES

    model, x, y, loss, optimizer = EXAMPLES["cnn"].make(4, seed=3)
    optimizer.build(model.trainable_variables)
    before = [v.numpy() for v in [*model.variables, *optimizer.variables]]
    client.profile(model, x, y, loss, optimizer, steps=1)
    after = [v.numpy() for v in [*model.variables, *optimizer.variables]]
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- apply_plan
def placed_against_unplaced(p: Profiled, plan: Any, steps: int = 3) -> tuple[list, list, Any]:
    """Losses of ``steps`` unplaced steps, then of the same steps placed by ``plan``."""
    import tensorflow as tf

    from baechi import client
    from baechi.client.tf.train_step import make_train_step

    p.restore()
    unplaced = tf.function(make_train_step(p.model, p.loss, p.optimizer))
    base = run_steps(unplaced, p.x, p.y, steps)
    p.restore()
    applied = client.apply_plan(p.model, plan, optimizer=p.optimizer)
    step = applied.train_step(p.loss)
    with applied.check() as report:
        placed = run_steps(step, p.x, p.y, 1)
    placed += run_steps(step, p.x, p.y, steps - 1)
    return base, placed, (applied, report)


def assert_placed_as_planned(applied: Any, report: Any, plan_ops: int) -> None:
    assert report.fraction >= 0.99, report.mismatches[:10]
    assert report.planned >= 0.5 * plan_ops  # the rest: inputs, variables, folded constants
    assert report.variables == report.variables_on_planned_device > 0
    assert not applied.unplanned_variables


@pytest.mark.parametrize("name", ["cnn", "lstm"])
def test_apply_plan_custom_loop_same_loss_planned_devices(
    profiled: dict[str, Profiled], name: str
) -> None:
    p = get(profiled, name)
    plan = striped_plan(p.graph)
    assert len(set(plan["placement"].values())) == DEVICES
    base, placed, (applied, report) = placed_against_unplaced(p, plan)
    assert placed == base  # bit-identical
    assert_placed_as_planned(applied, report, len(plan["placement"]))
    moved = {v.path: v.value.device for v in p.variables()}
    for path, device in moved.items():
        assert device.endswith(applied.placement[path].split("device:")[-1])


@pytest.mark.parametrize("name", ["cnn", "lstm"])
def test_apply_plan_with_an_engine_plan(profiled: dict[str, Profiled], name: str) -> None:
    p = get(profiled, name)
    plan = engine_plan(p.graph)
    base, placed, (_, report) = placed_against_unplaced(p, plan)
    assert placed == base
    assert report.fraction >= 0.99, report.mismatches[:5]


def test_apply_plan_model_fit(profiled: dict[str, Profiled]) -> None:
    from baechi import client

    p = get(profiled, "cnn")
    x = np.concatenate([p.x] * 3)
    y = np.concatenate([p.y] * 3)
    p.model.compile(optimizer=p.optimizer, loss=p.loss)
    p.restore()
    base = p.model.fit(x, y, batch_size=len(p.x), epochs=2, shuffle=False, verbose=0)
    p.restore()
    plan = striped_plan(p.graph)
    applied = client.apply_plan(p.model, plan)  # the compiled model's optimizer
    with applied.check() as report:
        placed = p.model.fit(x, y, batch_size=len(p.x), epochs=2, shuffle=False, verbose=0)
    assert placed.history["loss"] == base.history["loss"]
    assert_placed_as_planned(applied, report, len(plan["placement"]))


def test_resnet50_placed_equals_unplaced(profiled: dict[str, Profiled]) -> None:
    import tensorflow as tf

    # Grappler's arithmetic optimizer and remapper rewrite groups of ops that share a device,
    # so a placed step rounds differently from an unplaced one; BatchNorm over a batch of 2
    # at 1x1 resolution magnifies that. With those two rewrites off, both compute the same.
    saved = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options(
        {"arithmetic_optimization": False, "remapping": False}
    )
    try:
        p = get(profiled, "resnet50")
        plan = engine_plan(p.graph)
        assert len(set(plan.placement.values())) > 1
        base, placed, (applied, report) = placed_against_unplaced(p, plan, steps=2)
    finally:
        tf.config.optimizer.set_experimental_options(
            {"arithmetic_optimization": saved.get("arithmetic_optimization", True),
             "remapping": saved.get("remapping", True)}
        )
    assert placed == base
    assert_placed_as_planned(applied, report, len(plan.placement))


def test_apply_plan_takes_a_device_map_and_warns_on_the_old_signature(
        profiled: dict[str, Profiled]) -> None:
    """``device_map`` (as PyTorch's ``apply_plan`` takes it) decides where each plan device
    runs; the former ``apply_plan(model, plan, optimizer)`` still works, with a warning."""
    import tensorflow as tf

    from baechi import client

    p = get(profiled, "cnn")
    plan = striped_plan(p.graph)
    local = [d.name for d in tf.config.list_logical_devices("CPU")]
    reversed_map = {f"/GPU:{i}": local[DEVICES - 1 - i] for i in range(DEVICES)}
    p.restore()
    applied = client.apply_plan(p.model, plan, reversed_map, optimizer=p.optimizer,
                                patch_fit=False)
    assert applied.devices == {d: reversed_map[d] for d in set(plan["placement"].values())}
    assert all(applied.placement[op] == reversed_map[dev]
               for op, dev in plan["placement"].items())
    with pytest.raises(client.PlanMismatch, match="device_map has no local device"):
        client.apply_plan(p.model, plan, {"/GPU:0": local[0]}, optimizer=p.optimizer)
    p.restore()
    with pytest.warns(DeprecationWarning, match="optimizer=..."):
        old = client.apply_plan(p.model, plan, p.optimizer, patch_fit=False)
    assert old.optimizer is p.optimizer
    assert set(old.devices.values()) <= set(local)


def test_apply_plan_refuses_a_plan_for_more_devices(profiled: dict[str, Profiled]) -> None:
    from baechi import client

    p = get(profiled, "cnn")
    plan = striped_plan(p.graph, devices=DEVICES + 2)
    with pytest.raises(client.PlanMismatch, match="only 4 local CPU"):
        client.apply_plan(p.model, plan, optimizer=p.optimizer)


def test_apply_plan_refuses_another_models_plan(profiled: dict[str, Profiled]) -> None:
    from baechi import client

    cnn, lstm = get(profiled, "cnn"), get(profiled, "lstm")
    with pytest.raises(client.PlanMismatch, match="names none of the variables"):
        client.apply_plan(lstm.model, striped_plan(cnn.graph), optimizer=lstm.optimizer)
    with pytest.raises(client.InvalidInput, match="expected a baechi.plan/v1"):
        client.apply_plan(lstm.model, {"order": {}}, optimizer=lstm.optimizer)


def test_ops_the_plan_does_not_name_stay_where_tf_puts_them(
    profiled: dict[str, Profiled],
) -> None:

    p = get(profiled, "lstm")
    plan = striped_plan(p.graph)
    prefix = p.optimizer.name + "/"
    groups = {op["name"]: op.get("colocation_group") or "" for op in p.graph["ops"]}
    kept = {op: d for op, d in plan["placement"].items()
            if not op.startswith(prefix) and not groups[op].startswith(prefix)}
    base, placed, (applied, report) = placed_against_unplaced(p, {"placement": kept})
    assert placed == base
    assert report.fraction >= 0.99
    assert applied.unplanned_variables  # the optimizer's slots stayed where they were
    assert all(path.startswith(prefix) for path in applied.unplanned_variables)


def test_profile_cli_verb(tf: Any, tmp_path: Any) -> None:
    import argparse

    import baechi
    from baechi.client.cli import cmd_profile

    out = tmp_path / "cnn.json"
    args = argparse.Namespace(model="cnn", batch=4, steps=1, output=str(out))
    assert cmd_profile(args) == 0
    graph = baechi.load_graph(out)
    assert graph.meta["model"] == "small_cnn" and len(graph) > 100

