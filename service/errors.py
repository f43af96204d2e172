"""JSON errors ``{"error": {"code", "message", "details"}}`` and their OpenAPI documentation.

Every way a request can fail maps to one of the statuses of format.md §7; handlers here make sure
even framework errors (unknown route, bad query parameter) and Redis outages use that shape.
A 500 is left only for bugs.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from baechi.errors import PlacementError
from baechi.service.schemas import ErrorResponse

log = logging.getLogger(__name__)

#: What each documented error status means, for the OpenAPI descriptions.
DESCRIPTIONS = {
    400: "Malformed JSON body.",
    401: "Missing or unknown `X-API-Key`.",
    404: "No such placement or graph for this tenant (another tenant's ids are never found).",
    409: "Not possible in the placement's current status (plan not ready, already ended).",
    410: "The graph this placement was made from expired; the plan is still available.",
    413: "Request body larger than the server's limit.",
    415: "Request body declared with a Content-Type that is not JSON.",
    422: "Invalid graph, cluster, algorithm, options or parameter; names the op or field. "
         "Also an `Idempotency-Key` sent before with a different request.",
    429: "The tenant's request rate or number of queued and running placements is at its "
         "limit; retry after `Retry-After` seconds.",
    500: "The report could not be rendered (its worker crashed, or ran out of time or memory).",
    501: "HTML reports are not available in this installation.",
    503: "Redis unreachable, (readiness) no worker alive, or (report) still being rendered.",
}

_CODES = {400: "malformed_json", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed",
          409: "conflict", 413: "too_large", 415: "unsupported_media_type",
          422: "invalid_request", 429: "rate_limited", 503: "unavailable"}


class ApiError(Exception):
    """An error response with a stable ``code`` and a message naming the culprit."""

    def __init__(self, status: int, code: str, message: str,
                 details: dict[str, Any] | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
        self.headers = headers


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def error_response(status: int, code: str, message: str,
                   details: dict[str, Any] | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(code, message, details), status_code=status, headers=headers)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for these error statuses (plus 503, always possible, and
    429 wherever a tenant is authenticated)."""
    out: dict[int | str, dict[str, Any]] = {}
    tenant = {429} if 401 in statuses else set()
    for status in sorted({*statuses, *tenant, 503}):
        out[status] = {"model": ErrorResponse, "description": DESCRIPTIONS[status]}
    return out


def install(app: FastAPI) -> None:
    """Register the handlers that turn every failure into the JSON error shape."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.details, exc.headers)

    @app.exception_handler(PlacementError)
    async def _placement_error(request: Request, exc: PlacementError) -> JSONResponse:
        return error_response(422, exc.code, exc.message, exc.details)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        field = ".".join(str(part) for part in first.get("loc", ()) if part not in ("query",
                                                                                    "path"))
        return error_response(422, "invalid_request", f"{field or 'request'}: {first['msg']}",
                              {"field": field, "errors": len(errors)})

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _CODES.get(exc.status_code, "http_error")
        message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
        return error_response(exc.status_code, code, message, None,
                              getattr(exc, "headers", None))

    @app.exception_handler(RedisError)
    async def _redis(request: Request, exc: RedisError) -> JSONResponse:
        settings = request.app.state.settings
        log.warning("Redis error on %s %s: %s", request.method, request.url.path, exc)
        return error_response(
            503, "redis_unavailable",
            f"the service cannot reach Redis at {settings.redis_url_redacted}; retry later",
            headers={"Retry-After": "5"},
        )

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", "internal server error")
