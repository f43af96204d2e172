"""A/B of ``auto``'s m-EFT entries: what running m-EFT in the portfolio buys.

Usage::

    python bench/eft.py [--identical] [--seconds 2]

By default, ``auto`` without the m-EFT entries (A) against ``auto`` as it is (B) on the
clusters whose devices differ in speed, where ``auto`` runs m-EFT: bench/generated.py's
graphs on its three devices of speeds 1, 0.5, 0.5 (memory unlimited and at its share of each
graph's peak) and the shared graphs that hold memory on bench/clusters.py's mixed cluster
(both networks). ``--identical``: ``auto`` as it is (A: on identical devices m-EFT runs late,
with time left) against ``auto`` running m-EFT among the candidates there too (B), on
bench/run.py's memory-limited settings. The two runs of a
setting go back to back; prints the settings whose step times differ by more than 0.1% and
the geometric mean of B over A. Run on an idle machine: ``auto``'s plans depend on how much
work fits in its time limit. The numbers behind :data:`baechi.auto.PORTFOLIO`'s m-EFT note.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import clusters  # noqa: E402  (bench/ is not a package)
import generated  # noqa: E402
from compare import SAME, place_auto  # noqa: E402
from run import NETWORKS, geomean, graphs_or_exit, settings, single_peak  # noqa: E402

from baechi import auto  # noqa: E402


def mixed_settings(shared: str) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(label, graph, cluster) of every setting on devices of different speeds."""
    shape = generated.CLUSTERS[1]
    assert len(set(shape.speeds)) > 1
    for doc in generated.graphs(quick=False):
        for memory in (None, int(single_peak(doc) * shape.memory_share)):
            yield f"{doc['name']} {'unlimited' if memory is None else 'limited'}", doc, \
                generated.cluster(shape, memory)
    mixed = next(s for s in clusters.SHAPES if len({speed for speed, _ in s.devices}) > 1)
    for path in graphs_or_exit(shared, quick=False):
        doc = json.loads(path.read_text())
        peak = single_peak(doc)
        if peak:
            for name, network in NETWORKS.items():
                yield f"{path.stem} {name}", doc, clusters.cluster(mixed, network, peak)


def identical_settings(shared: str) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(label, graph, cluster) of bench/run.py's memory-limited settings."""
    for path in graphs_or_exit(shared, quick=False):
        doc = json.loads(path.read_text())
        for setting in settings(doc, single_peak(doc)):
            if setting.memory != "unlimited":
                yield f"{path.stem} {setting.network} {setting.memory}", doc, setting.cluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"))
    parser.add_argument("--identical", action="store_true")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    portfolio = auto.PORTFOLIO
    if args.identical:
        variants = (portfolio, tuple(dataclasses.replace(e, mixed_speeds=False)
                                     for e in portfolio))
        chosen = identical_settings(args.shared)
    else:
        variants = (tuple(e for e in portfolio if e.algorithm != "m-eft"), portfolio)
        chosen = mixed_settings(args.shared)
    ratios, seconds = [], ([], [])
    try:
        for label, doc, cluster in chosen:
            steps = []
            for variant, spent in zip(variants, seconds, strict=True):
                auto.PORTFOLIO = variant
                step, took = place_auto(doc, cluster, args.seconds)
                steps.append(step)
                spent.append(took)
            a, b = steps
            if a and b:
                ratios.append(b / a)
                if abs(b / a - 1) > SAME:
                    print(f"{label:48} A {a / 1e3:10.3f} ms  B {b / 1e3:10.3f} ms  "
                          f"B/A {b / a:.3f}", flush=True)
            elif a or b:
                print(f"{label:48} a plan from one variant only: A {a}, B {b}", flush=True)
    finally:
        auto.PORTFOLIO = portfolio
    print(f"settings {len(ratios)}: B / A geomean {geomean(ratios):.4f}, "
          f"B faster {sum(r < 1 - SAME for r in ratios)}, B slower "
          f"{sum(r > 1 + SAME for r in ratios)}; median seconds A "
          f"{statistics.median(seconds[0]):.2f}, B {statistics.median(seconds[1]):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
