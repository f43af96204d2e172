"""``auto`` on generated graphs: shapes and sizes nobody tuned it on.

Usage::

    python bench/generated.py [--quick] [--from-csv]

``bench/run.py`` and ``bench/clusters.py`` place the shared graphs, which ``auto``'s
constants were measured on. This places graphs made by :data:`baechi.testing.GENERATORS`
(layered, fork-join, chains with skip connections; :func:`baechi.testing.with_memory` gives
them weights and activations) at :data:`SIZES` ops and :data:`CCRS` (the communication to
computation ratio on :data:`NETWORK`), on the :data:`CLUSTERS` below, each unlimited and at a
share of the graph's single-device peak. Per setting, ``auto`` (``time_limit_s`` 2, as
run.py) against every named algorithm: the list schedulers (m-TOPO, m-ETF, m-EFT, m-SCT,
m-fill, m-cut) and ``exact`` (``time_limit_s`` 1), each with and without the pipeline, all with
``allow_single`` off. It reports ``auto`` against the fastest named plan and against m-ETF,
the settings where ``auto``'s plan is slower, and the wall seconds of ``auto``'s requests.
The graphs are seeded: every run places the same ones.

Writes ``bench/generated.csv`` and ``bench/fragments/generated.md`` (first line: the
command). ``--from-csv`` places nothing: it renders the fragment again from
``bench/generated.csv``. ``--quick``: the two smaller sizes only. ``--shared`` is not read.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from clusters import (  # noqa: E402  (bench/ is not a package)
    WORSE,
    exceptions,
    machine_seconds,
    summary_cells,
)
from run import (  # noqa: E402
    ALGORITHMS,
    AUTO_TIME_LIMIT_S,
    EXACT_TIME_LIMIT_S,
    fastest,
    geomean,
    named_steps,
    ratio,
    single_peak,
    sweep_main,
)

from baechi.testing import GENERATORS, with_memory  # noqa: E402

#: Ops per generated graph.
SIZES = (60, 200, 600, 2000)

#: Communication to computation ratios: each tensor's transfer takes about this many times
#: the mean op's compute time on :data:`NETWORK` (:func:`baechi.testing.layered`).
CCRS = (0.3, 3.0)

#: The seed of every generated graph.
SEED = 7

#: The generators' convention (:func:`baechi.testing.small_cluster`): a byte takes 1 µs, so
#: an edge's bytes are its transfer's µs; 1 µs latency.
NETWORK = {"latency_us": 1, "bandwidth_gbps": 0.001}


class Shape(NamedTuple):
    """A cluster: device speeds, the memory share of the graph's single-device peak each
    device gets when memory is limited, and the transfer mode."""

    name: str
    speeds: tuple[float, ...]
    memory_share: float
    mode: str = "sequential"


#: Four identical devices, three of two generations (one at full speed, two at half), and
#: eight devices whose transfers do not queue; memory unlimited, then limited to the share.
CLUSTERS = (
    Shape("4 identical", (1.0,) * 4, 0.5),
    Shape("3 mixed speeds (1, 0.5, 0.5)", (1.0, 0.5, 0.5), 0.5),
    Shape("8, parallel transfers", (1.0,) * 8, 0.3, "parallel"),
)

def cluster(shape: Shape, memory: int | None) -> dict[str, Any]:
    """The request's cluster for ``shape``, each device with ``memory`` bytes (or none).

    >>> cluster(CLUSTERS[1], 100)["devices"][2]
    {'name': '/GPU:2', 'speed': 0.5, 'memory_bytes': 100}
    """
    return {"devices": [{"name": f"/GPU:{i}", "speed": speed, "memory_bytes": memory}
                        for i, speed in enumerate(shape.speeds)],
            "network": {**NETWORK, "mode": shape.mode}}


def graphs(quick: bool) -> list[dict[str, Any]]:
    """The generated graph documents, every shape at every size and CCR."""
    sizes = SIZES[:2] if quick else SIZES
    return [with_memory(generate(SEED, ops, ccr)) for generate in GENERATORS.values()
            for ops in sizes for ccr in CCRS]


def run_graph(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """``auto``, m-ETF and the fastest named plan on every cluster, memory unlimited and
    limited."""
    from baechi import InfeasiblePlacement, place

    machine_s = machine_seconds()
    peak = single_peak(doc)
    named_runs = [(a, p, {"time_limit_s": EXACT_TIME_LIMIT_S} if a == "exact" else {})
                  for a in (*ALGORITHMS, "exact") for p in (True, False)]
    rows = []
    for shape in CLUSTERS:
        for memory in (None, int(peak * shape.memory_share)):
            request_cluster = cluster(shape, memory)
            row: dict[str, Any] = {
                "graph": doc["name"], "ops": len(doc["ops"]), "cluster": shape.name,
                "memory": "unlimited" if memory is None else f"{shape.memory_share:.0%}",
                "machine_s": machine_s}
            steps = named_steps(doc, request_cluster, named_runs)
            row.update(fastest(steps))
            if "m-etf" in steps:
                row["metf_us"] = steps["m-etf"]
            tick = time.perf_counter()
            with contextlib.suppress(InfeasiblePlacement):
                plan = place(doc, request_cluster, "auto", {"time_limit_s": AUTO_TIME_LIMIT_S})
                assert plan.estimate is not None
                row["auto_us"] = plan.estimate.step_time_us
            row["auto_seconds"] = time.perf_counter() - tick  # wall, validation included
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], command: str, elapsed: float) -> str:
    """The fragment: per cluster and memory, auto against the named plans; the exceptions."""
    machine_s = float(rows[0]["machine_s"]) if rows else math.nan
    sizes = sorted({int(r["ops"]) for r in rows})
    out = [f"<!-- generated by `{command}` in {elapsed:.0f} s -->",
           "## auto on generated graphs", "",
           f"Graphs nobody tuned `auto` on: {len(rows) // (2 * len(CLUSTERS))} made by "
           "`baechi.testing` (layered, fork-join, chains with skip connections; weights and "
           f"activations by `with_memory`; seed {SEED}) at "
           f"{', '.join(str(s) for s in sizes)} ops and CCR {', '.join(f'{c:g}' for c in CCRS)}"
           ", on the clusters below (memory unlimited, then each device at a share of the "
           "graph's single-device peak). `auto` with `time_limit_s` "
           f"{AUTO_TIME_LIMIT_S:g} against m-ETF with the pipeline and against the fastest "
           "named plan: m-TOPO, m-ETF, m-EFT, m-SCT, m-fill, m-cut and `exact` (`time_limit_s` "
           f"{EXACT_TIME_LIMIT_S:g}), each with and without the pipeline, all with "
           "`allow_single` off. Geometric means over the settings where both have a plan; "
           f"`worse` counts auto's plans slower than the best named one by more than {WORSE:.1%}"
           "; seconds are wall-clock per request, on a machine where m-ETF places gnmt_baechi "
           f"at 768 MiB in {machine_s:.2f} s. Reproduce: `python bench/generated.py`.", "",
           "| cluster | memory | settings | auto feasible | named feasible | auto / m-etf "
           "| auto / best named | auto better (>0.1%) | worse | auto s (median) "
           "| auto s (max) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for shape in CLUSTERS:
        for memory in ("unlimited", f"{shape.memory_share:.0%}"):
            group = [r for r in rows if r["cluster"] == shape.name and r["memory"] == memory]
            cells = summary_cells(group)
            # auto / m-etf goes before auto / best named
            metf = [x for r in group if (x := ratio(r, "metf_us")) is not None]
            cells.insert(3, f"{geomean(metf):.3f}")
            out.append(f"| {shape.name} | {memory} | {' | '.join(cells)} |")
    missing, worse = exceptions(rows)
    out += ["", f"Settings where a named algorithm found a plan and auto none: {missing}."
            f" Settings where auto's plan is slower than a named one: {len(worse)} of "
            f"{len(rows)}" + (" (one run of each per setting):" if worse else "."), ""]
    if worse:
        out += ["| graph | cluster | memory | auto (µs) | best named (µs) | by |",
                "|---|---|---|---|---|---|"]
        out += [f"| {r['graph']} | {r['cluster']} | {r['memory']} "
                f"| {float(r['auto_us']):.0f} | {float(r['named_us']):.0f} ({r['named']}) "
                f"| {x - 1:.2%} |" for x, r in worse]
    return "\n".join(out) + "\n"


def main() -> int:
    return sweep_main("generated", __doc__, run_graph, markdown, graphs)


if __name__ == "__main__":
    raise SystemExit(main())
