"""The graph format ``baechi.graph/v1`` (format.md §2): models, loading, validation, indexed form.

:func:`load_graph` turns a JSON document (path, bytes, str or dict) into a :class:`Graph`:
ops and edges numbered by their position in the file, adjacency as lists of edge ids, and the
canonical topological order. Every rule of docs/format.md §2 is checked; the first failure raises
:class:`~baechi.errors.InvalidGraph` naming the op or edge and the field.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired

import orjson
from pydantic import ConfigDict, Field, StrictBool, StrictInt, TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic needs it before Python 3.12

from baechi.errors import InvalidGraph

GRAPH_FORMAT = "baechi.graph/v1"

#: Largest time (µs) of one op: 11.6 days. Bounded so that sums over a graph stay finite.
MAX_TIME_US = 1e12

#: Largest byte field: 2**53 (8 PiB), exact as a float. Bounded, with :data:`MAX_TOTAL_BYTES`,
#: so that every sum of bytes the cost model computes fits in an int64.
MAX_BYTES = 2**53

#: Largest sum of every op's and edge's bytes in one graph (2**62).
MAX_TOTAL_BYTES = 2**62

#: Deepest nesting of JSON inside ``meta`` and ``attrs`` (the content hash serialises them).
MAX_NESTING = 64

NonNegativeTime = Annotated[float, Field(ge=0, le=MAX_TIME_US, allow_inf_nan=False, strict=True)]
NonNegativeBytes = Annotated[StrictInt, Field(ge=0, le=MAX_BYTES)]


# The document is validated into plain dicts (TypedDicts): five times faster than building a
# model instance per op, which matters at tens of thousands of ops.
class OpSpec(TypedDict):
    """One operator as written in the file (format.md §2); absent fields take their defaults."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    name: Annotated[str, Field(min_length=1)]
    type: NotRequired[str]
    compute_us: NonNegativeTime
    output_bytes: NotRequired[NonNegativeBytes]
    temp_bytes: NotRequired[NonNegativeBytes]
    persistent_bytes: NotRequired[NonNegativeBytes]
    colocation_group: NotRequired[str | None]
    forward_op: NotRequired[str | None]
    device: NotRequired[str | None]
    attrs: NotRequired[dict[str, Any]]
    compute_us_by_kind: NotRequired[dict[Annotated[str, Field(min_length=1)],
                                         NonNegativeTime | None]]


class EdgeSpec(TypedDict):
    """One tensor (or control dependency) from ``src`` to ``dst``."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    src: str
    dst: str
    bytes: NonNegativeBytes
    tensor: NotRequired[str | None]
    control: NotRequired[StrictBool]
    transfer_us: NotRequired[NonNegativeTime]


class GraphDoc(TypedDict):
    """A whole ``baechi.graph/v1`` document."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    format: Literal["baechi.graph/v1"]
    name: NotRequired[str]
    meta: NotRequired[dict[str, Any]]
    ops: list[OpSpec]
    edges: NotRequired[list[EdgeSpec]]


GRAPH_DOCUMENT = TypeAdapter(GraphDoc)


class Graph:
    """A graph in indexed form: op ``i`` is the i-th op of the file.

    Attributes are plain lists (fast to index from Python loops); ``out_edges[i]`` and
    ``in_edges[i]`` hold edge ids in file order; ``forward_op[i]`` is an op index or -1.
    The constructor trusts its lists (the reduction pipeline builds graphs this way);
    :func:`load_graph` validates a document first.

    docs/format.md §10's optional fields: ``compute_us_by_kind[i]`` is op ``i``'s ``{kind: µs or
    None}`` (``None`` = cannot run on that kind) and ``edge_transfer_us[k]`` edge ``k``'s
    measured transfer time or ``None``; each list is ``None`` when no op (edge) has the field.
    """

    def __init__(
        self, *, name: str, meta: dict[str, Any], names: list[str], types: list[str],
        compute_us: list[float], output_bytes: list[int], temp_bytes: list[int],
        persistent_bytes: list[int], colocation_group: list[str | None],
        pin: list[str | None], forward_op: list[int], edge_src: list[int],
        edge_dst: list[int], edge_bytes: list[int], edge_tensor: list[str],
        edge_control: list[bool], attrs: list[dict[str, Any]] | None = None,
        sha256: str | None = None, index: dict[str, int] | None = None,
        document: dict[str, Any] | None = None,
        compute_us_by_kind: list[dict[str, float | None]] | None = None,
        edge_transfer_us: list[float | None] | None = None,
    ) -> None:
        n = len(names)
        self.name, self.meta, self.names = name, meta, names
        self.index = index if index is not None else {x: i for i, x in enumerate(names)}
        self.types, self.compute_us = types, compute_us
        self.output_bytes, self.temp_bytes = output_bytes, temp_bytes
        self.persistent_bytes = persistent_bytes
        self.colocation_group, self.pin, self.forward_op = colocation_group, pin, forward_op
        self.edge_src, self.edge_dst, self.edge_bytes = edge_src, edge_dst, edge_bytes
        self.edge_tensor, self.edge_control = edge_tensor, edge_control
        self.attrs = attrs
        self.compute_us_by_kind = compute_us_by_kind
        self.edge_transfer_us = edge_transfer_us
        self._sha256 = sha256
        self._document = document
        self.out_edges: list[list[int]] = [[] for _ in range(n)]
        self.in_edges: list[list[int]] = [[] for _ in range(n)]
        for k, (src, dst) in enumerate(zip(edge_src, edge_dst, strict=True)):
            self.out_edges[src].append(k)
            self.in_edges[dst].append(k)
        self.topo: list[int] = self._canonical_order()
        self._topo_position: list[int] | None = None

    @classmethod
    def from_document(cls, data: dict[str, Any], sha256: str) -> Graph:
        """Index a document that passed :data:`GRAPH_DOCUMENT`; check names and references."""
        ops = data["ops"]
        names = [op["name"] for op in ops]
        index: dict[str, int] = {}
        for i, name in enumerate(names):
            if name in index:
                raise InvalidGraph(
                    f"ops[{i}].name: duplicate op name {name!r} (first at ops[{index[name]}])",
                    {"op": name, "field": "name"},
                )
            index[name] = i
        forward_op = [-1] * len(ops)
        for i, op in enumerate(ops):
            forward = op.get("forward_op")
            if forward is not None:
                if forward not in index:
                    raise InvalidGraph(
                        f"op {op['name']!r} (ops[{i}]).forward_op: names unknown op {forward!r}",
                        {"op": op["name"], "field": "forward_op"},
                    )
                forward_op[i] = index[forward]
        _check_forward_pairs(names, forward_op)
        _check_group_pins(ops)
        edges = data.get("edges", [])
        edge_src = [0] * len(edges)
        edge_dst = [0] * len(edges)
        edge_tensor = [""] * len(edges)
        seen: set[tuple[int, int, str, bool]] = set()
        for k, e in enumerate(edges):
            src = index.get(e["src"])
            dst = index.get(e["dst"])
            if src is None or dst is None:
                field, name = ("src", e["src"]) if src is None else ("dst", e["dst"])
                raise InvalidGraph(
                    f"edges[{k}].{field}: unknown op {name!r} (edge {e['src']!r} -> {e['dst']!r})",
                    {"edge": k, "field": field},
                )
            if src == dst:
                raise InvalidGraph(
                    f"edges[{k}]: self-loop on op {e['src']!r}", {"edge": k, "field": "dst"}
                )
            tensor = e.get("tensor")
            tensor = e["src"] if tensor is None else tensor
            control = e.get("control", False)
            key = (src, dst, tensor, control)
            if key in seen:
                raise InvalidGraph(
                    f"edges[{k}]: duplicate edge {e['src']!r} -> {e['dst']!r} "
                    f"({'control' if control else f'tensor {tensor!r}'}); parallel edges "
                    "must carry different tensors",
                    {"edge": k, "field": "tensor"},
                )
            seen.add(key)
            edge_src[k], edge_dst[k], edge_tensor[k] = src, dst, tensor
        return cls(
            name=data.get("name", ""), meta=data.get("meta", {}), names=names,
            types=[op.get("type", "") for op in ops],
            compute_us=[float(op["compute_us"]) for op in ops],
            output_bytes=[op.get("output_bytes", 0) for op in ops],
            temp_bytes=[op.get("temp_bytes", 0) for op in ops],
            persistent_bytes=[op.get("persistent_bytes", 0) for op in ops],
            colocation_group=[op.get("colocation_group") for op in ops],
            pin=[op.get("device") for op in ops], forward_op=forward_op,
            edge_src=edge_src, edge_dst=edge_dst,
            edge_bytes=[e["bytes"] for e in edges], edge_tensor=edge_tensor,
            edge_control=[e.get("control", False) for e in edges],
            attrs=[op.get("attrs", {}) for op in ops], sha256=sha256, index=index,
            document=data,
            compute_us_by_kind=[op.get("compute_us_by_kind", {}) for op in ops]
            if any("compute_us_by_kind" in op for op in ops) else None,
            edge_transfer_us=[e.get("transfer_us") for e in edges]
            if any("transfer_us" in e for e in edges) else None,
        )

    @property
    def sha256(self) -> str:
        """Content hash of the document (see :func:`graph_sha256`)."""
        if self._sha256 is None:
            self._sha256 = graph_sha256(self.to_dict())
        return self._sha256

    # ------------------------------------------------------------------ structure
    def __len__(self) -> int:
        return len(self.names)

    @property
    def num_edges(self) -> int:
        return len(self.edge_src)

    @property
    def topo_position(self) -> list[int]:
        """``topo_position[op]``: the op's index in :attr:`topo` (computed once)."""
        if self._topo_position is None:
            position = [0] * len(self.names)
            for i, op in enumerate(self.topo):
                position[op] = i
            self._topo_position = position
        return self._topo_position

    def successors(self, op: int) -> list[int]:
        return [self.edge_dst[k] for k in self.out_edges[op]]

    def predecessors(self, op: int) -> list[int]:
        return [self.edge_src[k] for k in self.in_edges[op]]

    def _canonical_order(self) -> list[int]:
        """Kahn's algorithm, smallest file index first (docs/format.md §4); raises on a cycle."""
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

    def largest_op(self) -> dict[str, Any] | None:
        """The op with the most compute and its share of the graph's (``None`` when no op
        takes time): no plan runs the step faster than that op, so a large share says the
        graph was captured too coarsely to split.

        Examples
        --------
        >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
        ...     {"name": "a", "compute_us": 3}, {"name": "b", "compute_us": 1}]})
        >>> g.largest_op()
        {'name': 'a', 'share': 0.75}
        """
        total = math.fsum(self.compute_us)
        if total <= 0:
            return None
        op = max(range(len(self.compute_us)), key=self.compute_us.__getitem__)
        return {"name": self.names[op], "share": round(self.compute_us[op] / total, 4)}

    def longest_chain_us(self, op_us: Sequence[float]) -> float:
        """Longest chain of ops (edges cost nothing), each op taking ``op_us[op]``."""
        finish = [0.0] * len(self.names)
        longest = 0.0
        for op in self.topo:
            start = 0.0
            for k in self.in_edges[op]:
                f = finish[self.edge_src[k]]
                if f > start:
                    start = f
            finish[op] = start + op_us[op]
            if finish[op] > longest:
                longest = finish[op]
        return longest

    def to_dict(self) -> dict[str, Any]:
        """The graph as a ``baechi.graph/v1`` document: the one it was loaded from, or one
        built from the lists (fields at their default omitted); its hash is :attr:`sha256`."""
        if self._document is not None:
            return self._document
        ops = []
        for i, name in enumerate(self.names):
            op: dict[str, Any] = {"name": name, "compute_us": self.compute_us[i]}
            for key, value, default in (
                ("type", self.types[i], ""), ("output_bytes", self.output_bytes[i], 0),
                ("temp_bytes", self.temp_bytes[i], 0),
                ("persistent_bytes", self.persistent_bytes[i], 0),
                ("colocation_group", self.colocation_group[i], None),
                ("forward_op", self.names[self.forward_op[i]] if self.forward_op[i] >= 0
                 else None, None),
                ("device", self.pin[i], None),
                ("attrs", self.attrs[i] if self.attrs else {}, {}),
                ("compute_us_by_kind",
                 self.compute_us_by_kind[i] if self.compute_us_by_kind else {}, {}),
            ):
                if value != default:
                    op[key] = value
            ops.append(op)
        edges = []
        for k in range(self.num_edges):
            edge: dict[str, Any] = {"src": self.names[self.edge_src[k]],
                                    "dst": self.names[self.edge_dst[k]],
                                    "bytes": self.edge_bytes[k]}
            if self.edge_tensor[k] != edge["src"]:
                edge["tensor"] = self.edge_tensor[k]
            if self.edge_control[k]:
                edge["control"] = True
            if self.edge_transfer_us is not None and self.edge_transfer_us[k] is not None:
                edge["transfer_us"] = self.edge_transfer_us[k]
            edges.append(edge)
        return {"format": GRAPH_FORMAT, "name": self.name, "meta": self.meta, "ops": ops,
                "edges": edges}


def _check_forward_pairs(names: list[str], forward_op: list[int]) -> None:
    """A backward op names another op as its forward op, and following ``forward_op`` never
    comes back (each op is visited once: linear)."""
    state = [0] * len(names)  # 0 unseen, 1 on the current chain, 2 done
    for first in range(len(names)):
        chain, op = [], first
        while op >= 0 and state[op] == 0:
            state[op] = 1
            chain.append(op)
            op = forward_op[op]
        if op >= 0 and state[op] == 1:
            cycle = chain[chain.index(op):]
            what = ("names itself" if len(cycle) == 1 else "forms a cycle "
                    + " -> ".join(repr(names[v]) for v in [*cycle, op]))
            raise InvalidGraph(f"op {names[op]!r} (ops[{op}]).forward_op: {what}",
                               {"op": names[op], "field": "forward_op"})
        for v in chain:
            state[v] = 2


def _check_group_pins(ops: list[dict[str, Any]]) -> None:
    """Ops of one colocation group share a device, so they cannot be pinned to two."""
    pinned: dict[str, tuple[int, str]] = {}
    for i, op in enumerate(ops):
        group, pin = op.get("colocation_group"), op.get("device")
        if group is None or pin is None:
            continue
        first = pinned.setdefault(group, (i, pin))
        if first[1] != pin:
            raise InvalidGraph(
                f"op {op['name']!r} (ops[{i}]).device: pinned to {pin!r}, but op "
                f"{ops[first[0]]['name']!r} of the same colocation group {group!r} is pinned "
                f"to {first[1]!r}", {"op": op["name"], "field": "device"})


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
        document = GRAPH_DOCUMENT.validate_python(data)
    except ValidationError as exc:
        message, details = _describe(exc, data)
        raise InvalidGraph(message, details) from None
    _check_nesting(document)
    _check_total_bytes(document)
    return Graph.from_document(document, graph_sha256(data))


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(
            item, list) else None
        if children is not None:
            deepest = max(deepest, depth + 1)
            if deepest > MAX_NESTING:
                return deepest
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _check_nesting(document: dict[str, Any]) -> None:
    places = [("meta", None, document.get("meta", {}))]
    places += [(f"op {op['name']!r} (ops[{i}]).attrs", op["name"], op.get("attrs", {}))
               for i, op in enumerate(document["ops"]) if op.get("attrs")]
    for where, name, value in places:
        if _depth(value) > MAX_NESTING:
            raise InvalidGraph(f"{where}: JSON nested deeper than {MAX_NESTING} levels",
                               {"field": "attrs" if name else "meta", "op": name})


def _check_total_bytes(document: dict[str, Any]) -> None:
    total = sum(op.get("output_bytes", 0) + op.get("temp_bytes", 0)
                + op.get("persistent_bytes", 0) for op in document["ops"])
    total += sum(e["bytes"] for e in document.get("edges", []))
    if total > MAX_TOTAL_BYTES:
        raise InvalidGraph(
            f"ops: the graph's bytes add up to {total}, more than {MAX_TOTAL_BYTES} (2**62): "
            "sums of memory would overflow; check the byte fields' units",
            {"field": "ops"},
        )


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

