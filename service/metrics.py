"""Prometheus metrics: HTTP requests of this process, and jobs of the whole deployment.

Request counters live in the API process. Job numbers are read from Redis at scrape time
(queue length, running jobs, ended placements, the placement-seconds histogram the workers
fill), so every API replica reports the same deployment-wide values.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from redis.exceptions import RedisError
from rq import Queue, Worker
from rq.registry import StartedJobRegistry
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from baechi.jobs.store import Store

log = logging.getLogger(__name__)


class Metrics:
    """The app's own registry (not the global one, so several apps can live in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "baechi_http_requests", "HTTP requests by method, route and status.",
            ["method", "route", "status"], registry=self.registry,
        )
        self.latency = Histogram(
            "baechi_http_request_duration_seconds", "HTTP request latency by route.",
            ["method", "route"], registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )

    def watch(self, store: Store, queue: Queue, worker_ttl_s: int) -> None:
        self.registry.register(JobCollector(store, queue, worker_ttl_s))


class JobCollector(Collector):
    """Jobs by status, live workers and placement seconds, read from Redis per scrape."""

    def __init__(self, store: Store, queue: Queue, worker_ttl_s: int) -> None:
        self.store = store
        self.queue = queue
        self.worker_ttl_s = worker_ttl_s

    def describe(self) -> list[Metric]:
        return []  # Values come from Redis; describing must not need it.

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("baechi_redis_up", "1 when Redis answered this scrape.")
        try:
            queued = self.queue.count
            running = StartedJobRegistry(queue=self.queue).get_job_count(cleanup=False)
            ended = self.store.ended_counts()
            buckets, total = self.store.histogram()
            workers = live_workers(self.queue, self.worker_ttl_s)
        except RedisError as exc:
            log.warning("metrics: Redis unavailable: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        jobs = GaugeMetricFamily("baechi_jobs", "Placements waiting or running now.",
                                 labels=["status"])
        jobs.add_metric(["queued"], queued)
        jobs.add_metric(["running"], running)
        yield jobs
        done = CounterMetricFamily("baechi_jobs_ended", "Placements that ended, by status.",
                                   labels=["status"])
        for status in ("finished", "failed", "canceled"):
            done.add_metric([status], ended.get(status, 0))
        yield done
        alive = GaugeMetricFamily("baechi_workers", "Workers that sent a heartbeat recently.")
        alive.add_metric([], workers)
        yield alive
        seconds = HistogramMetricFamily(
            "baechi_placement_seconds", "Wall-clock time of finished placements in the worker.",
        )
        seconds.add_metric([], buckets, total)
        yield seconds


def live_workers(queue: Queue, worker_ttl_s: int) -> int:
    """Workers of ``queue`` whose last heartbeat is recent (a SIGKILLed one soon drops out)."""
    count = 0
    now = time.time()
    for worker in Worker.all(queue=queue):
        beat = worker.last_heartbeat
        if beat is not None and now - beat.timestamp() <= worker_ttl_s:
            count += 1
    return count


#: Methods that keep their own label in the request metrics; any other is ``other``.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RequestMetrics:
    """Count and time every HTTP request, labelled by route template (not the raw path)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            # any token is a valid HTTP method: unknown ones share one label, so a client
            # inventing methods cannot grow the metrics without bound
            method = method if method in HTTP_METHODS else "other"
            self.metrics.requests.labels(method, label, str(status)).inc()
            self.metrics.latency.labels(method, label).observe(time.perf_counter() - started)
