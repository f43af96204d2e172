"""Digests of the named algorithms' plans on the shared graphs: the check that a refactor
changed no plan.

Usage: ``python bench/plan_digests.py [--shared ../shared] > digests.txt`` at two commits,
then ``diff`` the two files. Each line names a graph, an algorithm, the pipeline switch and the
memory level, and gives the SHA-256 of the plan's placement, per-device order, transfer order
and estimate (placement seconds and other timings left out). Only algorithms whose plan does
not depend on a wall-clock budget are listed (m-TOPO, m-ETF, m-SCT, m-fill, single).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import baechi  # noqa: E402
from baechi.errors import InfeasiblePlacement  # noqa: E402

ALGORITHMS = ("m-topo", "m-etf", "m-sct", "m-fill", "single")
MAX_OPS = 3000


def digest(plan: Any) -> str:
    """SHA-256 of what a plan decides and predicts, nothing that depends on the clock."""
    doc = plan.model_dump(mode="json")
    kept = {key: doc.get(key) for key in ("placement", "order", "transfer_order", "estimate")}
    return hashlib.sha256(orjson.dumps(kept, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def graphs(shared: Path) -> list[Path]:
    """The shared graphs up to ``MAX_OPS`` ops, and the bundled GNMT."""
    found = sorted((shared / "graphs").rglob("*.json")) if shared.is_dir() else []
    found.append(ROOT / "examples" / "graphs" / "gnmt_baechi.json")
    small = []
    for path in found:
        doc = orjson.loads(path.read_bytes())
        if isinstance(doc, dict) and doc.get("format") == "baechi.graph/v1" \
                and len(doc.get("ops", ())) <= MAX_OPS:
            small.append(path)
    return small


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    parser.add_argument("--limit", type=int, default=40, help="at most this many graphs")
    args = parser.parse_args()
    for path in graphs(args.shared)[: args.limit]:
        graph = baechi.load_graph(path)
        need = max(baechi.place(
            graph, {"devices": {"count": 1, "memory_bytes": 2**50},
                    "network": {"latency_us": 134, "bandwidth_gbps": 5.7}}, "single"
        ).estimate.peak_memory_bytes.values())
        for fraction in (None, 0.5):
            memory = 2**50 if fraction is None else max(1, int(need * fraction))
            cluster = {"devices": {"count": 4, "memory_bytes": memory},
                       "network": {"latency_us": 134, "bandwidth_gbps": 5.7}}
            for algorithm in ALGORITHMS:
                for pipeline in (True, False):
                    options = {"co_placement": pipeline, "fusion": pipeline,
                               "forward_only": pipeline}
                    try:
                        result = digest(baechi.place(graph, cluster, algorithm, options))
                    except InfeasiblePlacement:
                        result = "infeasible"
                    label = "unlimited" if fraction is None else f"{fraction:.0%}"
                    print(f"{path.stem} {algorithm} pipeline={pipeline} {label} {result}",
                          flush=True)


if __name__ == "__main__":
    main()
