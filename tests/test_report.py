"""The plan report (issue 6), Python side: hooks, numbers, aggregation, escaping, CLI.

The browser side (lanes and bars actually drawn, no JavaScript errors, screenshot) is in
``test_report_browser.py``; the builders here are shared with it.
"""

from __future__ import annotations

import base64
import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import needs_shared

import baechi
from baechi.report import (
    MAX_OP_BARS,
    decimate,
    merge_small,
    render_report,
    write_report,
)

ODD_NAME = 'd</script><b>&"x'


# --------------------------------------------------------------------------- builders
def small_graph() -> dict[str, Any]:
    """Six ops: a data transfer each way, a control edge and an awkward op name."""
    ops = [
        {"name": "a", "type": "MatMul", "compute_us": 10, "output_bytes": 1_000_000},
        {"name": "b", "type": "Relu", "compute_us": 20, "output_bytes": 2_000_000,
         "temp_bytes": 500_000},
        {"name": "c", "type": "MatMul", "compute_us": 15, "output_bytes": 1000,
         "persistent_bytes": 3_000_000},
        {"name": ODD_NAME, "type": "Add", "compute_us": 5},
        {"name": "e", "type": "Const", "compute_us": 0},
        {"name": "f", "type": "Add", "compute_us": 7, "output_bytes": 10},
    ]
    edges = [
        {"src": "a", "dst": "b", "bytes": 1_000_000},
        {"src": "a", "dst": "c", "bytes": 1_000_000},
        {"src": "b", "dst": ODD_NAME, "bytes": 2_000_000},
        {"src": "c", "dst": ODD_NAME, "bytes": 1000},
        {"src": "e", "dst": "c", "bytes": 0, "control": True},
        {"src": "c", "dst": "f", "bytes": 1000},
    ]
    return {"format": "baechi.graph/v1", "name": "small", "ops": ops, "edges": edges}


def small_plan() -> dict[str, Any]:
    """``small_graph`` on two 8 MiB devices, 5 µs + 1 GB/s, sequential channels."""
    return {
        "format": "baechi.plan/v1",
        "request": {
            "algorithm": "hand",
            "cluster": {"devices": {"count": 2, "memory_bytes": "8MiB"},
                        "network": {"latency_us": 5, "bandwidth_gbps": 1}},
        },
        "placement": {"a": "/GPU:0", "b": "/GPU:0", "c": "/GPU:1", ODD_NAME: "/GPU:0",
                      "e": "/GPU:0", "f": "/GPU:1"},
        "order": {"/GPU:0": ["e", "a", "b", ODD_NAME], "/GPU:1": ["c", "f"]},
    }


def chain_graph(n: int, width: int = 8, seed: int = 0) -> dict[str, Any]:
    """A layered random graph of ``n`` ops, ``width`` per layer, many tiny ops and some big."""
    rng = random.Random(seed)
    types = ["MatMul", "Add", "Relu", "Conv2D", "Mul", "Const", "Identity", "Softmax",
             "Sum", "Tanh", "Reshape", "Transpose"]
    ops = []
    edges = []
    for i in range(n):
        compute = rng.lognormvariate(1.0, 1.6)
        ops.append({"name": f"layer{i // width}/op{i}", "type": types[i % len(types)],
                    "compute_us": round(compute, 3), "output_bytes": rng.randrange(0, 4 << 20),
                    "temp_bytes": rng.randrange(0, 1 << 20)})
        layer = i // width
        if layer:
            for src in rng.sample(range((layer - 1) * width, layer * width), 2):
                edges.append({"src": ops[src]["name"], "dst": ops[i]["name"],
                              "bytes": rng.randrange(0, 2 << 20)})
    return {"format": "baechi.graph/v1", "name": f"chain{n}", "ops": ops, "edges": edges}


def round_robin_plan(graph: dict[str, Any], devices: int, mode: str = "sequential"
                     ) -> dict[str, Any]:
    """Op ``i`` on device ``i % devices``; each device runs its ops in canonical topo order."""
    g = baechi.load_graph(graph)
    names = [f"/GPU:{d}" for d in range(devices)]
    placement = {name: names[i % devices] for i, name in enumerate(g.names)}
    order: dict[str, list[str]] = {name: [] for name in names}
    for op in g.topo:
        order[names[op % devices]].append(g.names[op])
    return {"format": "baechi.plan/v1",
            "request": {"algorithm": "round-robin",
                        "cluster": {"devices": {"count": devices, "memory_bytes": "4GiB"},
                                    "network": {"latency_us": 134, "bandwidth_gbps": 5.7,
                                                "mode": mode}}},
            "placement": placement, "order": order}


# --------------------------------------------------------------------------- page parsing
def figure_of(page: str) -> dict[str, Any]:
    match = re.search(r'<script type="application/json" id="report-figure">(.*?)</script>',
                      page, re.S)
    assert match
    return json.loads(match.group(1))


def plot_attrs(page: str) -> dict[str, int]:
    tag = re.search(r'<div id="plot" ([^>]*)>', page)
    assert tag
    return {k: int(v) for k, v in re.findall(r'(data-[a-z-]+)="(\d+)"', tag.group(1))}


def array(value: Any) -> np.ndarray:
    """Decode a plotly typed-array spec (or a plain list)."""
    if isinstance(value, dict):
        dtype = {"f8": "<f8", "i4": "<i4"}[value["dtype"]]
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=dtype)
    return np.asarray(value)


def card(page: str, key: str) -> str:
    match = re.search(rf'<div class="card" data-key="{key}"[^>]*>(.*?)</div></div>', page, re.S)
    assert match, key
    return match.group(1)


# --------------------------------------------------------------------------- tests
def test_small_plan_hooks_and_self_contained() -> None:
    page = render_report(small_graph(), small_plan())
    assert page.startswith("<!DOCTYPE html>")
    attrs = plot_attrs(page)
    assert attrs["data-devices"] == 2
    assert attrs["data-lanes"] == 4 and attrs["data-device-lanes"] == 2
    assert attrs["data-channel-lanes"] == 2
    assert attrs["data-ops"] == attrs["data-op-bars"] == 6 and attrs["data-merged-ops"] == 0
    sim = baechi.simulate_plan(small_graph(), small_plan())
    assert attrs["data-transfers"] == len(sim.transfers) == 3
    assert attrs["data-transfer-bars"] == 6  # sequential: each transfer in both channels
    # nothing is fetched: no external scripts, styles, images or imports; the one link is the
    # inline (data:) icon that keeps browsers off /favicon.ico
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=(?!\"data:)", page)
    assert '<link rel="icon" href="data:,">' in page
    assert "@import" not in page
    assert 'id="report-status" data-ready="0"' in page
    assert "Plotly.newPlot" in page and len(page) > 3_000_000  # plotly.js is inlined


def test_figure_validates_with_plotly() -> None:
    go = pytest.importorskip("plotly.graph_objects")
    figure = figure_of(render_report(small_graph(), small_plan()))
    go.Figure(data=figure["data"], layout=figure["layout"])  # raises on unknown properties
    assert figure["detail"] == []  # nothing merged, nothing to detail on zoom


def test_drawn_numbers_are_the_simulators() -> None:
    graph, plan = small_graph(), small_plan()
    sim = baechi.simulate_plan(graph, plan)
    page = render_report(graph, plan)
    figure = figure_of(page)
    names = baechi.load_graph(graph).names
    seen = set()
    for trace in figure["data"]:
        if trace["meta"] != "ops":
            continue
        base, width = array(trace["base"]), array(trace["x"])
        for row, s, w in zip(trace["customdata"], base, width, strict=True):
            op = names.index(row[0].replace("&lt;", "<").replace("&gt;", ">")
                             .replace("&amp;", "&"))
            assert s == sim.start[op] and s + w == pytest.approx(sim.end[op], abs=1e-12)
            assert row[4] == sim.start[op]
            seen.add(op)
    assert seen == set(range(6))
    transfers = [t for t in figure["data"] if t["meta"] == "transfers"]
    starts = sorted(float(x) for t in transfers for x in array(t["base"]))
    assert starts == sorted(sim.transfers.start * 2)
    est = sim.estimate
    assert f"{est.step_time_us:,.3f} µs" in card(page, "step_time_us")
    assert f"{est.transfers:,}" in card(page, "transfers")
    assert "hand" in card(page, "algorithm")
    speedup = est.single_device_us / est.step_time_us
    assert f"{speedup:,.2f}×" in card(page, "speedup")
    for device, peak in est.peak_memory_bytes.items():
        row = re.search(rf'<tr class="ok" data-device="{device}">(.*?)</tr>', page)
        assert row and f'title="{peak:,} bytes"' in row.group(1)
        assert f'title="{8 * 2**20:,} bytes"' in row.group(1)


def test_memory_curves_are_the_simulators_and_limits_drawn() -> None:
    graph, plan = small_graph(), small_plan()
    sim = baechi.simulate_plan(graph, plan)
    figure = figure_of(render_report(graph, plan))
    curves = [t for t in figure["data"] if t["meta"] == "memory"]
    limits = [t for t in figure["data"] if t["meta"] == "limit"]
    peaks = [t for t in figure["data"] if t["meta"] == "peak"]
    assert len(curves) == len(limits) == len(peaks) == 2
    unit = 2**20  # MiB: the limit is 8 MiB
    for d, curve in enumerate(curves):
        levels = array(curve["y"]) * unit
        trace = sim.memory[d]
        assert np.allclose(levels.max(), trace.peak)
        # every level drawn is one the simulator reported (plus the persistent start level)
        assert set(np.round(levels).astype(int)) <= {*trace.bytes.tolist(), int(levels[0])}
        assert limits[d]["y"] == [8.0, 8.0]
        assert peaks[d]["y"][0] * unit == pytest.approx(trace.peak)


def test_memory_instants_are_drawn_as_peak_then_final_level() -> None:
    graph = chain_graph(400)
    plan = round_robin_plan(graph, 2)
    sim = baechi.simulate_plan(graph, plan)
    figure = figure_of(render_report(graph, plan))
    curves = [t for t in figure["data"] if t["meta"] == "memory"]
    for d, curve in enumerate(curves):
        times, levels = array(curve["x"]), array(curve["y"]) * 2**30  # GiB: 4 GiB limit
        trace = sim.memory[d]
        for t in np.unique(trace.times)[:200]:
            drawn = levels[times == t]
            at = trace.bytes[trace.times == t]
            assert 1 <= len(drawn) <= 2  # no intermediate levels inside an instant
            assert drawn[0] == pytest.approx(at.max()) and drawn[-1] == pytest.approx(at[-1])


def test_parallel_mode_lanes_are_per_sender() -> None:
    plan = small_plan()
    plan["request"]["cluster"]["network"]["mode"] = "parallel"
    page = render_report(small_graph(), plan)
    attrs = plot_attrs(page)
    assert attrs["data-transfer-bars"] == attrs["data-transfers"] == 3
    layout = figure_of(page)["layout"]
    assert layout["yaxis"]["ticktext"] == ["/GPU:0", "/GPU:0 sends", "/GPU:1", "/GPU:1 sends"]
    assert "parallel mode" in page


def test_single_device_has_no_channel_lanes() -> None:
    plan = baechi.place(small_graph(), {"devices": {"count": 1}}, "single")
    attrs = plot_attrs(render_report(small_graph(), plan))
    assert attrs["data-lanes"] == 1 and attrs["data-channel-lanes"] == 0
    assert attrs["data-transfer-bars"] == 0 and attrs["data-op-bars"] == 6


def test_names_are_escaped() -> None:
    page = render_report(small_graph(), small_plan())
    # only the page's own four scripts end a script element
    assert page.count("</script>") == 4
    assert ODD_NAME not in page
    figure = figure_of(page)
    custom = [row[0] for t in figure["data"] if t["meta"] == "ops" for row in t["customdata"]]
    assert "d&lt;/script&gt;&lt;b&gt;&amp;\"x" in custom


def test_over_limit_is_flagged() -> None:
    plan = small_plan()
    plan["request"]["cluster"]["devices"]["memory_bytes"] = "3MiB"
    page = render_report(small_graph(), plan)
    assert "OVER A LIMIT" in card(page, "memory_ok")
    assert 'class="over"' in page and "OVER THE LIMIT" in page


def test_cluster_override_and_stale_estimate() -> None:
    graph = small_graph()
    plan = baechi.Plan.parse(small_plan())
    faster = {"devices": {"count": 2}, "network": {"latency_us": 0, "mode": "sequential"}}
    page = render_report(graph, plan, cluster=faster)
    assert "Replayed on the cluster given to the report" in page
    assert 'data-key="memory_ok"' in page
    stale = plan.model_copy(update={"estimate": baechi.simulate(graph, plan).model_copy(
        update={"step_time_us": 1.0})})
    assert "stored estimate differs" in render_report(graph, stale)
    fresh = plan.model_copy(update={"estimate": baechi.simulate(graph, plan)})
    assert "stored estimate differs" not in render_report(graph, fresh)


def test_invalid_plan_raises() -> None:
    plan = small_plan()
    plan["order"]["/GPU:0"] = ["a", "e", ODD_NAME, "b"]  # ODD waits for b queued behind it
    with pytest.raises(baechi.InvalidPlan):
        render_report(small_graph(), plan)


def test_write_report_and_paths(tmp_path: Path) -> None:
    graph_path = tmp_path / "g.json"
    plan_path = tmp_path / "p.json"
    graph_path.write_text(json.dumps(small_graph()))
    plan_path.write_text(json.dumps(small_plan()))
    out = tmp_path / "report.html"
    write_report(str(graph_path), plan_path, out)
    assert out.read_text(encoding="utf-8") == render_report(small_graph(), small_plan())


def test_merge_small_keeps_big_items_and_lanes() -> None:
    rng = np.random.default_rng(1)
    lane = np.repeat(np.arange(3), 2000)
    duration = np.where(rng.random(6000) < 0.05, 50.0, rng.random(6000) * 0.5)
    start = np.zeros(6000)
    end = np.zeros(6000)
    for d in range(3):
        t = 0.0
        for i in range(d * 2000, (d + 1) * 2000):
            t += rng.random() * 0.2  # short idle gaps
            start[i], end[i] = t, t + duration[i]
            t = end[i]
    untouched = merge_small(lane, start, end, 6000)
    assert untouched.bars == 6000 and untouched.threshold == 0
    merged = merge_small(lane, start, end, 1000)
    assert merged.bars <= 1000
    assert len(merged.single) + merged.merged_items == 6000
    assert set(np.flatnonzero(duration >= merged.threshold)) <= set(merged.single.tolist())
    for r in range(len(merged.count)):
        a, b = merged.first[r], merged.last[r]
        assert lane[a] == lane[b] == merged.lane[r]
        members = range(a, b + 1)  # items of a lane are in time order here
        assert len(members) == merged.count[r]
        assert merged.start[r] == start[a] and merged.end[r] == end[b]
        assert merged.busy[r] == pytest.approx(duration[a : b + 1].sum())
        assert (duration[a : b + 1] < merged.threshold).all()


def test_decimate_keeps_every_peak() -> None:
    rng = np.random.default_rng(2)
    times = np.sort(rng.random(100_000)) * 1e6
    levels = np.cumsum(rng.integers(-1000, 1001, 100_000)).astype(float)
    t, v = decimate(times, levels, bins=500)
    assert len(t) <= 2000 and v.max() == levels.max() and v.min() == levels.min()
    assert np.isin(t, times).all()
    short_t, _short_v = decimate(times[:100], levels[:100], bins=500)
    assert len(short_t) == 100


def test_large_plan_is_aggregated_and_says_so() -> None:
    graph = chain_graph(20_000)
    plan = round_robin_plan(graph, 4)
    page = render_report(graph, plan)  # its render time is measured in bench/speed.py
    attrs = plot_attrs(page)
    assert attrs["data-ops"] == 20_000
    assert attrs["data-op-bars"] <= MAX_OP_BARS and attrs["data-merged-ops"] > 0
    assert 'id="aggregation-note"' in page and "merged" in page
    figure = figure_of(page)
    drawn = sum(len(array(t["base"])) for t in figure["data"]
                if t["meta"] in ("ops", "merged-ops"))
    assert drawn == attrs["data-op-bars"]
    merged_count = sum(row[0] for t in figure["data"] if t["meta"] == "merged-ops"
                       for row in t["customdata"])
    individual = sum(len(t["customdata"]) for t in figure["data"] if t["meta"] == "ops")
    assert merged_count + individual == 20_000
    go = pytest.importorskip("plotly.graph_objects")
    go.Figure(data=figure["data"], layout=figure["layout"])
    # every op travels along, so that a zoom can draw the ops in view one by one
    ops_detail, transfers_detail = figure["detail"]
    assert ops_detail["noun"] == "ops" and ops_detail["cap"] == MAX_OP_BARS
    sim = baechi.simulate_plan(graph, plan)
    assert np.array_equal(array(ops_detail["base"]), np.array(sim.start))
    assert np.array_equal(array(ops_detail["end"]), np.array(sim.end))
    assert len(ops_detail["rows"]) == 20_000 and ops_detail["rows"][7][0] == "layer0/op7"
    assert transfers_detail["noun"] == "transfers"
    assert len(array(transfers_detail["base"])) == 2 * len(sim.transfers)  # both channels


@needs_shared
def test_gnmt_on_four_devices(shared_dir: Path) -> None:
    graph = baechi.load_graph(shared_dir / "graphs" / "baechi" / "gnmt_baechi.json")
    algorithm = "m-etf" if "m-etf" in baechi.algorithms.ALGORITHMS else "single"
    cluster = {"devices": {"count": 4, "memory_bytes": "2GiB"},
               "network": {"latency_us": 134, "bandwidth_gbps": 5.7}}
    plan = baechi.place(graph, cluster, algorithm, {"allow_single": False})
    page = render_report(graph, plan)
    attrs = plot_attrs(page)
    assert attrs["data-ops"] == attrs["data-op-bars"] == 2494  # under the cap: every op drawn
    assert attrs["data-lanes"] == 8
    assert f"{plan.estimate.step_time_us:,.3f} µs" in card(page, "step_time_us")


def _cli_has(verb: str) -> bool:
    try:
        from baechi import cli
    except ImportError:
        return False
    return verb in cli.build_parser()._subparsers._group_actions[0].choices  # type: ignore


@pytest.mark.skipif(not _cli_has("report"), reason="the `baechi report` verb does not exist yet")
def test_cli_report_and_place_report(tmp_path: Path) -> None:
    graph_path = tmp_path / "g.json"
    plan_path = tmp_path / "p.json"
    graph_path.write_text(json.dumps(small_graph()))
    plan_path.write_text(json.dumps(small_plan()))
    out = tmp_path / "r.html"
    run = subprocess.run(
        [sys.executable, "-m", "baechi.cli", "report", str(graph_path), str(plan_path),
         "-o", str(out)], capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert plot_attrs(out.read_text())["data-op-bars"] == 6

    placed = tmp_path / "placed.html"
    run = subprocess.run(
        [sys.executable, "-m", "baechi.cli", "place", str(graph_path), "--devices", "2",
         "--algorithm", "single", "--report", str(placed)],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert plot_attrs(placed.read_text())["data-ops"] == 6
