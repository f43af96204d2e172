"""Placement algorithms and their registry.

Each algorithm is a function ``place_x(problem) -> Assignment`` (see :mod:`.base`).
"""

from __future__ import annotations

from baechi.algorithms.base import Algorithm, Assignment, Problem
from baechi.algorithms.cut import place_cut
from baechi.algorithms.etf import place_eft, place_etf
from baechi.algorithms.exact import place_exact
from baechi.algorithms.fill import place_fill
from baechi.algorithms.sct import place_sct
from baechi.algorithms.single import place_single
from baechi.algorithms.throughput import place_contiguous, place_split
from baechi.algorithms.topo import place_topo
from baechi.defaults import DEFAULT_ALGORITHM
from baechi.errors import InvalidRequest

#: Algorithm name → function, as accepted by ``place`` and the API.
ALGORITHMS: dict[str, Algorithm] = {
    "single": place_single,
    "m-topo": place_topo,
    "m-etf": place_etf,
    "m-eft": place_eft,
    "m-sct": place_sct,
    "m-fill": place_fill,
    "m-cut": place_cut,
    "exact": place_exact,
}

#: The throughput objective's placers (docs/format.md §10), for ``objective: "throughput"`` only
#: (they balance loads and check persistent memory, not one step's peak).
THROUGHPUT_ALGORITHMS: dict[str, Algorithm] = {
    "throughput-contiguous": place_contiguous,
    "throughput-cpsat": place_split,
}


#: Every name a request may give: ``auto`` (the portfolio of :func:`baechi.place`) and each
#: algorithm of :data:`ALGORITHMS`.
ALGORITHM_NAMES = ("auto", *ALGORITHMS, *THROUGHPUT_ALGORITHMS)


def get_algorithm(name: str, objective: str = "step_time") -> Algorithm:
    """The algorithm called ``name``; :class:`InvalidRequest` lists the known ones. Every
    algorithm serves the throughput objective; the throughput placers only that one."""
    if name in THROUGHPUT_ALGORITHMS:
        if objective != "throughput":
            raise InvalidRequest(
                f"algorithm: {name!r} places for objective 'throughput'; add "
                f"objective='throughput' or choose one of {', '.join(ALGORITHMS)}",
                {"field": "algorithm"},
            )
        return THROUGHPUT_ALGORITHMS[name]
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise InvalidRequest(
            f"algorithm: unknown algorithm {name!r}; choose one of {', '.join(ALGORITHM_NAMES)}",
            {"field": "algorithm"},
        ) from None


__all__ = [
    "ALGORITHMS",
    "ALGORITHM_NAMES",
    "DEFAULT_ALGORITHM",
    "THROUGHPUT_ALGORITHMS",
    "Algorithm",
    "Assignment",
    "Problem",
    "get_algorithm",
]
