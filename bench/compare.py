"""A/B of ``auto``: two variants of its tuning constants on the settings of ``bench/run.py``.

Usage::

    python bench/compare.py --b baechi.auto.SEARCH_PATIENCE=1000 [--a NAME=VALUE ...]
        [--seconds 2] [--all-memory] [--graph SUBSTRING ...] [--memory 50% ...]
        [--network pcie] [--fractions 0.5,0.6,0.7] [--csv out.csv]

Places every memory-limited setting of ``bench/run.py`` (``--all-memory``: the unlimited
ones too; ``--fractions``: instead, each graph that holds memory at these shares of its
single-device peak on 4 devices, both networks) with ``auto`` twice, once per variant, the
two runs of a setting back to back so that whatever else the machine does weighs on both
alike. A variant is a set of module constants, ``module.NAME=VALUE`` (the value parsed as
the constant's own type), set before each run and restored after. Prints the settings whose
step times differ by more than 0.1% and, per network and memory level, the geometric mean of
B's step over A's, the counts of B faster and slower, and the median seconds of each. Run
one at a time, on an idle machine: ``auto``'s plans depend on how much work fits in its time
limit.

It answers "does this change of a constant pay across the benchmark?" before the change is
made; BENCHMARKS.md (``bench/run.py``) remains the record of what main does.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from run import (  # noqa: E402  (bench/ is not a package)
    MEMORY_LEVELS,
    NETWORKS,
    Setting,
    fraction_settings,
    geomean,
    graphs_or_exit,
    settings,
    single_peak,
)

#: Relative difference of step times below which two runs count as equal.
SAME = 1e-3


def parse_assignment(text: str) -> tuple[Any, str, Any]:
    """``module.NAME=VALUE`` as (module, name, value), the value of the constant's type.

    >>> module, name, value = parse_assignment("baechi.auto.SEARCH_PATIENCE=5")
    >>> module.__name__, name, value
    ('baechi.auto', 'SEARCH_PATIENCE', 5)
    """
    target, _, raw = text.partition("=")
    module_name, _, name = target.rpartition(".")
    if not raw or not module_name:
        raise SystemExit(f"{text!r}: expected module.NAME=VALUE")
    module = importlib.import_module(module_name)
    if not hasattr(module, name):
        raise SystemExit(f"{text!r}: {module_name} has no {name}")
    current = getattr(module, name)
    if isinstance(current, bool):
        value: Any = raw.lower() in ("1", "true", "yes")
    elif isinstance(current, int | float | str):
        value = type(current)(raw)
    else:
        value = json.loads(raw)
        if isinstance(current, tuple):
            value = tuple(value)
    return module, name, value


@contextmanager
def variant(assignments: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Set the constants for the duration of the block."""
    saved = [(module, name, getattr(module, name)) for module, name, _ in assignments]
    for module, name, value in assignments:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def place_auto(doc: dict[str, Any], cluster: dict[str, Any], seconds: float
               ) -> tuple[float | None, float]:
    """``auto``'s step time (``None``: no plan) and the seconds it took."""
    from baechi import InfeasiblePlacement, place

    tick = time.perf_counter()
    try:
        plan = place(doc, cluster, "auto", {"time_limit_s": seconds})
    except InfeasiblePlacement:
        return None, time.perf_counter() - tick
    assert plan.estimate is not None
    return plan.estimate.step_time_us, time.perf_counter() - tick


def wanted(setting: Setting, args: argparse.Namespace) -> bool:
    """Whether the command line asks for ``setting``."""
    if setting.memory == "unlimited" and not args.all_memory:
        return False
    if args.memory and setting.memory not in args.memory:
        return False
    return not args.network or setting.network in args.network


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"))
    parser.add_argument("--a", action="append", default=[], metavar="module.NAME=VALUE")
    parser.add_argument("--b", action="append", default=[], metavar="module.NAME=VALUE")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--all-memory", action="store_true")
    parser.add_argument("--graph", action="append", default=[], metavar="SUBSTRING")
    parser.add_argument("--memory", action="append", default=[], choices=MEMORY_LEVELS)
    parser.add_argument("--network", action="append", default=[], choices=list(NETWORKS))
    parser.add_argument("--fractions", type=lambda text: [float(x) for x in text.split(",")],
                        metavar="0.6,0.7", help="instead of run.py's memory levels, these "
                        "shares of each graph's single-device peak")
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args()
    variants = {"a": [parse_assignment(t) for t in args.a],
                "b": [parse_assignment(t) for t in args.b]}
    rows: list[dict[str, Any]] = []
    for path in graphs_or_exit(args.shared, quick=False):
        if args.graph and not any(s in path.stem for s in args.graph):
            continue
        doc = json.loads(path.read_text())
        peak = single_peak(doc)
        chosen = fraction_settings(peak, args.fractions) if args.fractions else \
            settings(doc, peak)
        for setting in chosen:
            if not wanted(setting, args):
                continue
            row: dict[str, Any] = {"graph": path.stem, "network": setting.network,
                                   "memory": setting.memory}
            for key, assignments in variants.items():
                with variant(assignments):
                    row[key], row[f"{key}_s"] = place_auto(doc, setting.cluster, args.seconds)
            rows.append(row)
            a, b = row["a"], row["b"]
            if a and b and abs(b / a - 1) > SAME:
                print(f"{row['graph']:34} {row['network']:6} {row['memory']:9} "
                      f"A {a / 1e3:10.1f} ms  B {b / 1e3:10.1f} ms  B/A {b / a:.3f}", flush=True)
    print("\n| network | memory | settings | B / A | B faster | B slower | A s | B s |")
    print("|---|---|---|---|---|---|---|---|")
    for network in [*NETWORKS, "all"]:
        for memory in [*dict.fromkeys(r["memory"] for r in rows), "all"]:
            group = [r for r in rows if network in (r["network"], "all") and r["a"] and r["b"]
                     and memory in (r["memory"], "all")]
            if not group:
                continue
            ratios = [r["b"] / r["a"] for r in group]
            print(f"| {network} | {memory} | {len(group)} | {geomean(ratios):.4f} | "
                  f"{sum(x < 1 - SAME for x in ratios)} | {sum(x > 1 + SAME for x in ratios)} | "
                  f"{statistics.median(r['a_s'] for r in group):.2f} | "
                  f"{statistics.median(r['b_s'] for r in group):.2f} |")
    lost = [r for r in rows if bool(r["a"]) != bool(r["b"])]
    for r in lost:
        print(f"plan found by one variant only: {r}")
    if args.csv:
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["graph"])
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
