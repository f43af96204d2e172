"""Gap of every algorithm to the true optimum of tiny graphs under memory limits (brute force).

Usage::

    python bench/brute.py [--seeds 2] [--seconds 10] [--auto-seconds 2] [--quick]

``bench/optima.py`` measures against the optima ``exact`` proves. Under memory limits its
memory over time is a relaxation, and it proves only some of them, so the cases it cannot
prove are left out there. Here the optimum comes from enumeration
(:func:`baechi.testing.brute_force`: every placement of the units × every set of device
orders, each replayed by the simulator), and every case counts, proved or not: graphs of
:data:`baechi.testing.GENERATORS` with :func:`~baechi.testing.with_memory`, at the sizes,
device counts and memory shares of :data:`SETTINGS`, CCR 0.1, 1 and 10, links of 1 µs per
byte (:func:`~baechi.testing.small_cluster`), parallel mode. Then the same cases in
sequential mode, where a plan also orders each channel's transfers (the transfer-order
post-pass, ``exact``'s channel order) and the enumeration covers FIFO channels only: there the
reference is the best FIFO plan, which a plan can beat, and a plan can fit where no FIFO plan
does (a received copy is held from its transfer's start). The columns are
``bench/optima.py``'s. Writes ``bench/fragments/optima_brute.md`` (first line: the command;
named so that BENCHMARKS.md, which takes the fragments in name order, puts it after
``bench/optima.py``'s).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from optima import COLUMNS, SLACK, gap, gap_table, misses_line, proof_line, run_case  # noqa: E402


class Setting(NamedTuple):
    """Graphs of ``ops`` ops on ``devices`` devices, each with ``share`` of the graph's
    single-device peak."""

    ops: int
    devices: int
    share: float


#: The enumeration grows as devices ** units × topological orders: 8 ops on 2 devices and 6
#: on 3 take seconds each. The shares are where some plans fit and others do not (at 50% on
#: 2 devices, none of these graphs fits).
SETTINGS = tuple(Setting(ops, devices, share)
                 for ops, devices, shares in ((6, 2, (0.6, 0.8)), (8, 2, (0.6, 0.8)),
                                              (6, 3, (0.4, 0.6)))
                 for share in shares)

CCRS = (0.1, 1.0, 10.0)


def rows(seeds: int, seconds: float, auto_seconds: float, quick: bool,
         mode: str = "parallel") -> list[dict[str, Any]]:
    """Each case's brute-force optimum (``optimum_us`` when some plan fits; in sequential
    mode the best plan with FIFO channels) and columns."""
    from baechi import Cluster, load_graph
    from baechi.grouping import colocation_units
    from baechi.simulate import single_device_run
    from baechi.testing import GENERATORS, brute_force, small_cluster, with_memory

    out = []
    for setting in SETTINGS[:2] if quick else SETTINGS:
        for _shape, generate in sorted(GENERATORS.items()):
            for seed in range(seeds):
                for ccr in CCRS:
                    doc = with_memory(generate(seed=seed, ops=setting.ops, ccr=ccr))
                    graph = load_graph(doc)
                    peak = single_device_run(graph, Cluster.uniform(1))[1]
                    cluster = small_cluster(setting.devices, mode,
                                            memory_bytes=int(setting.share * peak))
                    parsed = Cluster.parse(cluster)
                    best, _, _ = brute_force(graph, parsed, colocation_units(graph, parsed),
                                             max_plans=5_000_000)
                    row = run_case(doc["name"], doc, cluster, seconds, auto_seconds)
                    row["setting"] = (f"{setting.ops} ops, {setting.devices} x "
                                      f"{setting.share:.0%}")
                    if math.isfinite(best):
                        row["optimum_us"] = best
                    # a column's plan where brute force found none: in parallel mode a defect
                    # of one of them, in sequential mode one that fits in its channel order
                    row["impossible"] = [c for c, step in row["steps"].items()
                                         if step is not None and not math.isfinite(best)]
                    print(f"{mode} {row['setting']} {doc['name']}: optimum {best}, exact "
                          f"{row['steps']['exact']} (proved {row.get('proved')}), auto "
                          f"{row['steps']['auto']}", flush=True)
                    out.append(row)
    return out


def at_optimum(row: dict[str, Any], column: str) -> bool:
    """Whether ``column``'s plan of ``row``'s case meets the optimum (float noise aside)."""
    found = gap(row, column)
    return found is not None and found <= SLACK


def markdown(command: str, cases: list[dict[str, Any]], sequential: list[dict[str, Any]],
             seconds: float, auto_seconds: float, elapsed: float) -> str:
    with_plan = [r for r in cases if "optimum_us" in r]
    impossible = sum(len(r["impossible"]) for r in cases)
    unproved = [r for r in with_plan if not r.get("proved")]
    auto_found = sum(at_optimum(r, "auto") for r in unproved)
    out = [f"<!-- generated by `{command}` in {elapsed:.0f} s -->",
           "## Gap to the true optimum under memory limits (`bench/brute.py`)", "",
           f"Tiny graphs (`baechi.testing.GENERATORS` with `with_memory`, CCR "
           f"{', '.join(f'{c:g}' for c in CCRS)}), each device at a share of the graph's "
           "single-device peak, 1 µs per byte, parallel mode; the optimum by enumeration "
           "(`baechi.testing.brute_force`: every placement × every set of device orders, "
           "replayed), so the cases `exact` cannot prove count too. Mean of step / optimum "
           "− 1 over the cases where some plan fits; columns as in `bench/optima.py` "
           f"(`auto` with `time_limit_s` {auto_seconds:g}, `exact` {seconds:g}). "
           f"{len(with_plan)} of {len(cases)} cases have a plan. "
           + proof_line(with_plan, seconds)
           + f" Of the {len(unproved)} it did not prove, `auto` found the optimum in "
           f"{auto_found}. Plans returned where none fits: {impossible}.", ""]
    out += [*gap_table(cases, "setting", "setting", known="with a plan"), misses_line(cases),
            "| at the optimum | | | "
            + " | ".join(str(sum(at_optimum(r, c) for r in with_plan)) for c in COLUMNS)
            + " |"]
    fifo = [r for r in sequential if "optimum_us" in r]
    out += ["", f"**Sequential mode**, the same cases: the reference is the best plan with FIFO "
            f"channels, found in {len(fifo)} of {len(sequential)} cases; a plan that orders "
            "its channels can beat it (a negative gap) or fit where no FIFO plan does (the "
            "last row). " + proof_line(fifo, seconds), "",
            *gap_table(sequential, "setting", "setting", known="with a FIFO plan"),
            misses_line(sequential),
            "| at or below it | | | "
            + " | ".join(str(sum(at_optimum(r, c) for r in fifo)) for c in COLUMNS) + " |",
            "| a plan, none with FIFO | | | "
            + " | ".join(str(sum(c in r["impossible"] for r in sequential)) for c in COLUMNS)
            + " |"]
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0, help="exact's time limit")
    parser.add_argument("--auto-seconds", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="the first two settings only")
    args = parser.parse_args()
    tick = time.perf_counter()
    cases = rows(args.seeds, args.seconds, args.auto_seconds, args.quick)
    sequential = rows(args.seeds, args.seconds, args.auto_seconds, args.quick, "sequential")
    command = " ".join(["python bench/brute.py", *sys.argv[1:]])
    text = markdown(command, cases, sequential, args.seconds, args.auto_seconds,
                    time.perf_counter() - tick)
    fragment = ROOT / "bench" / "fragments" / "optima_brute.md"
    fragment.write_text(text)
    print(text)
    print(f"wrote {fragment}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
