"""Jobs under stress: cancel, SIGKILLed workers, a Redis restart, 50 concurrent submissions.

Tests that hold or kill workers, or restart Redis, get an isolated stack from
``make_service``; ``BAECHI_WORKER_HOLD_S`` keeps a job ``running`` long enough to act on it.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from service_fixtures import RedisServer, Service, chain_graph, cluster, needs_redis, wait_until

pytestmark = [needs_redis, pytest.mark.service]

HOLD = {"BAECHI_WORKER_HOLD_S": "60"}


def body(name: str | None = None, n: int = 30) -> dict[str, Any]:
    return {"graph": chain_graph(n, name=name or f"g-{uuid.uuid4().hex[:8]}"),
            "cluster": cluster(), "algorithm": "single"}


def submit(http: Any, request: dict[str, Any] | None = None) -> str:
    response = http.post("/placements", json=request or body())
    assert response.status_code == 202, response.text
    return response.json()["id"]


# -------------------------------------------------------------------------- cancel
def test_cancel_queued_and_running_placements(make_service: Any) -> None:
    stack: Service = make_service(workers=0)
    with stack.client() as http:
        queued = submit(http)
        assert http.get(f"/placements/{queued}").json()["status"] == "queued"
        canceled = http.delete(f"/placements/{queued}")
        assert canceled.status_code == 200, canceled.text
        assert canceled.json()["status"] == "canceled"
        assert canceled.json()["finished_at"] is not None
        # Canceling again is harmless.
        assert http.delete(f"/placements/{queued}").json()["status"] == "canceled"

        holder = stack.start_worker(**HOLD)
        running = submit(http)
        stack.wait(running, statuses=("running",), timeout=30)
        response = http.delete(f"/placements/{running}")
        assert response.status_code == 200 and response.json()["status"] == "canceled"
        # The worker kills the work horse and stays up for the next job.
        wait_until(lambda: not holder.children(), 30, "the work horse to be killed")
        assert holder.alive
        assert http.get(f"/placements/{running}").json()["status"] == "canceled"
        for pid in (queued, running):
            assert http.get(f"/placements/{pid}/plan").status_code == 409

        stack.kill_worker(holder)
        stack.start_worker()
        after = submit(http)
        assert stack.wait(after)["status"] == "finished"
        # The canceled queued job never ran, even with a free worker.
        assert http.get(f"/placements/{queued}").json()["status"] == "canceled"
        listing = {p["id"]: p["status"] for p in http.get("/placements").json()["items"]}
    assert listing == {queued: "canceled", running: "canceled", after: "finished"}


# ---------------------------------------------------------------------- SIGKILL
def test_sigkilled_worker_job_is_retried_then_failed_never_left_running(
        make_service: Any) -> None:
    stack: Service = make_service(workers=0)
    with stack.client() as http:
        # 1. The worker and its work horse die mid-job: the job is retried and finishes.
        doomed = stack.start_worker(**HOLD)
        pid = submit(http)
        stack.wait(pid, statuses=("running",), timeout=30)
        stack.kill_worker(doomed, signal.SIGKILL)
        stack.start_worker()
        status = stack.wait(pid, timeout=120)
        assert status["status"] == "finished", status
        assert http.get(f"/placements/{pid}/plan").status_code == 200

        # 2. Killed on both attempts: it ends failed with a message saying the worker died.
        for worker in list(stack.workers):
            if worker.alive:
                stack.kill_worker(worker)
        second = submit(http)
        redis = stack.redis.client()
        for attempt in (1, 2):
            # maintenance is the workers' (a GET only reads): the next worker notices the
            # dead one's job, requeues it and runs it
            doomed = stack.start_worker(**HOLD)
            wait_until(lambda n=attempt: redis.hget(f"baechi:placement:{second}", "attempts")
                       == str(n).encode(), 60, f"attempt {attempt} to run")
            stack.wait(second, statuses=("running",), timeout=60)
            stack.kill_worker(doomed, signal.SIGKILL)
        stack.start_worker()
        status = stack.wait(second, timeout=120)
    assert status["status"] == "failed", status
    assert status["error"]["code"] == "worker_died"
    assert "worker" in status["error"]["message"] and "died" in status["error"]["message"]
    assert stack.api is not None
    assert "Traceback" not in stack.api.log.read_text(), stack.api.tail()


def test_a_busy_worker_reaps_a_dead_peers_job(make_service: Any) -> None:
    """Nobody polls the API here: the live worker, busy with its own job, requeues the job
    of the worker that was killed."""
    from rq.job import Job
    from rq.serializers import JSONSerializer

    stack: Service = make_service(workers=0)
    busy = stack.start_worker(**HOLD)
    doomed = stack.start_worker(**HOLD)
    with stack.client() as http:
        first, second = submit(http), submit(http)
        for pid in (first, second):
            stack.wait(pid, statuses=("running",), timeout=30)
    redis = stack.redis.client()
    jobs = {pid: Job.fetch(pid, connection=redis, serializer=JSONSerializer)
            for pid in (first, second)}
    victim = next(pid for pid, job in jobs.items() if job.worker_name == doomed.name)
    stack.kill_worker(doomed, signal.SIGKILL)

    def requeued() -> bool:
        return Job.fetch(victim, connection=redis, serializer=JSONSerializer) \
            .get_status() == "queued"

    wait_until(requeued, 60, "the busy worker to requeue the dead worker's job")
    assert busy.alive
    stack.kill_worker(busy)  # (rather than wait for its held job at teardown)


def test_sigkilled_work_horse_is_retried_by_its_worker(make_service: Any) -> None:
    stack: Service = make_service(workers=0)
    worker = stack.start_worker(BAECHI_WORKER_HOLD_S="2")
    with stack.client() as http:
        pid = submit(http)
        stack.wait(pid, statuses=("running",), timeout=30)
        horses = wait_until(worker.children, 10, "the work horse")
        for horse in horses:
            os.kill(horse, signal.SIGKILL)
        status = stack.wait(pid, timeout=60)
    assert status["status"] == "finished", status
    assert worker.alive


# ------------------------------------------------------------------------- timeout
def test_job_timeout_follows_time_limit_and_fails_without_retry(make_service: Any) -> None:
    # Job timeout = time_limit_s + overhead (5 s here) + 1; the held job overruns it.
    stack: Service = make_service(workers=1, env={"BAECHI_JOB_OVERHEAD_S": "5", **HOLD})
    with stack.client() as http:
        request = body()
        request["options"] = {"time_limit_s": 1}
        pid = submit(http, request)
        status = stack.wait(pid, timeout=60)
    assert status["status"] == "failed", status
    assert status["error"]["code"] == "timeout"
    assert "7 s" in status["error"]["message"]
    # one attempt only: a timeout is not retried
    assert stack.redis.client().hget(f"baechi:placement:{pid}", "attempts") == b"1"


# ------------------------------------------------------------------- Redis restart
def test_redis_restart_between_submit_and_work_keeps_the_job(make_service: Any) -> None:
    stack: Service = make_service(workers=0)
    with stack.client() as http:
        pid = submit(http)
        redis: RedisServer = stack.redis
        redis.restart()
        stack.start_worker()
        status = stack.wait(pid, timeout=60)
        assert status["status"] == "finished", status
        assert http.get(f"/placements/{pid}/plan").status_code == 200
        # The API reconnected by itself.
        assert submit(http) != pid


# ---------------------------------------------------------------------- concurrency
def test_fifty_concurrent_submissions_two_workers_none_lost_none_duplicated(
        service: Service) -> None:
    tag = uuid.uuid4().hex[:8]
    requests = [body(f"c{tag}-{i}", n=60) for i in range(50)]
    # Ten of them are sent twice at the same time: idempotency must hold under the race.
    sends = requests + requests[:10]
    with service.client() as http:
        before = _metric(http, 'baechi_jobs_ended_total{status="finished"}')
        with ThreadPoolExecutor(max_workers=16) as pool:
            responses = list(pool.map(lambda r: http.post("/placements", json=r), sends))
        assert all(r.status_code == 202 for r in responses), [r.text for r in responses
                                                              if r.status_code != 202]
        ids = [r.json()["id"] for r in responses]
        assert len(set(ids[:50])) == 50
        assert ids[50:] == ids[:10]

        started = time.monotonic()
        statuses = [service.wait(pid, timeout=180) for pid in ids[:50]]
        assert [s["status"] for s in statuses] == ["finished"] * 50
        elapsed = time.monotonic() - started
        after = _metric(http, 'baechi_jobs_ended_total{status="finished"}')
        names = {http.get(f"/placements/{pid}/plan").json()["graph"]["name"] for pid in ids[:50]}
    # Each finished once, on its first attempt (no job ran twice), each with its own graph.
    assert after - before == 50
    assert names == {f"c{tag}-{i}" for i in range(50)}
    redis = service.redis.client()
    attempts = [redis.hget(f"baechi:placement:{pid}", "attempts") for pid in ids[:50]]
    assert attempts == [b"1"] * 50
    print(f"50 placements finished {elapsed:.1f} s after the last submission")


def _metric(http: Any, name: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name):
            return float(line.split()[-1])
    return 0.0


# ------------------------------------------------------------------------ progress
def test_progress_is_throttled(redis_server: RedisServer) -> None:
    from rq import Queue
    from rq.serializers import JSONSerializer

    from baechi.worker.progress import Canceled, ProgressReporter

    redis = redis_server.client(db=3)
    queue = Queue(f"progress-{uuid.uuid4().hex[:6]}", connection=redis,
                  serializer=JSONSerializer)
    job = queue.enqueue_call("builtins.print", args=("x",))
    canceled = {"flag": False}
    reporter = ProgressReporter(job, 0.2, lambda: canceled["flag"])
    calls = 0
    started = time.monotonic()
    while time.monotonic() - started < 1.0:
        for i in range(1000):
            reporter("place", i / 1000)
        calls += 1000
    elapsed = time.monotonic() - started
    # at most one write per interval (the first is immediate), however many calls came
    assert 1 <= reporter.writes <= elapsed / 0.2 + 1 and calls >= 1000
    job.refresh()
    assert job.meta["progress"]["phase"] == "place"
    canceled["flag"] = True
    eager = ProgressReporter(job, 0.0, lambda: canceled["flag"])
    with pytest.raises(Canceled):
        eager("place", 1.0)
    queue.empty()


# ------------------------------------------------- Redis outage under a busy worker
def test_a_busy_worker_survives_a_short_redis_outage(make_service: Any) -> None:
    # issue 12, item 11: a worker running a job when Redis went away for a few seconds
    # exited for good; it must finish the job and stay registered
    stack: Service = make_service(workers=0)
    worker = stack.start_worker(BAECHI_WORKER_HOLD_S="8", BAECHI_WORKER_HEARTBEAT_S="1")
    with stack.client() as http:
        pid = submit(http)
    stack.wait(pid, statuses=("running",), timeout=30)
    stack.redis.stop()
    time.sleep(4)
    stack.redis.start()
    status = stack.wait(pid, timeout=90)
    assert status["status"] == "finished", status
    assert worker.alive, worker.tail()
    with stack.client() as http:
        assert http.get("/readyz").status_code == 200
        assert stack.wait(submit(http), timeout=60)["status"] == "finished"  # still working


def test_the_work_horse_dies_with_the_workers_main_process(make_service: Any) -> None:
    # issue 12, item 14: an orphaned work horse went on computing the job its retry ran again
    stack: Service = make_service(workers=0)
    worker = stack.start_worker(**HOLD)
    with stack.client() as http:
        pid = submit(http)
    stack.wait(pid, statuses=("running",), timeout=30)
    horses = wait_until(worker.children, 10, "the work horse to start")
    stack.kill_worker(worker, signal.SIGKILL, children=False)  # the main process only

    def gone() -> bool:
        return not any(os.path.exists(f"/proc/{horse}") and
                       "Z" not in open(f"/proc/{horse}/stat").read().split(")")[-1].split()[0]
                       for horse in horses)

    wait_until(gone, 10, f"work horse {horses} to die with its worker")
