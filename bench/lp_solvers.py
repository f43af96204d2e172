"""Time the favourite-child LP of m-SCT with GLOP settings and PDLP on gnmt_baechi.

Usage: ``python bench/lp_solvers.py [--shared ../shared]``. Why GLOP's dual simplex is the
default (docs/decisions.md): it was 5x faster than the primal and 100x faster than PDLP here.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ortools.linear_solver import pywraplp  # noqa: E402

import baechi  # noqa: E402
from baechi.algorithms import sct  # noqa: E402
from baechi.algorithms.base import Problem  # noqa: E402
from baechi.grouping import colocation_units  # noqa: E402

SETTINGS = {
    "GLOP primal": ("GLOP", "primal"),
    "GLOP dual simplex": ("GLOP", "dual"),
    "PDLP": ("PDLP", None),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"))
    args = parser.parse_args()
    graph = baechi.load_graph(Path(args.shared) / "graphs" / "baechi" / "gnmt_baechi.json")
    cluster = baechi.Cluster.uniform(4, latency_us=134, bandwidth_gbps=5.7)
    problem = Problem.of(graph, cluster, colocation_units(graph, cluster))
    create = pywraplp.Solver.CreateSolver
    for label, (solver_name, parameters) in SETTINGS.items():
        def make(_: str, solver_name: str = solver_name) -> pywraplp.Solver:
            return create(solver_name)

        pywraplp.Solver.CreateSolver = make  # type: ignore[method-assign]
        sct.LP_ALGORITHM = parameters
        tick = time.perf_counter()
        _, stats = sct.favourite_children(problem)
        print(f"{label:18} {time.perf_counter() - tick:6.2f} s total, "
              f"{stats['lp_solve_seconds']:6.2f} s solve, "
              f"makespan {stats['lp_makespan_us']:.1f} µs")
    pywraplp.Solver.CreateSolver = create  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
