"""Placement records and statuses against a real Redis (no API process needed)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from baechi.service.lifecycle import ENQUEUE_GRACE_S, describe_failure, resolve
from baechi.service.settings import Settings
from baechi.service.store import STATS_KEY, PlacementRecord, Store, placement_key
from service_fixtures import RedisServer, needs_redis

pytestmark = [needs_redis, pytest.mark.service]


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[Store]:
    redis = redis_server.client(db=2)
    redis.flushdb()
    yield Store(redis)
    redis.flushdb()


def record(**fields: Any) -> PlacementRecord:
    values: dict[str, Any] = {
        "id": uuid.uuid4().hex, "tenant": "t1", "status": "queued", "created_at": time.time(),
        "graph_id": "0" * 64, "algorithm": "single",
        "request": {"cluster": {"devices": {"count": 1}}, "options": {}}, "timeout_s": 61,
    }
    values.update(fields)
    return PlacementRecord(**values)


def test_record_round_trips(store: Store) -> None:
    saved = store.create(record(graph_name="g", graph_ops=3))
    loaded = store.get(saved.id)
    assert loaded == saved
    assert loaded is not None and loaded.seq > 0


def test_a_record_without_job_is_queued_briefly_then_lost(store: Store) -> None:
    settings = Settings(api_keys="k")
    fresh = store.create(record())
    assert resolve(store, settings, fresh, None).status == "queued"
    stale = store.create(record(created_at=time.time() - ENQUEUE_GRACE_S - 1))
    view = resolve(store, settings, stale, None)
    assert view.status == "failed" and view.error is not None
    assert view.error["code"] == "lost"
    persisted = store.get(stale.id)
    assert persisted is not None and persisted.status == "failed"
    assert 0 < store.redis.ttl(placement_key(stale.id)) <= settings.result_ttl_s


def test_an_ended_placement_never_changes_and_is_counted_once(store: Store) -> None:
    saved = store.create(record())
    assert store.transition(saved.id, "running") == "queued"
    assert store.transition(saved.id, "canceled", 60) == "running"
    # The worker finishing afterwards does not flip it.
    assert store.transition(saved.id, "finished", 60) == "canceled"
    assert store.get(saved.id).status == "canceled"  # type: ignore[union-attr]
    assert store.ended_counts() == {"canceled": 1}
    assert store.transition(uuid.uuid4().hex, "finished") is None
    assert store.redis.hget(STATS_KEY, "finished") is None


def test_identical_concurrent_claims_get_one_placement(store: Store) -> None:
    records = [store.create(record()) for _ in range(20)]
    with ThreadPoolExecutor(max_workers=20) as pool:
        winners = list(pool.map(lambda r: store.claim("t1", "digest", r.id, 60), records))
    assert len(set(winners)) == 1
    # Once that placement failed, the next identical request gets a new one.
    store.transition(winners[0], "failed", 60)
    again = store.create(record())
    assert store.claim("t1", "digest", again.id, 60) == again.id


@pytest.mark.parametrize(("text", "code"), [
    ("Moved to FailedJobRegistry, due to AbandonedJobError, at 2026-01-01", "worker_died"),
    ("Work-horse terminated unexpectedly; waitpid returned 9 (signal 9); ", "worker_died"),
    ("Traceback …\nrq.timeouts.JobTimeoutException: Task exceeded maximum timeout", "timeout"),
    ("Traceback …\nZeroDivisionError: division by zero", "internal_error"),
])
def test_failures_are_described_for_users(text: str, code: str) -> None:
    error = describe_failure(text, timeout_s=61)
    assert error["code"] == code
    if code == "worker_died":
        assert "worker" in error["message"] and "died" in error["message"]
    if code == "internal_error":
        assert "division by zero" in error["message"]


def test_a_killed_horse_past_its_timeout_is_a_timeout() -> None:
    text = "Work-horse terminated unexpectedly; waitpid returned 9 (signal 9); "
    assert describe_failure(text, timeout_s=61, ran_s=125.0)["code"] == "timeout"
