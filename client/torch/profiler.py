"""Profile a PyTorch training step into a ``baechi.graph/v1`` document (issue 13).

Granularity (why, at length: docs/torch.md): the ops are the nodes of the module's
``torch.fx`` trace — leaf modules (``Conv2d``, ``Linear``, ``BatchNorm2d`` ...) and every
function and method call between them — because :func:`baechi.client.torch.apply_plan` places
exactly those nodes and inserts a transfer on exactly those edges. Finer (ATen) ops could not
be placed one by one without replacing the user's module and autograd.

How it is measured, on a deep copy of the module and optimizer (the caller's are untouched):

1. Forward: an ``fx.Interpreter`` runs the traced module and times every node's execution
   (``time.perf_counter`` around it; CPU kernels are synchronous, CUDA ones are waited for).
   Output bytes are the tensors' shape × element size.
2. Backward: every autograd node that a forward node's outputs bring into the autograd graph
   (reachable from them and from no earlier node) belongs to that forward node. A pre-hook and
   a post-hook on each autograd node time it; the sum is the forward node's backward op
   ``<node>/backward`` (``forward_op`` = the node, same colocation group: autograd runs a
   backward function on its forward's device, so the pairing is a fact, not a hint).
3. Optimizer: ``optimizer.step()`` is timed as a whole and split over one ``<group>/update``
   op per parameter group in proportion to the group's trainable elements (the update is
   element-wise; a per-parameter timing is not possible with the fused/foreach kernels).
4. Each op's time is the median over ``steps`` profiled steps (after ``warmup`` steps).

Parameters, their gradients and the optimizer's state are persistent bytes of the forward
node that owns the parameters (the leaf module, or the ``get_attr`` node); every node that
shares a parameter, its backward and the update are in one colocation group.
"""

from __future__ import annotations

import copy
import statistics
import time
import warnings
from collections import defaultdict
from typing import Any

from baechi.client.errors import ProfileError
from baechi.client.tf.profiler import validate_profile
from baechi.client.torch.tracing import (
    mutates_input,
    nbytes,
    op_type,
    owned_tensors,
    reads_metadata_only,
    tensors,
    trace,
)

BACKWARD = "/backward"
UPDATE = "/update"


def profile(
    module: Any,
    inputs: Any,
    targets: Any,
    loss_fn: Any,
    optimizer: Any,
    steps: int = 5,
    *,
    warmup: int = 1,
    name: str | None = None,
    leaf_modules: Any = (),
) -> dict[str, Any]:
    """Profile one training step of ``module`` into a ``baechi.graph/v1`` document.

    Parameters
    ----------
    module : torch.nn.Module
        The model; its own ``forward`` must be traceable by ``torch.fx``. It is deep-copied
        with the optimizer: its weights and the optimizer's state do not change.
    inputs : Tensor or tuple of Tensors
        One batch: the step computes ``loss_fn(module(*inputs), targets)``.
    targets : Any
        What ``loss_fn`` takes as its second argument.
    loss_fn : callable
        ``loss_fn(output, targets) -> scalar Tensor``.
    optimizer : torch.optim.Optimizer
        An optimizer over ``module``'s parameters.
    steps : int
        Profiled steps; each op's time is the median over them.
    warmup : int
        Unmeasured steps run first.
    name : str, optional
        Graph name; default ``<module class>_train_step``.
    leaf_modules : iterable of module classes or submodule names
        Kept as one op each (not traced through). Submodules FX cannot trace are kept whole
        anyway (``meta.automatic_leaf_modules``).

    Returns
    -------
    dict
        A ``baechi.graph/v1`` document (validated by :func:`baechi.load_graph`).

    Raises
    ------
    ProfileError
        The module cannot be traced, or the step cannot run as given.
    """
    import torch

    if steps < 1 or warmup < 0:
        raise ProfileError(f"steps must be ≥ 1 and warmup ≥ 0 (got {steps}, {warmup})")
    if not isinstance(module, torch.nn.Module):
        raise ProfileError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ProfileError(
            f"optimizer: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    started = time.perf_counter()
    module_copy, optimizer_copy = copy.deepcopy((module, optimizer))
    graph_module = trace(module_copy, leaf_modules, example_inputs=inputs)
    traced = time.perf_counter()

    device = _device_of(module_copy, inputs)
    run = _Run(graph_module, device)
    module_copy.train()
    for i in range(warmup + steps):
        run.step(inputs, targets, loss_fn, optimizer_copy, measure=i >= warmup)
    measured = time.perf_counter()

    document = _document(graph_module, run, optimizer_copy)
    compute = [op for op in document["ops"] if op["compute_us"] > 0]
    profiled_us = sum(op["compute_us"] for op in document["ops"])
    step_us = _step_us(module_copy, inputs, targets, loss_fn, optimizer_copy, steps, run.clock)
    largest = max(document["ops"], key=lambda op: op["compute_us"])
    share = largest["compute_us"] / profiled_us if profiled_us > 0 else 0.0
    if share > LARGEST_OP_SHARE:
        warnings.warn(
            f"op {largest['name']!r} ({largest.get('type', '')}) holds {share:.0%} of the "
            f"step's compute: no placement can run the step in less than that op's time. "
            "Capture it finer (without leaf_modules; pass inputs torch.export can trace) or "
            "split the module", RuntimeWarning, stacklevel=2)
    document["name"] = name or f"{type(module).__name__}_train_step"
    document["meta"] = {
        "source": "baechi.client.torch.profile: torch.fx nodes timed by an fx.Interpreter, "
                  "autograd nodes timed by hooks",
        "framework": f"torch {torch.__version__}",
        "model": type(module).__name__,
        "optimizer": type(optimizer).__name__,
        "batch_shapes": {"inputs": [list(t.shape) for t in tensors(inputs)],
                         "targets": [list(t.shape) for t in tensors(targets)]},
        "steps": steps,
        "warmup": warmup,
        "timing": "median over the steps, in µs: forward = each fx node's execution, "
                  "backward = its autograd nodes, update = optimizer.step() split by "
                  "trainable elements",
        "device": str(device),
        "threads": torch.get_num_threads(),
        "fx_nodes": sum(1 for n in graph_module.graph.nodes if n.op != "output"),
        "capture": graph_module.meta["baechi_capture"],
        "largest_op": {"name": largest["name"], "share": round(share, 4)},
        "profiled_sum_us": round(profiled_us, 3),
        "measured_step_us": round(step_us, 3),
        "automatic_leaf_modules": graph_module.meta["baechi_leaf_modules"],
        "compute_ops": len(compute),
        "profile_seconds": round(time.perf_counter() - started, 3),
        "trace_seconds": round(traced - started, 3),
        "run_seconds": round(measured - traced, 3),
        "persistent_bytes": sum(op.get("persistent_bytes", 0) for op in document["ops"]),
    }
    validate_profile(document)
    return document


#: ``profile`` warns when one op holds more than this share of the step's compute.
LARGEST_OP_SHARE = 0.3


def _step_us(module: Any, inputs: tuple[Any, ...], targets: Any, loss_fn: Any,
             optimizer: Any, steps: int, clock: Any) -> float:
    """Median µs of plain training steps (forward, loss, backward, update) of ``module``, as
    the user's loop runs them: what the profiled op times should add up to."""
    times = []
    for _ in range(steps + 1):  # the first one warms up
        tick = clock()
        optimizer.zero_grad(set_to_none=True)
        loss_fn(module(*inputs), targets).backward()
        optimizer.step()
        times.append((clock() - tick) * 1e6)
    return statistics.median(times[1:])


class _Run:
    """Runs training steps through a timing interpreter and keeps what they measured."""

    def __init__(self, graph_module: Any, device: Any) -> None:
        self.graph_module = graph_module
        # CUDA kernels run asynchronously: wait for them around every timed piece
        # (untested here: this machine has no GPU)
        self.clock = _synchronized_clock if device.type == "cuda" else time.perf_counter
        self.forward_us: dict[str, list[float]] = defaultdict(list)
        self.backward_us: dict[str, list[float]] = defaultdict(list)
        self.update_us: list[float] = []
        self.values: dict[str, Any] = {}          # node → its last output (for bytes)
        self.has_backward: set[str] = set()
        self.saved_from: dict[str, set[str]] = defaultdict(set)   # node → nodes it saves
        self.saved_internal: dict[str, int] = {}   # node → bytes it saves of its own
        self.persistent_values: set[str] = set()   # get_attr nodes of parameters/buffers
        self.get_attrs = {n.name for n in graph_module.graph.nodes if n.op == "get_attr"}
        self.persistent_storage = {t.untyped_storage().data_ptr() for t in
                                   [*graph_module.parameters(), *graph_module.buffers()]}
        self.loss_name = "loss"
        self.targets_name = "targets"
        taken = {n.name for n in graph_module.graph.nodes}
        while self.loss_name in taken:
            self.loss_name += "_"
        while self.targets_name in taken:
            self.targets_name += "_"

    def step(self, inputs: tuple[Any, ...], targets: Any, loss_fn: Any, optimizer: Any,
             measure: bool) -> None:
        import torch
        import torch.fx

        optimizer.zero_grad(set_to_none=True)
        claimed: set[Any] = set()
        owners: dict[Any, str] = {}
        forward: dict[str, float] = {}
        run, clock = self, self.clock

        def claim(name: str, value: Any) -> None:
            stack = [t.grad_fn for t in tensors(value) if t.grad_fn is not None]
            while stack:
                fn = stack.pop()
                if fn is None or fn in claimed:
                    continue
                claimed.add(fn)
                owners[fn] = name
                stack.extend(f for f, _ in fn.next_functions)

        class Timing(torch.fx.Interpreter):
            def run_node(self, n: Any) -> Any:
                tick = clock()
                out = super().run_node(n)
                forward[n.name] = (clock() - tick) * 1e6
                if n.op != "output":
                    run.values[n.name] = out
                    claim(n.name, out)
                return out

        # Which tensors each node's autograd functions save for the backward (autograd's own
        # pack hook, called while the node runs): its saved activations.
        saving: list[str | None] = [None]
        saved: dict[str, list[Any]] = defaultdict(list)

        def pack(tensor: Any) -> Any:
            if saving[0] is not None:
                saved[saving[0]].append(tensor)
            return tensor

        class Timed(Timing):
            def run_node(self, n: Any) -> Any:
                saving[0] = n.name
                try:
                    return super().run_node(n)
                finally:
                    saving[0] = None

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                output = Timed(self.graph_module).run(*inputs)
                saving[0] = self.loss_name
                tick = clock()
                loss = loss_fn(output, targets)
                forward[self.loss_name] = (clock() - tick) * 1e6
                saving[0] = None
        except Exception as exc:
            raise ProfileError(f"running the forward pass failed: {type(exc).__name__}: "
                               f"{exc}") from exc
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ProfileError("loss_fn must return a scalar tensor")
        self.values[self.loss_name] = loss
        self.values[self.targets_name] = targets
        claim(self.loss_name, loss)
        self._attribute_saved(saved)

        backward: dict[str, float] = defaultdict(float)
        starts: dict[Any, float] = {}
        for fn, owner in owners.items():
            fn.register_prehook(lambda _go, fn=fn: starts.__setitem__(fn, clock()))
            fn.register_hook(lambda _gi, _go, fn=fn, owner=owner: backward.__setitem__(
                owner, backward[owner] + (clock() - starts[fn]) * 1e6))
        try:
            loss.backward()
        except Exception as exc:
            raise ProfileError(f"loss.backward() failed: {type(exc).__name__}: {exc}") from exc
        tick = clock()
        optimizer.step()
        update = (clock() - tick) * 1e6
        self.has_backward |= set(owners.values())
        if measure:
            for op, us in forward.items():
                self.forward_us[op].append(us)
            for op in set(owners.values()):
                self.backward_us[op].append(backward.get(op, 0.0))
            self.update_us.append(update)


    def _attribute_saved(self, saved: dict[str, list[Any]]) -> None:
        """Map each saved tensor to the node whose output it is; a module's internal tensors
        (BatchNorm's batch statistics, max-pooling's indices, the loss's log-probabilities)
        have none and count as the saving node's own. Parameters and buffers are skipped:
        they are persistent bytes already."""
        exact: dict[tuple[Any, ...], str] = {}
        allocator: dict[int, str] = {}
        for name, value in self.values.items():  # graph order
            if any(t.untyped_storage().data_ptr() in self.persistent_storage
                   for t in tensors(value)) and name in self.get_attrs:
                self.persistent_values.add(name)
            for tensor in tensors(value):
                exact[_identity(tensor)] = name  # a later view of the same memory wins
                allocator.setdefault(tensor.untyped_storage().data_ptr(), name)
        for name, kept in saved.items():
            internal: dict[tuple[Any, ...], int] = {}
            for tensor in kept:
                key = _identity(tensor)
                # the node whose output it is, else (a view made inside a kernel, e.g.
                # F.linear flattening a 3-d input) the node that allocated its memory
                source = exact.get(key) or allocator.get(key[0])
                if source is not None:
                    self.saved_from[name].add(source)
                elif key[0] not in self.persistent_storage:
                    internal[key] = tensor.numel() * tensor.element_size()
            self.saved_internal[name] = sum(internal.values())


def _identity(tensor: Any) -> tuple[Any, ...]:
    """What makes two tensor objects the same data: storage, offset, shape, strides, dtype."""
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
            tuple(tensor.stride()), tensor.dtype)


def _synchronized_clock() -> float:
    import torch

    torch.cuda.synchronize()
    return time.perf_counter()


def _device_of(module: Any, inputs: tuple[Any, ...]) -> Any:
    """The device the step runs on: the first parameter's, else the first input's, else CPU."""
    import torch

    for tensor in [*module.parameters(), *tensors(inputs)]:
        return tensor.device
    return torch.device("cpu")


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else 0.0


def _parameter_groups(
    graph_module: Any,
) -> tuple[dict[str, str], dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """For the nodes owning parameters or buffers: (node → group label, node → its tensors,
    label → the group's tensors), tensors keyed by qualified name.

    Nodes that share a parameter or buffer (tied weights, a module called twice) form one
    group, labelled by its first node.
    """
    parent: dict[str, str] = {}

    def find(a: str) -> str:
        parent.setdefault(a, a)
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    first_owner: dict[int, str] = {}
    owned: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for node in graph_module.graph.nodes:
        mine = owned_tensors(node, graph_module)
        if not mine:
            continue
        order.append(node.name)
        owned[node.name] = mine
        find(node.name)
        for tensor in mine.values():
            other = first_owner.setdefault(id(tensor), node.name)
            if other != node.name:
                ra, rb = find(other), find(node.name)
                if ra != rb:
                    parent[rb] = ra
    label_of: dict[str, str] = {}
    members: dict[str, dict[str, Any]] = defaultdict(dict)
    for name in order:
        root = find(name)
        label = label_of.setdefault(root, name)  # the first node of the group in graph order
        label_of[name] = label
        for qualified, tensor in owned[name].items():
            if all(tensor is not t for t in members[label].values()):
                members[label][qualified] = tensor
    return {n: label_of[n] for n in order}, owned, dict(members)


def _document(graph_module: Any, run: _Run, optimizer: Any) -> dict[str, Any]:
    import torch

    nodes = [n for n in graph_module.graph.nodes if n.op != "output"]
    output_node = next(n for n in graph_module.graph.nodes if n.op == "output")
    group_of, owned_by, members = _parameter_groups(graph_module)
    param_label = dict(group_of)
    state_bytes = _optimizer_state_bytes(optimizer)
    loss, targets = run.loss_name, run.targets_name

    names = [n.name for n in nodes]
    first_compute = next((i for i, n in enumerate(nodes) if n.op != "placeholder"), len(nodes))
    names.insert(first_compute, targets)
    names.append(loss)
    position = {name: i for i, name in enumerate(names)}
    metadata_readers = {n.name for n in nodes if reads_metadata_only(n)}
    producers = [a.name for a in output_node.all_input_nodes]
    inputs_of: dict[str, list[str]] = {n.name: [a.name for a in n.all_input_nodes] for n in nodes}
    inputs_of[loss] = [*producers, targets]
    inputs_of[targets] = []
    consumers_of: dict[str, list[str]] = defaultdict(list)
    for name in names:
        for src in inputs_of[name]:
            consumers_of[src].append(name)
    types = {n.name: op_type(n, graph_module) for n in nodes}
    types[loss], types[targets] = "loss", "placeholder"
    fx_ops = {n.name: n.op for n in nodes}
    fx_ops[loss], fx_ops[targets] = "loss", "placeholder"
    # a node's output: its tensors, plus what its kernels made and autograd keeps for the
    # backward without it being an output at this level (e.g. max-pooling's indices)
    value_bytes = {name: nbytes(run.values.get(name)) for name in names}  # what edges carry
    size = {name: value_bytes[name] + run.saved_internal.get(name, 0) for name in names}
    requires_grad = {name: any(t.requires_grad for t in tensors(run.values.get(name)))
                     for name in names}
    has_backward = run.has_backward

    # Colocation: parameter groups; a forward op and its backward (autograd runs a backward
    # function where its forward ran); the loss with the module's output (apply_plan leaves
    # outputs where they were computed, so the user's loss runs there).
    for name in names:
        if name in has_backward and name != loss:
            group_of.setdefault(name, name)
    if producers:
        group_of.setdefault(producers[0], producers[0])
        group_of[loss] = group_of[producers[0]]
    # An in-place op mutates its input where that input lives: on another device it would
    # mutate a copy, and the input's other consumers would read the old value.
    for node in nodes:
        if mutates_input(node, graph_module) and node.all_input_nodes:
            _merge_groups(group_of, node.name, node.all_input_nodes[0].name)

    def trainable(tensors_: Any) -> list[Any]:
        return [t for t in tensors_ if isinstance(t, torch.nn.Parameter) and t.requires_grad]

    ops: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    for name in names:
        record: dict[str, Any] = {"name": name, "type": types[name],
                                  "compute_us": _median(run.forward_us.get(name, [])),
                                  "attrs": {"fx_op": fx_ops[name]}}
        # a get_attr of a parameter or buffer allocates nothing: its bytes are persistent
        # (its edges still carry them to consumers on other devices)
        allocates = not (fx_ops[name] == "get_attr" and name in run.persistent_values)
        if size[name] and allocates:
            record["output_bytes"] = size[name]
        if run.saved_internal.get(name):
            record["attrs"]["saved_internal_bytes"] = run.saved_internal[name]
        if name in group_of:
            record["colocation_group"] = group_of[name]
        if name in members:
            owned = list(members[name].values())
            record["persistent_bytes"] = (sum(_nbytes(t) for t in owned)          # values
                                          + sum(_nbytes(t) for t in trainable(owned))  # grads
                                          + sum(state_bytes.get(id(t), 0) for t in owned))
            record["attrs"]["parameters"] = sorted(members[name])
        ops.append(record)
        if name in metadata_readers:  # x.size(1): no data moves, apply_plan adds no transfer
            edges.extend({"src": src, "dst": name, "bytes": 0, "control": True}
                         for src in inputs_of[name])
        else:
            edges.extend({"src": src, "dst": name, "bytes": value_bytes[src]}
                         for src in inputs_of[name])

    def grad_sources(name: str) -> list[str]:
        """Nearest ops at or above ``name`` whose backward receives the gradient of it."""
        out, stack, seen = [], [name], {name}
        while stack:
            current = stack.pop()
            if current in has_backward:
                out.append(current)
                continue
            for src in inputs_of[current]:
                if src not in seen and requires_grad[src]:
                    seen.add(src)
                    stack.append(src)
        return out

    # Backward ops, in reverse forward order (the order autograd runs them in).
    for name in reversed(names):
        if name not in has_backward:
            continue
        backward = name + BACKWARD
        out = sum(value_bytes[src] for src in inputs_of[name] if requires_grad[src])
        record = {"name": backward, "type": f"{types[name]}Backward",
                  "compute_us": _median(run.backward_us.get(name, [])),
                  "forward_op": name, "colocation_group": group_of[name],
                  "attrs": {"fx_op": "backward"}}
        if out:
            record["output_bytes"] = out
        ops.append(record)
        # saved activations, as autograd saved them: the same tensors as the forward edges
        # (a device that received them does not receive them again), kept in memory until
        # the backward has run; the forward op itself precedes its backward in any case
        saved = sorted(run.saved_from.get(name, ()), key=position.__getitem__)
        if run.saved_internal.get(name) and name not in saved:
            saved.append(name)  # its own saved tensors are part of its output (see above)
        edges.extend({"src": src, "dst": backward, "bytes": value_bytes[src]} for src in saved)
        if name not in saved:
            edges.append({"src": name, "dst": backward, "bytes": 0, "control": True})
        # the gradient of this op's output, from every consumer's backward
        for consumer in consumers_of[name]:
            if consumer in has_backward and requires_grad[name]:
                edges.append({"src": consumer + BACKWARD, "dst": backward,
                              "bytes": value_bytes[name], "tensor": f"grad:{name}@{consumer}"})
    # gradients through ops without backward work of their own (getitem on a tuple, ...)
    for name in names:
        if name in has_backward or not requires_grad[name]:
            continue
        sources = [s for s in grad_sources(name) if s != name]
        for consumer in consumers_of[name]:
            if consumer in has_backward:
                edges.extend({"src": consumer + BACKWARD, "dst": source + BACKWARD,
                              "bytes": value_bytes[name], "tensor": f"grad:{name}@{consumer}"}
                             for source in sources)

    # Optimizer updates: one per parameter group with trainable parameters.
    elements = {label: sum(t.numel() for t in trainable(owned.values()))
                for label, owned in members.items()}
    total = sum(elements.values())
    update_us = _median(run.update_us)
    for label in members:
        if not elements[label]:
            continue
        update = label + UPDATE
        ops.append({"name": update, "type": f"{type(optimizer).__name__}Update",
                    "compute_us": round(update_us * elements[label] / total, 3),
                    "colocation_group": group_of[label], "attrs": {"fx_op": "update"}})
        for owner in [n for n in owned_by if param_label[n] == label]:
            grad = sum(_nbytes(t) for t in trainable(owned_by[owner].values()))
            if owner in has_backward:    # a leaf module: its backward makes the gradients
                edges.append({"src": owner + BACKWARD, "dst": update, "bytes": grad,
                              "tensor": f"grad:{owner}:parameters"})
                continue
            for consumer in consumers_of[owner]:  # get_attr: its consumers' backward do
                if consumer in has_backward and grad:
                    edges.append({"src": consumer + BACKWARD, "dst": update, "bytes": grad,
                                  "tensor": f"grad:{owner}@{consumer}"})
    return {"format": "baechi.graph/v1", "name": "", "meta": {}, "ops": ops,
            "edges": _dedupe(edges)}


def _merge_groups(group_of: dict[str, str], a: str, b: str) -> None:
    """Put ops ``a`` and ``b`` (and their groups) in one colocation group, ``b``'s."""
    old, new = group_of.setdefault(a, a), group_of.setdefault(b, b)
    if old != new:
        for name, label in group_of.items():
            if label == old:
                group_of[name] = new


def _nbytes(tensor: Any) -> int:
    return int(tensor.numel() * tensor.element_size())


def _optimizer_state_bytes(optimizer: Any) -> dict[int, int]:
    """``id(parameter)`` → bytes of its optimizer state (momentum, Adam moments, ...)."""
    out: dict[int, int] = {}
    for parameter, state in optimizer.state.items():
        out[id(parameter)] = sum(nbytes(v) for v in state.values())
    return out


def _dedupe(edges: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[tuple[Any, ...]] = set()
    out = []
    for edge in edges:
        key = (edge["src"], edge["dst"], edge.get("tensor", edge["src"]), edge.get("control"))
        if key not in seen:
            seen.add(key)
            out.append(edge)
    return out


__all__ = ["BACKWARD", "UPDATE", "profile"]
