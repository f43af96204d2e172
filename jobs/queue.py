"""The RQ side of a placement: enqueueing, cancelling, and reading a job's state.

The job id is the placement id. The job carries only that id (JSON-serialized, never
pickled); the worker reads the request from the placement record and the graph from its own
key. Job status and progress (``job.meta["progress"]``) are merged with the record by
:mod:`baechi.jobs.lifecycle`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress

from redis import Redis
from redis.client import Pipeline
from rq import Callback, Queue, Retry
from rq.command import send_stop_job_command
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from baechi.jobs.settings import Settings

#: The function a worker runs for a placement (imported by name in the worker).
JOB_FUNCTION = "baechi.worker.tasks.run_placement"
#: Called by RQ when a job fails outside the function: abandoned by a dead worker, crashed.
FAILURE_CALLBACK = "baechi.worker.tasks.on_failure"
#: The function a worker runs to render a finished placement's HTML report, once.
REPORT_FUNCTION = "baechi.worker.tasks.render_report"
#: docs/format.md §7: a failed job is run once more.
RETRIES = 1
SERIALIZER = JSONSerializer


def make_queue(redis: Redis, settings: Settings) -> Queue:
    """The placement queue, JSON-serialized so nothing in Redis is a pickle."""
    return Queue(settings.queue_name, connection=redis, serializer=SERIALIZER)


def make_report_queue(redis: Redis, settings: Settings) -> Queue:
    """The queue of report renderings; workers take from it only when no placement waits."""
    return Queue(f"{settings.queue_name}-reports", connection=redis, serializer=SERIALIZER)


def report_job_id(placement_id: str) -> str:
    return f"report-{placement_id}"


def enqueue(queue: Queue, placement_id: str, timeout_s: int, settings: Settings,
            pipeline: Pipeline | None = None) -> Job:
    """Enqueue the job of a placement (inside ``pipeline``'s transaction when given)."""
    return queue.enqueue_call(
        JOB_FUNCTION,
        args=(placement_id,),
        job_id=placement_id,
        timeout=timeout_s,
        # The function returns a small summary; the plan lives under its own key.
        result_ttl=settings.result_ttl_s,
        failure_ttl=settings.result_ttl_s,
        retry=Retry(max=RETRIES),
        on_failure=Callback(FAILURE_CALLBACK),
        description=f"placement {placement_id}",
        pipeline=pipeline,
    )


def enqueue_report(queue: Queue, placement_id: str, settings: Settings) -> Job:
    """Enqueue the rendering of a finished placement's report (the worker does, not a GET)."""
    return queue.enqueue_call(
        REPORT_FUNCTION,
        args=(placement_id,),
        job_id=report_job_id(placement_id),
        timeout=settings.report_timeout_s,
        result_ttl=60,
        failure_ttl=settings.result_ttl_s,
        description=f"report of placement {placement_id}",
    )


def fetch(redis: Redis, placement_id: str) -> Job | None:
    try:
        return Job.fetch(placement_id, connection=redis, serializer=SERIALIZER)
    except NoSuchJobError:
        return None


def fetch_many(redis: Redis, ids: Sequence[str]) -> list[Job | None]:
    return Job.fetch_many(list(ids), connection=redis, serializer=SERIALIZER)


def cancel(redis: Redis, job: Job) -> None:
    """Stop a job: drop it from the queue, or make its worker kill the running work horse."""
    status = job.get_status(refresh=True)
    if status == JobStatus.STARTED:
        # It may have ended meanwhile; the record already says canceled either way.
        with suppress(InvalidJobOperation, NoSuchJobError):
            send_stop_job_command(redis, job.id, serializer=SERIALIZER)
        return
    if status in (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED, JobStatus.CREATED):
        with suppress(InvalidJobOperation):
            job.cancel()


def progress(job: Job) -> dict[str, object] | None:
    meta = job.meta or {}
    value = meta.get("progress")
    return value if isinstance(value, dict) else None
