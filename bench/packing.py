"""Which memory-limited settings the packing check decides, and how fast.

Usage: ``python bench/packing.py [--shared ../shared] [--seconds 1]``

For every setting of ``bench/run.py`` and of ``bench/memory_sweep.py`` with a memory limit
(each graph, device count and memory once: the network does not change memory), runs the
checks :func:`baechi.api.place` runs before any placer: the per-unit floor, then
:func:`baechi.bounds.pack_units` with ``--seconds``. Prints the settings it proves impossible
or cannot decide, each with its seconds, and the counts per outcome: where to look for the
next proof of infeasibility (``unknown``) and what the check costs.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from memory_sweep import FRACTIONS  # noqa: E402
from run import fraction_settings, graphs_or_exit, settings, single_peak  # noqa: E402

from baechi import Cluster, load_graph  # noqa: E402
from baechi.api import check_units_fit  # noqa: E402
from baechi.bounds import pack_units  # noqa: E402
from baechi.costmodel import CostModel  # noqa: E402
from baechi.errors import InfeasiblePlacement  # noqa: E402
from baechi.grouping import colocation_units  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"))
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="pack_units' time limit per setting (a request gives it at most "
                             "1 s or a tenth of its time_limit_s)")
    args = parser.parse_args()
    counts: collections.Counter[str] = collections.Counter()
    slowest = 0.0
    for path in graphs_or_exit(args.shared, quick=False):
        doc = json.loads(path.read_text())
        peak = single_peak(doc)
        graph = load_graph(doc)
        seen: set[tuple[int, int]] = set()
        for setting in [*settings(doc, peak), *fraction_settings(peak, FRACTIONS)]:
            if setting.memory_bytes is None or (setting.memory_bytes, setting.devices) in seen:
                continue
            seen.add((setting.memory_bytes, setting.devices))
            cluster = Cluster.parse(setting.cluster)
            cost = CostModel(graph, cluster)
            units = colocation_units(graph, cluster)
            try:
                check_units_fit(graph, cluster, units, cost)
            except InfeasiblePlacement:
                counts["a unit fits no device"] += 1
                continue
            tick = time.perf_counter()
            packing = pack_units(graph, cluster, units, cost, args.seconds)
            seconds = time.perf_counter() - tick
            slowest = max(slowest, seconds)
            counts[packing.status] += 1
            if packing.status != "packed":
                missing = f", {packing.missing_bytes} bytes missing at least" \
                    if packing.status == "impossible" else ""
                print(f"{path.parent.name}/{path.stem} on {setting.devices} devices at "
                      f"{setting.memory}: "
                      f"{packing.status} in {seconds:.3f} s{missing}")
    print(", ".join(f"{status}: {n}" for status, n in counts.most_common()),
          f"(slowest check {slowest:.3f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
