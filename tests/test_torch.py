"""PyTorch client: real profiles of real training steps, plans applied and trained on CPU."""

from __future__ import annotations

import copy
import doctest
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import baechi  # noqa: E402
from baechi.algorithms import ALGORITHMS  # noqa: E402
from baechi.client.errors import InvalidInput, PlanMismatch, ProfileError  # noqa: E402
from baechi.client.torch import (  # noqa: E402
    apply_plan,
    check_devices,
    placement,
    profile,
    verify_transfers,
)
from baechi.client.torch.tracing import reads_metadata_only  # noqa: E402
from baechi.examples.torch_models import make_cnn, make_transformer  # noqa: E402

pytestmark = pytest.mark.torch

DEVICES = [f"/GPU:{i}" for i in range(4)]
ALL_CPU = dict.fromkeys(DEVICES, "cpu")
#: Fast links, so that the transformer's plans really split it (checked below).
CLUSTER = {"devices": {"count": 4}, "network": {"latency_us": 5, "bandwidth_gbps": 50}}


def small_transformer(seed: int = 0) -> tuple[Any, ...]:
    return make_transformer(batch=4, seed=seed, length=16, vocab=64, dim=32, heads=2)


@pytest.fixture(scope="module")
def cnn_graph() -> dict[str, Any]:
    return profile(*make_cnn(batch=8), steps=2)


@pytest.fixture(scope="module")
def transformer_graph() -> dict[str, Any]:
    return profile(*small_transformer(), steps=2)


@pytest.fixture(scope="module")
def transformer_plan(transformer_graph: dict[str, Any]) -> Any:
    plan = baechi.place(transformer_graph, CLUSTER, "m-etf")
    assert len(set(plan.placement.values())) > 1, "the test plan must cross devices"
    return plan


def fx_names(module: nn.Module) -> list[str]:
    return [n.name for n in torch.fx.symbolic_trace(module).graph.nodes if n.op != "output"]


# ----------------------------------------------------------------------------- profile
def test_cnn_profile_is_a_valid_training_graph(cnn_graph: dict[str, Any]) -> None:
    module, x, *_ = make_cnn(batch=8)
    graph = baechi.load_graph(cnn_graph)
    ops = {op["name"]: op for op in cnn_graph["ops"]}
    assert len(graph.names) == len(ops)
    # every node of the module's trace is an op, plus the targets and the loss
    assert set(fx_names(module)) | {"targets", "loss"} <= set(ops)
    # output bytes from the tensors: conv1 makes 8×16×32×32 float32
    assert ops["conv1"]["output_bytes"] == 8 * 16 * 32 * 32 * 4
    assert ops["x"]["output_bytes"] == x.numel() * 4
    # measured work: forward and backward of the convolutions, the SGD update
    for name in ("conv1", "conv2", "conv1/backward", "conv2/backward", "conv1/update", "fc"):
        assert ops[name]["compute_us"] > 0, name
    # backward ops pair with their forward op and share its group
    backward = [op for op in cnn_graph["ops"] if op["name"].endswith("/backward")]
    assert len(backward) >= 10
    for op in backward:
        forward = ops[op["forward_op"]]
        assert forward["colocation_group"] == op["colocation_group"]
    # parameters + gradients + momentum (SGD) of conv1, and bn1's values, grads, momentum
    # and running statistics, as persistent bytes of the op that owns them
    conv1 = sum(p.numel() * 4 for p in module.conv1.parameters())
    assert ops["conv1"]["persistent_bytes"] == 3 * conv1
    bn1_params = sum(p.numel() * 4 for p in module.bn1.parameters())
    bn1_buffers = sum(b.numel() * b.element_size() for b in module.bn1.buffers())
    assert ops["bn1"]["persistent_bytes"] == 3 * bn1_params + bn1_buffers
    assert ops["conv1/update"]["colocation_group"] == ops["conv1"]["colocation_group"]
    # the loss runs where the output is; gradients flow back from it
    assert ops["loss"]["colocation_group"] == ops["fc"]["colocation_group"]
    edges = {(e["src"], e["dst"]) for e in cnn_graph["edges"]}
    assert ("loss/backward", "fc/backward") in edges and ("fc/backward", "fc/update") in edges
    # saved activations, as autograd saved them: conv1 its input, relu its output, bn1 its
    # input; conv1 does not keep its own output (ordering only)
    data = {(e["src"], e["dst"]): e for e in cnn_graph["edges"] if not e.get("control")}
    assert data[("x", "conv1/backward")]["bytes"] == x.numel() * 4
    assert ("relu", "relu/backward") in data and ("conv1", "bn1/backward") in data
    assert ("conv1", "conv1/backward") in edges and ("conv1", "conv1/backward") not in data
    # max-pooling keeps int64 indices of its output's shape: counted with its output
    pool = ops["max_pool2d"]
    assert pool["attrs"]["saved_internal_bytes"] == 8 * 16 * 16 * 16 * 8
    assert pool["output_bytes"] == 8 * 16 * 16 * 16 * 4 + 8 * 16 * 16 * 16 * 8
    assert data[("max_pool2d", "conv2")]["bytes"] == 8 * 16 * 16 * 16 * 4  # indices stay
    assert cnn_graph["meta"]["steps"] == 2 and cnn_graph["meta"]["profile_seconds"] > 0


def test_profile_leaves_the_callers_module_and_optimizer_alone() -> None:
    module, x, y, loss_fn, optimizer = make_cnn(batch=8)
    before = copy.deepcopy(module.state_dict())
    profile(module, x, y, loss_fn, optimizer, steps=1, warmup=0)
    after = module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not optimizer.state and all(p.grad is None for p in module.parameters())


def test_transformer_tied_weights_are_one_group(transformer_graph: dict[str, Any]) -> None:
    ops = {op["name"]: op for op in transformer_graph["ops"]}
    # nn.Embedding (call_module) and F.linear's weight (get_attr) share one parameter
    assert ops["embed"]["colocation_group"] == ops["embed_weight"]["colocation_group"]
    module = small_transformer()[0]
    weight = module.embed.weight.numel() * 4
    # value + gradient + Adam's two moments + its 0-dim float32 step, once for the group
    assert ops["embed"]["persistent_bytes"] == 4 * weight + 4
    assert ops["embed_weight"].get("persistent_bytes", 0) == 0
    assert [n for n in ops if n.endswith("/update") and "embed" in n] == ["embed/update"]
    # the output head's backward sends the tied weight's gradient to the update
    linear = next(n for n in ops if ops[n]["type"] == "linear")
    edges = {(e["src"], e["dst"]) for e in transformer_graph["edges"]}
    assert (f"{linear}/backward", "embed/update") in edges
    # F.linear flattens its 3-d input inside the kernel: the saved view is gelu's output
    assert ("gelu", "blocks_0_down/backward") in edges
    # the tied weight read by get_attr allocates nothing (persistent on embed)
    assert "output_bytes" not in ops["embed_weight"]
    total = sum(p.numel() for p in module.parameters())
    updates = sum(op["compute_us"] for op in ops.values() if op["name"].endswith("/update"))
    assert updates > 0 and total > 0


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) if x.sum() > 0 else self.fc(-x)  # data-dependent: FX cannot trace


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Gate()
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.inner(x))


def test_untraceable_submodules_become_one_op() -> None:
    torch.manual_seed(0)
    module, x, y = Branchy(), torch.randn(4, 8), torch.randint(0, 2, (4,))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    graph = profile(module, x, y, nn.CrossEntropyLoss(), optimizer, steps=1)
    # export fails on the data-dependent branch too: fx's capture, with Gate one op
    assert graph["meta"]["automatic_leaf_modules"] == ["inner"]
    assert graph["meta"]["capture"] == "torch.fx"
    ops = {op["name"]: op for op in graph["ops"]}
    assert ops["inner"]["type"] == "Gate" and ops["inner"]["persistent_bytes"] > 0
    assert ops["inner/backward"]["compute_us"] > 0
    plan = baechi.place(graph, CLUSTER, "m-topo")
    placed = apply_plan(copy.deepcopy(module), plan, ALL_CPU)  # finds the same leaf
    assert torch.equal(placed(x), module(x))
    # (no meta check here: Gate's branch needs data, which meta tensors do not have)
    # given explicitly, the same
    explicit = profile(module, x, y, nn.CrossEntropyLoss(), optimizer, steps=1,
                       leaf_modules=[Gate])
    assert explicit["meta"]["automatic_leaf_modules"] == []
    assert {op["name"] for op in explicit["ops"]} == set(ops)


def test_untraceable_forward_names_the_way_out() -> None:
    class Root(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x if x.sum() > 0 else -x)

    module = Root()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    with pytest.raises(ProfileError, match=r"Root\.forward.*submodule"):
        profile(module, torch.randn(4, 8), torch.zeros(4, dtype=torch.long),
                nn.CrossEntropyLoss(), optimizer)


def test_in_place_ops_stay_with_the_tensor_they_write() -> None:
    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.relu, self.b = nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.relu(self.a(x).mul_(2)))

    torch.manual_seed(0)
    module, x, y = InPlace(), torch.randn(4, 8), torch.randint(0, 3, (4,))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    graph = profile(module, x, y, nn.CrossEntropyLoss(), optimizer, steps=1)
    group = {op["name"]: op.get("colocation_group") for op in graph["ops"]}
    # mul_ writes into a's output, relu into mul_'s: one device for the three
    assert group["a"] == group["relu"] == group["mul_"] == group["a/update"] is not None
    assert group["mul_"] != group["b"]
    for algorithm in ALGORITHMS:
        plan = baechi.place(graph, CLUSTER, algorithm, {"time_limit_s": 1})
        assert len({plan.placement[n] for n in ("a", "relu", "mul_")}) == 1
        checks = verify_transfers(module, plan, x, y, nn.CrossEntropyLoss())
        assert all(c.ok for c in checks.values())


def test_bad_arguments_are_profile_errors() -> None:
    module, x, y, loss_fn, optimizer = make_cnn(batch=2)
    with pytest.raises(ProfileError, match="nn.Module"):
        profile(lambda t: t, x, y, loss_fn, optimizer)
    with pytest.raises(ProfileError, match="Optimizer"):
        profile(module, x, y, loss_fn, "sgd")
    with pytest.raises(ProfileError, match="steps"):
        profile(module, x, y, loss_fn, optimizer, steps=0)
    with pytest.raises(ProfileError, match="forward pass failed"):
        profile(module, torch.randn(2, 5, 32, 32), y, loss_fn, optimizer)


# ----------------------------------------------------------------------------- apply
def train(module: nn.Module, make: Any, steps: int, seed: int = 0) -> list[torch.Tensor]:
    """Losses of ``steps`` training steps with a fresh optimizer like ``make``'s."""
    _, x, y, loss_fn, optimizer = make(seed=seed)
    optimizer = type(optimizer)(module.parameters(), **optimizer.defaults)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(module(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_all_cpu_plan_trains_to_identical_losses(
    name: str, cnn_graph: dict[str, Any], transformer_plan: Any
) -> None:
    torch.use_deterministic_algorithms(True)
    try:
        make = small_transformer if name == "transformer" else (lambda seed: make_cnn(8, seed))
        plan = transformer_plan if name == "transformer" else baechi.place(
            cnn_graph, CLUSTER, "m-etf")
        reference = make(seed=0)[0]
        placed = apply_plan(make(seed=0)[0], plan, ALL_CPU)
        assert isinstance(placed, torch.fx.GraphModule)
        if name == "transformer":
            assert placed.baechi.transfers, "the plan crosses devices: transfers expected"
        expected = train(reference, make, steps=4)
        got = train(placed, make, steps=4)
        assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True)), (expected, got)
        assert expected[-1] < expected[0]  # it really trains
        for (n, a), (_, b) in zip(reference.named_parameters(), placed.named_parameters(),
                                  strict=True):
            assert torch.equal(a, b), n
    finally:
        torch.use_deterministic_algorithms(False)


def test_meta_check_every_op_on_its_planned_device(transformer_graph: dict[str, Any],
                                                   transformer_plan: Any) -> None:
    module, x, y, loss_fn, _ = small_transformer()
    ops = {op["name"]: op for op in transformer_graph["ops"]}
    # nodes with tensor outputs (x.size(0) gives an int: no device), inputs aside
    with_tensors = [n for n in fx_names(module) if ops[n]["type"] != "placeholder" and (
        ops[n].get("output_bytes") or ops[n]["attrs"]["fx_op"] == "get_attr")]
    checks = verify_transfers(module, transformer_plan, x, y, loss_fn)
    assert set(checks) == set(transformer_plan.placement.values())
    for device, check in checks.items():
        assert check.ok and check.backward, (device, check.mismatches)
        assert check.ops == len(with_tensors)
    # parameters live on their planned devices
    placed = apply_plan(copy.deepcopy(module), transformer_plan,
                        {d: ("meta" if d == "/GPU:1" else "cpu") for d in DEVICES})
    for node in placed.graph.nodes:
        if node.op == "call_module":
            planned = "meta" if transformer_plan.placement[node.name] == "/GPU:1" else "cpu"
            for p in placed.get_submodule(node.target).parameters():
                assert p.device.type == planned, node.name


def test_every_cross_device_edge_has_a_transfer(transformer_plan: Any) -> None:
    """Read from the transformed graph: each FX edge the plan cuts goes through a transfer
    to the consumer's device, one per (tensor, device); edges it does not cut, through none."""
    module = small_transformer()[0]
    planned = transformer_plan.placement
    # x.size(1) reads metadata only: its edges move no data (checked below), the others must
    edges = [(a.name, n.name) for n in torch.fx.symbolic_trace(module).graph.nodes
             if n.op != "output" and not reads_metadata_only(n) for a in n.all_input_nodes]
    readers = [n.name for n in torch.fx.symbolic_trace(module).graph.nodes
               if reads_metadata_only(n)]
    assert readers, "the transformer reads x.size()"
    placed = apply_plan(copy.deepcopy(module), transformer_plan, ALL_CPU)
    by_name = {n.name: n for n in placed.graph.nodes}
    cut = 0
    for src, dst in edges:
        feeding = [a for a in by_name[dst].all_input_nodes
                   if a.meta.get("baechi_transfer", (a.name,))[0] == src or a.name == src]
        assert len(feeding) == 1, (src, dst)
        transfer = "baechi_transfer" in feeding[0].meta and feeding[0].args[0].op != "placeholder"
        assert transfer == (planned[src] != planned[dst]), (src, dst)
        cut += transfer
    assert cut >= len(placed.baechi.transfers) > 0  # cached: never more transfers than cuts
    for reader in readers:
        assert not any("baechi_transfer" in a.meta and a.args[0].op != "placeholder"
                       for a in by_name[reader].all_input_nodes)
    assert len({(t[0], t[3]) for t in placed.baechi.transfers}) == len(placed.baechi.transfers)


def test_every_transfer_is_needed(transformer_graph: dict[str, Any],
                                  transformer_plan: Any) -> None:
    """Remove each transfer of a tensor in turn, its source's device mapped to meta: the
    check fails (the transfer is needed), while the intact module passes."""
    module, x, y, loss_fn, _ = small_transformer()
    holds_tensor = {op["name"]: op.get("output_bytes", 0) > 0 or op["attrs"]["fx_op"] == "get_attr"
                    for op in transformer_graph["ops"]}
    placed = apply_plan(copy.deepcopy(module), transformer_plan, ALL_CPU)
    crossing = [t for t in placed.baechi.transfers if holds_tensor[t[0]]]
    assert len(crossing) >= 3
    for src, dst, src_device, dst_device in crossing:
        assert src_device != dst_device
        mapping = {d: ("meta" if d == src_device else "cpu") for d in DEVICES}
        placed = apply_plan(copy.deepcopy(module), transformer_plan, mapping)
        assert check_devices(placed, x, y, loss_fn).ok  # intact: passes
        node = next(n for n in placed.graph.nodes
                    if n.meta.get("baechi_transfer") == (src, dst))
        node.replace_all_uses_with(node.args[0])
        placed.graph.erase_node(node)
        placed.recompile()
        with pytest.raises(PlanMismatch, match="transfer between devices is missing"):
            check_devices(placed, x, y, loss_fn)


@pytest.mark.parametrize("algorithm", [*ALGORITHMS, "auto"])
def test_graphs_place_with_every_algorithm_and_apply(
    algorithm: str, cnn_graph: dict[str, Any], transformer_graph: dict[str, Any]
) -> None:
    for graph, make in ((cnn_graph, lambda: make_cnn(8)), (transformer_graph, small_transformer)):
        plan = baechi.place(graph, CLUSTER, algorithm, {"time_limit_s": 1})
        assert set(plan.placement) == {op["name"] for op in graph["ops"]}
        module, x, y, loss_fn, _ = make()
        for check in verify_transfers(module, plan, x, y, loss_fn).values():
            assert check.ok, (algorithm, check.mismatches)


def test_memory_limit_plan_applies(transformer_graph: dict[str, Any]) -> None:
    single = baechi.place(transformer_graph, {"devices": {"count": 1}}, "single")
    peak = max(single.estimate.peak_memory_bytes.values())
    cluster = {**CLUSTER, "devices": {"count": 4, "memory_bytes": peak // 2}}
    plan = baechi.place(transformer_graph, cluster, "m-etf")
    assert len(set(plan.placement.values())) >= 2
    assert max(plan.estimate.peak_memory_bytes.values()) <= peak // 2
    module, x, y, loss_fn, _ = small_transformer()
    assert all(c.ok for c in verify_transfers(module, plan, x, y, loss_fn).values())


def test_tensor_factories_follow_their_node() -> None:
    class Positions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(16, 8)
            self.fc = nn.Linear(8, 3)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(tokens.size(1))
            return self.fc(self.embed(tokens) + self.embed(positions)).mean(1)

    torch.manual_seed(0)
    module, x, y = Positions(), torch.randint(0, 16, (2, 5)), torch.randint(0, 3, (2,))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    graph = profile(module, x, y, nn.CrossEntropyLoss(), optimizer, steps=1)
    plan = baechi.place(graph, {"devices": {"count": 1}}, "single")
    placed = apply_plan(copy.deepcopy(module), plan, {"/GPU:0": "meta"})
    arange = next(n for n in placed.graph.nodes if n.target is torch.arange)
    assert arange.kwargs["device"] == "meta"
    assert verify_transfers(module, plan, x, y, nn.CrossEntropyLoss())["/GPU:0"].ok


def test_default_map_warns_and_runs_on_cpu(transformer_plan: Any) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the default map uses it")
    module = small_transformer()[0]
    with pytest.warns(RuntimeWarning, match="CUDA"):
        placed = apply_plan(module, transformer_plan)
    assert {str(d) for d in placed.baechi.devices.values()} == {"cpu"}
    assert placed.baechi.output_device == torch.device("cpu")


def test_optimizer_state_moves_with_its_parameters(cnn_graph: dict[str, Any]) -> None:
    module, x, y, loss_fn, optimizer = make_cnn(batch=8)
    loss_fn(module(x), y).backward()
    optimizer.step()
    plan = baechi.place(cnn_graph, {"devices": {"count": 1}}, "single")
    placed = apply_plan(module, plan, {"/GPU:0": "meta"}, optimizer=optimizer)
    # moving to meta re-creates the parameters: the optimizer now holds the placed ones
    held = [p for group in optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in held} == {id(p) for p in placed.parameters()}
    assert len(optimizer.state) == len(held)
    for parameter, state in optimizer.state.items():
        assert parameter.device.type == "meta"
        assert state["momentum_buffer"].device.type == "meta"


def test_mismatched_plans_are_clear_errors(cnn_graph: dict[str, Any],
                                          transformer_plan: Any) -> None:
    module = make_cnn(batch=8)[0]
    with pytest.raises(PlanMismatch, match="does not name"):
        apply_plan(module, transformer_plan, ALL_CPU)
    plan = baechi.place(cnn_graph, CLUSTER, "m-topo")
    with pytest.raises(PlanMismatch, match="device_map has no entry"):
        apply_plan(module, plan, {"/GPU:9": "cpu"})
    with pytest.raises(InvalidInput, match="device_map"):
        apply_plan(module, plan, dict.fromkeys(DEVICES, "no-such-device"))
    with pytest.raises(InvalidInput):
        apply_plan(module, {"no": "plan"}, ALL_CPU)
    # a parameter's two owners on two devices cannot be applied
    tied = small_transformer()[0]
    tied_plan = transformer_plan.model_dump(mode="json")
    tied_plan["placement"]["embed"], tied_plan["placement"]["embed_weight"] = "/GPU:0", "/GPU:1"
    with pytest.raises(PlanMismatch, match="embed.weight"):
        apply_plan(tied, tied_plan, ALL_CPU)


def test_docstring_examples() -> None:
    result = doctest.testmod(placement)
    assert result.failed == 0 and result.attempted > 0
