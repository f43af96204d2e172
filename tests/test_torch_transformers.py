"""Hugging Face transformers, captured op by op: GPT-2, Llama and BERT from small random
configs (nothing downloaded) profile with ``torch.export`` where fx would make the model body
one op, place on 4 devices, pass the transfer check, and train to the unplaced losses."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch import nn  # noqa: E402

import baechi  # noqa: E402
from baechi.client import PlanMismatch  # noqa: E402
from baechi.client.torch import apply_plan, profile, verify_transfers  # noqa: E402
from baechi.examples.hf_models import make_language_model  # noqa: E402

pytestmark = pytest.mark.torch

DEVICES = [f"/GPU:{i}" for i in range(4)]
ALL_CPU = dict.fromkeys(DEVICES, "cpu")


def make(kind: str) -> tuple[nn.Module, Any, Any]:
    """The model (train mode, dropout off), a batch of token ids and its targets."""
    module, ids, targets, _, _ = make_language_model(kind, width=128, batch=4, length=32)
    return module, ids, targets


def losses(module: nn.Module, ids: Any, targets: Any, steps: int = 3) -> list[float]:
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    out = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(module(ids), targets)
        loss.backward()
        optimizer.step()
        out.append(loss.item())
    return out


@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert"])
def test_transformers_split_at_op_level_and_train_identically(kind: str) -> None:
    module, ids, targets = make(kind)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "one op holds the step" warning
        graph = profile(module, ids, targets, nn.CrossEntropyLoss(), optimizer, steps=5)
    meta = graph["meta"]
    assert meta["capture"] == "torch.export" and meta["automatic_leaf_modules"] == []
    assert len(graph["ops"]) > 150
    assert meta["largest_op"]["share"] < 0.10
    total = sum(op["compute_us"] for op in graph["ops"])
    assert max(op["compute_us"] for op in graph["ops"]) <= 0.10 * total
    assert meta["profiled_sum_us"] > 0 and meta["measured_step_us"] > 0

    cluster = {"devices": {"count": 4}, "network": {"latency_us": 10, "bandwidth_gbps": 10}}
    plan = baechi.place(graph, cluster, options={"time_limit_s": 3}).model_dump(mode="json")
    assert all(check.ok for check in verify_transfers(
        module, plan, ids, targets, nn.CrossEntropyLoss()).values())

    reference = losses(make(kind)[0], ids, targets)
    fresh = make(kind)[0]
    placed = apply_plan(fresh, plan, ALL_CPU, example_inputs=ids)
    assert len(set(plan["placement"].values())) > 1 or len(placed.baechi.transfers) == 0
    assert losses(placed, ids, targets) == reference
    # the same names need the same capture: without the inputs, fx's would not match
    with pytest.raises(PlanMismatch, match="example_inputs"):
        apply_plan(copy.deepcopy(make(kind)[0]), plan, ALL_CPU)
