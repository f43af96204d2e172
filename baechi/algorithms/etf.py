"""m-ETF: earliest-task-first list scheduling under memory limits (Baechi, docs/format.md §6).

Repeatedly commit the (ready op, device with room) pair with the earliest start; ties go to
the op with the longest remaining path, then the canonical order, then the device index.
Data arrival follows the cost model (transfer latency and bandwidth, one channel per device
in sequential mode, a tensor sent to a device once), so the schedule is the simulator's: in
parallel mode exactly, in sequential mode up to the order in which channels are booked.

Memory is tracked as the simulator counts it: persistent bytes of a unit from the moment
the unit is placed, an op's temp until it ends, its output until its last consumer is
scheduled, received copies until their last consumer there. A pair that does not fit waits
until its device frees memory; when nothing fits anywhere, the best pair is committed
anyway and the plan is left to the simulator's verdict (``place`` then retries with a
tighter budget, or reports :class:`~baechi.errors.InfeasiblePlacement`).

The same engine runs m-SCT (:mod:`.sct`): ``favourite_child`` makes a device that just
finished an op wait for that op's favourite child unless an urgent op is ready; and m-EFT
(:func:`place_eft`), which commits the pair with the earliest finish instead.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from baechi.algorithms.base import Assignment, Problem
from baechi.errors import InfeasiblePlacement
from baechi.memory import persistent_bytes_by

#: The scheduler looks at the clock once per this many committed ops (``Problem.deadline``).
DEADLINE_CHECK_OPS = 256


def remaining_path(problem: Problem) -> list[float]:
    """Longest compute path from each op to a sink, the op included (each op on the device
    where it is fastest)."""
    graph = problem.graph
    fastest_us = problem.cost.fastest_us
    level = [0.0] * len(graph)
    for op in reversed(graph.topo):
        tail = 0.0
        for k in graph.out_edges[op]:
            if level[graph.edge_dst[k]] > tail:
                tail = level[graph.edge_dst[k]]
        level[op] = fastest_us[op] + tail
    return level


def place_etf(problem: Problem) -> Assignment:
    """m-ETF on ``problem``; see the module docstring.

    Examples
    --------
    >>> from baechi import Cluster, load_graph
    >>> from baechi.grouping import colocation_units
    >>> g = load_graph({"format": "baechi.graph/v1",
    ...     "ops": [{"name": n, "compute_us": 10} for n in "abc"],
    ...     "edges": [{"src": "a", "dst": "b", "bytes": 0}, {"src": "a", "dst": "c", "bytes": 0}]})
    >>> c = Cluster.uniform(2)
    >>> place_etf(Problem.of(g, c, colocation_units(g, c))).device_of
    [0, 0, 1]
    """
    return ListScheduler(problem).run()


def place_eft(problem: Problem) -> Assignment:
    """m-EFT on ``problem``: m-ETF committing the pair with the earliest finish, not start.

    On devices of different speeds, the earliest start often belongs to an idle slow device:
    m-ETF hands it ops that a fast device, free a little later, would finish sooner, and
    the slow device's ends delay their consumers (the rule of HEFT, Topcuoglu et al. 2002,
    here with m-ETF's priorities, channels and memory). On identical devices the two
    differ only in which ready op goes first.

    Examples
    --------
    A fast device and one four times slower; ``b`` and ``c`` wait for ``a``. m-ETF starts
    ``c`` on the idle slow device at 10 (it ends at 50); m-EFT runs it after ``b`` on the
    fast device (it ends at 30).

    >>> from baechi import Cluster, load_graph
    >>> from baechi.grouping import colocation_units
    >>> g = load_graph({"format": "baechi.graph/v1",
    ...     "ops": [{"name": n, "compute_us": 10} for n in "abc"],
    ...     "edges": [{"src": "a", "dst": "b", "bytes": 0}, {"src": "a", "dst": "c", "bytes": 0}]})
    >>> c = Cluster.parse({"devices": [{"name": "fast", "speed": 1},
    ...                                 {"name": "slow", "speed": 0.25}]})
    >>> problem = Problem.of(g, c, colocation_units(g, c))
    >>> place_etf(problem).device_of, place_etf(problem).stats["placer_step_time_us"]
    ([0, 0, 1], 50.0)
    >>> place_eft(problem).device_of, place_eft(problem).stats["placer_step_time_us"]
    ([0, 0, 0], 30.0)
    """
    return ListScheduler(problem, earliest_finish=True).run()


class Candidate(NamedTuple):
    """A ready op on a device, ordered as the scheduler chooses: earliest start, then the
    longest remaining path (``neg_rank`` = −path), the canonical order, the device index."""

    start: float
    neg_rank: float
    topo: int
    device: int
    op: int


class ListScheduler:
    """Event-ordered list scheduling with per-device candidate heaps.

    For each device two heaps hold the ready ops allowed there: ``waiting`` (keyed by the
    time their data is ready on the device) and ``available`` (data ready before the device
    is free; keyed by priority). The best pair of a device is the top of ``available`` if
    any, else the earliest of the waiting; the global choice is the best of the devices'
    bests (a :class:`Candidate`). Entries of ops committed elsewhere are dropped lazily. In
    sequential mode a waiting key is when the data could arrive with the channels as they
    were: the chosen pair is re-keyed when they got busier since; once re-keyed, an op that
    waits for messages goes to ``bound``, under each device they come from, keyed by its
    dearest message from there, its arrival following those channels (:meth:`_register`).

    The constructor builds the whole state (units, memory accounting, heaps, channel times);
    :meth:`run` schedules every op once, so a scheduler is used for one run.
    """

    def __init__(self, problem: Problem, favourite_child: list[int] | None = None,
                 earliest_finish: bool = False) -> None:
        self.problem = problem
        self.earliest_finish = earliest_finish  # m-EFT's choice (place_eft)
        graph = problem.graph
        cluster = problem.cluster
        self.graph = graph
        self.n_dev = len(cluster.devices)
        self.cost = problem.cost
        self.op_us = self.cost.op_us
        self._key = self.cost.transfer_key
        self.sequential = self.cost.sequential
        self.favourite_child = favourite_child
        self.rank = remaining_path(problem)
        self.topo_index = graph.topo_position
        # the schedule being built (run() fills it; one run per scheduler)
        g, n, n_dev = graph, len(graph), self.n_dev
        self.units = problem.units
        self.unit_device = list(self.units.pin)
        self.unit_persistent = persistent_bytes_by(g, self.units.unit_of, len(self.units))
        self.op_size = [g.temp_bytes[op] + g.output_bytes[op] for op in range(n)]
        self.by_size = [sorted(ops, key=lambda op: -self.op_size[op])
                        for ops in self.units.members]
        self.size_cursor = [0] * len(self.units)
        self.unit_reserve = [0] * len(self.units)  # bytes held back on the unit's device
        self.reserved = [0] * n_dev
        self.device_of = [-1] * n
        self.end = [0.0] * n
        self.done = [False] * n
        self.device_free = [0.0] * n_dev
        self.channel_free = [0.0] * n_dev
        self.sent: dict[tuple[Any, ...], float] = {}
        self.copy_bytes: dict[tuple[Any, ...], int] = {}
        self.output_free = [0.0] * n
        self.live = [0.0] * n_dev
        self.frees: list[list[tuple[float, int]]] = [[] for _ in range(n_dev)]
        self.pending_free = [0] * n_dev  # bytes in frees[d]
        # per device, (bytes of room to wake at, topo index, op): see _block
        self.blocked: list[list[tuple[float, int, int]]] = [[] for _ in range(n_dev)]
        self.level_times: list[list[float]] = [[] for _ in range(n_dev)]
        self.levels: list[list[float]] = [[] for _ in range(n_dev)]
        self.available: list[list[Any]] = [[] for _ in range(n_dev)]
        self.waiting: list[list[Any]] = [[] for _ in range(n_dev)]
        # sequential mode, per device and source device: waiting ops keyed by the dearest
        # of their messages from that source not sent yet (``T``), so that their data is
        # ready no sooner than ``max(channel_free[source], channel_free[d]) + T``: a key
        # that follows the channels, where a fixed key had to be renewed at every step. On
        # layered graphs of baechi.testing (4 PCIe devices, unreduced) ready sinks, outranked
        # everywhere, were re-keyed at every step: 10,000 ops took 15 s (0.8 s in parallel
        # mode), now 1.0 s (40,000: 5.1 s), the same plans. An op's entries are current
        # while ``bound_serial[op, d]`` holds their serial and how many are left;
        # ``watchers`` lists them under their messages: sending one for another op makes
        # the op's data ready sooner, so that renews its entries
        self.bound: list[dict[int, list[Any]]] = [{} for _ in range(n_dev)]
        self.bound_serial: dict[tuple[int, int], list[int]] = {}
        self.watchers: dict[tuple[Any, ...], list[tuple[int, int, int]]] = {}
        self.serials = 0
        self.best_from: list[int] = [-1] * n_dev  # where _best took each device's best
        for unit, d in enumerate(self.unit_device):
            if d >= 0:  # pinned
                self.live[d] += self.unit_persistent[unit]
                self.unit_reserve[unit] = self._pending_peak(unit)
                self.reserved[d] += self.unit_reserve[unit]
        self.data_consumers = [
            sum(1 for k in g.out_edges[op] if not g.edge_control[k]) for op in range(n)
        ]
        #: distinct producers each op still waits for
        self.waiting_inputs = [len({g.edge_src[k] for k in g.in_edges[op]}) for op in range(n)]

    # ----------------------------------------------------------------- transfers

    def data_ready(self, op: int, d: int) -> float:
        """When all of ``op``'s inputs could be on device ``d`` (channels as they are now)."""
        g = self.graph
        ready = 0.0
        for k in g.in_edges[op]:
            src = g.edge_src[k]
            if self.device_of[src] == d:
                t = self.end[src]
            else:
                t = self.sent.get(self._key(k, d))
                if t is None:
                    t = self.end[src]
                    if self.sequential:
                        t = max(t, self.channel_free[self.device_of[src]], self.channel_free[d])
                    t += self.cost.transfer_us(k, self.device_of[src], d)
            if t > ready:
                ready = t
        return ready

    def _book(self, op: int, d: int) -> tuple[float, int]:
        """Book the transfers ``op`` needs on ``d``; its data-ready time and copy bytes."""
        g = self.graph
        ready = 0.0
        copy_bytes = 0
        rekey: list[tuple[int, int, int]] = []  # ops that waited for a message sent now
        for k in g.in_edges[op]:
            src = g.edge_src[k]
            sd = self.device_of[src]
            if sd == d:
                t = self.end[src]
            else:
                key = self._key(k, d)
                t = self.sent.get(key)
                if t is None:
                    cost = self.cost.transfer_us(k, sd, d)
                    begin = self.end[src]
                    if self.sequential:
                        begin = max(begin, self.channel_free[sd], self.channel_free[d])
                        self.channel_free[sd] = self.channel_free[d] = begin + cost
                    t = self.sent[key] = begin + cost
                    if not g.edge_control[k]:
                        copy_bytes += g.edge_bytes[k]
                        self.copy_bytes[key] = g.edge_bytes[k]
                        self.output_free[src] = max(self.output_free[src], t)
                    rekey.extend(self.watchers.pop(key, ()))
            if t > ready:
                ready = t
        for other, dd, serial in rekey:  # their data may now be ready sooner
            if self._current(other, dd, serial):
                del self.bound_serial[other, dd]
                if not self._stale(other, dd):
                    self._push(other, dd, self.data_ready(other, dd), rekeyed=True)
        return ready, copy_bytes

    # ----------------------------------------------------------------- candidates
    def _allowed(self, op: int) -> Sequence[int]:
        unit = self.units.unit_of[op]
        d = self.unit_device[unit]
        return (d,) if d >= 0 else self.problem.devices_for(unit)

    def _offer(self, op: int) -> None:
        """Make a newly ready op a candidate on every device it may go to."""
        for d in self._allowed(op):
            self._push(op, d, self.data_ready(op, d))

    def _push(self, op: int, d: int, ready: float, rekeyed: bool = False) -> None:
        """Make ``op`` a candidate on ``d``, its data ready at ``ready`` (just computed);
        ``rekeyed``: the channels made it later than it was keyed, so its keys may follow
        them (:meth:`_register`)."""
        priority = (-self.rank[op], self.topo_index[op])
        if ready <= self.device_free[d]:
            heapq.heappush(self.available[d], (*priority, ready, op))
        elif not (rekeyed and self._register(op, d)):
            heapq.heappush(self.waiting[d], (ready, *priority, op))

    def _register(self, op: int, d: int) -> bool:
        """Key ``op`` on ``d`` by the channels it waits for: one entry per source device of
        its messages to ``d`` not sent yet, keyed by the dearest of them (``T``). Each entry
        bounds when its data can be ready from below, ``max(channel_free[source],
        channel_free[d]) + T`` however busy the channels get, and the entry whose bound is
        the data-ready time says so exactly. False when no message is pending."""
        g = self.graph
        pending: dict[int, float] = {}
        keys = []
        for k in g.in_edges[op]:
            src = g.edge_src[k]
            sd = self.device_of[src]
            if sd == d:
                continue
            key = self._key(k, d)
            if key in self.sent:
                continue
            pending[sd] = max(pending.get(sd, 0.0), self.cost.transfer_us(k, sd, d))
            keys.append(key)
        if not pending:
            return False
        serial = self.serials = self.serials + 1
        self.bound_serial[op, d] = [serial, len(pending)]
        priority = (-self.rank[op], self.topo_index[op])
        for source, transfer_us in pending.items():
            heapq.heappush(self.bound[d].setdefault(source, []),
                           (transfer_us, *priority, op, serial))
        for key in keys:
            self.watchers.setdefault(key, []).append((op, d, serial))
        return True

    def _current(self, op: int, d: int, serial: int) -> bool:
        """Whether an entry of ``op`` on ``d`` in ``bound`` with ``serial`` still counts."""
        entries = self.bound_serial.get((op, d))
        return entries is not None and entries[0] == serial

    def _stale(self, op: int, d: int) -> bool:
        unit_device = self.unit_device[self.units.unit_of[op]]
        return self.done[op] or (unit_device >= 0 and unit_device != d)

    def _best(self, d: int) -> Candidate | None:
        """Device ``d``'s best candidate (its key a lower bound when it comes from
        ``bound``); ``best_from[d]`` says which heap holds it (-2 ``available``, -1
        ``waiting``, else the source device in ``bound``)."""
        available, waiting, free = self.available[d], self.waiting[d], self.device_free[d]
        while waiting and waiting[0][0] <= free:
            ready, neg_rank, topo, op = heapq.heappop(waiting)
            heapq.heappush(available, (neg_rank, topo, ready, op))
        for source, bound in self.bound[d].items():
            channels = max(self.channel_free[source], self.channel_free[d])
            while bound and channels + bound[0][0] <= free:
                _, neg_rank, topo, op, serial = heapq.heappop(bound)
                if not self._current(op, d, serial) or self._stale(op, d):
                    continue
                # a bound by the device's free time: the data may still come later
                entries = self.bound_serial[op, d]
                ready = self.data_ready(op, d)
                entries[1] -= 1
                if ready <= free:
                    del self.bound_serial[op, d]  # the op's other entries no longer count
                    heapq.heappush(available, (neg_rank, topo, ready, op))
                elif not entries[1]:  # the last entry: it waits keyed by its data-ready time
                    del self.bound_serial[op, d]
                    heapq.heappush(waiting, (ready, neg_rank, topo, op))
        while available and self._stale(available[0][3], d):
            heapq.heappop(available)
        if available:
            neg_rank, topo, _, op = available[0]
            self.best_from[d] = -2
            return Candidate(self.device_free[d], neg_rank, topo, d, op)
        while waiting and self._stale(waiting[0][3], d):
            heapq.heappop(waiting)
        best = None
        if waiting:
            ready, neg_rank, topo, op = waiting[0]
            best = Candidate(ready, neg_rank, topo, d, op)
            self.best_from[d] = -1
        for source, bound in self.bound[d].items():
            while bound:
                _, _, _, op, serial = bound[0]
                current = self._current(op, d, serial)
                if current and not self._stale(op, d):
                    break
                heapq.heappop(bound)
                if current:
                    del self.bound_serial[op, d]
            if bound:
                transfer_us, neg_rank, topo, op, _ = bound[0]
                channels = max(self.channel_free[source], self.channel_free[d])
                candidate = Candidate(channels + transfer_us, neg_rank, topo, d, op)
                if best is None or candidate < best:
                    best, self.best_from[d] = candidate, source
        return best

    def _drop(self, d: int, op: int, *, entry_only: bool = False) -> bool:
        """Remove ``op`` (device ``d``'s best candidate, :meth:`_best`) from ``d``'s heaps;
        with ``entry_only``, only the entry of ``bound`` it came from. Whether ``op`` is
        still a candidate on ``d`` (another of its entries there still counts)."""
        source = self.best_from[d]
        heap = self.available[d] if source == -2 else self.waiting[d] if source == -1 else \
            self.bound[d][source]
        assert heap and heap[0][3] == op, "op is not the device's best candidate"
        heapq.heappop(heap)
        if source < 0:
            return False
        entries = self.bound_serial[op, d]
        entries[1] -= 1
        if entry_only and entries[1]:
            return True
        del self.bound_serial[op, d]
        return False

    # ----------------------------------------------------------------- memory
    def _pending_peak(self, unit: int, besides: int = -1) -> int:
        """temp + output of the unit's biggest op not scheduled yet, ``besides`` aside
        (0 when none is left)."""
        members, i = self.by_size[unit], self.size_cursor[unit]
        while i < len(members) and self.done[members[i]]:
            i += 1
        self.size_cursor[unit] = i
        if i < len(members) and members[i] == besides:
            i += 1
            while i < len(members) and self.done[members[i]]:
                i += 1
        return self.op_size[members[i]] if i < len(members) else 0

    def _need(self, op: int, d: int) -> float:
        """Bytes committing ``op`` on ``d`` adds, plus what ``d`` must keep free for the
        biggest pending op of each unit already there (so a unit is not stranded)."""
        g = self.graph
        need = g.temp_bytes[op] + g.output_bytes[op] + self.reserved[d]
        unit = self.units.unit_of[op]
        if self.unit_device[unit] < 0:
            need += self.unit_persistent[unit] + self._pending_peak(unit, besides=op)
        else:
            need -= self.unit_reserve[unit]
        return need + self._arriving(op, d)[0]

    def _arriving(self, op: int, d: int) -> tuple[int, float]:
        """Bytes of the copies ``op`` would have sent to ``d``, and when the first producer
        of them ends (``inf`` when none is needed)."""
        g = self.graph
        arriving, since = 0, math.inf
        for k in g.in_edges[op]:
            src = g.edge_src[k]
            if not g.edge_control[k] and self.device_of[src] != d and \
                    self._key(k, d) not in self.sent:
                arriving += g.edge_bytes[k]
                since = min(since, self.end[src])
        return arriving, since

    def _record_level(self, d: int, time: float) -> None:
        """Remember ``d``'s level at ``time``, keeping only points no later point dominates
        (levels decrease along the list, so the first point at or after a time is the
        highest level since then)."""
        times, levels = self.level_times[d], self.levels[d]
        while levels and levels[-1] <= self.live[d]:
            times.pop()
            levels.pop()
        times.append(time)
        levels.append(self.live[d])

    def _highest_since(self, d: int, time: float) -> float:
        i = bisect.bisect_left(self.level_times[d], time)
        return self.levels[d][i] if i < len(self.levels[d]) else 0.0

    def _copies_fit(self, op: int, d: int, budget: float) -> bool:
        """Copies for ``op`` arrive on ``d`` when their producers end, maybe long before ``op``
        starts: they must fit on top of what ``d`` held since then."""
        arriving, since = self._arriving(op, d)
        return not arriving or self._highest_since(d, since) + arriving <= budget

    def _fits(self, op: int, d: int, start: float, budget: float) -> bool:
        """Whether ``op`` fits on ``d`` when it starts at ``start``."""
        if math.isinf(budget):
            return True
        if not self._copies_fit(op, d, budget):
            return False
        need = self._need(op, d)
        if self.live[d] + need <= budget:
            return True
        # frees due by the op's start, not only by the last commit
        level = self.live[d] - sum(b for t, b in self.frees[d] if t <= start)
        if level + need <= budget:
            return True
        if not self.cost.is_instant(op, d):
            return False
        # a zero-time op frees the inputs it is the last user of before it allocates
        g = self.graph
        uses: dict[int, int] = {}
        for k in g.in_edges[op]:
            src = g.edge_src[k]
            if not g.edge_control[k] and self.device_of[src] == d:
                uses[src] = uses.get(src, 0) + 1
        arriving = self._arriving(op, d)[0]
        freed = sum(g.output_bytes[src] for src, n in uses.items()
                    if n == self.data_consumers[src])
        own = g.temp_bytes[op] + g.output_bytes[op]
        return level + max(need - own, need - arriving - freed) <= budget

    def _block(self, op: int, d: int) -> None:
        """Set ``op`` aside on ``d`` until ``d`` may have the room it needs: waking every
        blocked op on every free made tight memory quadratic (gnmt_baechi ×4 at 1200 MiB:
        m-ETF took 24.6 s; 1.5 s with this wake rule, same step time)."""
        need = self._need(op, d) - self.reserved[d]  # the reservations change: added back
        if self.cost.is_instant(op, d):  # it may free its inputs first (_fits)
            need -= self.graph.temp_bytes[op] + self.graph.output_bytes[op]
        heapq.heappush(self.blocked[d], (need, self.topo_index[op], op))

    def _release(self, now: float) -> None:
        """Apply every free due by ``now``; wake the blocked ops that now have room."""
        for d in range(self.n_dev):
            frees = self.frees[d]
            freed = False
            while frees and frees[0][0] <= now:
                nbytes = heapq.heappop(frees)[1]
                self.live[d] -= nbytes
                self.pending_free[d] -= nbytes
                freed = True
            blocked = self.blocked[d]
            if freed and blocked:
                # an op may start after frees still to come: they count as room
                room = self.budget[d] - self.live[d] + self.pending_free[d] - self.reserved[d]
                while blocked and blocked[0][0] <= room:
                    op = heapq.heappop(blocked)[2]
                    if not self._stale(op, d):
                        self._push(op, d, self.data_ready(op, d))

    def _schedule_free(self, d: int, time: float, nbytes: int) -> None:
        heapq.heappush(self.frees[d], (time, nbytes))
        self.pending_free[d] += nbytes

    def _consumed(self, src: int) -> None:
        """Every consumer of ``src`` is scheduled: free its output and received copies."""
        g = self.graph
        d = self.device_of[src]
        self._schedule_free(d, self.output_free[src], g.output_bytes[src])
        last: dict[tuple[Any, ...], float] = {}
        for k in g.out_edges[src]:
            dst = g.edge_dst[k]
            dd = self.device_of[dst]
            if dd != d and not g.edge_control[k]:
                key = self._key(k, dd)
                last[key] = max(last.get(key, 0.0), self.end[dst])
        for key, t in last.items():
            self._schedule_free(key[1], t, self.copy_bytes[key])

    # ----------------------------------------------------------------- main loop
    def run(self) -> Assignment:
        problem, g = self.problem, self.graph
        n, n_dev = len(g), self.n_dev
        data_consumers, waiting_inputs = self.data_consumers, self.waiting_inputs
        orders: list[list[int]] = [[] for _ in range(n_dev)]
        self.budget = budget = problem.budget
        forced = 0
        step = max(1, n // 20)
        for op in range(n):
            if not waiting_inputs[op]:
                self._offer(op)
        last_device = [-1] * n_dev  # op each device finished last (m-SCT's favourite rule)
        deadline_step = min(step, DEADLINE_CHECK_OPS)
        for count in range(n):
            if count % step == 0:
                problem.progress("place", count / n)
            if count % deadline_step == 0 and time.perf_counter() > problem.deadline:
                raise InfeasiblePlacement(
                    f"the request's time limit passed after {count} of {n} ops were "
                    "scheduled", {"deadline_reached": True})
            choice = self._select(budget, last_device)
            if choice is None:
                choice = self._force()
                forced += 1
            _, op, d = choice
            unit = self.units.unit_of[op]
            if self.unit_device[unit] < 0:
                self.unit_device[unit] = d
                self.live[d] += self.unit_persistent[unit]
            self.done[op] = True
            self.reserved[d] -= self.unit_reserve[unit]
            self.unit_reserve[unit] = self._pending_peak(unit)
            self.reserved[d] += self.unit_reserve[unit]
            ready, copy_bytes = self._book(op, d)
            start = max(self.device_free[d], ready)
            end = start + self.op_us[d][op]
            self.device_of[op], self.end[op], self.done[op] = d, end, True
            self.output_free[op] = max(self.output_free[op], end)
            self.device_free[d] = end
            last_device[d] = op
            orders[d].append(op)
            self.live[d] += g.temp_bytes[op] + g.output_bytes[op] + copy_bytes
            self._record_level(d, start)
            self._schedule_free(d, end, g.temp_bytes[op])
            for k in g.in_edges[op]:
                src = g.edge_src[k]
                if not g.edge_control[k]:
                    if self.device_of[src] == d:
                        self.output_free[src] = max(self.output_free[src], end)
                    data_consumers[src] -= 1
                    if data_consumers[src] == 0:
                        self._consumed(src)
            if not data_consumers[op]:
                self._consumed(op)
                data_consumers[op] = -1
            seen: set[int] = set()
            for k in g.out_edges[op]:
                dst = g.edge_dst[k]
                if dst not in seen:
                    seen.add(dst)
                    waiting_inputs[dst] -= 1
                    if not waiting_inputs[dst]:
                        self._offer(dst)
            self._release(start)
        stats: dict[str, Any] = {"placer_step_time_us": max(self.end, default=0.0)}
        if forced:
            stats["memory_forced_ops"] = forced
        return Assignment(self.device_of, orders, stats)

    def _select(
        self, budget: list[float], last_device: list[int]
    ) -> tuple[float, int, int] | None:
        """The best (start, op, device) that fits in memory; ``None`` if none does."""
        no_favour: set[int] = set()
        # each device's best, and what it runs (m-SCT's favourite child may come first);
        # only the device whose heaps or favour a step changed is asked again (the others'
        # heaps, device, channel and unit times stay as they are within one selection)
        tops = [self._best(d) for d in range(self.n_dev)]
        picks = [self._pick(top, last_device, no_favour) for top in tops]
        while True:
            bests = [pick for pick in picks if pick is not None]
            if not bests:
                return None
            if self.earliest_finish:
                # a top keyed by stale channels may hide its device's true best, whose finish
                # the comparison needs: every stale top is re-keyed before m-EFT chooses
                choice = next((pick for pick in bests if self._rekey_due(pick, tops)), None) \
                    or min(bests, key=self._finish)
            else:
                choice = min(bests)
            start, d, op = choice.start, choice.device, choice.op
            is_top = op == tops[d].op  # type: ignore[union-attr]
            if self.sequential and is_top:
                # channels got busier since the op was offered: re-key it and choose again
                ready = self.data_ready(op, d)
                if max(ready, self.device_free[d]) > start:
                    # an entry of ``bound`` whose channels do not hold the op longest goes;
                    # when it was the last, the op waits keyed by its data-ready time
                    source = self.best_from[d]
                    if not self._drop(d, op, entry_only=True):
                        # not for m-SCT: its favourite-child rule looks at each device's
                        # best as the lazy heaps give it; keys that follow the channels
                        # changed its plans (inceptionv3_training_layer, PCIe, unreduced)
                        self._push(op, d, ready, rekeyed=source < 0
                                   and self.favourite_child is None)
                    tops[d] = self._best(d)
                    picks[d] = self._pick(tops[d], last_device, no_favour)
                    continue
            if self._fits(op, d, start, budget[d]):
                return start, op, d
            if not is_top:
                no_favour.add(d)  # the favourite child does not fit: let the device choose
                picks[d] = tops[d]
                continue
            self._drop(d, op)
            self._block(op, d)
            tops[d] = self._best(d)
            picks[d] = self._pick(tops[d], last_device, no_favour)

    def _rekey_due(self, pick: Candidate, tops: list[Candidate | None]) -> bool:
        """Whether ``pick``, its device's top, starts later now than its key says (the
        channels got busier since it was offered)."""
        top = tops[pick.device]
        return (self.sequential and top is not None and pick.op == top.op
                and max(self.data_ready(pick.op, pick.device),
                        self.device_free[pick.device]) > pick.start)

    def _finish(self, pair: Candidate) -> tuple[float, Candidate]:
        """m-EFT's key of a pair: its finish, then m-ETF's order."""
        return pair.start + self.op_us[pair.device][pair.op], pair

    def _pick(self, best: Candidate | None, last_device: list[int], no_favour: set[int]
              ) -> Candidate | None:
        """What the device of ``best`` (its best candidate) runs next: ``best``, or for
        m-SCT, when the device's last op has a ready favourite child, that child, unless
        ``best`` is urgent (ready everywhere now, i.e. at the device's free time)."""
        if best is None or self.favourite_child is None:
            return best
        d, op = best.device, best.op
        last = last_device[d]
        child = self.favourite_child[last] if last >= 0 else -1
        waits = d not in no_favour and child >= 0 and child != op and not self.done[child]
        if waits and not self._urgent(best):
            ready_here = self._candidate_start(child, d)
            if ready_here is not None:
                return Candidate(ready_here, -self.rank[child], self.topo_index[child], d, child)
        return best

    def _urgent(self, best: Candidate) -> bool:
        start, d, op = best.start, best.device, best.op
        return start <= self.device_free[d] and all(
            self.data_ready(op, e) <= start for e in self._allowed(op)
        )

    def _candidate_start(self, op: int, d: int) -> float | None:
        """Start of ``op`` on ``d`` if ``op`` is ready and allowed there, else ``None``."""
        g = self.graph
        if any(not self.done[g.edge_src[k]] for k in g.in_edges[op]):
            return None
        if d not in self._allowed(op):
            return None
        return max(self.device_free[d], self.data_ready(op, d))

    def _force(self) -> tuple[float, int, int]:
        """Every candidate is blocked: take the earliest blocked pair regardless of memory
        (the simulator and the caller's retries decide). Drops stale entries on the way."""
        best = None
        for d in range(self.n_dev):
            live = [entry for entry in self.blocked[d] if not self._stale(entry[2], d)]
            if len(live) < len(self.blocked[d]):
                heapq.heapify(live)
                self.blocked[d] = live
            for _, _, op in live:
                start = max(self.device_free[d], self.data_ready(op, d))
                key = (start, -self.rank[op], self.topo_index[op], d, op)
                if best is None or key < best:
                    best = key
        assert best is not None, "a ready op always exists in a DAG"
        start, _, _, d, op = best
        blocked = self.blocked[d]
        blocked[:] = [entry for entry in blocked if entry[2] != op]
        heapq.heapify(blocked)
        return start, op, d
