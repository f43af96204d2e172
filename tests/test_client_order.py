"""The topological order behind run-time enforcement (``client/tf/control_edges.py``): kept under edge
insertions without recomputing it, it must stay topological and refuse exactly the edges that
close a cycle. No TensorFlow needed."""

from __future__ import annotations

import doctest

from hypothesis import given, settings
from hypothesis import strategies as st

from baechi.client.tf import control_edges
from baechi.client.tf.control_edges import _Order


def reaches(successors: dict[str, set[str]], start: str, goal: str) -> bool:
    """A path from ``start`` to ``goal``, by plain search."""
    seen, stack = {start}, [start]
    while stack:
        name = stack.pop()
        if name == goal:
            return True
        for other in successors[name] - seen:
            seen.add(other)
            stack.append(other)
    return False


@st.composite
def graphs_and_insertions(draw: st.DrawFn) -> tuple[dict[str, set[str]], list[tuple[str, str]]]:
    """A directed graph (cycles allowed: TensorFlow's merged ops can close some) and edges to
    insert between any two of its ops."""
    n = draw(st.integers(1, 30))
    names = [f"n{i}" for i in range(n)]
    successors: dict[str, set[str]] = {name: set() for name in names}
    for i in range(n):
        for j in draw(st.sets(st.integers(0, n - 1), max_size=3)):
            # mostly forward edges, a few backward ones
            if j > i or draw(st.integers(0, 9)) == 0:
                successors[names[i]].add(names[j])
    pairs = st.tuples(st.sampled_from(names), st.sampled_from(names))
    return successors, draw(st.lists(pairs, max_size=60))


@settings(max_examples=300, deadline=None)
@given(case=graphs_and_insertions())
def test_insertions_keep_the_order_topological_and_refuse_only_cycles(
        case: tuple[dict[str, set[str]], list[tuple[str, str]]]) -> None:
    successors, insertions = case
    edges = {name: set(targets) - {name} for name, targets in successors.items()}
    order = _Order({name: set(targets) for name, targets in successors.items()})
    positioned = set(order.position)
    for a, b in insertions:
        if a == b or a not in order.position or b not in order.position:
            continue
        closes_a_cycle = reaches(edges, b, a)
        assert order.insert(a, b) is not closes_a_cycle, (a, b)
        if not closes_a_cycle:
            edges[a].add(b)
        assert order.successors == edges
        assert set(order.position) == positioned  # nothing gains or loses a position
        assert sorted(order.position.values()) == list(range(len(positioned)))
        for name in positioned:
            for target in edges[name]:
                if target in positioned:
                    assert order.position[name] < order.position[target], (name, target)
    # a refresh from scratch positions the same ops
    order.refresh()
    assert set(order.position) == positioned


@settings(max_examples=200, deadline=None)
@given(case=graphs_and_insertions())
def test_positions_refreshed_ahead_of_insertions_run_them_forward(
        case: tuple[dict[str, set[str]], list[tuple[str, str]]]) -> None:
    """Refreshed knowing the edges to come, the positions stay topological and position the
    same ops as a plain refresh; where those edges close no cycle together, they put each of
    them forward (then no insertion moves an op)."""
    successors, insertions = case
    order = _Order({name: set(targets) for name, targets in successors.items()})
    positioned = set(order.position)
    order.refresh(insertions)
    assert set(order.position) == positioned
    assert sorted(order.position.values()) == list(range(len(positioned)))
    for name in positioned:  # topological for the graph's own edges, whatever ``ahead`` is
        for target in successors[name] - {name}:
            if target in positioned:
                assert order.position[name] < order.position[target], (name, target)
    ahead = [(a, b) for a, b in insertions if a != b and a in positioned and b in positioned]
    union = {name: set(targets) - {name} for name, targets in successors.items()}
    for a, b in ahead:
        union[a].add(b)
    if all(not reaches(union, b, a) for a, b in ahead):  # acyclic together
        before = dict(order.position)
        for a, b in ahead:
            assert order.insert(a, b)
        assert order.position == before


def test_reaches_follows_the_edges_added() -> None:
    order = _Order({"a": {"b"}, "b": set(), "c": set()})
    assert order.reaches("a", "b") and not order.reaches("a", "c")
    assert order.insert("b", "c")
    assert order.reaches("a", "c") and not order.reaches("c", "a")


def test_docstring_examples() -> None:
    result = doctest.testmod(control_edges)
    assert result.attempted and result.failed == 0
