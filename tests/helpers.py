"""Small builders shared by the engine tests."""

from __future__ import annotations

from typing import Any


def graph_doc(ops: list[dict[str, Any]], edges: list[dict[str, Any]] | None = None,
              name: str = "t") -> dict[str, Any]:
    return {"format": "baechi.graph/v1", "name": name, "ops": ops, "edges": edges or []}


def op(name: str, compute_us: float = 10.0, **fields: Any) -> dict[str, Any]:
    return {"name": name, "compute_us": compute_us, **fields}


def edge(src: str, dst: str, nbytes: int = 0, **fields: Any) -> dict[str, Any]:
    return {"src": src, "dst": dst, "bytes": nbytes, **fields}


def plan_doc(cluster: dict[str, Any], placement: dict[str, str],
             order: dict[str, list[str]], options: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    return {"format": "baechi.plan/v1",
            "request": {"algorithm": "hand", "cluster": cluster, "options": options or {}},
            "placement": placement, "order": order}


def two_devices(latency: float = 134.0, bandwidth: float = 5.7, mode: str = "sequential",
                count: int = 2, memory: int | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"count": count}
    if memory is not None:
        devices["memory_bytes"] = memory
    return {"devices": devices,
            "network": {"latency_us": latency, "bandwidth_gbps": bandwidth, "mode": mode}}
