"""Dependencies of the routes: the caller's tenant, the request body, the shared clients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from baechi.service.errors import ApiError
from baechi.service.settings import ANONYMOUS_TENANT, Settings, key_digest
from baechi.service.store import Store
from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader
from redis import Redis
from rq import Queue

api_key_header = APIKeyHeader(
    name="X-API-Key", auto_error=False,
    description="Each key is one tenant; tenants never see each other's graphs or placements.",
)


@dataclass
class Services:
    """What the app opened at startup; one per process, shared by all requests."""

    settings: Settings
    redis: Redis
    store: Store
    queue: Queue


def get_services(request: Request) -> Services:
    return request.app.state.services


def get_tenant(
    request: Request, key: Annotated[str | None, Security(api_key_header)] = None
) -> str:
    """The tenant of the ``X-API-Key`` header (401 when missing or unknown)."""
    settings: Settings = request.app.state.settings
    if not key:
        if settings.allow_anonymous:
            return ANONYMOUS_TENANT
        raise ApiError(401, "unauthorized", "missing X-API-Key header",
                       headers={"WWW-Authenticate": "ApiKey"})
    tenant = settings.tenants.get(key_digest(key))
    if tenant is None:
        raise ApiError(401, "unauthorized", "unknown API key",
                       headers={"WWW-Authenticate": "ApiKey"})
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
