"""Placement records and statuses against a real Redis (no API process needed)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from service_fixtures import RedisServer, needs_redis

from baechi.jobs.lifecycle import ENQUEUE_GRACE_S, describe_failure, resolve, settle
from baechi.jobs.settings import Settings
from baechi.jobs.store import (
    STATS_KEY,
    KeyReused,
    PlacementRecord,
    Store,
    TooManyActive,
    active_key,
    placement_key,
    tenant_index_key,
)

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
    assert resolve(fresh, None).status == "queued"
    stale = store.create(record(created_at=time.time() - ENQUEUE_GRACE_S - 1))
    view = resolve(stale, None)
    assert view.status == "failed" and view.error is not None
    assert view.error["code"] == "lost"
    # resolve only reads (the API's GET calls it): the record is unchanged ...
    assert store.get(stale.id).status == "queued"  # type: ignore[union-attr]
    # ... until the workers' maintenance settles it
    assert settle(store, settings, stale, None).status == "failed"
    persisted = store.get(stale.id)
    assert persisted is not None and persisted.status == "failed"
    assert persisted.error is not None and persisted.error["code"] == "lost"
    assert 0 < store.redis.ttl(placement_key(stale.id)) <= settings.result_ttl_s
    assert stale.id not in store.active("t1")


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


def _submit(store: Store, **kwargs: Any) -> tuple[str, bool, list[str]]:
    enqueued: list[str] = []
    new = record()
    submission = store.submit(new, kwargs.pop("digest", "digest"), 60,
                              lambda pipe: enqueued.append(new.id) or pipe.rpush("q", new.id),
                              max_active=kwargs.pop("max_active", 100), **kwargs)
    return submission.placement_id, submission.replayed, enqueued


def test_identical_concurrent_submissions_get_one_placement(store: Store) -> None:
    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(lambda _: _submit(store), range(20)))
    winners = {pid for pid, _, _ in results}
    assert len(winners) == 1
    assert sum(not replayed for _, replayed, _ in results) == 1
    # only the winner's record, index entry and job exist
    assert store.redis.lrange("q", 0, -1) == [winners.pop().encode()]
    assert store.redis.zcard(tenant_index_key("t1")) == 1
    # Once that placement failed, the next identical request gets a new one.
    (first,) = [pid for pid, replayed, _ in results if not replayed]
    store.transition(first, "failed", 60)
    again, replayed, _ = _submit(store)
    assert again != first and not replayed
    # ... and once finished, only an explicit re-run starts another
    store.transition(again, "finished", 60)
    assert _submit(store)[:2] == (again, True)
    rerun, replayed, _ = _submit(store, rerun=True)
    assert rerun != again and not replayed


def test_a_submission_that_fails_before_commit_leaves_nothing(store: Store) -> None:
    """Issue 12, item 14: a request that never got its 202 leaves no visible placement."""
    def broken(pipe: Any) -> None:
        pipe.rpush("q", "x")
        raise ConnectionError("the API process died here")

    with pytest.raises(ConnectionError):
        store.submit(record(), "digest", 60, broken, max_active=100)
    assert store.redis.keys("baechi:placement:*") == []
    assert store.redis.zcard(tenant_index_key("t1")) == 0
    assert store.redis.llen("q") == 0
    assert store.redis.scard(active_key("t1")) == 0
    pid, replayed, _ = _submit(store)  # and the idempotency key was not taken
    assert not replayed and store.get(pid) is not None


def test_idempotency_key_replays_the_same_request_and_refuses_another(store: Store) -> None:
    first, replayed, _ = _submit(store, key="k-1")
    assert not replayed
    assert _submit(store, key="k-1")[:2] == (first, True)
    # a failed placement is still the answer to its key (only a new key retries)
    store.transition(first, "failed", 60)
    assert _submit(store, key="k-1")[:2] == (first, True)
    with pytest.raises(KeyReused) as caught:
        _submit(store, key="k-1", digest="another request")
    assert caught.value.placement_id == first
    assert _submit(store, key="k-2")[0] != first


def test_a_tenant_has_at_most_max_active_placements(store: Store) -> None:
    ids = [_submit(store, digest=f"d{i}", max_active=3)[0] for i in range(3)]
    with pytest.raises(TooManyActive):
        _submit(store, digest="d3", max_active=3)
    store.transition(ids[0], "finished", 60)  # an end frees a place
    assert not _submit(store, digest="d3", max_active=3)[1]
    with pytest.raises(TooManyActive):
        _submit(store, digest="d4", max_active=3)
    # another tenant has its own count
    other = record(tenant="t2")
    assert not store.submit(other, "d4", 60, lambda pipe: None, max_active=3).replayed


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


def test_the_workers_sweep_settles_lost_jobs_and_trims_expired_ids(store: Store) -> None:
    """Maintenance the API's GETs used to do, now the workers' (issue 12, item 8)."""
    from baechi.worker.maintenance import LOCK_KEY, sweep

    settings = Settings(api_keys="k")
    expired = store.create(record())
    store.redis.delete(placement_key(expired.id))  # its TTL ran out
    lost = store.create(record(created_at=time.time() - ENQUEUE_GRACE_S - 1))
    waiting = store.create(record())  # saved a moment ago: not lost yet
    sweep(store, settings)
    assert store.redis.zrange(tenant_index_key("t1"), 0, -1) == [lost.id.encode(),
                                                                  waiting.id.encode()]
    assert set(store.active("t1")) == {waiting.id}
    settled = store.get(lost.id)
    assert settled is not None and settled.status == "failed"
    assert settled.error is not None and settled.error["code"] == "lost"
    # one sweep per interval, whichever worker gets there first
    assert store.redis.ttl(LOCK_KEY) > 0
