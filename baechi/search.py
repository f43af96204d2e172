"""Local search over placements and orders, for graphs too large for an exact solver.

:func:`improve` starts from a plan (a heuristic's, within memory) and returns a plan that is
never worse under the simulator, stopping at a deadline. It is an iterated local search:

- **Representation.** A plan is a device per op plus one *rank*: a topological order of the
  whole graph. Each device's order is the subsequence of the rank on that device, so every
  candidate's orders are consistent by construction (all edges and device chains go forward
  in one linear order). The start plan's orders are kept exactly: its rank is a linear
  extension of its graph edges plus device chains. After each accepted move the rank is
  re-sorted by the new schedule's start times, so a moved op is inserted on its new device
  where it ran.
- **Moves**, aimed at the critical path (walked back from the op that ends last through what
  set each start: an input's arrival or the device being busy): move a unit to the device of
  the producer whose transfer it waited for, or the producer's unit to it; move a unit that
  waited for a busy device to another device, alone or with its *branch* (the chain of ops
  linked one to one through it on that device: moving one op of a chain pays a transfer in
  and out and runs nothing in parallel, moving the chain runs it beside the rest); swap it
  with the unit running there at that time; run it before the op it waited behind on its
  device; re-rank every device by upward rank (longest remaining path with this
  placement's transfers). Units (:class:`~baechi.grouping.Units`: colocation groups,
  forward pairs, pins) move as one; pinned units never move; a unit never goes where one of
  its ops cannot run (infinite time).
- **Acceptance.** First improvement, exactly as the simulator computes it
  (:class:`~baechi.evaluator.PlanEvaluator`: incremental replays from checkpoints, pruned as
  soon as a candidate cannot beat the current plan); memory must stay within every limit
  (persistent bytes screened first, then the simulated peaks). When no candidate improves,
  the best plan is *perturbed* (a few random unit moves that fit) and the search goes on from
  there, keeping the best plan found.
- **The judge.** The returned plan is replayed with :func:`~baechi.simulate.replay`; if that
  disagreed with the search's evaluator, or were worse than the start, the start is returned.

Examples
--------
>>> import time
>>> from baechi import Cluster, load_graph
>>> from baechi.grouping import colocation_units
>>> g = load_graph({"format": "baechi.graph/v1",
...     "ops": [{"name": n, "compute_us": 10} for n in "abcd"],
...     "edges": [{"src": "a", "dst": "b", "bytes": 0}, {"src": "a", "dst": "c", "bytes": 0},
...               {"src": "b", "dst": "d", "bytes": 0}, {"src": "c", "dst": "d", "bytes": 0}]})
>>> cluster = Cluster.uniform(2, latency_us=1)
>>> device_of, orders, stats = improve(g, cluster, [0, 0, 0, 0], [[0, 1, 2, 3], []],
...     units=colocation_units(g, cluster), deadline=time.perf_counter() + 1.0)
>>> stats.start_step_us, stats.step_us
(40.0, 31.0)
>>> device_of, orders
([0, 1, 0, 1], [[0, 2], [1, 3]])
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from baechi.cluster import Cluster
from baechi.costmodel import CostModel
from baechi.errors import InvalidPlan
from baechi.evaluator import Evaluation, PlanEvaluator
from baechi.graph import Graph
from baechi.grouping import Units, single_consumers
from baechi.memory import persistent_bytes_by
from baechi.simulate import check_orders, replay

#: Random unit moves applied to the best plan when the search is stuck.
PERTURB_MOVES = 3
#: Ops a branch move takes along at most, each way from the op on the critical path.
BRANCH_OPS = 8
#: Candidates built at a time and tried latest divergence first (cheapest replays first).
BATCH = 16
#: Candidates that change more ops than this are not estimated (tried first instead).
ESTIMATE_WINDOW = 512
#: Moves of at most this many ops edit the devices' current orders in place; larger ones
#: (a device emptied onto another) re-sort them.
SMALL_MOVE = 32


@dataclass
class SearchStats:
    """What :func:`improve` did.

    ``moves_evaluated`` counts candidate plans replayed (most only in part: from a
    checkpoint, and stopped once they cannot win); ``moves_screened`` the candidates set
    aside, not replayed, because their quick estimate did not beat the current plan (they are
    replayed only when no other candidate improves); ``moves_accepted`` the moves that
    improved the current plan (which after a perturbation may be worse than the best);
    ``note`` says why the start plan was returned unchanged, when it was for a reason other
    than finding nothing better.
    """

    start_step_us: float
    step_us: float
    moves_evaluated: int = 0
    moves_screened: int = 0
    moves_accepted: int = 0
    perturbations: int = 0
    seconds: float = 0.0
    note: str = ""

    @property
    def improvement(self) -> float:
        """Relative improvement over the start, in [0, 1)."""
        if self.start_step_us <= 0:
            return 0.0
        return 1.0 - self.step_us / self.start_step_us

    @property
    def moves_per_second(self) -> float:
        """Candidates considered (replayed or screened out) per second."""
        considered = self.moves_evaluated + self.moves_screened
        return considered / self.seconds if self.seconds > 0 else 0.0

    @property
    def replays_per_second(self) -> float:
        """Candidates replayed (in part or whole) per second."""
        return self.moves_evaluated / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with the derived figures."""
        return {**asdict(self), "improvement": self.improvement,
                "moves_per_second": self.moves_per_second,
                "replays_per_second": self.replays_per_second}


#: A built candidate: device_of, orders, rank, divergence instant, estimated step.
Candidate = tuple[list[int], list[list[int]], list[int], float, float]


@dataclass
class _Move:
    """A candidate: units sent to devices and/or one op run earlier in the rank."""

    units: tuple[tuple[int, int], ...] = ()  # (unit, destination device)
    before: tuple[int, int] | None = None  # (op, op it now runs before)


class _Search:
    """The current plan of one :func:`improve` call and the moves around it."""

    def __init__(
        self, graph: Graph, cluster: Cluster, units: Units, cost: CostModel,
        evaluator: PlanEvaluator, rng: random.Random, device_of: list[int], rank: list[int],
        evaluation: Evaluation,
    ) -> None:
        self.graph = graph
        self.units = units
        self.cost = cost
        self.ev = evaluator
        self.rng = rng
        self.n_dev = len(cluster.devices)
        self.limits = [math.inf if d.memory_bytes is None else d.memory_bytes
                       for d in cluster.devices]
        self.allowed = cost.unit_devices(units)
        self.unit_persistent = persistent_bytes_by(graph, units.unit_of, len(units))
        self.chain_prev, self.chain_next = _chain_links(graph)
        self.adopt(device_of, rank, evaluation)

    # ------------------------------------------------------------------ plan state
    def adopt(self, device_of: list[int], rank: list[int], evaluation: Evaluation) -> None:
        """Make a plan current: its placement, rank, replay and derived indexes."""
        self.device_of = device_of
        self.rank = rank
        self.cur = evaluation
        self.orders = evaluation.orders
        self.rank_of = [0] * len(rank)
        for i, op in enumerate(rank):
            self.rank_of[op] = i
        self.index_in_order = [0] * len(device_of)
        for order in self.orders:
            for i, op in enumerate(order):
                self.index_in_order[op] = i
        self.persistent_on = [0] * self.n_dev
        for unit, members in enumerate(self.units.members):
            self.persistent_on[device_of[members[0]]] += self.unit_persistent[unit]
        self.tail = self._schedule_tails()

    def _schedule_tails(self) -> list[float]:
        """``tail[op]``: the longest path from the op's start to the end of the current
        schedule, through its device chain (no gap) and its out-edges (the delay the schedule
        saw: the transfer, queueing included). ``start + tail == step`` on the critical path."""
        graph, cur = self.graph, self.cur
        end, arrival = cur.end, cur.arrival
        op_us, device_of = self.cost.op_us, self.device_of
        out_edges, edge_dst = graph.out_edges, graph.edge_dst
        chain_next = [-1] * len(device_of)
        for order in self.orders:
            for a, b in itertools.pairwise(order):
                chain_next[a] = b
        tail = [0.0] * len(device_of)
        for op in reversed(self.rank):
            best = tail[chain_next[op]] if chain_next[op] >= 0 else 0.0
            e = end[op]
            for k in out_edges[op]:
                t = arrival[k] - e + tail[edge_dst[k]]
                if t > best:
                    best = t
            tail[op] = op_us[device_of[op]][op] + best
        return tail

    def estimate(self, device_of: list[int], orders: list[list[int]],
                 changed: set[int], moved: list[int], earlier: int = -1) -> float:
        """A quick estimate of a candidate's step (to try the promising ones first): re-time
        only the ops around the change, each op's rest of the schedule taken from the current
        plan's tails (as job-shop local search estimates moves; channels not re-booked)."""
        cur, graph, cost = self.cur, self.graph, self.cost
        end, arrival, tail = cur.end, cur.arrival, self.tail
        old_device = self.device_of
        edge_src, edge_dst = graph.edge_src, graph.edge_dst
        # the ops whose timing the change touches directly: on each changed device, from
        # the first position that differs to the first op of the unchanged tail (moved ops
        # lie in that stretch of their new device), with their positions there
        index: dict[int, int] = {}
        for d in changed:
            old, new = self.orders[d], orders[d]
            i = _first_difference(old, new)
            j = _common_suffix(old, new)
            stop = min(len(new), len(new) - j + 1)
            if stop - i > ESTIMATE_WINDOW:
                return -math.inf  # too wide to estimate: try it first rather than never
            for pos in range(i, stop):
                index[new[pos]] = pos
        if len(index) > ESTIMATE_WINDOW:
            return -math.inf
        rank_of = self.rank_of
        # in the candidate's rank, ``earlier`` (a reordered op) comes just before its old
        # predecessor on the device, which is also where the sort below puts it
        ordered = sorted(index, key=lambda op: rank_of[op] if op != earlier
                         else rank_of[orders[device_of[op]][index[op] + 1]] - 0.5)
        new_end: dict[int, float] = {}
        estimate = -math.inf
        for op in ordered:
            d = device_of[op]
            order = orders[d]
            i = index[op]
            head = 0.0
            if i:
                before = order[i - 1]
                head = new_end.get(before, end[before])
            for k in graph.in_edges[op]:
                src = edge_src[k]
                ready = new_end.get(src, end[src])
                ds = device_of[src]
                if ds != d:
                    if old_device[src] == ds and old_device[op] == d:
                        ready += arrival[k] - end[src]
                    else:
                        ready += cost.transfer_us(k, ds, d)
                if ready > head:
                    head = ready
            e = head + cost.op_us[d][op]
            new_end[op] = e
            rest = 0.0
            if i + 1 < len(order) and order[i + 1] not in index:
                rest = tail[order[i + 1]]
            for k in graph.out_edges[op]:
                dst = edge_dst[k]
                if dst in index:
                    continue
                dd = device_of[dst]
                delay = 0.0
                if dd != d:
                    if old_device[dst] == dd and old_device[op] == d:
                        delay = arrival[k] - end[op]
                    else:
                        delay = cost.transfer_us(k, d, dd)
                if delay + tail[dst] > rest:
                    rest = delay + tail[dst]
            if e + rest > estimate:
                estimate = e + rest
        return estimate

    def orders_of(self, device_of: list[int], rank: list[int]) -> list[list[int]]:
        orders: list[list[int]] = [[] for _ in range(self.n_dev)]
        appenders = [o.append for o in orders]
        for op in rank:
            appenders[device_of[op]](op)
        return orders

    @staticmethod
    def resorted_rank(rank: list[int], evaluation: Evaluation) -> list[int]:
        """``rank`` sorted by (start, commit instant, position in ``rank``): still a linear
        extension of the graph and of the device chains ``rank`` gives, and it follows the
        schedule, so a moved op is later inserted on its new device where it ran."""
        start, commit = evaluation.start, evaluation.commit
        rank_of = [0] * len(rank)
        for i, op in enumerate(rank):
            rank_of[op] = i
        return sorted(rank, key=lambda op: (start[op], commit[op], rank_of[op]))

    # ------------------------------------------------------------------ candidates
    def apply(self, move: _Move) -> Candidate | None:
        """The candidate plan (device_of, orders, rank), the instant from which it may
        behave differently from the current plan, and its estimated step; ``None`` when it
        cannot fit or is a no-op."""
        units = self.units
        device_of = self.device_of
        rank = self.rank
        changed: set[int] = set()
        moved: list[int] = []
        if move.units:
            persistent = list(self.persistent_on)
            device_of = list(device_of)
            for unit, d in move.units:
                members = units.members[unit]
                old = device_of[members[0]]
                if old == d:
                    continue
                persistent[old] -= self.unit_persistent[unit]
                persistent[d] += self.unit_persistent[unit]
                for op in members:
                    device_of[op] = d
                moved.extend(members)
                changed.update((old, d))
            if not moved or any(p > lim for p, lim in zip(persistent, self.limits, strict=True)):
                return None
        if move.before is not None:
            op, ahead = move.before
            rank = list(rank)
            rank.pop(self.rank_of[op])
            rank.insert(self.rank_of[ahead], op)
            changed.add(device_of[op])
        orders = list(self.orders)
        for d in changed:
            orders[d] = self._new_order(d, device_of, rank, moved, move.before)
        earlier = move.before[0] if move.before is not None else -1
        return (device_of, orders, rank, self.since(orders, changed, moved, device_of),
                self.estimate(device_of, orders, changed, moved, earlier))

    def _new_order(self, d: int, device_of: list[int], rank: list[int], moved: list[int],
                   before: tuple[int, int] | None) -> list[int]:
        """Device ``d``'s order in a candidate: the rank's ops placed on ``d``. Built from
        the current order where a move changes little of it (list edits in C), from the
        whole rank otherwise."""
        order = self.orders[d]
        if before is not None:
            op, ahead = before
            i = self.index_in_order[op]
            if moved or not i or order[i - 1] != ahead:
                return [v for v in rank if device_of[v] == d]
            order = list(order)
            order[i - 1], order[i] = op, ahead  # op now runs just before its predecessor
            return order
        rank_of = self.rank_of
        if len(moved) > SMALL_MOVE:
            return sorted([v for v in order if device_of[v] == d]
                          + [v for v in moved if device_of[v] == d], key=rank_of.__getitem__)
        order = list(order)
        for v in moved:
            if self.device_of[v] == d:
                order.remove(v)
            elif device_of[v] == d:
                bisect.insort(order, v, key=rank_of.__getitem__)
        return order

    def since(self, orders: list[list[int]], changed: set[int], moved: list[int],
              device_of: list[int]) -> float:
        """The earliest simulated instant at which the candidate may behave differently
        from the current plan (see :meth:`PlanEvaluator.run`)."""
        cur = self.cur
        commit, end = cur.commit, cur.end
        graph = self.graph
        edge_src, in_edges = graph.edge_src, graph.in_edges
        since = math.inf
        for d in changed:
            old, new = self.orders[d], orders[d]
            i = _first_difference(old, new)
            if i < len(old):
                since = min(since, commit[old[i]])
            if i < len(new):
                ready = max((end[edge_src[k]] for k in in_edges[new[i]]), default=-math.inf)
                # the device reaches position i when the op before it completes
                previous = end[new[i - 1]] if i else -math.inf
                since = min(since, max(previous, ready))
        # what a moved op's inputs do is settled when each producer completes: it books
        # messages for the op's device, or the input is there at once on the same device;
        # a moved op's new device changes that even where its producer's messages stay the
        # same (one control message serves every consumer on a device)
        moved_set = set(moved)
        for op in moved:
            for k in in_edges[op]:
                producer = edge_src[k]
                if producer not in moved_set and end[producer] < since:
                    since = end[producer]
        return since

    def critical_path(self) -> list[tuple[int, int]]:
        """(op, what set its start) from the last op back: an in-edge id, or -1 when the
        device was busy (the op ran right after its predecessor there)."""
        cur = self.cur
        start, end, binding = cur.start, cur.end, cur.binding
        if not end:
            return []
        op = max(range(len(end)), key=end.__getitem__)
        path = []
        edge_src = self.graph.edge_src
        while True:
            b = binding[op]
            path.append((op, b))
            if start[op] <= 0:
                break
            if b >= 0:
                op = edge_src[b]
                continue
            i = self.index_in_order[op]
            if not i:
                break
            op = self.orders[self.device_of[op]][i - 1]
        return path

    def candidates(self) -> Iterator[_Move]:
        """Moves aimed at the critical path, in a random order per kind of bottleneck."""
        device_of, unit_of = self.device_of, self.units.unit_of
        path = self.critical_path()
        self.rng.shuffle(path)
        edge_src, in_edges = self.graph.edge_src, self.graph.in_edges
        for op, b in path:
            unit = unit_of[op]
            here = device_of[op]
            if b >= 0:
                producer = edge_src[b]
                there = device_of[producer]
                if there != here:  # waited for a transfer: bring the two together
                    if there in self.allowed[unit]:
                        yield _Move(units=((unit, there),))
                    if here in self.allowed[unit_of[producer]]:
                        yield _Move(units=((unit_of[producer], here),))
                continue
            i = self.index_in_order[op]
            if i == 0:
                continue
            # waited for its device: run it earlier there, or elsewhere
            ahead = self.orders[here][i - 1]
            if all(self.rank_of[edge_src[k]] < self.rank_of[ahead] for k in in_edges[op]):
                yield _Move(before=(op, ahead))
            others = [d for d in self.allowed[unit] if d != here]
            self.rng.shuffle(others)
            branch = self.branch(op)
            for d in others:
                yield _Move(units=((unit, d),))
                if len(branch) > 1 and all(d in self.allowed[w] for w in branch):
                    yield _Move(units=tuple((w, d) for w in branch))
                other = self._running_at(d, self.cur.start[op])
                if other >= 0 and here in self.allowed[unit_of[other]]:
                    yield _Move(units=((unit, d), (unit_of[other], here)))

    def branch(self, op: int) -> tuple[int, ...]:
        """The units of the chain through ``op`` on its device: ops linked one to one (a
        single producer with a single consumer), at most :data:`BRANCH_OPS` each way."""
        device_of, unit_of = self.device_of, self.units.unit_of
        here = device_of[op]
        found = {unit_of[op]: None}
        for links in (self.chain_prev, self.chain_next):
            v = links[op]
            steps = 0
            while v >= 0 and device_of[v] == here and steps < BRANCH_OPS:
                found[unit_of[v]] = None
                v = links[v]
                steps += 1
        return tuple(found)

    def _running_at(self, d: int, t: float) -> int:
        """The op of device ``d`` running (or next to run) at time ``t``; -1 if none."""
        order = self.orders[d]
        end = self.cur.end
        lo, hi = 0, len(order)
        while lo < hi:
            mid = (lo + hi) // 2
            if end[order[mid]] <= t:
                lo = mid + 1
            else:
                hi = mid
        return order[lo] if lo < len(order) else -1

    def collapses(self) -> Iterator[_Move]:
        """Every unit of one device moved to another (when they may all go there)."""
        on: list[list[int]] = [[] for _ in range(self.n_dev)]
        for unit, members in enumerate(self.units.members):
            on[self.device_of[members[0]]].append(unit)
        for a in range(self.n_dev):
            if not on[a]:
                continue
            for b in range(self.n_dev):
                if b != a and all(b in self.allowed[u] for u in on[a]):
                    yield _Move(units=tuple((u, b) for u in on[a]))

    def random_move(self) -> _Move | None:
        """A random unit to a random other device it may use."""
        units = [u for u in range(len(self.units)) if len(self.allowed[u]) > 1]
        if not units:
            return None
        unit = self.rng.choice(units)
        here = self.device_of[self.units.members[unit][0]]
        return _Move(units=((unit, self.rng.choice([d for d in self.allowed[unit]
                                                      if d != here])),))

    def upward_rank(self) -> list[int]:
        """A rank by longest remaining path (compute here, plus transfers between devices),
        ties in canonical order: list scheduling's priority for this placement."""
        graph, cost, device_of = self.graph, self.cost, self.device_of
        op_us = cost.op_us
        level = [0.0] * len(graph)
        for op in reversed(graph.topo):
            d = device_of[op]
            best = 0.0
            for k in graph.out_edges[op]:
                dst = graph.edge_dst[k]
                dd = device_of[dst]
                t = level[dst] + (cost.transfer_us(k, d, dd) if dd != d else 0.0)
                if t > best:
                    best = t
            level[op] = op_us[d][op] + best
        position = graph.topo_position
        indegree = [len(ins) for ins in graph.in_edges]
        heap = [(-level[op], position[op], op) for op in range(len(graph)) if not indegree[op]]
        heapq.heapify(heap)
        rank = []
        while heap:
            _, _, op = heapq.heappop(heap)
            rank.append(op)
            for k in graph.out_edges[op]:
                dst = graph.edge_dst[k]
                indegree[dst] -= 1
                if not indegree[dst]:
                    heapq.heappush(heap, (-level[dst], position[dst], dst))
        return rank


class _Driver:
    """The iterated local search: global moves, local moves, perturbations; keeps the best."""

    def __init__(self, search: _Search, stats: SearchStats, deadline: float,
                 lower_bound_us: float, on_better: Callable[[float], None] | None) -> None:
        self.search = search
        self.ev = search.ev
        self.stats = stats
        self.deadline = deadline
        # no plan ends before the lower bound: reaching it proves the plan optimal
        self.floor = lower_bound_us * (1 + 1e-12)
        self.on_better = on_better
        self.best = (search.device_of, search.rank, search.cur)

    def run(self) -> None:
        fresh = True  # a plan the global moves have not been tried on
        while time.perf_counter() < self.deadline and self.best[2].step_us > self.floor:
            if fresh:
                fresh = False
                if self.global_step():
                    continue
            if self.local_step():
                continue
            if time.perf_counter() < self.deadline:
                self.perturb()
                fresh = True

    def take(self, device_of: list[int], rank: list[int], evaluation: Evaluation) -> None:
        """Make a plan current; remember it if it is the best so far."""
        self.search.adopt(device_of, rank, evaluation)
        if evaluation.step_us < self.best[2].step_us:
            self.best = (device_of, rank, evaluation)
            if self.on_better is not None:
                self.on_better(evaluation.step_us)

    def global_step(self) -> bool:
        """Re-rank by upward rank, or empty a device onto another: the best that improves."""
        search, stats = self.search, self.stats
        found: tuple[list[int], list[int], Evaluation] | None = None
        rank = search.upward_rank()
        candidates = [(search.device_of, search.orders_of(search.device_of, rank), rank)]
        for move in search.collapses():
            built = search.apply(move)
            if built is not None:
                candidates.append((built[0], built[1], search.rank))
        for cand_device_of, cand_orders, cand_rank in candidates:
            if time.perf_counter() >= self.deadline:
                break
            stats.moves_evaluated += 1
            bound = found[2].step_us if found else search.cur.step_us
            candidate = self.ev.run(cand_device_of, cand_orders, bound=bound, keep=True,
                                    deadline=self.deadline)
            if candidate is not None and candidate.memory_ok:
                found = (cand_device_of, cand_rank, candidate)
        if found is None:
            return False
        stats.moves_accepted += 1
        self.take(found[0], search.resorted_rank(found[1], found[2]), found[2])
        return True

    def local_step(self) -> bool:
        """First improvement among the critical path's moves: first those whose estimate
        beats the current step, then (only if none improved) the others."""
        search = self.search
        skipped: list[_Move] = []
        for move, built in _batched(search, search.candidates(), BATCH, self.deadline):
            if time.perf_counter() >= self.deadline:
                return False
            if built[4] >= search.cur.step_us:
                self.stats.moves_screened += 1
                skipped.append(move)
                continue
            if self._try(built, keep=True):  # promising: often accepted
                return True
        for _, built in _batched(search, iter(skipped), BATCH, self.deadline):
            if time.perf_counter() >= self.deadline:
                return False
            if self._try(built, keep=False):
                return True
        return False

    def _try(self, built: Candidate, keep: bool) -> bool:
        """Replay a candidate (from the current plan's checkpoint); adopt it if it is
        faster and fits. ``keep``: take the snapshots a new base needs in this replay (else
        an accepted candidate is replayed again to take them)."""
        search = self.search
        cand_device_of, cand_orders, rank, since, _ = built
        self.stats.moves_evaluated += 1
        candidate = self.ev.run(cand_device_of, cand_orders, bound=search.cur.step_us,
                                base=search.cur, since=since, deadline=self.deadline,
                                keep=keep)
        if candidate is None or not candidate.memory_ok:
            return False
        if not keep:
            candidate = self.ev.run(cand_device_of, cand_orders, base=search.cur, since=since,
                                    keep=True)
            assert candidate is not None
        self.stats.moves_accepted += 1
        self.take(cand_device_of, search.resorted_rank(rank, candidate), candidate)
        return True

    def perturb(self) -> None:
        """A few random unit moves from the best plan, whatever they cost."""
        search = self.search
        self.stats.perturbations += 1
        search.adopt(*self.best)
        for _ in range(PERTURB_MOVES):
            move = search.random_move()
            built = search.apply(move) if move is not None else None
            if built is None:
                continue
            self.stats.moves_evaluated += 1
            candidate = self.ev.run(built[0], built[1], keep=True, deadline=self.deadline)
            if candidate is not None and candidate.memory_ok:
                self.take(built[0], search.resorted_rank(search.rank, candidate), candidate)


def _batched(search: _Search, moves: Iterator[_Move], batch: int,
             deadline: float) -> Iterator[tuple[_Move, Candidate]]:
    """Moves built in batches, each batch tried latest divergence first (the cheapest to
    replay: they resume from a later checkpoint); none built after ``deadline``."""
    pending: list[tuple[_Move, Candidate]] = []
    for move in moves:
        if time.perf_counter() >= deadline:
            return
        built = search.apply(move)
        if built is None:
            continue
        pending.append((move, built))
        if len(pending) == batch:
            pending.sort(key=lambda item: -item[1][3])
            yield from pending
            pending = []
    pending.sort(key=lambda item: -item[1][3])
    yield from pending


def _chain_links(graph: Graph) -> tuple[list[int], list[int]]:
    """Per op its producer and its consumer where the two are linked one to one (the op
    reads data from that producer alone, which feeds it alone), else -1."""
    consumer, _ = single_consumers(graph)
    n = len(graph)
    producer = [-1] * n  # the only data producer so far; -2: more than one
    for k, (src, dst) in enumerate(zip(graph.edge_src, graph.edge_dst, strict=True)):
        if not graph.edge_control[k]:
            producer[dst] = src if producer[dst] in (-1, src) else -2
    prev, nxt = [-1] * n, [-1] * n
    for op, p in enumerate(producer):
        # p feeds op data, so p's single consumer is a data one (never the control fallback)
        if p >= 0 and consumer[p] == op:
            prev[op], nxt[p] = p, op
    return prev, nxt


def _first_difference(a: list[int], b: list[int]) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter length if one is a prefix
    of the other). Bisection over slice comparisons, which run in C.

    >>> _first_difference([1, 2, 3, 4], [1, 2, 5]), _first_difference([1, 2], [1, 2, 3])
    (2, 2)
    """
    n = min(len(a), len(b))
    lo, hi = 0, n
    if a[:n] == b[:n]:
        return n
    while hi - lo > 1:  # a[:lo] == b[:lo] and a[lo:hi] != b[lo:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _common_suffix(a: list[int], b: list[int]) -> int:
    """How many trailing elements ``a`` and ``b`` share.

    >>> _common_suffix([1, 2, 3, 4], [0, 3, 4]), _common_suffix([1], [2])
    (2, 0)
    """
    n = min(len(a), len(b))
    lo, hi = 0, n  # the last lo elements agree; the last hi do not (unless hi == lo)
    if a[len(a) - n:] == b[len(b) - n:]:
        return n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[len(a) - mid:len(a) - lo] == b[len(b) - mid:len(b) - lo]:
            lo = mid
        else:
            hi = mid
    return lo


def _rank_of_plan(graph: Graph, orders: list[list[int]], evaluation: Evaluation) -> list[int]:
    """A topological order of the graph in which each device's order is a subsequence.

    Kahn's algorithm over the graph's edges plus each device's chain, earliest start first
    (then commit instant, then canonical position), so the rank follows the schedule.
    """
    n = len(graph)
    position = graph.topo_position
    chain_next = [-1] * n
    indegree = [len(ins) for ins in graph.in_edges]
    for order in orders:
        for a, b in itertools.pairwise(order):
            chain_next[a] = b
            indegree[b] += 1
    start, commit = evaluation.start, evaluation.commit
    heap = [(start[op], commit[op], position[op], op) for op in range(n) if not indegree[op]]
    heapq.heapify(heap)
    rank = []
    while heap:
        op = heapq.heappop(heap)[3]
        rank.append(op)
        successors = [graph.edge_dst[k] for k in graph.out_edges[op]]
        if chain_next[op] >= 0:
            successors.append(chain_next[op])
        for nxt in successors:
            indegree[nxt] -= 1
            if not indegree[nxt]:
                heapq.heappush(heap, (start[nxt], commit[nxt], position[nxt], nxt))
    return rank


def _check_start(graph: Graph, cluster: Cluster, units: Units, device_of: list[int],
                 orders: list[list[int]]) -> None:
    """Raise :class:`InvalidPlan` unless the start plan and units fit the graph and cluster."""
    n, n_dev = len(graph), len(cluster.devices)
    if len(device_of) != n or len(units.unit_of) != n:
        raise InvalidPlan(f"the start plan places {len(device_of)} ops and the units cover "
                          f"{len(units.unit_of)}; the graph has {n}")
    if len(orders) != n_dev:
        raise InvalidPlan(f"the start plan has {len(orders)} orders for {n_dev} devices")
    for d, order in enumerate(orders):
        for op in order:
            if not 0 <= op < n or device_of[op] != d:
                raise InvalidPlan(f"order of device {cluster.devices[d].name!r}: op {op} is "
                                  "not an op placed on that device")
    if sum(len(order) for order in orders) != n:
        raise InvalidPlan("the start plan's orders do not hold every op exactly once")
    for members in units.members:
        d = device_of[members[0]]
        for op in members[1:]:
            if device_of[op] != d:
                raise InvalidPlan(
                    f"the start plan splits a unit: {graph.names[members[0]]!r} and "
                    f"{graph.names[op]!r} must share a device", {"op": graph.names[op]})


def improve(
    graph: Graph, cluster: Cluster, device_of: list[int], orders: list[list[int]], *,
    units: Units, deadline: float, seed: int = 0, cost: CostModel | None = None,
    on_better: Callable[[float], None] | None = None,
) -> tuple[list[int], list[list[int]], SearchStats]:
    """Improve a plan by local search until ``deadline``; never returns a worse plan.

    Parameters
    ----------
    graph, cluster
        What the plan places.
    device_of, orders
        The start plan: device index per op, op indices per device (consistent orders).
    units
        Ops that move together (colocation groups, forward pairs, pins); pinned units
        never move.
    deadline
        A :func:`time.perf_counter` value; replays of candidates stop at it, so the search
        returns after it by about one replay of the best plan (the final check).
    seed
        Seed of the random choices (same seed, same plan, given the same number of moves).
    cost
        The request's cost model (built when not given).
    on_better
        Called with the step time (µs, the simulator's) of each better plan found, for
        progress reports.

    Returns
    -------
    device_of, orders, stats
        The best plan found (the start plan if nothing better was found) and
        :class:`SearchStats`. Its step time is the simulator's and is never above the start's;
        its memory peaks are within every device's limit when the start's were.

    Raises
    ------
    InvalidPlan
        The start plan's orders are inconsistent, or it splits a unit.
    """
    began = time.perf_counter()
    cost = cost or CostModel(graph, cluster)
    _check_start(graph, cluster, units, device_of, orders)
    check_orders(graph, orders)
    judged = replay(graph, cluster, device_of, orders, cost).estimate
    stats = SearchStats(judged.step_time_us, judged.step_time_us)

    def unchanged(note: str) -> tuple[list[int], list[list[int]], SearchStats]:
        stats.note = note
        stats.seconds = time.perf_counter() - began
        return list(device_of), [list(o) for o in orders], stats

    if not judged.memory_ok:
        return unchanged("the start plan exceeds a device's memory; it is returned as is")
    if len(cluster.devices) < 2 or len(graph) < 2:
        return unchanged("nothing to move")
    evaluator = PlanEvaluator(graph, cluster, cost)
    first = evaluator.run(list(device_of), [list(o) for o in orders], keep=True)
    names = [d.name for d in cluster.devices]
    if first is None or first.step_us != judged.step_time_us or (
        first.peaks is not None
        and first.peaks != [judged.peak_memory_bytes[name] for name in names]
    ):
        return unchanged("the search's evaluator disagrees with the simulator here")
    search = _Search(graph, cluster, units, cost, evaluator, random.Random(seed),
                     list(device_of), _rank_of_plan(graph, orders, first), first)
    driver = _Driver(search, stats, deadline, judged.lower_bound_us, on_better)
    driver.run()
    best = driver.best
    best_device_of, _, best_eval = best
    if best_eval is first:
        stats.seconds = time.perf_counter() - began
        return list(device_of), [list(o) for o in orders], stats
    final = replay(graph, cluster, best_device_of, best_eval.orders, cost).estimate
    if final.step_time_us > judged.step_time_us or not final.memory_ok:
        return unchanged("the search's evaluator disagreed with the simulator; start kept")
    stats.step_us = final.step_time_us
    stats.seconds = time.perf_counter() - began
    return best_device_of, [list(o) for o in best_eval.orders], stats


__all__ = ["SearchStats", "improve"]
