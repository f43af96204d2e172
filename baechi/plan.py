"""The plan format ``baechi.plan/v1`` (docs/format.md §5)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

from baechi.cluster import describe_validation_error
from baechi.errors import InvalidPlan

PLAN_FORMAT = "baechi.plan/v1"


class GraphInfo(BaseModel):
    """Which graph a plan is for: its name, content hash and op count."""

    name: str = ""
    sha256: str = ""
    ops: int = 0


class PlanRequest(BaseModel):
    """The request that produced a plan, cluster as written by the user."""

    model_config = ConfigDict(extra="allow")

    algorithm: str = ""
    cluster: dict[str, Any]
    options: dict[str, Any] = Field(default_factory=dict)


class Estimate(BaseModel):
    """What the simulator (docs/format.md §4) reports for a plan.

    ``single_device_us`` is infinite (``null`` in JSON) when no device can run every op
    (``compute_us_by_kind``). Under the throughput objective (docs/format.md §10) the estimate also
    has ``time_per_sample_us`` and ``device_load_us`` (the load of each device); both are
    absent otherwise.
    """

    step_time_us: float
    lower_bound_us: float
    single_device_us: float
    single_device_fits: bool
    peak_memory_bytes: dict[str, int]
    transfer_bytes: int
    transfers: int
    memory_ok: bool = True
    time_per_sample_us: float | None = None
    device_load_us: dict[str, float] | None = None

    @field_validator("single_device_us", mode="before")
    @classmethod
    def _none_is_infinite(cls, value: Any) -> Any:
        return math.inf if value is None else value

    @field_serializer("single_device_us")
    def _infinite_is_none(self, value: float) -> float | None:
        return None if math.isinf(value) else value

    @model_serializer(mode="wrap")
    def _without_absent(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        for key in ("time_per_sample_us", "device_load_us"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


class ReductionStep(BaseModel):
    """One step of the reduction pipeline: the nodes an algorithm would place after it, and
    the units they form."""

    phase: str
    nodes: int
    units: int


class Candidate(BaseModel):
    """One plan ``auto`` tried: which algorithm, with the pipeline or not, its replayed step
    time (``None`` when it found no plan within memory) and the seconds it took.

    Extra fields hold what a candidate adds (local search: ``improved``, ``moves_evaluated``).
    """

    model_config = ConfigDict(extra="allow")

    algorithm: str
    pipeline: bool = False
    step_time_us: float | None = None
    seconds: float = 0.0
    note: str = ""


class Chosen(BaseModel):
    """The candidate whose plan ``auto`` returned, and whether local search improved it."""

    algorithm: str
    pipeline: bool = False
    local_search: bool = False


class PlanStats(BaseModel):
    """How a plan was made (the plan's ``stats``; docs/format.md §5).

    The fields every request fills are typed; algorithm-specific figures (m-SCT's LP sizes,
    ``exact``'s ``optimal`` and ``bound_us``, m-ETF's ``memory_forced_ops``) are extra
    fields, read as attributes or from :meth:`~pydantic.BaseModel.model_dump`.

    Examples
    --------
    >>> stats = PlanStats(placement_seconds=0.5, lp_variables=12)
    >>> stats.memory_retries, stats.lp_variables, stats.model_dump()["fallback"]
    (0, 12, None)
    """

    model_config = ConfigDict(extra="allow")

    #: Wall-clock seconds of the whole request.
    placement_seconds: float = 0.0
    #: Nodes the algorithm placed (after the reduction pipeline).
    nodes_placed: int = 0
    #: Seconds per phase (validate, grouping, co_placement, fusion, place, simulate, search,
    #: order: the transfer-order post-pass).
    phases: dict[str, float] = Field(default_factory=dict)
    #: Nodes and units after each reduction step run.
    nodes: list[ReductionStep] = Field(default_factory=list)
    #: The reduction pipeline's own figures (merge cap, fusion counters).
    reduction: dict[str, Any] = Field(default_factory=dict)
    #: Times the placer ran again with tighter budgets because its plan overshot memory.
    memory_retries: int = 0
    #: Why another plan than the requested algorithm's was returned, when one was.
    fallback: str | None = None
    #: The single-device plan was returned because it was faster; the algorithm's step time.
    chose_single: bool = False
    algorithm_step_time_us: float | None = None
    #: With ``options.portfolio``: step time of each variant tried, and the one kept.
    portfolio_step_times_us: dict[str, float] | None = None
    portfolio_choice: str | None = None
    #: ``auto``: every candidate tried, in order, and the one returned.
    candidates: list[Candidate] | None = None
    chosen: Chosen | None = None
    #: The request's deadline (``options.time_limit_s``) passed before the plan was final:
    #: it is the best found by then.
    deadline_reached: bool = False
    #: ``exact`` and ``auto``: whether the plan is proven optimal for the simulator's cost,
    #: and the proven lower bound of every plan's step time (``None``: nothing proven).
    optimal: bool | None = None
    bound_us: float | None = None
    #: Sequential mode, step-time objective: the channel order the plan keeps, ``"fifo"``
    #: (first come, first served; no ``transfer_order`` in the plan) or ``"model-aware"``
    #: (the plan's ``transfer_order``, kept because it replays strictly faster); ``None``
    #: where there are no channels to order. ``fifo_step_time_us``: the step time with FIFO;
    #: ``None`` where the placement fits memory only in its transfer order (FIFO would exceed
    #: a device's memory; ``transfer_order_note`` says so).
    transfer_order: Literal["fifo", "model-aware"] | None = None
    fifo_step_time_us: float | None = None
    #: Why model-aware ordering was not tried or cut short (the deadline), when it was, or
    #: why FIFO was no option.
    transfer_order_note: str | None = None
    #: The op with the most compute and its share of the graph's (``{"name", "share"}``): no
    #: plan beats that op's time, so a large share means the graph is too coarse to split.
    largest_op: dict[str, Any] | None = None


class TransferEntry(BaseModel):
    """One message in a channel's transfer order (docs/format.md §10): the
    message the cost model keys as (``src``, ``tensor``, ``bytes``) to device ``dst``, or
    the control message from ``src`` to ``dst`` when ``control`` is true. It is sent from the
    device the plan places ``src`` on.

    Examples
    --------
    >>> TransferEntry(src="a", bytes=8, dst="/GPU:1").model_dump()
    {'src': 'a', 'tensor': 'a', 'bytes': 8, 'dst': '/GPU:1'}
    >>> TransferEntry(src="a", dst="/GPU:1", control=True).model_dump()
    {'src': 'a', 'dst': '/GPU:1', 'control': True}
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    src: str
    tensor: str | None = None
    bytes: StrictInt | None = Field(default=None, ge=0)
    dst: str
    control: StrictBool = False

    @model_validator(mode="after")
    def _data_or_control(self) -> TransferEntry:
        if self.control:
            if self.tensor is not None or self.bytes is not None:
                raise ValueError("a control message has no tensor or bytes")
        elif self.bytes is None:
            raise ValueError(f"the transfer of {self.src!r} to {self.dst!r} needs 'bytes' "
                             "(the edge's bytes), or 'control': true")
        elif self.tensor is None:
            object.__setattr__(self, "tensor", self.src)  # the tensor defaults to the op
        return self

    @model_serializer(mode="plain")
    def _as_json(self) -> dict[str, Any]:
        if self.control:
            return {"src": self.src, "dst": self.dst, "control": True}
        return {"src": self.src, "tensor": self.tensor, "bytes": self.bytes, "dst": self.dst}


class Plan(BaseModel):
    """Device per op, order per device, and the simulator's estimate for that order.

    ``transfer_order`` (optional): per device, its channel's messages in booking order
    (docs/format.md §10); absent, channels are booked first come, first served
    (docs/format.md §4). It is left out of the JSON when absent.
    """

    model_config = ConfigDict(extra="forbid")

    format: Literal["baechi.plan/v1"] = PLAN_FORMAT
    graph: GraphInfo = Field(default_factory=GraphInfo)
    request: PlanRequest
    placement: dict[str, str]
    order: dict[str, list[str]]
    transfer_order: dict[str, list[TransferEntry]] | None = None
    estimate: Estimate | None = None
    stats: PlanStats = Field(default_factory=PlanStats)
    engine: dict[str, Any] = Field(default_factory=dict)

    @model_serializer(mode="wrap")
    def _without_absent(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if data.get("transfer_order") is None:
            data.pop("transfer_order", None)  # plans without one read as before
        return data

    @classmethod
    def parse(cls, value: Plan | dict[str, Any]) -> Plan:
        """Build a plan from its JSON form, raising :class:`InvalidPlan` on bad input."""
        if isinstance(value, Plan):
            return value
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            raise InvalidPlan("plan: " + describe_validation_error(exc)) from None
