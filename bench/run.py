"""Benchmarks: placement speed and plan quality on ../shared/graphs, written to BENCHMARKS.md.

Usage::

    python bench/run.py [--shared ../shared] [--quick] [--jobs 2]

For every graph (all of baechi/, dnn-partitioning/, pipedream/ and a sample of stg/), on 4
devices, two networks (PCIe as Baechi fitted it; NVLink-class), memory unlimited and at
75/50/30% of the single-device peak (and the source's suggested memory where given), each
algorithm with and without the reduction pipeline, ``exact`` with a short time limit, and
``auto`` (the default) with its own per-request time limit. Plans of the named algorithms are
their own (``allow_single`` off), so a speedup below 1 shows where one device would have been
better; ``auto`` runs as users get it. Writes BENCHMARKS.md (with the Markdown fragments other
benchmarks leave in bench/fragments/, each a section), bench/results.csv and bench/memory.png.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from baechi.plan import Chosen

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NETWORKS = {
    "pcie": {"latency_us": 134, "bandwidth_gbps": 5.7},
    "nvlink": {"latency_us": 10, "bandwidth_gbps": 150},
}
ALGORITHMS = ("m-topo", "m-etf", "m-eft", "m-sct", "m-fill", "m-cut")
#: ``auto``'s per-request time limit in the benchmark (the default is 60 s; on these graphs it
#: usually stops much earlier, when local search stagnates).
AUTO_TIME_LIMIT_S = 2.0
#: ``exact``'s time limit in the benchmark (it returns its best plan, proven or not).
EXACT_TIME_LIMIT_S = 1.0
FRACTIONS = (None, 0.75, 0.5, 0.3)
DEVICES = 4


def graphs_or_exit(shared: str, quick: bool) -> list[Path]:
    """:func:`graphs`; exits with status 2, saying why, when there are none."""
    paths = graphs(Path(shared), quick)
    if not paths:
        print(f"no graphs under {shared}/graphs", file=sys.stderr)
        raise SystemExit(2)
    return paths


def graphs(shared: Path, quick: bool) -> list[Path]:
    root = shared / "graphs"
    paths = sorted((root / "baechi").glob("*.json"))
    paths += sorted(p for p in (root / "dnn-partitioning").rglob("*.json")
                    if "original" not in p.parts)  # original/: the unconverted source files
    paths += sorted((root / "pipedream").glob("*.json"))
    paths += sorted((root / "stg").glob("*.json"))[:: 5]
    if quick:
        paths = [p for p in paths if "training" in p.name or "baechi" in str(p)][:6]
    return paths


def runs(quick: bool) -> list[tuple[str, bool]]:
    """(algorithm, pipeline) pairs run on every setting: the named ones both ways, ``exact``
    when it is registered, and ``auto`` (its own candidates cover both ways)."""
    from baechi.algorithms import ALGORITHMS as registered

    names = [*ALGORITHMS, *(["exact"] if "exact" in registered else [])]
    pairs = [(a, p) for a in names for p in (True, False) if p or not quick]
    return [*pairs, ("auto", True)]


def single_peak(doc: dict[str, Any]) -> int:
    from baechi import Cluster, load_graph
    from baechi.simulate import single_device_run

    return single_device_run(load_graph(doc), Cluster.uniform(1))[1]


class Setting(NamedTuple):
    """One cluster a graph is placed on (:func:`settings`)."""

    network: str
    memory: str
    devices: int
    memory_bytes: int | None
    cluster: dict[str, Any]


def settings(doc: dict[str, Any], peak: int) -> Iterator[Setting]:
    """Every setting a graph is placed on: each network, memory unlimited and at each of
    :data:`FRACTIONS` of the single-device ``peak`` on :data:`DEVICES` devices, and the
    source's suggested memory on its suggested device count. A graph that holds no memory
    (``peak`` 0: the STG task graphs give only times) has no memory-limited settings: a
    fraction of nothing limits nothing, and its rows would repeat the unlimited one."""
    memories: list[tuple[str, int | None]] = [
        ("unlimited" if f is None else f"{int(f * 100)}%", None if f is None else int(peak * f))
        for f in FRACTIONS if f is None or peak > 0
    ]
    meta = doc.get("meta", {})
    if meta.get("suggested_memory_bytes"):
        memories.append(("suggested", int(meta["suggested_memory_bytes"])))
    for net_name, network in NETWORKS.items():
        for mem_name, memory in memories:
            count = meta.get("suggested_devices", DEVICES) if mem_name == "suggested" else DEVICES
            devices: dict[str, Any] = {"count": count}
            if memory is not None:
                devices["memory_bytes"] = memory
            yield Setting(net_name, mem_name, count, memory,
                          {"devices": devices, "network": network})


def fraction_settings(peak: int, fractions: Iterable[float]) -> Iterator[Setting]:
    """Both networks at each of ``fractions`` of the single-device ``peak`` on
    :data:`DEVICES` devices, labelled ``"60%"`` (none for a graph that holds no memory):
    the settings between :func:`settings`' levels that ``bench/memory_sweep.py`` and
    ``bench/compare.py --fractions`` place."""
    if peak == 0:
        return
    for network_name, network in NETWORKS.items():
        for fraction in fractions:
            memory = int(peak * fraction)
            yield Setting(network_name, f"{fraction:.0%}", DEVICES, memory,
                          {"devices": {"count": DEVICES, "memory_bytes": memory},
                           "network": network})


def run_graph(path: str, quick: bool) -> list[dict[str, Any]]:
    from baechi import InfeasiblePlacement, place

    doc = json.loads(Path(path).read_text())
    peak = single_peak(doc)
    rows = []
    for net_name, mem_name, count, memory, cluster in settings(doc, peak):
        for algorithm, pipeline in runs(quick):
            options: dict[str, Any] = {"allow_single": False,
                                       "co_placement": pipeline, "fusion": pipeline}
            if algorithm == "exact":
                options["time_limit_s"] = EXACT_TIME_LIMIT_S
            if algorithm == "auto":
                options = {"time_limit_s": AUTO_TIME_LIMIT_S}
            row = {"graph": Path(path).stem, "group": Path(path).parent.name,
                   "ops": len(doc["ops"]), "network": net_name, "memory": mem_name,
                   "devices": count,
                   "memory_bytes": memory, "algorithm": algorithm,
                   "pipeline": pipeline, "single_peak": peak}
            tick = time.perf_counter()
            try:
                plan = place(doc, cluster, algorithm, options)
            except InfeasiblePlacement as exc:
                bound = "no plan" not in exc.message and "fits on no" not in exc.message
                row.update(status="infeasible", seconds=time.perf_counter() - tick,
                           reason=exc.message[:160],
                           kind="lower bound" if bound else "no plan found")
                rows.append(row)
                continue
            e = plan.estimate
            assert e is not None
            used = max(e.peak_memory_bytes.values())
            row.update(
                status="ok", seconds=plan.stats.placement_seconds,
                nodes=plan.stats.nodes_placed, step_us=e.step_time_us,
                lower_bound_us=e.lower_bound_us, single_us=e.single_device_us,
                ratio_lb=e.step_time_us / e.lower_bound_us if e.lower_bound_us else 1,
                speedup=e.single_device_us / e.step_time_us if e.step_time_us else 1,
                peak_over_limit=(used / memory) if memory else None,
                fallback=plan.stats.fallback or "",
                bound_us=plan.stats.bound_us,
            )
            if plan.stats.chosen is not None:
                row["chosen"] = chosen_label(plan.stats.chosen)
            rows.append(row)
    return rows


def geomean(values: list[float]) -> float:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def markdown(rows: list[dict[str, Any]], command: str, elapsed: float) -> str:
    out = [
        "# Benchmarks",
        "",
        f"Generated by `{command}` in {elapsed:.0f} s on {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}. "
        f"{DEVICES} devices; networks: PCIe = Baechi's fit (134 µs, 5.7 GB/s), "
        "NVLink-class = 10 µs, 150 GB/s; both in sequential mode (one channel per device). "
        "Memory limits are fractions of the graph's single-device peak under the cost model "
        "(format.md §4; the STG task graphs hold no memory and are placed without limit only); "
        "`suggested` is the source's per-device memory on the source's device "
        "count (`meta.suggested_devices`). Plans are the algorithms' own (`allow_single` "
        "off): a speedup below 1 is where one device would have been faster — the service "
        "then returns the single-device plan by default. Step times and peaks are the simulator's. "
        "Time limits are wall-clock seconds: on a slower machine `auto` and `exact` do less "
        "within them (within the 2 s limits here most), so compare tables from two machines "
        "by the row `gnmt_baechi at 768 MiB, m-etf` of the speed section below.",
        "",
        "## Summary per setting",
        "",
        "Feasible = plans within memory / runs (of them, how many came from a fallback: the "
        "unreduced graph or m-fill); ratios are geometric means over the feasible runs; "
        "seconds are medians. Infeasible runs are rejected by a memory lower bound (a unit or "
        "op that fits no device, persistent bytes over the cluster's memory, or no split of "
        "the units that fits) or found no plan; the per-run table says which.",
        "",
        "| network | memory | algorithm | pipeline | feasible (fallback) | step / lower bound | "
        "speedup vs 1 device | placement s (median) | max s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["network"], r["memory"], r["algorithm"], r["pipeline"]) for r in rows},
                  key=lambda k: (k[0], MEMORY_LEVELS.index(k[1]),
                                 k[2], not k[3]))
    for key in keys:
        group = [r for r in rows
                 if (r["network"], r["memory"], r["algorithm"], r["pipeline"]) == key]
        ok = [r for r in group if r["status"] == "ok"]
        secs = [r["seconds"] for r in group]
        out.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {_pipe(group[0])} | "
            f"{len(ok)}/{len(group)} ({sum(1 for r in ok if r['fallback'])}) | "
            f"{geomean([r['ratio_lb'] for r in ok]):.3f} | "
            f"{geomean([r['speedup'] for r in ok]):.3f} | {statistics.median(secs):.3f} | "
            f"{max(secs):.2f} |"
        )
    out += improvement(rows)
    if BASELINE.exists():
        baseline = read_rows(BASELINE)
        out += against_baseline(rows, baseline)
        out += memory_ceiling(rows, baseline)
        out += against_each_named(rows, baseline)
    out += ["", "## Every run", "",
            "| graph | ops | devices | network | memory | algorithm | pipeline | nodes | seconds | "
            "step ms | / lower bound | speedup | peak / limit | status |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] == "ok":
            peak = f"{r['peak_over_limit']:.2f}" if r["peak_over_limit"] is not None else "–"
            out.append(
                f"| {r['graph']} | {r['ops']} | {r['devices']} | {r['network']} | {r['memory']} | "
                f"{r['algorithm']} | {_pipe(r)} | {r['nodes']} | "
                f"{r['seconds']:.3f} | {r['step_us'] / 1000:.3f} | {r['ratio_lb']:.3f} | "
                f"{r['speedup']:.3f} | {peak} | {_status(r)} |"
            )
        else:
            out.append(
                f"| {r['graph']} | {r['ops']} | {r['devices']} | {r['network']} | {r['memory']} | "
                f"{r['algorithm']} | {_pipe(r)} | – | "
                f"{r['seconds']:.3f} | – | – | – | – | infeasible: {r['kind']} |"
            )
    return "\n".join(out) + "\n"


MEMORY_LEVELS = ["unlimited", "75%", "50%", "30%", "suggested"]


def _pipe(row: dict[str, Any]) -> str:
    """The pipeline column: on/off, or ``both`` for auto (its candidates run both ways)."""
    return "both" if row["algorithm"] == "auto" else ("on" if row["pipeline"] else "off")


def _status(row: dict[str, Any]) -> str:
    """``ok``, ``ok (fallback)``, or for auto the plan it chose."""
    if row.get("chosen"):
        return f"ok ({row['chosen']})"
    return "ok (fallback)" if row["fallback"] else "ok"


def improvement(rows: list[dict[str, Any]]) -> list[str]:
    """``auto`` against m-ETF (the former default: pipeline on) and against the best named
    algorithm of each setting (graph, network, memory), both ways and ``exact`` included."""
    out = ["", "## auto against m-ETF and the best named algorithm", "",
           f"Per setting (graph × network × memory): `auto` with `time_limit_s` "
           f"{AUTO_TIME_LIMIT_S:g} (its default is 60 s) against m-ETF with the pipeline (the "
           "former default) and against the fastest plan of any named algorithm with or without "
           f"the pipeline (`exact` at {EXACT_TIME_LIMIT_S:g} s included; named plans with "
           "`allow_single` off, so the single-device plan counts for auto only when it wins). "
           "Ratios < 1 mean auto is faster; geometric means over the settings where both "
           "have a plan. `worse` counts settings where auto's step is above the best named "
           "one by more than 0.01%.", "",
           "| network | memory | settings | auto feasible | best named feasible | "
           "auto / m-etf | auto / best named | auto better (>0.1%) | worse | "
           "auto step / 1 device | best named step / 1 device | auto s (median) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    settings: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
    for r in rows:
        settings.setdefault((r["network"], r["memory"]), {}).setdefault(
            (r["group"], r["graph"]), []).append(r)
    for key in sorted(settings, key=lambda k: (k[0], MEMORY_LEVELS.index(k[1]))):
        graphs = settings[key]
        vs_etf, vs_best, auto_single, best_single, secs = [], [], [], [], []
        auto_ok = best_ok = better = worse = 0
        for group in graphs.values():
            auto = next((r for r in group if r["algorithm"] == "auto"), None)
            named = [r for r in group if r["algorithm"] != "auto" and r["status"] == "ok"]
            etf = next((r for r in named if r["algorithm"] == "m-etf" and r["pipeline"]), None)
            best = min(named, key=lambda r: r["step_us"], default=None)
            best_ok += best is not None
            if auto is None:
                continue
            secs.append(auto["seconds"])
            if auto["status"] != "ok":
                continue
            auto_ok += 1
            if etf is not None:
                vs_etf.append(auto["step_us"] / etf["step_us"])
            if best is not None:
                ratio = auto["step_us"] / best["step_us"]
                vs_best.append(ratio)
                better += ratio < 0.999
                worse += ratio > 1.0001
                auto_single.append(auto["step_us"] / auto["single_us"])
                best_single.append(best["step_us"] / best["single_us"])
        out.append(
            f"| {key[0]} | {key[1]} | {len(graphs)} | {auto_ok} | {best_ok} | "
            f"{geomean(vs_etf):.3f} | {geomean(vs_best):.3f} | {better} | {worse} | "
            f"{geomean(auto_single):.3f} | {geomean(best_single):.3f} | "
            f"{statistics.median(secs) if secs else float('nan'):.2f} |")
    return out


#: The named algorithms' results before the plan-optimizer work (issue 9) began: bench/results.csv
#: as ``python bench/run.py`` wrote it at commit ddf1dd4, on the same graphs and settings.
BASELINE = ROOT / "bench" / "baseline.csv"


def setting_key(row: dict[str, Any]) -> tuple[str, ...]:
    """A setting: graph (with its group), devices, network and memory."""
    return (row["group"], row["graph"], str(row["devices"]), row["network"], row["memory"])


def fastest_steps(rows: list[dict[str, Any]], leave_out: tuple[str, ...] = (),
                  ) -> dict[tuple[str, ...], float]:
    """Per setting, the fastest step time of a plan found by an algorithm not in
    ``leave_out``."""
    found: dict[tuple[str, ...], float] = {}
    for r in rows:
        if r["status"] == "ok" and r["algorithm"] not in leave_out:
            key = setting_key(r)
            found[key] = min(found.get(key, math.inf), float(r["step_us"]))
    return found


def auto_steps_and_bounds(rows: list[dict[str, Any]]
                          ) -> tuple[dict[tuple[str, ...], float], dict[tuple[str, ...], float]]:
    """Per setting where ``auto`` found a plan: its step time, and its ``stats.bound_us`` (no
    plan of the setting is faster; the format's lower bound when absent)."""
    found = {setting_key(r): r for r in rows if r["algorithm"] == "auto" and r["status"] == "ok"}
    return ({k: float(r["step_us"]) for k, r in found.items()},
            {k: float(r.get("bound_us") or r["lower_bound_us"]) for k, r in found.items()})


def memory_groups(per_network: bool = True) -> list[tuple[str, list[str]]]:
    """The (network or ``"all"``, memory levels) the memory-limited settings are summed up
    by: each network at each level, each network over every level (``per_network``), and
    everything together."""
    levels = [m for m in MEMORY_LEVELS if m != "unlimited"]
    return [(n, [m]) for n in NETWORKS for m in levels] + \
        ([(n, levels) for n in NETWORKS] if per_network else []) + [("all", levels)]


def against_baseline(rows: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> list[str]:
    """``auto``'s step / single device against the best named plan of each setting, today's
    and :data:`BASELINE`'s, as geometric means over the memory-limited settings where both
    have a plan (per memory level and all together)."""
    unnamed = ("auto", "single")  # the best plan of a *named* algorithm
    now, before = fastest_steps(rows, unnamed), fastest_steps(baseline, unnamed)
    autos, bounds = auto_steps_and_bounds(rows)
    out = ["", "## auto against the named algorithms before the plan optimizer", "",
           "Memory-limited settings only. `auto` (as above) against the fastest named plan of "
           "each setting today and in `bench/baseline.csv` (the named algorithms' results at "
           "commit ddf1dd4, before `auto`, `exact`, local search, repair and transfer ordering "
           "existed; same graphs and settings). Ratios are geometric means of auto's step over "
           "the best named step (the single-device step cancels out) over the settings where "
           "all three have a plan. `bound` is auto's `stats.bound_us`, a step time no plan of "
           "the setting can beat (the format's lower bound raised by the transfers memory "
           "forces, or CP-SAT's): `bound / best named today` is the most any placer could gain, "
           "`auto / bound` what is left at most.", "",
           "| network | memory | settings | auto / best named today | auto / best named before "
           "| bound / best named today | auto / bound | auto at its bound |",
           "|---|---|---|---|---|---|---|---|"]
    for network, memories in memory_groups(per_network=False):
        keys = [k for k in autos if k in now and k in before and k[4] in memories
                and network in ("all", k[3])]
        out.append(f"| {network} | {'all' if len(memories) > 1 else memories[0]} | {len(keys)} | "
                   f"{geomean([autos[k] / now[k] for k in keys]):.3f} | "
                   f"{geomean([autos[k] / before[k] for k in keys]):.3f} | "
                   f"{geomean([bounds[k] / now[k] for k in keys]):.3f} | "
                   f"{geomean([autos[k] / bounds[k] for k in keys]):.3f} | "
                   f"{sum(autos[k] <= bounds[k] * (1 + 1e-6) for k in keys)} |")
    broken = bound_violations(rows, bounds)
    out += ["", f"Checked: auto's bound is above a plan some algorithm found in {len(broken)} "
            f"of {len(bounds)} settings (must be 0){': ' if broken else '.'}"
            + "; ".join(" ".join(k) for k in broken)]
    return out


def memory_ceiling(rows: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> list[str]:
    """How much faster than the named algorithms before the plan optimizer any placer could
    be under each memory limit: per setting, the higher of ``auto``'s bound and the fastest
    plan any algorithm found on the same graph, devices and network under any memory limit
    or none (no plan under a limit is faster than the fastest plan without one), over the
    best named step before (:data:`BASELINE`); geometric means over the memory-limited
    settings that have an unlimited one on as many devices (the suggested rows mostly use
    other device counts)."""
    before = fastest_steps(baseline, ("auto", "single"))
    autos, bounds = auto_steps_and_bounds(rows)
    # the fastest plan known per graph, devices and network (a plan within a limit is one
    # without it too)
    free: dict[tuple[str, ...], float] = {}
    for k, step in fastest_steps(rows).items():
        free[k[:4]] = min(free.get(k[:4], math.inf), step)
    out = ["", "### How far memory lets any placer go", "",
           "The issue's target under memory limits is `auto` / best named before ≤ 0.900 "
           "(10% faster). `unlimited` is, per setting, the higher of auto's bound and the "
           "fastest plan any algorithm found for the same graph, devices and network, with "
           "or without a memory limit: no plan under a limit beats the fastest plan without "
           "one, so `unlimited / best named before` is about the least any placer could "
           "reach, unless the plans without a limit are far from optimal (on the graphs "
           "with proven optima, auto's are at them: see the gap to proven optima below). "
           "`bound` alone is proven (and weak on PCIe, where it leaves out most transfers). "
           "Geometric means over the 4-device memory-limited settings with a plan before "
           "and now.", "",
           "| network | memory | settings | auto / best named before "
           "| unlimited / best named before | bound / best named before |",
           "|---|---|---|---|---|---|"]
    for network, memories in memory_groups():
        keys = [k for k in autos if k[4] in memories and (*k[:4], "unlimited") in autos
                and k in before and network in ("all", k[3])]
        if not keys:
            continue
        out.append(f"| {network} | {'all' if len(memories) > 1 else memories[0]} | "
                   f"{len(keys)} | {geomean([autos[k] / before[k] for k in keys]):.3f} | "
                   f"{geomean([max(bounds[k], free[k[:4]]) / before[k] for k in keys]):.3f} | "
                   f"{geomean([bounds[k] / before[k] for k in keys]):.3f} |")
    return out


def against_each_named(rows: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> list[str]:
    """The memory target read per algorithm: in each memory level (and all together), the
    named algorithm and pipeline of :data:`BASELINE` with the lowest geometric mean of step /
    single device, ``auto``'s geometric mean over it and the proven bound's, over the settings
    where both it and ``auto`` have a plan. Where ``bound / it`` is above 0.900, no placer can
    be 10% faster than that algorithm there."""
    autos, bounds = auto_steps_and_bounds(rows)
    singles = {setting_key(r): float(r["single_us"]) for r in rows
               if r["algorithm"] == "auto" and r["status"] == "ok"}
    named: dict[tuple[str, str], dict[tuple[str, ...], float]] = {}
    for r in baseline:
        if r["status"] == "ok":
            named.setdefault((r["algorithm"], _pipe(r)), {})[setting_key(r)] = float(r["step_us"])
    out = ["", "### The memory target read per named algorithm", "",
           "The same target read against one named algorithm instead of the fastest named plan "
           "of each setting: per memory level, the algorithm and pipeline of "
           "`bench/baseline.csv` whose geometric mean of step / single device is lowest (over "
           "the settings where it and `auto` both have a plan), `auto` over it and the proven "
           "bound over it. `reachable` says whether the bound leaves room for 10%: where "
           "`bound / it` is above 0.900, no plan of any placer is 10% faster than that "
           "algorithm on those settings.", "",
           "| network | memory | best named before | settings | its step / 1 device "
           "| auto / it | bound / it | reachable |",
           "|---|---|---|---|---|---|---|---|"]
    for network, memories in memory_groups():
        best = None
        for (algorithm, pipeline), steps in sorted(named.items()):
            keys = [k for k in steps if k in autos and k[4] in memories
                    and network in ("all", k[3])]
            if keys:
                mean = geomean([steps[k] / singles[k] for k in keys])
                if best is None or mean < best[0]:
                    best = (mean, f"{algorithm} ({pipeline})", keys, steps)
        if best is None:
            continue
        mean, name, keys, steps = best
        bound_ratio = geomean([bounds[k] / steps[k] for k in keys])
        out.append(f"| {network} | {'all' if len(memories) > 1 else memories[0]} | {name} | "
                   f"{len(keys)} | {mean:.3f} | "
                   f"{geomean([autos[k] / steps[k] for k in keys]):.3f} | "
                   f"{bound_ratio:.3f} | {'yes' if bound_ratio <= 0.9 else 'no'} |")
    return out


def bound_violations(rows: list[dict[str, Any]],
                     bounds: dict[tuple[str, ...], float]) -> list[tuple[str, ...]]:
    """The settings where a bound is above the step time of a plan any algorithm found
    there (a bound that is not one: a bug)."""
    fastest = fastest_steps(rows)
    return sorted(k for k, b in bounds.items() if b > fastest[k] * (1 + 1e-6))


def fragments(directory: Path) -> str:
    """The Markdown fragments other benchmarks write (first line: a comment naming the
    command that generated it), each as a section, in file-name order."""
    parts = []
    for path in sorted(directory.glob("*.md")):
        text = path.read_text().strip()
        first, _, rest = text.partition("\n")
        command = first.removeprefix("<!--").removesuffix("-->").strip()
        parts.append(f"{rest.strip()}\n\n_Section from `bench/fragments/{path.name}`, "
                     f"{command}._\n")
    return "\n".join(parts)


def with_front_page(text: str) -> str:
    """``text`` with one screen at its top, after the first paragraph: ``auto``'s rows of the
    summary table and a linked list of every section, each with its first sentence."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines)
                  if line.startswith("| network | memory | algorithm")), None)
    glance = ["## At a glance", ""]
    if start is not None:
        glance += ["`auto`, the default, per network and memory level (from the summary below; "
                   "step / lower bound and speedup over one device are geometric means):", "",
                   lines[start], lines[start + 1]]
        for line in lines[start + 2:]:
            if not line.startswith("|"):
                break
            if "| auto |" in line:
                glance.append(line)
        glance.append("")
    glance += ["Every section:", ""]
    for i, line in enumerate(lines):
        if line.startswith("## "):
            title = line[3:].strip()
            anchor = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
            after = next((x for x in lines[i + 1:] if x.strip()), "")
            first = after.split(". ")[0].rstrip(".") if not after.startswith("|") else ""
            glance.append(f"- [{title}](#{anchor})" + (f": {first[:160]}" if first else ""))
    end_of_intro = next(i for i, line in enumerate(lines) if line.startswith("## "))
    return "\n".join([*lines[:end_of_intro], *glance, "", *lines[end_of_intro:]])


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = [g for g in ("gnmt_baechi", "resnet50_training_operator",
                          "bert_l-12_training_operator", "pipedream_nasnetalarge")
              if any(r["graph"] == g for r in rows)]
    fig, axes = plt.subplots(1, max(1, len(chosen)), figsize=(4.2 * max(1, len(chosen)), 3.6))
    axes = axes if hasattr(axes, "__len__") else [axes]
    levels = ["30%", "50%", "75%", "unlimited"]
    for ax, graph in zip(axes, chosen, strict=False):
        for algorithm in ALGORITHMS:
            ys = []
            for level in levels:
                match = [r for r in rows if r["graph"] == graph and r["memory"] == level
                         and r["algorithm"] == algorithm and r["pipeline"]
                         and r["network"] == "nvlink" and r["status"] == "ok"]
                ys.append(match[0]["step_us"] / 1000 if match else float("nan"))
            ax.plot(levels, ys, marker="o", label=algorithm)
        single = [r["single_us"] for r in rows if r["graph"] == graph and "single_us" in r]
        if single:
            ax.axhline(single[0] / 1000, color="grey", linestyle="--", label="1 device")
        ax.set_title(graph, fontsize=9)
        ax.set_xlabel("memory per device (of 1-device peak)")
        ax.set_ylabel("step time (ms)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Step time against per-device memory (4 devices, NVLink-class, pipeline on)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


#: Columns of bench/results.csv that are numbers or flags (the rest are text).
INT_COLUMNS = ("devices", "memory_bytes", "nodes", "ops", "single_peak")
FLOAT_COLUMNS = ("lower_bound_us", "peak_over_limit", "ratio_lb", "seconds", "single_us",
                 "speedup", "step_us")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows a run wrote to bench/results.csv, with their types back."""
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row: dict[str, Any] = dict(raw)
            for key in INT_COLUMNS:
                row[key] = int(raw[key]) if raw.get(key) else None
            for key in FLOAT_COLUMNS:
                row[key] = float(raw[key]) if raw.get(key) else None
            row["pipeline"] = raw.get("pipeline") == "True"
            rows.append(row)
    return rows


def number(value: Any) -> float | None:
    """A CSV cell as a float; ``None`` where it is empty (a run that found no plan).

    >>> number("1.5"), number(""), number(None)
    (1.5, None, None)
    """
    return None if value in (None, "") else float(value)


def ratio(row: dict[str, Any], key: str = "named_us") -> float | None:
    """A sweep row's ``auto`` step over its step in ``key`` (the best named one's); ``None``
    unless both found a plan.

    >>> ratio({"auto_us": "90", "named_us": "100"}), ratio({"auto_us": "", "named_us": "1"})
    (0.9, None)
    """
    auto, other = number(row.get("auto_us")), number(row.get(key))
    return None if auto is None or other is None else auto / other


def named_label(algorithm: str, pipeline: bool) -> str:
    """A run's label in the sweeps' tables: ``m-etf``, ``m-etf/unreduced``."""
    return algorithm + ("" if pipeline else "/unreduced")


def named_steps(doc: dict[str, Any], cluster: dict[str, Any],
                runs: Iterable[tuple[str, bool, dict[str, Any]]]) -> dict[str, float]:
    """Step time (µs) of each named run (algorithm, with the pipeline, more options) that
    found a plan of ``doc`` on ``cluster``, by label (``m-etf``, ``m-etf/unreduced``), with
    ``allow_single`` off: what the sweeps compare ``auto`` with."""
    from baechi import InfeasiblePlacement, place

    steps = {}
    for algorithm, pipeline, extra in runs:
        options = {"allow_single": False, "co_placement": pipeline, "fusion": pipeline, **extra}
        with contextlib.suppress(InfeasiblePlacement):
            plan = place(doc, cluster, algorithm, options)
            assert plan.estimate is not None
            steps[named_label(algorithm, pipeline)] = plan.estimate.step_time_us
    return steps


def fastest(steps: dict[str, float]) -> dict[str, Any]:
    """The row fields of the fastest of :func:`named_steps`: ``named_us`` and ``named`` (its
    label); none when no run found a plan."""
    if not steps:
        return {}
    step, label = min((step, label) for label, step in steps.items())
    return {"named_us": step, "named": label}


def no_auto_plan(rows: list[dict[str, Any]]) -> int:
    """How many sweep rows have a named plan and no plan of ``auto``."""
    return sum(number(r.get("auto_us")) is None and number(r.get("named_us")) is not None
               for r in rows)


def chosen_label(chosen: Chosen) -> str:
    """``auto``'s choice as the tables show it: ``m-fill/unreduced + search``."""
    return (named_label(chosen.algorithm, chosen.pipeline)
            + (" + search" if chosen.local_search else ""))


def write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """Runs as CSV, one column per key any row has (:func:`read_rows` reads them back)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
        writer.writeheader()
        writer.writerows(rows)


def rewrite_fragment(fragment: Path, text: str, source: str) -> None:
    """Write ``text`` (a fragment rendered again from ``source``, a CSV, without placing)
    over ``fragment``, keeping its first line: the command and seconds of the run that
    wrote the CSV."""
    header = fragment.read_text().splitlines()[0]
    fragment.write_text("\n".join([header, *text.splitlines()[1:]]) + "\n")
    print(f"wrote {fragment} from {source}")


def sweep_main(name: str, doc: str, run_graph: Callable[[Any], list[dict[str, Any]]],
               render: Callable[[list[dict[str, Any]], str, float], str],
               cases: Callable[[bool], list[dict[str, Any]]] | None = None) -> int:
    """The command line of a benchmark ``bench/{name}.py`` (``doc``: its module docstring)
    that places each shared graph (or each graph document ``cases(quick)`` gives) with
    ``run_graph`` and renders its rows as a fragment with ``render(rows, command,
    seconds)``: ``--shared``, ``--quick`` (run.py's quick graphs, or ``cases``' own) and
    ``--from-csv`` (render again from ``bench/{name}.csv``, placing nothing, keeping the
    fragment's first line). Writes ``bench/{name}.csv`` and ``bench/fragments/{name}.md``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"))
    parser.add_argument("--quick", action="store_true", help="the few graphs of run.py --quick")
    parser.add_argument("--from-csv", action="store_true",
                        help=f"render the fragment again from bench/{name}.csv, placing nothing")
    args = parser.parse_args()
    table = ROOT / "bench" / f"{name}.csv"
    fragment = ROOT / "bench" / "fragments" / f"{name}.md"
    if args.from_csv:
        rewrite_fragment(fragment, render(read_rows(table), "", 0.0), f"bench/{name}.csv")
        return 0
    items: list[Any] = cases(args.quick) if cases else graphs_or_exit(args.shared, args.quick)
    tick = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        rows.extend(run_graph(item))
        label = item.stem if isinstance(item, Path) else item["name"]
        print(f"[{i + 1}/{len(items)}] {label}", file=sys.stderr)
    elapsed = time.perf_counter() - tick
    command = f"python bench/{name}.py" + (" --quick" if args.quick else "")
    write_rows(rows, table)
    fragment.write_text(render(rows, command, elapsed))
    print(f"wrote {fragment} and bench/{name}.csv in {elapsed:.0f} s")
    return 0


def reassemble(output: Path) -> int:
    """BENCHMARKS.md from the last run's rows and the fragments as they are now (a fragment
    regenerated by its own command shows up without placing every graph again)."""
    previous = output.read_text() if output.exists() else ""
    match = re.search(r"Generated by `(python bench/run.py[^`]*)` in (\d+) s", previous)
    command, elapsed = (match.group(1), float(match.group(2))) if match else \
        ("python bench/run.py", float("nan"))
    rows = read_rows(ROOT / "bench" / "results.csv")
    text = markdown(rows, command, elapsed)
    included = fragments(ROOT / "bench" / "fragments")
    output.write_text(with_front_page(text + ("\n" + included if included else "")))
    print(f"wrote {output} from bench/results.csv ({len(rows)} runs) and the fragments")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"))
    parser.add_argument("--quick", action="store_true", help="a few graphs, pipeline on only")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    parser.add_argument("--from-csv", action="store_true",
                        help="rebuild BENCHMARKS.md from bench/results.csv and the current "
                             "fragments, without placing anything again")
    args = parser.parse_args()
    if args.from_csv:
        return reassemble(Path(args.output))
    paths = graphs_or_exit(args.shared, args.quick)
    tick = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for i, result in enumerate(pool.map(run_graph, map(str, paths),
                                            [args.quick] * len(paths))):
            rows.extend(result)
            print(f"[{i + 1}/{len(paths)}] {paths[i].stem}", file=sys.stderr)
    elapsed = time.perf_counter() - tick
    command = "python bench/run.py" + (" --quick" if args.quick else "") + \
        f" --jobs {args.jobs}"
    text = markdown(rows, command, elapsed)
    included = fragments(ROOT / "bench" / "fragments")
    Path(args.output).write_text(with_front_page(text + ("\n" + included if included else "")))
    write_rows(rows, ROOT / "bench" / "results.csv")
    plot(rows, ROOT / "bench" / "memory.png")
    print(f"wrote {args.output}, bench/results.csv, bench/memory.png in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
