"""The FastAPI application: :func:`create_app` wires settings, Redis, routes and middleware."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from baechi._version import __version__
from baechi.jobs import queue as jobqueue
from baechi.jobs.connection import connect
from baechi.jobs.settings import Settings, get_settings
from baechi.jobs.store import Store
from baechi.plan import Plan
from baechi.service import errors
from baechi.service.deps import Services, TenantRate
from baechi.service.limits import BodySizeLimit
from baechi.service.metrics import Metrics, RequestMetrics
from baechi.service.routes import graphs, health, placements
from baechi.service.schemas import PlacementRequest

DESCRIPTION = """Placement as a service for ML training graphs (docs/format.md §7).

Submit a profiled graph and a cluster, poll the placement, fetch the plan. Authenticate with
`X-API-Key`. Errors are JSON `{"error": {"code", "message", "details"}}`."""


#: Responses from this size on are gzip-compressed when the client accepts it.
GZIP_MIN_BYTES = 4096


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the API for ``settings`` (read from ``BAECHI_*`` when omitted).

    Redis is connected lazily: the app starts even when Redis is down and answers 503 until
    it is back (``baechi serve`` checks Redis before starting, to fail loudly).
    """
    settings = settings or get_settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        app.state.services.redis.close()

    app = FastAPI(title="Baechi placement service", version=__version__,
                  description=DESCRIPTION, lifespan=lifespan)
    redis = connect(settings.redis_url, socket_timeout=10.0)
    store = Store(redis)
    queue = jobqueue.make_queue(redis, settings)
    metrics.watch(store, queue, settings.worker_ttl_s)
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.services = Services(settings=settings, redis=redis, store=store, queue=queue,
                                  rate=TenantRate(settings.tenant_rate_per_s,
                                                  settings.tenant_burst))

    errors.install(app)
    # Added inner to outer: the metrics wrap the size limit, so refused bodies are counted.
    app.add_middleware(BodySizeLimit, limit=settings.max_body_bytes)
    # plans and report pages of large graphs weigh megabytes of repetitive JSON and HTML
    # (a 20k-op report: 10–14 MB); compressed for clients that accept gzip
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES)
    app.add_middleware(RequestMetrics, metrics=metrics)
    app.include_router(placements.router)
    app.include_router(graphs.router)
    app.include_router(health.router)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document plus the bodies the routes parse themselves (generated from the
    models they validate with: the request from the engine's models, the plan's)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description,
                         routes=app.routes)
    _, defs = models_json_schema(
        [(PlacementRequest, "validation"), (Plan, "serialization")],
        ref_template="#/components/schemas/{model}",
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in defs.get("$defs", {}).items():
        components.setdefault(name, definition)
    # Every error is JSON ErrorResponse, whatever the route's success media type (FastAPI would
    # document errors of the HTML report as text/html) and for parameter errors (FastAPI's
    # own 422 body is not what the handlers send).
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            for status, response in operation.get("responses", {}).items():
                if status[0] in "45":
                    response["content"] = error
                    response["description"] = errors.DESCRIPTIONS.get(
                        int(status), response.get("description", ""))
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    app.openapi_schema = schema
    return schema
