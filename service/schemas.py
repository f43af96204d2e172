"""Request and response bodies of the API, as pydantic models (they make the OpenAPI document).

The request is the engine's own models put together: the cluster is
:class:`baechi.cluster.Cluster`, the options :class:`baechi.options.Options`, the algorithm a
name of the engine's registry and the graph :class:`baechi.graph.GraphDoc`. The routes
validate a request with :class:`PlacementRequest` itself, except for the graph, which the
engine's :func:`baechi.load_graph` reads once (its errors name the op). Response models are
what the routes return.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from baechi.algorithms import ALGORITHM_NAMES
from baechi.cluster import Cluster
from baechi.defaults import DEFAULT_ALGORITHM
from baechi.graph import GraphDoc
from baechi.jobs.store import Status
from baechi.options import Options

GRAPH_ID_PATTERN = r"^[0-9a-f]{64}$"
Objective = Literal["step_time", "throughput"]


# ---------------------------------------------------------------------------- requests
class PlacementRequest(BaseModel):
    """A placement request (format.md §3): ``graph`` inline or ``graph_id`` of an uploaded one."""

    model_config = ConfigDict(extra="forbid")

    graph: GraphDoc | None = Field(default=None, description="A baechi.graph/v1 document.")
    graph_id: str | None = Field(default=None, pattern=GRAPH_ID_PATTERN,
                                 description="Id returned by POST /graphs.")
    cluster: Cluster
    algorithm: str = Field(default=DEFAULT_ALGORITHM, description="Placement algorithm.",
                           json_schema_extra={"enum": list(ALGORITHM_NAMES)})
    options: Options = Field(default_factory=Options)
    objective: Objective = Field(default="step_time",
                                 description="step_time or throughput (docs/format.md §10).")

    @field_validator("algorithm")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in ALGORITHM_NAMES:
            raise ValueError(f"unknown algorithm {name!r}; choose one of "
                             f"{', '.join(ALGORITHM_NAMES)}")
        return name

    @model_validator(mode="after")
    def _one_graph(self, info: ValidationInfo) -> PlacementRequest:
        # the routes validate without the graph (the engine reads it) and say if it was there
        has_graph = self.graph is not None or bool((info.context or {}).get("has_graph"))
        if has_graph == (self.graph_id is not None):
            raise ValueError("give exactly one of 'graph' (a document) and 'graph_id' (from "
                             "POST /graphs)")
        return self


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
