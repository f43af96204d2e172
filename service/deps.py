"""Dependencies of the routes: the caller's tenant, the request body, the shared clients."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader
from redis import Redis
from rq import Queue

from baechi.jobs.settings import ANONYMOUS_TENANT, Settings, key_digest
from baechi.jobs.store import Store
from baechi.service.errors import ApiError

api_key_header = APIKeyHeader(
    name="X-API-Key", auto_error=False,
    description="Each key is one tenant; tenants never see each other's graphs or placements.",
)


class TenantRate:
    """A token bucket per tenant: ``burst`` requests at once, ``rate_per_s`` on average.

    Kept in the API process (one bucket per tenant and process, nothing written to Redis),
    so a read stays a read; with several API processes a tenant gets the rate of each.
    """

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant → (tokens, when)
        self._lock = threading.Lock()

    def take(self, tenant: str) -> float:
        """Take one request's token; 0 when granted, else the seconds until one is free."""
        now = time.monotonic()
        with self._lock:
            tokens, then = self._buckets.get(tenant, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - then) * self.rate_per_s)
            if tokens >= 1.0:
                self._buckets[tenant] = (tokens - 1.0, now)
                return 0.0
            self._buckets[tenant] = (tokens, now)
            return (1.0 - tokens) / self.rate_per_s


@dataclass
class Services:
    """What the app opened at startup; one per process, shared by all requests."""

    settings: Settings
    redis: Redis
    store: Store
    queue: Queue
    rate: TenantRate


def get_services(request: Request) -> Services:
    return request.app.state.services


def get_tenant(
    request: Request, key: Annotated[str | None, Security(api_key_header)] = None
) -> str:
    """The tenant of the ``X-API-Key`` header (401 when missing or unknown, 429 when it
    exceeds its request rate)."""
    settings: Settings = request.app.state.settings
    if not key:
        if not settings.allow_anonymous:
            raise ApiError(401, "unauthorized", "missing X-API-Key header",
                           headers={"WWW-Authenticate": "ApiKey"})
        tenant = ANONYMOUS_TENANT
    else:
        found = settings.tenants.get(key_digest(key))
        if found is None:
            raise ApiError(401, "unauthorized", "unknown API key",
                           headers={"WWW-Authenticate": "ApiKey"})
        tenant = found
    wait_s = request.app.state.services.rate.take(tenant)
    if wait_s:
        raise ApiError(429, "rate_limited", f"too many requests: this server allows "
                       f"{settings.tenant_rate_per_s:g} per second per tenant (bursts of "
                       f"{settings.tenant_burst}); retry in {wait_s:.2f} s",
                       {"rate_per_s": settings.tenant_rate_per_s, "burst": settings.tenant_burst},
                       headers={"Retry-After": str(max(1, math.ceil(wait_s)))})
    return tenant


async def read_body(request: Request) -> bytes:
    """The raw body (the size limit middleware stops it at ``max_body_bytes``); a body whose
    ``Content-Type`` says it is not JSON is refused with 415 (no header: read as JSON)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        raise ApiError(415, "unsupported_media_type",
                       f"Content-Type {media!r} is not JSON; send application/json",
                       {"content_type": media})
    return await request.body()


ServicesDep = Annotated[Services, Depends(get_services)]
Tenant = Annotated[str, Depends(get_tenant)]
RawBody = Annotated[bytes, Depends(read_body)]
