"""Exceptions of the placement engine.

One root, :class:`PlacementError`; each subclass carries a stable ``code`` that the
service puts in its JSON errors and the CLI maps to an exit status.
"""

from __future__ import annotations

from typing import Any


class PlacementError(Exception):
    """Root of every error the engine raises on purpose."""

    code = "placement_error"
    #: Exit status of the ``baechi`` CLI for this error.
    exit_status = 1

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class InvalidGraph(PlacementError):
    """The graph document breaks the ``baechi.graph/v1`` format (docs/format.md §2)."""

    code = "invalid_graph"
    exit_status = 2


class InvalidCluster(PlacementError):
    """The cluster description (devices, network) is malformed (docs/format.md §3)."""

    code = "invalid_cluster"
    exit_status = 2


class InvalidRequest(PlacementError):
    """The algorithm or its options are unknown or malformed."""

    code = "invalid_request"
    exit_status = 2


class InvalidPlan(PlacementError):
    """A plan does not fit its graph: missing ops, inconsistent orders, split groups."""

    code = "invalid_plan"
    exit_status = 2


class InfeasiblePlacement(PlacementError):
    """No placement within the devices' memory was found.

    ``plan``: when a placer completed an assignment it believes overshoots memory (m-fill's
    walk past an op that fitted nowhere), that assignment, for the caller to replay and
    repair; ``None`` otherwise. It is never part of :meth:`to_dict`.
    """

    code = "infeasible"
    exit_status = 3
    plan: Any = None


class MissingExtra(PlacementError):
    """A command needs an optional dependency group (``pip install 'baechi[extra]'``)."""

    code = "missing_extra"
    exit_status = 2
