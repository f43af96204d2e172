"""HTTP transport of the client: authentication, retries with backoff, typed errors.

Every request is retried on connection errors and on ``502``/``503``/``504`` (honouring a
``Retry-After`` header), with exponential backoff and jitter. Retrying is safe for every call
of the API: ``POST /placements`` and ``POST /graphs`` are idempotent (docs/format.md §7). Error
responses become the exceptions of :mod:`baechi.client.errors`, carrying the server's JSON error.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import orjson

from baechi.client.errors import BaechiError, ServerError, ServiceUnavailable, error_for_status

#: Statuses that mean "try again later".
RETRY_STATUSES = frozenset({502, 503, 504})
USER_AGENT = "baechi-client/0.1"


class Transport:
    """One HTTP connection pool to a Baechi service.

    Parameters
    ----------
    url : str
        Base URL of the service, e.g. ``http://localhost:8000``.
    api_key : str or None
        Sent as ``X-API-Key``.
    timeout : float
        Seconds for each request (connect, read, write).
    retries : int
        How many times a failed request is tried again (so ``retries + 1`` attempts).
    backoff : float
        First wait in seconds; doubled after each attempt, capped at ``max_backoff``.
    transport : httpx.BaseTransport, optional
        For tests: an httpx transport to use instead of the network.
    sleep : callable, optional
        For tests: replaces :func:`time.sleep`.
    """

    def __init__(
        self,
        url: str,
        api_key: str | None,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not url or "://" not in url:
            raise BaechiError(f"server URL {url!r} must start with http:// or https://",
                              code="invalid_url")
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if api_key:
            headers["X-API-Key"] = api_key
        self.url = url.rstrip("/")
        self.retries = max(0, retries)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
    ) -> httpx.Response:
        """Send a request, retrying transient failures; return a 2xx response.

        Raises
        ------
        ServiceUnavailable
            Still unreachable or answering 503 after every retry.
        BaechiError
            The subclass for the response's status, with the server's error.
        """
        content = None
        headers = {}
        if body is not None:
            content = body if isinstance(body, bytes) else orjson.dumps(body)
            headers["Content-Type"] = "application/json"
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    method, path, content=content, params=params, headers=headers
                )
            except httpx.TransportError as exc:
                if attempt >= self.retries:
                    raise ServiceUnavailable(
                        f"cannot reach the Baechi service at {self.url} "
                        f"({type(exc).__name__}: {exc}) after {attempt + 1} attempts",
                        code="connection_failed",
                    ) from exc
                self._sleep(self._delay(attempt, None))
                attempt += 1
                continue
            if response.status_code in RETRY_STATUSES and attempt < self.retries:
                self._sleep(self._delay(attempt, response.headers.get("Retry-After")))
                attempt += 1
                continue
            if response.is_success:
                return response
            raise _error(response, method, path)

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """:meth:`request`, then the body parsed as JSON."""
        response = self.request(method, path, **kwargs)
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise ServerError(
                f"{method} {path}: the server answered {response.status_code} with a body that "
                "is not JSON",
                status=response.status_code,
            ) from None

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        """Seconds to wait before attempt ``attempt + 1``: ``Retry-After`` or backoff."""
        if retry_after is not None:
            try:
                return min(max(float(retry_after), 0.0), self.max_backoff)
            except ValueError:
                pass
        ceiling = min(self.backoff * (2**attempt), self.max_backoff)
        return ceiling / 2 + random.uniform(0, ceiling / 2)


def _error(response: httpx.Response, method: str, path: str) -> BaechiError:
    """The typed exception for an error response, carrying the server's JSON error."""
    status = response.status_code
    cls = error_for_status(status)
    try:
        error = orjson.loads(response.content)["error"]
        code, message = str(error["code"]), str(error["message"])
        details = error.get("details") or {}
        if not isinstance(details, dict):
            details = {"details": details}
    except (orjson.JSONDecodeError, KeyError, TypeError):
        text = response.text.strip().replace("\n", " ")[:200]
        code = None
        message = f"{method} {path}: HTTP {status}" + (f": {text}" if text else "")
        details = {}
    return cls(message, code=code, details=details, status=status)


__all__ = ["RETRY_STATUSES", "Transport"]
