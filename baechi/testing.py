"""Small graphs with communication whose optima can be proved, and a brute force to check them.

The generators are pure functions of a seed: the same arguments give the same document. Times
are whole microseconds and the cluster's network costs one µs per byte with no latency
(``bandwidth_gbps`` 0.001), so every op and transfer time is an integer and ``exact`` needs no
rounding. CCR (communication to computation ratio) is the mean transfer time of an edge over
the mean compute time of an op.

Shapes (10–40 ops is the intended range):

- :func:`layered`: layers of random width, each op fed by one to three ops of the layer
  before (and sometimes of the one before that);
- :func:`fork_join`: stages of a fork, parallel branches (chains of one to three ops) and a
  join;
- :func:`skip_connections`: a ResNet-like chain whose ops also feed ops two or three steps
  ahead, with side ops hanging off the chain.

:func:`small_cases` lists a benchmark set (every shape × CCR × device count), and
:func:`brute_force` finds the best step time of any plan on a tiny graph by enumerating
every placement and every consistent order, replayed by the simulator.

Examples
--------
>>> from baechi import load_graph
>>> doc = fork_join(seed=1, ops=12, ccr=1.0)
>>> g = load_graph(doc)
>>> len(g), doc == fork_join(seed=1, ops=12, ccr=1.0)
(12, True)
>>> small_cluster(2)["network"]
{'latency_us': 0, 'bandwidth_gbps': 0.001, 'mode': 'parallel'}
"""

from __future__ import annotations

import copy
import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from baechi.cluster import Cluster
from baechi.graph import Graph, load_graph
from baechi.grouping import Units
from baechi.simulate import replay, single_device_run

#: The memory each device gets in :func:`small_cases` with ``memory=True``: this share of the
#: single-device peak (the benchmarks' middle level, ``bench/run.py``).
MEMORY_FRACTION = 0.5

#: Device counts of the memory-limited cases (at half the peak, two devices would have to
#: split every byte evenly: most such cases have no plan).
MEMORY_DEVICE_COUNTS = (3, 4)

#: Shapes :func:`small_cases` draws from.
SHAPES = ("layered", "fork_join", "skip_connections")

#: CCRs :func:`small_cases` draws from.
CCRS = (0.1, 0.5, 1.0, 3.0, 10.0)

#: Device counts :func:`small_cases` draws from.
DEVICE_COUNTS = (2, 3, 4)

#: Compute times are drawn from this range (µs, whole).
COMPUTE_US = (1, 20)


def small_cluster(devices: int, mode: str = "parallel",
                  memory_bytes: int | None = None) -> dict[str, Any]:
    """A cluster document of ``devices`` identical devices whose links cost 1 µs per byte.

    ``mode`` ``"parallel"`` (the default) is where ``exact``'s model is the simulator's.
    """
    return {"devices": {"count": devices, "memory_bytes": memory_bytes},
            "network": {"latency_us": 0, "bandwidth_gbps": 0.001, "mode": mode}}


def layered(seed: int, ops: int, ccr: float) -> dict[str, Any]:
    """A layered graph of ``ops`` ops (layers 1–4 wide), each op fed by 1–3 ops of the
    previous layer and now and then by one of the layer before that."""
    rng = random.Random(f"layered/{seed}/{ops}/{float(ccr)}")
    layers: list[list[int]] = []
    left = ops
    while left:
        width = min(left, rng.randint(1, 4))
        first = ops - left
        layers.append(list(range(first, first + width)))
        left -= width
    edges: list[tuple[int, int]] = []
    for i, layer in enumerate(layers[1:], start=1):
        for v in layer:
            for u in rng.sample(layers[i - 1], rng.randint(1, min(3, len(layers[i - 1])))):
                edges.append((u, v))
            if i >= 2 and rng.random() < 0.2:
                edges.append((rng.choice(layers[i - 2]), v))
    return _document(f"layered_s{seed}_n{ops}_ccr{ccr:g}", rng, ops, edges, ccr)


def fork_join(seed: int, ops: int, ccr: float) -> dict[str, Any]:
    """Stages of fork → 2–4 parallel branches (chains of 1–3 ops) → join, ``ops`` ops in all
    (the last stage is cut short to fit)."""
    rng = random.Random(f"fork_join/{seed}/{ops}/{float(ccr)}")
    edges: list[tuple[int, int]] = []
    count = 1  # op 0 is the first fork
    fork = 0
    while count < ops:
        tails = []
        for _ in range(rng.randint(2, 4)):
            prev = fork
            for _ in range(rng.randint(1, 3)):
                if count >= ops - 1:
                    break
                edges.append((prev, count))
                prev, count = count, count + 1
            if prev != fork:
                tails.append(prev)
        join = count
        count += 1
        edges.extend((t, join) for t in tails or [fork])
        fork = join
    return _document(f"fork_join_s{seed}_n{ops}_ccr{ccr:g}", rng, ops, edges, ccr)


def skip_connections(seed: int, ops: int, ccr: float) -> dict[str, Any]:
    """A chain of about two thirds of ``ops``, each chain op also feeding the op two or three
    steps ahead (skip connections) now and then; the other ops hang off the chain (a side
    op reads one chain op and feeds a later one)."""
    rng = random.Random(f"skip_connections/{seed}/{ops}/{float(ccr)}")
    chain_len = max(2, (2 * ops) // 3)
    chain = list(range(chain_len))
    edges = [(a, a + 1) for a in chain[:-1]]
    for a in chain:
        for jump in (2, 3):
            if a + jump < chain_len and rng.random() < 0.35:
                edges.append((a, a + jump))
    for side in range(chain_len, ops):
        a = rng.randrange(chain_len - 1)
        b = rng.randrange(a + 1, min(chain_len, a + 4))
        edges.extend([(a, side), (side, b)])
    return _document(f"skip_s{seed}_n{ops}_ccr{ccr:g}", rng, ops, edges, ccr)


GENERATORS = {"layered": layered, "fork_join": fork_join, "skip_connections": skip_connections}


def _document(name: str, rng: random.Random, ops: int, edges: list[tuple[int, int]],
              ccr: float) -> dict[str, Any]:
    """The graph document: whole compute times in :data:`COMPUTE_US`, each edge's bytes (= its
    µs on :func:`small_cluster`'s links) about ``ccr`` × the mean compute time."""
    low, high = COMPUTE_US
    compute = [rng.randint(low, high) for _ in range(ops)]
    mean = sum(compute) / ops
    unique = sorted(set(edges))
    sizes = [max(0, round(ccr * mean * rng.uniform(0.5, 1.5))) for _ in unique]
    return {
        "format": "baechi.graph/v1",
        "name": name,
        "meta": {"source": "baechi.testing", "ccr": ccr},
        "ops": [{"name": f"op{v}", "compute_us": compute[v], "output_bytes": 0}
                for v in range(ops)],
        "edges": [{"src": f"op{a}", "dst": f"op{b}", "bytes": size}
                  for (a, b), size in zip(unique, sizes, strict=True)],
    }


@dataclass(frozen=True)
class SmallCase:
    """One benchmark case: a graph document and a cluster document."""

    name: str
    shape: str
    ccr: float
    devices: int
    graph: dict[str, Any]
    cluster: dict[str, Any]


def with_memory(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with memory: each op's output as large as the largest tensor it sends, and
    weights (persistent bytes) drawn from 0 to 3 × the mean tensor (seeded by the name).

    Examples
    --------
    >>> doc = with_memory(fork_join(seed=1, ops=12, ccr=1.0))
    >>> doc == with_memory(fork_join(seed=1, ops=12, ccr=1.0))
    True
    >>> all(op["output_bytes"] >= 0 and op["persistent_bytes"] >= 0 for op in doc["ops"])
    True
    """
    rng = random.Random(f"memory/{doc['name']}")
    sent: dict[str, int] = {}
    for edge in doc["edges"]:
        sent[edge["src"]] = max(sent.get(edge["src"], 0), edge["bytes"])
    mean = sum(e["bytes"] for e in doc["edges"]) / max(1, len(doc["edges"]))
    ops = [{**op, "output_bytes": sent.get(op["name"], 0),
            "persistent_bytes": rng.randint(0, round(3 * mean))} for op in doc["ops"]]
    return {**doc, "ops": ops, "meta": {**doc["meta"], "memory": "with_memory"}}


def small_cases(seeds: int = 2, ops: tuple[int, ...] = (10, 20, 30, 40),
                mode: str = "parallel", memory: bool = False) -> Iterator[SmallCase]:
    """Every shape × CCR × device count × op count, ``seeds`` graphs each (seeds 0, 1, …).

    With ``memory``, each graph gets memory (:func:`with_memory`) and each device
    :data:`MEMORY_FRACTION` of the graph's single-device peak, on
    :data:`MEMORY_DEVICE_COUNTS` devices.

    Examples
    --------
    >>> len(list(small_cases(seeds=1, ops=(10,))))
    45
    >>> case = next(small_cases(seeds=1, ops=(10,), memory=True))
    >>> case.name, case.cluster["devices"]["memory_bytes"] > 0
    ('layered_s0_n10_ccr0.1_d3_m50', True)
    """
    counts = MEMORY_DEVICE_COUNTS if memory else DEVICE_COUNTS
    for shape, ccr, devices, n, seed in itertools.product(
            SHAPES, CCRS, counts, ops, range(seeds)):
        graph = GENERATORS[shape](seed, n, ccr)
        if not memory:
            yield SmallCase(f"{graph['name']}_d{devices}", shape, ccr, devices, graph,
                            small_cluster(devices, mode))
            continue
        graph = with_memory(graph)
        peak = single_device_run(load_graph(graph), Cluster.uniform(1))[1]
        yield SmallCase(f"{graph['name']}_d{devices}_m{round(MEMORY_FRACTION * 100)}",
                        shape, ccr, devices, graph,
                        small_cluster(devices, mode, int(MEMORY_FRACTION * peak)))


def linear_extensions(graph: Graph) -> Iterator[list[int]]:
    """Every topological order of ``graph`` (exponential: tiny graphs only)."""
    n = len(graph)
    indegree = [len(graph.in_edges[v]) for v in range(n)]
    order: list[int] = []

    def extend() -> Iterator[list[int]]:
        if len(order) == n:
            yield list(order)
            return
        for v in range(n):
            if indegree[v] == 0:
                indegree[v] = -1
                for k in graph.out_edges[v]:
                    indegree[graph.edge_dst[k]] -= 1
                order.append(v)
                yield from extend()
                order.pop()
                for k in graph.out_edges[v]:
                    indegree[graph.edge_dst[k]] += 1
                indegree[v] = 0

    yield from extend()


def brute_force(graph: Graph, cluster: Cluster, units: Units, max_plans: int = 200_000,
                memory: bool = True) -> tuple[float, list[int], list[list[int]]]:
    """The least step time of any plan within memory, by enumeration: every placement of the
    units (on devices their pins allow) × every consistent set of device orders, each replayed
    by the simulator. Returns (step µs, device_of, orders) of a best plan; ``inf`` and empty
    lists when no plan fits. ``memory=False`` ignores the memory limits.

    Channels are booked first come, first served: in sequential mode a plan with its own
    transfer order can be faster (:func:`claim_violations` bounds those from below by the
    same enumeration in parallel mode).

    Every consistent set of device orders is the projection of some topological order of the
    graph (the graph's edges plus the device chains are acyclic, so they have one), so the
    projections of all topological orders are all the plans. Raises ``ValueError`` when the
    enumeration would exceed ``max_plans`` placements × topological orders.
    """
    n_dev = len(cluster.devices)
    choices = [[units.pin[u]] if units.pin[u] >= 0 else list(range(n_dev))
               for u in range(len(units))]
    orders_all = list(itertools.islice(linear_extensions(graph), max_plans + 1))
    placements = math.prod(len(c) for c in choices)
    if placements * len(orders_all) > max_plans:
        raise ValueError(f"brute force: {placements} placements × {len(orders_all)}+ "
                         f"orders exceed {max_plans} plans")
    best: tuple[float, list[int], list[list[int]]] = (math.inf, [], [])
    for unit_devices in itertools.product(*choices):
        device_of = [unit_devices[units.unit_of[v]] for v in range(len(graph))]
        seen: set[tuple[tuple[int, ...], ...]] = set()
        for topo in orders_all:
            orders = tuple(tuple(v for v in topo if device_of[v] == d) for d in range(n_dev))
            if orders in seen:
                continue
            seen.add(orders)
            plan_orders = [list(o) for o in orders]
            estimate = replay(graph, cluster, device_of, plan_orders).estimate
            if (estimate.memory_ok or not memory) and estimate.step_time_us < best[0]:
                best = (estimate.step_time_us, device_of, plan_orders)
    return best


# ------------------------------------------------------------------------ claims
def tiny_request(rng: random.Random) -> tuple[dict[str, Any], dict[str, Any]]:
    """A random tiny request (3–6 ops) with what makes claims hard: a colocation group, a pin,
    forward/backward pairs, output/temp/persistent bytes under a memory limit (sometimes too
    small for any plan), devices of different speeds, sequential or parallel channels.

    Returns ``(graph document, cluster document)``.

    Examples
    --------
    >>> import random
    >>> doc, cluster = tiny_request(random.Random(3))
    >>> 3 <= len(doc["ops"]) <= 6 and 2 <= len(cluster["devices"]) <= 3
    True
    """
    n = rng.randint(3, 6)
    n_dev = rng.randint(2, 3)
    ops: list[dict[str, Any]] = []
    for i in range(n):
        ops.append({"name": f"o{i}", "compute_us": rng.choice([0, 1, 2, 5, 10, 20]),
                    "output_bytes": rng.choice([0, 10, 100]),
                    "temp_bytes": rng.choice([0, 0, 20]),
                    "persistent_bytes": rng.choice([0, 0, 50])})
    grouped = rng.sample(range(n), rng.choice([0, 0, 2]))
    for i in grouped:
        ops[i]["colocation_group"] = "g"
    if rng.random() < 0.4:
        ops[rng.randrange(n)]["device"] = f"/GPU:{rng.randrange(n_dev)}"
        pinned = [op for op in ops if op.get("device")]
        if any(op.get("colocation_group") for op in pinned):
            for op in ops:  # one pin per group: the group takes it
                op.pop("colocation_group", None)
    edges = []
    for j in range(1, n):
        for i in rng.sample(range(j), min(j, rng.choice([1, 1, 2]))):
            edges.append({"src": f"o{i}", "dst": f"o{j}",
                          "bytes": min(ops[i]["output_bytes"], rng.choice([0, 10, 100]))})
    if n >= 4 and rng.random() < 0.5:  # the last op is the backward op of an early one
        ops[-1]["forward_op"] = ops[rng.randrange(n // 2)]["name"]
    total = sum(op["output_bytes"] + op["temp_bytes"] + op["persistent_bytes"] for op in ops)
    memory = rng.choice([None, None, max(1, total // 2), max(1, total // 4)])
    speeds = rng.choice([[1.0] * n_dev, [2.0] + [1.0] * (n_dev - 1)])
    cluster = {"devices": [{"name": f"/GPU:{d}", "memory_bytes": memory, "speed": speeds[d]}
                           for d in range(n_dev)],
               "network": {"latency_us": rng.choice([0, 1, 3]), "bandwidth_gbps": 0.01,
                           "mode": rng.choice(["parallel", "sequential"])}}
    return {"format": "baechi.graph/v1", "name": "tiny", "ops": ops, "edges": edges}, cluster


def claim_violations(doc: dict[str, Any], cluster_doc: dict[str, Any], plan: Any,
                     objective: str = "step_time") -> list[str]:
    """What is false in ``plan``'s claims for the request ``(doc, cluster_doc)``, by brute
    force over every valid plan (an empty list: every claim holds).

    Checked: the plan keeps every unit and pin, fits memory and replays to its estimate;
    it is no faster than the best valid plan; ``bound_us`` (and the estimate's
    ``lower_bound_us``) is no more than the best; ``optimal`` only where the plan is the best.
    Under the throughput objective the same against the best time per sample of
    :func:`baechi.throughput.throughput` over every placement of the units.

    In sequential mode the enumeration books channels first come, first served, and a plan
    with its own transfer order may beat every such plan: the plan is then checked against
    the same enumeration without channels (parallel mode, a floor of every plan), and
    ``bound_us`` and ``optimal`` against the best FIFO plan (a claim above it is caught, one
    between the true optimum and it is not).
    """
    from baechi.grouping import colocation_units
    from baechi.plan import Plan
    from baechi.simulate import simulate
    from baechi.throughput import throughput

    graph, cluster = load_graph(doc), Cluster.parse(cluster_doc)
    plan = Plan.parse(plan)
    units = colocation_units(graph, cluster, bool(plan.request.options.get("forward_only",
                                                                            True)))
    names = [d.name for d in cluster.devices]
    device_of = [names.index(plan.placement[name]) for name in graph.names]
    problems = []
    for u, members in enumerate(units.members):
        if len({device_of[op] for op in members}) > 1:
            problems.append(f"unit {u} ({[graph.names[op] for op in members]}) is split")
        if units.pin[u] >= 0 and device_of[members[0]] != units.pin[u]:
            problems.append(f"unit {u} is not on its pin")
    stats = plan.stats
    tolerance = 1e-9
    if objective == "throughput":
        achieved = throughput(graph, cluster, device_of).time_per_sample_us
        best = math.inf
        n_dev = len(names)
        choices = [[units.pin[u]] if units.pin[u] >= 0 else list(range(n_dev))
                   for u in range(len(units))]
        apart = not plan.request.options.get("allow_single", True) and len(units) > 1
        for unit_devices in itertools.product(*choices):
            if apart and len(set(unit_devices)) == 1:
                continue  # allow_single off: no plan puts every unit on one device
            verdict = throughput(graph, cluster,
                                 [unit_devices[units.unit_of[v]] for v in range(len(graph))])
            if verdict.memory_ok and verdict.time_per_sample_us < best:
                best = verdict.time_per_sample_us
        floor = best
    else:
        estimate = simulate(graph, plan.model_dump(mode="json"))
        if estimate != plan.estimate:
            problems.append("the estimate is not the plan's replay")
        if not estimate.memory_ok:
            problems.append("the plan exceeds memory")
        achieved = estimate.step_time_us
        best = floor = brute_force(graph, cluster, units)[0]
        if cluster.network.mode == "sequential":
            # a transfer order can beat every FIFO plan, never the same plan without channels
            relaxed = copy.deepcopy(cluster_doc)
            relaxed.setdefault("network", {})["mode"] = "parallel"
            floor = brute_force(graph, Cluster.parse(relaxed), units, memory=False)[0]
        if estimate.lower_bound_us > best * (1 + tolerance) + tolerance:
            problems.append(f"lower_bound_us {estimate.lower_bound_us} > best {best}")
    if achieved < floor * (1 - tolerance) - tolerance:
        problems.append(f"the plan ({achieved}) beats the brute force ({floor})")
    bound = getattr(stats, "bound_us", None)
    if bound is not None and bound > best * (1 + tolerance) + tolerance:
        problems.append(f"bound_us {bound} > best {best}")
    if getattr(stats, "optimal", None) and achieved > best * (1 + tolerance) + tolerance:
        problems.append(f"optimal claimed at {achieved}, best is {best}")
    return problems


__all__ = [
    "CCRS",
    "DEVICE_COUNTS",
    "GENERATORS",
    "MEMORY_DEVICE_COUNTS",
    "MEMORY_FRACTION",
    "SHAPES",
    "SmallCase",
    "brute_force",
    "claim_violations",
    "fork_join",
    "layered",
    "linear_extensions",
    "skip_connections",
    "small_cases",
    "small_cluster",
    "tiny_request",
    "with_memory",
]
