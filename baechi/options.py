"""Options of a placement request (docs/format.md §3, §6), with their defaults."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from baechi.cluster import describe_validation_error
from baechi.defaults import DEFAULT_TIME_LIMIT_S, DEFAULT_TRANSFER_ORDER
from baechi.errors import InvalidRequest


class Options(BaseModel):
    """Switches of the reduction pipeline and limits of the placer.

    Every pipeline step is on by default; ``allow_single`` returns the single-device plan
    when it fits and is predicted faster than the algorithm's plan with its transfers ordered
    (``transfer_order``); ``portfolio`` also places the unreduced graph and with m-fill, and
    keeps the fastest plan.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    co_placement: StrictBool = True
    fusion: StrictBool = True
    forward_only: StrictBool = True
    allow_single: StrictBool = True
    #: Also place the unreduced graph and with m-fill; keep the fastest plan (about twice
    #: the time).
    portfolio: StrictBool = False
    time_limit_s: float = Field(default=DEFAULT_TIME_LIMIT_S, gt=0, le=86400, allow_inf_nan=False)
    #: How each channel's transfers are ordered (sequential mode): ``"fifo"``, first come,
    #: first served (docs/format.md §4), or ``"model-aware"``, by the urgency of their consumers,
    #: kept only when strictly faster (:mod:`baechi.ordering`).
    transfer_order: Literal["fifo", "model-aware"] = DEFAULT_TRANSFER_ORDER  # type: ignore[assignment]

    @classmethod
    def parse(cls, value: Options | dict[str, Any] | None) -> Options:
        """Build options from JSON, raising :class:`InvalidRequest` on unknown or bad fields."""
        if value is None:
            return cls()
        if isinstance(value, Options):
            return value
        if not isinstance(value, dict):
            raise InvalidRequest("options: expected an object")
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            raise InvalidRequest("options: " + describe_validation_error(exc)) from None

    def without_pipeline(self) -> Options:
        """The same options with every reduction step off."""
        return self.model_copy(update={"co_placement": False, "fusion": False})
