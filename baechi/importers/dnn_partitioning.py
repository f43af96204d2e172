"""Import the graphs of msr-fiddle/dnn-partitioning (Tarnawski et al., NeurIPS 2020).

Their inputs (``{latency,throughput}-inputs/{Layer,Operator}Graphs/*.json``) look like::

    {"maxSizePerFPGA": 629145600.0, "maxFPGAs": 5, "maxCPUs": 8,
     "nodes": [{"name": "node3", "id": 3, "fpgaLatency": 0.696, "cpuLatency": 6.96,
                "isBackwardNode": false, "colorClass": 3, "size": 131325952.0, ...}],
     "edges": [{"sourceId": 3, "destId": 5, "cost": 1.95, "size": 4194304.0}]}

Mapping: everything their throughput model needs (issue 10), so that
:func:`baechi.throughput.throughput_loads` on the import, on :data:`meta.suggested_cluster`,
reproduces their max-load:

- ``compute_us`` = ``fpgaLatency`` (ms) × 1000 (``cpuLatency`` when a node has no FPGA
  latency); ``compute_us_by_kind`` = ``{"cpu": cpuLatency × 1000}``, plus ``"gpu": null`` when
  ``supportedOnFpga`` is false (accelerators are devices of kind ``gpu``);
- a node's ``size`` (its memory on the device) → ``persistent_bytes``; ``colorClass`` c →
  colocation group ``color<c>``; ``isBackwardNode`` → ``attrs.is_backward``; ``id`` →
  ``attrs.id`` (so that splits written in their ids, such as the human-expert files, map back);
- edge ``bytes`` = the edge's ``size``, ``transfer_us`` = its ``cost`` × 1000; one tensor per
  source node (their model charges a node's communication once, whatever its consumers), a
  second edge between the same two nodes a tensor of its own; ``output_bytes`` = the largest
  outgoing edge;
- ``maxFPGAs``, ``maxSizePerFPGA`` and ``maxCPUs`` become ``meta.suggested_devices``,
  ``meta.suggested_memory_bytes`` and ``meta.suggested_cluster``: ``maxFPGAs`` devices
  ``/GPU:i`` of kind ``gpu`` with ``maxSizePerFPGA`` bytes, ``maxCPUs`` devices ``/CPU:i`` of
  kind ``cpu`` with ``host: true`` (no memory limit).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from baechi.errors import InvalidGraph
from baechi.importers.common import number, read_json, to_us

FORMAT_NAME = "dnn-partitioning"
NOTE = ("compute_us = fpgaLatency*1000; compute_us_by_kind.cpu = cpuLatency*1000 (gpu null "
        "where not supportedOnFpga); persistent_bytes = node size; edge bytes = edge size; "
        "edge transfer_us = cost*1000; attrs.id = node id")
_KIND_SUFFIX = {"operatorgraphs": "_operator", "layergraphs": "_layer"}


def import_dnn_partitioning(source: str | Path, name: str | None = None) -> dict[str, Any]:
    """Convert a dnn-partitioning JSON graph into a ``baechi.graph/v1`` document.

    Parameters
    ----------
    source : path
        The JSON file.
    name : str, optional
        Graph name; default the file's stem in lower case, with ``_operator`` or ``_layer``
        appended when the file sits in ``OperatorGraphs/`` or ``LayerGraphs/``.

    Raises
    ------
    InvalidGraph
        Missing or malformed fields, unknown node ids, naming the node or edge.
    """
    path = Path(source)
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise InvalidGraph(f"{path}: expected an object with 'nodes' and 'edges' lists")
    raw_edges = data.get("edges", [])
    if not isinstance(raw_edges, list):
        raise InvalidGraph(f"{path}: 'edges' must be a list")

    ops: list[dict[str, Any]] = []
    name_of: dict[Any, str] = {}
    for i, node in enumerate(data["nodes"]):
        where = f"nodes[{i}]"
        if not isinstance(node, dict) or not isinstance(node.get("name"), str):
            raise InvalidGraph(f"{path}: {where}: expected an object with a string 'name'")
        if "id" not in node:
            raise InvalidGraph(f"{path}: {where} ({node['name']!r}): missing 'id'")
        if node["id"] in name_of:
            raise InvalidGraph(f"{path}: {where}: duplicate node id {node['id']!r}")
        name_of[node["id"]] = node["name"]
        ops.append(_op(node, f"{path}: {where} ({node['name']!r})"))

    edges: list[dict[str, Any]] = []
    largest_out: dict[str, int] = {}
    pairs: set[tuple[str, str]] = set()
    for k, edge in enumerate(raw_edges):
        where = f"{path}: edges[{k}]"
        if not isinstance(edge, dict):
            raise InvalidGraph(f"{where}: expected an object")
        ends = []
        for field in ("sourceId", "destId"):
            if edge.get(field) not in name_of:
                raise InvalidGraph(f"{where}.{field}: unknown node id {edge.get(field)!r}")
            ends.append(name_of[edge[field]])
        src, dst = ends
        nbytes = int(number(edge.get("size", 0), where, "size"))
        converted: dict[str, Any] = {"src": src, "dst": dst, "bytes": nbytes}
        if (src, dst) in pairs:  # a second tensor between the same two nodes
            converted["tensor"] = f"{src}:{k}"
        pairs.add((src, dst))
        if "cost" in edge:
            # unrounded: their model adds these up exactly (costs are often powers of two)
            converted["transfer_us"] = number(edge["cost"], where, "cost") * 1000.0
        edges.append(converted)
        largest_out[src] = max(largest_out.get(src, 0), nbytes)

    for op in ops:
        if largest_out.get(op["name"]):
            op["output_bytes"] = largest_out[op["name"]]
    meta: dict[str, Any] = {"source": f"dnn-partitioning {path.name}", "note": NOTE}
    if "maxFPGAs" in data:
        meta["suggested_devices"] = int(number(data["maxFPGAs"], str(path), "maxFPGAs"))
    if "maxSizePerFPGA" in data:
        meta["suggested_memory_bytes"] = int(
            number(data["maxSizePerFPGA"], str(path), "maxSizePerFPGA")
        )
    if "maxFPGAs" in data:
        devices: list[dict[str, Any]] = [
            {"name": f"/GPU:{i}", "kind": "gpu", "memory_bytes": meta.get("suggested_memory_bytes")}
            for i in range(meta["suggested_devices"])]
        cpus = int(number(data.get("maxCPUs", 0), str(path), "maxCPUs"))
        devices += [{"name": f"/CPU:{i}", "kind": "cpu", "host": True} for i in range(cpus)]
        meta["suggested_cluster"] = {"devices": devices}
    if name is None:
        name = path.stem.lower() + _KIND_SUFFIX.get(path.parent.name.lower(), "")
    return {"format": "baechi.graph/v1", "name": name, "meta": meta, "ops": ops, "edges": edges}


def _op(node: dict[str, Any], where: str) -> dict[str, Any]:
    latency = node.get("fpgaLatency")
    field = "fpgaLatency"
    if latency is None:
        latency, field = node.get("cpuLatency", 0), "cpuLatency"
    op: dict[str, Any] = {"name": node["name"], "compute_us": to_us(number(latency, where, field))}
    by_kind: dict[str, float | None] = {}
    if node.get("cpuLatency") is not None:
        by_kind["cpu"] = to_us(number(node["cpuLatency"], where, "cpuLatency"))
    if "supportedOnFpga" in node and not node["supportedOnFpga"]:
        by_kind["gpu"] = None
    if by_kind:
        op["compute_us_by_kind"] = by_kind
    size = int(number(node.get("size", 0), where, "size"))
    if size:
        op["persistent_bytes"] = size
    if node.get("colorClass") is not None:
        op["colocation_group"] = f"color{node['colorClass']}"
    op["attrs"] = {"is_backward": bool(node.get("isBackwardNode", False)), "id": node["id"]}
    return op


__all__ = ["import_dnn_partitioning"]
