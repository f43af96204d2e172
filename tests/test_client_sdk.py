"""The client SDK without a service: retries, error mapping, inputs, progress bar, CLI errors.

Responses come from ``httpx.MockTransport`` handlers that play the service's documented
answers (docs/format.md §7); the same behaviour against the real service is in
``test_client_service.py``.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from baechi import client
from baechi.cli import main
from baechi.progress import ProgressBar

URL = "http://baechi.test"
GRAPH = {"format": "baechi.graph/v1", "name": "g",
         "ops": [{"name": "a", "compute_us": 1.0}, {"name": "b", "compute_us": 2.0}],
         "edges": [{"src": "a", "dst": "b", "bytes": 8}]}
CLUSTER = {"devices": {"count": 2}}


class Recorder:
    """An httpx handler answering from a list of (status, body, headers), recording requests."""

    def __init__(self, *answers: tuple[int, Any] | tuple[int, Any, dict[str, str]]) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        status, body, *rest = answer
        if isinstance(body, Exception):
            raise body
        headers = rest[0] if rest else {}
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.Response(status, content=content, headers=headers)


def make(recorder: Recorder, **kwargs: Any) -> tuple[client.BaechiClient, list[float]]:
    sleeps: list[float] = []
    sdk = client.BaechiClient(URL, "key-a", transport=httpx.MockTransport(recorder),
                              sleep=sleeps.append, **kwargs)
    return sdk, sleeps


def error(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details}}


def status(state: str, fraction: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {"id": "p1", "status": state, "progress": {"phase": state, "fraction": fraction},
            "error": None, "created_at": "2025-01-01T00:00:00Z", "started_at": None,
            "finished_at": None, **extra}


PLAN = {"format": "baechi.plan/v1", "request": {"algorithm": "m-etf", "cluster": CLUSTER},
        "placement": {"a": "/GPU:0", "b": "/GPU:0"}, "order": {"/GPU:0": ["a", "b"]}}


def test_submit_sends_the_request_with_the_key() -> None:
    recorder = Recorder((202, {"id": "p1", "status": "queued", "links": {}}))
    sdk, _ = make(recorder)
    placement = sdk.submit(GRAPH, CLUSTER, "m-etf", {"fusion": False})
    assert placement.id == "p1" and placement.last_status.status == "queued"
    request = recorder.requests[0]
    assert request.method == "POST" and request.url.path == "/placements"
    assert request.headers["X-API-Key"] == "key-a"
    assert json.loads(request.content) == {"graph": GRAPH, "cluster": CLUSTER,
                                           "algorithm": "m-etf", "options": {"fusion": False}}


def test_submit_accepts_paths_graph_objects_and_graph_ids(tmp_path: Path) -> None:
    import baechi

    path = tmp_path / "g.json"
    path.write_text(json.dumps(GRAPH))
    recorder = Recorder((202, {"id": "p1", "status": "queued"}))
    sdk, _ = make(recorder)
    sdk.submit(path, baechi.Cluster.parse(CLUSTER))
    sdk.submit(str(path), CLUSTER)
    sdk.submit(baechi.load_graph(GRAPH), CLUSTER)
    sdk.submit("ab" * 32, CLUSTER)
    bodies = [json.loads(r.content) for r in recorder.requests]
    assert bodies[0]["graph"] == bodies[1]["graph"] == GRAPH
    assert bodies[0]["algorithm"] == "auto"  # the one default (baechi.defaults)
    assert bodies[0]["cluster"]["devices"][0]["name"] == "/GPU:0"
    assert bodies[2]["graph"]["ops"] == GRAPH["ops"]
    assert bodies[3] == {"graph_id": "ab" * 32, "cluster": CLUSTER, "algorithm": "auto"}
    with pytest.raises(client.InvalidInput, match="cannot read graph file"):
        sdk.submit(tmp_path / "missing.json", CLUSTER)
    with pytest.raises(client.InvalidInput, match="not valid JSON"):
        sdk.submit("{not json", CLUSTER)


@pytest.mark.parametrize(
    ("status_code", "cls"),
    [(400, client.InvalidInput), (401, client.Unauthorized), (404, client.NotFound),
     (409, client.Conflict), (410, client.Gone), (413, client.PayloadTooLarge),
     (422, client.InvalidInput), (500, client.ServerError)],
)
def test_errors_are_typed_and_carry_the_server_message(status_code: int, cls: type) -> None:
    body = error("invalid_graph", "op 'x' (ops[3]).compute_us: must be finite", op="x")
    sdk, sleeps = make(Recorder((status_code, body)))
    with pytest.raises(cls) as info:
        sdk.placement("p1").status()
    assert isinstance(info.value, client.BaechiError)
    assert info.value.code == "invalid_graph"
    assert info.value.message == "op 'x' (ops[3]).compute_us: must be finite"
    assert info.value.details == {"op": "x"} and info.value.status == status_code
    assert sleeps == []  # never retried


def test_a_non_json_error_still_says_what_happened() -> None:
    sdk, _ = make(Recorder((502, b"<html>Bad gateway</html>")), retries=0)
    with pytest.raises(client.ServerError, match="HTTP 502: <html>Bad gateway"):
        sdk.placement("p1").status()


def test_retries_503_with_backoff_then_succeeds() -> None:
    unavailable = error("redis_unavailable", "the service cannot reach Redis")
    recorder = Recorder((503, unavailable), (503, unavailable), (200, status("queued")))
    sdk, sleeps = make(recorder, backoff=0.5)
    assert sdk.placement("p1").status().status == "queued"
    assert len(recorder.requests) == 3
    assert 0.25 <= sleeps[0] <= 0.5 and 0.5 <= sleeps[1] <= 1.0  # exponential, jittered


def test_retry_after_is_honoured() -> None:
    recorder = Recorder((503, error("unavailable", "busy"), {"Retry-After": "3"}),
                        (200, status("running")))
    sdk, sleeps = make(recorder)
    sdk.placement("p1").status()
    assert sleeps == [3.0]


def test_gives_up_after_the_retries_with_the_server_error() -> None:
    sdk, sleeps = make(Recorder((503, error("redis_unavailable", "no Redis"))), retries=3)
    with pytest.raises(client.ServiceUnavailable, match="no Redis") as info:
        sdk.placement("p1").status()
    assert info.value.code == "redis_unavailable" and info.value.status == 503
    assert len(sleeps) == 3


def test_connection_errors_are_retried_then_raised() -> None:
    refused = httpx.ConnectError("Connection refused")
    recorder = Recorder((0, refused), (0, refused), (200, status("finished", 1.0)))
    sdk, sleeps = make(recorder)
    assert sdk.placement("p1").status().done
    assert len(sleeps) == 2
    sdk, sleeps = make(Recorder((0, refused)), retries=2)
    with pytest.raises(client.ServiceUnavailable, match="cannot reach") as info:
        sdk.placement("p1").status()
    assert info.value.code == "connection_failed" and len(sleeps) == 2


def test_wait_polls_until_finished_and_returns_the_plan() -> None:
    recorder = Recorder((200, status("queued")), (200, status("running", 0.5)),
                        (200, status("finished", 1.0)), (200, PLAN))
    sdk, sleeps = make(recorder)
    plan = sdk.placement("p1").wait(progress=False)
    assert plan.placement == PLAN["placement"]
    assert [r.url.path for r in recorder.requests] == ["/placements/p1"] * 3 + [
        "/placements/p1/plan"]
    assert sleeps == [0.25, 0.375]  # growing pauses


def test_wait_raises_on_failed_and_canceled() -> None:
    failed = status("failed", error={"code": "infeasible", "message": "needs 3 GiB more",
                                     "details": {"missing_bytes": 3}})
    sdk, _ = make(Recorder((200, failed)))
    with pytest.raises(client.PlacementFailed, match="needs 3 GiB more") as info:
        sdk.placement("p1").wait(progress=False)
    assert info.value.code == "infeasible" and info.value.details["missing_bytes"] == 3
    sdk, _ = make(Recorder((200, status("canceled"))))
    with pytest.raises(client.PlacementCanceled):
        sdk.placement("p1").wait(progress=False)


def test_wait_timeout() -> None:
    sdk, _ = make(Recorder((200, status("running", 0.3))))
    with pytest.raises(client.WaitTimeout, match="still running"):
        sdk.placement("p1").wait(timeout=0.0, progress=False)


def test_placements_follow_the_pages() -> None:
    page1 = {"items": [status("finished") | {"id": "p3"}, status("queued") | {"id": "p2"}],
             "next_cursor": "17"}
    page2 = {"items": [status("failed") | {"id": "p1"}], "next_cursor": None}
    recorder = Recorder((200, page1), (200, page2))
    sdk, _ = make(recorder)
    assert [s.id for s in sdk.placements()] == ["p3", "p2", "p1"]
    assert recorder.requests[1].url.params["cursor"] == "17"


def test_progress_bar_draws_only_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    pipe = io.StringIO()
    bar = ProgressBar(pipe)
    bar.update("running", "place", 0.5)
    bar.close()
    assert pipe.getvalue() == ""
    term = Terminal()
    bar = ProgressBar(term)
    bar.update("running", "place", 0.5)
    bar.update("finished", "done", 1.0)
    bar.close()
    text = term.getvalue()
    assert "\r[###############...............]  50.0%  running: place" in text
    assert "100.0%" in text and text.endswith("\n")
    term = Terminal()
    bar = ProgressBar(term, enabled=False)
    bar.update("running", "place", 0.5)
    assert term.getvalue() == ""


def test_wait_draws_no_bar_when_stderr_is_not_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sdk, _ = make(Recorder((200, status("running", 0.5)), (200, status("finished", 1.0)),
                           (200, PLAN)))
    sdk.placement("p1").wait(progress=True)
    assert capsys.readouterr().err == ""


def test_http_part_needs_no_tensorflow() -> None:
    import subprocess

    code = ("import sys; from baechi import client; from baechi.client import BaechiClient; "
            "import baechi.client.cli; assert 'tensorflow' not in sys.modules, 'tf imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bad_urls_are_refused() -> None:
    with pytest.raises(client.BaechiError, match="must start with http"):
        client.BaechiClient("localhost:8000", "k")


def test_cli_needs_a_server(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BAECHI_URL", raising=False)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(GRAPH))
    assert main(["submit", str(path), "--devices", "2"]) == 2
    assert "no service URL" in capsys.readouterr().err


def test_cli_unreachable_server_is_exit_1(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.json"
    path.write_text(json.dumps(GRAPH))
    # Port 9 (discard) on loopback refuses connections.
    code = main(["status", "p1", "--server", "http://127.0.0.1:9", "--retries", "1"])
    err = capsys.readouterr().err
    assert code == 1 and "cannot reach the Baechi service" in err and err.count("\n") == 1


def test_cli_bad_cluster_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.json"
    path.write_text(json.dumps(GRAPH))
    code = main(["submit", str(path), "--server", URL, "--devices", "2", "--memory", "lots"])
    assert code == 2 and "cannot read size" in capsys.readouterr().err
