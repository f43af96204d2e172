"""``POST /graphs`` (upload a graph once) and ``GET /graphs/{graph_id}``."""

from __future__ import annotations

from fastapi import APIRouter, Response

from baechi.jobs.store import GraphInfo
from baechi.service.deps import RawBody, ServicesDep, Tenant
from baechi.service.errors import ApiError, responses
from baechi.service.schemas import GraphUploaded
from baechi.service.validation import parse_graph, parse_json

router = APIRouter(tags=["graphs"])


@router.post(
    "/graphs", status_code=201, summary="Upload a graph; refer to it by graph_id afterwards",
    responses={**responses(400, 401, 413, 415, 422),
               200: {"model": GraphUploaded, "description": "The graph was already uploaded."}},
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/GraphDoc"}}}}},
)
def upload_graph(tenant: Tenant, body: RawBody, services: ServicesDep,
                 response: Response) -> GraphUploaded:
    graph = parse_graph(parse_json(body), services.settings, field="graph")
    created = services.store.put_graph(
        tenant, graph.graph_id, graph.document, name=graph.name, ops=graph.ops,
        edges=graph.edges, pins=graph.pins, ttl_s=services.settings.graph_ttl_s,
    )
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/graphs/{graph.graph_id}"
    return GraphUploaded(graph_id=graph.graph_id, name=graph.name, ops=graph.ops,
                         edges=graph.edges, size_bytes=len(graph.document))


@router.get("/graphs/{graph_id}", summary="An uploaded graph's summary",
            responses=responses(401, 404))
def get_graph(graph_id: str, tenant: Tenant, services: ServicesDep) -> GraphUploaded:
    info = services.store.graph_info(tenant, graph_id)
    if info is None:
        raise ApiError(404, "not_found", f"no graph {graph_id}", {"graph_id": graph_id})
    return _summary(info)


def _summary(info: GraphInfo) -> GraphUploaded:
    return GraphUploaded(graph_id=info.graph_id, name=info.name, ops=info.ops, edges=info.edges,
                         size_bytes=info.size_bytes)
