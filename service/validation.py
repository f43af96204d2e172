"""Checking a request before anything is queued: everything cheap enough to do in the request.

Graph format, cluster, options, algorithm name, op count and pins against the cluster's
devices are all checked here, so a bad request gets its 422 at ``POST`` time instead of a job
that fails later. The engine's own errors (naming the op or field) pass through unchanged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson
from baechi.service.errors import ApiError
from baechi.service.schemas import DEFAULT_ALGORITHM
from baechi.service.settings import Settings

from baechi.algorithms import ALGORITHM_NAMES
from baechi.cluster import Cluster
from baechi.errors import InvalidCluster, InvalidRequest
from baechi.graph import Graph, load_graph
from baechi.options import Options

#: Largest byte count accepted anywhere (a signed 64-bit integer).
MAX_BYTES = 2**63 - 1
REQUEST_KEYS = ("graph", "graph_id", "cluster", "algorithm", "options")


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
    cluster: dict[str, Any]  # as the user wrote it: plans are self-describing (DESIGN §5)
    algorithm: str
    options: dict[str, Any]  # defaults filled in, time limit capped for the job's timeout
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
    """Validate a placement request.

    ``uploaded(graph_id)`` returns the stored graph's ``(name, ops, pins)`` or ``None``.
    """
    if not isinstance(data, dict):
        raise InvalidRequest("request: expected a JSON object with graph and cluster",
                             {"field": "request"})
    unknown = sorted(set(data) - set(REQUEST_KEYS))
    if unknown:
        raise InvalidRequest(f"{unknown[0]}: unknown key; a request has "
                             f"{', '.join(REQUEST_KEYS)}", {"field": unknown[0]})
    has_graph = data.get("graph") is not None
    has_id = data.get("graph_id") is not None
    if has_graph == has_id:
        raise InvalidRequest("graph: give exactly one of 'graph' (a document) and 'graph_id' "
                             "(from POST /graphs)", {"field": "graph"})
    if "cluster" not in data:
        raise InvalidRequest("cluster: required", {"field": "cluster"})
    cluster = Cluster.parse(data["cluster"])
    _check_sizes(cluster)
    algorithm = data.get("algorithm", DEFAULT_ALGORITHM)
    if not isinstance(algorithm, str) or algorithm not in ALGORITHM_NAMES:
        raise InvalidRequest(f"algorithm: unknown algorithm {algorithm!r}; choose one of "
                             f"{', '.join(ALGORITHM_NAMES)}", {"field": "algorithm"})
    options = Options.parse(data.get("options"))

    graph: ParsedGraph | None = None
    if has_graph:
        graph = parse_graph(data["graph"], settings)
        graph_id, name, ops, pins = graph.graph_id, graph.name, graph.ops, graph.pins
    else:
        graph_id = data["graph_id"]
        if not isinstance(graph_id, str) or not _is_graph_id(graph_id):
            raise InvalidRequest("graph_id: expected the 64-hex-digit id returned by POST "
                                 "/graphs", {"field": "graph_id"})
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
    _check_pins(pins, cluster)

    limit = settings.solver_limit_s(options.time_limit_s)
    normalised = options.model_dump()
    digest = hashlib.sha256(orjson.dumps(
        {"graph": graph_id, "cluster": cluster.to_json(), "algorithm": algorithm,
         "options": normalised}, option=orjson.OPT_SORT_KEYS,
    )).hexdigest()
    return PlacementInput(
        graph=graph, graph_id=graph_id, graph_name=name, graph_ops=ops,
        cluster=data["cluster"], algorithm=algorithm,
        options=normalised | {"time_limit_s": limit},
        timeout_s=settings.job_timeout_s(limit), digest=digest,
    )


def _check_sizes(cluster: Cluster) -> None:
    # JSON numbers like 1e30 parse as floats and become integers no 64-bit field can hold;
    # nothing downstream (orjson, Redis) can store them.
    for i, device in enumerate(cluster.devices):
        if device.memory_bytes is not None and device.memory_bytes > MAX_BYTES:
            raise InvalidCluster(
                f"cluster.devices[{i}].memory_bytes: {device.memory_bytes} is out of range "
                f"(at most {MAX_BYTES})", {"field": f"devices[{i}].memory_bytes"},
            )


def _check_pins(pins: dict[str, str], cluster: Cluster) -> None:
    names = [d.name for d in cluster.devices]
    for device, op in pins.items():
        if device not in names:
            shown = ", ".join(names[:8]) + (" …" if len(names) > 8 else "")
            raise InvalidRequest(
                f"op {op!r}.device: pinned to {device!r}, which is not a device of the "
                f"cluster ({shown})", {"op": op, "field": "device"},
            )


def _is_graph_id(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)
