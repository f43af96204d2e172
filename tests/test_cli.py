"""The ``baechi`` command: summaries, plans on disk, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from helpers import edge, graph_doc, op

from baechi.cli import main

GNMT = ROOT / "examples" / "graphs" / "gnmt_baechi.json"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """The real console entry point in a child process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "baechi.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_readme_main_job_places_the_bundled_graph(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    result = run("place", str(GNMT), "--devices", "4", "--memory", "768MiB", "--latency-us",
                 "134", "--bandwidth-gbps", "5.7", "-o", str(plan_path))
    assert result.returncode == 0, result.stderr
    for line in ("step time", "lower bound", "single device", "speedup", "peak memory",
                 "transfers", "placement", "reduction", "algorithm      auto", "candidates",
                 "chosen", "m-fill/unreduced"):
        assert line in result.stdout
    plan = json.loads(plan_path.read_text())
    # auto, the default: better than its first plan (m-ETF's, 139.1 ms) and says how
    first, *_ = plan["stats"]["candidates"]
    assert (first["algorithm"], first["pipeline"]) == ("m-etf", True)
    assert plan["estimate"]["step_time_us"] < first["step_time_us"]
    assert plan["stats"]["chosen"]["algorithm"] in {c["algorithm"] for c in
                                                    plan["stats"]["candidates"]}
    # with time left, local search restarts from the next fastest plan (auto.SEARCH_RESTARTS)
    restarts = [c for c in plan["stats"]["candidates"]
                if c["algorithm"] == "local-search" and c["note"].startswith("from ")]
    # the CLI lists each candidate on its own line, with the note that tells reruns apart
    assert "local-search" in result.stdout and "ms: from " in result.stdout
    assert len(restarts) == 1 and plan["estimate"]["step_time_us"] <= min(
        c["step_time_us"] for c in plan["stats"]["candidates"] if c["step_time_us"])
    assert plan["format"] == "baechi.plan/v1" and len(plan["placement"]) == 2494
    # 768 MiB is below GNMT's single-device peak: the plan must use several devices
    assert len(set(plan["placement"].values())) > 1 and plan["estimate"]["memory_ok"]
    assert not list(tmp_path.glob("*.partial"))
    replay = run("simulate", str(GNMT), str(plan_path), "--json")
    assert replay.returncode == 0, replay.stderr
    estimate = json.loads(replay.stdout[replay.stdout.index("{"):])
    assert estimate == plan["estimate"]


@pytest.mark.parametrize("algorithm", ["single", "m-topo", "m-etf", "m-sct"])
def test_every_algorithm_from_the_cli(tmp_path: Path, algorithm: str, capsys) -> None:
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(graph_doc([op("a", 5), op("b", 5), op("c", 5)],
                                          [edge("a", "b", 10), edge("a", "c", 10)])))
    assert main(["place", str(graph), "--devices", "2", "--algorithm", algorithm,
                 "--comm", "parallel", "--no-single"]) == 0
    assert f"algorithm      {algorithm} on 2 devices" in capsys.readouterr().out


@pytest.mark.parametrize("algorithm", ["throughput-contiguous", "throughput-cpsat"])
def test_throughput_objective_summary(tmp_path: Path, algorithm: str, capsys) -> None:
    """The throughput summary reads the typed stats (it used to call ``stats.get`` and
    crash with a traceback)."""
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(graph_doc([op("a", 5), op("b", 7), op("c", 3)],
                                          [edge("a", "b", 10), edge("b", "c", 10)])))
    assert main(["place", str(graph), "--devices", "2", "--objective", "throughput",
                 "--algorithm", algorithm]) == 0
    out = capsys.readouterr().out
    if algorithm == "throughput-cpsat":
        assert "time/sample" in out and "(proved optimal)" in out
    else:  # {a, c} | {b} (8 us) beats the best contiguous split (10 us): no claim for it
        assert "time/sample    0.010 ms  (best found; bound" in out
        assert "optimal among contiguous splits" in out


def test_invalid_input_exits_2_with_one_line(tmp_path: Path) -> None:
    graph = tmp_path / "bad.json"
    graph.write_text(json.dumps(graph_doc([op("a", -3)])))
    result = run("place", str(graph))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "op 'a' (ops[0]).compute_us" in result.stderr and "Traceback" not in result.stderr
    result = run("place", str(GNMT), "--memory", "lots")
    assert result.returncode == 2 and "cannot read size 'lots'" in result.stderr


def test_infeasible_exits_3_and_says_what_is_missing(tmp_path: Path) -> None:
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(graph_doc([op("w", 1, persistent_bytes=3 * 2**20)])))
    result = run("place", str(graph), "--devices", "2", "--memory", "1MiB")
    assert result.returncode == 3
    assert "op 'w' needs 3145728 bytes" in result.stderr and "bytes missing" in result.stderr


def test_simulate_rejects_an_invalid_plan(tmp_path: Path) -> None:
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(graph_doc([op("a"), op("b")], [edge("a", "b")])))
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({
        "format": "baechi.plan/v1",
        "request": {"algorithm": "hand", "cluster": {"devices": {"count": 1}}},
        "placement": {"a": "/GPU:0", "b": "/GPU:0"}, "order": {"/GPU:0": ["b", "a"]}}))
    result = run("simulate", str(graph), str(plan))
    assert result.returncode == 2 and "inconsistent order" in result.stderr


def test_plugin_verbs_come_from_entry_points_and_a_broken_one_is_reported(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata

    from baechi import cli

    verbs = cli.build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"serve", "worker", "submit", "import"} <= set(verbs)
    real = importlib.metadata.entry_points(group=cli.PLUGIN_GROUP)
    broken = importlib.metadata.EntryPoint("broken", "baechi_no_such_module:register",
                                           cli.PLUGIN_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [*real, broken])
    verbs = cli.build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"serve", "submit", "import"} <= set(verbs)
    warning = capsys.readouterr().err
    assert "plugin 'broken' (baechi_no_such_module:register) could not be loaded" in warning
    assert "No module named 'baechi_no_such_module'" in warning


def test_a_missing_extra_names_the_pip_command(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from baechi import cli

    monkeypatch.setitem(cli.EXTRAS, "server", ("baechi_no_such_module",))
    assert cli.main(["serve"]) == 2
    error = capsys.readouterr().err.strip()
    assert error == ("baechi: error: baechi serve needs the 'server' extra "
                     "(baechi_no_such_module not installed): pip install 'baechi[server]'")


def test_the_summary_notes_an_op_too_large_to_split(tmp_path: Path, capsys) -> None:
    """stats.largest_op carries the figure; the summary says what it means above 30%."""
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(graph_doc([op("body", 80), op("head", 20)],
                                          [edge("body", "head", 10)])))
    assert main(["place", str(graph), "--devices", "2", "--algorithm", "m-etf",
                 "-o", str(tmp_path / "p.json")]) == 0
    assert "op 'body' holds 80% of the compute" in capsys.readouterr().out
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["stats"]["largest_op"] == {"name": "body", "share": 0.8}
