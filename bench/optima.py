"""Gap of every algorithm to proven optima: small generated graphs and the STG graphs.

Usage::

    python bench/optima.py [--shared ../shared] [--seeds 1] [--ops 10,20,30,40]
                           [--sequential-ops 10,20] [--memory-ops 10,20,30] [--seconds 10]
                           [--auto-seconds 2] [--quick]

Small graphs (``baechi.testing.small_cases``: layered, fork-join, skip connections; CCR 0.1 to
10; 2–4 devices; whole-µs times, 1 µs per byte, no latency): ``exact`` with the pipeline off
and ``--seconds`` proves the optimum in parallel mode (where its model is the simulator's);
every other algorithm's gap is measured against it on the cases it proved. The same for a
subset in sequential mode (``--sequential-ops``), where a proof needs the replayed plan to meet
CP-SAT's bound. And for graphs with memory (``--memory-ops``; ``small_cases(memory=True)``:
outputs and weights, 3–4 devices each with half the single-device peak), where ``exact``'s
memory model is a relaxation and a proof needs the replayed plan to fit and meet its bound;
the table counts, per algorithm, the proved cases where it found no plan. STG graphs
(``../shared/graphs/stg``) on 4 devices (no network): the gap to
``meta.optimal_makespan_us["4"]`` (the first number; a pair is a proven lower and upper bound).

The algorithms: m-ETF, m-EFT, m-SCT, m-TOPO, m-fill, m-cut with the pipeline (default options)
and without (``co_placement``/``fusion`` false), ``allow_single`` off so that each is measured
itself; the single-device plan; ``auto`` with default options and ``--auto-seconds``;
``exact``. Writes ``bench/fragments/optima.md``; its first line is the command that generated
it.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HEURISTICS = ("m-etf", "m-eft", "m-sct", "m-topo", "m-fill", "m-cut")
#: Column name → (algorithm, options without the time limit).
COLUMNS: dict[str, tuple[str, dict[str, Any]]] = {
    **{f"{a}": (a, {"allow_single": False}) for a in HEURISTICS},
    **{f"{a} (no pipeline)": (a, {"allow_single": False, "co_placement": False,
                                  "fusion": False}) for a in HEURISTICS},
    "single": ("single", {}),
    "auto": ("auto", {}),
    "exact": ("exact", {"allow_single": False, "co_placement": False, "fusion": False}),
}
#: The proportion of a relative gap below which two step times are equal (float noise).
SLACK = 1e-9


def run_case(name: str, doc: dict[str, Any], cluster: dict[str, Any], seconds: float,
             auto_seconds: float) -> dict[str, Any]:
    """Every column's step time and seconds on one request, and what ``exact`` proved."""
    from baechi import InfeasiblePlacement, place

    row: dict[str, Any] = {"name": name, "ops": len(doc["ops"]), "steps": {}, "seconds": {}}
    for column, (algorithm, options) in COLUMNS.items():
        limit = {"exact": seconds, "auto": auto_seconds}.get(algorithm, seconds)
        tick = time.perf_counter()
        try:
            plan = place(doc, cluster, algorithm, {**options, "time_limit_s": limit})
        except InfeasiblePlacement:
            row["steps"][column] = None
            continue
        row["seconds"][column] = time.perf_counter() - tick
        row["steps"][column] = plan.estimate.step_time_us
        if algorithm == "exact":
            stats = plan.stats.model_dump()
            row["proved"] = bool(stats.get("optimal"))
            row["bound_us"] = stats.get("bound_us")
            row["status"] = stats.get("solver_status")
    return row


def small_rows(ops: tuple[int, ...], seeds: int, mode: str, seconds: float,
               auto_seconds: float, memory: bool = False) -> list[dict[str, Any]]:
    from baechi.testing import small_cases

    rows = []
    for case in small_cases(seeds=seeds, ops=ops, mode=mode, memory=memory):
        row = run_case(case.name, case.graph, case.cluster, seconds, auto_seconds)
        row.update(ccr=case.ccr, devices=case.devices, shape=case.shape)
        if row.get("proved"):
            row["optimum_us"] = row["steps"]["exact"]
        print(f"{mode} {case.name}: exact {row['steps']['exact']} ({row.get('status')}, "
              f"proved {row.get('proved')}, {row['seconds'].get('exact', 0):.2f} s), "
              f"m-etf {row['steps']['m-etf']}, auto {row['steps']['auto']}", flush=True)
        rows.append(row)
    return rows


def stg_rows(shared: Path, seconds: float, auto_seconds: float,
             quick: bool) -> list[dict[str, Any]]:
    paths = sorted((shared / "graphs" / "stg").glob("*.json"))
    if quick:
        paths = paths[:3]
    rows = []
    for path in paths:
        doc = json.loads(path.read_text())
        known = doc["meta"]["optimal_makespan_us"]["4"]
        row = run_case(path.stem, doc, {"devices": {"count": 4}}, seconds, auto_seconds)
        # a pair is a proven lower and upper bound: the optimum is exact's plan when it
        # proved it (within the pair), else the gap is measured against the lower bound
        row["optimum_us"] = float(known[0])
        if len(known) > 1 and row.get("proved"):
            row["optimum_us"] = row["steps"]["exact"]
        row["known"] = known
        print(f"stg {path.stem}: optimum {known}, exact {row['steps']['exact']} "
              f"({row.get('status')}), m-etf {row['steps']['m-etf']}, auto "
              f"{row['steps']['auto']}", flush=True)
        rows.append(row)
    return rows


def gap(row: dict[str, Any], column: str) -> float | None:
    step = row["steps"].get(column)
    if step is None or "optimum_us" not in row:
        return None
    return step / row["optimum_us"] - 1


def mean_gap(rows: Iterable[dict[str, Any]], column: str) -> str:
    gaps = [g for r in rows if (g := gap(r, column)) is not None]
    return f"{statistics.fmean(gaps):.2%}" if gaps else "–"


def gap_table(rows: list[dict[str, Any]], key: str, label: str,
              known: str = "proved") -> list[str]:
    """Mean gap to the optimum per column, one line per value of ``key`` (cases whose
    optimum is known: proved by ``exact``, or given)."""
    columns = list(COLUMNS)
    out = [f"| {label} | cases | {known} | " + " | ".join(columns) + " |",
           "|---|---|---|" + "---|" * len(columns)]
    groups: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(r)
    for value, group in [*sorted(groups.items()), ("all", rows)]:
        proved = [r for r in group if "optimum_us" in r]
        out.append(f"| {value} | {len(group)} | {len(proved)} | "
                   + " | ".join(mean_gap(proved, c) for c in columns) + " |")
    return out


def misses_line(rows: list[dict[str, Any]]) -> str:
    """Per column, the cases with a proven optimum where it found no plan."""
    proved = [r for r in rows if "optimum_us" in r]
    return "| no plan | | | " + " | ".join(
        str(sum(r["steps"].get(c) is None for r in proved)) for c in COLUMNS) + " |"


def proof_line(rows: list[dict[str, Any]], seconds: float) -> str:
    proved = [r for r in rows if r.get("proved")]
    times = [r["seconds"]["exact"] for r in proved]
    median = f"{statistics.median(times):.2f}" if times else "–"
    return (f"`exact` proved {len(proved)} of {len(rows)} optimal "
            f"({len(proved) / max(1, len(rows)):.1%}) within {seconds:g} s each; median "
            f"{median} s per proof (2 CP-SAT workers).")


def markdown(command: str, small: list[dict[str, Any]], sequential: list[dict[str, Any]],
             memory: list[dict[str, Any]], stg: list[dict[str, Any]], seconds: float,
             auto_seconds: float) -> str:
    out = [f"<!-- generated by: {command} -->",
           "## Gap to proven optima (`bench/optima.py`)",
           "",
           f"Machine: {platform.machine()}, Python {platform.python_version()}. Mean of "
           "step / optimum − 1 over the cases whose optimum is proved; columns without "
           "\"(no pipeline)\" run the default pipeline; `allow_single` off; `auto` with default "
           f"options and `time_limit_s` {auto_seconds:g}; `exact` without the pipeline and "
           f"`time_limit_s` {seconds:g}.",
           "",
           "**Small graphs, parallel mode** (`baechi.testing.small_cases`: layered, fork-join, "
           "skip connections; 10–40 ops; 1 µs per byte, no latency). " + proof_line(small,
                                                                                    seconds),
           ""]
    out += gap_table(small, "ccr", "CCR")
    out += ["", "By device count:", "", *gap_table(small, "devices", "devices")]
    if sequential:
        out += ["", "**Small graphs, sequential mode** (one channel per device; proofs need "
                "the replay to meet CP-SAT's bound). " + proof_line(sequential, seconds), ""]
        out += gap_table(sequential, "ccr", "CCR")
    if memory:
        with_plan = sum(any(v is not None for v in r["steps"].values()) for r in memory)
        out += ["", "**Small graphs under memory limits** (`small_cases(memory=True)`: the "
                "same shapes, 10–30 ops; each op's output as large as the largest tensor it "
                "sends, weights drawn up to 3 × the mean tensor; 3 and 4 devices, each with "
                "half the single-device peak; parallel mode). `exact`'s memory over time is "
                "a relaxation: a proof needs the plan to fit and its replay to meet the "
                f"bound. {with_plan} of {len(memory)} cases have a plan (some algorithm found "
                "one). "
                + proof_line(memory, seconds) + " `no plan`: the cases with a proven optimum "
                "where the column found no plan within memory (left out of its mean).", ""]
        out += [*gap_table(memory, "ccr", "CCR"), misses_line(memory)]
    if stg:
        below = [r["name"] for r in stg for c in COLUMNS
                 if r["steps"].get(c) is not None
                 and r["steps"][c] < r["optimum_us"] * (1 - SLACK)]
        for r in stg:
            r["set"] = "STG"
        out += ["", "**STG graphs, 4 devices** (no communication; optimum from "
                "`meta.optimal_makespan_us`; where it is a lower/upper pair, `exact`'s plan "
                "when it proved it, else the lower bound). " + proof_line(stg, seconds)
                + f" Plans below the known optimum: {len(below)}.", ""]
        out += gap_table(stg, "set", "set", "optimum known")
        out += ["", "| graph | optimum | exact | proved | bound | m-etf (no pipeline) | auto |",
                "|---|---|---|---|---|---|---|"]
        for r in stg:
            out.append(f"| {r['name']} | {'/'.join(f'{k:g}' for k in r['known'])} | "
                       f"{r['steps']['exact']:g} | {r.get('proved')} | "
                       f"{r.get('bound_us') or 0:g} | {r['steps']['m-etf (no pipeline)']:g} | "
                       f"{r['steps']['auto']:g} |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--ops", default="10,20,30,40")
    parser.add_argument("--sequential-ops", default="10,20")
    parser.add_argument("--memory-ops", default="10,20,30")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--auto-seconds", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="10-op graphs, 3 STG graphs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "fragments" / "optima.md")
    parser.add_argument("--json", type=Path, help="also write every row here")
    args = parser.parse_args()
    command = "python " + " ".join(["bench/optima.py", *sys.argv[1:]])
    ops = (10,) if args.quick else tuple(int(x) for x in args.ops.split(","))
    seq_ops = (10,) if args.quick else tuple(int(x) for x in args.sequential_ops.split(",") if x)
    small = small_rows(ops, args.seeds, "parallel", args.seconds, args.auto_seconds)
    sequential = small_rows(seq_ops, args.seeds, "sequential", args.seconds,
                            args.auto_seconds) if seq_ops else []
    mem_ops = (10,) if args.quick else tuple(int(x) for x in args.memory_ops.split(",") if x)
    memory = small_rows(mem_ops, args.seeds, "parallel", args.seconds, args.auto_seconds,
                        memory=True) if mem_ops else []
    stg = stg_rows(args.shared, args.seconds, args.auto_seconds, args.quick)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(command, small, sequential, memory, stg, args.seconds,
                                 args.auto_seconds))
    if args.json:
        args.json.write_text(json.dumps({"small": small, "sequential": sequential,
                                         "memory": memory, "stg": stg}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
