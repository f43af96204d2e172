"""Throughput objective and heterogeneous clusters (issue 10): writes
``bench/fragments/throughput.md``.

Usage: ``python bench/throughput.py [--shared ../shared] [--time-limit 10] [--skip-hetero]``.

Table 1, for the 16 throughput inputs of Tarnawski et al. (imported from
``dnn-partitioning/original`` with ``baechi import dnn-partitioning``, placed on the import's
``meta.suggested_cluster``, judged by :func:`baechi.throughput.throughput`): time per sample
(ms, their units) of everything on one accelerator, of the human experts' split where given, of
``throughput-contiguous`` and ``throughput-cpsat`` (each with ``time_limit_s``), solve seconds,
whether the solver proved optimality, next to the anchors of the issue (their DP's optimum).

Table 2, step time: m-ETF, m-SCT and m-TOPO on a heterogeneous cluster (2 GPUs of speed 2 on
NVLink, 2 of speed 1 on NVLink, the pairs joined by PCIe) placed knowing the cluster, against
the same algorithm placed as if the cluster were uniform (speed 1, PCIe everywhere) and replayed
on the real one (``allow_single`` off in both: the algorithms' own plans).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import baechi  # noqa: E402
from baechi.importers import import_graph  # noqa: E402
from baechi.throughput import throughput  # noqa: E402

#: (file under original/throughput-inputs, expert file or None, k, DP optimum ms or None)
INPUTS = [
    ("LayerGraphs/bert24_inference.json", "bert24_inference_expert.json", 6, 17.79),
    ("LayerGraphs/bert24_training.json", "bert24_training_expert.json", 6, 41.75),
    ("LayerGraphs/gnmt_inference.json", "gnmt_inference_expert.json", 6, 32.91),
    ("LayerGraphs/gnmt_training.json", "gnmt_training_expert.json", 6, 107.00),
    ("LayerGraphs/inceptionv3_inference.json", "inceptionv3_inference_expert.json", 6, None),
    ("LayerGraphs/inceptionv3_training.json", None, 6, None),
    ("LayerGraphs/resnet50_inference.json", "resnet50_inference_expert.json", 6, 33.77),
    ("LayerGraphs/resnet50_training.json", None, 6, 78.63),
    ("OperatorGraphs/bert_l-3_inference.json", None, 3, 27.92),
    ("OperatorGraphs/bert_l-3_training.json", None, 3, 65.30),
    ("OperatorGraphs/bert_l-6_inference.json", None, 3, 29.58),
    ("OperatorGraphs/bert_l-6_training.json", None, 3, 72.87),
    ("OperatorGraphs/bert_l-12_inference.json", None, 6, 147.48),
    ("OperatorGraphs/bert_L-12_training.json", None, 6, 438.00),
    ("OperatorGraphs/resnet50_inference.json", None, 6, 124.35),
    ("OperatorGraphs/resnet50_training.json", None, 6, 255.19),
]

HETERO = {
    "devices": [{"name": "/GPU:0", "speed": 2.0}, {"name": "/GPU:1", "speed": 2.0},
                {"name": "/GPU:2"}, {"name": "/GPU:3"}],
    "network": {"latency_us": 20, "bandwidth_gbps": 12, "links": [
        {"devices": ["/GPU:0", "/GPU:1"], "latency_us": 5, "bandwidth_gbps": 150},
        {"devices": ["/GPU:2", "/GPU:3"], "latency_us": 5, "bandwidth_gbps": 150}]},
}
UNIFORM = {"devices": [{"name": f"/GPU:{i}"} for i in range(4)],
           "network": {"latency_us": 20, "bandwidth_gbps": 12}}
#: The algorithms' own plans (not the single-device fallback), to compare the algorithms.
NO_SINGLE = {"allow_single": False}
STEP_GRAPHS = ("baechi/gnmt_baechi.json", "pipedream/pipedream_gnmt.json",
               "pipedream/pipedream_vgg16.json", "pipedream/pipedream_resnet101.json",
               "pipedream/pipedream_nasnetalarge.json")


def expert_devices(graph: baechi.Graph, expert: dict[str, Any], n_gpus: int) -> list[int]:
    """The experts' split (their node ids; 0 = CPU, i = accelerator i) as device indices;
    backward nodes follow their colour class, as their tool does."""
    group_of = {i: 0 for machine in expert["cpus"] for i in machine["nodes"]}
    for g, machine in enumerate(expert["fpgas"], start=1):
        group_of.update({i: g for i in machine["nodes"]})
    by_colour = {graph.colocation_group[op]: group_of[graph.attrs[op]["id"]]
                 for op in range(len(graph)) if graph.attrs[op]["id"] in group_of}
    out = []
    for op in range(len(graph)):
        group = group_of.get(graph.attrs[op]["id"], by_colour.get(graph.colocation_group[op]))
        out.append(n_gpus if group == 0 else group - 1)
    return out


def throughput_table(shared: Path, time_limit: float) -> list[str]:
    original = shared / "graphs" / "dnn-partitioning" / "original"
    rows = ["| input | k | one device | human expert | contiguous (s, proved) | "
            "non-contiguous (s, proved) | their DP optimum |",
            "|---|---|---|---|---|---|---|"]
    for path, expert_file, k, anchor in INPUTS:
        document = import_graph("dnn-partitioning", original / "throughput-inputs" / path)
        graph = baechi.load_graph(document)
        cluster_json = document["meta"]["suggested_cluster"]
        cluster = baechi.Cluster.parse(cluster_json)
        one = throughput(graph, cluster, [0] * len(graph)).time_per_sample_us / 1000
        expert = "–"
        if expert_file:
            split = json.loads((original / "human-experts" / expert_file).read_text())
            verdict = throughput(graph, cluster, expert_devices(graph, split, k))
            expert = f"{verdict.time_per_sample_us / 1000:.2f}"
        cells = []
        for algorithm in ("throughput-contiguous", "throughput-cpsat"):
            started = time.perf_counter()
            try:
                plan = baechi.place(document, cluster_json, algorithm,
                                    {"time_limit_s": time_limit}, objective="throughput")
            except baechi.InfeasiblePlacement as exc:
                cells.append(f"– ({exc.message})")
                continue
            seconds = time.perf_counter() - started
            tps = plan.estimate.time_per_sample_us / 1000
            cells.append(f"{tps:.2f} ({seconds:.1f} s, {'yes' if plan.stats.optimal else 'no'})")
        kind = "Layer" if path.startswith("Layer") else "Operator"
        name = Path(path).stem
        dp = f"{anchor:.2f}" if anchor is not None else f"– (≤ 1.1 × work/k = {1.1 * one / k:.2f})"
        rows.append(f"| {kind} {name} | {k} | {one:.2f} | {expert} | {cells[0]} | {cells[1]} | "
                    f"{dp} |")
        print(rows[-1], flush=True)
    return rows


def hetero_table(shared: Path) -> list[str]:
    rows = ["| graph | algorithm | knowing the cluster (ms) | as if uniform, replayed (ms) | "
            "gain |", "|---|---|---|---|---|"]
    for path in STEP_GRAPHS:
        document = json.loads((shared / "graphs" / path).read_text())
        for algorithm in ("m-topo", "m-etf", "m-eft", "m-sct"):
            aware = baechi.place(document, HETERO, algorithm, NO_SINGLE).estimate.step_time_us
            blind_plan = baechi.place(document, UNIFORM, algorithm, NO_SINGLE)
            blind = baechi.simulate(document, blind_plan, HETERO).step_time_us
            rows.append(f"| {Path(path).stem} | {algorithm} | {aware / 1000:.2f} | "
                        f"{blind / 1000:.2f} | {(blind - aware) / blind:+.1%} |")
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"))
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--skip-hetero", action="store_true")
    parser.add_argument("--output", default=str(ROOT / "bench" / "fragments" / "throughput.md"))
    args = parser.parse_args()
    shared = Path(args.shared)
    command = " ".join(["python", "bench/throughput.py", *sys.argv[1:]])
    lines = [f"<!-- generated by: {command} -->",
             "### Throughput objective (time per sample, ms, their model and cluster)", ""]
    lines += throughput_table(shared, args.time_limit)
    if not args.skip_hetero:
        lines += ["", "### Step time on a heterogeneous cluster (2 × speed 2 + 2 × speed 1, "
                  "NVLink pairs over PCIe)", ""]
        lines += hetero_table(shared)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
