"""``auto`` between the memory levels of ``bench/run.py``: does it hold up where nobody tuned it?

Usage::

    python bench/memory_sweep.py [--shared ../shared] [--quick]

``bench/run.py`` places every graph at 75%, 50% and 30% of its single-device peak. This places
the graphs that hold memory at :data:`FRACTIONS` of their peak (4 devices, both networks) with
``auto`` (``time_limit_s`` 2, as run.py) and with every named list scheduler (m-TOPO, m-ETF,
m-SCT, m-fill, m-cut, with and without the pipeline; ``exact`` left out for time), and
reports:

- ``auto`` against the fastest named plan per setting;
- *more memory, slower plan*: settings where ``auto``'s plan is slower by over
  :data:`SLOWER` than its plan of the same graph and network with less memory (here or in
  ``bench/results.csv``), which fits there too: a plan any placer could have returned.

Run it after ``bench/run.py`` (it reads ``bench/results.csv``). Writes
``bench/memory_sweep.csv`` and ``bench/fragments/memory_sweep.md`` (first line: the command).
``--from-csv`` places nothing: it renders the fragment again from ``bench/memory_sweep.csv``
against the current ``bench/results.csv``, keeping the first line of the run that wrote it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from run import (  # noqa: E402  (bench/ is not a package)
    ALGORITHMS,
    AUTO_TIME_LIMIT_S,
    DEVICES,
    NETWORKS,
    fraction_settings,
    geomean,
    number,
    read_rows,
    single_peak,
    sweep_main,
)

#: Shares of the single-device peak placed here: between and around run.py's 30/50/75%.
FRACTIONS = (0.4, 0.6, 0.7, 0.9)

#: Relative excess over a plan with less memory above which a plan counts as slower.
SLOWER = 0.01

#: Settings listed by name under "more memory, slower plan".
LISTED = 10


def run_graph(path: Path) -> list[dict[str, Any]]:
    """``auto`` and the fastest named plan at each of :data:`FRACTIONS` on both networks."""
    from baechi import InfeasiblePlacement, place

    doc = json.loads(path.read_text())
    rows = []
    for setting in fraction_settings(single_peak(doc), FRACTIONS):
        row: dict[str, Any] = {"group": path.parent.name, "graph": path.stem,
                               "ops": len(doc["ops"]), "network": setting.network,
                               "memory": setting.memory, "memory_bytes": setting.memory_bytes}
        named: list[tuple[float, str]] = []
        for algorithm in ALGORITHMS:
            for pipeline in (True, False):
                options = {"allow_single": False, "co_placement": pipeline, "fusion": pipeline}
                with contextlib.suppress(InfeasiblePlacement):
                    plan = place(doc, setting.cluster, algorithm, options)
                    assert plan.estimate is not None
                    named.append((plan.estimate.step_time_us,
                                  algorithm + ("" if pipeline else "/unreduced")))
        if named:
            row["named_us"], row["named"] = min(named)
        tick = time.perf_counter()
        try:
            plan = place(doc, setting.cluster, "auto", {"time_limit_s": AUTO_TIME_LIMIT_S})
        except InfeasiblePlacement:
            row["auto_seconds"] = time.perf_counter() - tick
        else:
            assert plan.estimate is not None
            row.update(auto_us=plan.estimate.step_time_us,
                       auto_seconds=plan.stats.placement_seconds)
        rows.append(row)
    return rows


def slower_with_more_memory(rows: list[dict[str, Any]], results: list[dict[str, Any]]
                            ) -> list[tuple[float, str, str, int, float, float, int]]:
    """(excess, graph, network, memory, step, faster step, its memory) where ``auto``'s plan
    is over :data:`SLOWER` slower than its plan with less memory (this sweep's settings and
    run.py's 4-device ones), worst first."""
    steps: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    for r in rows:
        if number(r.get("auto_us")) is not None:
            steps.setdefault((r["group"], r["graph"], r["network"]), []).append(
                (int(r["memory_bytes"]), float(r["auto_us"])))
    for r in results:
        if r["algorithm"] == "auto" and r["status"] == "ok" and r["memory_bytes"] \
                and int(r["devices"]) == DEVICES:
            key = (r["group"], r["graph"], r["network"])
            if key in steps:
                steps[key].append((int(r["memory_bytes"]), float(r["step_us"])))
    found = []
    for (_, graph, network), points in steps.items():
        points.sort()
        best_memory, best = points[0]
        for memory, step in points[1:]:
            if step > best * (1 + SLOWER):
                found.append((step / best - 1, graph, network, memory, step, best, best_memory))
            if step < best:
                best_memory, best = memory, step
    return sorted(found, reverse=True)


def markdown(rows: list[dict[str, Any]], command: str, elapsed: float) -> str:
    """The fragment: auto against the named plans, and plans slower with more memory."""
    out = [f"<!-- generated by `{command}` in {elapsed:.0f} s -->",
           "## auto between the memory levels", "",
           f"The graphs that hold memory placed at {', '.join(f'{f:.0%}' for f in FRACTIONS)} "
           f"of their single-device peak (run.py places them at 75/50/30%), {DEVICES} devices, "
           f"`auto` with `time_limit_s` {AUTO_TIME_LIMIT_S:g}, against the fastest of the named "
           "list schedulers (m-TOPO, m-ETF, m-SCT, m-fill, m-cut, with and without the pipeline, "
           "`allow_single` off; `exact` left out for time). Geometric means over the settings "
           "where both have a plan; `worse` counts auto's plans slower than the best named "
           "one by more than 0.01%.", "",
           "| network | memory | settings | auto feasible | named feasible "
           "| auto / best named | auto better (>0.1%) | worse | auto s (median) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for network in NETWORKS:
        for fraction in FRACTIONS:
            group = [r for r in rows if r["network"] == network
                     and r["memory"] == f"{fraction:.0%}"]
            both = [r for r in group if number(r.get("auto_us")) is not None
                    and number(r.get("named_us")) is not None]
            ratios = [float(r["auto_us"]) / float(r["named_us"]) for r in both]
            seconds = sorted(float(r["auto_seconds"]) for r in group)
            out.append(
                f"| {network} | {fraction:.0%} | {len(group)} "
                f"| {sum(number(r.get('auto_us')) is not None for r in group)} "
                f"| {sum(number(r.get('named_us')) is not None for r in group)} "
                f"| {geomean(ratios):.3f} | {sum(x < 0.999 for x in ratios)} "
                f"| {sum(x > 1.0001 for x in ratios)} "
                f"| {seconds[len(seconds) // 2] if seconds else 0:.2f} |")
    missing = [r for r in rows if number(r.get("auto_us")) is None
               and number(r.get("named_us")) is not None]
    out += ["", f"Settings where a named algorithm found a plan and auto none: {len(missing)} "
            "(must be 0)."]
    found = slower_with_more_memory(rows, read_rows(ROOT / "bench" / "results.csv"))
    total = sum(number(r.get("auto_us")) is not None for r in rows)
    out += ["", "### More memory, slower plan", "",
            f"Of auto's {total} plans here, {len(found)} are more than {SLOWER:.0%} slower than "
            "its plan of the same graph and network with less memory (this sweep's settings "
            "and run.py's), which fits with more memory too: plans a placer could have "
            "returned. Worst first:", "",
            "| graph | network | memory (MiB) | auto (ms) | with less memory (ms) | at (MiB) |",
            "|---|---|---|---|---|---|"]
    out += [f"| {graph} | {network} | {memory / 2**20:.0f} | {step / 1000:.1f} "
            f"| {best / 1000:.1f} | {best_memory / 2**20:.0f} |"
            for _, graph, network, memory, step, best, best_memory in found[:LISTED]]
    return "\n".join(out) + "\n"


def main() -> int:
    return sweep_main("memory_sweep", __doc__, run_graph, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
