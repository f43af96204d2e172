"""Model-aware transfer order: book each channel by the urgency of its messages' consumers.

docs/format.md §4 books a channel first come, first served (FIFO): a message whose consumer is on
the critical path may queue behind one whose consumer idles for milliseconds. Hashemi et al.
("TicTac", 2019: TIC orders by the consumers' place in the graph, TAC by the schedule's times)
cut step time by ordering communication by when the computation needs it. Here every
candidate order is replayed by the exact simulator and the fastest kept; FIFO stays (no
``transfer_order`` in the plan) unless a candidate is strictly faster and fits every device's
memory (the order moves memory peaks: a received copy is held from its transfer's start).

Candidates (the sorted ones order every channel's messages by one value, ties in the booking
order of the replay the value was read from):

- ``latest-start`` (TIC-like): the latest start of the message that does not lengthen the
  plan, given the longest path after it (op times on their devices, message durations, each
  device's order): step time − bottom level.
- ``dispatch/latest-start`` and ``dispatch/consumer-start``: list scheduling of the
  channels. The simulator's dispatch mode (:func:`~baechi.simulate.replay` with
  ``priority``) holds each issued message until both its channels are free and then sends
  the most urgent waiting one (by latest start, or by its first consumer's start in the FIFO
  replay); the order it books is the candidate, and the dispatch replay is its replay
  (written out, that order replays to the same times: property test). On the shared graphs
  this is the candidate that wins most often.
- ``consumer-start`` (TAC-like): when its first consumer started in the last replay, minus
  its duration; replayed and re-sorted by the new times :data:`TAC_ROUNDS` times.

Then, from the fastest order so far, ``promote``: walk the critical path of its replay back
from the last op; a message on it that started later than it was issued waited for the one
booked before it on one of its channels: move it just ahead of that one (or else ahead of
every message booked after it was issued), replay, keep the move when strictly faster (at most
:data:`PROMOTE_REPLAYS` replays). A move may deadlock (the one
ahead can be what it waits for): the simulator rejects it and the move is dropped.

For the sorted candidates, every value is non-decreasing along the plan's dependencies (an op
or message that waits for another, directly or not, never gets a smaller value) and ties go by
a booking order, which respects dependencies; a channel order sorted this way puts nothing
ahead of a message it waits for, so no sorted candidate deadlocks. A dispatched order is a
booked one, so it cannot deadlock either.

Cost: one pass over the plan's schedule graph plus at most :data:`MAX_REPLAYS` replays; none
starts after the request's deadline.

Examples
--------
>>> from baechi import Cluster, load_graph
>>> from baechi.costmodel import CostModel
>>> from baechi.simulate import replay
>>> g = load_graph({"format": "baechi.graph/v1",
...     "ops": [{"name": "p1", "compute_us": 10}, {"name": "p2", "compute_us": 10},
...             {"name": "x", "compute_us": 100}, {"name": "y", "compute_us": 1}],
...     "edges": [{"src": "p1", "dst": "y", "bytes": 50000},
...               {"src": "p2", "dst": "x", "bytes": 10000}]})
>>> cluster = Cluster.uniform(2, latency_us=0, bandwidth_gbps=1)
>>> cost = CostModel(g, cluster)
>>> fifo = replay(g, cluster, [0, 0, 1, 1], [[0, 1], [2, 3]], cost)
>>> outcome = order_transfers(cost, fifo, float("inf"))
>>> fifo.estimate.step_time_us, outcome.simulation.estimate.step_time_us, outcome.kept
(171.0, 131.0, 'model-aware')
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from baechi.costmodel import CostModel
from baechi.errors import InvalidPlan
from baechi.simulate import (
    Simulation,
    TransferKey,
    replay,
    schedule_graph,
    topological_nodes,
)

#: Replays of the ``consumer-start`` candidate (each re-sorts by the previous replay's times):
#: on the shared graphs the third round rarely changes the order any more.
TAC_ROUNDS = 3

#: Replays of ``promote`` at most (each tries one move of one critical message); after the
#: dispatch candidates it rarely wins on the shared graphs, so it gets few.
PROMOTE_REPLAYS = 8

#: Replays at most per plan: the placer's order, ``latest-start``, the two dispatch
#: candidates, :data:`TAC_ROUNDS` and :data:`PROMOTE_REPLAYS`.
MAX_REPLAYS = 1 + 1 + 2 + TAC_ROUNDS + PROMOTE_REPLAYS

#: The candidate a ``quick`` pass tries (:func:`order_transfers`), the one that wins most
#: often and by most: on a layered graph of 2,000 ops (4 devices, 1 byte per µs, CCR 0.3),
#: m-SCT's plan goes from 12,454 µs (FIFO) to 11,753 with it and to 11,750 with every
#: candidate, in 2 replays instead of 20 (135 ms).
QUICK = "dispatch/latest-start"

Kept = Literal["fifo", "model-aware"]


@dataclass(frozen=True)
class OrderOutcome:
    """What the post-pass kept: the plan's replay (with its ``transfer_order`` when the
    model-aware one was kept), which order, FIFO's step time, why it stopped short (the
    deadline) if it did, and each candidate's replayed step time (µs; ``None`` when it broke a
    memory limit)."""

    simulation: Simulation
    kept: Kept | None
    fifo_step_time_us: float | None = None
    note: str | None = None
    candidates: dict[str, float | None] = field(default_factory=dict)


def order_transfers(
    cost: CostModel, simulation: Simulation, deadline: float, *,
    mode: Literal["fifo", "model-aware"] = "model-aware",
    proposed: list[list[TransferKey]] | None = None, quick: bool = False,
    resume: OrderOutcome | None = None,
) -> OrderOutcome:
    """The plan of ``simulation`` with the fastest transfer order found.

    Parameters
    ----------
    cost : CostModel
        The request's cost model (the graph and cluster of ``simulation``).
    simulation : Simulation
        The plan's FIFO replay, or its replay in its placer's channel order, which is then
        the ``proposed`` one. When the placement's FIFO replay exceeds a device's memory,
        FIFO is no option: the plan keeps that order or a faster one that fits
        (``fifo_step_time_us`` is then ``None``, ``note`` says why).
    deadline : float
        A :func:`time.perf_counter` value: no replay starts after it.
    mode : {"model-aware", "fifo"}
        ``"fifo"`` keeps FIFO without trying anything.
    proposed : list of lists of message keys, optional
        A channel order for the same plan that the placer scheduled with (``exact``'s
        solution), tried first; kept like any candidate, only when strictly faster.
    quick : bool
        Try only :data:`QUICK` after ``proposed`` (one replay each instead of up to
        :data:`MAX_REPLAYS`): enough to rank several plans by what ordering gives them.
    resume : OrderOutcome, optional
        A ``quick`` pass of the same plan: the full pass starts from its order and does not
        replay what it tried again (``proposed`` and :data:`QUICK`: two of a full pass's
        replays, which a deadline may need for the others).

    Returns
    -------
    OrderOutcome
        ``kept`` is ``None`` in parallel mode (no channels), ``"fifo"`` when FIFO was kept.
    """
    if not cost.sequential:
        return OrderOutcome(simulation, None)
    placed = simulation if simulation.transfer_order is not None else None
    if placed is not None:  # the candidates are built from the placement's FIFO replay
        proposed = placed.transfer_order
        simulation = replay(cost.graph, cost.cluster, placed.device_of, placed.orders, cost)
        if not simulation.estimate.memory_ok:
            return _beyond_fifo(cost, simulation, placed, deadline, mode, quick, resume)
    fifo_us = simulation.estimate.step_time_us
    channels = simulation.channel_orders()
    if mode == "fifo" or all(len(channel) < 2 for channel in channels):
        return OrderOutcome(simulation, "fifo", fifo_us)
    if time.perf_counter() >= deadline:  # not even the schedule graph is built
        return OrderOutcome(simulation, "fifo", fifo_us,
                            "the deadline passed before transfers could be ordered")
    search = _Search(cost, simulation, deadline, resume)
    search.run(proposed, quick)
    kept: Kept = "fifo" if search.best.transfer_order is None else "model-aware"
    return OrderOutcome(search.best, kept, fifo_us, search.note, search.tried)


def _beyond_fifo(cost: CostModel, fifo: Simulation, placed: Simulation, deadline: float,
                 mode: Literal["fifo", "model-aware"], quick: bool,
                 resume: OrderOutcome | None) -> OrderOutcome:
    """:func:`order_transfers` for a plan that fits memory in its own channel order but not
    under FIFO (``fifo``): it keeps that order, or a faster candidate that fits too."""
    if mode == "fifo":
        raise ValueError("the plan fits memory only in its own transfer order, not under FIFO")
    search = _Search(cost, fifo, deadline, resume)
    if resume is None:
        search.best = placed
    if time.perf_counter() < deadline:
        search.run(None, quick)
    note = FIFO_OVERSHOOTS if search.note is None else f"{FIFO_OVERSHOOTS}; {search.note}"
    return OrderOutcome(search.best, "model-aware", None, note, search.tried)


#: ``transfer_order_note`` of a plan that fits memory only in its transfer order.
FIFO_OVERSHOOTS = ("with FIFO channels this placement would exceed a device's memory (a "
                   "received copy is held from its transfer's start): it keeps its placer's "
                   "transfer order, or a faster one that fits")


class _Search:
    """The candidates of the module docstring, replayed while the deadline allows."""

    def __init__(self, cost: CostModel, fifo: Simulation, deadline: float,
                 resume: OrderOutcome | None = None) -> None:
        self.cost = cost
        self.fifo = fifo
        self.deadline = deadline
        self.best = fifo if resume is None else resume.simulation
        self.note: str | None = None
        self.tried: dict[str, float | None] = {} if resume is None else dict(resume.candidates)
        n = len(cost.graph)
        keys, successors = schedule_graph(cost, fifo.device_of, fifo.orders)
        self.keys = keys
        self.successors = successors
        self.n = n
        #: consumers of each message (ops only: the graph has no channel edges)
        self.consumers = [successors[n + j] for j in range(len(keys))]

    def run(self, proposed: list[list[TransferKey]] | None = None, quick: bool = False
            ) -> None:
        fifo = self.fifo
        if proposed is not None and "placer" not in self.tried \
                and not self._try("placer", lambda: self._replayed(proposed)):
            return
        bottom = self._bottom_levels(fifo)
        step = fifo.estimate.step_time_us
        latest = {key: step - bottom[self.n + j] for j, key in enumerate(self.keys)}
        if quick:
            self._try(QUICK, lambda: self._dispatched(latest))
            return
        # No sort by the later of issue and latest start: in the FIFO replay every message
        # starts after its issue and at most at its latest start (its start plus the longest
        # path after it is at most the step), so that sort is this one (both gave the same step
        # time on all 129 plans of m-ETF and m-SCT that ordering sped up on the shared graphs).
        if not self._try("latest-start",
                         lambda: self._replayed(_sorted(fifo, latest, _booking_index(fifo)))):
            return
        for name, value in ((QUICK, latest),
                            ("dispatch/consumer-start", self._consumer_start(fifo))):
            if name not in self.tried \
                    and not self._try(name, lambda value=value: self._dispatched(value)):
                return
        current = fifo
        for round_ in range(TAC_ROUNDS):
            value = self._consumer_start(current)
            order = _sorted(current, value, _booking_index(current))
            if current.transfer_order is not None and order == current.transfer_order:
                break  # a fixed point: the next round would replay the same order
            replayed = self._try(f"consumer-start/{round_ + 1}",
                                 lambda order=order: self._replayed(order))
            if replayed is None:
                return
            current = replayed
        self._promote()

    def _promote(self) -> None:
        """Move critical messages ahead of the one they waited for (module docstring)."""
        replays = 0
        improved = True
        while improved and replays < PROMOTE_REPLAYS:
            improved = False
            base = self.best
            issued_at = {key: base.end[key[0]] for key in base.transfers.key}
            starts = dict(zip(base.transfers.key, base.transfers.start, strict=True))
            for channel, key, ahead in _critical_waits(self.cost, base):
                order = base.booked_order() if base.transfer_order is None \
                    else [list(c) for c in base.transfer_order]
                lane = order[channel]
                lane.remove(key)
                # just ahead of the one it waited for; else ahead of every message booked
                # after it was issued (as if it had been sent first when issued)
                first = lane.index(ahead)
                jump = first
                while jump > 0 and starts[lane[jump - 1]] > issued_at[key]:
                    jump -= 1
                for position in dict.fromkeys((first, jump)):
                    if replays >= PROMOTE_REPLAYS:
                        return
                    moved = [list(c) for c in order]
                    moved[channel].insert(position, key)
                    replays += 1
                    before = self.best
                    if self._try("promote", lambda moved=moved: self._replayed(moved)) is None:
                        return
                    if self.best is not before:
                        improved = True
                        break
                if improved:
                    break

    def _try(self, name: str, make: Callable[[], Simulation]) -> Simulation | None:
        """Keep the replay ``make`` makes if strictly faster and within memory; ``None`` (and
        a note) once the deadline has passed, without calling it."""
        if time.perf_counter() >= self.deadline:
            done = ", ".join(self.tried) or "none"
            self.note = f"the deadline passed while ordering transfers (candidates tried: {done})"
            return None
        try:
            simulation = make()
        except InvalidPlan:  # a promotion that deadlocks (the sorted candidates cannot)
            return self.fifo
        estimate = simulation.estimate
        step = estimate.step_time_us if estimate.memory_ok else None
        if name in self.tried:  # keep the best of repeated tries
            previous = self.tried[name]
            step = previous if step is None or (previous is not None and previous < step) \
                else step
        self.tried[name] = step
        if estimate.memory_ok and estimate.step_time_us < self.best.estimate.step_time_us:
            self.best = simulation
        return simulation

    def _replayed(self, order: list[list[TransferKey]]) -> Simulation:
        """The plan replayed in the transfer order ``order``."""
        fifo = self.fifo
        return replay(self.cost.graph, self.cost.cluster, fifo.device_of, fifo.orders,
                      self.cost, order, name_cycle=False)

    def _dispatched(self, value: dict[TransferKey, float]) -> Simulation:
        """The replay of the order the simulator's dispatch by ``value`` books (smallest
        first among the messages waiting when their channels are free): the dispatch replay
        itself, as that order replays to its times (property test), with the order."""
        fifo = self.fifo
        dispatched = replay(self.cost.graph, self.cost.cluster, fifo.device_of, fifo.orders,
                            self.cost, priority=value)
        return dataclasses.replace(dispatched, transfer_order=dispatched.booked_order())

    def _bottom_levels(self, simulation: Simulation) -> list[float]:
        """Longest path (µs) from each node's start to the end of the schedule graph."""
        successors, cost = self.successors, self.cost
        transfers = simulation.transfers
        booked = {key: i for i, key in enumerate(transfers.key)}
        duration = [cost.op_us[d][op] for op, d in enumerate(simulation.device_of)]
        for key in self.keys:
            i = booked[key]
            duration.append(transfers.end[i] - transfers.start[i])
        level = [0.0] * len(successors)
        for node in reversed(topological_nodes(successors)):
            after = 0.0
            for s in successors[node]:
                if level[s] > after:
                    after = level[s]
            level[node] = duration[node] + after
        return level

    def _consumer_start(self, simulation: Simulation) -> dict[TransferKey, float]:
        """Per message: when its first consumer started in ``simulation``, minus the
        message's duration (the latest start that would not have delayed that consumer)."""
        start, transfers = simulation.start, simulation.transfers
        duration = {key: e - s for key, s, e in zip(transfers.key, transfers.start,
                                                     transfers.end, strict=True)}
        return {key: min(start[c] for c in consumers) - duration[key]
                for key, consumers in zip(self.keys, self.consumers, strict=True)}


def _critical_waits(
    cost: CostModel, simulation: Simulation,
) -> list[tuple[int, TransferKey, TransferKey]]:
    """The messages on ``simulation``'s critical path that started later than they were
    issued, from the end back: (channel where the one booked before it ended at its start,
    its key, that one's key)."""
    graph, transfers = cost.graph, simulation.transfers
    start, end, device_of = simulation.start, simulation.end, simulation.device_of
    if not len(graph):
        return []
    booked = {key: i for i, key in enumerate(transfers.key)}
    previous_on: list[dict[int, int]] = []  # per channel: transfer -> the one booked before
    for channel in simulation.channel_orders():
        previous_on.append({b: a for a, b in itertools.pairwise(channel)})
    previous_op: dict[int, int] = {}
    for order in simulation.orders:
        previous_op.update({b: a for a, b in itertools.pairwise(order)})
    waits: list[tuple[int, TransferKey, TransferKey]] = []
    op = max(range(len(graph)), key=end.__getitem__)
    for _ in range(len(graph)):  # each step moves to an op that ended earlier or at once
        s, d = start[op], device_of[op]
        via_transfer, via_device = -1, -1
        for k in graph.in_edges[op]:
            src = graph.edge_src[k]
            if device_of[src] == d:
                if end[src] == s and via_device < 0:
                    via_device = src
                continue
            i = booked[cost.transfer_key(k, d)]
            if transfers.end[i] != s:
                continue
            if transfers.start[i] > end[src]:  # it waited for a channel
                for channel in (transfers.src_device[i], transfers.dst_device[i]):
                    ahead = previous_on[channel].get(i)
                    if ahead is not None and transfers.end[ahead] == transfers.start[i]:
                        waits.append((channel, transfers.key[i], transfers.key[ahead]))
                        break
            via_transfer = src
            break
        prev = previous_op.get(op, -1)
        nxt = via_transfer if via_transfer >= 0 else via_device
        if nxt < 0 and prev >= 0 and end[prev] == s:
            nxt = prev
        if nxt < 0 or nxt == op:
            break
        op = nxt
    return waits


def _booking_index(simulation: Simulation) -> dict[TransferKey, int]:
    return {key: i for i, key in enumerate(simulation.transfers.key)}


def _sorted(simulation: Simulation, value: dict[TransferKey, float],
            index: dict[TransferKey, int]) -> list[list[TransferKey]]:
    """Each channel's messages of ``simulation`` sorted by ``value``, ties by ``index``."""
    return [sorted(channel, key=lambda key: (value[key], index[key]))
            for channel in simulation.booked_order()]


__all__ = ["MAX_REPLAYS", "TAC_ROUNDS", "OrderOutcome", "order_transfers"]
