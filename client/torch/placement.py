"""``apply_plan`` for PyTorch: put a module's parameters and ops where a plan says (issue 13).

The module is traced with ``torch.fx`` exactly as :func:`baechi.client.torch.profile` traced
it, so the plan names its nodes. The returned ``GraphModule``:

- holds the module's own parameters and buffers (moved in place, so an optimizer made before
  or after ``apply_plan`` trains it), each on the device of the node that owns it;
- runs every node on its planned device: a ``_transfer`` node (``tensor.to(device)``, which
  autograd differentiates, so gradients flow back across the same edge) is inserted before
  the first consumer on each device an output is needed on — one per (tensor, device), as the
  cost model's transfer cache (docs/format.md §4); tensor factories get the node's device;
- moves its inputs to their placeholders' planned devices and leaves each output on the device
  that computed it (``placed.baechi.output_device``; the loss runs there).

:func:`check_devices` runs a placed module (forward, and backward with a loss) with every
PyTorch op checked: all its tensors on one device (0-dim CPU scalars aside, as PyTorch allows),
and records where each node's output was. :func:`verify_transfers` maps one planned device at a
time to ``meta`` and the others to ``cpu``, so that a missing transfer fails loudly.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from baechi.client.errors import InvalidInput, PlanMismatch
from baechi.client.tf.devices import device_index
from baechi.client.torch.tracing import owned_tensors, reads_metadata_only, tensors, trace

#: Functions that create tensors: without a ``device`` argument they would create them on
#: the default device instead of the node's.
FACTORY_NAMES = frozenset({"arange", "empty", "eye", "full", "linspace", "ones", "rand",
                           "randint", "randn", "tensor", "zeros"})


def _transfer(value: Any, device: str) -> Any:
    """Every tensor in ``value`` on ``device`` (a no-op for tensors already there)."""
    import torch
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: t.to(device), value)


@dataclass
class PlacedInfo:
    """What :func:`apply_plan` did; ``placed.baechi`` on the returned module.

    Attributes
    ----------
    placement : dict
        Node name → plan device, for every node of the module's trace.
    devices : dict
        Plan device → local ``torch.device``.
    transfers : list of (src node, dst node, src plan device, dst plan device)
        The cross-device edges, each with its own ``_transfer`` node (the first consumer on a
        device; later consumers there reuse it).
    output_device : torch.device or None
        Where the (first tensor of the) output is computed: put the targets there.
    """

    placement: dict[str, str]
    devices: dict[str, Any]
    transfers: list[tuple[str, str, str, str]] = field(default_factory=list)
    output_device: Any = None

    def local(self, node: str) -> Any:
        """The local device of a planned node."""
        return self.devices[self.placement[node]]


def default_device_map(plan_devices: Iterable[str]) -> dict[str, Any]:
    """``/GPU:i`` → ``cuda:i``; every device → ``cpu`` (with a warning) without enough GPUs.

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     mapping = default_device_map(["/GPU:0", "/GPU:1"])
    >>> sorted(mapping) == ["/GPU:0", "/GPU:1"] and len(set(mapping.values())) in (1, 2)
    True
    """
    import torch

    names = sorted(set(plan_devices))
    indices = {name: device_index(name) for name in names}
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if indices and max(indices.values()) < available:
        return {name: torch.device("cuda", i) for name, i in indices.items()}
    warnings.warn(
        f"the plan uses {len(names)} device(s) ({', '.join(names)}) but {available} CUDA "
        "device(s) are present: every op runs on the CPU (pass device_map= to choose)",
        RuntimeWarning, stacklevel=3)
    return {name: torch.device("cpu") for name in names}


def apply_plan(
    module: Any,
    plan: Any,
    device_map: dict[str, Any] | None = None,
    *,
    optimizer: Any = None,
    leaf_modules: Iterable[type | str] = (),
    example_inputs: Any = None,
) -> Any:
    """A module that runs ``module``'s ops on their planned devices.

    Parameters
    ----------
    module : torch.nn.Module
        The module that was profiled (same class, same ``leaf_modules``). Its parameters and
        buffers are moved in place (they stay the same objects).
    plan : baechi.Plan, dict, or path
        A ``baechi.plan/v1`` plan made from :func:`baechi.client.torch.profile`'s graph.
    device_map : dict, optional
        Plan device name → ``torch.device`` or string (``"cuda:1"``, ``"cpu"``, ``"meta"``).
        Default :func:`default_device_map`.
    optimizer : torch.optim.Optimizer, optional
        Its state (momentum, Adam moments) is moved along with the parameters.
    leaf_modules : iterable
        As given to ``profile``.
    example_inputs : tensor or tuple, optional
        The inputs given to ``profile``: needed to capture the module the same way when
        ``profile`` used ``torch.export`` (its graph's ``meta.capture``).

    Returns
    -------
    torch.fx.GraphModule
        Train it like the module: ``loss_fn(placed(x), y).backward(); optimizer.step()``;
        ``placed.baechi`` is a :class:`PlacedInfo`.

    Raises
    ------
    PlanMismatch
        The plan does not name the module's ops, splits a parameter's owners, or names a
        device the map lacks.
    InvalidInput
        ``plan`` is not a plan.
    """
    import torch

    from baechi.client.tf.pinning import read_plan

    placement_by_plan = read_plan(plan).placement
    if example_inputs is not None and not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    placed = trace(module, leaf_modules, example_inputs=example_inputs)
    graph = placed.graph
    nodes = [n for n in graph.nodes if n.op != "output"]
    missing = [n.name for n in nodes if n.name not in placement_by_plan]
    if missing:
        hint = ("; a plan made from a torch.export capture needs example_inputs= (the "
                "inputs given to profile)" if example_inputs is None
                and placed.meta["baechi_leaf_modules"] else "")
        raise PlanMismatch(
            f"the plan does not name {len(missing)} of the {len(nodes)} ops of "
            f"{type(module).__name__} (e.g. {', '.join(missing[:5])}): was it made for this "
            f"module's profile?{hint}", details={"missing": missing[:20]})
    placement = {n.name: placement_by_plan[n.name] for n in nodes}
    used = sorted(set(placement.values()))
    if device_map is None:
        devices = default_device_map(used)
    else:
        absent = [d for d in used if d not in device_map]
        if absent:
            raise PlanMismatch(f"device_map has no entry for plan device(s) {absent}",
                               details={"devices": absent})
        try:
            devices = {d: torch.device(device_map[d]) for d in used}
        except (RuntimeError, TypeError) as exc:
            raise InvalidInput(f"device_map: {exc}") from None

    before = {n.name: owned_tensors(n, placed) for n in nodes}
    _move_parameters(placed, nodes, placement, devices)
    if optimizer is not None:
        # a move PyTorch cannot do in place (to meta) makes new Parameter objects
        renamed = {id(old): owned_tensors(n, placed)[q] for n in nodes
                   for q, old in before[n.name].items()}
        _move_optimizer_state(optimizer, renamed)
    info = PlacedInfo(placement, devices)
    _insert_transfers(graph, nodes, info)
    graph.lint()
    placed.recompile()
    placed.baechi = info
    return placed


def _move_parameters(placed: Any, nodes: list[Any], placement: dict[str, str],
                     devices: dict[str, Any]) -> None:
    """Each parameter and buffer to its owner's device; owners sharing one must agree."""
    import torch

    owner_of: dict[int, str] = {}
    for node in nodes:
        device = placement[node.name]
        for qualified, tensor in owned_tensors(node, placed).items():
            other = owner_of.setdefault(id(tensor), node.name)
            if placement[other] != device:
                raise PlanMismatch(
                    f"{qualified} belongs to ops {other} ({placement[other]}) and "
                    f"{node.name} ({device}): the plan must put them on one device",
                    details={"ops": [other, node.name]})
    for node in nodes:
        device = devices[placement[node.name]]
        if node.op == "call_module":
            # Module.to keeps each Parameter object where the device allows (cpu <-> cuda)
            placed.get_submodule(node.target).to(device)
        elif node.op == "get_attr":
            path, _, attr = node.target.rpartition(".")
            owner = placed.get_submodule(path) if path else placed
            value = getattr(owner, attr)
            if isinstance(value, torch.Tensor) and value.device != device:
                _move_attribute(owner, attr, value, device)


def _move_attribute(owner: Any, attr: str, value: Any, device: Any) -> None:
    """``owner.attr`` to ``device``: in place when PyTorch allows it, else a new tensor."""
    import torch

    moved = value.data.to(device)
    if torch._has_compatible_shallow_copy_type(value, moved):
        value.data = moved
        if value.grad is not None:
            value.grad = value.grad.to(device)
    elif isinstance(value, torch.nn.Parameter):
        setattr(owner, attr, torch.nn.Parameter(moved, requires_grad=value.requires_grad))
    elif attr in getattr(owner, "_buffers", {}):
        owner._buffers[attr] = moved
    else:
        setattr(owner, attr, moved)


def _move_optimizer_state(optimizer: Any, renamed: dict[int, Any]) -> None:
    """The optimizer's parameters (replaced where they were re-created) and state, moved."""
    import torch

    for group in optimizer.param_groups:
        group["params"] = [renamed.get(id(p), p) for p in group["params"]]
    for parameter in list(optimizer.state):
        state = optimizer.state.pop(parameter)
        parameter = renamed.get(id(parameter), parameter)
        for key, value in list(state.items()):
            # per-element state follows its parameter; scalars (Adam's step) stay put
            if isinstance(value, torch.Tensor) and value.shape == parameter.shape:
                state[key] = value.to(parameter.device)
        optimizer.state[parameter] = state


def _insert_transfers(graph: Any, nodes: list[Any], info: PlacedInfo) -> None:
    import torch

    device_of = {n: info.placement[n.name] for n in nodes}
    for node in nodes:
        node.meta["baechi_device"] = device_of[node]
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if placeholders:
        # inputs arrive wherever the caller has them: move each to its placeholder's device
        with graph.inserting_after(placeholders[-1]):
            for ph in reversed(placeholders):
                moved = graph.call_function(_transfer, (ph, str(info.local(ph.name))))
                moved.meta["baechi_transfer"] = (ph.name, ph.name)
                ph.replace_all_uses_with(moved, delete_user_cb=lambda user, m=moved: user is not m)
                device_of[moved] = device_of[ph]
    made: dict[tuple[Any, str], Any] = {}
    for node in nodes:
        if node.op == "placeholder":
            continue
        device = device_of[node]
        if reads_metadata_only(node):  # x.size(1) reads no data: nothing to move
            continue
        for source in list(node.all_input_nodes):
            if device_of.get(source, device) == device:
                continue
            key = (source, device)
            if key not in made:
                with graph.inserting_before(node):
                    made[key] = graph.call_function(
                        _transfer, (source, str(info.devices[device])))
                made[key].meta["baechi_transfer"] = (_origin(source), node.name)
                info.transfers.append((_origin(source), node.name, device_of[source], device))
            node.replace_input_with(source, made[key])
        if (node.op == "call_function" and getattr(node.target, "__module__", "") == "torch"
                and getattr(node.target, "__name__", "") in FACTORY_NAMES
                and "device" not in node.kwargs):
            node.kwargs = {**node.kwargs, "device": str(info.devices[device])}
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            _retarget_device(node, info.devices[device])
    output = next(n for n in graph.nodes if n.op == "output")
    first = next((a for a in output.all_input_nodes if a in device_of), None)
    info.output_device = info.devices[device_of[first]] if first is not None else None


def _retarget_device(node: Any, device: Any) -> None:
    """torch.export records the device an ATen call (``arange``, ``full``, ``to``, ...) named
    at capture, as a keyword or a positional argument: the planned device replaces it."""
    names = [argument.name for argument in node.target._schema.arguments]
    if "device" not in names:
        return
    index = names.index("device")
    if index < len(node.args) and node.args[index] is not None:
        node.args = (*node.args[:index], device, *node.args[index + 1:])
    elif node.kwargs.get("device") is not None:
        node.kwargs = {**node.kwargs, "device": device}


def _origin(node: Any) -> str:
    """The planned node behind an input transfer node."""
    return node.meta.get("baechi_transfer", (node.name,))[0]


# ------------------------------------------------------------------------------- checks
@dataclass
class DeviceCheck:
    """Where a placed module's nodes ran, from :func:`check_devices`.

    Attributes
    ----------
    ops : int
        Planned nodes whose output holds a tensor (others have no device), placeholders
        aside (they are the caller's tensors; the input transfers move them).
    on_planned_device : int
        Of those, the ones whose every output tensor is on the node's planned device.
    mismatches : list of (node, planned local device, devices of its outputs)
    transfers : int
        Transfer nodes run (input moves included).
    backward : bool
        Whether the backward pass ran under the check too.
    """

    ops: int = 0
    on_planned_device: int = 0
    mismatches: list[tuple[str, str, list[str]]] = field(default_factory=list)
    transfers: int = 0
    backward: bool = False

    @property
    def ok(self) -> bool:
        """Every op on its planned device."""
        return self.ops > 0 and self.on_planned_device == self.ops


def _strict_mode() -> Any:
    """A dispatch mode in which an op mixing devices raises :class:`PlanMismatch`.

    Copies between devices are the transfers and pass; a copy out of ``meta`` gives zeros
    (a meta tensor has no data; the check is about devices, not values).
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    aten = torch.ops.aten
    copies = {aten._to_copy.default, aten.copy_.default, aten._copy_from.default,
              aten._copy_from_and_resize.default}

    class StrictDevices(TorchDispatchMode):
        where = "forward"

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func in copies:
                source = args[1] if func is aten.copy_.default else args[0]
                target = (args[0].device if func is aten.copy_.default
                          else torch.device(kwargs.get("device") or source.device))
                if source.device.type == "meta" and target.type != "meta":
                    if func is aten.copy_.default:
                        return args[0]
                    return torch.zeros(source.shape, device=target,
                                       dtype=kwargs.get("dtype") or source.dtype)
                return func(*args, **kwargs)
            found = {t.device for t in tree_leaves((args, kwargs))
                     if isinstance(t, torch.Tensor) and not (t.device.type == "cpu"
                                                              and t.dim() == 0)}
            if len(found) > 1:
                raise PlanMismatch(
                    f"{func} got tensors on {sorted(map(str, found))} in the {self.where}: "
                    "a transfer between devices is missing",
                    details={"op": str(func), "where": self.where})
            return func(*args, **kwargs)

    return StrictDevices()


def check_devices(placed: Any, inputs: Any, targets: Any = None,
                  loss_fn: Any = None) -> DeviceCheck:
    """Run ``placed`` once with every op's devices checked; report where each node ran.

    Parameters
    ----------
    placed : torch.fx.GraphModule
        What :func:`apply_plan` returned.
    inputs : Tensor or tuple of Tensors
    targets, loss_fn : optional
        Given both, the backward pass runs under the check too (targets are moved to
        ``placed.baechi.output_device``, as a training loop would).

    Raises
    ------
    PlanMismatch
        An op got tensors on two devices (a transfer is missing).
    """
    import torch
    import torch.fx

    info: PlacedInfo = placed.baechi
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    report = DeviceCheck()
    mode = _strict_mode()

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            try:
                out = super().run_node(n)
            except PlanMismatch as exc:  # name the node, not only the kernel
                raise PlanMismatch(f"{exc.message} (node {n.name!r}, planned on "
                                   f"{n.meta.get('baechi_device')})",
                                   details={**exc.details, "node": n.name}) from None
            if "baechi_transfer" in n.meta:
                report.transfers += 1
            elif "baechi_device" in n.meta and n.op != "placeholder":
                found = sorted({str(t.device) for t in tensors(out)})
                if found:
                    report.ops += 1
                    planned = str(info.local(n.name))
                    if found == [planned]:
                        report.on_planned_device += 1
                    else:
                        report.mismatches.append((n.name, planned, found))
            return out

    with mode:
        output = Recorder(placed).run(*inputs)
        if loss_fn is not None and targets is not None:
            moved = _transfer(targets, str(info.output_device or "cpu"))
            loss = loss_fn(output, moved)
            mode.where = "backward"
            loss.backward()
            report.backward = True
    return report


def verify_transfers(module: Any, plan: Any, inputs: Any, targets: Any = None,
                     loss_fn: Any = None, *,
                     leaf_modules: Iterable[type | str] = ()) -> dict[str, DeviceCheck]:
    """For each plan device: map it to ``meta``, the others to ``cpu``, and check a step.

    ``module`` is deep-copied each time (a meta parameter has no values). A missing transfer
    on any cross-device edge raises :class:`PlanMismatch`, in the forward or the backward.

    Returns
    -------
    dict
        Plan device → the :class:`DeviceCheck` of the run where it was ``meta``.
    """
    from baechi.client.tf.pinning import read_plan

    placement = read_plan(plan).placement
    used = sorted(set(placement.values()))
    checks = {}
    for meta in used:
        mapping = {d: ("meta" if d == meta else "cpu") for d in used}
        placed = apply_plan(copy.deepcopy(module), plan, mapping, leaf_modules=leaf_modules,
                            example_inputs=inputs)
        checks[meta] = check_devices(placed, inputs, targets, loss_fn)
    return checks


__all__ = ["FACTORY_NAMES", "DeviceCheck", "PlacedInfo", "apply_plan", "check_devices",
           "default_device_map", "verify_transfers"]
