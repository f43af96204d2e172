"""Local search (``baechi.search.improve``) after m-ETF: step time after 2 s and 10 s.

Usage::

    python bench/search.py [--shared ../shared] [--quick] [--seconds 10] [--early 2]

For the shared graphs (baechi/gnmt_baechi, dnn-partitioning training graphs, pipedream) and a
10k-op graph (gnmt_baechi replicated 4 times, ``bench/synthetic.py``), on 4 devices, PCIe
(134 µs, 5.7 GB/s) and NVLink-class (10 µs, 150 GB/s) in sequential mode, memory unlimited and
at 75% / 50% of the single-device peak: m-ETF's plan (default pipeline, ``allow_single`` off),
then ``improve`` from it for ``--seconds``; the best step time reached by ``--early`` seconds
is read from the same run (``on_better`` reports each better plan). Writes
``bench/fragments/search.md``; its first line is the command that generated it.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

NETWORKS = {
    "pcie": {"latency_us": 134, "bandwidth_gbps": 5.7},
    "nvlink": {"latency_us": 10, "bandwidth_gbps": 150},
}
FRACTIONS = (None, 0.75, 0.5)
DEVICES = 4


def graphs(shared: Path, quick: bool) -> list[tuple[str, dict[str, Any]]]:
    from synthetic import replicate

    root = shared / "graphs"
    gnmt = json.loads((root / "baechi" / "gnmt_baechi.json").read_text())
    paths = sorted((root / "dnn-partitioning" / "throughput-inputs").glob("*training*.json"))
    paths += sorted((root / "pipedream").glob("*.json"))
    if quick:
        paths = [p for p in paths if p.stem in (
            "resnet50_training_operator", "pipedream_nasnetalarge", "pipedream_resnet50")]
    docs = [("gnmt_baechi", gnmt)]
    docs += [(p.stem, json.loads(p.read_text())) for p in paths]
    docs.append(("gnmt_baechi_x4", replicate(gnmt, 4)))
    return docs


def run(name: str, doc: dict[str, Any], seconds: float, early: float) -> list[dict[str, Any]]:
    from baechi import Cluster, InfeasiblePlacement, load_graph, place
    from baechi.costmodel import CostModel
    from baechi.grouping import colocation_units
    from baechi.search import improve
    from baechi.simulate import index_plan, single_device_run

    graph = load_graph(doc)
    peak = single_device_run(graph, Cluster.uniform(1))[1]
    rows = []
    for net_name, network in NETWORKS.items():
        for fraction in FRACTIONS:
            devices: dict[str, Any] = {"count": DEVICES}
            if fraction is not None:
                devices["memory_bytes"] = int(peak * fraction)
            cluster = Cluster.parse({"devices": devices, "network": network})
            row: dict[str, Any] = {
                "graph": name, "ops": len(graph), "network": net_name,
                "memory": "unlimited" if fraction is None else f"{int(fraction * 100)}%"}
            tick = time.perf_counter()
            try:
                plan = place(graph, cluster, "m-etf", {"allow_single": False})
            except InfeasiblePlacement:
                rows.append({**row, "status": "no start plan"})
                continue
            row["etf_seconds"] = time.perf_counter() - tick
            device_of, orders = index_plan(graph, plan, cluster)
            units = colocation_units(graph, cluster)
            began = time.perf_counter()
            found: list[tuple[float, float]] = []

            def better(step: float, found: list[tuple[float, float]] = found,
                       began: float = began) -> None:
                found.append((time.perf_counter() - began, step))

            _, _, stats = improve(graph, cluster, device_of, orders, units=units,
                                  deadline=began + seconds, cost=CostModel(graph, cluster),
                                  on_better=better)
            start = stats.start_step_us
            at_early = min([s for t, s in found if t <= early], default=start)
            rows.append({
                **row, "status": "ok", "etf_us": start, "early_us": at_early,
                "final_us": stats.step_us, "single_us": plan.estimate.single_device_us,
                "lower_bound_us": plan.estimate.lower_bound_us,
                "moves": stats.moves_evaluated + stats.moves_screened,
                "replays": stats.moves_evaluated, "accepted": stats.moves_accepted,
                "moves_per_s": stats.moves_per_second,
                "replays_per_s": stats.replays_per_second, "seconds": stats.seconds,
                "note": stats.note,
            })
    return rows


def geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def markdown(rows: list[dict[str, Any]], command: str, seconds: float, early: float) -> str:
    ok = [r for r in rows if r["status"] == "ok"]
    out = [
        f"<!-- generated by: {command} -->",
        "## Local search after m-ETF",
        "",
        f"`baechi.search.improve` from m-ETF's plan (default pipeline, `allow_single` off) for "
        f"{seconds:g} s; the {early:g} s column is the best plan that same run had found by "
        f"then. {DEVICES} devices, sequential mode; memory as a fraction of the single-device "
        f"peak. Step times are the simulator's. {platform.machine()}, Python "
        f"{platform.python_version()}, one process.",
        "",
        "Moves/s counts the candidates considered (replayed, or screened out by their "
        "estimate); replays/s those replayed by the exact evaluator (most from a checkpoint).",
        "",
        "| network | memory | runs | improved | geomean gain @ "
        f"{early:g} s | @ {seconds:g} s | best gain | moves/s (median) | replays/s (median) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["network"], r["memory"]) for r in ok},
                  key=lambda k: (k[0], ["unlimited", "75%", "50%"].index(k[1])))
    for key in keys:
        group = [r for r in ok if (r["network"], r["memory"]) == key]
        gain_early = 1 - geomean([r["early_us"] / r["etf_us"] for r in group])
        gain = 1 - geomean([r["final_us"] / r["etf_us"] for r in group])
        best = max(1 - r["final_us"] / r["etf_us"] for r in group)
        out.append(
            f"| {key[0]} | {key[1]} | {len(group)} | "
            f"{sum(r['final_us'] < r['etf_us'] for r in group)} | {gain_early:.2%} | "
            f"{gain:.2%} | {best:.2%} | "
            f"{statistics.median(r['moves_per_s'] for r in group):.0f} | "
            f"{statistics.median(r['replays_per_s'] for r in group):.0f} |")
    out += ["", "| graph | ops | network | memory | m-ETF ms | "
            f"@ {early:g} s ms | @ {seconds:g} s ms | gain | 1 device ms | lower bound ms | "
            "moves | moves/s | replays/s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            out.append(f"| {r['graph']} | {r['ops']} | {r['network']} | {r['memory']} | "
                       f"{r['status']} | | | | | | | | |")
            continue
        out.append(
            f"| {r['graph']} | {r['ops']} | {r['network']} | {r['memory']} | "
            f"{r['etf_us'] / 1000:.3f} | {r['early_us'] / 1000:.3f} | "
            f"{r['final_us'] / 1000:.3f} | {1 - r['final_us'] / r['etf_us']:.2%} | "
            f"{r['single_us'] / 1000:.3f} | {r['lower_bound_us'] / 1000:.3f} | "
            f"{r['moves']} | {r['moves_per_s']:.0f} | {r['replays_per_s']:.0f} |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    parser.add_argument("--quick", action="store_true", help="a few graphs only")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--early", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "fragments" / "search.md")
    args = parser.parse_args()
    command = "python " + " ".join(["bench/search.py", *sys.argv[1:]])
    rows: list[dict[str, Any]] = []
    for name, doc in graphs(args.shared, args.quick):
        found = run(name, doc, args.seconds, args.early)
        for r in found:
            if r["status"] == "ok":
                print(f"{name} {r['network']} {r['memory']}: {r['etf_us'] / 1000:.3f} -> "
                      f"{r['early_us'] / 1000:.3f} -> {r['final_us'] / 1000:.3f} ms, "
                      f"{r['moves_per_s']:.0f} moves/s, {r['replays_per_s']:.0f} replays/s",
                      flush=True)
        rows += found
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(rows, command, args.seconds, args.early))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
