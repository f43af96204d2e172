"""Redis storage of graphs, placements, plans and idempotency keys (shared by API and worker).

Key layout (everything under ``baechi:``; RQ keeps its own ``rq:`` keys)::

    baechi:graph:{tenant}:{sha256}     hash: zlib-compressed JSON, name, ops, edges, size
    baechi:placement:{id}              hash: the placement record (status, tenant, request …)
    baechi:plan:{id}                   string: the plan JSON (docs/format.md §5)
    baechi:report:{id}                 hash: the HTML report, rendered once by a worker (gzip)
    baechi:idem:{tenant}:{digest}      string: placement id of an identical earlier request
    baechi:key:{tenant}:{sha256(key)}  string: "{digest} {id}" of an ``Idempotency-Key`` header
    baechi:tenant:{tenant}:placements  sorted set: placement ids scored by creation sequence
    baechi:tenant:{tenant}:active      set: the tenant's queued and running placements
    baechi:seq                         counter behind those scores
    baechi:stats                       hash: placements that ended, by status
    baechi:placement_seconds           hash: histogram of placement time (buckets, sum, count)

Graphs are keyed by tenant as well as content, so a tenant can never reach another's graph
even by guessing its hash. Nothing here is pickled: records are flat hashes, documents JSON.
"""

from __future__ import annotations

import gzip
import hashlib
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import orjson
from redis import Redis
from redis.client import Pipeline
from redis.exceptions import WatchError

PREFIX = "baechi"
SEQ_KEY = f"{PREFIX}:seq"
STATS_KEY = f"{PREFIX}:stats"
HISTOGRAM_KEY = f"{PREFIX}:placement_seconds"

#: Every status of docs/format.md §7 (the API's schema uses this type).
Status = Literal["queued", "running", "finished", "failed", "canceled"]
STATUSES: tuple[str, ...] = get_args(Status)
#: Statuses a placement never leaves.
TERMINAL = frozenset({"finished", "failed", "canceled"})
#: Upper bounds of the placement-seconds histogram buckets.
SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)


def graph_key(tenant: str, graph_id: str) -> str:
    return f"{PREFIX}:graph:{tenant}:{graph_id}"


def placement_key(placement_id: str) -> str:
    return f"{PREFIX}:placement:{placement_id}"


def plan_key(placement_id: str) -> str:
    return f"{PREFIX}:plan:{placement_id}"


def same_request_key(tenant: str, digest: str) -> str:
    """Key of a request's content digest: the same graph and request from the same tenant
    return the placement already made."""
    return f"{PREFIX}:idem:{tenant}:{digest}"


def tenant_index_key(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:placements"


def active_key(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:active"


def idempotency_key(tenant: str, key: str) -> str:
    """Key of an ``Idempotency-Key`` header (hashed: a header can be any 255 characters)."""
    return f"{PREFIX}:key:{tenant}:{hashlib.sha256(key.encode()).hexdigest()}"


def report_key(placement_id: str) -> str:
    return f"{PREFIX}:report:{placement_id}"


class KeyReused(Exception):
    """An ``Idempotency-Key`` already names a different request (``placement_id``)."""

    def __init__(self, placement_id: str) -> None:
        super().__init__(placement_id)
        self.placement_id = placement_id


class TooManyActive(Exception):
    """The tenant already has ``active`` queued or running placements (the limit)."""

    def __init__(self, active: int) -> None:
        super().__init__(active)
        self.active = active


@dataclass
class Submission:
    """What a submission maps to: a new placement, or one that answers it already."""

    placement_id: str
    replayed: bool

# Moves a placement to ARGV[1] unless it already ended; sets the ARGV[3..] field/value pairs
# and, when ARGV[2] > 0, a TTL; an end takes it out of its tenant's active set. Returns the
# status it had (nil when the record is gone).
_TRANSITION = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return nil end
if status == 'finished' or status == 'failed' or status == 'canceled' then return status end
redis.call('HSET', KEYS[1], 'status', ARGV[1], unpack(ARGV, 3))
if tonumber(ARGV[2]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
if ARGV[1] == 'finished' or ARGV[1] == 'failed' or ARGV[1] == 'canceled' then
  redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
  local tenant = redis.call('HGET', KEYS[1], 'tenant')
  if tenant then
    redis.call('SREM', 'PREFIX:tenant:' .. tenant .. ':active', redis.call('HGET', KEYS[1], 'id'))
  end
end
return status
""".replace("PREFIX", PREFIX)


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
    def submit(self, record: PlacementRecord, digest: str, ttl_s: int,
               enqueue: Callable[[Pipeline], object], *, max_active: int,
               key: str | None = None, rerun: bool = False) -> Submission:
        """Save ``record`` and enqueue its job in one transaction, or answer with an earlier one.

        ``digest`` identifies equal requests: an equal live or finished placement of the
        tenant is the answer unless ``rerun``. An ``Idempotency-Key`` ``key`` answers with the
        placement it named before (whatever its status), and raises :class:`KeyReused` when
        it named a different request. :class:`TooManyActive` when the tenant has
        ``max_active`` placements queued or running. Record, index, keys and the job are
        written by one ``MULTI``/``EXEC``: a request that dies before it commits leaves
        nothing behind, and two identical concurrent ones get one placement.
        """
        record.seq = int(self.redis.incr(SEQ_KEY))
        tenant = record.tenant
        equal, active = same_request_key(tenant, digest), active_key(tenant)
        keyed = idempotency_key(tenant, key) if key is not None else None
        while True:
            with self.redis.pipeline() as pipe:
                try:
                    pipe.watch(equal, active, *([keyed] if keyed else []))
                    earlier = self._earlier(pipe, digest, equal, keyed, rerun)
                    if earlier is not None:
                        return Submission(earlier, replayed=True)
                    members = [m.decode() for m in pipe.smembers(active)]
                    ended = self._ended(members)
                    if len(members) - len(ended) >= max_active:
                        raise TooManyActive(len(members) - len(ended))
                    pipe.multi()
                    if ended:
                        pipe.srem(active, *ended)
                    pipe.hset(placement_key(record.id), mapping=record.to_hash())
                    pipe.zadd(tenant_index_key(tenant), {record.id: record.seq})
                    pipe.sadd(active, record.id)
                    pipe.set(equal, record.id, ex=ttl_s)
                    if keyed is not None:
                        pipe.set(keyed, f"{digest} {record.id}", ex=ttl_s)
                    enqueue(pipe)
                    pipe.execute()
                    return Submission(record.id, replayed=False)
                except WatchError:
                    continue  # another submission or an end of this tenant: look again

    def _earlier(self, pipe: Pipeline, digest: str, equal: str, keyed: str | None,
                 rerun: bool) -> str | None:
        if keyed is not None:
            bound = pipe.get(keyed)
            if bound is not None:
                bound_digest, placement_id = bound.decode().split(" ")
                if bound_digest != digest:
                    raise KeyReused(placement_id)
                if pipe.exists(placement_key(placement_id)):
                    return placement_id
        if rerun:
            return None
        current = pipe.get(equal)
        if current is None:
            return None
        status = pipe.hget(placement_key(current.decode()), "status")
        # a failed or canceled placement is not an answer: submitting again retries it
        if status is not None and status.decode() not in ("failed", "canceled"):
            return current.decode()
        return None

    def _ended(self, ids: Sequence[str]) -> list[str]:
        """Those of ``ids`` whose record ended or expired."""
        with self.redis.pipeline(transaction=False) as pipe:
            for pid in ids:
                pipe.hget(placement_key(pid), "status")
            statuses = pipe.execute()
        return [pid for pid, status in zip(ids, statuses, strict=True)
                if status is None or status.decode() in TERMINAL]

    def create(self, record: PlacementRecord) -> PlacementRecord:
        """Save a new record and index it under its tenant, newest last (no job: for tests
        and tools; the API uses :meth:`submit`)."""
        record.seq = int(self.redis.incr(SEQ_KEY))
        with self.redis.pipeline() as pipe:
            pipe.hset(placement_key(record.id), mapping=record.to_hash())
            pipe.zadd(tenant_index_key(record.tenant), {record.id: record.seq})
            pipe.sadd(active_key(record.tenant), record.id)
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
        """Drop expired placements from a tenant's index and active set."""
        ids = list(ids)
        if ids:
            with self.redis.pipeline() as pipe:
                pipe.zrem(tenant_index_key(tenant), *ids)
                pipe.srem(active_key(tenant), *ids)
                pipe.execute()

    def forget_active(self, tenant: str, ids: Iterable[str]) -> None:
        """Drop ended or expired placements from a tenant's active set."""
        ids = list(ids)
        if ids:
            self.redis.srem(active_key(tenant), *ids)

    def tenants_with_active(self) -> list[str]:
        """Tenants that have (or had) queued or running placements."""
        head, tail = f"{PREFIX}:tenant:", ":active"
        return [key.decode()[len(head):-len(tail)]
                for key in self.redis.scan_iter(match=f"{head}*{tail}", count=500)]

    def tenants(self) -> list[str]:
        """Tenants with a placement index."""
        head, tail = f"{PREFIX}:tenant:", ":placements"
        return [key.decode()[len(head):-len(tail)]
                for key in self.redis.scan_iter(match=f"{head}*{tail}", count=500)]

    def active(self, tenant: str) -> list[str]:
        return [m.decode() for m in self.redis.smembers(active_key(tenant))]

    def oldest(self, tenant: str, count: int) -> list[str]:
        """The ``count`` oldest ids of a tenant's index (where expired ones collect)."""
        return [m.decode() for m in self.redis.zrange(tenant_index_key(tenant), 0, count - 1)]

    # ------------------------------------------------------------------ plans
    def put_plan(self, placement_id: str, plan_json: bytes, ttl_s: int) -> None:
        self.redis.set(plan_key(placement_id), plan_json, ex=ttl_s)

    def plan(self, placement_id: str) -> bytes | None:
        return self.redis.get(plan_key(placement_id))

    # ---------------------------------------------------------------- reports
    def put_report(self, placement_id: str, html: str, ttl_s: int) -> None:
        """Store a rendered report, gzip-compressed (10–14 MB pages shrink about tenfold)."""
        self._put_report(placement_id, {"status": "ready",
                                        "html": gzip.compress(html.encode(), 6)}, ttl_s)

    def put_report_error(self, placement_id: str, error: dict[str, Any], ttl_s: int) -> None:
        """Record why a report could not be rendered (served instead of retrying)."""
        self._put_report(placement_id, {"status": "failed", "error": orjson.dumps(error)},
                         ttl_s)

    def _put_report(self, placement_id: str, mapping: dict[str, Any], ttl_s: int) -> None:
        with self.redis.pipeline() as pipe:
            pipe.delete(report_key(placement_id))
            pipe.hset(report_key(placement_id), mapping=mapping)
            pipe.expire(report_key(placement_id), ttl_s)
            pipe.execute()

    def report(self, placement_id: str) -> tuple[bytes | None, dict[str, Any] | None] | None:
        """``(gzipped html, None)``, ``(None, error)``, or ``None`` while not rendered."""
        status, html, error = self.redis.hmget(report_key(placement_id),
                                               "status", "html", "error")
        if status is None:
            return None
        if status == b"ready":
            return html, None
        return None, orjson.loads(error or b"{}")

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
