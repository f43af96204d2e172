"""Redis storage of graphs, placements, plans and idempotency keys (shared by API and worker).

Key layout (everything under ``baechi:``; RQ keeps its own ``rq:`` keys)::

    baechi:graph:{tenant}:{sha256}     hash: zlib-compressed JSON, name, ops, edges, size
    baechi:placement:{id}              hash: the placement record (status, tenant, request …)
    baechi:plan:{id}                   string: the plan JSON (DESIGN §5)
    baechi:idem:{tenant}:{digest}      string: placement id of an identical earlier request
    baechi:tenant:{tenant}:placements  sorted set: placement ids scored by creation sequence
    baechi:seq                         counter behind those scores
    baechi:stats                       hash: placements that ended, by status
    baechi:placement_seconds           hash: histogram of placement time (buckets, sum, count)

Graphs are keyed by tenant as well as content, so a tenant can never reach another's graph
even by guessing its hash. Nothing here is pickled: records are flat hashes, documents JSON.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis import Redis

PREFIX = "baechi"
SEQ_KEY = f"{PREFIX}:seq"
STATS_KEY = f"{PREFIX}:stats"
HISTOGRAM_KEY = f"{PREFIX}:placement_seconds"

#: Statuses a placement never leaves.
TERMINAL = frozenset({"finished", "failed", "canceled"})
#: Every status of DESIGN §7.
STATUSES = ("queued", "running", "finished", "failed", "canceled")
#: Upper bounds of the placement-seconds histogram buckets.
SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)


def graph_key(tenant: str, graph_id: str) -> str:
    return f"{PREFIX}:graph:{tenant}:{graph_id}"


def placement_key(placement_id: str) -> str:
    return f"{PREFIX}:placement:{placement_id}"


def plan_key(placement_id: str) -> str:
    return f"{PREFIX}:plan:{placement_id}"


def idempotency_key(tenant: str, digest: str) -> str:
    return f"{PREFIX}:idem:{tenant}:{digest}"


def tenant_index_key(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:placements"


# Returns the id already bound to KEYS[1] when that placement is alive and not failed or
# canceled (a resubmission should retry those); otherwise binds ARGV[1]. Atomic, so two
# identical concurrent submissions get one placement.
_CLAIM = """
local current = redis.call('GET', KEYS[1])
if current then
  local status = redis.call('HGET', ARGV[3] .. current, 'status')
  if status and status ~= 'failed' and status ~= 'canceled' then
    return current
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return ARGV[1]
"""

# Moves a placement to ARGV[1] unless it already ended; sets the ARGV[3..] field/value pairs
# and, when ARGV[2] > 0, a TTL. Returns the status it had (nil when the record is gone).
_TRANSITION = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return nil end
if status == 'finished' or status == 'failed' or status == 'canceled' then return status end
redis.call('HSET', KEYS[1], 'status', ARGV[1], unpack(ARGV, 3))
if tonumber(ARGV[2]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
if ARGV[1] == 'finished' or ARGV[1] == 'failed' or ARGV[1] == 'canceled' then
  redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
end
return status
"""


@dataclass
class PlacementRecord:
    """What the service knows about a placement besides the RQ job."""

    id: str
    tenant: str
    status: str
    created_at: float
    graph_id: str
    algorithm: str
    request: dict[str, Any]
    timeout_s: int
    seq: int = 0
    graph_name: str = ""
    graph_ops: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    error: dict[str, Any] | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def to_hash(self) -> dict[str, str | bytes]:
        out: dict[str, str | bytes] = {
            "id": self.id, "tenant": self.tenant, "status": self.status,
            "created_at": repr(self.created_at), "graph_id": self.graph_id,
            "graph_name": self.graph_name, "graph_ops": str(self.graph_ops),
            "algorithm": self.algorithm, "request": orjson.dumps(self.request),
            "timeout_s": str(self.timeout_s), "seq": str(self.seq),
        }
        if self.started_at is not None:
            out["started_at"] = repr(self.started_at)
        if self.finished_at is not None:
            out["finished_at"] = repr(self.finished_at)
        if self.error is not None:
            out["error"] = orjson.dumps(self.error)
        return out

    @classmethod
    def from_hash(cls, raw: Mapping[bytes, bytes]) -> PlacementRecord | None:
        if not raw or b"tenant" not in raw:
            return None
        data = {k.decode(): v for k, v in raw.items()}

        def text(name: str, default: str = "") -> str:
            value = data.get(name)
            return value.decode() if value is not None else default

        def stamp(name: str) -> float | None:
            value = data.get(name)
            return float(value) if value else None

        error = data.get("error")
        return cls(
            id=text("id"), tenant=text("tenant"), status=text("status", "queued"),
            created_at=float(text("created_at", "0")), graph_id=text("graph_id"),
            algorithm=text("algorithm"), request=orjson.loads(data.get("request") or b"{}"),
            timeout_s=int(text("timeout_s", "0")), seq=int(text("seq", "0")),
            graph_name=text("graph_name"), graph_ops=int(text("graph_ops", "0")),
            started_at=stamp("started_at"), finished_at=stamp("finished_at"),
            error=orjson.loads(error) if error else None,
        )


@dataclass
class GraphInfo:
    """Metadata of a stored graph (the document itself stays compressed in Redis)."""

    graph_id: str
    name: str
    ops: int
    edges: int
    size_bytes: int
    pins: dict[str, str] = field(default_factory=dict)


class Store:
    """Typed access to the ``baechi:`` keys of one Redis database."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._claim = redis.register_script(_CLAIM)
        self._transition = redis.register_script(_TRANSITION)

    # ----------------------------------------------------------------- graphs
    def put_graph(
        self, tenant: str, graph_id: str, document: bytes, *, name: str, ops: int, edges: int,
        pins: dict[str, str], ttl_s: int,
    ) -> bool:
        """Store a validated graph document; ``False`` when it was already there (TTL renewed)."""
        key = graph_key(tenant, graph_id)
        if self.redis.expire(key, ttl_s):
            return False
        # Level 1: profiled graphs shrink about tenfold at ~200 MB/s, far cheaper than parsing.
        blob = zlib.compress(document, 1)
        with self.redis.pipeline() as pipe:
            pipe.hset(key, mapping={
                "json": blob, "name": name, "ops": ops, "edges": edges,
                "size": len(document), "pins": orjson.dumps(pins),
                "created_at": repr(time.time()),
            })
            pipe.expire(key, ttl_s)
            pipe.execute()
        return True

    def graph_info(self, tenant: str, graph_id: str) -> GraphInfo | None:
        name, ops, edges, size, pins = self.redis.hmget(
            graph_key(tenant, graph_id), "name", "ops", "edges", "size", "pins"
        )
        if ops is None:
            return None
        return GraphInfo(graph_id, name.decode() if name else "", int(ops), int(edges or 0),
                         int(size or 0), orjson.loads(pins) if pins else {})

    def graph_document(self, tenant: str, graph_id: str) -> bytes | None:
        blob = self.redis.hget(graph_key(tenant, graph_id), "json")
        return zlib.decompress(blob) if blob is not None else None

    def touch_graph(self, tenant: str, graph_id: str, ttl_s: int) -> bool:
        """Keep a graph at least ``ttl_s`` more seconds; ``False`` if it is gone."""
        key = graph_key(tenant, graph_id)
        remaining = self.redis.ttl(key)
        if remaining == -2:
            return False
        if 0 <= remaining < ttl_s:
            self.redis.expire(key, ttl_s)
        return True

    # ------------------------------------------------------------- placements
    def claim(self, tenant: str, digest: str, placement_id: str, ttl_s: int) -> str:
        """The placement id an idempotent request maps to: an earlier one or ``placement_id``."""
        result = self._claim(
            keys=[idempotency_key(tenant, digest)],
            args=[placement_id, ttl_s, placement_key("")],
        )
        return result.decode() if isinstance(result, bytes) else str(result)

    def discard(self, record: PlacementRecord) -> None:
        """Remove a record that lost an idempotency race (it was never enqueued)."""
        with self.redis.pipeline() as pipe:
            pipe.delete(placement_key(record.id))
            pipe.zrem(tenant_index_key(record.tenant), record.id)
            pipe.execute()

    def create(self, record: PlacementRecord) -> PlacementRecord:
        """Save a new record and index it under its tenant, newest last."""
        record.seq = int(self.redis.incr(SEQ_KEY))
        with self.redis.pipeline() as pipe:
            pipe.hset(placement_key(record.id), mapping=record.to_hash())
            pipe.zadd(tenant_index_key(record.tenant), {record.id: record.seq})
            pipe.execute()
        return record

    def get(self, placement_id: str) -> PlacementRecord | None:
        return PlacementRecord.from_hash(self.redis.hgetall(placement_key(placement_id)))

    def get_many(self, ids: Sequence[str]) -> list[PlacementRecord | None]:
        with self.redis.pipeline(transaction=False) as pipe:
            for pid in ids:
                pipe.hgetall(placement_key(pid))
            raws = pipe.execute()
        return [PlacementRecord.from_hash(raw) for raw in raws]

    def transition(
        self, placement_id: str, status: str, ttl_s: int = 0, **fields: Any
    ) -> str | None:
        """Set ``status`` (and ``fields``) unless the placement already ended.

        Returns the status it had before: when that is terminal nothing changed (a canceled
        placement stays canceled even if its worker finishes afterwards).
        """
        args: list[Any] = [status, ttl_s]
        for name, value in fields.items():
            if value is None:
                continue
            if isinstance(value, (dict, list)):
                value = orjson.dumps(value)
            elif isinstance(value, float):
                value = repr(value)
            args += [name, value]
        result = self._transition(keys=[placement_key(placement_id), STATS_KEY], args=args)
        return result.decode() if isinstance(result, bytes) else result

    def set_fields(self, placement_id: str, **fields: Any) -> None:
        """Update fields of a live record that carry no status change (e.g. ``started_at``)."""
        mapping = {k: repr(v) if isinstance(v, float) else v for k, v in fields.items()}
        self.redis.hset(placement_key(placement_id), mapping=mapping)

    def page(self, tenant: str, before: int | None, limit: int) -> list[tuple[str, int]]:
        """Up to ``limit`` (id, seq) of a tenant, newest first, older than sequence ``before``."""
        top = f"({before}" if before is not None else "+inf"
        rows = self.redis.zrevrangebyscore(
            tenant_index_key(tenant), top, "-inf", start=0, num=limit, withscores=True
        )
        return [(member.decode(), int(score)) for member, score in rows]

    def forget(self, tenant: str, ids: Iterable[str]) -> None:
        """Drop expired placements from a tenant's index."""
        ids = list(ids)
        if ids:
            self.redis.zrem(tenant_index_key(tenant), *ids)

    # ------------------------------------------------------------------ plans
    def put_plan(self, placement_id: str, plan_json: bytes, ttl_s: int) -> None:
        self.redis.set(plan_key(placement_id), plan_json, ex=ttl_s)

    def plan(self, placement_id: str) -> bytes | None:
        return self.redis.get(plan_key(placement_id))

    # ---------------------------------------------------------------- metrics
    def observe_seconds(self, seconds: float) -> None:
        """Add one placement's duration to the shared histogram (cumulative buckets)."""
        with self.redis.pipeline() as pipe:
            for bound in SECONDS_BUCKETS:
                if seconds <= bound:
                    pipe.hincrby(HISTOGRAM_KEY, repr(bound), 1)
            pipe.hincrby(HISTOGRAM_KEY, "+Inf", 1)
            pipe.hincrbyfloat(HISTOGRAM_KEY, "sum", seconds)
            pipe.execute()

    def histogram(self) -> tuple[list[tuple[str, int]], float]:
        raw = {k.decode(): v for k, v in self.redis.hgetall(HISTOGRAM_KEY).items()}
        buckets = [(repr(b), int(raw.get(repr(b), 0))) for b in SECONDS_BUCKETS]
        buckets.append(("+Inf", int(raw.get("+Inf", 0))))
        return buckets, float(raw.get("sum", 0.0))

    def ended_counts(self) -> dict[str, int]:
        raw = self.redis.hgetall(STATS_KEY)
        return {k.decode(): int(v) for k, v in raw.items()}
