"""Reproductions of a hostile user's probe of the running service (issue 12, items 8–14).

Real API process, real Redis (AOF), real forking RQ workers; every case once failed (a 500, a
job lost or killed, a read that wrote, one tenant exhausting the API) and must keep holding.
"""

from __future__ import annotations

import gzip
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from service_fixtures import Service, chain_graph, cluster, needs_redis, wait_until

from baechi.testing import layered

pytestmark = [needs_redis, pytest.mark.service]


def unique_graph(n: int = 20) -> dict[str, Any]:
    return chain_graph(n, name=f"g-{uuid.uuid4().hex[:8]}")


def body(**fields: Any) -> dict[str, Any]:
    request = {"graph": unique_graph(), "cluster": cluster(), "algorithm": "single"}
    request.update(fields)
    return request


def error_of(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    if code is not None:
        assert error["code"] == code, error
    return error


def nested(depth: int) -> dict[str, Any]:
    deep: dict[str, Any] = {}
    cursor = deep
    for _ in range(depth):
        cursor["x"] = {}
        cursor = cursor["x"]
    return deep


# --------------------------------------------------------------- items 9–10: bad numbers
def _op(**fields: Any) -> dict[str, Any]:
    return {"name": "a", "compute_us": 1, **fields}


def _graph(*ops: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"format": "baechi.graph/v1", "name": f"g-{uuid.uuid4().hex[:8]}", "ops": list(ops),
            **extra}


HOSTILE = {
    "memory 1e400": ({"cluster": {"devices": {"count": 2, "memory_bytes": "1e400"}}},
                     "memory_bytes"),
    "memory 1e308GiB": ({"cluster": {"devices": [{"name": "x", "memory_bytes": "1e308GiB"}]}},
                        "memory_bytes"),
    "attrs nested 300 deep": ({"graph": _graph(_op(attrs=nested(300)))}, "attrs"),
    "meta nested 300 deep": ({"graph": _graph(_op(), meta=nested(300))}, "meta"),
    "compute_us 1e308 with m-SCT": (
        {"graph": _graph(*[_op(name=f"o{i}", compute_us=1e308) for i in range(5)]),
         "algorithm": "m-sct"}, "compute_us"),
    "speed 1e-308": ({"cluster": {"devices": [{"name": "x", "speed": 1e-308}]}}, "speed"),
    "persistent_bytes int64 max": (
        {"graph": _graph(*[_op(name=f"o{i}", persistent_bytes=2**63 - 1) for i in range(2)])},
        "persistent_bytes"),
    "forward_op naming itself": ({"graph": _graph(_op(forward_op="a"))}, "forward_op"),
    "one group on two devices": (
        {"graph": _graph(_op(colocation_group="g", device="/GPU:0"),
                         _op(name="b", colocation_group="g", device="/GPU:1"))}, "device"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_input_is_422_naming_the_field_on_a_kept_connection(
        service: Service, case: str) -> None:
    fields, field = HOSTILE[case]
    with service.client() as http:
        response = http.post("/placements", json=body(**fields))
        error = error_of(response, 422)
        assert field in error["message"], error
        assert response.headers.get("connection", "keep-alive") != "close"
        # nothing was created: the tenant's listing does not show it
        listed = http.get("/placements", params={"limit": 100}).json()["items"]
    assert all(item["graph"]["name"] != fields.get("graph", {}).get("name") for item in listed)


# ------------------------------------------------------------- item 8: reads only read
WRITES = ("set", "setex", "hset", "hsetnx", "hincrby", "hincrbyfloat", "del", "unlink",
          "expire", "pexpire", "zadd", "zrem", "sadd", "srem", "lpush", "rpush", "lrem",
          "incr", "evalsha", "eval", "multi", "exec", "hdel", "rename", "setnx")


def _write_calls(redis: Any) -> int:
    stats = redis.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in WRITES)


def test_get_routes_never_write_and_reports_are_rendered_once_by_a_worker(
        make_service: Any) -> None:
    stack: Service = make_service(workers=1)
    redis = stack.redis.client()
    with stack.client() as http:
        pid = http.post("/placements", json=body(graph=unique_graph(300))).json()["id"]
        assert stack.wait(pid)["status"] == "finished"
        # the worker renders the report after the plan, from its report queue
        wait_until(lambda: redis.hget(f"baechi:report:{pid}", "status") == b"ready", 60,
                   "the worker to render the report")
        stored = gzip.decompress(redis.hget(f"baechi:report:{pid}", "html"))
        for worker in stack.workers:  # no heartbeats from here on: only the API talks
            stack.kill_worker(worker)
        before = _write_calls(redis)
        for path in ("", "/plan", "/report"):
            assert http.get(f"/placements/{pid}{path}").status_code == 200
        assert http.get("/placements").status_code == 200
        with ThreadPoolExecutor(max_workers=8) as pool:
            pages = list(pool.map(
                lambda _: http.get(f"/placements/{pid}/report",
                                   headers={"Accept-Encoding": "gzip"}), range(8)))
        plain = http.get(f"/placements/{pid}/report", headers={"Accept-Encoding": "identity"})
        assert _write_calls(redis) == before
    for page in pages:
        assert page.status_code == 200 and page.headers["content-encoding"] == "gzip"
        assert page.content == stored  # httpx decoded the stored bytes: nothing re-rendered
    assert "content-encoding" not in plain.headers and plain.content == stored
    assert b"<html" in stored.lower()


def test_a_dead_workers_job_is_settled_by_a_worker_not_by_a_get(make_service: Any) -> None:
    """A GET of a placement whose worker died reports it without writing; the next worker's
    maintenance writes the end (here: retried, then finished)."""
    import signal

    stack: Service = make_service(workers=0)
    doomed = stack.start_worker(BAECHI_WORKER_HOLD_S="60")
    with stack.client() as http:
        pid = http.post("/placements", json=body()).json()["id"]
        stack.wait(pid, statuses=("running",), timeout=30)
        stack.kill_worker(doomed, signal.SIGKILL)
        # past the heartbeat's grace (1 + 4 s here): the job is abandoned, which a GET used
        # to act on (requeue it, write the record)
        time.sleep(7)
        redis = stack.redis.client()
        before = _write_calls(redis)
        assert http.get(f"/placements/{pid}").json()["status"] == "running"
        assert _write_calls(redis) == before
        stack.start_worker()
        assert stack.wait(pid, timeout=120)["status"] == "finished"


# -------------------------------------------------------- item 14: idempotency, re-runs
def test_idempotency_key_header_and_explicit_rerun(service: Service) -> None:
    request = body()
    key = {"Idempotency-Key": uuid.uuid4().hex}
    with service.client() as http:
        first = http.post("/placements", json=request, headers=key)
        assert first.status_code == 202 and "idempotent-replayed" not in first.headers
        pid = first.json()["id"]
        again = http.post("/placements", json=request, headers=key)
        assert again.json()["id"] == pid and again.headers["idempotent-replayed"] == "true"
        other = http.post("/placements", json=body(), headers=key)
        error = error_of(other, 422, "idempotency_key_reused")
        assert "Idempotency-Key" in error["message"] and error["details"]["id"] == pid
        assert service.wait(pid)["status"] == "finished"
        # without a key an identical request answers with the finished placement ...
        assert http.post("/placements", json=request).json()["id"] == pid
        # ... unless it asks for a re-run
        rerun = http.post("/placements", json=request, params={"rerun": "true"})
        assert rerun.status_code == 202 and "idempotent-replayed" not in rerun.headers
        assert rerun.json()["id"] != pid
        assert service.wait(rerun.json()["id"])["status"] == "finished"


# ------------------------------------------------------- item 14: per-tenant limits
def test_one_tenant_cannot_exhaust_the_api(make_service: Any) -> None:
    stack: Service = make_service(workers=0, env={
        "BAECHI_TENANT_MAX_ACTIVE": "2", "BAECHI_TENANT_RATE_PER_S": "0.5",
        "BAECHI_TENANT_BURST": "6"})
    with stack.client("key-a") as a, stack.client("key-b") as b:
        for _ in range(2):
            assert a.post("/placements", json=body()).status_code == 202
        error = error_of(a.post("/placements", json=body()), 429, "too_many_active")
        assert error["details"]["max_active"] == 2
        assert b.post("/placements", json=body()).status_code == 202  # its own count
        # a's bucket (6) is spent after three more requests; b still has tokens
        codes = [a.get("/placements").status_code for _ in range(4)]
        assert codes[:3] == [200, 200, 200] and codes[3] == 429
        limited = a.get("/placements")
        error_of(limited, 429, "rate_limited")
        assert int(limited.headers["retry-after"]) >= 1
        assert b.get("/placements").status_code == 200
        assert a.get("/healthz").status_code == 200  # unauthenticated routes are not counted


# ----------------------------------------------------------- item 12: the deadline
def test_time_limit_gives_the_best_plan_by_the_deadline_not_a_timeout(
        make_service: Any) -> None:
    """The probe's 15k-op m-SCT with ``time_limit_s: 30`` failed ``timeout`` at 91 s. Here the
    job's timeout is time_limit_s + 5 s + 1 and m-SCT needs far longer unbounded."""
    stack: Service = make_service(workers=1, env={"BAECHI_JOB_OVERHEAD_S": "5"})
    graph = layered(1, 15000, 1.0)
    request = {"graph": graph, "cluster": {"devices": {"count": 4}, "network": {
        "latency_us": 10, "bandwidth_gbps": 5}}, "algorithm": "m-sct",
        "options": {"time_limit_s": 3}}
    with stack.client() as http:
        response = http.post("/placements", json=request)
        assert response.status_code == 202, response.text
        pid = response.json()["id"]
        status = stack.wait(pid, timeout=120)
        assert status["status"] == "finished", status
        plan = http.get(f"/placements/{pid}/plan").json()
    assert len(plan["placement"]) == 15000
    assert plan["estimate"]["step_time_us"] > 0


# -------------------------------------------------- the SDK's objective reaches a worker
def test_the_throughput_objective_reaches_the_worker(service: Service) -> None:
    request = body(objective="throughput", algorithm="throughput-contiguous")
    with service.client() as http:
        response = http.post("/placements", json=request)
        assert response.status_code == 202, response.text
        pid = response.json()["id"]
        assert service.wait(pid)["status"] == "finished"
        plan = http.get(f"/placements/{pid}/plan").json()
        step = http.post("/placements", json={**request, "objective": "step_time",
                                              "algorithm": "single"})
        assert step.status_code == 202 and step.json()["id"] != pid
    assert plan["estimate"]["time_per_sample_us"] is not None
