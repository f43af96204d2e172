"""Request and response bodies of the API, as pydantic models (they make the OpenAPI document).

Request models document the bodies; the routes parse those bodies themselves (orjson, then
the engine's validators) so a large graph is read once and every error names the op or field
the engine names. Response models are what the routes return.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from baechi.algorithms import DEFAULT_ALGORITHM
from baechi.graph import GraphDoc
from baechi.options import Options

Status = Literal["queued", "running", "finished", "failed", "canceled"]
GRAPH_ID_PATTERN = r"^[0-9a-f]{64}$"


# ---------------------------------------------------------------------------- requests
class DeviceSpec(BaseModel):
    """One device; ``memory_bytes`` in bytes or with a unit (``8GiB``), absent = unlimited."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    memory_bytes: int | str | None = Field(default=None, examples=[8589934592, "8GiB"])
    speed: float = Field(default=1.0, gt=0)


class DeviceCountSpec(BaseModel):
    """``count`` identical devices named ``name_prefix`` + index."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(ge=1, le=4096)
    memory_bytes: int | str | None = None
    speed: float = Field(default=1.0, gt=0)
    name_prefix: str = "/GPU:"


class NetworkSpec(BaseModel):
    """Links between devices; ``bandwidth_gbps`` in GB/s, absent = infinite."""

    model_config = ConfigDict(extra="forbid")

    latency_us: float = Field(default=0.0, ge=0)
    bandwidth_gbps: float | None = Field(default=None, gt=0)
    mode: Literal["sequential", "parallel"] = "sequential"


class ClusterSpec(BaseModel):
    """Devices (a list, or the count shorthand) and their network (DESIGN §3)."""

    model_config = ConfigDict(extra="forbid")

    devices: list[DeviceSpec] | DeviceCountSpec
    network: NetworkSpec | None = None


class PlacementRequest(BaseModel):
    """A placement request (DESIGN §3): ``graph`` inline or ``graph_id`` of an uploaded one."""

    model_config = ConfigDict(extra="forbid")

    graph: GraphDoc | None = Field(default=None, description="A baechi.graph/v1 document.")
    graph_id: str | None = Field(default=None, pattern=GRAPH_ID_PATTERN,
                                 description="Id returned by POST /graphs.")
    cluster: ClusterSpec
    algorithm: str = Field(default=DEFAULT_ALGORITHM, description="Placement algorithm.")
    options: Options | None = None
    objective: Literal["step_time", "throughput"] | None = Field(
        default=None, description="step_time (default) or throughput (DESIGN §10).")


# --------------------------------------------------------------------------- responses
class ErrorInfo(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. invalid_graph.")
    message: str = Field(description="What is wrong, naming the op or field.")
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorResponse(BaseModel):
    error: ErrorInfo


class Links(BaseModel):
    self: str
    plan: str
    report: str


class Progress(BaseModel):
    phase: str
    fraction: float = Field(ge=0, le=1)


class GraphSummary(BaseModel):
    graph_id: str
    name: str
    ops: int


class PlacementAccepted(BaseModel):
    id: str
    status: Status
    links: Links


class PlacementStatus(BaseModel):
    id: str
    status: Status
    progress: Progress
    error: ErrorInfo | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    algorithm: str
    graph: GraphSummary
    links: Links


class PlacementPage(BaseModel):
    items: list[PlacementStatus]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next (older) page; null on the last page."
    )


class GraphUploaded(BaseModel):
    graph_id: str = Field(description="SHA-256 of the graph's canonical JSON.")
    name: str
    ops: int
    edges: int
    size_bytes: int


class Health(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    status: Literal["ready"]
    redis: Literal["ok"]
    workers: int
