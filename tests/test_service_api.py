"""The placement API end to end: real API process, real Redis, real forking RQ workers."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import orjson
import pytest
from conftest import SHARED, needs_shared
from service_fixtures import Service, chain_graph, cluster, needs_redis

import baechi
from baechi.algorithms import ALGORITHMS

pytestmark = [needs_redis, pytest.mark.service]

GNMT = SHARED / "graphs" / "baechi" / "gnmt_baechi.json"
#: The best algorithm the engine has right now (m-etf once it exists).
ALGORITHM = "m-etf" if "m-etf" in ALGORITHMS else "single"
GNMT_CLUSTER = {"devices": {"count": 4, "memory_bytes": "8GiB"},
                "network": {"latency_us": 134, "bandwidth_gbps": 5.7}}


def unique_graph(n: int = 20) -> dict[str, Any]:
    """A graph no other test submits (so idempotency never links two tests)."""
    return chain_graph(n, name=f"g-{uuid.uuid4().hex[:8]}")


def submit(http: Any, graph: dict[str, Any] | None = None, **fields: Any) -> Any:
    body = {"graph": graph or unique_graph(), "cluster": cluster(), "algorithm": "single"}
    body.update(fields)
    return http.post("/placements", json=body)


def assert_error(response: Any, status: int, code: str | None = None,
                 mentions: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details"}
    if code is not None:
        assert error["code"] == code, error
    if mentions is not None:
        assert mentions in error["message"], error
    return error


# ------------------------------------------------------------------------ full flow
@needs_shared
def test_gnmt_end_to_end_plan_validates_under_the_simulator(service: Service) -> None:
    document = orjson.loads(GNMT.read_bytes())
    with service.client() as http:
        created = http.post("/placements", json={"graph": document, "cluster": GNMT_CLUSTER,
                                                 "algorithm": ALGORITHM})
        assert created.status_code == 202, created.text
        body = created.json()
        pid = body["id"]
        assert created.headers["location"] == f"/placements/{pid}"
        assert body["status"] in ("queued", "running", "finished")
        assert body["links"]["plan"] == f"/placements/{pid}/plan"

        status = service.wait(pid)
        assert status["status"] == "finished", status
        assert status["error"] is None
        assert status["progress"] == {"phase": "done", "fraction": 1.0}
        assert status["created_at"] <= status["started_at"] <= status["finished_at"]
        assert status["graph"]["ops"] == 2494 and status["graph"]["name"] == "gnmt_baechi"

        response = http.get(f"/placements/{pid}/plan")
        assert response.status_code == 200
        plan = response.json()
    graph = baechi.load_graph(document)
    assert plan["format"] == "baechi.plan/v1"
    assert set(plan["placement"]) == set(graph.names)
    assert plan["graph"]["sha256"] == graph.sha256 == status["graph"]["graph_id"]
    estimate = baechi.simulate(graph, plan)
    assert estimate.step_time_us == pytest.approx(plan["estimate"]["step_time_us"])
    assert estimate.peak_memory_bytes == plan["estimate"]["peak_memory_bytes"]


def test_graph_upload_once_then_place_by_graph_id(service: Service) -> None:
    graph = unique_graph(30)
    with service.client() as http:
        first = http.post("/graphs", json=graph)
        assert first.status_code == 201, first.text
        uploaded = first.json()
        assert uploaded["ops"] == 30 and uploaded["name"] == graph["name"]
        assert uploaded["graph_id"] == baechi.load_graph(graph).sha256
        assert first.headers["location"] == f"/graphs/{uploaded['graph_id']}"
        again = http.post("/graphs", json=graph)
        assert again.status_code == 200 and again.json() == uploaded
        assert http.get(f"/graphs/{uploaded['graph_id']}").json() == uploaded

        created = http.post("/placements", json={"graph_id": uploaded["graph_id"],
                                                 "cluster": cluster(), "algorithm": "single"})
        assert created.status_code == 202, created.text
        pid = created.json()["id"]
        assert service.wait(pid)["status"] == "finished"
        plan = http.get(f"/placements/{pid}/plan").json()
        assert set(plan["placement"]) == {op["name"] for op in graph["ops"]}


# --------------------------------------------------------------------- idempotency
def test_identical_request_returns_the_same_placement(service: Service) -> None:
    graph = unique_graph()
    with service.client() as http:
        first = submit(http, graph)
        # Key order, size spelling and explicit defaults do not make a request different.
        reordered = dict(reversed(list(copy.deepcopy(graph).items())))
        same = http.post("/placements", json={
            "algorithm": "single", "cluster": cluster(),
            "options": {"fusion": True, "co_placement": True},
            "graph": reordered})
        other_algorithm = submit(http, graph, algorithm="m-topo") \
            if "m-topo" in ALGORITHMS else None
        other_cluster = submit(http, graph, cluster=cluster(count=3))
    assert first.status_code == same.status_code == 202
    assert same.json()["id"] == first.json()["id"]
    assert same.headers["location"] == first.headers["location"]
    assert same.headers.get("idempotent-replayed") == "true"
    assert other_cluster.json()["id"] != first.json()["id"]
    if other_algorithm is not None:
        assert other_algorithm.json()["id"] != first.json()["id"]
    # Another tenant sending the same request gets its own placement.
    with service.client("key-b") as http:
        theirs = submit(http, graph)
    assert theirs.status_code == 202 and theirs.json()["id"] != first.json()["id"]
    assert service.wait(first.json()["id"])["status"] == "finished"


def test_a_failed_placement_is_not_replayed(service: Service) -> None:
    graph = chain_graph(10, name=f"big-{uuid.uuid4().hex[:6]}", nbytes=10**6)
    too_small = cluster(count=2, memory=1000)
    with service.client() as http:
        first = submit(http, graph, cluster=too_small)
        failed = service.wait(first.json()["id"])
        assert failed["status"] == "failed"
        assert failed["error"]["code"] == "infeasible", failed
        assert failed["error"]["message"]
        again = submit(http, graph, cluster=too_small)
    assert again.status_code == 202
    assert again.json()["id"] != first.json()["id"]


# ---------------------------------------------------------------------- isolation
def test_tenants_never_see_each_others_placements_plans_or_graphs(service: Service) -> None:
    graph = unique_graph()
    with service.client("key-a") as a, service.client("key-b") as b:
        pid = submit(a, graph).json()["id"]
        graph_id = a.post("/graphs", json=graph).json()["graph_id"]
        assert service.wait(pid)["status"] == "finished"
        for path in (f"/placements/{pid}", f"/placements/{pid}/plan",
                     f"/placements/{pid}/report", f"/graphs/{graph_id}"):
            assert_error(b.get(path), 404, "not_found")
            assert a.get(path).status_code == 200, path
        assert_error(b.delete(f"/placements/{pid}"), 404, "not_found")
        # b cannot place a's uploaded graph by its id either.
        response = b.post("/placements", json={"graph_id": graph_id, "cluster": cluster()})
        assert_error(response, 422, "unknown_graph")
        assert pid not in {p["id"] for p in b.get("/placements?limit=100").json()["items"]}
        assert pid in {p["id"] for p in a.get("/placements?limit=100").json()["items"]}


# --------------------------------------------------------------------- pagination
def test_listing_is_newest_first_and_paginated(service: Service) -> None:
    # Tenant key-b is shared with other tests: compare against our own ids only.
    with service.client("key-b") as http:
        ids = [submit(http).json()["id"] for _ in range(5)]
        seen: list[str] = []
        cursor = None
        for _ in range(50):
            params: dict[str, Any] = {"limit": 2}
            if cursor:
                params["cursor"] = cursor
            page = http.get("/placements", params=params)
            assert page.status_code == 200, page.text
            body = page.json()
            assert len(body["items"]) <= 2
            seen += [item["id"] for item in body["items"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert len(seen) == len(set(seen)), "a placement appeared on two pages"
        mine = [pid for pid in seen if pid in ids]
        assert mine == list(reversed(ids)), "not newest first"
        for pid in ids:
            service.wait(pid, key="key-b")


# -------------------------------------------------------------------- error statuses
def test_400_malformed_json(service: Service) -> None:
    with service.client() as http:
        for path in ("/placements", "/graphs"):
            response = http.post(path, content=b'{"graph": {', headers={
                "Content-Type": "application/json"})
            assert_error(response, 400, "malformed_json", "not valid JSON")
            assert_error(http.post(path, content=b""), 400, "malformed_json")


def test_401_missing_or_unknown_key(service: Service) -> None:
    with service.client(None) as http:
        assert_error(http.get("/placements"), 401, "unauthorized", "missing X-API-Key")
        assert_error(submit(http), 401, "unauthorized")
        response = http.get("/placements", headers={"X-API-Key": "not-a-key"})
        assert_error(response, 401, "unauthorized", "unknown API key")
        assert http.get("/healthz").status_code == 200  # health needs no key


def test_404_unknown_ids(service: Service) -> None:
    with service.client() as http:
        for path in ("/placements/nope", f"/placements/{uuid.uuid4().hex}",
                     f"/placements/{uuid.uuid4().hex}/plan", "/graphs/" + "0" * 64):
            assert_error(http.get(path), 404, "not_found")
        assert_error(http.get("/no/such/route"), 404)


def test_409_plan_not_ready_and_cancel_after_end(service: Service) -> None:
    graph = chain_graph(10, name=f"big-{uuid.uuid4().hex[:6]}", nbytes=10**6)
    with service.client() as http:
        failed = submit(http, graph, cluster=cluster(count=2, memory=1000)).json()["id"]
        assert service.wait(failed)["status"] == "failed"
        assert_error(http.get(f"/placements/{failed}/plan"), 409, "not_ready", "failed")
        assert_error(http.get(f"/placements/{failed}/report"), 409, "not_ready")
        assert_error(http.delete(f"/placements/{failed}"), 409, "already_ended")
        done = submit(http).json()["id"]
        assert service.wait(done)["status"] == "finished"
        assert_error(http.delete(f"/placements/{done}"), 409, "already_ended", "finished")


def test_413_body_too_large_before_it_is_read(service: Service) -> None:
    limit = 16 * 2**20
    with service.client() as http:
        big = b" " * (limit + 1)
        error = assert_error(http.post("/placements", content=big, headers={
            "Content-Type": "application/json"}), 413, "too_large")
        assert error["details"]["max_body_bytes"] == limit

        def chunks() -> Any:  # no Content-Length: counted while streaming
            for _ in range(17):
                yield b" " * 2**20

        assert_error(http.post("/graphs", content=chunks()), 413, "too_large")
        assert http.get("/healthz").status_code == 200


def test_422_invalid_requests_name_the_op_or_field(service: Service) -> None:
    graph = unique_graph(5)
    cyclic = copy.deepcopy(graph)
    cyclic["edges"].append({"src": "op4", "dst": "op0", "bytes": 1})
    negative = copy.deepcopy(graph)
    negative["ops"][2]["compute_us"] = -1
    pinned = copy.deepcopy(graph)
    pinned["ops"][3]["device"] = "/GPU:7"
    too_many = chain_graph(50001, name="huge")
    cases = [
        ({"graph": cyclic, "cluster": cluster()}, "invalid_graph", "cycle"),
        ({"graph": negative, "cluster": cluster()}, "invalid_graph", "'op2'"),
        ({"graph": pinned, "cluster": cluster()}, "invalid_request", "'op3'"),
        ({"graph": graph, "cluster": cluster(), "algorithm": "magic"}, "invalid_request",
         "algorithm"),
        ({"graph": graph, "cluster": {"devices": {"count": 0}}}, "invalid_cluster", "count"),
        ({"graph": graph, "cluster": {"devices": {"count": 1, "memory_bytes": 1e30}}},
         "invalid_cluster", "memory_bytes"),
        ({"graph": graph, "cluster": cluster(), "options": {"time_limit_s": -1}},
         "invalid_request", "time_limit_s"),
        ({"graph": graph, "cluster": cluster(), "colour": "red"}, "invalid_request", "colour"),
        ({"graph": graph, "graph_id": "0" * 64, "cluster": cluster()}, "invalid_request",
         "exactly one"),
        ({"graph_id": "f" * 64, "cluster": cluster()}, "unknown_graph", "graph_id"),
        ({"graph": graph}, "invalid_request", "cluster"),
        ([1, 2, 3], "invalid_request", "request"),
        ({"graph": too_many, "cluster": cluster()}, "too_many_ops", "50000"),
    ]
    with service.client() as http:
        for body, code, mentions in cases:
            assert_error(http.post("/placements", json=body), 422, code, mentions)
        assert_error(http.post("/graphs", json=negative), 422, "invalid_graph", "'op2'")
        assert_error(http.post("/graphs", json=too_many), 422, "too_many_ops")
        assert_error(http.get("/placements", params={"limit": 0}), 422, "invalid_request",
                     "limit")
        assert_error(http.get("/placements", params={"cursor": "x"}), 422, "invalid_request")


def test_503_when_redis_is_down(make_service: Any) -> None:
    stack = make_service(workers=0)
    with stack.client() as http:
        error = assert_error(http.get("/readyz"), 503, "no_worker")
        assert error["details"] == {"workers": 0}
        stack.redis.stop()
        try:
            error = assert_error(http.get("/placements"), 503, "redis_unavailable")
            assert stack.redis.url.rsplit("/", 1)[0].split("//")[1] in error["message"]
            assert_error(submit(http), 503, "redis_unavailable")
            assert_error(http.get("/readyz"), 503)
            assert http.get("/healthz").status_code == 200
            assert "baechi_redis_up 0.0" in http.get("/metrics").text
        finally:
            stack.redis.start()
        assert http.get("/placements").status_code == 200


# ------------------------------------------------------------------ health, metrics
def test_health_ready_and_metrics(service: Service) -> None:
    with service.client() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        ready = http.get("/readyz").json()
        assert ready["status"] == "ready" and ready["workers"] >= 2
        pid = submit(http).json()["id"]
        service.wait(pid)
        text = http.get("/metrics").text
    assert 'baechi_http_requests_total{method="POST",route="/placements",status="202"}' in text
    assert 'baechi_jobs{status="queued"}' in text
    assert 'baechi_jobs_ended_total{status="finished"}' in text
    assert "baechi_placement_seconds_count" in text
    count = next(line for line in text.splitlines()
                 if line.startswith("baechi_placement_seconds_count"))
    assert float(count.split()[-1]) >= 1


def test_report_is_html(service: Service) -> None:
    pytest.importorskip("baechi.report", reason="baechi/report.py is not written yet")
    with service.client() as http:
        pid = submit(http).json()["id"]
        assert service.wait(pid)["status"] == "finished"
        response = http.get(f"/placements/{pid}/report")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    assert "<html" in response.text.lower()


# ---------------------------------------------------------- hostile input (issue 12)
def test_a_body_that_is_not_json_by_content_type_is_refused_with_415(service: Service) -> None:
    body = orjson.dumps({"graph": unique_graph(), "cluster": cluster(), "algorithm": "single"})
    with service.client() as http:
        for path in ("/placements", "/graphs"):
            response = http.post(path, content=body,
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
            error = assert_error(response, 415, "unsupported_media_type", "not JSON")
            assert error["details"]["content_type"] == "application/x-www-form-urlencoded"
        accepted = http.post("/placements", content=body,
                             headers={"Content-Type": "application/json; charset=utf-8"})
        assert accepted.status_code == 202, accepted.text


def test_invented_http_methods_share_one_metrics_label(service: Service) -> None:
    with service.client() as http:
        for i in range(20):
            http.request(f"BREW{i}", "/healthz")
        text = http.get("/metrics").text
    assert "BREW" not in text
    assert 'method="other"' in text


def test_a_device_list_is_capped_like_the_count(service: Service) -> None:
    devices = [{"name": f"/GPU:{i}"} for i in range(4097)]
    with service.client() as http:
        response = submit(http, cluster={"devices": devices})
    assert_error(response, 422, mentions="devices")


def test_overflowing_numbers_are_422_naming_the_field_and_keep_the_connection(
        service: Service) -> None:
    graph = {"format": "baechi.graph/v1",
             "ops": [{"name": f"o{i}", "compute_us": 1,
                      "persistent_bytes": 9223372036854775807} for i in range(2)]}
    with service.client() as http:
        response = submit(http, graph=graph)
        assert_error(response, 422, mentions="persistent_bytes")
        response = submit(http, cluster={"devices": {"count": 2, "memory_bytes": "1e400"}})
        assert_error(response, 422, mentions="memory_bytes")
        assert response.headers.get("connection", "keep-alive") != "close"


def test_large_responses_are_gzipped_for_clients_that_accept_it(service: Service) -> None:
    with service.client() as http:
        created = submit(http, graph=unique_graph(400))
        pid = created.json()["id"]
        assert service.wait(pid, timeout=120)["status"] == "finished"
        zipped = http.get(f"/placements/{pid}/plan", headers={"Accept-Encoding": "gzip"})
        plain = http.get(f"/placements/{pid}/plan", headers={"Accept-Encoding": "identity"})
    assert zipped.headers["content-encoding"] == "gzip"
    assert "content-encoding" not in plain.headers
    assert zipped.json() == plain.json()  # httpx decodes it: the same plan
    assert int(zipped.headers["content-length"]) < len(plain.content) / 3


def test_favicon_is_204_for_browsers_opening_a_report(service: Service) -> None:
    with service.client(key=None) as http:
        response = http.get("/favicon.ico")
    assert response.status_code == 204 and not response.content
