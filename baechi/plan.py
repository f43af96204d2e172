"""The plan format ``baechi.plan/v1`` (DESIGN §5)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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
    """What the simulator (DESIGN §4) reports for a plan."""

    step_time_us: float
    lower_bound_us: float
    single_device_us: float
    single_device_fits: bool
    peak_memory_bytes: dict[str, int]
    transfer_bytes: int
    transfers: int
    memory_ok: bool = True


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
