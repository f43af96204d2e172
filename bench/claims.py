"""Claims against brute force, at scale, and named ``exact`` on the small benchmark graphs.

Usage::

    python bench/claims.py [--cases 10000] [--optima-ops 10,20] [--seconds 10]

1. ``--cases`` random tiny requests (:func:`baechi.testing.tiny_request`: colocation groups,
   pins, forward/backward pairs, memory limits, two device speeds, both network modes), each
   placed with default options by one algorithm in turn (``exact``, ``auto``,
   ``throughput-cpsat``, ``throughput-contiguous``, ``m-etf``, ``m-sct``) and checked by
   :func:`baechi.testing.claim_violations` against brute force: false ``optimal`` claims,
   ``bound_us`` above the best valid plan, invalid plans. The target is zero of each.
2. Named ``exact`` with default options (a request as users send it) on the small graphs of
   ``bench/optima.py`` (:func:`baechi.testing.small_cases`, parallel mode): the share it
   proves optimal within ``--seconds``, and the seconds it takes.

Writes ``bench/fragments/claims.md``; its first line is the command.
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from baechi import Cluster, load_graph, place  # noqa: E402
from baechi.errors import InfeasiblePlacement  # noqa: E402
from baechi.grouping import colocation_units  # noqa: E402
from baechi.testing import (  # noqa: E402
    brute_force,
    claim_violations,
    small_cases,
    tiny_request,
)

#: (algorithm, objective) in turn, one per case.
ROTATION = (("exact", "step_time"), ("auto", "step_time"),
            ("throughput-cpsat", "throughput"), ("throughput-contiguous", "throughput"),
            ("m-etf", "step_time"), ("m-sct", "step_time"))


def check_cases(cases: int) -> tuple[dict[str, collections.Counter], float]:
    """Per algorithm: cases placed, claimed optimal, with a bound, and each kind of violation."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    tick = time.perf_counter()
    for seed in range(cases):
        algorithm, objective = ROTATION[seed % len(ROTATION)]
        doc, cluster = tiny_request(random.Random(seed))
        tally = counts[algorithm]
        tally["cases"] += 1
        try:
            plan = place(doc, cluster, algorithm, {"time_limit_s": 5}, objective=objective)
        except InfeasiblePlacement:
            tally["no plan"] += 1
            if objective == "step_time" and feasible(doc, cluster):
                tally["no plan, one exists"] += 1
            continue
        tally["optimal claimed"] += bool(plan.stats.optimal)
        tally["bound given"] += plan.stats.bound_us is not None
        for problem in claim_violations(doc, cluster, plan, objective):
            kind = ("false optimal" if problem.startswith("optimal") else
                    "bound above a valid plan" if problem.startswith("bound_us") else
                    "invalid plan")
            tally[kind] += 1
            print(f"seed {seed} {algorithm}: {problem}", flush=True)
    return counts, time.perf_counter() - tick


def feasible(doc: dict, cluster: dict) -> bool:
    """Whether some plan of the request fits memory (brute force)."""
    graph, parsed = load_graph(doc), Cluster.parse(cluster)
    return brute_force(graph, parsed, colocation_units(graph, parsed))[0] < float("inf")


def exact_on_small_graphs(ops: tuple[int, ...], seconds: float) -> list[tuple[int, bool, float]]:
    """(ops, proved, seconds) of named ``exact`` with default options on each small case."""
    rows = []
    for case in small_cases(seeds=1, ops=ops, mode="parallel"):
        tick = time.perf_counter()
        plan = place(case.graph, case.cluster, "exact", {"time_limit_s": seconds})
        rows.append((len(case.graph["ops"]), bool(plan.stats.optimal),
                     time.perf_counter() - tick))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--optima-ops", default="10,20")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "fragments" / "claims.md")
    args = parser.parse_args()
    command = "python bench/claims.py " + " ".join(sys.argv[1:])
    counts, spent = check_cases(args.cases)
    ops = tuple(int(x) for x in args.optima_ops.split(","))
    exact_rows = exact_on_small_graphs(ops, args.seconds)
    kinds = ("false optimal", "bound above a valid plan", "invalid plan")
    lines = [f"<!-- {command} -->", "## Claims against brute force (`bench/claims.py`)", "",
             f"{args.cases:,} random tiny requests (3–6 ops; colocation groups, pins, "
             "forward/backward pairs, memory limits, two device speeds, both network modes), "
             "default options, one algorithm per request in turn, every claim checked against "
             f"the best valid plan found by enumeration ({spent:.0f} s).", "",
             "| algorithm | requests | no plan | no plan, one exists | `optimal` claimed | "
             "`bound_us` given | "
             + " | ".join(kinds) + " |", "|---|" + "---:|" * (5 + len(kinds))]
    for algorithm, _ in ROTATION:
        c = counts[algorithm]
        lines.append(f"| {algorithm} | {c['cases']} | {c['no plan']} | "
                     f"{c['no plan, one exists']} | {c['optimal claimed']} "
                     f"| {c['bound given']} | " + " | ".join(str(c[k]) for k in kinds) + " |")
    total = sum(counts[a][k] for a, _ in ROTATION for k in kinds)
    lines += ["", f"Violations in all: **{total}**.", "",
              "Named `exact` with default options (the reduction pipeline on, as a request "
              "without options gets it) on the small graphs of `bench/optima.py` (parallel "
              f"mode), `time_limit_s` {args.seconds:g}: below its size limit it places the "
              "graph itself.", "", "| ops | cases | proved optimal | median s | max s |",
              "|---:|---:|---:|---:|---:|"]
    for n in ops:
        group = [r for r in exact_rows if r[0] == n]
        proved = sum(r[1] for r in group)
        times = [r[2] for r in group]
        lines.append(f"| {n} | {len(group)} | {proved} ({proved / len(group):.0%}) | "
                     f"{statistics.median(times):.2f} | {max(times):.2f} |")
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
