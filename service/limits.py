"""Body size limit, enforced before the body is read (pure ASGI, so it also covers streams)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from baechi.service.errors import ApiError, error_response


class BodyTooLarge(ApiError):
    def __init__(self, limit: int) -> None:
        super().__init__(413, "too_large", f"the request body exceeds this server's limit of "
                         f"{limit} bytes", {"max_body_bytes": limit})


class BodySizeLimit:
    """Refuse bodies over ``limit`` bytes with 413.

    A ``Content-Length`` over the limit is refused before reading a byte; a chunked body is
    counted as it streams and refused as soon as it passes the limit, so the server never
    buffers more than ``limit`` bytes of one request.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            exc = BodyTooLarge(self.limit)
            response = error_response(413, exc.code, exc.message, exc.details,
                                      {"Connection": "close"})
            await response(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, limited, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
