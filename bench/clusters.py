"""``auto`` on clusters unlike ``bench/run.py``'s: does it hold up where nobody tuned it?

Usage::

    python bench/clusters.py [--shared ../shared] [--quick] [--from-csv]

``bench/run.py`` and ``bench/memory_sweep.py`` place every graph on 4 identical devices with
one channel each. This places the graphs that hold memory on the :data:`SHAPES` below, on both
networks, with ``auto`` (``time_limit_s`` 2, as run.py) and with every named algorithm: the
list schedulers (m-TOPO, m-ETF, m-EFT, m-SCT, m-fill, m-cut) with and without the pipeline, and
``exact`` with the pipeline for 1 s (without it, ``exact`` solves the graph itself, which
``auto`` does too), all with ``allow_single`` off. It reports ``auto`` against the fastest
named plan per setting, lists the settings where ``auto``'s plan is slower, and the wall
seconds of ``auto``'s requests against their time limit.

Writes ``bench/clusters.csv`` and ``bench/fragments/clusters.md`` (first line: the command).
``--from-csv`` places nothing: it renders the fragment again from ``bench/clusters.csv``,
keeping the first line of the run that wrote it. Each row keeps the speed of the machine that
placed it (:func:`machine_seconds`).
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from run import (  # noqa: E402  (bench/ is not a package)
    ALGORITHMS,
    AUTO_TIME_LIMIT_S,
    EXACT_TIME_LIMIT_S,
    NETWORKS,
    fastest,
    geomean,
    named_steps,
    no_auto_plan,
    number,
    ratio,
    single_peak,
    sweep_main,
)
from speed import PCIE, timed  # noqa: E402


class Shape(NamedTuple):
    """A cluster shape: per device (speed, share of the graph's single-device peak as its
    memory), and whether each device has one channel (``sequential``) or none."""

    name: str
    devices: tuple[tuple[float, float], ...]
    mode: str = "sequential"


#: The clusters placed here: two devices with room to spare, eight small ones, two
#: generations mixed (the faster devices with more memory, as newer accelerators have), and
#: three devices whose transfers do not queue.
SHAPES = (
    Shape("2 x 75%", ((1.0, 0.75),) * 2),
    Shape("8 x 30%", ((1.0, 0.3),) * 8),
    Shape("mixed 2 x (1.0, 80%) + 2 x (0.5, 50%)", ((1.0, 0.8),) * 2 + ((0.5, 0.5),) * 2),
    Shape("3 x 50%, parallel transfers", ((1.0, 0.5),) * 3, "parallel"),
)

#: Relative excess over the best named plan above which ``auto``'s plan counts as slower.
WORSE = 1e-3


def cluster(shape: Shape, network: dict[str, Any], peak: int) -> dict[str, Any]:
    """The request's cluster: ``shape`` for a graph whose single-device peak is ``peak``.

    >>> cluster(SHAPES[3], {"latency_us": 10, "bandwidth_gbps": 150}, 1000)["devices"][2]
    {'name': '/GPU:2', 'speed': 1.0, 'memory_bytes': 500}
    """
    return {"devices": [{"name": f"/GPU:{i}", "speed": speed, "memory_bytes": int(peak * share)}
                        for i, (speed, share) in enumerate(shape.devices)],
            "network": {**network, "mode": shape.mode}}


def run_graph(path: Path) -> list[dict[str, Any]]:
    """``auto`` and the fastest named plan on every shape and network (none for a graph that
    holds no memory: a share of nothing limits nothing)."""
    from baechi import InfeasiblePlacement, place

    machine_s = machine_seconds()
    doc = json.loads(path.read_text())
    peak = single_peak(doc)
    if peak == 0:
        return []
    named_runs = [(a, p, {}) for a in ALGORITHMS for p in (True, False)]
    named_runs.append(("exact", True, {"time_limit_s": EXACT_TIME_LIMIT_S}))
    rows = []
    for shape in SHAPES:
        for network_name, network in NETWORKS.items():
            request_cluster = cluster(shape, network, peak)
            row: dict[str, Any] = {"group": path.parent.name, "graph": path.stem,
                                   "ops": len(doc["ops"]), "shape": shape.name,
                                   "network": network_name, "machine_s": machine_s}
            row.update(fastest(named_steps(doc, request_cluster, named_runs)))
            tick = time.perf_counter()
            try:
                plan = place(doc, request_cluster, "auto", {"time_limit_s": AUTO_TIME_LIMIT_S})
            except InfeasiblePlacement:
                pass
            else:
                assert plan.estimate is not None
                row["auto_us"] = plan.estimate.step_time_us
            row["auto_seconds"] = time.perf_counter() - tick  # wall, validation included
            rows.append(row)
    return rows


def exceptions(rows: list[dict[str, Any]]) -> tuple[int, list[tuple[float, dict[str, Any]]]]:
    """How many settings have a named plan and no plan of ``auto``, and the settings where
    ``auto``'s plan is slower than the best named one by more than :data:`WORSE`, with that
    ratio, slowest first."""
    worse = sorted(((x, r) for r in rows if (x := ratio(r)) is not None and x > 1 + WORSE),
                   key=lambda item: item[0], reverse=True)
    return no_auto_plan(rows), worse


def summary_cells(group: list[dict[str, Any]]) -> list[str]:
    """The cells of a fragment's row for ``group`` (rows of one cluster): settings, auto's
    plans, the named plans, auto / best named, auto better and worse, auto's median and
    longest seconds."""
    ratios = [x for r in group if (x := ratio(r)) is not None]
    seconds = [float(r["auto_seconds"]) for r in group]
    return [str(len(group)), str(sum(number(r.get("auto_us")) is not None for r in group)),
            str(sum(number(r.get("named_us")) is not None for r in group)),
            f"{geomean(ratios):.3f}", str(sum(x < 1 - WORSE for x in ratios)),
            str(sum(x > 1 + WORSE for x in ratios)),
            f"{statistics.median(seconds) if seconds else 0:.2f}",
            f"{max(seconds, default=0):.2f}"]


@functools.cache
def machine_seconds() -> float:
    """Median seconds m-ETF takes to place gnmt_baechi (the bundled copy) on 4 PCIe devices
    of 768 MiB: the row BENCHMARKS.md compares machines by (``auto``'s plans depend on the
    work that fits in its time limit). Measured once per run, before the first graph is
    placed."""
    from baechi import load_graph, place

    graph = load_graph(ROOT / "examples" / "graphs" / "gnmt_baechi.json")
    cluster_768 = {"devices": {"count": 4, "memory_bytes": "768MiB"}, "network": PCIE}
    return timed(lambda: place(graph, cluster_768, "m-etf"))[0]


def markdown(rows: list[dict[str, Any]], command: str, elapsed: float) -> str:
    """The fragment: per shape and network, auto against the named plans; the exceptions."""
    machine_s = float(rows[0]["machine_s"]) if rows else math.nan
    out = [f"<!-- generated by `{command}` in {elapsed:.0f} s -->",
           "## auto on other clusters", "",
           "The graphs that hold memory, placed on clusters unlike the 4 identical devices "
           "above (memory as shares of the graph's single-device peak; speeds relative), "
           f"`auto` with `time_limit_s` {AUTO_TIME_LIMIT_S:g} against the fastest named plan: "
           "m-TOPO, m-ETF, m-EFT, m-SCT, m-fill, m-cut with and without the pipeline, `exact` with "
           f"the pipeline and `time_limit_s` {EXACT_TIME_LIMIT_S:g}, all with `allow_single` "
           "off. Geometric means over the settings where both have a plan; `worse` counts "
           f"auto's plans slower than the best named one by more than {WORSE:.1%}; seconds "
           "are wall-clock per request, on a machine where m-ETF places gnmt_baechi at 768 MiB "
           f"in {machine_s:.2f} s (the speed section's row).", "",
           "| cluster | network | settings | auto feasible | named feasible "
           "| auto / best named | auto better (>0.1%) | worse | auto s (median) | auto s (max) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for shape in SHAPES:
        for network in NETWORKS:
            group = [r for r in rows if r["shape"] == shape.name and r["network"] == network]
            out.append(f"| {shape.name} | {network} | {' | '.join(summary_cells(group))} |")
    missing, worse = exceptions(rows)
    out += ["", f"Settings where a named algorithm found a plan and auto none: {missing}."
            f" Settings where auto's plan is slower than a named one: {len(worse)} of "
            f"{len(rows)}" + (" (one run of each per setting: `auto` and `exact` depend on "
                              "how much work fits in their time, so a listed setting may not "
                              "repeat):" if worse else "."), ""]
    if worse:
        out += ["| graph | cluster | network | auto (ms) | best named (ms) | by |",
                "|---|---|---|---|---|---|"]
        out += [f"| {r['graph']} | {r['shape']} | {r['network']} "
                f"| {float(r['auto_us']) / 1000:.1f} "
                f"| {float(r['named_us']) / 1000:.1f} ({r['named']}) | {x - 1:.2%} |"
                for x, r in worse]
    return "\n".join(out) + "\n"


def main() -> int:
    return sweep_main("clusters", __doc__, run_graph, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
