"""``apply_plan``: put a Keras model's variables and ops where a plan says (docs/format.md §8).

Three things happen:

1. Each variable of the model and of its optimizer moves to its planned device (the plan
   names it by its Keras path, as :func:`client.profile` does); the optimizer's variable index,
   keyed by the variables' identities, is rebuilt.
2. A device function looks every op up in the plan by name while the training step is traced
   again; ops the plan does not name keep the device TensorFlow gives them.
3. With ``enforce_order`` (the default), once the step is traced each device's planned ops
   are chained by control dependencies in the plan's ``order``, and, when the plan carries a
   ``transfer_order``, every planned cross-device tensor is routed through an ``Identity`` on
   its receiving device and those identities are chained per channel in that order (see
   :mod:`baechi.client.tf.control_edges`). :attr:`AppliedPlan.enforcement` says what was added.
4. ``model.fit`` is patched to trace its step under that device function (and without XLA,
   which would compile the whole step for one device); :meth:`AppliedPlan.wrap` and
   :meth:`AppliedPlan.train_step` do the same for a custom training loop.

:meth:`AppliedPlan.check` records which device every op really ran on (from the partition
graphs TensorFlow executed) and reports how many planned ops ran where planned.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from baechi.client.errors import InvalidInput, PlanMismatch
from baechi.client.tf.control_edges import Enforcement, enforce
from baechi.client.tf.devices import cluster_device_names, local_devices, map_devices


@dataclass
class PlacementReport:
    """Where the planned ops really ran, from :meth:`AppliedPlan.check`.

    Attributes
    ----------
    planned : int
        Planned ops found among the executed nodes.
    on_planned_device : int
        Of those, the ones that ran on their planned device.
    missing : list of str
        Planned ops not seen executing (folded, fused or pruned by TensorFlow's graph
        optimizer, or the step's inputs).
    mismatches : list of (op, planned device, devices it ran on)
    executed_nodes : int
        Nodes TensorFlow executed (all functions, all devices).
    variables, variables_on_planned_device : int
        Planned variables of the model and optimizer, and those stored on their device.
    """

    planned: int = 0
    on_planned_device: int = 0
    missing: list[str] = field(default_factory=list)
    mismatches: list[tuple[str, str, list[str]]] = field(default_factory=list)
    executed_nodes: int = 0
    variables: int = 0
    variables_on_planned_device: int = 0

    @property
    def fraction(self) -> float:
        """Share of the found planned ops that ran on their planned device."""
        return self.on_planned_device / self.planned if self.planned else 0.0


class AppliedPlan:
    """A plan applied to a model: the device function and helpers to trace placed steps.

    Returned by :func:`apply_plan`; not built directly.
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        placement: dict[str, str],
        devices: dict[str, str],
        moved: dict[str, str],
        unplanned_variables: list[str],
        order: dict[str, list[str]] | None = None,
        transfer_order: dict[str, list[dict[str, Any]]] | None = None,
        enforce_order: bool = False,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        #: op name → local device, for every op of the plan.
        self.placement = placement
        #: plan device → local device.
        self.devices = devices
        #: variable path → local device, for the variables that moved.
        self.moved_variables = moved
        #: variables the plan does not name (left where they were).
        self.unplanned_variables = unplanned_variables
        #: planned ops the device function has seen while a step was traced → their type.
        self.traced: dict[str, str] = {}
        #: local device → its planned ops in the plan's order (None: the plan has none).
        self.order = order
        #: plan device → its channel's transfers in order (``dst`` mapped to local devices).
        self.transfer_order = transfer_order
        #: order the traced steps by control dependencies (see :func:`apply_plan`).
        self.enforce_order = enforce_order
        #: what enforcing the order added to the most recently traced step.
        self.enforcement: Enforcement | None = None
        self._tracing: list[set[str]] = []

    def __repr__(self) -> str:
        return (f"AppliedPlan({len(self.placement)} ops on {len(set(self.devices.values()))} "
                f"devices, {len(self.moved_variables)} variables moved)")

    def device_for(self, op_name: str) -> str | None:
        """The local device the plan gives ``op_name``, None when it does not name it."""
        return self.placement.get(op_name)

    def device_function(self, op: Any) -> str:
        """For ``Graph.device``: the planned device of ``op``, else the device it has."""
        device = self.placement.get(op.name)
        if device is None:
            return op.device
        self.traced[op.name] = op.type
        if self._tracing:
            self._tracing[-1].add(op.name)
        return device

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Inside a ``tf.function`` being traced: create ops on their planned devices.

        With order enforcement, the ops created in the block are ordered when it exits.
        """
        import tensorflow as tf

        if tf.executing_eagerly():
            raise PlanMismatch(
                "AppliedPlan.scope() works while a tf.function is traced; in eager code use "
                "AppliedPlan.wrap(step) or AppliedPlan.train_step(loss)"
            )
        graph = tf.compat.v1.get_default_graph()
        self._tracing.append(set())
        try:
            with graph.device(self.device_function):
                yield
            created = self._tracing[-1]
        finally:
            self._tracing.pop()
        if self.enforce_order and self.order is not None:
            # The whole step exists now: order it (see baechi.client.tf.control_edges).
            self.enforcement = enforce(graph, self.order, self.transfer_order,
                                       self.placement, created)

    def wrap(self, step: Callable[..., Any], **function_kwargs: Any) -> Any:
        """``tf.function(step)`` whose ops are created on their planned devices."""
        import tensorflow as tf

        def placed(*args: Any, **kwargs: Any) -> Any:
            with self.scope():
                return step(*args, **kwargs)

        placed.__name__ = getattr(step, "__name__", "placed_step")
        return tf.function(placed, **function_kwargs)

    def train_step(self, loss: Any, optimizer: Any = None) -> Any:
        """The standard training step (the one :func:`client.profile` measures), placed.

        Returns a ``tf.function`` ``step(x, y) -> loss``.
        """
        from baechi.client.tf.train_step import make_train_step

        optimizer = optimizer if optimizer is not None else self.optimizer
        if optimizer is None:
            raise PlanMismatch("train_step needs an optimizer (none given, model not compiled)")
        return self.wrap(make_train_step(self.model, loss, optimizer))

    @contextlib.contextmanager
    def check(self) -> Iterator[PlacementReport]:
        """Record where ops run while the block executes; fill the yielded report at exit.

        >>> with applied.check() as report:        # doctest: +SKIP
        ...     model.fit(x, y, epochs=1)
        >>> report.fraction                        # doctest: +SKIP
        """
        from tensorflow.python.eager import context

        report = PlacementReport()
        ctx = context.context()
        ctx.enable_run_metadata()
        try:
            yield report
            metadata = ctx.export_run_metadata()
        finally:
            ctx.disable_run_metadata()
        variables = self._variables()
        _fill_report(report, metadata, self.placement, self.traced, skip=set(variables))
        for path, variable in variables.items():
            report.variables += 1
            if same_device(variable.value.device, self.placement[path]):
                report.variables_on_planned_device += 1

    def _variables(self) -> dict[str, Any]:
        """Planned variables of the model and optimizer, by path."""
        found = {}
        optimizer_variables = list(self.optimizer.variables) if self.optimizer else []
        for variable in [*self.model.variables, *optimizer_variables]:
            if variable.path in self.placement:
                found[variable.path] = variable
        return found


def apply_plan(
    model: Any,
    plan: Any,
    device_map: Mapping[str, str] | None = None,
    *,
    optimizer: Any = None,
    devices: list[str] | None = None,
    device_type: str | None = None,
    patch_fit: bool = True,
    enforce_order: bool = True,
) -> AppliedPlan:
    """Move ``model``'s variables to their planned devices and prepare placed training steps.

    Parameters
    ----------
    model : keras.Model
        The profiled model (built).
    plan : baechi.Plan, dict, or path
        A ``baechi.plan/v1`` plan (only ``placement`` and ``request.cluster`` are read).
    device_map : dict, optional
        Plan device name → local TensorFlow device name (``"/GPU:1"``,
        ``"/job:localhost/replica:0/task:0/device:CPU:2"``), as PyTorch's ``apply_plan``
        takes it. Default: ``devices[i]`` (or the i-th local device) for the plan's ``/GPU:i``.
    optimizer : keras optimizer, optional
        Default ``model.optimizer`` (after ``compile``). Built here when needed; its variables
        move too, and its variable index is rebuilt. Passing it third, by position, is the
        former signature: it still works, with a ``DeprecationWarning``.
    devices : list of str, optional
        Local device names, ``devices[i]`` standing for the plan's ``/GPU:i``; default the
        local GPUs, else the local (logical) CPUs. Ignored with ``device_map``.
    device_type : {"GPU", "CPU"}, optional
        Which local devices stand for the plan's devices (default: GPUs if there are any).
    patch_fit : bool
        Make ``model.fit`` trace its step under the plan (and without XLA).
    enforce_order : bool
        Make each device run its planned ops in the plan's ``order``, and the plan's
        transfers (when it carries a ``transfer_order``) arrive in each channel's order, by
        control dependencies in the traced step (:mod:`baechi.client.tf.control_edges`). False
        leaves the order to TensorFlow's executor; so does a plan without an ``order`` (a
        hand-written placement).

    Returns
    -------
    AppliedPlan
        ``.wrap(step)``, ``.train_step(loss)``, ``.scope()`` and ``.check()``;
        ``.enforcement`` after a step was traced.

    Raises
    ------
    PlanMismatch
        The plan needs more devices than there are here, or names none of the model's
        variables.
    InvalidInput
        ``plan`` is not a plan.

    Notes
    -----
    tf.functions traced before this call hold the old variables: trace them again (Keras's own
    ``fit``/``evaluate``/``predict`` functions are reset here).
    """
    if device_map is not None and not isinstance(device_map, Mapping):
        warnings.warn("apply_plan(model, plan, optimizer) is deprecated: pass the optimizer as "
                      "optimizer=..., the third argument is now device_map",
                      DeprecationWarning, stacklevel=2)
        device_map, optimizer = None, device_map
    applied = prepare_plan(model, plan, optimizer, devices=devices, device_type=device_type,
                           enforce_order=enforce_order, device_map=device_map)
    moved, unplanned = _move_variables(model, applied.optimizer, applied.placement)
    if applied.optimizer is not None:
        _reindex(applied.optimizer)
    applied.moved_variables, applied.unplanned_variables = moved, unplanned
    _reset_functions(model)
    if patch_fit:
        _patch_fit(model, applied)
    return applied


def prepare_plan(
    model: Any,
    plan: Any,
    optimizer: Any = None,
    *,
    devices: list[str] | None = None,
    device_type: str | None = None,
    enforce_order: bool = True,
    device_map: Mapping[str, str] | None = None,
) -> AppliedPlan:
    """:func:`apply_plan` without moving anything: the plan read and mapped onto local devices.

    :func:`baechi.client.tf.measurement.measure` traces placed steps with it and leaves the
    model as it is.
    Parameters as for :func:`apply_plan`.
    """
    read = read_plan(plan)
    if device_map is not None:
        missing = sorted(set(read.placement.values()) - set(device_map))
        if missing:
            raise PlanMismatch(f"device_map has no local device for the plan's {missing}",
                               details={"devices": missing})
        mapping = {name: device_map[name] for name in set(read.placement.values())}
    else:
        if devices is None:
            kind, local = local_devices(device_type)
        else:
            kind, local = "given", list(devices)
        mapping = map_devices(read.placement.values(), local, kind, read.cluster_order)
    placement = {op: mapping[device] for op, device in read.placement.items()}

    if optimizer is None:
        optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not getattr(optimizer, "built", False):
        optimizer.build(model.trainable_variables)
    if not any(v.path in placement for v in model.variables):
        raise PlanMismatch(
            f"the plan names none of the variables of model {model.name!r} (e.g. "
            f"{model.variables[0].path if model.variables else '-'}): was it made for another "
            "model, or profiled before the model was rebuilt?"
        )
    order = _local_order(read, placement, mapping)
    transfer_order = None
    if read.transfer_order is not None:
        transfer_order = _local_transfer_order(read.transfer_order, read.placement, mapping)
    return AppliedPlan(model, optimizer, placement, mapping, {}, [], order, transfer_order,
                       enforce_order)


# ------------------------------------------------------------------------------ plans
@dataclass
class ReadPlan:
    """What the SDK reads from a plan (``read_plan``): checked, nothing resolved yet."""

    placement: dict[str, str]
    cluster_order: list[str]
    order: dict[str, list[str]] | None
    transfer_order: dict[str, list[dict[str, Any]]] | None


def read_plan(plan: Any) -> ReadPlan:
    """Placement, cluster device order, op order and transfer order of a plan.

    From a Plan, a dict, JSON text or a path. A plan made for the throughput objective is
    refused (:class:`PlanMismatch`): ``apply_plan`` and ``measure`` run single steps.
    """
    if hasattr(plan, "placement") and hasattr(plan, "request"):
        placement = dict(plan.placement)
        cluster = plan.request.cluster
        objective = plan.request.model_dump().get("objective")
        order = getattr(plan, "order", None)
        transfer_order = getattr(plan, "transfer_order", None)
        if transfer_order is not None:  # TransferEntry models: read them as the JSON reads
            transfer_order = {device: [entry.model_dump() for entry in entries]
                              for device, entries in transfer_order.items()}
    else:
        if isinstance(plan, (str, bytes, Path)):
            plan = plan_document(plan)
        if not isinstance(plan, dict) or not isinstance(plan.get("placement"), dict):
            raise InvalidInput("plan: expected a baechi.plan/v1 document with a 'placement'")
        placement = plan["placement"]
        cluster = (plan.get("request") or {}).get("cluster") or {}
        objective = (plan.get("request") or {}).get("objective")
        order = plan.get("order")
        transfer_order = plan.get("transfer_order")
    if objective == "throughput":
        raise PlanMismatch(
            "this plan was made for objective 'throughput': its devices are pipeline stages "
            "that run micro-batches at once, and its time per sample holds only so. "
            "apply_plan runs one step split over the devices, which would be slower than the "
            "plan says; run it as pipeline stages (torch.distributed.pipelining), or place "
            "again with objective 'step_time'", details={"objective": objective})
    bad = [op for op, device in placement.items() if not isinstance(device, str)]
    if bad:
        raise InvalidInput(f"plan: placement of {bad[0]!r} is not a device name")
    return ReadPlan(placement, cluster_device_names(cluster), _check_order(order),
                     _check_transfer_order(transfer_order))


def plan_document(plan: str | bytes | Path) -> Any:
    """A plan given as JSON text, or as the path of a JSON file, parsed (not yet checked)."""
    if isinstance(plan, (str, Path)) and not str(plan).lstrip().startswith("{"):
        try:
            plan = Path(plan).read_bytes()
        except OSError as exc:
            raise InvalidInput(f"{plan}: cannot read plan: {exc.strerror}") from None
    try:
        return orjson.loads(plan)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"plan: not valid JSON: {exc}") from None


def _check_order(order: Any) -> dict[str, list[str]] | None:
    if order is None:
        return None
    if not isinstance(order, dict) or not all(
        isinstance(ops, list) and all(isinstance(op, str) for op in ops)
        for ops in order.values()
    ):
        raise InvalidInput("plan: 'order' must map each device to a list of op names")
    return order


def _check_transfer_order(order: Any) -> dict[str, list[dict[str, Any]]] | None:
    if order is None:
        return None
    if not isinstance(order, dict):
        raise InvalidInput("plan: 'transfer_order' must map each device to a list of transfers")
    for device, entries in order.items():
        if not isinstance(entries, list):
            raise InvalidInput(f"plan: transfer_order[{device!r}] is not a list")
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("src"), str) or \
                    not isinstance(entry.get("dst"), str):
                raise InvalidInput(
                    f"plan: transfer_order[{device!r}][{i}] needs 'src' and 'dst' names"
                )
    return order


def _local_order(
    read: ReadPlan, placement: dict[str, str], mapping: dict[str, str]
) -> dict[str, list[str]] | None:
    """Local device → its ops in the plan's order; None when the plan has no ``order``."""
    if read.order is None:
        return None  # a hand-written placement: nothing to enforce
    local: dict[str, list[str]] = {}
    for device, ops in read.order.items():
        if device not in mapping:
            continue  # a device the plan orders but puts nothing on
        wrong = [op for op in ops if placement.get(op) != mapping[device]]
        if wrong:
            raise InvalidInput(
                f"plan: order of {device!r} lists {wrong[0]!r}, which the placement puts on "
                f"{read.placement.get(wrong[0], 'no device')!r}"
            )
        local[mapping[device]] = list(ops)
    return local


def _local_transfer_order(
    order: dict[str, list[dict[str, Any]]], placement: dict[str, str], mapping: dict[str, str]
) -> dict[str, list[dict[str, Any]]]:
    """The transfer order with each entry's ``dst`` named by its local device."""
    local: dict[str, list[dict[str, Any]]] = {}
    for device, entries in order.items():
        channel = []
        for entry in entries:
            if entry["dst"] not in mapping or entry["src"] not in placement:
                raise InvalidInput(
                    f"plan: transfer_order[{device!r}] names {entry['src']!r} -> "
                    f"{entry['dst']!r}, which the placement does not know"
                )
            channel.append({**entry, "dst": mapping[entry["dst"]]})
        local[device] = channel
    return local


# -------------------------------------------------------------------------- variables
def _move_variables(
    model: Any, optimizer: Any, placement: dict[str, str]
) -> tuple[dict[str, str], list[str]]:
    """Re-create each planned variable on its device; return (moved, unplanned paths)."""
    variables = list(model.variables)
    if optimizer is not None:
        variables += list(optimizer.variables)
    moved: dict[str, str] = {}
    unplanned: list[str] = []
    seen: set[int] = set()
    for variable in variables:
        if id(variable) in seen:
            continue
        seen.add(id(variable))
        device = placement.get(variable.path)
        if device is None:
            unplanned.append(variable.path)
            continue
        if _move(variable, device):
            moved[variable.path] = device
    return moved, unplanned


def _move(variable: Any, device: str) -> bool:
    """Put a Keras variable's storage on ``device``, keeping its value; True if it moved."""
    import tensorflow as tf

    current = variable.value
    if same_device(current.device, device):
        return False
    if not hasattr(variable, "_initialize"):
        raise PlanMismatch(
            f"cannot move variable {variable.path}: not a Keras 3 TensorFlow variable"
        )
    with tf.device(device):
        variable._initialize(tf.identity(current))
    return True


def _reindex(optimizer: Any) -> None:
    """Rebuild the optimizer's variable index (keyed by the variables' storage ids)."""
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        _reindex(inner)
    variables = getattr(optimizer, "_trainable_variables", None)
    if variables is None or not hasattr(optimizer, "_trainable_variables_indices"):
        return
    optimizer._trainable_variables_indices = {
        optimizer._var_key(variable): i for i, variable in enumerate(variables)
    }


def same_device(a: str, b: str) -> bool:
    """True when two device strings name the same device type and index."""
    return bool(a and b) and _device_key(a) == _device_key(b)


@functools.lru_cache(maxsize=256)
def _device_key(name: str) -> tuple[str, int]:
    import tensorflow as tf

    spec = tf.DeviceSpec.from_string(name)
    return (spec.device_type or "").upper(), spec.device_index or 0


# ------------------------------------------------------------------------------ keras
def _reset_functions(model: Any) -> None:
    for attribute in ("train_function", "test_function", "predict_function"):
        if hasattr(model, attribute):
            setattr(model, attribute, None)


def _patch_fit(model: Any, applied: AppliedPlan) -> None:
    """Make Keras trace ``train_step`` under the plan's device function, without XLA."""
    step = type(model).train_step

    def train_step(data: Any) -> Any:
        with applied.scope():
            return step(model, data)

    model.train_step = train_step
    if getattr(model, "compiled", False) and getattr(model, "jit_compile", False):
        model.jit_compile = False


# ----------------------------------------------------------------------------- report
def _fill_report(
    report: PlacementReport,
    metadata: Any,
    placement: dict[str, str],
    traced: dict[str, str],
    skip: set[str],
) -> None:
    """Compare each planned op's device with the device its executed node ran on.

    Only the functions of placed steps count (those holding ops traced under the plan; not,
    say, the one-op functions Keras runs eagerly to reset a metric), and a node counts as the
    planned op only with the op's type (a constant folded from it is not it).
    """
    exact: dict[str, set[tuple[str, str]]] = {}
    inlined: dict[str, set[tuple[str, str]]] = {}
    lowered: dict[str, set[tuple[str, str]]] = {}
    for graph in _step_graphs(metadata, traced, placement):
        for node in graph.node:
            report.executed_nodes += 1
            exact.setdefault(node.name, set()).add((node.op, node.device))
            parts = node.name.removeprefix("Func/").split("/")
            for i in range(1, len(parts) - 1):
                inlined.setdefault("/".join(parts[i:]), set()).add((node.op, node.device))
                if parts[i] in LOWERED_PARTS:
                    # The frame of a lowered loop or conditional: "<op>/enter/_3", ...
                    lowered.setdefault("/".join(parts[:i]), set()).add(("", node.device))
    for op, device in placement.items():
        if op in skip:
            continue
        kind = traced.get(op)
        # A node of an inlined function is named "<call>/<op>": use it when no exact name.
        found = exact.get(op) or (inlined.get(op) if "/" in op else None) or set()
        ran_on = sorted({d for t, d in found if _same_kind(t, kind)})
        if not ran_on and kind in CONTROL_FLOW:
            ran_on = sorted({d for _, d in lowered.get(op, ())})
        if not ran_on:
            report.missing.append(op)
            continue
        report.planned += 1
        if any(same_device(d, device) for d in ran_on):
            report.on_planned_device += 1
        else:
            report.mismatches.append((op, device, ran_on))


#: Functional control flow, which TF lowers into frames of nodes named "<op>/<part>/...".
CONTROL_FLOW = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case",
                          "StatelessCase"})
LOWERED_PARTS = frozenset({"enter", "exit", "merge", "switch", "next_iteration", "switch_pred",
                           "output", "branch_executed"})


def _same_kind(executed: str, traced: str | None) -> bool:
    """The executed node is the traced op itself, or a fusion TF named after it."""
    return traced is None or executed == traced or executed.startswith("_")


def _step_graphs(
    metadata: Any, traced: dict[str, str], placement: dict[str, str]
) -> list[Any]:
    """Partition graphs of the functions that hold ops traced under the plan.

    A function counts when it holds enough traced ops and, as traced, asks for this plan's
    devices: TensorFlow may report again, while the block runs, a function traced earlier
    (unplaced, or under a plan since replaced) that holds the same op names on other devices.
    (Seen once steps traced with order enforcement had run; only the current function runs.)
    """
    functions = [(list(f.partition_graphs), f.pre_optimization_graph)
                 for f in getattr(metadata, "function_graphs", [])]
    if not functions:  # only then: the partitions listed at the top repeat the functions'
        functions = [([graph], None) for graph in getattr(metadata, "partition_graphs", [])]
    need = min(10, len(traced))
    chosen: list[Any] = []
    for partitions, traced_graph in functions:
        hits = sum(
            1
            for graph in partitions
            for node in graph.node
            if node.name in traced or node.name.partition("/")[2] in traced
        )
        if traced and hits >= need and _requests_plan(traced_graph, placement):
            chosen.extend(partitions)
    return chosen


def _requests_plan(graph: Any, placement: dict[str, str]) -> bool:
    """Whether the planned ops of a function, as traced, request their planned devices.

    A function traced without a plan requests none.
    """
    if graph is None:
        return True
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    # Ops made under a variable's colocation (an optimizer's updates) ask for no device.
    asked = [same_device(n.device, placement[n.name]) for n in nodes
             if n.name in placement and n.device]
    return bool(asked) and sum(asked) >= 0.9 * len(asked)


__all__ = ["AppliedPlan", "PlacementReport", "apply_plan", "prepare_plan", "same_device"]
