"""Fusion (format.md §6, step 3): contract the ops of each unit into reduced nodes, acyclically.

:func:`fusion_partition` decides which ops become one node; :func:`contract` builds the reduced
graph, its units and the node → ops map; :func:`fuse` does both.

Acyclicity. Contracting an edge U→V of the current (already contracted) graph creates a cycle
iff another path U ⇝ V exists. Every node keeps a rank, and the ranks stay a topological order
of the contracted graph after each contraction; the test is exact or errs on the safe side:

- no other predecessor of V is ranked after U (Baechi's in(v) = 1 is the simplest case): a
  detour would have to enter V from after U, so there is none, and the merged node takes U's
  rank. Symmetrically, no other successor of U ranked before V (covers out(u) = 1): it takes
  V's rank. O(degree), the scan bounded by :data:`MAX_SCAN`.
- otherwise a search forward from U's other successors, through nodes ranked below V, looks for
  V (nodes ranked above V cannot reach it). If it is not found, a search backward from V's other
  predecessors through nodes ranked above U collects V's ancestors in between, and the affected
  ranks are permuted as in Pearce and Kelly's dynamic topological sort: ancestors of V, then
  the merged node, then descendants of U. Each search stops after :data:`MAX_VISITS` edges and
  the whole run after :data:`VISITS_PER_EDGE` per edge of the graph; a contraction whose check
  runs out of budget is skipped, which is always safe. Total time O((n + m) log n).

Edges are tried in canonical order of their source, then the skipped ones once more when one
of their nodes changed since (a contraction can remove the detour that blocked another one).
A node never outgrows the memory cap of the units (:func:`baechi.grouping.merge_cap`, same
proxy), so a unit larger than the cap (a big colocation group) stays several nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from baechi.cluster import Cluster
from baechi.graph import Graph
from baechi.grouping import DisjointSets, Units
from baechi.memory import MemoryProxy

#: Neighbours the O(degree) tests may scan before falling back to the exact check.
MAX_SCAN = 32
#: Edges one exact reachability check may scan before the contraction is skipped.
MAX_VISITS = 128
#: The whole run's exact checks may scan at most this many edges per edge of the graph.
VISITS_PER_EDGE = 4
#: Passes over the edges skipped earlier (each pass only retries the skipped ones).
RETRY_PASSES = 1


@dataclass
class Fusion:
    """The reduced graph and how its nodes map back to the original ops.

    ``node_of[op]`` is the op's reduced node, ``members[node]`` its ops in canonical order;
    ``units`` are the units of the reduced graph's nodes.
    """

    graph: Graph
    units: Units
    node_of: list[int]
    members: list[list[int]]
    stats: dict[str, int] = field(default_factory=dict)


def fusion_partition(
    graph: Graph, unit_of: list[int], max_visits: int = MAX_VISITS,
    stats: dict[str, int] | None = None, max_scan: int = MAX_SCAN, cap: float = math.inf,
    kinds: frozenset[str] | None = None,
) -> tuple[list[int], int]:
    """Which ops fuse into one node: contract edges inside units without creating a cycle.

    Parameters
    ----------
    graph
        The original graph.
    unit_of
        Unit per op; only edges whose ends share a unit are contracted.
    max_visits
        Edges one exact check may scan before it gives up (the contraction is then skipped).
    max_scan
        Neighbours the O(degree) tests may scan.
    cap
        Largest :func:`~baechi.grouping.unit_memory` proxy of a node (default: no limit).
    stats
        If given, receives counters: ``contracted`` edges, ``exact_checks`` run, of which
        ``reordered`` (safe, ranks permuted) and ``cycles_avoided`` (another path found), and
        ``gave_up`` (attempts skipped because a bounded search ran out).

    Returns
    -------
    node_of, count
        Node per op, nodes numbered in a topological order of the reduced graph.

    Examples
    --------
    A diamond a→{b, c}→d in one unit fuses into one node; with c in another unit, fusing
    a, b and d would make a cycle with c, so only a→b (or b→d) is contracted.

    >>> from baechi.graph import load_graph
    >>> g = load_graph({"format": "baechi.graph/v1",
    ...     "ops": [{"name": n, "compute_us": 1} for n in "abcd"],
    ...     "edges": [{"src": s, "dst": d, "bytes": 1}
    ...               for s, d in ["ab", "ac", "bd", "cd"]]})
    >>> fusion_partition(g, [0, 0, 0, 0])
    ([0, 0, 0, 0], 1)
    >>> fusion_partition(g, [0, 0, 1, 0])
    ([0, 0, 1, 2], 3)
    """
    n = len(graph)
    rank = list(graph.topo_position)  # changed as nodes merge
    edge_src, edge_dst = graph.edge_src, graph.edge_dst
    succ = [{edge_dst[k] for k in outs} for outs in graph.out_edges]
    pred = [{edge_src[k] for k in ins} for ins in graph.in_edges]
    # candidate edges inside units, in canonical order of their source, then file order
    pending_edges = [
        (u, v) for u in graph.topo for v in (edge_dst[k] for k in graph.out_edges[u])
        if unit_of[u] == unit_of[v]
    ]

    nodes = DisjointSets(n)  # a node is named by its root op
    parent, find = nodes.parent, nodes.find

    budget = VISITS_PER_EDGE * (len(edge_src) + n)
    proxy = MemoryProxy(graph)  # of each node, at its root
    # kinds with a measured time per op (compute_us_by_kind): a node sums its members' times
    # per kind, so only ops measured on the same kinds fuse (nulls fuse with anything)
    # (``kinds``: the cluster's device kinds; None = every kind counts)
    timed_kinds = None if graph.compute_us_by_kind is None else [
        frozenset(k for k, us in by_kind.items()
                  if us is not None and (kinds is None or k in kinds))
        for by_kind in graph.compute_us_by_kind]
    # a node's version changes when it or a neighbour merges: a skipped edge is only worth
    # retrying when one of its two nodes changed since
    version = [0] * n
    counts = {"contracted": 0, "exact_checks": 0, "reordered": 0, "cycles_avoided": 0,
              "gave_up": 0}
    pending = [(u, v, -1, -1, -1, -1) for u, v in pending_edges]
    for _ in range(RETRY_PASSES + 1):
        skipped: list[tuple[int, int, int, int, int, int]] = []
        merged_before = counts["contracted"]
        for u, v, old_u, old_v, ver_u, ver_v in pending:
            U = u if parent[u] == u else find(u)
            V = v if parent[v] == v else find(v)
            if U == V:
                continue
            if old_u == U and old_v == V and version[U] == ver_u and version[V] == ver_v:
                continue  # nothing changed around this edge since it was skipped
            # a node may not outgrow the merge cap (same proxy as units): the placer holds a
            # node's memory while any of it runs. Nodes only grow: no retry needed.
            if proxy.merged(U, V) > cap:
                continue
            if timed_kinds is not None and timed_kinds[U] != timed_kinds[V]:
                continue  # the fused node's time on some kind would mix two rules
            ru, rv = rank[U], rank[V]
            out_u, in_v = succ[U], pred[V]
            # No other predecessor of V ranked after U (Baechi's in(v) = 1 is the simplest
            # case): no path U ⇝ V can end in another edge, and the merged node can stand
            # where U stood. Symmetrically, no other successor of U ranked before V: it can
            # stand where V stood. Scans are bounded so that a node with thousands of
            # neighbours does not make the pass quadratic.
            if len(in_v) == 1 or (
                len(in_v) <= max_scan and all(rank[x] <= ru for x in in_v)
            ):
                new_rank = ru
            elif len(out_u) == 1 or (
                len(out_u) <= max_scan and all(rank[x] >= rv for x in out_u)
            ):
                new_rank = rv
            else:
                limit = min(max_visits, budget)
                scanned = _reorder(U, V, succ, pred, rank, limit) if limit > 0 else None
                if scanned is not None and scanned >= 0:
                    counts["exact_checks"] += 1
                    counts["reordered"] += 1
                    budget -= scanned
                    new_rank = rank[U]  # _reorder gave U the merged node's slot
                else:
                    if scanned is None:  # out of budget: skipping is always safe
                        counts["gave_up"] += 1
                        budget -= limit
                    else:
                        counts["exact_checks"] += 1
                        counts["cycles_avoided"] += 1
                        budget += scanned  # scanned < 0: minus the edges scanned
                    skipped.append((u, v, U, V, version[U], version[V]))
                    continue
            # merge the node with fewer neighbours into the other (O(m log n) relinking)
            if len(out_u) + len(pred[U]) < len(succ[V]) + len(in_v):
                U, V = V, U
            _merge(U, V, succ, pred, version)
            proxy.merge(U, V)
            nodes.attach(U, V)
            rank[U] = new_rank
            counts["contracted"] += 1
        pending = skipped
        if not skipped or counts["contracted"] == merged_before:
            break
    if stats is not None:
        stats.update(counts)

    roots = sorted((r for r in range(n) if parent[r] == r), key=rank.__getitem__)
    number = [0] * n
    for i, r in enumerate(roots):
        number[r] = i
    return [number[find(op)] for op in range(n)], len(roots)


def _reorder(
    U: int, V: int, succ: list[set[int]], pred: list[set[int]], rank: list[int], limit: int
) -> int | None:
    """Exact check that U→V is the only path from U to V, and re-rank for contracting it.

    Returns the edges scanned (≥ 0) when the contraction is safe, after permuting the ranks of
    the affected nodes so that they stay topological once U and V are one node (which takes
    U's new rank); minus the edges scanned (< 0) when another path exists; None when ``limit``
    was hit. Ranks are only changed in the first case.
    """
    ru, rv = rank[U], rank[V]
    scanned = len(succ[U]) + len(pred[V])
    if scanned > limit:
        return None
    # descendants of U ranked below V: V among them means a second path
    forward: list[int] = []
    stack = [x for x in succ[U] if x != V and rank[x] < rv]
    seen = set(stack)
    while stack:
        x = stack.pop()
        forward.append(x)
        nexts = succ[x]
        scanned += len(nexts)
        if scanned > limit:
            return None
        if V in nexts:
            return -scanned
        for y in nexts:
            if y not in seen and rank[y] < rv:
                seen.add(y)
                stack.append(y)
    # ancestors of V ranked above U (none of them is a descendant of U: no second path)
    backward: list[int] = []
    stack = [x for x in pred[V] if x != U and rank[x] > ru]
    seen = set(stack)
    while stack:
        x = stack.pop()
        backward.append(x)
        prevs = pred[x]
        scanned += len(prevs)
        if scanned > limit:
            return None
        for y in prevs:
            if y not in seen and rank[y] > ru:
                seen.add(y)
                stack.append(y)
    by_rank = rank.__getitem__
    backward.sort(key=by_rank)
    forward.sort(key=by_rank)
    slots = sorted([ru, rv, *map(by_rank, backward), *map(by_rank, forward)])
    i = 0
    for x in backward:
        rank[x] = slots[i]
        i += 1
    rank[U] = slots[i]
    i += 1
    for x in forward:
        rank[x] = slots[i]
        i += 1
    return scanned


def _merge(
    a: int, b: int, succ: list[set[int]], pred: list[set[int]], version: list[int]
) -> None:
    """Fold node ``b`` into node ``a`` in the adjacency sets, dropping the a–b edges."""
    succ_a, pred_a = succ[a], pred[a]
    for s in succ[b]:
        ps = pred[s]
        ps.discard(b)
        version[s] += 1
        if s != a:
            ps.add(a)
            succ_a.add(s)
    for p in pred[b]:
        sp = succ[p]
        sp.discard(b)
        version[p] += 1
        if p != a:
            sp.add(a)
            pred_a.add(p)
    succ_a.discard(b)
    pred_a.discard(b)
    version[a] += 1
    succ[b] = set()
    pred[b] = set()


# ---------------------------------------------------------------------------- contraction


def contract(
    graph: Graph, cluster: Cluster, units: Units, node_of: list[int], count: int
) -> Fusion:
    """Build the reduced graph of a partition whose quotient is acyclic.

    Node ``i`` is named after its first op in canonical order. Compute and persistent bytes are
    summed. ``output_bytes`` is the sum of the outputs of members that send data out of the
    node (held as long as the node's consumers need them); ``temp_bytes`` is the peak of what
    the node holds internally while its members run in canonical order: each member's temp plus
    the outputs consumed only inside the node that are still alive (so fusion never hides a
    large intermediate tensor: on its own the node's modelled memory bounds its real peak). A
    node of one op keeps the op's figures. Each original edge between two nodes stays an edge
    with tensor ``"<src op index>:<tensor>"`` (plus ``":<bytes>"`` when one tensor is sent
    with different sizes), so per-tensor transfer caching matches the original graph; control
    edges are kept once per node pair; edges inside a node are dropped. Units: a node's unit is
    its ops' unit; the reduced graph's colocation groups and pins say the same.

    Examples
    --------
    >>> from baechi.graph import load_graph
    >>> from baechi.grouping import Units
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
    ...     {"name": "a", "compute_us": 1, "output_bytes": 8, "temp_bytes": 2},
    ...     {"name": "b", "compute_us": 2, "output_bytes": 4, "temp_bytes": 1},
    ...     {"name": "c", "compute_us": 3}],
    ...     "edges": [{"src": "a", "dst": "b", "bytes": 8}, {"src": "b", "dst": "c", "bytes": 4}]})
    >>> f = contract(g, Cluster.uniform(2), Units([0, 0, 1], [[0, 1], [2]], [-1, -1]), [0, 0, 1], 2)
    >>> f.graph.names, f.graph.compute_us, f.graph.output_bytes, f.graph.temp_bytes
    (['a', 'c'], [3.0, 3.0], [4, 0], [10, 0])
    >>> f.graph.edge_tensor, f.members
    (['1:b'], [[0, 1], [2]])
    """
    n = len(graph)
    members: list[list[int]] = [[] for _ in range(count)]
    slot = [0] * n  # position of an op within its node
    for op in graph.topo:
        ms = members[node_of[op]]
        slot[op] = len(ms)
        ms.append(op)

    # which members send data out, the last member that consumes an internal output, and
    # the edges between nodes with their tensor names
    edge_src, edge_dst = graph.edge_src, graph.edge_dst
    edge_bytes, edge_tensor, edge_control = graph.edge_bytes, graph.edge_tensor, graph.edge_control
    leaves = [False] * n
    last_use = slot[:]  # an output with no consumer inside is freed when its op ends
    cross: list[int] = []
    cross_tensor: list[str] = []
    sizes: dict[str, int] = {}  # bytes per "<src op>:<tensor>", -1 when they differ
    for k, (a, b) in enumerate(zip(edge_src, edge_dst, strict=True)):
        if node_of[a] == node_of[b]:
            if not edge_control[k] and slot[b] > last_use[a]:
                last_use[a] = slot[b]
            continue
        tensor = f"{a}:{edge_tensor[k]}"
        cross.append(k)
        cross_tensor.append(tensor)
        if not edge_control[k]:
            leaves[a] = True
            if sizes.setdefault(tensor, edge_bytes[k]) != edge_bytes[k]:
                sizes[tensor] = -1

    names, types, compute, output, temp, persistent = [], [], [], [], [], []
    g_names, g_types, g_compute = graph.names, graph.types, graph.compute_us
    g_out, g_temp, g_pers = graph.output_bytes, graph.temp_bytes, graph.persistent_bytes
    for ms in members:
        first = ms[0]
        names.append(g_names[first])
        if len(ms) == 1:
            types.append(g_types[first])
            compute.append(g_compute[first])
            output.append(g_out[first])
            temp.append(g_temp[first])
            persistent.append(g_pers[first])
            continue
        types.append("fused")
        compute.append(sum(g_compute[op] for op in ms))
        persistent.append(sum(g_pers[op] for op in ms))
        out_total, live, peak = 0, 0, 0
        expire: dict[int, int] = {}  # member slot → internal output bytes freed after it
        for i, op in enumerate(ms):
            own = 0
            if leaves[op]:
                out_total += g_out[op]
            else:
                own = g_out[op]
                expire[last_use[op]] = expire.get(last_use[op], 0) + own
            held = live + g_temp[op] + own
            if held > peak:
                peak = held
            live += own - expire.pop(i, 0)
        output.append(out_total)
        temp.append(peak)

    # units of the nodes, numbered by first node, and what the reduced graph says of them
    unit_new: dict[int, int] = {}
    node_unit = [0] * count
    unit_members: list[list[int]] = []
    unit_pin: list[int] = []
    for node, ms in enumerate(members):
        old = units.unit_of[ms[0]]
        new = unit_new.get(old)
        if new is None:
            new = unit_new[old] = len(unit_members)
            unit_members.append([])
            unit_pin.append(units.pin[old])
        node_unit[node] = new
        unit_members[new].append(node)
    device_names = [d.name for d in cluster.devices]
    group = [f"unit:{node_unit[i]}" if len(unit_members[node_unit[i]]) > 1 else None
             for i in range(count)]
    pin = [device_names[unit_pin[node_unit[i]]] if unit_pin[node_unit[i]] >= 0 else None
           for i in range(count)]

    by_kind = None
    if graph.compute_us_by_kind is not None:
        by_kind = [_fused_times([graph.compute_us_by_kind[op] for op in ms]) for ms in members]
    measured = graph.edge_transfer_us
    e_transfer: list[float | None] = []
    e_src, e_dst, e_bytes, e_tensor, e_control = [], [], [], [], []
    seen: set[tuple[int, ...] | tuple[int, int, str]] = set()
    for k, tensor in zip(cross, cross_tensor, strict=True):
        na, nb = node_of[edge_src[k]], node_of[edge_dst[k]]
        control = edge_control[k]
        if control:
            # one control message per node pair: the nodes' ops run back to back anyway
            key: tuple[int, ...] | tuple[int, int, str] = (na, nb)
        else:
            if sizes[tensor] < 0:
                tensor = f"{tensor}:{edge_bytes[k]}"
            key = (na, nb, tensor)  # the same tensor to two ops of one node: one transfer
        if key in seen:
            continue
        seen.add(key)
        e_src.append(na)
        e_dst.append(nb)
        e_bytes.append(edge_bytes[k])
        e_tensor.append(tensor)
        e_control.append(control)
        e_transfer.append(None if measured is None else measured[k])

    reduced = Graph(
        name=graph.name, meta={"reduced_from": graph.sha256, "ops": n}, names=names,
        types=types, compute_us=compute, output_bytes=output, temp_bytes=temp,
        persistent_bytes=persistent, colocation_group=group, pin=pin,
        forward_op=[-1] * len(names), edge_src=e_src, edge_dst=e_dst, edge_bytes=e_bytes,
        edge_tensor=e_tensor, edge_control=e_control, compute_us_by_kind=by_kind,
        edge_transfer_us=None if measured is None else e_transfer,
    )
    return Fusion(reduced, Units(node_unit, unit_members, unit_pin), node_of, members)


def _fused_times(members: list[dict[str, float | None]]) -> dict[str, float | None]:
    """A node's ``compute_us_by_kind``: per kind the sum of its members' times, null when one
    of them is null (fusion only joins ops timed on the same kinds)."""
    if len(members) == 1:
        return members[0]
    out: dict[str, float | None] = {}
    for times in members:
        for kind, us in times.items():
            if us is None or out.get(kind, 0.0) is None:
                out[kind] = None
            else:
                out[kind] = out.get(kind, 0.0) + us  # type: ignore[operator]
    return out


def fuse(
    graph: Graph, cluster: Cluster, units: Units, max_visits: int = MAX_VISITS,
    cap: float = math.inf,
) -> Fusion:
    """Fuse each unit's ops into as few nodes as acyclicity allows (:func:`fusion_partition`).

    ``cap`` bounds each node's memory proxy (the pipeline passes
    :func:`~baechi.grouping.merge_cap`); ``Fusion.stats`` holds the partition's counters.

    Examples
    --------
    >>> from baechi.graph import load_graph
    >>> from baechi.grouping import colocation_units
    >>> g = load_graph({"format": "baechi.graph/v1", "ops": [
    ...     {"name": "w", "compute_us": 1, "colocation_group": "v"},
    ...     {"name": "x", "compute_us": 5},
    ...     {"name": "r", "compute_us": 2, "colocation_group": "v"}],
    ...     "edges": [{"src": "w", "dst": "r", "bytes": 4}, {"src": "x", "dst": "r", "bytes": 4}]})
    >>> c = Cluster.uniform(2)
    >>> f = fuse(g, c, colocation_units(g, c))
    >>> f.graph.names, f.members, f.units.members
    (['x', 'w'], [[1], [0, 2]], [[0], [1]])
    """
    stats: dict[str, int] = {}
    node_of, count = fusion_partition(graph, units.unit_of, max_visits, stats, cap=cap,
                                      kinds=frozenset(d.kind for d in cluster.devices))
    fusion = contract(graph, cluster, units, node_of, count)
    fusion.stats = stats
    return fusion
