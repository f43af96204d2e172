"""The RQ job of a placement: fetch graph and request, run the engine, store the plan.

:func:`run_placement` runs in a forked work horse. Errors of the input or the problem
(:class:`~baechi.errors.PlacementError`) and timeouts end the placement ``failed`` right here,
without a retry: running it again would fail the same way. Anything else escapes to RQ, which
retries the job once (docs/format.md §7) and calls :func:`on_failure` when it gives up.

:func:`render_report` renders a finished placement's HTML report once and stores it, so the
API only serves stored bytes (issue 12, items 8 and 14).
"""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import Any

import orjson
from redis import Redis
from rq import get_current_job
from rq.job import Job
from rq.timeouts import JobTimeoutException

import baechi
from baechi.errors import PlacementError
from baechi.jobs import queue as jobqueue
from baechi.jobs.lifecycle import INTERNAL, TIMEOUT, describe_failure
from baechi.jobs.settings import Settings, get_settings
from baechi.jobs.store import PlacementRecord, Store, placement_key
from baechi.worker.progress import Canceled, ProgressReporter

log = logging.getLogger(__name__)

_settings: Settings | None = None


def settings() -> Settings:
    """The worker's settings, read once per process (the work horse inherits them)."""
    global _settings
    if _settings is None:
        _settings = get_settings()
    return _settings


def run_placement(placement_id: str) -> dict[str, Any]:
    """Place the graph of placement ``placement_id``; returns a small summary for RQ."""
    job = get_current_job()
    assert job is not None, "run_placement runs inside an RQ job"
    config = settings()
    store = Store(job.connection)
    record = store.get(placement_id)
    if record is None:
        log.warning("placement %s: record expired before it ran", placement_id)
        return {"status": "missing"}
    if record.terminal:
        return {"status": record.status}  # Canceled while it waited in the queue.
    started = time.time()
    if record.started_at is None:
        store.set_fields(placement_id, started_at=started)
    store.transition(placement_id, "running", attempts=_attempt(job))

    reporter = ProgressReporter(
        job, config.progress_interval_s, lambda: _canceled(store, placement_id)
    )
    try:
        reporter.write("loading", 0.0)
        if config.worker_hold_s:
            time.sleep(config.worker_hold_s)
        plan = _place(store, record, reporter)
    except Canceled:
        return {"status": "canceled"}
    except PlacementError as exc:
        _fail(store, config, placement_id, exc.to_dict())
        return {"status": "failed", "code": exc.code}
    except JobTimeoutException:
        # RQ's alarm went off: running it again would only time out again.
        _fail(store, config, placement_id, {
            "code": TIMEOUT,
            "message": f"the placement exceeded its time limit of {record.timeout_s} s",
            "details": {"timeout_s": record.timeout_s},
        })
        return {"status": "failed", "code": TIMEOUT}

    store.put_plan(placement_id, orjson.dumps(plan.model_dump(mode="json")), config.result_ttl_s)
    # The report needs the graph as long as the plan lives.
    store.touch_graph(record.tenant, record.graph_id, config.result_ttl_s)
    previous = store.transition(placement_id, "finished", config.result_ttl_s,
                                finished_at=time.time())
    if previous in ("queued", "running"):
        store.observe_seconds(time.time() - started)
        # rendered by whichever worker is free once no placement waits, never on a GET
        jobqueue.enqueue_report(jobqueue.make_report_queue(job.connection, config), placement_id,
                            config)
    estimate = plan.estimate
    return {"status": "finished",
            "step_time_us": estimate.step_time_us if estimate is not None else None}


def _place(store: Store, record: PlacementRecord, reporter: ProgressReporter) -> baechi.Plan:
    document = store.graph_document(record.tenant, record.graph_id)
    if document is None:
        raise baechi.InvalidRequest(
            f"graph_id: graph {record.graph_id} expired before the placement ran; upload it "
            "again", {"field": "graph_id"},
        )
    graph = baechi.load_graph(document)
    request = record.request
    return baechi.place(graph, request["cluster"], record.algorithm, request.get("options"),
                        progress=reporter,
                        objective=request.get("objective") or "step_time")


def _canceled(store: Store, placement_id: str) -> bool:
    return store.redis.hget(placement_key(placement_id), "status") == b"canceled"


def _attempt(job: Job) -> int:
    left = job.retries_left if job.retries_left is not None else jobqueue.RETRIES
    return jobqueue.RETRIES - left + 1


def render_report(placement_id: str) -> dict[str, Any]:
    """Render the HTML report of a finished placement once and store it (gzip-compressed)."""
    job = get_current_job()
    assert job is not None, "render_report runs inside an RQ job"
    config = settings()
    store = Store(job.connection)
    record = store.get(placement_id)
    plan = store.plan(placement_id)
    if record is None or plan is None:
        return {"status": "missing"}  # expired meanwhile: nothing to render
    document = store.graph_document(record.tenant, record.graph_id)
    if document is None:
        store.put_report_error(placement_id, {
            "code": "graph_expired",
            "message": f"the graph of placement {placement_id} expired before its report was "
                       "rendered; the plan is still available at its /plan URL",
            "details": {"graph_id": record.graph_id}}, config.result_ttl_s)
        return {"status": "failed"}
    try:
        from baechi.report import render_report as render
    except ImportError as exc:
        store.put_report_error(placement_id, {
            "code": "report_unavailable",
            "message": f"HTML reports are not available on this server: {exc}",
            "details": {}}, config.result_ttl_s)
        return {"status": "failed"}
    html = render(baechi.load_graph(document), baechi.Plan.model_validate_json(plan))
    store.put_report(placement_id, html, config.result_ttl_s)
    return {"status": "ready", "bytes": len(html)}


def report_failed(store: Store, placement_id: str, exc_string: str) -> None:
    """A report job that crashed or was killed (out of memory, its timeout): say so."""
    lines = [line for line in exc_string.strip().splitlines() if line.strip()]
    store.put_report_error(placement_id, {
        "code": "report_failed",
        "message": "rendering the report failed: " + (lines[-1][:300] if lines else "killed"),
        "details": {}}, settings().result_ttl_s)


def _fail(store: Store, config: Settings, placement_id: str, error: dict[str, Any]) -> None:
    store.transition(placement_id, "failed", config.result_ttl_s, finished_at=time.time(),
                     error=error)


def on_failure(job: Job, connection: Redis, exc_type: type[BaseException] | None,
               exc_value: BaseException | None, traceback: TracebackType | None) -> None:
    """RQ's failure callback: record the failure once RQ will not retry the job.

    Called in the work horse when the function raised, and by whoever reaps an abandoned
    job (a worker's maintenance or the API) when its worker was killed.
    """
    if job.should_retry:
        return  # RQ requeues it next; the placement stays alive.
    name = exc_type.__name__ if exc_type is not None else "error"
    error = describe_failure(f"{name}: {exc_value}", timeout_s=job.timeout)
    if error["code"] == INTERNAL and exc_value is not None:
        error["message"] = f"the placement crashed in the worker: {name}: {exc_value}"[:600]
    record_failure(Store(connection), job.id, error)


def record_failure(store: Store, placement_id: str, error: dict[str, Any]) -> None:
    """End a placement ``failed`` (no-op when it already ended)."""
    _fail(store, settings(), placement_id, error)
