"""Placement seconds and step times of m-topo/m-etf/m-sct on four shared graphs (issue notes).

Usage: ``python bench/gnmt_table.py [--shared ../shared] [--runs 5]``; prints a Markdown table
(4 devices, 134 µs + 5.7 GB/s, sequential, ``allow_single`` off, median placement seconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import baechi  # noqa: E402

GRAPHS = ("baechi/gnmt_baechi.json",
          "dnn-partitioning/throughput-inputs/bert_l-12_training_operator.json",
          "dnn-partitioning/throughput-inputs/resnet50_training_operator.json",
          "pipedream/pipedream_nasnetalarge.json")
CLUSTER = {"devices": {"count": 4}, "network": {"latency_us": 134, "bandwidth_gbps": 5.7}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"))
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print("| graph | ops | algorithm | pipeline | nodes | placement s | step ms | "
          "1 device ms | lower bound ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rel in GRAPHS:
        doc = json.loads((Path(args.shared) / "graphs" / rel).read_text())
        for algorithm in ("m-topo", "m-etf", "m-sct"):
            for pipeline in (False, True):
                options = {"allow_single": False, "co_placement": pipeline, "fusion": pipeline}
                seconds = []
                for _ in range(args.runs):
                    plan = baechi.place(doc, CLUSTER, algorithm, options)
                    seconds.append(plan.stats.placement_seconds)
                e = plan.estimate
                assert e is not None
                print(f"| {doc['name']} | {len(doc['ops'])} | {algorithm} | "
                      f"{'on' if pipeline else 'off'} | {plan.stats.nodes_placed} | "
                      f"{statistics.median(seconds):.3f} | {e.step_time_us / 1000:.1f} | "
                      f"{e.single_device_us / 1000:.1f} | {e.lower_bound_us / 1000:.1f} |")


if __name__ == "__main__":
    main()
