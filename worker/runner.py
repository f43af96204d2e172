"""The worker process: an RQ forking worker on the placement queue, tuned to notice deaths.

RQ's defaults notice a killed worker only after about ten minutes (heartbeat TTL of 90 s,
maintenance every 600 s). :class:`PlacementWorker` shortens both from settings so a job whose
worker was SIGKILLed is retried or failed well within two minutes. Its maintenance also runs
the service's (:func:`baechi.worker.maintenance.sweep`): the API's reads never write.
It takes report renderings from a second queue only when no placement waits.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import sys

import redis.exceptions
from redis import Redis
from rq import Worker
from rq.job import Job, JobStatus
from rq.queue import Queue

from baechi.jobs import queue as jobqueue
from baechi.jobs.lifecycle import describe_failure
from baechi.jobs.settings import Settings
from baechi.jobs.store import Store

#: Errors of a Redis that is briefly unreachable; a busy worker rides them out.
REDIS_OUTAGE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class PlacementWorker(Worker):
    """A forking RQ worker with short heartbeats and a failure hook for killed work horses."""

    #: Seconds a running job's registry entry outlives its last heartbeat.
    grace_s: int = 20
    #: The deployment's settings (set by :func:`build_worker`).
    settings: Settings

    @property
    def dequeue_timeout(self) -> int:
        # An idle worker blocks on the queue this long; waking up often enough lets its
        # maintenance (reaping abandoned jobs) run on time.
        return max(1, min(self.worker_ttl - 15, self.maintenance_interval))

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        # RQ adds 60 s to the monitoring interval; a dead worker's job would then look alive
        # for 90 s. Heartbeats come every interval, so a few seconds of grace are enough.
        return self.job_monitoring_interval + self.grace_s

    def maintain_heartbeats(self, job: Job, execution) -> None:
        try:
            super().maintain_heartbeats(job, execution)
            # RQ reaps abandoned jobs only between jobs; a worker busy with a long placement
            # reaps too, so a dead peer's job is noticed even when every live worker is busy.
            if self.should_run_maintenance_tasks:
                self.clean_registries()
        except REDIS_OUTAGE as exc:
            # Redis went away for a moment (a restart, a failover): the work horse runs on,
            # and the next beat, a second or so later, tries again. Raising here made RQ quit
            # the worker for good (issue 12, item 11).
            self.log.warning("Worker %s: heartbeat skipped, Redis unreachable: %s",
                             self.name, exc)

    def clean_registries(self) -> None:
        super().clean_registries()
        from baechi.worker.maintenance import sweep

        sweep(Store(self.connection), self.settings)

    def main_work_horse(self, job: Job, queue: Queue) -> None:
        # The work horse dies with the worker's main process: an orphan would go on computing
        # the job while its retry runs elsewhere, and its timeout could fail the retry.
        die_with_parent()
        super().main_work_horse(job, queue)

    def handle_job_failure(self, job: Job, queue: Queue, started_job_registry=None,
                           exc_string: str = "", execution=None) -> None:
        super().handle_job_failure(job, queue, started_job_registry=started_job_registry,
                                   exc_string=exc_string, execution=execution)
        # A work horse killed by a signal (OOM killer, kill -9) fails here without RQ calling
        # the job's failure callback; record it once the retry is spent.
        if job.get_status(refresh=True) == JobStatus.FAILED:
            from baechi.worker.tasks import record_failure, report_failed

            if job.func_name == jobqueue.REPORT_FUNCTION:
                report_failed(Store(self.connection), job.args[0], exc_string)
                return

            ran = (job.ended_at - job.started_at).total_seconds() \
                if job.ended_at and job.started_at else None
            record = Store(self.connection).get(job.id)
            timeout = record.timeout_s if record is not None else None
            record_failure(Store(self.connection), job.id,
                           describe_failure(exc_string, timeout_s=timeout, ran_s=ran))


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``); a no-op
    elsewhere. If the parent is already gone, exit now."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(1)


def default_name() -> str:
    """``{hostname}.{pid}``: unique per process, and lets a container find its own worker."""
    return f"{socket.gethostname()}.{os.getpid()}"


def preload() -> None:
    """Import the engine before forking, so each work horse starts with it loaded, and
    freeze what the imports made (:func:`gc.freeze`, as Python's documentation advises
    before forking): it lives as long as the worker, and a work horse's full collections no
    longer walk it, nor copy its pages on write. GNMT under 700 MiB, ``auto`` at 5 s in a
    forked child: 0.16-0.19 s of full collections instead of 0.02-0.03 s."""

    gc.freeze()


def build_worker(settings: Settings, redis: Redis, queue_name: str | None = None,
                 name: str | None = None) -> PlacementWorker:
    queue = Queue(queue_name or settings.queue_name, connection=redis,
                  serializer=jobqueue.SERIALIZER)
    # placements first: RQ takes from the first queue that has a job
    worker = PlacementWorker(
        [queue, jobqueue.make_report_queue(redis, settings)],
        name=name or default_name(),
        connection=redis,
        serializer=jobqueue.SERIALIZER,
        worker_ttl=settings.worker_ttl_s,
        job_monitoring_interval=settings.worker_heartbeat_s,
        maintenance_interval=settings.worker_maintenance_s,
        default_result_ttl=settings.result_ttl_s,
    )
    worker.grace_s = settings.worker_grace_s
    worker.settings = settings
    return worker


def run_worker(settings: Settings, *, burst: bool = False, queue_name: str | None = None,
               name: str | None = None, logging_level: str = "INFO") -> int:
    """Run a worker until it is stopped (or, with ``burst``, until the queue is empty)."""
    from baechi.jobs.connection import RedisUnavailable, connect

    try:
        redis = connect(settings.redis_url, check=True)
    except RedisUnavailable as exc:
        print(f"baechi worker: {exc}", file=sys.stderr)
        return 1
    preload()
    worker = build_worker(settings, redis, queue_name, name)
    logging.basicConfig(level=logging_level)
    worker.work(burst=burst, logging_level=logging_level)
    return 0
