"""Large graphs for speed measurements: ``k`` copies of a graph chained one after another."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def replicate(doc: dict[str, Any], copies: int) -> dict[str, Any]:
    """``copies`` renamed copies of ``doc``; each copy's sinks feed the next copy's sources."""
    ops: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    has_in = {e["dst"] for e in doc["edges"]}
    has_out = {e["src"] for e in doc["edges"]}
    sources = [o["name"] for o in doc["ops"] if o["name"] not in has_in]
    sinks = [o["name"] for o in doc["ops"] if o["name"] not in has_out]
    for c in range(copies):
        for o in doc["ops"]:
            op = {**o, "name": f"c{c}/{o['name']}"}
            for key in ("colocation_group", "forward_op"):
                if op.get(key):
                    op[key] = f"c{c}/{op[key]}"
            ops.append(op)
        for e in doc["edges"]:
            edges.append({**e, "src": f"c{c}/{e['src']}", "dst": f"c{c}/{e['dst']}",
                          **({"tensor": f"c{c}/{e['tensor']}"} if e.get("tensor") else {})})
        if c:
            edges.append({"src": f"c{c - 1}/{sinks[0]}", "dst": f"c{c}/{sources[0]}",
                          "bytes": 4096})
    return {**doc, "name": f"{doc.get('name', 'graph')}_x{copies}", "ops": ops, "edges": edges}


if __name__ == "__main__":
    source, copies, target = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    Path(target).write_text(json.dumps(replicate(json.loads(Path(source).read_text()), copies)))
