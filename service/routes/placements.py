"""``/placements``: submit, poll, list, cancel, and fetch the plan and its report.

Routes are sync (RQ and redis-py are), so FastAPI runs them in its thread pool and a large
graph being validated never blocks the event loop. ``GET`` routes only read Redis: workers
run the maintenance and render each report once (issue 12, item 8).
"""

from __future__ import annotations

import gzip
import time
import uuid
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import HTMLResponse

from baechi.jobs import queue as jobqueue
from baechi.jobs.lifecycle import View, resolve
from baechi.jobs.store import KeyReused, PlacementRecord, TooManyActive
from baechi.service.deps import RawBody, Services, ServicesDep, Tenant
from baechi.service.errors import ApiError, responses
from baechi.service.schemas import (
    ErrorInfo,
    GraphSummary,
    Links,
    PlacementAccepted,
    PlacementPage,
    PlacementStatus,
    Progress,
)
from baechi.service.validation import parse_json, parse_placement

router = APIRouter(tags=["placements"])

#: Hard upper bound of ``limit`` in the schema; the server's ``max_page_size`` may be lower.
PAGE_LIMIT = 1000


@router.post(
    "/placements", status_code=202, summary="Submit a placement request (docs/format.md §3)",
    responses={**responses(400, 401, 413, 415, 422),
               202: {"description": "Accepted (or an identical earlier request's placement).",
                     "headers": {"Location": {"schema": {"type": "string"},
                                              "description": "URL of the placement."}}}},
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/PlacementRequest"}}}}},
)
def submit(
    tenant: Tenant, body: RawBody, services: ServicesDep, response: Response,
    idempotency_key: Annotated[str | None, Header(
        alias="Idempotency-Key", min_length=1, max_length=255,
        description="Names this request: sent again with the same body, it answers with the "
                    "same placement; with a different body, 422.")] = None,
    rerun: Annotated[bool, Query(
        description="Run it again even if an identical request already finished.")] = False,
) -> PlacementAccepted:
    settings, store = services.settings, services.store

    def uploaded(graph_id: str) -> tuple[str, int, dict[str, str]] | None:
        info = store.graph_info(tenant, graph_id)
        return (info.name, info.ops, info.pins) if info is not None else None

    request = parse_placement(parse_json(body), settings, uploaded)
    if request.graph is not None:
        # content-addressed and private to the tenant: harmless even if the submission fails
        graph = request.graph
        store.put_graph(tenant, graph.graph_id, graph.document, name=graph.name, ops=graph.ops,
                        edges=graph.edges, pins=graph.pins, ttl_s=settings.graph_ttl_s)
    elif not store.touch_graph(tenant, request.graph_id, settings.graph_ttl_s):
        raise ApiError(422, "unknown_graph", f"graph_id: graph {request.graph_id} expired",
                       {"field": "graph_id"})
    record = PlacementRecord(
        id=uuid.uuid4().hex, tenant=tenant, status="queued", created_at=time.time(),
        graph_id=request.graph_id, graph_name=request.graph_name, graph_ops=request.graph_ops,
        algorithm=request.algorithm, timeout_s=request.timeout_s,
        request={"cluster": request.cluster, "options": request.options,
                 "objective": request.objective},
    )
    try:
        submission = store.submit(
            record, request.digest, settings.result_ttl_s,
            lambda pipe: jobqueue.enqueue(services.queue, record.id, record.timeout_s, settings,
                                      pipeline=pipe),
            max_active=settings.tenant_max_active, key=idempotency_key, rerun=rerun)
    except KeyReused as exc:
        raise ApiError(422, "idempotency_key_reused", f"Idempotency-Key: this key was sent "
                       f"before with a different request (placement {exc.placement_id}); use "
                       "a new key for a new request", {"field": "Idempotency-Key",
                                                       "id": exc.placement_id}) from None
    except TooManyActive as exc:
        raise ApiError(429, "too_many_active", f"this tenant has {exc.active} placements queued "
                       f"or running, the server's limit of {settings.tenant_max_active}; wait "
                       "for one to end or cancel one", {"active": exc.active,
                                                       "max_active": settings.tenant_max_active},
                       headers={"Retry-After": "5"}) from None
    placement_id = submission.placement_id
    response.headers["Location"] = f"/placements/{placement_id}"
    if submission.replayed:
        # An identical request of this tenant is alive (or finished), or the same key was sent
        # before: that placement is the answer.
        view = _view(services, tenant, placement_id)
        response.headers["Idempotent-Replayed"] = "true"
        return PlacementAccepted(id=placement_id, status=view.status, links=_links(placement_id))
    return PlacementAccepted(id=placement_id, status="queued", links=_links(placement_id))


@router.get("/placements", summary="The caller's placements, newest first",
            responses=responses(401, 422))
def list_placements(
    tenant: Tenant,
    services: ServicesDep,
    limit: Annotated[int | None, Query(ge=1, le=PAGE_LIMIT,
                                       description="Page size (capped by the server).")] = None,
    cursor: Annotated[str | None, Query(pattern=r"^[0-9]{1,18}$", max_length=18,
                                        description="`next_cursor` of the previous page.")] = None,
) -> PlacementPage:
    settings, store = services.settings, services.store
    size = min(limit or settings.page_size, settings.max_page_size)
    before = int(cursor) if cursor is not None else None
    items: list[PlacementStatus] = []
    more = True
    # Expired placements leave ids behind in the index until a worker's sweep drops them;
    # skip them until the page is full, so a page is short only at the end.
    while len(items) < size and more:
        rows = store.page(tenant, before, size - len(items))
        more = len(rows) == size - len(items)
        if not rows:
            break
        ids = [pid for pid, _ in rows]
        records = store.get_many(ids)
        live = [r for r in records if r is not None and r.tenant == tenant]
        pending = [r for r in live if not r.terminal]
        found = dict(zip([r.id for r in pending],
                         jobqueue.fetch_many(services.redis, [r.id for r in pending]), strict=True))
        items += [_status(resolve(r, found.get(r.id))) for r in live]
        before = rows[-1][1]
    next_cursor = str(before) if more and items else None
    return PlacementPage(items=items, next_cursor=next_cursor)


@router.get("/placements/{placement_id}", summary="Status, progress and error of a placement",
            responses=responses(401, 404))
def get_placement(placement_id: str, tenant: Tenant, services: ServicesDep) -> PlacementStatus:
    return _status(_view(services, tenant, placement_id))


@router.delete("/placements/{placement_id}", summary="Cancel a queued or running placement",
               responses=responses(401, 404, 409))
def cancel_placement(placement_id: str, tenant: Tenant,
                     services: ServicesDep) -> PlacementStatus:
    view = _view(services, tenant, placement_id)
    if view.status in ("finished", "failed"):
        raise ApiError(409, "already_ended", f"placement {placement_id} already {view.status}; "
                       "only a queued or running placement can be canceled",
                       {"status": view.status})
    if view.status != "canceled":
        previous = services.store.transition(placement_id, "canceled",
                                             services.settings.result_ttl_s,
                                             finished_at=time.time())
        job = jobqueue.fetch(services.redis, placement_id)
        if job is not None and previous not in ("finished", "failed"):
            jobqueue.cancel(services.redis, job)
        view = _view(services, tenant, placement_id)
    return _status(view)


@router.get(
    "/placements/{placement_id}/plan", summary="The plan (format.md §5) of a finished placement",
    response_class=Response,
    responses={**responses(401, 404, 409),
               200: {"description": "The plan, format baechi.plan/v1.",
                     "content": {"application/json": {
                         "schema": {"$ref": "#/components/schemas/Plan"}}}}},
)
def get_plan(placement_id: str, tenant: Tenant, services: ServicesDep) -> Response:
    _ready(services, tenant, placement_id)
    plan = services.store.plan(placement_id)
    if plan is None:
        raise ApiError(404, "not_found", f"the plan of placement {placement_id} expired",
                       {"id": placement_id})
    return Response(plan, media_type="application/json")


@router.get(
    "/placements/{placement_id}/report", summary="HTML report of a finished placement",
    response_class=HTMLResponse,
    responses={**responses(401, 404, 409, 410, 500, 501),
               200: {"description": "Timeline, memory over time, summary.",
                     "content": {"text/html": {"schema": {"type": "string"}}}}},
)
def get_report(placement_id: str, tenant: Tenant, services: ServicesDep,
               request: Request) -> Response:
    """The report a worker rendered once when the placement finished (stored gzip-compressed,
    sent as is to clients that accept gzip). While it is still being rendered, wait up to
    ``report_wait_s``, then 503 with ``Retry-After``."""
    _ready(services, tenant, placement_id)
    store = services.store
    deadline = time.monotonic() + services.settings.report_wait_s
    stored = store.report(placement_id)
    while stored is None and time.monotonic() < deadline:
        time.sleep(0.2)
        stored = store.report(placement_id)
    if stored is None:
        if store.plan(placement_id) is None:
            raise ApiError(404, "not_found", f"the plan of placement {placement_id} expired",
                           {"id": placement_id})
        raise ApiError(503, "report_pending", f"the report of placement {placement_id} is "
                       "being rendered; retry shortly", {"id": placement_id},
                       headers={"Retry-After": "5"})
    html, error = stored
    if error is not None:
        status = {"report_unavailable": 501, "graph_expired": 410}.get(error.get("code"), 500)
        raise ApiError(status, error.get("code", "report_failed"), error.get("message", ""),
                       error.get("details") or {})
    assert html is not None
    headers = {"Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("accept-encoding", "").lower():
        return Response(html, media_type="text/html; charset=utf-8",
                        headers={**headers, "Content-Encoding": "gzip"})
    return Response(gzip.decompress(html), media_type="text/html; charset=utf-8",
                    headers=headers)


# -------------------------------------------------------------------------------- helpers
def _view(services: Services, tenant: str, placement_id: str) -> View:
    """The placement's current view; 404 when missing or another tenant's."""
    record = services.store.get(placement_id)
    if record is None or record.tenant != tenant:
        raise ApiError(404, "not_found", f"no placement {placement_id}", {"id": placement_id})
    job = None if record.terminal else jobqueue.fetch(services.redis, placement_id)
    return resolve(record, job)


def _ready(services: Services, tenant: str, placement_id: str) -> View:
    view = _view(services, tenant, placement_id)
    if view.status != "finished":
        raise ApiError(409, "not_ready", f"placement {placement_id} is {view.status}; the plan "
                       "exists once it is finished", {"status": view.status})
    return view


def _links(placement_id: str) -> Links:
    base = f"/placements/{placement_id}"
    return Links(self=base, plan=f"{base}/plan", report=f"{base}/report")


def _time(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value is not None else None


def _status(view: View) -> PlacementStatus:
    record = view.record
    return PlacementStatus(
        id=record.id, status=view.status,
        progress=Progress(phase=str(view.progress.get("phase", view.status)),
                          fraction=float(view.progress.get("fraction", 0.0))),
        error=ErrorInfo(**view.error) if view.error else None,
        created_at=_time(record.created_at),
        started_at=_time(view.started_at),
        finished_at=_time(view.finished_at),
        algorithm=record.algorithm,
        graph=GraphSummary(graph_id=record.graph_id, name=record.graph_name, ops=record.graph_ops),
        links=_links(record.id),
    )
