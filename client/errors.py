"""Exceptions of the client: one root, :class:`BaechiError`, and one flat subclass per case.

Errors that come from the service carry its JSON error (``{"error": {"code", "message",
"details"}}``, docs/format.md §7) in :attr:`~BaechiError.code`, :attr:`~BaechiError.message` and
:attr:`~BaechiError.details`, and the HTTP status in :attr:`~BaechiError.status`.
"""

from __future__ import annotations

from typing import Any


class BaechiError(Exception):
    """Root of every error the client raises on purpose.

    Attributes
    ----------
    message : str
        What went wrong (the server's message when it sent one).
    code : str
        Stable machine-readable code, e.g. ``invalid_graph`` (the server's when it sent one).
    details : dict
        The server's ``details`` (e.g. the op or field at fault).
    status : int or None
        HTTP status of the response, None when there was none.
    """

    code = "client_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        details: dict[str, Any] | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details or {}
        self.status = status

    def __str__(self) -> str:
        return self.message


class InvalidInput(BaechiError):
    """The request was refused as malformed or invalid (HTTP 400, 422), or bad local input."""

    code = "invalid_request"


class Unauthorized(BaechiError):
    """No API key, or one the server does not know (HTTP 401)."""

    code = "unauthorized"


class NotFound(BaechiError):
    """No such placement or graph for this API key (HTTP 404)."""

    code = "not_found"


class Conflict(BaechiError):
    """Not possible in the placement's current status, e.g. its plan is not ready (HTTP 409)."""

    code = "conflict"


class Gone(BaechiError):
    """What the request refers to has expired on the server (HTTP 410)."""

    code = "gone"


class PayloadTooLarge(BaechiError):
    """The request body is larger than the server accepts (HTTP 413)."""

    code = "too_large"


class ServiceUnavailable(BaechiError):
    """The service could not be reached, or answered 503, after every retry."""

    code = "unavailable"


class ServerError(BaechiError):
    """The server failed (HTTP 5xx) or answered something that is not the API's."""

    code = "server_error"


class PlacementFailed(BaechiError):
    """The placement job ended ``failed``; ``code``/``message`` are the job's error."""

    code = "placement_failed"


class PlacementCanceled(BaechiError):
    """The placement was canceled before it produced a plan."""

    code = "canceled"


class WaitTimeout(BaechiError):
    """:meth:`Placement.wait <client.Placement.wait>` ran out of time; the job goes on."""

    code = "timeout"


class ProfileError(BaechiError):
    """The model or its training step cannot be profiled as asked."""

    code = "profile_error"


class PlanMismatch(BaechiError):
    """A plan does not fit this model or these local devices."""

    code = "plan_mismatch"


#: HTTP status → exception class for error responses.
STATUS_ERRORS: dict[int, type[BaechiError]] = {
    400: InvalidInput,
    401: Unauthorized,
    403: Unauthorized,
    404: NotFound,
    409: Conflict,
    410: Gone,
    413: PayloadTooLarge,
    422: InvalidInput,
    503: ServiceUnavailable,
}


def error_for_status(status: int) -> type[BaechiError]:
    """The exception class for an HTTP error status."""
    if status in STATUS_ERRORS:
        return STATUS_ERRORS[status]
    if status >= 500:
        return ServerError
    return InvalidInput


__all__ = [
    "BaechiError",
    "Conflict",
    "Gone",
    "InvalidInput",
    "NotFound",
    "PayloadTooLarge",
    "PlacementCanceled",
    "PlacementFailed",
    "PlanMismatch",
    "ProfileError",
    "ServerError",
    "ServiceUnavailable",
    "Unauthorized",
    "WaitTimeout",
    "error_for_status",
]
