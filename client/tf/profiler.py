"""Profile a Keras training step into a ``baechi.graph/v1`` document (docs/format.md §2, §8).

How it works:

1. The training step (forward, loss, gradients, optimizer update; see
   :mod:`baechi.client.tf.train_step`) is traced with ``tf.function`` into a graph. Only the ops
   the step really runs (ancestors of its outputs and side effects) are kept.
2. That graph is imported into a TF1-style ``tf.Graph`` whose variables are copies of the
   model's and the optimizer's, and run by a ``tf.compat.v1.Session`` with ``FULL_TRACE``
   several times; every op's compute time is the median, over the steps, of its kernel time
   in the ``RunMetadata`` step stats. Graph rewrites are switched off so the names TF reports
   are the graph's; the nodes of lowered loops and inlined functions are charged to the op
   that owns them. The model's own variables are never touched.
3. The document: one op per graph op and one per variable (named by the variable's path, its
   bytes as ``persistent_bytes``); output bytes from static shapes × dtype size (measured
   allocations where a shape is not static); one edge per consumed tensor with its bytes,
   control dependencies as control edges; colocation groups from ``_class`` attributes and
   from variable ownership (every op that takes a variable's handle, as TF's placer requires);
   each ``gradient_tape/<scope>`` op names the forward op of ``<scope>`` as its ``forward_op``.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from baechi.client.errors import ProfileError
from baechi.client.tf.train_step import input_signature, make_train_step, prepare, resolve_optimizer

#: Name scope TensorFlow gives the gradient ops of a ``tf.GradientTape``.
GRADIENT_SCOPE = "gradient_tape/"
#: Ops that pass a resource handle on without dereferencing it: TF's placer does not colocate
#: them with the variable (its "input colocation exemptions").
RESOURCE_FORWARDERS = frozenset({"Identity", "IdentityN"})
RESOURCE_EXEMPT = frozenset({
    "While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
    "PartitionedCall", "StatefulPartitionedCall",
})
#: Loops: their i-th output is their i-th input after the last iteration.
LOOPS = frozenset({"While", "StatelessWhile"})
#: Op types that never have a kernel time of their own.
NOT_COMPUTE = frozenset({"Placeholder", "NoOp", "VarHandleOp", "Const"})
_SCOPE = "baechi_profile"


@dataclass
class _Variable:
    name: str
    value: Any
    trainable: bool

    @property
    def nbytes(self) -> int:
        return int(self.value.nbytes)


@dataclass
class _Measurements:
    """What the profiled steps measured, per exported op."""

    times_us: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    output_bytes: dict[tuple[str, int], int] = field(default_factory=dict)
    temp_bytes: dict[str, int] = field(default_factory=dict)
    steps: int = 0


def profile(
    model: Any,
    x: Any,
    y: Any,
    loss: Any,
    optimizer: Any,
    steps: int = 5,
    *,
    warmup: int = 1,
    name: str | None = None,
    train_step: Any = None,
) -> dict[str, Any]:
    """Profile one training step of ``model`` on the batch ``(x, y)``.

    Parameters
    ----------
    model : keras.Model
        The model; it is built here if needed. Its weights are not changed.
    x, y : array-like or nested structures of them
        One batch of inputs and targets; the profiled step has exactly these shapes.
    loss : keras loss, callable or name
        ``loss(y_true, y_pred)``.
    optimizer : keras optimizer or name
        Built here if needed (its slot variables are part of the step).
    steps : int
        Profiled steps; each op's time is the median over them.
    warmup : int
        Unmeasured steps run first.
    name : str, optional
        Graph name; default ``<model name>_train_step``.
    train_step : callable, optional
        Your own ``step(x, y)`` to profile instead of the standard one.

    Returns
    -------
    dict
        A ``baechi.graph/v1`` document (validated by :func:`baechi.load_graph`).

    Raises
    ------
    ProfileError
        The model, loss or optimizer cannot be used as given.
    """
    import keras
    import tensorflow as tf

    if steps < 1 or warmup < 0:
        raise ProfileError(f"steps must be ≥ 1 and warmup ≥ 0 (got {steps}, {warmup})")
    started = time.perf_counter()
    optimizer = resolve_optimizer(optimizer)
    prepare(model, optimizer, x)
    step = train_step or make_train_step(model, loss, optimizer)
    x_spec, y_spec = input_signature(x, y)
    try:
        concrete = tf.function(step).get_concrete_function(x_spec, y_spec)
    except Exception as exc:
        raise ProfileError(f"tracing the training step failed: {exc}") from exc
    graph = concrete.graph
    traced = time.perf_counter()

    arguments = tf.nest.flatten((x, y))
    variables = _captured_variables(graph, model, optimizer)
    keep = _needed_ops(graph)
    measurements = _measure(graph, arguments, variables, keep, steps, warmup)
    measured = time.perf_counter()

    unused = _uncaptured_variables(model, optimizer, variables)
    document = _document(graph, keep, variables, measurements, unused)
    seconds = time.perf_counter() - started
    compute = [op for op in document["ops"] if op["type"] not in NOT_COMPUTE]
    with_time = sum(1 for op in compute if op["attrs"].get("measured"))
    document["name"] = name or f"{model.name}_train_step"
    document["meta"] = {
        "source": "client.profile: TensorFlow RunMetadata step stats (FULL_TRACE)",
        "framework": f"tensorflow {tf.__version__}, keras {keras.__version__}",
        "model": model.name,
        "batch_shapes": {
            "x": [list(s.shape) for s in tf.nest.flatten(x_spec)],
            "y": [list(s.shape) for s in tf.nest.flatten(y_spec)],
        },
        "steps": steps,
        "warmup": warmup,
        "timing": "median over the steps of each op's kernel time (op_end_rel - op_start_rel "
                  "in the step stats), in µs",
        "device": _profile_device(),
        "compute_ops": len(compute),
        "measured_fraction": with_time / len(compute) if compute else 1.0,
        "profile_seconds": round(seconds, 3),
        "trace_seconds": round(traced - started, 3),
        "run_seconds": round(measured - traced, 3),
        "persistent_bytes": sum(v.nbytes for v in [*variables.values(), *unused]),
    }
    validate_profile(document)
    return document


def validate_profile(document: dict[str, Any]) -> None:
    """The engine's own check of a profiled graph (TensorFlow's or PyTorch's): a failure is a
    bug of the profiler, reported as :class:`ProfileError`."""
    from baechi.errors import InvalidGraph
    from baechi.graph import load_graph

    try:
        load_graph(document)
    except InvalidGraph as exc:
        raise ProfileError(f"the profiled graph is not valid: {exc.message}") from exc


def _profile_device() -> str:
    """The device the profile session runs on (TF's default: the first GPU, else the CPU)."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return (gpus or tf.config.list_logical_devices("CPU"))[0].name


# ---------------------------------------------------------------------------- tracing
def variable_names(model: Any, optimizer: Any) -> dict[int, tuple[str, bool]]:
    """``id(tf.Variable)`` → (Keras path, trainable) for the model's and optimizer's variables."""
    names: dict[int, tuple[str, bool]] = {}
    for variable in [*model.variables, *getattr(optimizer, "variables", [])]:
        inner = getattr(variable, "value", variable)
        names.setdefault(id(inner), (variable.path, bool(variable.trainable)))
        handle = getattr(variable, "handle", None)
        if handle is not None:
            names.setdefault(id(handle), (variable.path, bool(variable.trainable)))
    return names


def _captured_variables(graph: Any, model: Any, optimizer: Any) -> dict[str, _Variable]:
    """Capture placeholder name → the variable it stands for (with its current value)."""
    import tensorflow as tf

    known = variable_names(model, optimizer)
    by_handle = {id(v.handle): v for v in graph.variables}
    out: dict[str, _Variable] = {}
    used_names: set[str] = set()
    for external, internal in graph.captures:
        if internal.dtype != tf.resource:
            continue
        variable = by_handle.get(id(external))
        if variable is None:
            raise ProfileError(
                f"the step captures a resource that is not a variable ({internal.op.name}); "
                "only variables and tensors can be profiled"
            )
        path, trainable = known.get(id(variable), known.get(id(external),
                                                           (variable.name.split(":")[0],
                                                            bool(variable.trainable))))
        unique = path
        while unique in used_names:
            unique += "_"
        used_names.add(unique)
        out[internal.op.name] = _Variable(unique, variable.numpy(), trainable)
    return out


def _uncaptured_variables(
    model: Any, optimizer: Any, captured: dict[str, _Variable]
) -> list[_Variable]:
    """Model and optimizer variables the step does not use: they take memory all the same."""
    taken = {v.name for v in captured.values()}
    out = []
    for variable in [*model.variables, *getattr(optimizer, "variables", [])]:
        if variable.path in taken:
            continue
        taken.add(variable.path)
        out.append(_Variable(variable.path, variable.numpy(), bool(variable.trainable)))
    return out


def _needed_ops(graph: Any) -> set[str]:
    """Names of the ops the step runs: ancestors of its results and of its side effects.

    The ``Identity`` and ``NoOp`` that ``tf.function`` adds around a step's results are left
    out: they are created outside the step, so no device function sees them.
    """
    stack = [_unwrap_output(t).op for t in graph.outputs] + list(graph.control_outputs)
    seen: set[str] = set()
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def _unwrap_output(tensor: Any) -> Any:
    """The step's own result behind the ``Identity`` ``tf.function`` wraps it in."""
    op = tensor.op
    if op.type == "Identity" and op.name.startswith("Identity") and op.inputs:
        return op.inputs[0]
    return tensor


# -------------------------------------------------------------------------- measuring
def _session_config(devices_from_context: bool = False) -> Any:
    """A session config that runs the graph as traced: no graph rewrites, no folding.

    ``devices_from_context`` gives the session the devices the eager context has (the
    logical CPUs of :func:`~baechi.client.tf.devices.split_cpu`); by default a session sees one.
    """
    import tensorflow as tf
    from tensorflow.python.eager import context

    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    if devices_from_context:
        config.MergeFrom(context.context().config)
        config.allow_soft_placement = True
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    options = config.graph_options.optimizer_options
    options.opt_level = tf.compat.v1.OptimizerOptions.L0
    options.do_constant_folding = False
    options.do_common_subexpression_elimination = False
    options.do_function_inlining = False
    return config


def _measure(
    graph: Any,
    arguments: list[Any],
    variables: dict[str, _Variable],
    keep: set[str],
    steps: int,
    warmup: int,
) -> _Measurements:
    """Run the step in a session ``warmup + steps`` times; collect the step stats."""
    owner = _Owner(keep)
    result = _Measurements()
    for metadata in run_traced(graph, arguments, variables, steps, warmup):
        _collect(metadata, owner, result)
    return result


def run_traced(
    graph: Any,
    arguments: list[Any],
    variables: dict[str, _Variable],
    steps: int,
    warmup: int,
    *,
    variable_devices: dict[str, str] | None = None,
    devices_from_context: bool = False,
) -> Iterator[Any]:
    """Run a traced step's graph ``warmup + steps`` times; yield each measured step's metadata.

    The graph is imported into a TF1 graph (ops keep their devices) whose variables are fresh
    copies of ``variables`` (placeholder name → variable), each on ``variable_devices[name]``
    when given; a ``tf.compat.v1.Session`` runs it with ``FULL_TRACE`` and yields the
    ``RunMetadata`` of every step after the warm-up ones.
    """
    import tensorflow as tf

    variable_devices = variable_devices or {}
    session_graph = tf.Graph()
    input_map: dict[str, Any] = {}
    placeholders = graph.inputs
    with session_graph.as_default():
        with tf.name_scope(_SCOPE):
            for i, value in enumerate(arguments):
                input_map[placeholders[i].name] = tf.constant(value, name=f"input_{i}")
            for external, internal in graph.captures:
                if internal.op.name in variables:
                    with session_graph.device(variable_devices.get(internal.op.name)):
                        copy = tf.Variable(variables[internal.op.name].value, name="variable")
                    input_map[internal.name] = copy.handle
                elif internal.name not in input_map:
                    input_map[internal.name] = tf.constant(external.numpy(), name="captured")
        tf.graph_util.import_graph_def(graph.as_graph_def(), input_map=input_map, name="")
        initialize = tf.compat.v1.global_variables_initializer()
    fetches = [t.name for t in graph.outputs]
    targets = [op.name for op in graph.control_outputs]
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    config = _session_config(devices_from_context)
    with tf.compat.v1.Session(graph=session_graph, config=config) as session:
        session.run(initialize)
        for i in range(warmup + steps):
            metadata = tf.compat.v1.RunMetadata()
            try:
                session.run(fetches + targets, options=options, run_metadata=metadata)
            except tf.errors.OpError as exc:
                raise ProfileError(f"running the training step failed: {exc.message}") from exc
            if i >= warmup:
                yield metadata


class _Owner:
    """Maps a node name of the executed graph to the exported op it belongs to.

    Lowered loops and inlined functions run nodes named ``<op>/...`` (or ``Func/<op>/...``):
    the longest prefix that is an op owns them.
    """

    def __init__(self, ops: set[str]) -> None:
        self.ops = ops
        self.cache: dict[str, str | None] = {}

    def __call__(self, node: str) -> str | None:
        if node in self.cache:
            return self.cache[node]
        name = node[len("Func/"):] if node.startswith("Func/") else node
        found = None
        while name:
            if name in self.ops:
                found = name
                break
            name = name.rpartition("/")[0]
        self.cache[node] = found
        return found


def _collect(metadata: Any, owner: _Owner, result: _Measurements) -> None:
    totals: dict[str, float] = defaultdict(float)
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            op = owner(node.node_name)
            if op is None:
                continue
            totals[op] += _kernel_us(node)
            if node.node_name == op:
                for out in node.output:
                    allocated = out.tensor_description.allocation_description.requested_bytes
                    key = (op, out.slot)
                    result.output_bytes[key] = max(result.output_bytes.get(key, 0), allocated)
                temp = node.memory_stats.temp_memory_size
                if temp:
                    result.temp_bytes[op] = max(result.temp_bytes.get(op, 0), temp)
    for op, total in totals.items():
        result.times_us[op].append(total)
    result.steps += 1


def _kernel_us(node: Any) -> float:
    """The time a node's kernel ran, in µs (its executor span without scheduling waits)."""
    if node.op_end_rel_nanos or node.op_start_rel_nanos:
        return max(node.op_end_rel_nanos - node.op_start_rel_nanos, 0) / 1000.0
    return float(max(node.op_end_rel_micros - node.op_start_rel_micros, 0))


# ---------------------------------------------------------------------------- document
def tensor_bytes(tensor: Any, measured: dict[tuple[str, int], int]) -> int:
    """Bytes of a tensor: static shape × dtype size, else what the profile allocated."""
    import tensorflow as tf

    dtype = tensor.dtype
    if dtype in (tf.resource, tf.variant, tf.string):
        return measured.get((tensor.op.name, tensor.value_index), 0) if dtype != tf.resource else 0
    shape = tensor.shape
    if shape.rank is not None and shape.is_fully_defined():
        return int(shape.num_elements()) * dtype.size
    return measured.get((tensor.op.name, tensor.value_index), 0)


def _variable_op(var: _Variable, used: bool = True) -> dict[str, Any]:
    attrs: dict[str, Any] = {"variable": var.name, "shape": list(var.value.shape),
                             "dtype": str(var.value.dtype), "trainable": var.trainable}
    if not used:
        attrs["unused"] = True
    return {"name": var.name, "type": "VarHandleOp", "compute_us": 0.0,
            "persistent_bytes": var.nbytes, "attrs": attrs}


def _document(
    graph: Any,
    keep: set[str],
    variables: dict[str, _Variable],
    measured: _Measurements,
    unused: list[_Variable],
) -> dict[str, Any]:
    operations = [op for op in graph.get_operations() if op.name in keep]
    rename = {placeholder: var.name for placeholder, var in variables.items()}
    variable_ops = {rename[op.name] for op in operations if op.name in rename}
    clash = variable_ops & {op.name for op in operations if op.name not in rename}
    if clash:
        raise ProfileError(f"a variable's path equals an op's name: {sorted(clash)[:3]}")

    groups = _colocation(operations, rename)
    forward = _forward_pairs([rename.get(op.name, op.name) for op in operations])
    ops: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    seen_edges: set[tuple[str, str, str, bool]] = set()
    for op in operations:
        name = rename.get(op.name, op.name)
        if op.name in variables:
            record = _variable_op(variables[op.name])
        else:
            times = measured.times_us.get(op.name)
            output = sum(tensor_bytes(t, measured.output_bytes) for t in op.outputs)
            record = {
                "name": name, "type": op.type,
                "compute_us": round(statistics.median(times), 3) if times else 0.0,
                "attrs": {"measured": bool(times)},
            }
            if output:
                record["output_bytes"] = output
            if measured.temp_bytes.get(op.name):
                record["temp_bytes"] = measured.temp_bytes[op.name]
        if name in groups:
            record["colocation_group"] = groups[name]
        if name in forward:
            record["forward_op"] = forward[name]
        ops.append(record)

        for tensor in op.inputs:
            src = rename.get(tensor.op.name, tensor.op.name)
            identity = f"{src}:{tensor.value_index}"
            key = (src, name, identity, False)
            if key in seen_edges:
                continue
            seen_edges.add(key)
            edges.append({"src": src, "dst": name,
                          "bytes": tensor_bytes(tensor, measured.output_bytes),
                          "tensor": identity})
        for control in op.control_inputs:
            src = rename.get(control.name, control.name)
            key = (src, name, src, True)
            if key in seen_edges:
                continue
            seen_edges.add(key)
            edges.append({"src": src, "dst": name, "bytes": 0, "control": True})
    ops.extend(_variable_op(var, used=False) for var in unused)
    return {"format": "baechi.graph/v1", "name": "", "meta": {}, "ops": ops, "edges": edges}


def _colocation(operations: list[Any], rename: dict[str, str]) -> dict[str, str]:
    """Op name → colocation group, for ops that must share a device with another.

    Unions every variable with the ops that dereference its handle (following ``Identity``),
    and every op with the ops its ``_class`` attribute names. A group holding a variable is
    named after the variable, any other after its first op.
    """
    import tensorflow as tf

    parent: dict[str, str] = {}

    def find(a: str) -> str:
        parent.setdefault(a, a)
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[rb] = ra

    present = {rename.get(op.name, op.name) for op in operations}
    for op in operations:
        name = rename.get(op.name, op.name)
        if op.type not in RESOURCE_EXEMPT and op.type not in RESOURCE_FORWARDERS:
            for tensor in op.inputs:
                if tensor.dtype == tf.resource:
                    union(_resource_root(tensor, rename), name)
        colocated = op.node_def.attr["_class"].list.s if "_class" in op.node_def.attr else []
        for entry in colocated:
            target = entry.decode()
            if target.startswith("loc:@"):
                other = rename.get(target[5:], target[5:])
                if other in present and other != name:
                    union(other, name)

    members: dict[str, list[str]] = defaultdict(list)
    order = [rename.get(op.name, op.name) for op in operations]
    for name in order:
        if name in parent:
            members[find(name)].append(name)
    variables = set(rename.values())
    groups: dict[str, str] = {}
    for names in members.values():
        if len(names) < 2:
            continue
        label = next((n for n in names if n in variables), names[0])
        for n in names:
            groups[n] = label
    return groups


def _resource_root(tensor: Any, rename: dict[str, str]) -> str:
    """The op that produces a resource handle, through ``Identity`` ops and loops.

    A loop's i-th output is its i-th loop variable: TF's placer follows it to the variable.
    """
    op = tensor.op
    while (op.type in RESOURCE_FORWARDERS or op.type in LOOPS) and op.inputs:
        index = 0 if op.type == "Identity" else tensor.value_index
        tensor = op.inputs[index]
        op = tensor.op
    return rename.get(op.name, op.name)


def _forward_pairs(names: list[str]) -> dict[str, str]:
    """Backward op → forward op, pairing ``gradient_tape/<scope>/...`` with ``<scope>``.

    The longest prefix of the scope that names a forward op wins; failing that, the first
    forward op inside the longest prefix that is a scope of forward ops.
    """
    forward = [n for n in names if not n.startswith(GRADIENT_SCOPE)]
    forward_set = set(forward)
    first_in_scope: dict[str, str] = {}
    for name in forward:
        scope = name
        while "/" in scope:
            scope = scope.rpartition("/")[0]
            first_in_scope.setdefault(scope, name)
    pairs: dict[str, str] = {}
    for name in names:
        if not name.startswith(GRADIENT_SCOPE):
            continue
        rest = name[len(GRADIENT_SCOPE):]
        found = None
        prefix = rest
        while prefix:
            if prefix in forward_set:
                found = prefix
                break
            prefix = prefix.rpartition("/")[0]
        if found is None:
            prefix = rest
            while prefix:
                if prefix in first_in_scope:
                    found = first_in_scope[prefix]
                    break
                prefix = prefix.rpartition("/")[0]
        if found is not None:
            pairs[name] = found
    return pairs


__all__ = ["profile", "run_traced", "tensor_bytes", "variable_names"]
