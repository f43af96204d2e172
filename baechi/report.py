"""The plan report: one self-contained HTML page showing a simulated plan (issue 6).

The page replays the plan with :func:`baechi.simulate_plan` and draws exactly the simulator's
numbers with plotly.js (inlined, so the page needs no network):

- a timeline with one lane per device holding its ops, and one communication lane per device
  channel holding the transfers that use it (sequential mode: a transfer a→b holds both a's and
  b's channel, so it appears in both lanes; parallel mode: one lane per *sending* device, where
  transfers may overlap since they never contend);
- memory in use over time per device, with its limit and its peak marked;
- the summary: step time, lower bound, single device, speedup, peak memory / limit per device,
  transfers, algorithm and placement seconds.

Large plans stay responsive: above ``max_op_bars`` ops (or ``max_transfer_bars`` transfer
bars), runs of consecutive tiny items (shorter than a threshold, with gaps before them shorter
than it) are drawn as one merged bar per run, shaded by their busy share, with the smallest
threshold that meets the cap. Every item still travels in the page: once a zoom leaves at most
the cap in view, the page draws those items one by one. Memory curves are decimated to a
min/max envelope that keeps every peak. The page says what was merged.

Stable DOM hooks for tests: ``#plot`` carries ``data-lanes``, ``data-device-lanes``,
``data-channel-lanes``, ``data-ops``, ``data-op-bars``, ``data-merged-ops``,
``data-transfers``, ``data-transfer-bars`` and ``data-devices``; ``#report-status`` gets
``data-ready="1"`` (or ``"error"``) once plotly has drawn, with ``data-rendered-lanes``,
``data-rendered-op-bars``, ``data-rendered-transfer-bars`` (counted in the drawn SVG),
``data-errors`` and ``data-error-text`` (JavaScript errors seen), ``data-render-ms`` and
``data-ready-ms`` (since navigation start), and after each zoom ``data-view`` and
``data-view-updates``.
"""

from __future__ import annotations

import base64
import functools
import html
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from baechi._version import __version__
from baechi.cluster import Cluster
from baechi.graph import Graph, load_graph
from baechi.plan import Plan
from baechi.simulate import MemoryTrace, Simulation, simulate_plan

#: Above this many ops, runs of tiny consecutive ops are merged into one bar each.
MAX_OP_BARS = 3000
#: Above this many transfer bars, runs of tiny consecutive transfers are merged likewise.
MAX_TRANSFER_BARS = 1500
#: Memory curves longer than 4 points per bin are decimated to ``MEMORY_BINS`` time bins.
MEMORY_BINS = 800
#: Op types with the most compute get their own colour; the rest are "other".
TYPE_COLOURS = (
    "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948",
    "#76b7b2", "#ff9da7", "#9c755f", "#bcbd22",
)
OTHER_COLOUR = "#b8bec8"
MERGED_COLOUR = "#5f6670"
MERGED_TRANSFER_COLOUR = "#7f3b2f"
TRANSFER_COLOUR = "#d65f4c"
CONTROL_COLOUR = "#f4a582"
MEMORY_COLOUR = "#2c6fb7"
LIMIT_COLOUR = "#d62728"

DEVICE_LANE_PX = 40
CHANNEL_LANE_PX = 24
MEMORY_ROW_PX = 120
MEMORY_GAP_PX = 42


# --------------------------------------------------------------------------- public API
def render_report(
    graph: Graph | dict[str, Any] | str | Path,
    plan: Plan | dict[str, Any] | str | Path,
    cluster: Cluster | dict[str, Any] | None = None,
    *,
    max_op_bars: int = MAX_OP_BARS,
    max_transfer_bars: int = MAX_TRANSFER_BARS,
) -> str:
    """Render the report of a plan as one self-contained HTML page.

    Parameters
    ----------
    graph : Graph, dict or path
        The plan's graph (``baechi.graph/v1``).
    plan : Plan, dict or path
        The plan (``baechi.plan/v1``); it is replayed, never trusted.
    cluster : Cluster or dict, optional
        Replay on this cluster instead of the plan's ``request.cluster``.
    max_op_bars, max_transfer_bars : int
        Caps above which tiny consecutive ops / transfers are merged into one bar per run.

    Returns
    -------
    str
        The HTML page (plotly.js inlined; no network needed to view it).

    Raises
    ------
    InvalidGraph, InvalidPlan, InvalidCluster
        When the inputs are invalid or the plan breaks a rule of docs/format.md §4.
    ImportError
        When plotly (the ``report`` extra) is not installed.
    """
    graph = load_graph(graph)
    plan = _load_plan(plan)
    replayed = Cluster.parse(cluster if cluster is not None else plan.request.cluster)
    simulation = simulate_plan(graph, plan, replayed)
    view = _build_view(graph, replayed, simulation, max(1, max_op_bars),
                       max(1, max_transfer_bars))
    overridden = cluster is not None and _cluster_differs(plan, replayed)
    return _page(graph, plan, replayed, simulation, view, overridden)


def write_report(
    graph: Graph | dict[str, Any] | str | Path,
    plan: Plan | dict[str, Any] | str | Path,
    path: str | Path,
    cluster: Cluster | dict[str, Any] | None = None,
) -> None:
    """Write the report of :func:`render_report` to ``path`` (UTF-8)."""
    Path(path).write_text(render_report(graph, plan, cluster), encoding="utf-8")


# --------------------------------------------------------------------------- data shaping
def _load_plan(plan: Plan | dict[str, Any] | str | Path) -> Plan:
    if isinstance(plan, str | Path):
        from baechi.errors import InvalidPlan

        try:
            plan = orjson.loads(Path(plan).read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise InvalidPlan(f"{plan}: cannot read plan: {exc}") from None
    return Plan.parse(plan)


def _cluster_differs(plan: Plan, cluster: Cluster) -> bool:
    try:
        return Cluster.parse(plan.request.cluster) != cluster
    except Exception:  # the plan's own cluster is unreadable: we replay on the given one
        return True


@dataclass
class Merge:
    """Which items are drawn alone and which runs are merged into one bar.

    ``single`` holds item indices drawn as their own bar; each merged run ``r`` covers
    ``[start[r], end[r]]`` on lane ``lane[r]``, holds ``count[r]`` items, ``busy[r]`` µs of
    their summed durations, and its first and last items ``first[r]``, ``last[r]``.
    ``threshold`` is the duration under which items were merged (0: nothing merged).
    """

    single: np.ndarray
    lane: np.ndarray
    start: np.ndarray
    end: np.ndarray
    count: np.ndarray
    busy: np.ndarray
    first: np.ndarray
    last: np.ndarray
    threshold: float

    @property
    def bars(self) -> int:
        return len(self.single) + len(self.count)

    @property
    def merged_items(self) -> int:
        return int(self.count.sum())


def merge_small(lane: np.ndarray, start: np.ndarray, end: np.ndarray, cap: int) -> Merge:
    """Merge runs of tiny items per lane until at most ``cap`` bars remain.

    An item is tiny when it lasts less than the threshold; a run is a maximal sequence of tiny
    items on one lane (by start time) whose gaps to what came before are under the threshold.
    The threshold is the smallest (found by bisection) for which the cap holds.
    """
    n = len(start)
    empty_i = np.zeros(0, dtype=np.int64)
    empty_f = np.zeros(0)
    if n <= cap:
        return Merge(np.arange(n), empty_i, empty_f, empty_f, empty_i, empty_f, empty_i, empty_i,
                     0.0)
    order = np.lexsort((end, start, lane))
    ln, s, e = lane[order], start[order], end[order]
    duration = e - s
    new_lane = np.ones(n, dtype=bool)
    new_lane[1:] = ln[1:] != ln[:-1]
    # the latest end of anything earlier on the same lane (items may overlap in parallel mode)
    previous_end = np.full(n, -np.inf)
    bounds = [*np.flatnonzero(new_lane).tolist(), n]
    for a, b in itertools.pairwise(bounds):
        previous_end[a + 1 : b] = np.maximum.accumulate(e[a : b - 1])
    span = float(e.max() - s.min()) or 1.0

    def runs(threshold: float) -> np.ndarray:
        tiny = duration < threshold
        after_big = np.ones(n, dtype=bool)
        after_big[1:] = ~tiny[:-1]
        return np.flatnonzero(new_lane | ~tiny | after_big | (s - previous_end >= threshold))

    # the smallest threshold (to a factor of ~1.0001) that meets the cap, by geometric bisection
    lo, hi = span * 1e-9, span * 2
    for _ in range(22):
        mid = math.sqrt(lo * hi)
        if len(runs(mid)) <= cap:
            hi = mid
        else:
            lo = mid
    threshold = hi
    firsts = runs(threshold)
    count = np.diff(np.append(firsts, n))
    run_end = np.maximum.reduceat(e, firsts)
    busy = np.add.reduceat(duration, firsts)
    alone = count == 1
    many = ~alone
    lasts = firsts + count - 1
    return Merge(
        single=np.sort(order[firsts[alone]]),
        lane=ln[firsts[many]],
        start=s[firsts[many]],
        end=run_end[many],
        count=count[many],
        busy=busy[many],
        first=order[firsts[many]],
        last=order[lasts[many]],
        threshold=threshold,
    )


def decimate(times: np.ndarray, levels: np.ndarray, bins: int = MEMORY_BINS
             ) -> tuple[np.ndarray, np.ndarray]:
    """Keep, per time bin, the first, last, highest and lowest point of a step curve.

    Every peak survives (the maximum of each bin is kept); curves of at most ``4 * bins``
    points are returned unchanged.
    """
    n = len(times)
    if n <= 4 * bins:
        return times, levels
    t0, t1 = float(times[0]), float(times[-1])
    width = (t1 - t0) / bins or 1.0
    which = np.minimum(((times - t0) / width).astype(np.int64), bins - 1)
    starts = np.flatnonzero(np.r_[True, which[1:] != which[:-1]])
    ends = np.r_[starts[1:], n] - 1
    by_max = np.lexsort((-levels, which))
    by_min = np.lexsort((levels, which))
    keep = np.unique(np.concatenate([starts, ends, by_max[starts], by_min[starts]]))
    return times[keep], levels[keep]


@dataclass
class View:
    """Everything the page draws, already shaped for plotly."""

    figure: dict[str, Any]
    lanes: list[str]
    device_lanes: int
    channel_lanes: int
    op_bars: int
    merged_ops: int
    op_merge: Merge
    transfer_bars: int
    transfer_items: int
    transfer_merge: Merge
    memory_points: list[tuple[int, int]]
    height: int
    op_cap: int
    transfer_cap: int


def _typed(values: np.ndarray | list[float]) -> dict[str, str]:
    """A plotly.js typed-array spec: compact and exact (float64 / int32)."""
    array = np.asarray(values)
    if array.dtype.kind in "iub":
        array = array.astype("<i4")
        dtype = "i4"
    else:
        array = array.astype("<f8")
        dtype = "f8"
    return {"dtype": dtype, "bdata": base64.b64encode(array.tobytes()).decode("ascii")}


def _esc(text: str) -> str:
    return html.escape(text, quote=False)


def _memory_unit(peak: int) -> tuple[str, float]:
    for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if peak >= size:
            return name, float(size)
    return "bytes", 1.0


@dataclass
class BarSet:
    """Items drawn as bars on timeline lanes (ops, or transfers), one trace per legend group.

    Per item: lane ``y``, ``start``, ``end``, legend ``group`` and ``row`` (its hover data in
    ``rows``, the ``customdata`` of ``hover``; ``rows[r][0]`` names the item).
    """

    noun: str
    meta: str
    y: np.ndarray
    start: np.ndarray
    end: np.ndarray
    group: np.ndarray
    group_names: list[str]
    colours: list[str]
    row: np.ndarray
    rows: list[list[Any]]
    hover: str
    width: float
    opacity: float
    line_width: float
    merged_name: str
    merged_colour: str


def _add_bars(
    traces: list[dict[str, Any]], bars: BarSet, lanes: list[str], cap: int
) -> tuple[Merge, dict[str, Any] | None]:
    """Append the traces of ``bars`` (merged above ``cap``); return the merge and zoom detail.

    The detail (only when something was merged) holds every item, so that the page can draw
    the items in view one by one once a zoom brings them under the cap.
    """
    merge = merge_small(bars.y, bars.start, bars.end, cap)
    merged = len(merge.count) > 0
    present = np.unique(bars.group) if merged else np.unique(bars.group[merge.single])
    slot = np.full(len(bars.group_names), -1, dtype=np.int64)
    ids: list[int] = []
    for g in present.tolist():
        slot[g] = len(ids)
        ids.append(len(traces))
        idx = merge.single[bars.group[merge.single] == g]
        traces.append({
            "type": "bar", "orientation": "h", "meta": bars.meta, "name": bars.group_names[g],
            "y": _typed(bars.y[idx]), "base": _typed(bars.start[idx]),
            "x": _typed(bars.end[idx] - bars.start[idx]), "width": bars.width,
            "opacity": bars.opacity,
            "marker": {"color": bars.colours[g],
                       "line": {"width": bars.line_width, "color": "white"}},
            "customdata": [bars.rows[r] for r in bars.row[idx].tolist()],
            "hovertemplate": bars.hover,
        })
    if not merged:
        return merge, None
    first_row, last_row = bars.row[merge.first].tolist(), bars.row[merge.last].tolist()
    custom = [
        [int(k), _esc(lanes[y]), bars.rows[a][0], bars.rows[b][0], float(s), float(e - s),
         float(u)]
        for k, y, a, b, s, e, u in zip(
            merge.count.tolist(), merge.lane.tolist(), first_row, last_row,
            merge.start.tolist(), merge.end.tolist(), merge.busy.tolist(), strict=True)
    ]
    merged_id = len(traces)
    traces.append({
        "type": "bar", "orientation": "h", "meta": f"merged-{bars.meta}",
        "name": bars.merged_name,
        "y": _typed(merge.lane), "base": _typed(merge.start),
        "x": _typed(merge.end - merge.start), "width": bars.width,
        "marker": {"color": bars.merged_colour, "line": {"width": 0},
                   "opacity": _typed(_density(merge))},
        "customdata": custom,
        "hovertemplate": f"<b>%{{customdata[0]}} tiny {bars.noun} merged</b> in "
        "%{customdata[1]}<br>first: %{customdata[2]}<br>last: %{customdata[3]}<br>"
        "from %{customdata[4]:,.3f} µs for %{customdata[5]:,.3f} µs<br>"
        "busy: %{customdata[6]:,.3f} µs<extra></extra>",
    })
    detail = {
        "noun": bars.noun, "cap": cap, "traces": ids, "merged": merged_id,
        "y": _typed(bars.y), "base": _typed(bars.start), "end": _typed(bars.end),
        "slot": _typed(slot[bars.group]), "row": _typed(bars.row), "rows": bars.rows,
    }
    return merge, detail


def _build_view(
    graph: Graph, cluster: Cluster, sim: Simulation, max_op_bars: int, max_transfer_bars: int
) -> View:
    devices = [d.name for d in cluster.devices]
    n_dev = len(devices)
    sequential = cluster.network.mode == "sequential"
    with_channels = n_dev > 1
    # lanes: each device, followed by its communication lane
    lanes: list[str] = []
    device_y: list[int] = []
    channel_y: list[int] = []
    for name in devices:
        device_y.append(len(lanes))
        lanes.append(name)
        if with_channels:
            channel_y.append(len(lanes))
            lanes.append(f"{name} {'comm' if sequential else 'sends'}")
    device_y_a = np.array(device_y, dtype=np.int64)
    channel_y_a = np.array(channel_y, dtype=np.int64)

    step = float(sim.estimate.step_time_us)
    x_end = step if step > 0 else 1.0
    traces: list[dict[str, Any]] = []

    # ------------------------------------------------------------- ops
    n_ops = len(graph)
    start = np.asarray(sim.start, dtype=float)
    end = np.asarray(sim.end, dtype=float)
    device_of = np.asarray(sim.device_of, dtype=np.int64)
    position = np.zeros(n_ops, dtype=np.int64)
    for order in sim.orders:
        position[np.asarray(order, dtype=np.int64)] = np.arange(len(order))
    names = graph.names
    types = [t or "(no type)" for t in graph.types]
    totals: dict[str, float] = {}
    for t, c in zip(types, graph.compute_us, strict=True):
        totals[t] = totals.get(t, 0.0) + c
    ranked = sorted(totals, key=lambda t: (-totals[t], t))[: len(TYPE_COLOURS)]
    rank = {t: i for i, t in enumerate(ranked)}
    ops = BarSet(
        noun="ops", meta="ops",
        y=device_y_a[device_of], start=start, end=end,
        group=np.array([rank.get(t, len(ranked)) for t in types], dtype=np.int64),
        group_names=[_esc(t) for t in ranked] + ["other"],
        colours=[*TYPE_COLOURS[: len(ranked)], OTHER_COLOUR],
        row=np.arange(n_ops),
        rows=[[_esc(names[op]), _esc(types[op]), devices[d], int(p) + 1, float(s), float(e - s)]
              for op, (d, p, s, e) in enumerate(zip(device_of.tolist(), position.tolist(),
                                                    sim.start, sim.end, strict=True))],
        hover="<b>%{customdata[0]}</b><br>type: %{customdata[1]}<br>"
        "device: %{customdata[2]} (#%{customdata[3]} in its order)<br>"
        "start: %{customdata[4]:,.3f} µs<br>duration: %{customdata[5]:,.3f} µs<extra></extra>",
        width=0.8, opacity=1.0, line_width=0.5 if n_ops <= 200 else 0.0,
        merged_name="merged tiny ops", merged_colour=MERGED_COLOUR,
    )
    op_merge, op_detail = _add_bars(traces, ops, lanes, max_op_bars)

    # ------------------------------------------------------------- transfers
    tr = sim.transfers
    n_tr = len(tr)
    t_src = np.asarray(tr.src_device, dtype=np.int64)
    t_dst = np.asarray(tr.dst_device, dtype=np.int64)
    if with_channels and n_tr:
        if sequential:  # a transfer holds both channels: one bar in each lane
            item = np.concatenate([np.arange(n_tr), np.arange(n_tr)])
            item_lane = np.concatenate([t_src, t_dst])
        else:
            item = np.arange(n_tr)
            item_lane = t_src
    else:
        item = np.zeros(0, dtype=np.int64)
        item_lane = np.zeros(0, dtype=np.int64)
    transfers = BarSet(
        noun="transfers", meta="transfers",
        y=channel_y_a[item_lane] if len(item) else item,
        start=np.asarray(tr.start, dtype=float)[item], end=np.asarray(tr.end, dtype=float)[item],
        group=np.asarray(tr.control, dtype=np.int64)[item],
        group_names=["data transfer", "control message"],
        colours=[TRANSFER_COLOUR, CONTROL_COLOUR],
        row=item,
        rows=[["(control)" if c else _esc(t), _esc(names[o]), devices[a], devices[b], float(s),
               float(e - s), int(n)]
              for t, c, o, a, b, s, e, n in zip(tr.tensor, tr.control, tr.src_op, tr.src_device,
                                                tr.dst_device, tr.start, tr.end, tr.nbytes,
                                                strict=True)] if len(item) else [],
        hover="<b>%{customdata[0]}</b><br>from op %{customdata[1]}<br>"
        "%{customdata[2]} → %{customdata[3]}<br>start: %{customdata[4]:,.3f} µs<br>"
        "duration: %{customdata[5]:,.3f} µs<br>bytes: %{customdata[6]:,}<extra></extra>",
        width=0.55, opacity=1.0 if sequential else 0.55, line_width=0.0,
        merged_name="merged tiny transfers", merged_colour=MERGED_TRANSFER_COLOUR,
    )
    transfer_merge, transfer_detail = _add_bars(traces, transfers, lanes, max_transfer_bars)

    # ------------------------------------------------------------- memory
    limits = [d.memory_bytes for d in cluster.devices]
    top = max([m.peak for m in sim.memory] + [lim or 0 for lim in limits] + [1])
    unit_name, unit = _memory_unit(top)
    memory_points: list[tuple[int, int]] = []
    base = np.zeros(n_dev, dtype=np.int64)
    np.add.at(base, device_of, np.asarray(graph.persistent_bytes, dtype=np.int64))
    for d, trace in enumerate(sim.memory):
        times, levels = _memory_curve(trace, int(base[d]), x_end)
        shown_t, shown_b = decimate(times, levels)
        memory_points.append((len(times), len(shown_t)))
        axis = f"y{d + 2}"
        traces.append({
            "type": "scatter", "mode": "lines", "meta": "memory", "name": devices[d],
            "xaxis": f"x{d + 2}", "yaxis": axis, "showlegend": False,
            "x": _typed(shown_t), "y": _typed(shown_b / unit),
            "line": {"shape": "hv", "width": 1.2, "color": MEMORY_COLOUR},
            "fill": "tozeroy", "fillcolor": "rgba(44,111,183,0.18)",
            "hovertemplate": f"{_esc(devices[d])}<br>%{{y:,.3f}} {unit_name} from "
            "%{x:,.3f} µs<extra></extra>",
        })
        if len(trace.bytes):
            at = int(np.argmax(trace.bytes))
            traces.append({
                "type": "scatter", "mode": "markers", "meta": "peak", "name": "peak",
                "xaxis": f"x{d + 2}", "yaxis": axis, "showlegend": False,
                "x": [float(trace.times[at])], "y": [trace.peak / unit],
                "marker": {"color": MEMORY_COLOUR, "size": 7, "symbol": "diamond"},
                "hovertemplate": f"peak on {_esc(devices[d])}: {trace.peak:,} bytes "
                f"({trace.peak / unit:,.3f} {unit_name})<br>at %{{x:,.3f}} µs<extra></extra>",
            })
        if limits[d] is not None:
            traces.append({
                "type": "scatter", "mode": "lines", "meta": "limit", "name": "limit",
                "xaxis": f"x{d + 2}", "yaxis": axis, "showlegend": False,
                "x": [0.0, x_end], "y": [limits[d] / unit, limits[d] / unit],
                "line": {"color": LIMIT_COLOUR, "dash": "dash", "width": 1.5},
                "hovertemplate": f"limit of {_esc(devices[d])}: {limits[d]:,} bytes "
                f"({limits[d] / unit:,.3f} {unit_name})<extra></extra>",
            })

    figure, height = _layout(lanes, devices, limits, sim, traces, x_end, unit_name, unit)
    figure["detail"] = [d for d in (op_detail, transfer_detail) if d is not None]
    return View(
        figure=figure, lanes=lanes, device_lanes=n_dev, channel_lanes=len(channel_y),
        op_bars=op_merge.bars, merged_ops=op_merge.merged_items, op_merge=op_merge,
        transfer_bars=transfer_merge.bars, transfer_items=len(item),
        transfer_merge=transfer_merge, memory_points=memory_points, height=height,
        op_cap=max_op_bars, transfer_cap=max_transfer_bars,
    )


def _density(merge: Merge) -> np.ndarray:
    """Opacity of merged bars: the busy share of their span (at least 0.15, to stay visible)."""
    span = np.maximum(merge.end - merge.start, 1e-12)
    return np.clip(merge.busy / span, 0.15, 1.0)


def _memory_curve(trace: MemoryTrace, base: int, x_end: float) -> tuple[np.ndarray, np.ndarray]:
    """The simulator's memory trace as a step curve from 0 (persistent bytes) to ``x_end``.

    The trace holds one point per allocation or free; at one instant frees come first
    (format.md §4), so the intermediate levels of an instant are not states anyone could observe.
    Each instant is drawn as its peak (the highest level at it) followed by its final level.
    """
    times = np.asarray(trace.times, dtype=float)
    levels = np.asarray(trace.bytes, dtype=np.int64)
    if len(times):
        firsts = np.flatnonzero(np.r_[True, times[1:] != times[:-1]])
        lasts = np.r_[firsts[1:], len(times)] - 1
        peaks = np.maximum.reduceat(levels, firsts)
        finals = levels[lasts]
        keep = np.stack([np.ones(len(firsts), dtype=bool), peaks != finals], axis=1).ravel()
        times = np.repeat(times[firsts], 2)[keep]
        levels = np.stack([peaks, finals], axis=1).ravel()[keep]
    if not len(times) or times[0] > 0:
        times = np.r_[0.0, times]
        levels = np.r_[base, levels]
    if times[-1] < x_end:
        times = np.r_[times, x_end]
        levels = np.r_[levels, levels[-1]]
    return times, levels.astype(float)


def _layout(
    lanes: list[str], devices: list[str], limits: list[int | None], sim: Simulation,
    traces: list[dict[str, Any]], x_end: float, unit_name: str, unit: float,
) -> tuple[dict[str, Any], int]:
    n_dev = len(devices)
    channel_lanes = len(lanes) - n_dev
    top_px, bottom_px, gap_px = 70, 50, 74
    timeline_px = max(140, n_dev * DEVICE_LANE_PX + channel_lanes * CHANNEL_LANE_PX)
    height = top_px + timeline_px + gap_px + n_dev * (MEMORY_ROW_PX + MEMORY_GAP_PX) + bottom_px
    plot_px = height - top_px - bottom_px

    def frac(px: float) -> float:
        return max(0.0, min(1.0, 1.0 - px / plot_px))

    x_range = [0.0, x_end * 1.005]
    layout: dict[str, Any] = {
        "height": height,
        "margin": {"l": 150, "r": 30, "t": top_px, "b": bottom_px},
        "barmode": "overlay",
        "hovermode": "closest",
        "dragmode": "zoom",
        "plot_bgcolor": "#fbfbfc",
        "paper_bgcolor": "white",
        "font": {"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif",
                 "size": 12, "color": "#222"},
        "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": 1.0, "yanchor": "bottom",
                   "font": {"size": 11}, "groupclick": "toggleitem"},
        "hoverlabel": {"font": {"size": 12}, "align": "left"},
        "xaxis": {
            "domain": [0, 1], "anchor": "y", "range": x_range, "title": {"text": "time (µs)",
                                                                          "standoff": 4},
            "showgrid": True, "gridcolor": "#e4e6ea", "zeroline": False, "ticks": "outside",
            "showspikes": True, "spikemode": "across", "spikethickness": 1,
            "spikecolor": "#888", "spikedash": "dot",
        },
        "yaxis": {
            "domain": [frac(timeline_px), 1.0], "anchor": "x",
            "tickmode": "array", "tickvals": list(range(len(lanes))),
            "ticktext": [_esc(lane) for lane in lanes],
            "range": [len(lanes) - 0.5, -0.5], "fixedrange": True, "showgrid": False,
            "zeroline": False, "ticks": "",
        },
        "annotations": [],
        "shapes": [],
    }
    # light bands behind the communication lanes
    for i, lane in enumerate(lanes):
        if i >= 1 and lane not in devices:
            layout["shapes"].append({
                "type": "rect", "xref": "x domain", "yref": "y", "x0": 0, "x1": 1,
                "y0": i - 0.5, "y1": i + 0.5, "fillcolor": "#eef0f4", "line": {"width": 0},
                "layer": "below",
            })
    y_px = top_px + timeline_px + gap_px
    for d in range(n_dev):
        axis = d + 2
        top, bottom = y_px, y_px + MEMORY_ROW_PX
        peak = sim.memory[d].peak
        limit = limits[d]
        y_top = max(peak, limit or 0, 1) / unit * 1.08
        last = d == n_dev - 1
        layout[f"xaxis{axis}"] = {
            "domain": [0, 1], "anchor": f"y{axis}", "matches": "x", "range": x_range,
            "showticklabels": last, "showgrid": True, "gridcolor": "#e4e6ea",
            "zeroline": False, "ticks": "outside" if last else "",
            "title": {"text": "time (µs)", "standoff": 4} if last else None,
        }
        layout[f"yaxis{axis}"] = {
            "domain": [frac(bottom - top_px), frac(top - top_px)], "anchor": f"x{axis}",
            "range": [0, y_top], "fixedrange": True, "title": {"text": unit_name},
            "showgrid": True, "gridcolor": "#e4e6ea", "zeroline": True, "nticks": 4,
        }
        if limit is None:
            share = " (no memory limit)"
        else:
            share = f" = {peak / limit:.1%} of its" if limit else " with a"
            share += f" {_bytes(limit)} limit"
        over = limit is not None and peak > limit
        layout["annotations"].append({
            "xref": "paper", "yref": f"y{axis} domain", "x": 0, "y": 1.0, "xanchor": "left",
            "yanchor": "bottom", "showarrow": False, "align": "left",
            "text": f"<b>memory on {_esc(devices[d])}</b>: peak {_bytes(peak)}{share}"
            + (" <b>— OVER THE LIMIT</b>" if over else ""),
            "font": {"size": 12, "color": LIMIT_COLOUR if over else "#222"},
        })
        y_px = bottom + MEMORY_GAP_PX
    config = {"responsive": True, "displaylogo": False, "scrollZoom": False,
              "modeBarButtonsToRemove": ["select2d", "lasso2d"],
              "toImageButtonOptions": {"format": "png", "filename": "baechi-plan"}}
    return {"data": traces, "layout": layout, "config": config}, height


# --------------------------------------------------------------------------- HTML
def _us(value: float, in_ms: bool | None = None) -> str:
    """A duration in ms (``in_ms``, or by default from 10 ms on) or in µs."""
    if not math.isfinite(value):
        return "—"
    if in_ms if in_ms is not None else value >= 10_000:
        return f"{value / 1000:,.2f} ms"
    return f"{value:,.1f} µs"


def _bytes(value: int | None) -> str:
    if value is None:
        return "unlimited"
    for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:,.2f} {name}"
    return f"{value:,} B"


def _card(label: str, value: str, detail: str = "", key: str = "", title: str = "") -> str:
    attr = f' data-key="{key}"' if key else ""
    tip = f' title="{html.escape(title)}"' if title else ""
    return (f'<div class="card"{attr}{tip}><div class="label">{html.escape(label)}</div>'
            f'<div class="value">{value}</div><div class="detail">{detail}</div></div>')


def _page(
    graph: Graph, plan: Plan, cluster: Cluster, sim: Simulation, view: View, overridden: bool
) -> str:
    est = sim.estimate
    devices = cluster.devices
    net = cluster.network
    algorithm = plan.request.algorithm or "(unknown)"
    seconds = plan.stats.placement_seconds or None
    step = est.step_time_us
    in_ms = step >= 10_000  # one unit for every duration on the page

    def dur(value: float) -> str:
        return _us(value, in_ms)

    speedup = est.single_device_us / step if step > 0 else math.nan
    over_lb = step / est.lower_bound_us if est.lower_bound_us > 0 else math.nan
    bandwidth = "∞" if math.isinf(net.bandwidth_gbps) else f"{net.bandwidth_gbps:g} GB/s"
    title = f"Baechi plan — {graph.name or 'graph'} on {len(devices)} devices ({algorithm})"

    cards = [
        _card("step time", dur(step), f"{step:,.3f} µs", "step_time_us"),
        _card("lower bound", dur(est.lower_bound_us),
              f"step time is {over_lb:,.2f}× the bound" if math.isfinite(over_lb) else "",
              "lower_bound_us", f"{est.lower_bound_us:,.3f} µs"),
        _card("single device", dur(est.single_device_us),
              "fits in memory" if est.single_device_fits else "does not fit in memory",
              "single_device_us", f"{est.single_device_us:,.3f} µs"),
        _card("speedup", f"{speedup:,.2f}×" if math.isfinite(speedup) else "—",
              "single device ÷ step time", "speedup"),
        _card("transfers", f"{est.transfers:,}", _bytes(est.transfer_bytes) + " moved",
              "transfers", f"{est.transfer_bytes:,} bytes"),
        _card("memory", "fits" if est.memory_ok else "OVER A LIMIT",
              "peak ≤ limit on every device" if est.memory_ok else "see the table",
              "memory_ok"),
        _card("algorithm", html.escape(algorithm),
              "the single-device plan was faster" if plan.stats.chose_single else "",
              "algorithm"),
        _card("placement",
              f"{seconds:,.3f} s" if isinstance(seconds, int | float) else "—",
              "" if isinstance(seconds, int | float) else "not recorded in the plan",
              "placement_seconds"),
    ]

    busy = [0.0] * len(devices)
    count = [0] * len(devices)
    for op, d in enumerate(sim.device_of):
        busy[d] += sim.end[op] - sim.start[op]
        count[d] += 1
    sends = [0] * len(devices)
    receives = [0] * len(devices)
    for s, r in zip(sim.transfers.src_device, sim.transfers.dst_device, strict=True):
        sends[s] += 1
        receives[r] += 1
    rows = []
    for d, dev in enumerate(devices):
        peak = est.peak_memory_bytes.get(dev.name, sim.memory[d].peak)
        limit = dev.memory_bytes
        over = limit is not None and peak > limit
        share = (f"{peak / limit:.1%}" if limit else "—") + (" — over" if over else "")
        # (a zero limit has no meaningful share; "over" still says whether the peak exceeds it)
        cells = [
            html.escape(dev.name), f"{dev.speed:g}", f"{count[d]:,}", dur(busy[d]),
            f"{busy[d] / step:.1%}" if step > 0 else "—",
            f'<span title="{peak:,} bytes">{_bytes(peak)}</span>',
            f'<span title="{"unlimited" if limit is None else f"{limit:,} bytes"}">'
            f"{_bytes(limit)}</span>",
            share, f"{sends[d]:,} / {receives[d]:,}",
        ]
        rows.append(
            f'<tr class="{"over" if over else "ok"}" data-device="{html.escape(dev.name)}">'
            + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
        )

    notes = []
    if net.mode == "sequential":
        notes.append(
            "Communication lanes: each device has one channel shared by its sends and receives "
            "(sequential mode); a transfer a→b holds both channels, so it is drawn in both "
            "devices' <i>comm</i> lanes.")
    else:
        notes.append(
            "Communication lanes: one per sending device (parallel mode: transfers never "
            "contend, so they may overlap; they are drawn translucent).")
    om, tm = view.op_merge, view.transfer_merge
    if len(om.count):
        notes.append(
            f'<span id="aggregation-note">Aggregated for speed: {len(graph):,} ops exceed the '
            f"cap of {view.op_cap:,} bars — "
            f"{len(om.single):,} ops are drawn individually and {om.merged_items:,} ops shorter "
            f"than {om.threshold:,.2f} µs (with idle gaps under that) are merged into "
            f"{len(om.count):,} dark grey bars, one per run, shaded by how busy the run is "
            "(faint = mostly idle); hover one for its count and busy time. Zoom in until at most "
            f"{view.op_cap:,} ops are in view to see them one by one.</span>")
    if len(tm.count):
        notes.append(
            f"Aggregated for speed: {view.transfer_items:,} transfer bars exceed the cap of "
            f"{view.transfer_cap:,}; {tm.merged_items:,} of them, shorter than "
            f"{tm.threshold:,.2f} µs (with gaps under that), are merged into "
            f"{len(tm.count):,} dark red bars, shaded by how busy the channel is in them; "
            "zooming in far enough draws them one by one.")
    decimated = [(a, b) for a, b in view.memory_points if b < a]
    if decimated:
        notes.append(
            "Memory curves with many changes are drawn as a min/max envelope per time bin "
            f"(≤ {4 * MEMORY_BINS:,} points per device; every peak kept).")
    if overridden:
        notes.append("Replayed on the cluster given to the report, not the plan's own.")
    elif plan.estimate is not None and not _same_estimate(plan.estimate.model_dump(),
                                                           est.model_dump()):
        notes.append(
            '<span class="warn">The plan\'s stored estimate differs from this replay '
            f"(stored step time {dur(plan.estimate.step_time_us)}); the page shows the "
            "replay.</span>")
    notes.append(
        "Drag across the timeline to zoom in time (every chart follows); double-click to "
        "reset; click a legend entry to hide it.")

    figure_json = orjson.dumps(view.figure, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    figure_json = figure_json.replace("<", "\\u003c")
    plot_attrs = {
        "data-lanes": len(view.lanes),
        "data-device-lanes": view.device_lanes,
        "data-channel-lanes": view.channel_lanes,
        "data-ops": len(graph),
        "data-op-bars": view.op_bars,
        "data-merged-ops": view.merged_ops,
        "data-transfers": len(sim.transfers),
        "data-transfer-bars": view.transfer_bars,
        "data-devices": len(devices),
    }
    attrs = " ".join(f'{k}="{v}"' for k, v in plot_attrs.items())
    sub = (f"{len(graph):,} ops, {graph.num_edges:,} edges · {len(devices)} devices · network "
           f"{net.latency_us:g} µs + {bandwidth}, {net.mode} · engine {__version__}")
    return _TEMPLATE.format(
        title=html.escape(title),
        heading=html.escape(title),
        sub=html.escape(sub),
        cards="\n".join(cards),
        rows="\n".join(rows),
        notes="\n".join(f"<li>{n}</li>" for n in notes),
        attrs=attrs,
        height=view.height,
        plotly=_plotly_js(),
        figure=figure_json,
        script=_SCRIPT,
        css=_CSS,
        errors=_ERRORS,
    )


def _same_estimate(a: dict[str, Any], b: dict[str, Any]) -> bool:
    for key, value in a.items():
        other = b.get(key)
        if isinstance(value, float) and isinstance(other, float):
            if not math.isclose(value, other, rel_tol=1e-9, abs_tol=1e-9):
                return False
        elif value != other:
            return False
    return True


@functools.lru_cache(maxsize=1)
def _plotly_js() -> str:
    """The minified plotly.js bundle shipped with the plotly package (imported lazily)."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise ImportError(
            "the plan report needs plotly (its bundled plotly.js is inlined in the page): "
            "pip install 'baechi[report]'"
        ) from None
    return get_plotlyjs().replace("</script", "<\\/script")


_CSS = """
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#222;
background:#f4f5f7}
main{max-width:1800px;margin:0 auto;padding:18px 22px 30px}
h1{font-size:20px;margin:0 0 2px}
.sub{color:#555;margin:0 0 14px;font-size:13px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(145px,1fr));gap:10px;
margin-bottom:14px}
.card{background:#fff;border:1px solid #dfe2e7;border-radius:8px;padding:9px 12px}
.card .label{font-size:11px;text-transform:uppercase;letter-spacing:.04em;color:#666}
.card .value{font-size:18px;font-weight:600;margin:1px 0;white-space:nowrap}
.card .detail{font-size:12px;color:#666;min-height:1em}
.panel{background:#fff;border:1px solid #dfe2e7;border-radius:8px;padding:10px 12px;
margin-bottom:14px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:right;padding:4px 10px;border-bottom:1px solid #eceef1;white-space:nowrap}
th:first-child,td:first-child{text-align:left}
th{font-weight:600;color:#444;background:#f7f8fa}
tr.over td{color:#b00020;font-weight:600}
ul.notes{margin:6px 0 0;padding-left:20px;color:#444;font-size:13px}
.warn{color:#b00020;font-weight:600}
#plot{width:100%}
.zoom-note{margin:0;min-height:1.2em;font-size:13px;color:#444}
"""

_ERRORS = """
(function () {
  var status = document.getElementById('report-status');
  var seen = [];
  window.baechiReportError = function (what) {
    var text = String(what && (what.stack || what.message) || what);
    seen.push(text);
    status.setAttribute('data-errors', String(seen.length));
    status.setAttribute('data-error-text', seen.join(' | ').slice(0, 2000));
  };
  window.addEventListener('error', function (e) {
    window.baechiReportError(e.error || e.message);
  });
  window.addEventListener('unhandledrejection', function (e) {
    window.baechiReportError(e.reason);
  });
})();
"""

_SCRIPT = """
(function () {
  var status = document.getElementById('report-status');
  var zoomNote = document.getElementById('zoom-note');
  var fail = function (e) {
    window.baechiReportError(e);
    status.setAttribute('data-ready', 'error');
  };
  function decode(spec) {
    var bin = atob(spec.bdata), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return spec.dtype === 'f8' ? new Float64Array(bytes.buffer) : new Int32Array(bytes.buffer);
  }
  // count what plotly actually drew, by the meta tag of each bar trace
  function count(gd) {
    var counts = {};
    gd.querySelectorAll('.barlayer .trace').forEach(function (g) {
      var cd = g.__data__;
      var meta = cd && cd[0] && cd[0].trace ? cd[0].trace.meta : '?';
      counts[meta] = (counts[meta] || 0) + g.querySelectorAll('.point path').length;
    });
    status.setAttribute('data-rendered-lanes',
      String(gd.querySelectorAll('.yaxislayer-above .ytick').length));
    status.setAttribute('data-rendered-op-bars',
      String((counts['ops'] || 0) + (counts['merged-ops'] || 0)));
    status.setAttribute('data-rendered-transfer-bars',
      String((counts['transfers'] || 0) + (counts['merged-transfers'] || 0)));
  }
  // zoom detail: once a zoom leaves at most `cap` merged items in view, draw them one by one
  function detail(gd, fig) {
    var full = fig.layout.xaxis.range.slice(), shown = full.slice(), updates = 0;
    var sets = (fig.detail || []).map(function (d) {
      var ids = d.traces.concat([d.merged]);
      return {d: d, ids: ids, y: decode(d.y), base: decode(d.base), end: decode(d.end),
              slot: decode(d.slot), row: decode(d.row), detailed: false,
              original: ['y', 'base', 'x', 'customdata'].map(function (k) {
                return ids.map(function (i) { return gd.data[i][k]; });
              })};
    });
    if (!sets.length) return;
    function apply() {
      var r = gd.layout.xaxis.range;
      if (!r || (r[0] === shown[0] && r[1] === shown[1])) return;
      shown = [r[0], r[1]];
      var zoomed = r[0] > full[0] || r[1] < full[1], notes = [];
      var ids = [], cols = [[], [], [], []];  // y, base, x, customdata per trace: one restyle
      sets.forEach(function (s) {
        var d = s.d, view = [];
        if (zoomed) {
          for (var i = 0; i < s.base.length; i++) {
            if (s.base[i] <= r[1] && s.end[i] >= r[0]) view.push(i);
          }
        }
        var want = zoomed && view.length <= d.cap;
        if (want) {
          var parts = [0, 1, 2, 3].map(function () {
            return s.ids.map(function () { return []; });
          });
          view.forEach(function (i) {
            var g = s.slot[i];
            parts[0][g].push(s.y[i]);
            parts[1][g].push(s.base[i]);
            parts[2][g].push(s.end[i] - s.base[i]);
            parts[3][g].push(d.rows[s.row[i]]);
          });
          notes.push('all ' + view.length.toLocaleString() + ' ' + d.noun +
                     ' in view are drawn one by one');
        } else {
          var parts = s.detailed ? s.original : null;
          if (zoomed) {
            notes.push(view.length.toLocaleString() + ' ' + d.noun + ' in view, more than ' +
                       d.cap.toLocaleString() + ': zoom in further to see them one by one');
          }
        }
        if (parts) {
          ids = ids.concat(s.ids);
          for (var k = 0; k < 4; k++) cols[k] = cols[k].concat(parts[k]);
        }
        s.detailed = want;
      });
      var job = ids.length ? Plotly.restyle(gd, {y: cols[0], base: cols[1], x: cols[2],
                                                 customdata: cols[3]}, ids) : Promise.resolve();
      job.then(function () {
        count(gd);
        zoomNote.textContent = notes.length ? 'Zoomed: ' + notes.join('; ') + '.' : '';
        status.setAttribute('data-view', sets.map(function (s) {
          return s.d.noun + ':' + (s.detailed ? 'detail' : 'merged');
        }).join(' '));
        status.setAttribute('data-view-updates', String(++updates));
      }).catch(fail);
    }
    var timer = null;
    gd.on('plotly_relayout', function () {
      clearTimeout(timer);
      timer = setTimeout(apply, 30);
    });
  }
  try {
    var t0 = performance.now();
    var fig = JSON.parse(document.getElementById('report-figure').textContent);
    Plotly.newPlot('plot', fig.data, fig.layout, fig.config).then(function (gd) {
      count(gd);
      detail(gd, fig);
      status.setAttribute('data-render-ms', (performance.now() - t0).toFixed(1));
      status.setAttribute('data-ready-ms', performance.now().toFixed(1));
      status.setAttribute('data-ready', '1');
    }).catch(fail);
  } catch (e) {
    fail(e);
  }
})();
"""

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="baechi report">
<link rel="icon" href="data:,">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
<div id="report-status" data-ready="0" data-errors="0" hidden></div>
<script>{errors}</script>
<main>
<h1>{heading}</h1>
<p class="sub">{sub}</p>
<section class="cards" id="summary">
{cards}
</section>
<section class="panel">
<table id="devices">
<thead><tr><th>device</th><th>speed</th><th>ops</th><th>busy</th><th>busy share</th>
<th>peak memory</th><th>limit</th><th>peak / limit</th><th>sends / receives</th></tr></thead>
<tbody>
{rows}
</tbody>
</table>
<ul class="notes" id="notes">
{notes}
</ul>
</section>
<section class="panel">
<p id="zoom-note" class="zoom-note"></p>
<div id="plot" {attrs} style="height:{height}px"></div>
</section>
</main>
<script>{plotly}</script>
<script type="application/json" id="report-figure">{figure}</script>
<script>{script}</script>
</body>
</html>
"""
