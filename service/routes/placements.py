"""``/placements``: submit, poll, list, cancel, and fetch the plan and its report.

Routes are sync (RQ and redis-py are), so FastAPI runs them in its thread pool and a large
graph being validated never blocks the event loop.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Annotated

from baechi.service import jobs
from baechi.service.deps import RawBody, Services, ServicesDep, Tenant
from baechi.service.errors import ApiError, responses
from baechi.service.lifecycle import View, resolve
from baechi.service.schemas import (
    ErrorInfo,
    GraphSummary,
    Links,
    PlacementAccepted,
    PlacementPage,
    PlacementStatus,
    Progress,
)
from baechi.service.store import PlacementRecord
from baechi.service.validation import parse_json, parse_placement
from fastapi import APIRouter, Query, Response
from fastapi.responses import HTMLResponse

router = APIRouter(tags=["placements"])

#: Hard upper bound of ``limit`` in the schema; the server's ``max_page_size`` may be lower.
PAGE_LIMIT = 1000


@router.post(
    "/placements", status_code=202, summary="Submit a placement request (DESIGN §3)",
    responses={**responses(400, 401, 413, 415, 422),
               202: {"description": "Accepted (or an identical earlier request's placement).",
                     "headers": {"Location": {"schema": {"type": "string"},
                                              "description": "URL of the placement."}}}},
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/PlacementRequest"}}}}},
)
def submit(tenant: Tenant, body: RawBody, services: ServicesDep,
           response: Response) -> PlacementAccepted:
    settings, store = services.settings, services.store

    def uploaded(graph_id: str) -> tuple[str, int, dict[str, str]] | None:
        info = store.graph_info(tenant, graph_id)
        return (info.name, info.ops, info.pins) if info is not None else None

    request = parse_placement(parse_json(body), settings, uploaded)
    if request.graph is not None:
        graph = request.graph
        store.put_graph(tenant, graph.graph_id, graph.document, name=graph.name, ops=graph.ops,
                        edges=graph.edges, pins=graph.pins, ttl_s=settings.graph_ttl_s)
    elif not store.touch_graph(tenant, request.graph_id, settings.graph_ttl_s):
        raise ApiError(422, "unknown_graph", f"graph_id: graph {request.graph_id} expired",
                       {"field": "graph_id"})
    record = store.create(PlacementRecord(
        id=uuid.uuid4().hex, tenant=tenant, status="queued", created_at=time.time(),
        graph_id=request.graph_id, graph_name=request.graph_name, graph_ops=request.graph_ops,
        algorithm=request.algorithm, timeout_s=request.timeout_s,
        request={"cluster": request.cluster, "options": request.options},
    ))
    winner = store.claim(tenant, request.digest, record.id, settings.result_ttl_s)
    response.headers["Location"] = f"/placements/{winner}"
    if winner != record.id:
        # An identical request of this tenant is alive (or finished): that is the answer.
        store.discard(record)
        view = _view(services, tenant, winner)
        response.headers["Idempotent-Replayed"] = "true"
        return PlacementAccepted(id=winner, status=view.status, links=_links(winner))
    jobs.enqueue(services.queue, record.id, record.timeout_s, settings)
    return PlacementAccepted(id=record.id, status="queued", links=_links(record.id))


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
    # Expired placements leave ids behind in the index; skip (and drop) them until the page
    # is full, so a page is short only at the end.
    while len(items) < size and more:
        rows = store.page(tenant, before, size - len(items))
        more = len(rows) == size - len(items)
        if not rows:
            break
        ids = [pid for pid, _ in rows]
        records = store.get_many(ids)
        live = [r for r in records if r is not None and r.tenant == tenant]
        store.forget(tenant, [pid for pid, r in zip(ids, records, strict=True) if r is None])
        pending = [r for r in live if not r.terminal]
        found = dict(zip([r.id for r in pending],
                         jobs.fetch_many(services.redis, [r.id for r in pending]), strict=True))
        items += [_status(resolve(store, settings, r, found.get(r.id))) for r in live]
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
        job = jobs.fetch(services.redis, placement_id)
        if job is not None and previous not in ("finished", "failed"):
            jobs.cancel(services.redis, job)
        view = _view(services, tenant, placement_id)
    return _status(view)


@router.get(
    "/placements/{placement_id}/plan", summary="The plan (DESIGN §5) of a finished placement",
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
    responses={**responses(401, 404, 409, 410, 501),
               200: {"description": "Timeline, memory over time, summary.",
                     "content": {"text/html": {"schema": {"type": "string"}}}}},
)
def get_report(placement_id: str, tenant: Tenant, services: ServicesDep) -> HTMLResponse:
    view = _ready(services, tenant, placement_id)
    store = services.store
    plan = store.plan(placement_id)
    if plan is None:
        raise ApiError(404, "not_found", f"the plan of placement {placement_id} expired",
                       {"id": placement_id})
    document = store.graph_document(tenant, view.record.graph_id)
    if document is None:
        raise ApiError(410, "graph_expired", f"the graph of placement {placement_id} expired; "
                       "the plan is still available at its /plan URL",
                       {"graph_id": view.record.graph_id})
    # Imported here: the report pulls in plotting code the rest of the API never needs.
    from baechi import load_graph
    from baechi.plan import Plan

    try:
        from baechi.report import render_report
    except ImportError as exc:
        raise ApiError(501, "report_unavailable", f"HTML reports are not available: {exc}") \
            from None
    html = render_report(load_graph(document), Plan.model_validate_json(plan))
    return HTMLResponse(html)


# -------------------------------------------------------------------------------- helpers
def _view(services: Services, tenant: str, placement_id: str) -> View:
    """The placement's current view; 404 when missing or another tenant's."""
    record = services.store.get(placement_id)
    if record is None or record.tenant != tenant:
        raise ApiError(404, "not_found", f"no placement {placement_id}", {"id": placement_id})
    job = None
    if not record.terminal:
        # A job whose worker was killed is retried or failed here if its heartbeats stopped,
        # even when no idle worker is left to notice.
        jobs.reap_abandoned(services.queue)
        job = jobs.fetch(services.redis, placement_id)
        fresh = services.store.get(placement_id)
        record = fresh if fresh is not None else record
    return resolve(services.store, services.settings, record, job)


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
