"""The client SDK and CLI against the real service: API, Redis and RQ workers (no mocks).

Uses the ``service`` and ``make_service`` fixtures of ``service_fixtures.py``; skipped, saying
so, where ``redis-server`` is missing.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import DATA
from service_fixtures import chain_graph, cluster, needs_redis

import baechi
from baechi import client
from baechi.cli import main
from baechi.client import PlanMismatch
from baechi.defaults import DEFAULT_ALGORITHM

pytestmark = [pytest.mark.service, needs_redis]


@pytest.fixture
def sdk(service: Any) -> Any:
    with client.BaechiClient(service.url, service.keys["key-a"], retries=2,
                             backoff=0.2) as sdk:
        yield sdk


def unique_graph(tag: str, n: int = 20) -> dict[str, Any]:
    """A graph no other test submitted (identical requests share one placement)."""
    return chain_graph(n, name=f"client-{tag}-{time.time_ns()}")


def test_submit_wait_plan(sdk: Any) -> None:
    graph = unique_graph("wait")
    placement = sdk.submit(graph, cluster(2), algorithm="m-etf")
    plan = placement.wait(timeout=120, progress=False)
    assert isinstance(plan, baechi.Plan)
    assert set(plan.placement) == {op["name"] for op in graph["ops"]}
    assert plan.request.algorithm == "m-etf"
    assert plan.estimate is not None and plan.estimate.step_time_us > 0
    assert baechi.simulate(baechi.load_graph(graph), plan).step_time_us == pytest.approx(
        plan.estimate.step_time_us)
    status = placement.status()
    assert status.status == "finished" and status.done
    assert status.created_at is not None and status.finished_at is not None
    assert placement.plan().placement == plan.placement


def test_default_algorithm_is_the_engines(sdk: Any) -> None:
    # one default for the engine, the CLI, the service and the SDK (baechi.defaults); it was
    # m-sct in the SDK and m-etf elsewhere until issue 12
    plan = sdk.submit(unique_graph("default"), cluster(2)).wait(timeout=120, progress=False)
    assert plan.request.algorithm == DEFAULT_ALGORITHM == "auto"
    assert plan.stats.chosen is not None


def test_graph_inputs_and_upload(sdk: Any, tmp_path: Path) -> None:
    graph = unique_graph("upload")
    path = tmp_path / "g.json"
    path.write_text(json.dumps(graph))
    by_dict = sdk.submit(graph, cluster(2), "m-etf")
    by_path = sdk.submit(path, cluster(2), "m-etf")
    assert by_path.id == by_dict.id  # identical request of the same tenant: same placement
    graph_id = sdk.upload_graph(baechi.load_graph(graph))
    assert graph_id == baechi.load_graph(graph).sha256
    by_id = sdk.submit(graph_id, cluster(3), "m-etf")
    plan = by_id.wait(timeout=120, progress=False)
    assert set(plan.placement) == {op["name"] for op in graph["ops"]}
    assert by_id.id in {s.id for s in sdk.placements(limit=50)}


def test_imported_profile_end_to_end(sdk: Any) -> None:
    from baechi.importers import import_graph

    graph = import_graph("pipedream", DATA / "importers/pipedream/alexnet/graph.txt")
    graph["name"] += f"-{time.time_ns()}"
    plan = sdk.submit(graph, cluster(4), "m-etf").wait(timeout=120, progress=False)
    assert len(plan.placement) == 23


def test_invalid_graph_is_refused_naming_the_op(sdk: Any) -> None:
    graph = unique_graph("invalid")
    graph["ops"][3]["compute_us"] = -1
    with pytest.raises(client.InvalidInput) as info:
        sdk.submit(graph, cluster(2))
    assert info.value.status == 422
    assert "op3" in info.value.message and "compute_us" in info.value.message
    assert info.value.code


def test_wrong_key_unknown_id_and_other_tenants(service: Any, sdk: Any) -> None:
    with client.BaechiClient(service.url, "not-a-key") as stranger, pytest.raises(
        client.Unauthorized
    ) as info:
        stranger.submit(unique_graph("auth"), cluster(2))
    assert info.value.status == 401
    with pytest.raises(client.NotFound):
        sdk.placement("0" * 32).status()
    placement = sdk.submit(unique_graph("tenant"), cluster(2), "m-etf")
    with client.BaechiClient(service.url, service.keys["key-b"]) as other, pytest.raises(
        client.NotFound
    ):
        other.placement(placement.id).status()


def test_failed_job_raises_with_the_job_error(sdk: Any) -> None:
    graph = unique_graph("infeasible")
    tiny = {"devices": {"count": 2, "memory_bytes": 10}}
    placement = sdk.submit(graph, tiny, "m-etf")
    with pytest.raises(client.PlacementFailed) as info:
        placement.wait(timeout=120, progress=False)
    assert info.value.code == "infeasible"
    assert placement.last_status.status == "failed"


def test_queued_job_plan_conflict_wait_timeout_and_cancel(make_service: Any) -> None:
    stack = make_service(workers=0)  # nothing runs: the job stays queued
    with client.BaechiClient(stack.url, stack.keys["key-a"]) as sdk:
        placement = sdk.submit(unique_graph("cancel"), cluster(2))
        assert placement.status().status == "queued"
        with pytest.raises(client.Conflict) as info:
            placement.plan()
        assert info.value.status == 409
        with pytest.raises(client.WaitTimeout):
            placement.wait(timeout=0.5, progress=False)
        assert placement.cancel().status == "canceled"
        with pytest.raises(client.PlacementCanceled):
            placement.wait(timeout=10, progress=False)


def test_cancel_a_finished_placement_is_a_conflict(sdk: Any) -> None:
    placement = sdk.submit(unique_graph("done"), cluster(2), "m-etf")
    placement.wait(timeout=120, progress=False)
    with pytest.raises(client.Conflict):
        placement.cancel()


def test_503_while_redis_is_down_is_retried(make_service: Any) -> None:
    stack = make_service(workers=1)
    with client.BaechiClient(stack.url, stack.keys["key-a"], retries=1, backoff=0.1) as sdk:
        placement = sdk.submit(unique_graph("redis"), cluster(2), "m-etf")
        placement.wait(timeout=120, progress=False)
        stack.redis.stop()
        with pytest.raises(client.ServiceUnavailable) as info:
            placement.status()
        assert info.value.status == 503 and "Redis" in info.value.message

        # A patient client rides out the outage: it retries until Redis is back. Redis is
        # restarted from this (main) thread: the fixture ties its life to the starting thread.
        answer: dict[str, str] = {}

        def ask() -> None:
            with client.BaechiClient(stack.url, stack.keys["key-a"], retries=10,
                                     backoff=0.5) as patient:
                answer["status"] = patient.placement(placement.id).status().status

        asking = threading.Thread(target=ask)
        asking.start()
        time.sleep(1.5)
        stack.redis.start()
        asking.join(timeout=120)
        assert answer.get("status") == "finished"


def test_cli_submit_status_fetch(service: Any, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    graph_path = tmp_path / "g.json"
    graph_path.write_text(json.dumps(unique_graph("cli")))
    plan_path = tmp_path / "plan.json"
    server = ["--server", service.url, "--api-key", service.keys["key-a"]]
    code = main(["submit", str(graph_path), *server, "--devices", "2", "--memory", "1GiB",
                 "--latency-us", "10", "--bandwidth-gbps", "5", "--algorithm", "m-etf",
                 "--wait", "-o", str(plan_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    placement_id = out.splitlines()[0]
    assert "step time" in out and f"plan written to {plan_path}" in out
    plan = baechi.Plan.parse(json.loads(plan_path.read_text()))
    assert plan.request.cluster["devices"] == {"count": 2, "memory_bytes": "1GiB"}

    assert main(["status", placement_id, *server]) == 0
    assert capsys.readouterr().out.split() == [placement_id, "finished"]
    assert main(["status", placement_id, *server, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "finished"
    fetched = tmp_path / "fetched.json"
    assert main(["fetch", placement_id, *server, "-o", str(fetched)]) == 0
    assert json.loads(fetched.read_text())["placement"] == plan.placement
    assert f"plan written to {fetched}" in capsys.readouterr().out

    # Without --wait: the id alone on stdout, for scripts.
    code = main(["submit", str(graph_path), *server, "--devices", "3"])
    captured = capsys.readouterr()
    assert code == 0 and len(captured.out.split()) == 1


def test_cli_errors_exit_codes(service: Any, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    bad = unique_graph("cli-bad")
    bad["edges"].append({"src": "op1", "dst": "nowhere", "bytes": 1})
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    server = ["--server", service.url, "--api-key", service.keys["key-a"]]
    assert main(["submit", str(path), *server]) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and err.count("\n") == 1
    assert main(["status", "f" * 32, *server]) == 1
    assert "not_found" in capsys.readouterr().err
    assert main(["status", "f" * 32, "--server", service.url, "--api-key", "nope"]) == 1
    assert "unauthorized" in capsys.readouterr().err


def test_cli_submits_a_throughput_request_and_apply_plan_refuses_its_plan(
        service: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``baechi submit --objective throughput`` reaches the service; its plan (pipeline
    stages) is refused by ``apply_plan``, which runs single steps."""
    from baechi.client.tf.pinning import read_plan

    graph_path = tmp_path / "g.json"
    graph_path.write_text(json.dumps(unique_graph("cli-throughput")))
    plan_path = tmp_path / "plan.json"
    server = ["--server", service.url, "--api-key", service.keys["key-a"]]
    code = main(["submit", str(graph_path), *server, "--devices", "2", "--objective",
                 "throughput", "--wait", "-o", str(plan_path)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    plan = json.loads(plan_path.read_text())
    assert plan["request"]["objective"] == "throughput"
    assert "time_per_sample_us" in plan["estimate"]
    with pytest.raises(PlanMismatch, match="objective 'throughput'.*pipeline stages"):
        read_plan(plan)  # what TensorFlow's and PyTorch's apply_plan read first
