"""Placement algorithms and their registry.

Each algorithm is a function ``place_x(problem) -> Assignment`` (see :mod:`.base`).
"""

from __future__ import annotations

from baechi.algorithms.base import Algorithm, Assignment, Problem
from baechi.algorithms.etf import place_etf
from baechi.algorithms.exact import place_exact
from baechi.algorithms.fill import place_fill
from baechi.algorithms.sct import place_sct
from baechi.algorithms.single import place_single
from baechi.algorithms.topo import place_topo
from baechi.defaults import DEFAULT_ALGORITHM
from baechi.errors import InvalidRequest

#: Algorithm name → function, as accepted by ``place`` and the API.
ALGORITHMS: dict[str, Algorithm] = {
    "single": place_single,
    "m-topo": place_topo,
    "m-etf": place_etf,
    "m-sct": place_sct,
    "m-fill": place_fill,
    "exact": place_exact,
}


#: Every name a request may give: ``auto`` (the portfolio of :func:`baechi.place`) and each
#: algorithm of :data:`ALGORITHMS`.
ALGORITHM_NAMES = ("auto", *ALGORITHMS)


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called ``name``; :class:`InvalidRequest` lists the known ones."""
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
    "Algorithm",
    "Assignment",
    "Problem",
    "get_algorithm",
]
