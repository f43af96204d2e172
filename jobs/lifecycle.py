"""A placement's status: the record's when it ended, else what its RQ job says.

The worker writes ``finished``/``failed`` to the record itself, and the API writes
``canceled``. Everything RQ decides on its own — a job failed after its retry, abandoned by a
SIGKILLed worker, or gone from Redis — is read from the job by :func:`resolve` (which only
reads: the API's ``GET`` calls it) and written back to the record by :func:`settle`, which
the workers' maintenance calls (:mod:`baechi.worker.maintenance`), so the record ends up
terminal and outlives the RQ job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from rq.job import Job, JobStatus

from baechi.jobs import queue as jobqueue
from baechi.jobs.settings import Settings
from baechi.jobs.store import PlacementRecord, Store

WORKER_DIED = "worker_died"
TIMEOUT = "timeout"
INTERNAL = "internal_error"
LOST = "lost"
#: A live record without an RQ job is "lost" only after this long: between saving the record
#: and enqueueing its job, an identical concurrent request may already be reading it.
ENQUEUE_GRACE_S = 30.0


@dataclass
class View:
    """What ``GET /placements/{id}`` reports, before it is turned into JSON."""

    record: PlacementRecord
    status: str
    progress: dict[str, Any]
    error: dict[str, Any] | None
    started_at: float | None
    finished_at: float | None
    #: RQ ended the job but the record does not say so yet (:func:`settle` writes it).
    unsettled: bool = False


def describe_failure(exc_string: str, *, timeout_s: int | None = None,
                     ran_s: float | None = None) -> dict[str, Any]:
    """Turn RQ's failure text into the ``{code, message}`` a user can act on."""
    text = exc_string or ""
    if "AbandonedJobError" in text or "terminated unexpectedly" in text:
        if timeout_s and ran_s is not None and ran_s >= timeout_s:
            return {"code": TIMEOUT, "message": f"the placement exceeded its time limit of "
                    f"{timeout_s} s and its worker had to kill it"}
        return {"code": WORKER_DIED, "message": (
            "the worker running this placement died (killed or crashed) on its last attempt; "
            f"it was attempted {jobqueue.RETRIES + 1} times. Submit it again to retry"
        )}
    if "JobTimeoutException" in text:
        return {"code": TIMEOUT, "message": f"the placement exceeded its time limit of "
                f"{timeout_s} s" if timeout_s else "the placement exceeded its time limit"}
    lines = [line for line in text.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else "unknown error"
    return {"code": INTERNAL, "message": f"the placement crashed in the worker: {last[:500]}"}


def resolve(record: PlacementRecord, job: Job | None) -> View:
    """The current view of a placement; reads only (RQ's own ends are marked ``unsettled``)."""
    if record.terminal:
        return _ended(record, job)
    if job is None:
        if time.time() - record.created_at < ENQUEUE_GRACE_S:
            # A record saved by hand (tools, tests) before its job; the API saves both at once.
            return View(record, "queued", {"phase": "queued", "fraction": 0.0}, None, None, None)
        error = {"code": LOST, "message": "the placement's job is no longer in Redis (was its "
                 "data lost?); submit it again"}
        return _rq_end(record, job, "failed", error)
    status = job.get_status(refresh=False)
    if status == JobStatus.FAILED:
        result = job.latest_result()
        ran = (job.ended_at - job.started_at).total_seconds() \
            if job.ended_at and job.started_at else None
        error = describe_failure(result.exc_string if result else "", timeout_s=record.timeout_s,
                                 ran_s=ran)
        return _rq_end(record, job, "failed", error)
    if status in (JobStatus.STOPPED, JobStatus.CANCELED):
        return _rq_end(record, job, "canceled", None)
    if status == JobStatus.FINISHED:
        # The function writes the record before returning; getting here means it returned
        # without doing so, which only a bug does.
        error = {"code": INTERNAL, "message": "the worker finished without storing a plan"}
        return _rq_end(record, job, "failed", error)
    started = record.started_at or _stamp(job.started_at)
    if status == JobStatus.STARTED:
        progress = jobqueue.progress(job) or {"phase": "starting", "fraction": 0.0}
        return View(record, "running", progress, None, started, None)
    return View(record, "queued", {"phase": "queued", "fraction": 0.0}, None, started, None)


def settle(store: Store, settings: Settings, record: PlacementRecord, job: Job | None) -> View:
    """:func:`resolve`, then write an end RQ reached on its own to the record."""
    view = resolve(record, job)
    if not view.unsettled:
        return view
    previous = store.transition(record.id, view.status, settings.result_ttl_s,
                                finished_at=view.finished_at, error=view.error)
    if previous in ("finished", "failed", "canceled"):
        # Someone else ended it meanwhile (the worker, a cancel): report theirs.
        fresh = store.get(record.id)
        if fresh is not None:
            return _ended(fresh, job)
    return replace(view, unsettled=False)


def _ended(record: PlacementRecord, job: Job | None) -> View:
    if record.status == "finished":
        progress: dict[str, Any] = {"phase": "done", "fraction": 1.0}
    else:
        last = jobqueue.progress(job) if job is not None else None
        progress = {"phase": record.status,
                    "fraction": float(last.get("fraction", 0.0)) if last else 0.0}
    error = record.error
    if error is not None:
        error = {"code": error.get("code", INTERNAL), "message": error.get("message", ""),
                 "details": error.get("details") or {}}
    return View(record, record.status, progress, error, record.started_at, record.finished_at)


def _rq_end(record: PlacementRecord, job: Job | None, status: str,
            error: dict[str, Any] | None) -> View:
    finished = _stamp(job.ended_at) if job is not None and job.ended_at else time.time()
    started = record.started_at
    if started is None and job is not None:
        started = _stamp(job.started_at)
    ended = replace(record, status=status, error=error, finished_at=finished, started_at=started)
    return replace(_ended(ended, job), unsettled=True)


def _stamp(value: Any) -> float | None:
    return value.timestamp() if value is not None else None
