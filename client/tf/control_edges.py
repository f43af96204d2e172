"""Enforce a plan's order in a traced training step (docs/format.md §10, issue 11).

TensorFlow runs every op as soon as its inputs are ready; a device of a plan, in contrast,
runs its ops one after the other in the plan's ``order``. :func:`enforce` makes the traced
step keep that order by adding control dependencies to the graph being traced (a
``tf.function``'s ``FuncGraph`` accepts new control inputs until the function is finalised):

* **Ops.** For each device, consecutive planned ops of the plan's order that exist in the graph
  get a control edge ``previous → next``. Planned ops the graph lacks (variables, which a
  step captures instead of creating, or inputs) are skipped over; ops the plan does not know
  are left free.
* **Transfers.** When the plan carries a ``transfer_order`` (format: docs/format.md §10,
  "Transfer order"), each listed data transfer ``src tensor → dst device`` is routed
  through an ``Identity`` created on the receiving device, which its consumers there read
  instead of the tensor; the identities are chained in each channel's order. TensorFlow inserts
  its own ``_Send``/``_Recv`` pair when it partitions the graph and offers no way to order
  those, so the ordered event is the tensor's arrival on the receiving device (its
  ``Identity``), not the wire transfer itself. Control messages are not routed: TensorFlow
  sends them itself.
* **Safety.** A control edge that closes a cycle with the data and control edges would hang
  or fail the step. Plans are consistent with the graph they were made for, but a re-traced
  step can differ from the profiled one (an op renamed, fused, or missing), so each edge is
  checked against the graph plus the edges added so far and skipped, and counted, if it
  would close a cycle.

Only the step's own graph is ordered: the bodies of loops and conditionals (an LSTM's
``while`` body) are separate functions whose ops a plan does not name; the loop runs as one
op of the plan, and that op is ordered.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Name scope of the identities that mark a transfer's arrival on its receiving device.
TRANSFER_SCOPE = "baechi_transfer"


@dataclass
class Enforcement:
    """What :func:`enforce` did to one traced step.

    Attributes
    ----------
    order_edges : int
        Control edges added between consecutive ops of a device.
    order_edges_skipped : int
        Edges left out because they would have closed a cycle (plan and trace disagree).
    order_edges_present : int
        Edges that were already implied by an existing direct edge.
    order_edges_merged : int
        Edges left out because TensorFlow may fuse or merge the two ops' groups into one node,
        which the edge would turn into a cycle (see ``_fusion_chain``): there the order is
        TensorFlow's.
    ops_ordered : int
        Planned ops found in the traced graph and ordered.
    ops_absent : int
        Planned ops of the order not in the traced graph (variables, inputs, renamed ops).
    transfers_routed : int
        Transfers routed through an ``Identity`` on their receiving device.
    transfers_absent : list of str
        Listed transfers not found in the trace (tensor missing, or no consumer on the
        receiving device), control messages, and tensors of foldable ops (left to TensorFlow).
    transfer_edges, transfer_edges_skipped : int
        Control edges added (and skipped as cycles) between consecutive transfers of a channel.
    skipped : list of (str, str)
        The first skipped edges ``(from, to)``, for diagnosis.
    """

    order_edges: int = 0
    order_edges_skipped: int = 0
    order_edges_present: int = 0
    order_edges_merged: int = 0
    ops_ordered: int = 0
    ops_absent: int = 0
    transfers_routed: int = 0
    transfers_absent: list[str] = field(default_factory=list)
    transfer_edges: int = 0
    transfer_edges_skipped: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: Ops left unordered because Grappler folds them into constants (see :func:`foldable`).
    foldable: set[str] = field(default_factory=set, repr=False)


class _Order:
    """A directed graph's topological positions, kept as edges are added.

    Positions come from Kahn's algorithm; the ops on or after a cycle get none. An edge
    ``a → b`` with ``a`` before ``b`` keeps them topological; otherwise only the ops between
    the two move (Pearce and Kelly's dynamic topological order, JEA 2006). Recomputing every
    position instead made enforcing an m-ETF plan of ResNet-50 (14k ops) take 268 s of its
    first step.

    >>> order = _Order({"x": {"y"}, "y": set(), "z": set()})
    >>> order.insert("y", "z"), order.insert("z", "x"), order.insert("y", "x")
    (True, False, False)
    >>> order.insert("z", "y"), order.insert("x", "z")
    (False, True)
    >>> sorted(order.position, key=order.position.get)
    ['x', 'y', 'z']
    """

    def __init__(self, successors: dict[str, set[str]]) -> None:
        self.successors = successors
        self.predecessors: dict[str, set[str]] = {name: set() for name in successors}
        for name, targets in successors.items():
            targets.discard(name)
            for target in targets:
                self.predecessors[target].add(name)
        self.refresh()

    def refresh(self, ahead: Iterable[tuple[str, str]] = ()) -> None:
        """Recompute every position (Kahn's algorithm), keeping as many edges of ``ahead``
        (edges about to be inserted) forward as it can: an op also waits for the ops such
        edges come from, unless no op is ready otherwise. Where those edges close no cycle
        among the positioned ops, inserting them later moves nothing."""
        self.position = self._kahn([])
        ahead = [(a, b) for a, b in ahead if a != b and a in self.position and b in self.position]
        if ahead:
            self.position = self._kahn(ahead)

    def _kahn(self, ahead: list[tuple[str, str]]) -> dict[str, int]:
        """Positions of a topological order (none for the ops on or after a cycle), each op
        after the sources of its ``ahead`` edges where some op is ready without breaking one."""
        hard = {name: len(sources) for name, sources in self.predecessors.items()}
        soft = dict.fromkeys(hard, 0)
        more: dict[str, list[str]] = {}
        for a, b in ahead:
            more.setdefault(a, []).append(b)
            soft[b] += 1
        ready = [name for name, degree in hard.items() if degree == 0 and not soft[name]]
        waiting = [name for name, degree in hard.items() if degree == 0 and soft[name]]
        position: dict[str, int] = {}
        while ready or waiting:
            name = ready.pop() if ready else waiting.pop()
            if name in position:  # waited, then became ready too
                continue
            position[name] = len(position)
            for target in self.successors[name]:
                hard[target] -= 1
                if hard[target] == 0:
                    (waiting if soft[target] else ready).append(target)
            for target in more.get(name, ()):
                soft[target] -= 1
                if soft[target] == 0 and hard[target] == 0:
                    ready.append(target)
        return position

    def add_node(self, name: str) -> None:
        self.successors.setdefault(name, set())
        self.predecessors.setdefault(name, set())

    def link(self, a: str, b: str) -> None:
        """Record the edge ``a → b`` (the positions are the caller's to refresh)."""
        self.successors[a].add(b)
        self.predecessors[b].add(a)

    def reaches(self, start: str, goal: str) -> bool:
        """Whether a path leads from ``start`` to ``goal`` (which has a position)."""
        return goal in self._region(start, self.successors, 0, self.position[goal])

    def insert(self, a: str, b: str) -> bool:
        """Add ``a → b`` between two positioned ops and keep the positions topological, or
        return False (adding nothing) when ``b`` reaches ``a``. What ``b`` reaches up to
        ``a``'s position moves after what reaches ``a`` from ``b``'s position on, each in its
        own order, into the positions the two sets held; every other op keeps its own."""
        low, high = self.position[b], self.position[a]
        if low < high:
            after = self._region(b, self.successors, low, high)
            if a in after:
                return False
            before = self._region(a, self.predecessors, low, high)
            moved = sorted(before, key=self.position.__getitem__) + \
                sorted(after, key=self.position.__getitem__)
            places = sorted(self.position[name] for name in moved)
            for name, place in zip(moved, places, strict=True):
                self.position[name] = place
        self.link(a, b)
        return True

    def _region(self, start: str, neighbours: dict[str, set[str]], low: int, high: int
                ) -> set[str]:
        """``start`` and the ops it reaches through ``neighbours`` among those positioned
        from ``low`` to ``high``. Ops without a position sit on or after a cycle: no ancestor
        of an op with one is among them."""
        seen, stack = {start}, [start]
        while stack:
            for other in neighbours[stack.pop()]:
                place = self.position.get(other)
                if other not in seen and place is not None and low <= place <= high:
                    seen.add(other)
                    stack.append(other)
        return seen


class _CycleGuard:
    """Adds control edges to a graph unless they would close a cycle, deciding by the
    topological positions of an :class:`_Order` of the graph's ops (the ops TensorFlow may
    merge counted as one) and the edges ``tf.function`` will add."""

    def __init__(self, graph: Any) -> None:
        self.same = _equivalent_ops(graph)
        successors: dict[str, set[str]] = {}
        for op in graph.get_operations():
            successors.setdefault(self.rep(op.name), set())
            for tensor in op.inputs:
                successors.setdefault(self.rep(tensor.op.name), set()).add(self.rep(op.name))
            for control in op.control_inputs:
                successors.setdefault(self.rep(control.name), set()).add(self.rep(op.name))
        self._add_future_edges(graph, successors)
        self.order = _Order(successors)

    def rep(self, name: str) -> str:
        """The op standing for ``name`` and the ops TensorFlow may merge with it."""
        return self.same.get(name, name)

    def _add_future_edges(self, graph: Any, successors: dict[str, set[str]]) -> None:
        """Edges ``tf.function`` will add once the whole function is traced.

        Its automatic control dependencies run the stateful ops in program order: the ops
        using one resource (a read after the write before it, a write after the reads and the
        write before it), and the stateful ops that use no resource. They are added after the
        step is traced, after :func:`enforce` ran, so an order edge must not contradict them
        either. Counting every op that is not a known read as a write makes this a superset.
        """
        import tensorflow as tf

        last_write: dict[int, str] = {}
        reads: dict[int, list[str]] = {}
        last_stateful: str | None = None
        for op in graph.get_operations():
            handles = [_resource_root(t) for t in op.inputs if t.dtype == tf.resource]
            if not handles:
                if _is_stateful(op) and op.type not in RESOURCE_FREE_UNORDERED:
                    if last_stateful is not None:
                        successors[last_stateful].add(self.rep(op.name))
                    last_stateful = self.rep(op.name)
                continue
            for handle in handles:
                name = self.rep(op.name)
                if handle in last_write:
                    successors[last_write[handle]].add(name)
                if op.type in RESOURCE_READS:
                    reads.setdefault(handle, []).append(name)
                    continue
                for read in reads.pop(handle, []):
                    successors[read].add(name)
                last_write[handle] = name

    def add(self, before: Any, after: Any) -> str:
        """Make ``after`` wait for ``before``: "added", "present", "merged" or "cycle"."""
        a, b = self.rep(before.name), self.rep(after.name)
        order = self.order
        if b in order.successors[a]:
            return "present"
        # Fused with a consumer that depends on ``after``, ``before`` would take ``after``'s
        # result as its input: the edge would become a cycle (seen in TF 2.21, Conv2D →
        # bias Reshape, the bias feeding the BiasAdd fused into the Conv2D: "N nodes in a
        # cycle").
        if a == b or any(self.rep(c) in order.position and order.reaches(b, self.rep(c))
                         for c in _fusion_chain(before)):
            return "merged"
        if a not in order.position or b not in order.position:
            return "cycle"  # on a cycle already: never add to it
        if not order.insert(a, b):
            return "cycle"
        after._add_control_input(before)
        return "added"

    def register(self, op: Any) -> None:
        """Track an op created after the guard (its inputs are already tracked ops); call
        :meth:`refresh` once they all are."""
        self.order.add_node(op.name)
        for tensor in op.inputs:
            self.order.link(self.rep(tensor.op.name), op.name)

    def link(self, a: str, b: str) -> None:
        """Track an edge ``a → b`` TensorFlow already has; call :meth:`refresh` after."""
        self.order.link(a, b)

    def refresh(self, chains: Sequence[Sequence[Any]] = ()) -> None:
        """Recompute the positions after ops or edges were tracked, if possible so that the
        control edges of ``chains`` (ops in the order they are to run) go forward."""
        self.order.refresh((self.rep(a.name), self.rep(b.name))
                           for chain in chains for a, b in itertools.pairwise(chain))


#: Ops that only read a resource (automatic control dependencies let reads run together).
RESOURCE_READS = frozenset({"ReadVariableOp", "VariableShape", "ResourceGather",
                            "ResourceGatherNd"})
#: Stateful ops that automatic control dependencies leave unordered (none assumed but these).
RESOURCE_FREE_UNORDERED = frozenset({"Placeholder", "VarHandleOp", "NoOp"})


#: Ops whose value Grappler computes from static shapes.
SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})


def foldable(graph: Any) -> set[str]:
    """Names of the ops TensorFlow may fold into constants or merge with an equal op.

    Constants, shape ops of tensors with a static shape, stateless ops computed from those
    alone, and stateless ops equal to another (:func:`_twins`). Folding then merges equal
    constants, so an order through them could close a cycle in the graph TensorFlow really
    runs (seen on the CNN: "The graph couldn't be sorted in topological order"). They do
    little work worth ordering: they are left free.
    """
    folded: set[str] = set()
    for op in graph.get_operations():
        shape_of_static = op.type in SHAPE_OPS and all(t.shape.is_fully_defined()
                                                       for t in op.inputs)
        from_constants = (bool(op.inputs) and not _is_stateful(op)
                          and op.type not in ("Placeholder", "NoOp")
                          and all(t.op.name in folded for t in op.inputs))
        if op.type == "Const" or shape_of_static or from_constants:
            folded.add(op.name)
    return folded | _twins(graph)


def _twins(graph: Any) -> set[str]:
    """Stateless ops with the same type, attributes and data inputs as another op.

    TensorFlow's common-subexpression passes may merge them (whatever their devices and
    control inputs): an order edge into one of them could close a cycle once merged.
    """
    seen: dict[tuple[Any, ...], str] = {}
    twins: set[str] = set()
    for op in graph.get_operations():
        if _is_stateful(op) or op.type in ("Placeholder", "NoOp"):
            continue
        attrs = tuple(sorted((k, v.SerializeToString(deterministic=True))
                             for k, v in op.node_def.attr.items() if not k.startswith("_")))
        key = (op.type, tuple((t.op.name, t.value_index) for t in op.inputs), attrs)
        if key in seen:
            twins.update((seen[key], op.name))
        else:
            seen[key] = op.name
    return twins


#: Heavy ops Grappler's remapper fuses with the ops after them.
_FUSION_ROOTS = frozenset({"Conv2D", "Conv3D", "MatMul", "DepthwiseConv2dNative", "BatchMatMul",
                           "BatchMatMulV2", "Conv2DBackpropInput", "FusedBatchNorm",
                           "FusedBatchNormV3"})
_ACTIVATIONS = frozenset({"Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid"})
_ADDS = frozenset({"BiasAdd", "Add", "AddV2", "AddN"})
#: (producer, consumer) op types that Grappler may turn into one node with more inputs: the
#: remapper's contraction + bias + activation (+ residual add) fusions, and the arithmetic
#: optimizer's rewrites of add trees into one AddN, of chains of multiplications and additions
#: (minimising broadcasts, hoisting common factors) and of a multiplication into a
#: convolution's filter.
FUSABLE = frozenset(
    {(root, nxt) for root in _FUSION_ROOTS for nxt in _ADDS | _ACTIVATIONS}
    | {(add, nxt) for add in _ADDS for nxt in _ADDS | _ACTIVATIONS}
    | {("Mul", "Mul"), ("Mul", "Add"), ("Mul", "AddV2"), ("Mul", "Conv2D")}
)


def _fusion_chain(op: Any, depth: int = 3) -> set[str]:
    """The ops Grappler may merge ``op`` with, down its data flow: while the next op is the
    only consumer on the same device and the pair is :data:`FUSABLE` (``Conv2D`` →
    ``BiasAdd`` → ``Relu`` become one ``_FusedConv2D`` taking the bias as an input)."""
    chain: set[str] = set()
    while depth:
        consumers = {c.name: c for t in op.outputs for c in t.consumers()}
        if len(consumers) != 1:
            break
        (consumer,) = consumers.values()
        if consumer.device != op.device or (op.type, consumer.type) not in FUSABLE:
            break
        chain.add(consumer.name)
        op, depth = consumer, depth - 1
    return chain


def _equivalent_ops(graph: Any) -> dict[str, str]:
    """Op name → the first op Grappler's common-subexpression pass may merge it with.

    Grappler merges stateless ops of one device with the same type, attributes and inputs
    (data and control; two equal constants, two ``Shape`` of one tensor). Two such ops
    ordered with an op between them would, merged, close a cycle, so the guard treats them
    as one op.
    """
    first: dict[tuple[Any, ...], str] = {}
    same: dict[str, str] = {}
    for op in graph.get_operations():
        if _is_stateful(op) or op.type in ("Placeholder", "NoOp"):
            continue
        attrs = tuple(sorted((k, v.SerializeToString(deterministic=True))
                             for k, v in op.node_def.attr.items()))
        inputs = tuple((same.get(t.op.name, t.op.name), t.value_index) for t in op.inputs)
        controls = tuple(sorted(same.get(c.name, c.name) for c in op.control_inputs))
        key = (op.type, op.device, inputs, controls, attrs)
        name = first.setdefault(key, op.name)
        if name != op.name:
            same[op.name] = name
    return same


def _resource_root(tensor: Any) -> int:
    """Identity of the op producing a resource handle, through ``Identity`` ops."""
    op = tensor.op
    while op.type in ("Identity", "IdentityN") and op.inputs:
        op = op.inputs[tensor.value_index if op.type == "IdentityN" else 0].op
    return id(op)


def _is_stateful(op: Any) -> bool:
    try:
        return bool(op._is_stateful)
    except AttributeError:
        return False


def enforce(
    graph: Any,
    order: Mapping[str, Sequence[str]],
    transfer_order: Mapping[str, Sequence[Mapping[str, Any]]] | None,
    device_of: Mapping[str, str],
    planned: Iterable[str],
) -> Enforcement:
    """Add the control edges that make ``graph`` run in the plan's order.

    Parameters
    ----------
    graph : tf.Graph
        The graph being traced (a ``FuncGraph``), all of the step's ops created.
    order : dict
        Local device → the plan's op names on it, in the plan's order.
    transfer_order : dict, optional
        Plan device → channel order (docs/format.md §10), with ``dst`` already mapped
        to local devices; None when the plan carries none.
    device_of : dict
        Op name → local device, for every op of the plan.
    planned : iterable of str
        Names of the ops created under the plan's device function in this trace.

    Returns
    -------
    Enforcement
    """
    report = Enforcement()
    traced = set(planned)
    ops = {op.name: op for op in graph.get_operations() if op.name in traced}
    guard = _CycleGuard(graph)
    folded = foldable(graph)
    report.foldable = folded
    channels: list[list[Any]] = []
    if transfer_order:
        # Any op of the step may send or receive, also those made under a variable's
        # colocation (an optimizer's reads), which bypass the device function.
        every_op = {op.name: op for op in graph.get_operations()}
        identities = _route_transfers(graph, transfer_order, device_of, every_op, folded, guard,
                                      report)
        channels = [[identities[_transfer_key(e)] for e in channel
                     if _transfer_key(e) in identities] for channel in transfer_order.values()]
    chains: list[list[Any]] = []
    for names in order.values():
        chains.append([ops[name] for name in names if name in ops and name not in folded])
        report.ops_ordered += len(chains[-1])
        report.ops_absent += sum(1 for name in names if name not in ops)
    # a plan's orders are consistent with its graph: positions that already run every chain
    # forward leave the guard nothing to reorder (ResNet-50, 14k ops: 13 s of searches)
    guard.refresh([*channels, *chains])
    for chain in channels:
        outcomes = _add_chain(guard, chain, report)
        report.transfer_edges += outcomes["added"]
        report.transfer_edges_skipped += outcomes["cycle"]
    for chain in chains:
        outcomes = _add_chain(guard, chain, report)
        report.order_edges += outcomes["added"]
        report.order_edges_present += outcomes["present"]
        report.order_edges_merged += outcomes["merged"]
        report.order_edges_skipped += outcomes["cycle"]
    return report


def _add_chain(guard: _CycleGuard, chain: Sequence[Any], report: Enforcement) -> Counter[str]:
    """Control edges between consecutive ops of ``chain``; how many had each outcome of
    :meth:`_CycleGuard.add` (the edges skipped as cycles are noted in ``report``)."""
    outcomes: Counter[str] = Counter()
    for before, after in itertools.pairwise(chain):
        outcome = guard.add(before, after)
        outcomes[outcome] += 1
        if outcome == "cycle":
            _note(report, before, after)
    return outcomes


def _note(report: Enforcement, before: Any, after: Any) -> None:
    if len(report.skipped) < 20:
        report.skipped.append((before.name, after.name))


def _transfer_key(entry: Mapping[str, Any]) -> tuple[str, str, str]:
    """(tensor, src op, dst device) naming one message as the cost model keys it."""
    src = str(entry.get("src", ""))
    return str(entry.get("tensor") or src), src, str(entry.get("dst", ""))


def _tensor_name(name: str) -> tuple[str, int]:
    """``op:3`` → ("op", 3); a bare op name is its first output."""
    op, colon, index = name.rpartition(":")
    if colon and index.isdigit():
        return op, int(index)
    return name, 0


def _route_transfers(
    graph: Any,
    transfer_order: Mapping[str, Sequence[Mapping[str, Any]]],
    device_of: Mapping[str, str],
    ops: Mapping[str, Any],
    folded: set[str],
    guard: _CycleGuard,
    report: Enforcement,
) -> dict[tuple[str, str, str], Any]:
    """One ``Identity`` per listed transfer, on its receiving device, read by its consumers.

    Tensors of foldable ops are left to TensorFlow: constant folding recomputes them where
    they are read (an ``Identity`` would be folded too, and the constant moved with it).
    """
    import tensorflow as tf

    from baechi.client.tf.pinning import same_device

    identities: dict[tuple[str, str, str], Any] = {}
    entries = {_transfer_key(e): e for channel in transfer_order.values() for e in channel}
    for key, entry in entries.items():
        tensor_name, _src, dst = key
        op_name, index = _tensor_name(tensor_name)
        producer = ops.get(op_name)
        if (entry.get("control") or producer is None or index >= len(producer.outputs)
                or op_name in folded):
            report.transfers_absent.append(f"{tensor_name} -> {dst}")
            continue
        tensor = producer.outputs[index]
        consumers = [
            op for op in tensor.consumers()
            if op.name in device_of and same_device(device_of[op.name], dst)
        ]
        if not consumers or tensor.dtype in (tf.resource, tf.variant):
            report.transfers_absent.append(f"{tensor_name} -> {dst}")
            continue
        # Outside the step's own scopes: no inherited control dependencies or device.
        with graph.as_default(), graph.control_dependencies(None), graph.device(dst):
            identity = tf.identity(tensor, name=f"{TRANSFER_SCOPE}/{op_name.replace(':', '_')}")
        guard.register(identity.op)
        for consumer in consumers:
            for i, value in enumerate(consumer.inputs):
                if value is tensor:
                    consumer._update_input(i, identity)
                    guard.link(identity.op.name, guard.rep(consumer.name))
        identities[key] = identity.op
        report.transfers_routed += 1
    return identities  # the guard's positions are refreshed by the caller


__all__ = ["TRANSFER_SCOPE", "Enforcement", "enforce", "foldable"]
