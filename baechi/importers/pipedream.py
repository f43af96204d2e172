"""Import PipeDream's layer profiles (``profiler/*/profiles/<model>/graph.txt``).

PipeDream (msr-fiddle/pipedream) writes one line per layer, then one tab-indented line per edge::

    node2 -- Conv2d(3, 64, kernel_size=(11, 11)) -- forward_compute_time=22.316, \
backward_compute_time=6.405, activation_size=198246400.000, parameter_size=93184.000
    \tnode1 -- node2

Times are milliseconds for the forward and the backward pass of a training step; sizes are bytes.
An ``activation_size`` may be a list ``[a; b; c]`` (a layer with several outputs): it is summed.

Mapping (the same as ``../shared/graphs/pipedream``): one op per layer, ``compute_us`` =
forward + backward, ``type`` = the module name before its arguments, ``output_bytes`` = the
activation size, ``persistent_bytes`` = the parameter size (weights only: optimizer state is not
in the profile), one edge per line with ``bytes`` = the producer's activation size (the gradient
flows back at the same size), ``attrs.forward_us`` / ``attrs.backward_us`` kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from baechi.errors import InvalidGraph
from baechi.importers.common import read_text, to_us

FORMAT_NAME = "pipedream"
NOTE = (
    "layer graph of a training step: compute_us = (forward+backward) ms * 1000; "
    "output_bytes = activation_size; persistent_bytes = parameter_size (weights only)"
)
_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")


def import_pipedream(source: str | Path, name: str | None = None) -> dict[str, Any]:
    """Convert a PipeDream ``graph.txt`` into a ``baechi.graph/v1`` document.

    Parameters
    ----------
    source : path
        The ``graph.txt`` file.
    name : str, optional
        Graph name; default ``pipedream_<model>``, the model being the file's folder.

    Raises
    ------
    InvalidGraph
        A line that is neither a node nor an edge, naming the file and line.
    """
    path = Path(source)
    text = read_text(path)
    ops: list[dict[str, Any]] = []
    activation: dict[str, int] = {}
    pairs: list[tuple[str, str, str]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        if line.startswith("\t"):
            pairs.append((*_edge(line, where), where))
        else:
            op = _node(line, where)
            if op["name"] in activation:
                raise InvalidGraph(f"{where}: node {op['name']!r} appears twice")
            activation[op["name"]] = op.get("output_bytes", 0)
            ops.append(op)
    edges = []
    for src, dst, where in pairs:
        if src not in activation:
            raise InvalidGraph(f"{where}: edge from unknown node {src!r}")
        edges.append({"src": src, "dst": dst, "bytes": activation[src], "tensor": f"{src}:0"})
    if name is None:
        model = path.parent.name if path.name == "graph.txt" else path.stem
        name = f"pipedream_{model}"
    return {
        "format": "baechi.graph/v1",
        "name": name,
        "meta": {"source": f"PipeDream profile {path.name}", "note": NOTE},
        "ops": ops,
        "edges": edges,
    }


def _node(line: str, where: str) -> dict[str, Any]:
    tokens = line.strip().split(" -- ")
    metrics_at = next((i for i, t in enumerate(tokens) if "forward_compute_time=" in t), None)
    if len(tokens) < 3 or metrics_at is None or metrics_at < 2:
        raise InvalidGraph(
            f"{where}: expected 'node_id -- description -- forward_compute_time=..., ...', "
            f"got {line.strip()[:80]!r}"
        )
    node_id = tokens[0].strip()
    description = " -- ".join(tokens[1:metrics_at]).strip()
    values = _metrics(tokens[metrics_at], where)
    forward_us = to_us(values["forward_compute_time"])
    backward_us = to_us(values["backward_compute_time"])
    op: dict[str, Any] = {
        "name": node_id,
        "compute_us": forward_us + backward_us,
        "type": description.split("(", 1)[0].strip(),
        "attrs": {"forward_us": forward_us, "backward_us": backward_us},
    }
    output_bytes = int(values["activation_size"])
    persistent = int(values["parameter_size"])
    if output_bytes:
        op["output_bytes"] = output_bytes
    if persistent:
        op["persistent_bytes"] = persistent
    return op


def _metrics(text: str, where: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for item in text.split(", "):
        key, _, raw = item.partition("=")
        key = key.strip()
        if key not in _FIELDS:
            continue
        raw = raw.strip()
        try:
            if raw.startswith("["):
                values[key] = sum(float(x) for x in raw.strip("[]").split(";") if x.strip())
            else:
                values[key] = float(raw)
        except ValueError:
            raise InvalidGraph(f"{where}: {key}: not a number: {raw!r}") from None
        if values[key] < 0 or values[key] != values[key]:
            raise InvalidGraph(f"{where}: {key}: must be a non-negative number, got {raw!r}")
    missing = [f for f in _FIELDS if f not in values]
    if missing:
        raise InvalidGraph(f"{where}: missing {', '.join(missing)}")
    return values


def _edge(line: str, where: str) -> tuple[str, str]:
    parts = [p.strip() for p in line.strip().split(" -- ")]
    if len(parts) != 2 or not all(parts):
        raise InvalidGraph(f"{where}: expected an edge '\\tsrc -- dst', got {line.strip()!r}")
    return parts[0], parts[1]


__all__ = ["import_pipedream"]
