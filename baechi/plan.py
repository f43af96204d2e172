"""The plan format ``baechi.plan/v1`` (DESIGN §5)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_serializer,
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
    """What the simulator (DESIGN §4) reports for a plan.

    ``single_device_us`` is infinite (``null`` in JSON) when no device can run every op
    (``compute_us_by_kind``). Under the throughput objective (DESIGN §10) the estimate also
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


class Plan(BaseModel):
    """Device per op, order per device, and the simulator's estimate for that order."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["baechi.plan/v1"] = PLAN_FORMAT
    graph: GraphInfo = Field(default_factory=GraphInfo)
    request: PlanRequest
    placement: dict[str, str]
    order: dict[str, list[str]]
    estimate: Estimate | None = None
    stats: dict[str, Any] = Field(default_factory=dict)
    engine: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def parse(cls, value: Plan | dict[str, Any]) -> Plan:
        """Build a plan from its JSON form, raising :class:`InvalidPlan` on bad input."""
        if isinstance(value, Plan):
            return value
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            raise InvalidPlan("plan: " + describe_validation_error(exc)) from None
