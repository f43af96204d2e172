"""``measure``: run a placed training step and compare what TensorFlow did with the plan.

The step is traced under the plan, once with order enforcement and once without
(:func:`baechi.client.tf.pinning.apply_plan`'s ``enforce_order``), and each trace runs a few times
the way :func:`client.profile` runs its step (:func:`baechi.client.tf.profiler.run_traced`: a
TF1 session over the traced graph, fresh copies of the variables on their planned devices,
graph rewrites off, ``FULL_TRACE`` step stats). From each step's stats:

* **ops on planned device**: each planned op of the traced step that executed, and whether a
  node of that name ran on its planned device (for a lowered loop or conditional, a node of
  its frame);
* **order agreement**: for each device, every pair of consecutive ops of the plan's order that
  both executed, and whether the first started no later than the second (step-stats start
  times, ns). Ops that did not execute, and the constants and static shapes that enforcement
  leaves free (:func:`baechi.client.tf.control_edges.foldable`), are skipped over;
* **measured step**: from the first node's start to the last node's end, median over steps
  (``FULL_TRACE`` adds its own overhead, as in the profile the plan's times come from);
* **busy time** per device: the sum of its nodes' kernel times, median over steps.

Counts are totals over the measured steps. The model itself is not changed: neither its
variables nor their devices.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from baechi.client.errors import InvalidInput
from baechi.client.tf.pinning import CONTROL_FLOW

#: The counters of :class:`~baechi.client.tf.control_edges.Enforcement` a measurement reports (the
#: fields of the same names below; 0 for a run without enforcement).
ENFORCEMENT_COUNTERS = ("order_edges", "order_edges_present", "order_edges_merged",
                        "order_edges_skipped", "transfers_routed", "transfer_edges",
                        "transfer_edges_skipped")


class RunMeasurement(BaseModel):
    """What a few placed steps did, with or without order enforcement."""

    #: Whether the step was traced with control dependencies enforcing the plan's order.
    enforce_order: bool
    #: Measured steps (after the warm-up ones); counts below are totals over them.
    steps: int
    #: Planned ops in the traced step (per step).
    ops_planned: int
    #: Planned ops seen executing, and those of them that ran on their planned device.
    ops_observed: int
    ops_observed_on_planned_device: int
    #: ``ops_observed_on_planned_device / ops_observed`` (None when nothing was observed).
    ops_on_planned_device: float | None
    #: Planned ops left out of the order: constants, static shapes and equal twins, which
    #: TensorFlow may fold or merge (:func:`baechi.client.tf.control_edges.foldable`).
    ops_unordered: int = 0
    #: Consecutive pairs of a device's plan order that both executed, and those in order.
    pairs: int
    pairs_in_order: int
    #: ``pairs_in_order / pairs`` (None when the plan has no order or no pair executed).
    order_agreement: float | None
    #: Median over steps of first start to last end, µs.
    measured_step_us: float
    #: Median over steps of each device's summed kernel times, µs, by plan device name.
    device_busy_us: dict[str, float]
    #: Order edges the enforcement added, found already there, left to TensorFlow between
    #: ops it may fuse, and skipped as cycles; then the same for transfers.
    order_edges: int = 0
    order_edges_present: int = 0
    order_edges_merged: int = 0
    order_edges_skipped: int = 0
    transfers_routed: int = 0
    transfer_edges: int = 0
    transfer_edges_skipped: int = 0
    #: The first planned ops seen off their device: (op, planned device, devices it ran on).
    off_device: list[tuple[str, str, list[str]]] = Field(default_factory=list)
    #: The first consecutive pairs seen out of the plan's order: (earlier op, later op).
    out_of_order: list[tuple[str, str]] = Field(default_factory=list)


class MeasureReport(RunMeasurement):
    """:func:`measure`'s report: the run as applied, the plan's prediction, and the other run.

    The top-level fields describe the run with the requested ``enforce_order`` (default
    True); ``compared`` is the same measurement with the opposite setting.
    """

    #: The plan's ``estimate.step_time_us`` (None when the plan has no estimate).
    predicted_step_us: float | None = None
    compared: RunMeasurement | None = None

    def table(self) -> str:
        """The report as a small text table, one column per run."""
        runs = [self] + ([self.compared] if self.compared is not None else [])
        rows = [
            ("order enforced", [("yes" if r.enforce_order else "no") for r in runs]),
            ("ops on planned device", [_share(r.ops_on_planned_device,
                                              r.ops_observed_on_planned_device, r.ops_observed)
                                       for r in runs]),
            ("consecutive pairs in plan order", [_share(r.order_agreement, r.pairs_in_order,
                                                        r.pairs) for r in runs]),
            ("measured step (ms)", [f"{r.measured_step_us / 1000:.3f}" for r in runs]),
            ("predicted step (ms)", [_ms(self.predicted_step_us) for _ in runs]),
        ]
        for device in sorted({d for r in runs for d in r.device_busy_us}):
            rows.append((f"busy {device} (ms)",
                         [_ms(r.device_busy_us.get(device)) for r in runs]))
        rows.append(("order edges added / skipped",
                     [f"{r.order_edges} / {r.order_edges_skipped}" for r in runs]))
        width = max(len(name) for name, _ in rows)
        lines = [f"{name:<{width}}  " + "  ".join(f"{v:>22}" for v in values)
                 for name, values in rows]
        lines.append(f"(counts over {self.steps} measured step(s) per run)")
        return "\n".join(lines)


def _share(fraction: float | None, part: int, whole: int) -> str:
    return "-" if fraction is None else f"{fraction:.1%} ({part}/{whole})"


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:.3f}"


def measure(
    model: Any,
    x: Any,
    y: Any,
    plan: Any,
    steps: int = 5,
    *,
    loss: Any = None,
    optimizer: Any = None,
    warmup: int = 1,
    enforce_order: bool = True,
    compare: bool = True,
    devices: list[str] | None = None,
    device_type: str | None = None,
) -> MeasureReport:
    """Run placed training steps of ``model`` and report how closely they follow ``plan``.

    Parameters
    ----------
    model : keras.Model
        The model the plan was made for (profiled with :func:`client.profile`).
    x, y : array-like
        One batch, with the profiled shapes.
    plan : baechi.Plan, dict, or path
        A ``baechi.plan/v1`` plan.
    steps : int
        Measured steps per run.
    loss, optimizer : optional
        Default: the compiled model's.
    warmup : int
        Unmeasured steps run first.
    enforce_order : bool
        The run the top-level fields describe.
    compare : bool
        Also measure the opposite ``enforce_order`` (``report.compared``).
    devices, device_type : optional
        As for :func:`~baechi.client.tf.pinning.apply_plan`.

    Returns
    -------
    MeasureReport

    Raises
    ------
    InvalidInput
        No loss or optimizer, or bad ``steps``.
    PlanMismatch
        The plan does not fit this model or these devices.
    """
    from baechi.client.tf.pinning import plan_document, read_plan
    from baechi.client.tf.train_step import prepare, resolve_optimizer

    if steps < 1 or warmup < 0:
        raise InvalidInput(f"steps must be ≥ 1 and warmup ≥ 0 (got {steps}, {warmup})")
    loss = loss if loss is not None else getattr(model, "loss", None)
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    if loss is None or optimizer is None:
        raise InvalidInput("measure needs a loss and an optimizer: pass loss= and optimizer=, "
                           "or compile the model")
    optimizer = resolve_optimizer(optimizer)
    prepare(model, optimizer, x)
    if isinstance(plan, (str, bytes, Path)):
        plan = plan_document(plan)
    read_plan(plan)  # bad plans fail here, before any tracing
    predicted = _predicted_step_us(plan)

    settings = [enforce_order] + ([not enforce_order] if compare else [])
    runs = [_run(model, x, y, plan, loss, optimizer, steps, warmup, enforce, devices,
                 device_type) for enforce in settings]
    report = MeasureReport(**runs[0].model_dump(), predicted_step_us=predicted,
                           compared=runs[1] if compare else None)
    return report


def _predicted_step_us(plan: Any) -> float | None:
    """The plan's ``estimate.step_time_us``, None when it has no estimate."""
    estimate = plan.get("estimate") if isinstance(plan, dict) else getattr(plan, "estimate", None)
    if isinstance(estimate, dict):
        return estimate.get("step_time_us")
    return getattr(estimate, "step_time_us", None)


def _run(
    model: Any, x: Any, y: Any, plan: Any, loss: Any, optimizer: Any, steps: int, warmup: int,
    enforce: bool, devices: list[str] | None, device_type: str | None,
) -> RunMeasurement:
    """Trace the placed step with or without enforcement, run it, and judge the step stats."""
    import tensorflow as tf

    from baechi.client.errors import ProfileError
    from baechi.client.tf.pinning import prepare_plan
    from baechi.client.tf.profiler import _captured_variables, run_traced
    from baechi.client.tf.train_step import input_signature, make_train_step

    applied = prepare_plan(model, plan, optimizer, devices=devices, device_type=device_type,
                           enforce_order=enforce)
    step = applied.wrap(make_train_step(model, loss, optimizer))
    try:
        graph = step.get_concrete_function(*input_signature(x, y)).graph
    except Exception as exc:
        raise ProfileError(f"tracing the placed training step failed: {exc}") from exc
    traced = {op.name for op in graph.get_operations()
              if op.name in applied.placement and op.name in applied.traced}
    variables = _captured_variables(graph, model, optimizer)
    variable_devices = {name: applied.placement[v.name] for name, v in variables.items()
                        if v.name in applied.placement}
    from baechi.client.tf.control_edges import foldable

    observer = _Observer(applied, traced, foldable(graph))
    for metadata in run_traced(graph, tf.nest.flatten((x, y)), variables, steps, warmup,
                               variable_devices=variable_devices, devices_from_context=True):
        observer.add(metadata)
    enforcement = applied.enforcement if enforce else None
    return observer.result(enforce, enforcement)


class _Observer:
    """Accumulates, step by step, where and when the planned ops ran."""

    def __init__(self, applied: Any, traced: set[str], free: set[str]) -> None:
        from baechi.client.tf.profiler import _Owner

        self.applied = applied
        self.free = free
        self.traced = traced
        self.owner = _Owner(traced)
        self.to_plan = {local: name for name, local in applied.devices.items()}
        self.steps = 0
        self.observed = self.on_device = self.pairs = self.in_order = 0
        self.step_us: list[float] = []
        self.busy: dict[str, list[float]] = defaultdict(list)
        self.off_device: list[tuple[str, str, list[str]]] = []
        self.out_of_order: list[tuple[str, str]] = []

    def _plan_device(self, device: str) -> str:
        from baechi.client.tf.pinning import same_device

        for local, name in self.to_plan.items():
            if same_device(local, device):
                return name
        return device

    def add(self, metadata: Any) -> None:
        from baechi.client.tf.pinning import same_device
        from baechi.client.tf.profiler import _kernel_us

        self.steps += 1
        exact: dict[str, tuple[str, int]] = {}
        parts: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
        busy: dict[str, float] = defaultdict(float)
        first, last = None, None
        for device_stats in metadata.step_stats.dev_stats:
            device = device_stats.device
            for node in device_stats.node_stats:
                start = node.all_start_nanos or node.all_start_micros * 1000
                end = start + (node.all_end_rel_nanos or node.all_end_rel_micros * 1000)
                first = start if first is None else min(first, start)
                last = end if last is None else max(last, end)
                busy[self._plan_device(device)] += _kernel_us(node)
                if node.node_name in self.traced:
                    exact[node.node_name] = (device, start)
                elif (kind := _node_type(node)) in FRAME_OPS:
                    op = self.owner(node.node_name)
                    if op is not None:
                        parts[op].append((device, start, kind))
        self.step_us.append(((last or 0) - (first or 0)) / 1000.0)
        for device, total in busy.items():
            self.busy[device].append(total)

        started: dict[str, int] = {}
        for op in sorted(self.traced):
            if self.applied.traced.get(op) in CONTROL_FLOW and op in parts:
                nodes = [(device, start) for device, start, _ in parts[op]]
                started[op] = _frame_start(parts[op])
            elif op in exact:
                nodes = [exact[op]]
                started[op] = exact[op][1]
            else:
                continue
            self.observed += 1
            planned = self.applied.placement[op]
            if any(same_device(device, planned) for device, _ in nodes):
                self.on_device += 1
            elif len(self.off_device) < 10:
                self.off_device.append(
                    (op, self._plan_device(planned),
                     sorted({self._plan_device(d) for d, _ in nodes})))
        for names in (self.applied.order or {}).values():
            chain = [op for op in names if op in started and op not in self.free]
            for before, after in itertools.pairwise(chain):
                self.pairs += 1
                if started[before] <= started[after]:
                    self.in_order += 1
                elif len(self.out_of_order) < 10:
                    self.out_of_order.append((before, after))

    def result(self, enforce: bool, enforcement: Any) -> RunMeasurement:
        steps = max(self.steps, 1)
        return RunMeasurement(
            enforce_order=enforce,
            steps=self.steps,
            ops_planned=len(self.traced),
            ops_unordered=len(self.traced & self.free),
            ops_observed=self.observed,
            ops_observed_on_planned_device=self.on_device,
            ops_on_planned_device=self.on_device / self.observed if self.observed else None,
            pairs=self.pairs,
            pairs_in_order=self.in_order,
            order_agreement=self.in_order / self.pairs if self.pairs else None,
            measured_step_us=statistics.median(self.step_us) if self.step_us else 0.0,
            device_busy_us={d: round(statistics.median(v + [0.0] * (steps - len(v))), 3)
                            for d, v in sorted(self.busy.items())},
            **{name: getattr(enforcement, name, 0) for name in ENFORCEMENT_COUNTERS},
            off_device=self.off_device,
            out_of_order=self.out_of_order,
        )


#: The nodes of a lowered loop's or conditional's frame (its control-flow primitives).
FRAME_OPS = frozenset({"Enter", "Merge", "Switch", "Exit", "NextIteration", "LoopCond",
                       "RefEnter", "RefMerge", "RefSwitch", "RefExit", "RefNextIteration"})


def _frame_start(nodes: list[tuple[str, int, str]]) -> int:
    """When a lowered loop or conditional starts: once all its inputs entered its frame.

    Lowering turns a ``While`` into one ``Enter`` per input (an ``If`` into one ``Switch``
    per input), each waiting only for its own input; the op as a whole starts, as any op
    does, when the last of them has. (The node keeping the op's name gathers the results at
    the end.)
    """
    for kind in ("Enter", "Switch"):
        starts = [start for _, start, k in nodes if k == kind]
        if starts:
            return max(starts)
    return min(start for _, start, _ in nodes)


def _node_type(node: Any) -> str:
    """An executed node's op type, from its timeline label ``name = Type(inputs)``."""
    return node.timeline_label.partition(" = ")[2].partition("(")[0]


__all__ = ["MeasureReport", "RunMeasurement", "measure"]
