"""Fast, exact evaluation of many plans of one graph on one cluster (for local search).

:class:`PlanEvaluator` replays a plan (device per op, order per device) with the simulator's
rules (docs/format.md §4, :mod:`baechi.simulate`) and returns the same step time and memory peaks as
:func:`baechi.simulate.replay`, but is built for thousands of calls:

- what depends only on the graph and cluster is computed once: adjacency as flat lists, each
  message's cache identity as a small integer, transfer times memoised per (edge, link);
- a *bound* stops a replay as soon as the plan provably cannot beat it: an op ending at ``e``
  with a chain of successors that takes at least ``tail[op]`` on the fastest devices, or with
  ops after it on its device that take ``w`` in all, means the step ends no earlier than
  ``e + max(tail[op], w)``;
- *checkpoints*: a replay of a base plan keeps snapshots of its state; a candidate that
  differs from the base only from some instant on (a moved unit, a reordered device) resumes
  from the last snapshot before that instant instead of replaying from time zero;
- memory peaks are computed only when a device has a limit, and only for candidates that
  beat the bound.

Every time comes from :class:`~baechi.costmodel.CostModel`. The search replays its final plan
with :func:`~baechi.simulate.replay` (the judge) and the tests compare the two on random
graphs, so a divergence would be caught rather than returned.

Examples
--------
>>> from baechi import Cluster, load_graph
>>> g = load_graph({"format": "baechi.graph/v1",
...     "ops": [{"name": "a", "compute_us": 8}, {"name": "b", "compute_us": 2}],
...     "edges": [{"src": "a", "dst": "b", "bytes": 1000}]})
>>> ev = PlanEvaluator(g, Cluster.uniform(2, latency_us=10, bandwidth_gbps=1))
>>> ev.run([0, 1], [[0], [1]]).step_us, ev.run([0, 0], [[0, 1], []]).step_us
(21.0, 10.0)
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from baechi.cluster import Cluster
from baechi.costmodel import CostModel
from baechi.errors import InvalidPlan
from baechi.graph import Graph

#: Relative slack on the pruning bound, so that rounding never prunes a real improvement.
BOUND_SLACK = 1e-9
#: A replay with a deadline reads the clock once every this many events (+1; a power of 2).
CLOCK_EVERY = 1023


@dataclass
class _State:
    """Everything the event loop needs to continue from a point in simulated time."""

    events: list[tuple[float, float, int, int, int]]
    start: list[float]
    end: list[float]
    binding: list[int]
    arrival: list[float]
    waiting: list[int]
    position: list[int]
    busy: list[bool]  # an op committed on the device has not completed yet
    device_free: list[float]
    channel_free: list[float]
    sent: dict[int, int]
    t_src: list[int]
    t_dst: list[int]
    t_start: list[float]
    t_end: list[float]
    t_bytes: list[int]
    committed: int  # ops committed (given a start) so far
    now: float  # time of the last processed event

    def copy(self) -> _State:
        return _State(
            list(self.events), list(self.start), list(self.end), list(self.binding),
            list(self.arrival), list(self.waiting), list(self.position), list(self.busy),
            list(self.device_free), list(self.channel_free), dict(self.sent),
            list(self.t_src), list(self.t_dst), list(self.t_start), list(self.t_end),
            list(self.t_bytes), self.committed, self.now,
        )


@dataclass
class Evaluation:
    """The result of one replay.

    ``arrival[edge]`` is when the edge's data (or control message) reached its consumer's
    device; ``binding[op]`` is the in-edge whose arrival set the op's start, or -1 when the
    device (or time zero) did; ``commit[op]`` is the simulated instant at which the op was
    given its start (once it was ready and its device free); ``peaks`` are per-device memory
    peaks (``None`` when not computed).
    """

    step_us: float
    device_of: list[int]
    orders: list[list[int]]
    start: list[float]
    end: list[float]
    arrival: list[float]
    binding: list[int]
    commit: list[float]
    peaks: list[int] | None
    memory_ok: bool
    checkpoints: list[_State]


class PlanEvaluator:
    """Replays plans of one graph on one cluster, exactly as :func:`~baechi.simulate.replay`.

    Parameters
    ----------
    graph, cluster
        What every evaluated plan places.
    cost : CostModel, optional
        The request's cost model (built when not given).
    checkpoints : int
        How many snapshots a base replay keeps (see :meth:`run`).
    """

    def __init__(
        self, graph: Graph, cluster: Cluster, cost: CostModel | None = None,
        checkpoints: int = 24,
    ) -> None:
        self.graph = graph
        self.cluster = cluster
        self.cost = cost or CostModel(graph, cluster)
        self.n = len(graph)
        self.n_dev = len(cluster.devices)
        self.n_checkpoints = checkpoints
        self.op_us = self.cost.op_us
        self.sequential = self.cost.sequential
        self.limits = [d.memory_bytes for d in cluster.devices]
        self.limited = any(limit is not None for limit in self.limits)
        m = graph.num_edges
        self._message_bytes = [self.cost.message_bytes(k) for k in range(m)]
        self._message: list[int] = [-1] * (m * self.n_dev)  # (edge, dst device) → message id
        self._message_ids: dict[Any, int] = {}
        self._duration: list[float] = [-1.0] * (m * self.n_dev * self.n_dev)
        self.tail = self._tails()
        self._remaining: dict[int, tuple[list[int], list[float]]] = {}

    # ------------------------------------------------------------------ precomputation
    def _tails(self) -> list[float]:
        """``tail[op]``: a lower bound of the time between ``op``'s end and the step's end
        (its longest chain of successors, each at its fastest finite device time)."""
        fastest = [
            min((us[op] for us in self.op_us if math.isfinite(us[op])), default=0.0)
            for op in range(self.n)
        ]
        graph = self.graph
        tail = [0.0] * self.n
        for op in reversed(graph.topo):
            best = 0.0
            for k in graph.out_edges[op]:
                dst = graph.edge_dst[k]
                t = fastest[dst] + tail[dst]
                if t > best:
                    best = t
            tail[op] = best
        return tail

    def remaining(self, d: int, order: list[int]) -> list[float]:
        """``remaining[i]``: the compute time of the ops after ``order[i]`` on device ``d``
        (memoised per order list: candidates share the lists of devices they leave alone)."""
        cached = self._remaining.get(id(order))
        if cached is not None and cached[0] is order:
            return cached[1]
        us = self.op_us[d]
        suffix = list(itertools.accumulate([us[op] for op in reversed(order)]))
        suffix.reverse()
        suffix.append(0.0)
        rest = suffix[1:]
        if len(self._remaining) > 4096:
            self._remaining.clear()
        self._remaining[id(order)] = (order, rest)
        return rest

    def message(self, edge: int, dst_device: int) -> int:
        """The id of ``edge``'s message to ``dst_device`` (equal ids: one transfer)."""
        slot = edge * self.n_dev + dst_device
        mid = self._message[slot]
        if mid < 0:
            key = self.cost.transfer_key(edge, dst_device)
            mid = self._message_ids.setdefault(key, len(self._message_ids))
            self._message[slot] = mid
        return mid

    # ------------------------------------------------------------------ replay
    def run(
        self, device_of: list[int], orders: list[list[int]], bound: float = math.inf,
        base: Evaluation | None = None, since: float = 0.0, keep: bool = False,
        deadline: float = math.inf,
    ) -> Evaluation | None:
        """Replay a plan; ``None`` unless it ends strictly before ``bound`` (a step to beat).

        Parameters
        ----------
        device_of, orders
            The plan (op → device index, device → op indices); orders must be consistent.
        bound
            Stop and return ``None`` as soon as the step provably ends at or after this.
        base, since
            A replay (made with ``keep``) of a plan that behaves exactly like this one until
            simulated time ``since``: resume from its last snapshot taken before ``since``.
        keep
            Keep snapshots of this replay, to serve as a ``base`` later.
        deadline
            A :func:`time.perf_counter` value after which the replay gives up (``None``).
        """
        n_dev = self.n_dev
        graph = self.graph
        state: _State | None = None
        if base is not None:
            for snapshot in base.checkpoints:
                if snapshot.now < since:
                    state = snapshot
                else:
                    break
        if state is None:
            state = _State(
                [], [0.0] * self.n, [0.0] * self.n, [-1] * self.n,
                [0.0] * graph.num_edges, [len(ins) for ins in graph.in_edges],
                [0] * n_dev, [False] * n_dev, [0.0] * n_dev, [0.0] * n_dev, {},
                [], [], [], [], [], 0, -math.inf,
            )
            commit = [0.0] * self.n
            fresh = True
        else:
            state = state.copy()
            assert base is not None
            commit = list(base.commit)
            fresh = False
        checkpoints: list[_State] = []
        if keep and base is not None:  # the shared prefix's snapshots hold for this plan too
            checkpoints = [c for c in base.checkpoints if c.now < since]
        limit = bound * (1 + BOUND_SLACK) if math.isfinite(bound) else math.inf
        if not self._loop(state, device_of, orders, commit, fresh, limit, checkpoints, keep,
                          deadline):
            return None
        if any(state.position[d] < len(orders[d]) for d in range(n_dev)):
            raise InvalidPlan("inconsistent order: a device's order deadlocks")
        step = max(state.end, default=0.0)
        if step >= bound:
            return None
        peaks: list[int] | None = None
        memory_ok = True
        if self.limited:
            peaks = self._peaks(device_of, state)
            memory_ok = all(
                lim is None or p <= lim for lim, p in zip(self.limits, peaks, strict=True)
            )
        return Evaluation(step, device_of, orders, state.start, state.end, state.arrival,
                          state.binding,
                          commit, peaks, memory_ok, checkpoints)

    def _loop(
        self, state: _State, device_of: list[int], orders: list[list[int]],
        commit: list[float], fresh: bool, limit: float, checkpoints: list[_State],
        keep: bool, deadline: float,
    ) -> bool:
        """The simulator's event loop (see :func:`baechi.simulate._timing`); False if pruned
        or out of time."""
        graph = self.graph
        n_dev = self.n_dev
        op_us, tail = self.op_us, self.tail
        in_edges, out_edges, edge_dst = graph.in_edges, graph.out_edges, graph.edge_dst
        sequential = self.sequential
        message_slot, message = self._message, self.message
        duration, cost = self._duration, self.cost
        events, start, end, binding = state.events, state.start, state.end, state.binding
        arrival, waiting, position = state.arrival, state.waiting, state.position
        busy = state.busy
        device_free, channel_free, sent = state.device_free, state.channel_free, state.sent
        t_src, t_dst, t_start, t_end = state.t_src, state.t_dst, state.t_start, state.t_end
        t_bytes = state.t_bytes
        message_bytes = self._message_bytes
        push, pop = heapq.heappush, heapq.heappop
        if limit < math.inf:
            remaining = [self.remaining(d, orders[d]) for d in range(n_dev)]
        else:
            remaining = [[0.0] * len(order) for order in orders]
        now = state.now
        committed = state.committed

        def start_ready(d: int) -> bool:
            # Commit the device's next op once it is ready and the device's previous op has
            # completed (the simulator commits earlier, as soon as it is ready, but the times
            # are the same: the device chain alone sets device_free). Late commits make
            # checkpoints more useful: a candidate diverges no earlier than its first commit.
            nonlocal committed
            i = position[d]
            order = orders[d]
            if busy[d] or i == len(order):
                return True
            op = order[i]
            if waiting[op]:
                return True
            s = device_free[d]
            b = -1
            for k in in_edges[op]:
                if arrival[k] > s:
                    s = arrival[k]
                    b = k
            e = s + op_us[d][op]
            rest = remaining[d][i]
            if e + (tail[op] if tail[op] > rest else rest) > limit:
                return False
            start[op] = s
            end[op] = e
            binding[op] = b
            commit[op] = now
            push(events, (e, s, d, i, op))
            position[d] = i + 1
            device_free[d] = e
            busy[d] = True
            committed += 1
            return True

        if fresh:
            for d in range(n_dev):
                if not start_ready(d):
                    return False
        every = max(1, self.n // self.n_checkpoints) if keep else 0
        next_snapshot = committed + every
        clock = time.perf_counter
        popped = 0
        while events:
            popped += 1
            if not popped & CLOCK_EVERY and clock() > deadline:
                return False
            if keep and committed >= next_snapshot:
                state.now, state.committed = now, committed
                checkpoints.append(state.copy())
                next_snapshot = committed + every
            t, _, d, _, op = pop(events)
            now = t
            busy[d] = False
            for k in out_edges[op]:
                dst = edge_dst[k]
                dd = device_of[dst]
                if dd == d:
                    arrival[k] = t
                else:
                    slot = k * n_dev + dd
                    mid = message_slot[slot]
                    if mid < 0:
                        mid = message(k, dd)
                    index = sent.get(mid)
                    if index is None:
                        dslot = slot * n_dev + d
                        us = duration[dslot]
                        if us < 0:
                            us = duration[dslot] = cost.transfer_us(k, d, dd)
                        s = t
                        if sequential:
                            if channel_free[d] > s:
                                s = channel_free[d]
                            if channel_free[dd] > s:
                                s = channel_free[dd]
                            channel_free[d] = channel_free[dd] = s + us
                        index = sent[mid] = len(t_src)
                        t_src.append(op)
                        t_dst.append(dd)
                        t_start.append(s)
                        t_end.append(s + us)
                        t_bytes.append(message_bytes[k])
                    arrival[k] = t_end[index]
                waiting[dst] -= 1
                if not waiting[dst] and not busy[dd] and not start_ready(dd):
                    return False
            if not start_ready(d):  # the device is free: its next op, if ready
                return False
        state.now, state.committed = now, committed
        return True

    # ------------------------------------------------------------------ memory
    def _peaks(self, device_of: list[int], state: _State) -> list[int]:
        """Per-device memory peaks, as :func:`baechi.simulate._memory` computes them."""
        graph = self.graph
        n_dev = self.n_dev
        start, end, arrival = state.start, state.end, state.arrival
        output_free = list(end)
        copy_free = list(state.t_start)
        sent = state.sent
        edge_control = graph.edge_control
        for k, (src, dst) in enumerate(zip(graph.edge_src, graph.edge_dst, strict=True)):
            if edge_control[k]:
                continue
            d = device_of[src]
            dd = device_of[dst]
            if dd == d:
                if end[dst] > output_free[src]:
                    output_free[src] = end[dst]
            else:
                if arrival[k] > output_free[src]:
                    output_free[src] = arrival[k]
                index = sent[self.message(k, dd)]
                if end[dst] > copy_free[index]:
                    copy_free[index] = end[dst]
        dev = np.asarray(device_of, dtype=np.int64)
        start_a, end_a, out_free_a = np.array(start), np.array(end), np.array(output_free)
        temp_a = np.asarray(graph.temp_bytes, dtype=np.int64)
        out_a = np.asarray(graph.output_bytes, dtype=np.int64)
        persistent = np.asarray(graph.persistent_bytes, dtype=np.int64)
        t_dst = np.asarray(state.t_dst, dtype=np.int64)
        t_start, t_free = np.asarray(state.t_start), np.asarray(copy_free)
        t_bytes = np.asarray(state.t_bytes, dtype=np.int64)  # 0 for control messages
        peaks = []
        for d in range(n_dev):
            ops = np.flatnonzero(dev == d)
            copies = np.flatnonzero(t_dst == d)
            base = int(persistent[ops].sum())
            alloc = np.concatenate([start_a[ops], start_a[ops], t_start[copies]])
            free = np.concatenate([end_a[ops], out_free_a[ops], t_free[copies]])
            nbytes = np.concatenate([temp_a[ops], out_a[ops], t_bytes[copies]])
            peaks.append(_peak(alloc, free, nbytes, base))
        return peaks


def _peak(alloc: np.ndarray, free: np.ndarray, nbytes: np.ndarray, base: int) -> int:
    """Peak of items held over [alloc, free] on top of ``base``; at one instant frees of
    earlier items come before allocations, which come before frees of items allocated then."""
    keep = nbytes > 0
    alloc, free, nbytes = alloc[keep], free[keep], nbytes[keep]
    if not len(nbytes):
        return base
    times = np.concatenate([free, alloc])
    phase = np.concatenate([np.where(free > alloc, 0, 2), np.ones(len(alloc), dtype=np.int64)])
    delta = np.concatenate([-nbytes, nbytes])
    order = np.lexsort((phase, times))
    level = base + np.cumsum(delta[order])
    return int(max(base, level.max()))


__all__ = ["Evaluation", "PlanEvaluator"]
