"""Measurements of the service (a benchmark, not part of the test suite)::

    .venv/bin/python -m pytest bench/service_bench.py -p service_fixtures -s -q

Prints: time to accept an 8 MB graph, gnmt_baechi end to end through the service versus
``baechi.place`` alone, and the throughput of 50 submissions with 1 and 2 workers.
"""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

import orjson
import pytest
from conftest import SHARED, needs_shared
from service_fixtures import Service, chain_graph, cluster, needs_redis

import baechi
from baechi.algorithms import ALGORITHMS

pytestmark = [needs_redis, needs_shared, pytest.mark.service]

GNMT = SHARED / "graphs" / "baechi" / "gnmt_baechi.json"
ALGORITHM = "m-etf" if "m-etf" in ALGORITHMS else "single"
GNMT_CLUSTER = {"devices": {"count": 4, "memory_bytes": "8GiB"},
                "network": {"latency_us": 134, "bandwidth_gbps": 5.7}}
BIG = {"BAECHI_MAX_BODY_BYTES": str(64 * 2**20), "BAECHI_MAX_OPS": "200000"}


def gnmt() -> dict[str, Any]:
    return orjson.loads(GNMT.read_bytes())


def scaled_gnmt(target_bytes: int, tag: str) -> dict[str, Any]:
    """Copies of gnmt_baechi side by side (ops renamed), chained, until ``target_bytes``."""
    base = gnmt()
    one = len(orjson.dumps(base))
    copies = max(1, round(target_bytes / one))
    ops: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    for k in range(copies):
        prefix = f"{tag}{k}/"
        for op in base["ops"]:
            renamed = dict(op, name=prefix + op["name"])
            if renamed.get("colocation_group"):
                renamed["colocation_group"] = prefix + renamed["colocation_group"]
            if renamed.get("forward_op"):
                renamed["forward_op"] = prefix + renamed["forward_op"]
            ops.append(renamed)
        for edge in base["edges"]:
            edges.append(dict(edge, src=prefix + edge["src"], dst=prefix + edge["dst"],
                              **({"tensor": prefix + edge["tensor"]} if edge.get("tensor")
                                 else {})))
    return {"format": "baechi.graph/v1", "name": f"gnmt_x{copies}", "ops": ops, "edges": edges}


def test_accept_an_8mb_graph(make_service: Any) -> None:
    stack: Service = make_service(workers=0, env=BIG)
    times, upload_times, sizes = [], [], []
    with stack.client(timeout=120) as http:
        for i in range(3):
            graph = scaled_gnmt(8 * 10**6, f"r{i}-{uuid.uuid4().hex[:4]}-")
            body = orjson.dumps({"graph": graph, "cluster": GNMT_CLUSTER,
                                 "algorithm": ALGORITHM})
            sizes.append(len(body))
            started = time.perf_counter()
            response = http.post("/placements", content=body,
                                 headers={"Content-Type": "application/json"})
            times.append(time.perf_counter() - started)
            assert response.status_code == 202, response.text
            graph["name"] += "-upload"
            document = orjson.dumps(graph)
            started = time.perf_counter()
            response = http.post("/graphs", content=document,
                                 headers={"Content-Type": "application/json"})
            upload_times.append(time.perf_counter() - started)
            assert response.status_code == 201, response.text
    print(f"\n8 MB graph ({statistics.mean(sizes) / 1e6:.1f} MB body, "
          f"{len(graph['ops'])} ops): POST /placements → 202 in "
          f"{statistics.median(times):.2f} s (median of 3: "
          f"{', '.join(f'{t:.2f}' for t in times)}); POST /graphs → 201 in "
          f"{statistics.median(upload_times):.2f} s")


def test_gnmt_through_the_service_vs_the_engine(make_service: Any) -> None:
    document = gnmt()
    engine = []
    for _ in range(3):
        started = time.perf_counter()
        baechi.place(baechi.load_graph(document), GNMT_CLUSTER, ALGORITHM)
        engine.append(time.perf_counter() - started)
    stack: Service = make_service(workers=1)
    service = []
    with stack.client() as http:
        for i in range(3):
            request = {"graph": document, "cluster": GNMT_CLUSTER, "algorithm": ALGORITHM,
                       "options": {"time_limit_s": 60 + i}}  # distinct: no idempotent replay
            started = time.perf_counter()
            pid = http.post("/placements", json=request).json()["id"]
            while http.get(f"/placements/{pid}").json()["status"] not in (
                    "finished", "failed"):
                time.sleep(0.01)
            assert http.get(f"/placements/{pid}/plan").status_code == 200
            service.append(time.perf_counter() - started)
    print(f"\ngnmt_baechi ({ALGORITHM}, 4 devices): engine alone (load_graph + place) "
          f"{statistics.median(engine):.2f} s; through the service (POST → finished → GET "
          f"plan, 10 ms polling) {statistics.median(service):.2f} s "
          f"(runs: {', '.join(f'{t:.2f}' for t in service)})")


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("kind", ["gnmt", "small"])
def test_throughput_of_fifty_submissions(make_service: Any, workers: int, kind: str) -> None:
    stack: Service = make_service(workers=workers)
    with stack.client() as http:
        if kind == "gnmt":
            graph_id = http.post("/graphs", json=gnmt()).json()["graph_id"]
            requests = [{"graph_id": graph_id, "cluster": GNMT_CLUSTER, "algorithm": ALGORITHM,
                         "options": {"time_limit_s": 60 + i}} for i in range(50)]
        else:
            requests = [{"graph": chain_graph(60, name=f"s{i}"), "cluster": cluster(),
                         "algorithm": "single"} for i in range(50)]
        started = time.perf_counter()
        ids = [http.post("/placements", json=r).json()["id"] for r in requests]
        submitted = time.perf_counter() - started
        pending = set(ids)
        while pending:
            page = http.get("/placements", params={"limit": 100}).json()["items"]
            for item in page:
                if item["status"] in ("finished", "failed"):
                    assert item["status"] == "finished", item
                    pending.discard(item["id"])
            time.sleep(0.2)  # (the poll itself costs the 2 cores some API time)
        elapsed = time.perf_counter() - started
    print(f"\n50 {kind} placements ({ALGORITHM if kind == 'gnmt' else 'single'}), {workers} "
          f"worker(s): submitted in {submitted:.2f} s, all finished after {elapsed:.2f} s "
          f"→ {50 / elapsed:.1f} placements/s")
