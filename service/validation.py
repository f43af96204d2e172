"""Checking a request before anything is queued: everything cheap enough to do in the request.

The request is validated by :class:`~baechi.service.schemas.PlacementRequest` (the engine's
own cluster and options models; no rule is repeated here), the graph by the engine's loader;
op count and pins against the cluster's devices are checked here too, so a bad request gets
its 422 at ``POST`` time instead of a job that fails later. The engine's own errors (naming
the op or field) pass through unchanged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from baechi.cluster import Cluster, describe_validation_error
from baechi.errors import InvalidCluster, InvalidRequest, PlacementError
from baechi.graph import Graph, load_graph
from baechi.jobs.settings import Settings
from baechi.service.errors import ApiError
from baechi.service.schemas import PlacementRequest


@dataclass
class ParsedGraph:
    """A validated graph, ready to store: its id, document and what the API reports."""

    graph_id: str
    document: bytes
    name: str
    ops: int
    edges: int
    pins: dict[str, str]

    @classmethod
    def of(cls, graph: Graph, data: dict[str, Any]) -> ParsedGraph:
        pins: dict[str, str] = {}
        for op, device in enumerate(graph.pin):
            if device is not None:
                pins.setdefault(device, graph.names[op])
        return cls(graph.sha256, orjson.dumps(data), graph.name, len(graph), graph.num_edges,
                   pins)


@dataclass
class PlacementInput:
    """A valid placement request, normalised."""

    graph: ParsedGraph | None  # None when the request named an uploaded graph_id
    graph_id: str
    graph_name: str
    graph_ops: int
    cluster: dict[str, Any]  # as the user wrote it: plans are self-describing (docs/format.md §5)
    algorithm: str
    options: dict[str, Any]  # defaults filled in, time limit capped for the job's timeout
    objective: str
    timeout_s: int
    digest: str  # equal for equal requests: the idempotency key


def parse_json(body: bytes) -> Any:
    """The body as JSON, or a 400 saying where it stops being JSON."""
    if not body.strip():
        raise ApiError(400, "malformed_json", "the request body is empty; expected JSON")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "malformed_json", f"the request body is not valid JSON: {exc}",
                       {"position": exc.pos}) from None


def parse_graph(data: Any, settings: Settings, field: str = "graph") -> ParsedGraph:
    """Validate a graph document, refusing more ops than the server accepts before parsing."""
    if not isinstance(data, dict):
        raise ApiError(422, "invalid_graph", f"{field}: expected a baechi.graph/v1 JSON object",
                       {"field": field})
    ops = data.get("ops")
    if isinstance(ops, list) and len(ops) > settings.max_ops:
        raise ApiError(422, "too_many_ops",
                       f"{field}.ops: the graph has {len(ops)} ops; this server accepts at most "
                       f"{settings.max_ops}", {"field": f"{field}.ops", "ops": len(ops),
                                               "max_ops": settings.max_ops})
    return ParsedGraph.of(load_graph(data), data)


def parse_placement(data: Any, settings: Settings, uploaded: Any) -> PlacementInput:
    """Validate a placement request with :class:`~baechi.service.schemas.PlacementRequest`
    (the engine's models); the graph is read once, by the engine.

    ``uploaded(graph_id)`` returns the stored graph's ``(name, ops, pins)`` or ``None``.
    """
    if not isinstance(data, dict):
        raise InvalidRequest("request: expected a JSON object with graph and cluster",
                             {"field": "request"})
    has_graph = data.get("graph") is not None
    fields = {key: value for key, value in data.items() if key != "graph"}
    try:
        request = PlacementRequest.model_validate(fields, context={"has_graph": has_graph})
    except ValidationError as exc:
        raise _request_error(exc) from None

    graph: ParsedGraph | None = None
    if has_graph:
        graph = parse_graph(data["graph"], settings)
        graph_id, name, ops, pins = graph.graph_id, graph.name, graph.ops, graph.pins
    else:
        graph_id = request.graph_id or ""
        found = uploaded(graph_id)
        if found is None:
            raise ApiError(422, "unknown_graph", f"graph_id: no graph {graph_id} (never "
                           "uploaded by this tenant, or expired); upload it with POST /graphs",
                           {"field": "graph_id"})
        name, ops, pins = found
        if ops > settings.max_ops:
            raise ApiError(422, "too_many_ops", f"graph_id: the graph has {ops} ops; this "
                           f"server accepts at most {settings.max_ops}",
                           {"field": "graph_id", "ops": ops, "max_ops": settings.max_ops})
    _check_pins(pins, request.cluster)

    limit = settings.solver_limit_s(request.options.time_limit_s)
    normalised = request.options.model_dump()
    digest = hashlib.sha256(orjson.dumps(
        {"graph": graph_id, "cluster": request.cluster.to_json(),
         "algorithm": request.algorithm, "options": normalised,
         "objective": request.objective}, option=orjson.OPT_SORT_KEYS,
    )).hexdigest()
    return PlacementInput(
        graph=graph, graph_id=graph_id, graph_name=name, graph_ops=ops,
        cluster=data["cluster"], algorithm=request.algorithm,
        options=normalised | {"time_limit_s": limit}, objective=request.objective,
        timeout_s=settings.job_timeout_s(limit), digest=digest,
    )


def _request_error(exc: ValidationError) -> PlacementError:
    """The engine's error for a request the schema refused, naming the first bad field."""
    errors = exc.errors()
    where = errors[0]["loc"][0] if errors and errors[0]["loc"] else "request"
    message = describe_validation_error(exc)
    if where == "cluster" and errors[0]["type"] != "missing":
        return InvalidCluster(message, {"field": "cluster"})
    if errors and errors[0]["type"] == "extra_forbidden":
        message = (f"{where}: unknown key; a request has "
                   f"{', '.join(PlacementRequest.model_fields)}")
    return InvalidRequest(message, {"field": str(where)})


def _check_pins(pins: dict[str, str], cluster: Cluster) -> None:
    names = [d.name for d in cluster.devices]
    for device, op in pins.items():
        if device not in names:
            shown = ", ".join(names[:8]) + (" …" if len(names) > 8 else "")
            raise InvalidRequest(
                f"op {op!r}.device: pinned to {device!r}, which is not a device of the "
                f"cluster ({shown})", {"op": op, "field": "device"},
            )
