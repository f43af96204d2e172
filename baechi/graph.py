"""The graph format ``baechi.graph/v1`` (DESIGN §2): models, loading, validation, indexed form.

:func:`load_graph` turns a JSON document (path, bytes, str or dict) into a :class:`Graph`:
ops and edges numbered by their position in the file, adjacency as lists of edge ids, and the
canonical topological order. Every rule of DESIGN §2 is checked; the first failure raises
:class:`~baechi.errors.InvalidGraph` naming the op or edge and the field.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from baechi.errors import InvalidGraph

GRAPH_FORMAT = "baechi.graph/v1"

NonNegativeTime = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]
NonNegativeBytes = Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]


class OpSpec(BaseModel):
    """One operator as written in the file."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    type: str = ""
    compute_us: NonNegativeTime
    output_bytes: NonNegativeBytes = 0
    temp_bytes: NonNegativeBytes = 0
    persistent_bytes: NonNegativeBytes = 0
    colocation_group: str | None = None
    forward_op: str | None = None
    device: str | None = None
    attrs: dict[str, Any] = Field(default_factory=dict)


class EdgeSpec(BaseModel):
    """One tensor (or control dependency) from ``src`` to ``dst``."""

    model_config = ConfigDict(extra="forbid")

    src: str
    dst: str
    bytes: NonNegativeBytes
    tensor: str | None = None
    control: StrictBool = False


class GraphDoc(BaseModel):
    """A whole ``baechi.graph/v1`` document."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["baechi.graph/v1"]
    name: str = ""
    meta: dict[str, Any] = Field(default_factory=dict)
    ops: list[OpSpec]
    edges: list[EdgeSpec] = Field(default_factory=list)


class Graph:
    """A validated graph in indexed form: op ``i`` is the i-th op of the file.

    Attributes are plain lists (fast to index from Python loops); ``out_edges[i]`` and
    ``in_edges[i]`` hold edge ids in file order.
    """

    def __init__(self, doc: GraphDoc, sha256: str) -> None:
        self.doc = doc
        self.name = doc.name
        self.meta = doc.meta
        self.sha256 = sha256
        ops = doc.ops
        self.names: list[str] = [op.name for op in ops]
        self.index: dict[str, int] = {}
        for i, name in enumerate(self.names):
            if name in self.index:
                raise InvalidGraph(
                    f"ops[{i}].name: duplicate op name {name!r} (first at ops[{self.index[name]}])",
                    {"op": name, "field": "name"},
                )
            self.index[name] = i
        n = len(ops)
        self.types: list[str] = [op.type for op in ops]
        self.compute_us: list[float] = [float(op.compute_us) for op in ops]
        self.output_bytes: list[int] = [op.output_bytes for op in ops]
        self.temp_bytes: list[int] = [op.temp_bytes for op in ops]
        self.persistent_bytes: list[int] = [op.persistent_bytes for op in ops]
        self.colocation_group: list[str | None] = [op.colocation_group for op in ops]
        self.pin: list[str | None] = [op.device for op in ops]
        self.forward_op: list[int] = [-1] * n
        for i, op in enumerate(ops):
            if op.forward_op is not None:
                target = self.index.get(op.forward_op)
                if target is None:
                    raise InvalidGraph(
                        f"op {op.name!r} (ops[{i}]).forward_op: names unknown op {op.forward_op!r}",
                        {"op": op.name, "field": "forward_op"},
                    )
                self.forward_op[i] = target

        edges = doc.edges
        m = len(edges)
        self.edge_src: list[int] = [0] * m
        self.edge_dst: list[int] = [0] * m
        self.edge_bytes: list[int] = [e.bytes for e in edges]
        self.edge_control: list[bool] = [e.control for e in edges]
        self.edge_tensor: list[str] = [""] * m
        self.out_edges: list[list[int]] = [[] for _ in range(n)]
        self.in_edges: list[list[int]] = [[] for _ in range(n)]
        seen: set[tuple[int, int, str, bool]] = set()
        for k, e in enumerate(edges):
            src = self.index.get(e.src)
            dst = self.index.get(e.dst)
            if src is None or dst is None:
                field, name = ("src", e.src) if src is None else ("dst", e.dst)
                raise InvalidGraph(
                    f"edges[{k}].{field}: unknown op {name!r} (edge {e.src!r} -> {e.dst!r})",
                    {"edge": k, "field": field},
                )
            if src == dst:
                raise InvalidGraph(
                    f"edges[{k}]: self-loop on op {e.src!r}", {"edge": k, "field": "dst"}
                )
            tensor = e.tensor if e.tensor is not None else e.src
            key = (src, dst, tensor, e.control)
            if key in seen:
                raise InvalidGraph(
                    f"edges[{k}]: duplicate edge {e.src!r} -> {e.dst!r} "
                    f"({'control' if e.control else f'tensor {tensor!r}'}); parallel edges "
                    "must carry different tensors",
                    {"edge": k, "field": "tensor"},
                )
            seen.add(key)
            self.edge_src[k] = src
            self.edge_dst[k] = dst
            self.edge_tensor[k] = tensor
            self.out_edges[src].append(k)
            self.in_edges[dst].append(k)
        self.topo: list[int] = self._canonical_order()

    # ------------------------------------------------------------------ structure
    def __len__(self) -> int:
        return len(self.names)

    @property
    def num_edges(self) -> int:
        return len(self.edge_src)

    def successors(self, op: int) -> list[int]:
        return [self.edge_dst[k] for k in self.out_edges[op]]

    def predecessors(self, op: int) -> list[int]:
        return [self.edge_src[k] for k in self.in_edges[op]]

    def _canonical_order(self) -> list[int]:
        """Kahn's algorithm, smallest file index first (DESIGN §4); raises on a cycle."""
        indegree = [len(ins) for ins in self.in_edges]
        heap = [i for i, d in enumerate(indegree) if d == 0]
        heapq.heapify(heap)
        order: list[int] = []
        while heap:
            op = heapq.heappop(heap)
            order.append(op)
            for k in self.out_edges[op]:
                dst = self.edge_dst[k]
                indegree[dst] -= 1
                if indegree[dst] == 0:
                    heapq.heappush(heap, dst)
        if len(order) < len(self.names):
            cycle = find_cycle(
                [i for i, d in enumerate(indegree) if d > 0],
                lambda op: [self.edge_dst[k] for k in self.out_edges[op]],
            )
            names = [self.names[i] for i in cycle]
            raise InvalidGraph(
                "edges: the graph has a cycle through ops " + " -> ".join(map(repr, names)),
                {"cycle": names, "field": "edges"},
            )
        return order

    def critical_path_us(self, speed: float = 1.0) -> float:
        """Longest chain of compute (edges cost nothing) at the given device speed."""
        finish = [0.0] * len(self.names)
        longest = 0.0
        for op in self.topo:
            start = 0.0
            for k in self.in_edges[op]:
                f = finish[self.edge_src[k]]
                if f > start:
                    start = f
            finish[op] = start + self.compute_us[op] / speed
            if finish[op] > longest:
                longest = finish[op]
        return longest

    def to_dict(self) -> dict[str, Any]:
        """The document as JSON-ready data (defaults omitted)."""
        return self.doc.model_dump(exclude_defaults=True) | {"format": GRAPH_FORMAT}


def find_cycle(candidates: Sequence[int], successors: Any) -> list[int]:
    """A cycle among ``candidates`` (each has a successor among them), iteratively."""
    inside = set(candidates)
    state: dict[int, int] = {}  # 1 = on the stack, 2 = done
    for root in candidates:
        if root in state:
            continue
        stack = [(root, iter(successors(root)))]
        path = [root]
        state[root] = 1
        while stack:
            node, children = stack[-1]
            for child in children:
                if child not in inside:
                    continue
                if state.get(child) == 1:
                    return path[path.index(child):]
                if child not in state:
                    state[child] = 1
                    stack.append((child, iter(successors(child))))
                    path.append(child)
                    break
            else:
                stack.pop()
                path.pop()
                state[node] = 2
    return list(candidates)


def _describe(exc: ValidationError, data: Any) -> tuple[str, dict[str, Any]]:
    """Turn pydantic's first error into one line naming the op or edge and the field."""
    error = exc.errors()[0]
    loc = error["loc"]
    msg = error["msg"]
    if error["type"] in ("float_type", "int_type") and isinstance(error.get("input"), bool):
        msg = "a boolean is not a number"
    elif error["type"] == "finite_number":
        msg = "must be a finite number (not NaN or infinity)"
    details: dict[str, Any] = {"field": ".".join(map(str, loc)), "errors": exc.error_count()}
    if len(loc) >= 2 and loc[0] in ("ops", "edges") and isinstance(loc[1], int):
        section, i = loc[0], loc[1]
        field = ".".join(map(str, loc[2:])) or "(item)"
        item = data[section][i] if isinstance(data, dict) else None
        if section == "ops":
            name = item.get("name") if isinstance(item, dict) else None
            where = f"op {name!r} (ops[{i}])" if isinstance(name, str) else f"ops[{i}]"
            details["op"] = name
        else:
            if isinstance(item, dict):
                where = f"edge {item.get('src')!r} -> {item.get('dst')!r} (edges[{i}])"
            else:
                where = f"edges[{i}]"
            details["edge"] = i
        details["field"] = field
        return f"{where}.{field}: {msg}", details
    where = ".".join(map(str, loc)) or "graph"
    if error["type"] == "extra_forbidden":
        msg = "unknown key"
    return f"{where}: {msg}", details


def parse_graph(data: dict[str, Any]) -> Graph:
    """Validate a graph document already parsed from JSON."""
    if not isinstance(data, dict):
        raise InvalidGraph("graph: expected a JSON object", {"field": "graph"})
    if data.get("format") != GRAPH_FORMAT:
        raise InvalidGraph(
            f"format: expected {GRAPH_FORMAT!r}, got {data.get('format')!r}", {"field": "format"}
        )
    try:
        doc = GraphDoc.model_validate(data)
    except ValidationError as exc:
        message, details = _describe(exc, data)
        raise InvalidGraph(message, details) from None
    return Graph(doc, graph_sha256(data))


def graph_sha256(data: dict[str, Any]) -> str:
    """Content hash of a graph document: SHA-256 of its canonical JSON (sorted keys)."""
    return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()


def load_graph(source: Graph | dict[str, Any] | str | Path | bytes) -> Graph:
    """Load and validate a ``baechi.graph/v1`` graph.

    Parameters
    ----------
    source : Graph, dict, path, JSON text or bytes
        A path names a JSON file; a ``str`` starting with ``{`` is read as JSON text.

    Examples
    --------
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [{"name": "a", "compute_us": 1}]})
    >>> g.names, g.topo
    (['a'], [0])
    """
    if isinstance(source, Graph):
        return source
    if isinstance(source, dict):
        return parse_graph(source)
    if isinstance(source, str) and source.lstrip().startswith("{"):
        source = source.encode()
    if isinstance(source, (str, Path)):
        path = Path(source)
        try:
            source = path.read_bytes()
        except OSError as exc:
            raise InvalidGraph(f"{path}: cannot read graph file: {exc.strerror}") from None
    try:
        data = orjson.loads(source)
    except orjson.JSONDecodeError as exc:
        raise InvalidGraph(f"graph: not valid JSON: {exc}") from None
    return parse_graph(data)

