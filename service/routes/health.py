"""``/healthz`` (the process answers), ``/readyz`` (Redis and a worker), ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from baechi.service.deps import ServicesDep
from baechi.service.errors import ApiError, responses
from baechi.service.metrics import live_workers
from baechi.service.schemas import Health, Ready

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", summary="Redis is reachable and at least one worker is alive",
            responses=responses(503))
def readyz(services: ServicesDep) -> Ready:
    services.redis.ping()
    workers = live_workers(services.queue, services.settings.worker_ttl_s)
    if workers == 0:
        raise ApiError(503, "no_worker", "no worker is alive: placements would wait in the queue",
                       {"workers": 0}, headers={"Retry-After": "5"})
    return Ready(status="ready", redis="ok", workers=workers)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition format."}})
def metrics(request: Request) -> Response:
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/favicon.ico", include_in_schema=False)
def favicon() -> Response:
    """No icon: browsers opening a report ask for one; 204 keeps their consoles clean."""
    return Response(status_code=204)
