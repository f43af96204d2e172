"""The ``baechi`` command: place, simulate and report in-process; more verbs from plugins.

Exit status: 0 success, 2 invalid input, 3 infeasible placement, 1 anything else.
Errors go to stderr as one line, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from baechi._version import __version__
from baechi.algorithms import ALGORITHM_NAMES, DEFAULT_ALGORITHM
from baechi.api import place
from baechi.auto import NO_FIT
from baechi.cluster import Cluster
from baechi.defaults import DEFAULT_TIME_LIMIT_S, DEFAULT_TRANSFER_ORDER
from baechi.errors import InvalidCluster, MissingExtra, PlacementError
from baechi.graph import load_graph
from baechi.plan import Candidate, Estimate, Plan
from baechi.progress import ProgressBar
from baechi.simulate import simulate_plan
from baechi.throughput import OBJECTIVES

#: Entry-point group of the modules that add verbs (``register(subparsers)``, pyproject.toml).
PLUGIN_GROUP = "baechi.cli"

#: Third-party modules each optional extra installs: a verb that needs them says which extra.
EXTRAS = {
    "server": ("fastapi", "uvicorn", "rq", "redis", "pydantic_settings", "prometheus_client"),
    "tf": ("tensorflow",),
    "report": ("plotly",),
}


def require_extra(extra: str, verb: str) -> None:
    """Raise :class:`~baechi.errors.MissingExtra` when a module of ``extra`` is missing.

    Examples
    --------
    >>> require_extra("report", "report")  # installed here: nothing happens
    """
    missing = [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingExtra(
            f"baechi {verb} needs the {extra!r} extra ({', '.join(missing)} not installed): "
            f"pip install 'baechi[{extra}]'", {"extra": extra, "missing": missing})


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """``--devices/--memory`` or ``--cluster``, plus the network flags."""
    group = parser.add_argument_group("cluster")
    group.add_argument("--cluster", metavar="FILE", help="cluster JSON (docs/format.md §3)")
    group.add_argument("--devices", type=int, default=None, help="number of devices (4)")
    group.add_argument("--memory", default=None, help="memory per device, e.g. 8GiB")
    group.add_argument("--latency-us", type=float, default=None, help="link latency (µs)")
    group.add_argument("--bandwidth-gbps", type=float, default=None, help="link GB/s")
    group.add_argument("--comm", choices=("sequential", "parallel"), default=None,
                       help="communication mode (sequential)")


def cluster_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The cluster JSON from :func:`add_cluster_arguments`' flags."""
    if args.cluster:
        if args.devices is not None or args.memory is not None:
            raise InvalidCluster("give either --cluster or --devices/--memory, not both")
        data = _read_json(args.cluster, "cluster")
        if not isinstance(data, dict):
            raise InvalidCluster(f"{args.cluster}: expected a JSON object")
    else:
        devices: dict[str, Any] = {"count": args.devices if args.devices is not None else 4}
        if args.memory is not None:
            devices["memory_bytes"] = args.memory
        data = {"devices": devices}
    network = dict(data.get("network") or {})
    for flag, key in (("latency_us", "latency_us"), ("bandwidth_gbps", "bandwidth_gbps"),
                      ("comm", "mode")):
        if getattr(args, flag) is not None:
            network[key] = getattr(args, flag)
    if network:
        data["network"] = network
    Cluster.parse(data)  # fail early, naming the field
    return data


def _read_json(path: str, what: str) -> Any:
    try:
        return orjson.loads(Path(path).read_bytes())
    except OSError as exc:
        raise InvalidCluster(f"{path}: cannot read {what} file: {exc.strerror}") from None
    except orjson.JSONDecodeError as exc:
        raise InvalidCluster(f"{path}: {what} is not valid JSON: {exc}") from None


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if args.no_pipeline:
        options.update(co_placement=False, fusion=False)
    if args.no_fusion:
        options["fusion"] = False
    if args.no_co_placement:
        options["co_placement"] = False
    if args.no_forward_only:
        options["forward_only"] = False
    if args.no_single:
        options["allow_single"] = False
    if args.portfolio:
        options["portfolio"] = True
    if args.time_limit is not None:
        options["time_limit_s"] = args.time_limit
    if args.transfer_order is not None:
        options["transfer_order"] = args.transfer_order
    return options


def _bytes(n: float | None) -> str:
    if n is None or math.isinf(n):
        return "unlimited"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _ms(us: float) -> str:
    return f"{us / 1000:.3f} ms"


#: The summary notes an op holding more than this share of the graph's compute.
LARGEST_OP_SHARE = 0.3


def summary(plan: Plan, estimate: Estimate, cluster: Cluster) -> str:
    """The human-readable summary printed by ``place`` and ``simulate``."""
    e = estimate
    speedup = e.single_device_us / e.step_time_us if e.step_time_us > 0 else 1.0
    net = cluster.network
    bandwidth = "∞" if math.isinf(net.bandwidth_gbps) else f"{net.bandwidth_gbps:g}"
    lines = [
        f"graph          {plan.graph.name or '(unnamed)'}: {len(plan.placement)} ops",
        f"algorithm      {plan.request.algorithm} on {len(cluster.devices)} devices "
        f"({net.latency_us:g} µs, {bandwidth} GB/s, {net.mode})",
    ]
    stats = plan.stats
    if stats.nodes:
        lines.append("reduction      " + " -> ".join(
            f"{n.nodes} ({n.phase})" if n.units == n.nodes
            else f"{n.nodes} nodes in {n.units} units ({n.phase})" for n in stats.nodes))
    if stats.chose_single and stats.algorithm_step_time_us is not None:
        lines.append(
            f"note           single device is faster than {plan.request.algorithm}'s plan "
            f"({_ms(stats.algorithm_step_time_us)}): returning it"
        )
    if stats.portfolio_choice and stats.portfolio_step_times_us:
        lines.append("portfolio      " + ", ".join(
            f"{k} {_ms(v)}" for k, v in stats.portfolio_step_times_us.items())
            + f": kept the {stats.portfolio_choice} plan")
    if stats.fallback:
        lines.append(f"note           {stats.fallback}")
    if stats.largest_op and stats.largest_op["share"] > LARGEST_OP_SHARE:
        lines.append(f"note           op {stats.largest_op['name']!r} holds "
                     f"{stats.largest_op['share']:.0%} of the compute: no plan beats its time; "
                     "profile the model finer to split it")
    if stats.candidates:
        # one per line: the notes tell reruns apart (repairs, local search restarts,
        # exact's rounds and its long last solve)
        lines += [f"{'candidates' if i == 0 else '':<15}{_candidate(c)}"
                  for i, c in enumerate(stats.candidates)]
    if stats.chosen is not None:
        chosen = stats.chosen
        lines.append(f"chosen         {_name(chosen.algorithm, chosen.pipeline)}"
                     + (", then local search" if chosen.local_search else ""))
    if stats.deadline_reached:
        lines.append("note           the time limit was reached: this is the best plan found "
                     "by then")
    if plan.transfer_order is not None and cluster.network.mode == "sequential":
        fifo = stats.fifo_step_time_us
        lines.append("transfer order model-aware (the plan's transfer_order)"
                     + ("" if fifo is None else f"; FIFO would take {_ms(fifo)}")
                     + (f"; {stats.transfer_order_note}" if stats.transfer_order_note else ""))
    elif stats.transfer_order == "fifo":
        lines.append("transfer order FIFO (first come, first served)"
                     + (f"; {stats.transfer_order_note}" if stats.transfer_order_note else ""))
    lines += [
        f"step time      {_ms(e.step_time_us)}  (lower bound {_ms(e.lower_bound_us)}, "
        f"ratio {e.step_time_us / e.lower_bound_us if e.lower_bound_us else 1:.3f})",
        f"single device  {_ms(e.single_device_us)}  "
        f"(fits: {'yes' if e.single_device_fits else 'no'})  speedup {speedup:.3f}x",
        "peak memory",
    ]
    if e.time_per_sample_us is not None:  # the throughput objective (docs/format.md §10)
        optimal = plan.stats.optimal
        proof = "" if optimal is None else "  (proved optimal)" if optimal else \
            f"  (best found; bound {_ms(plan.stats.bound_us or 0.0)})"
        if not optimal and getattr(plan.stats, "contiguous_optimal", False):
            proof += "; optimal among contiguous splits"
        loads = ", ".join(f"{name} {_ms(us)}" for name, us in (e.device_load_us or {}).items())
        lines[-3:-3] = [f"time/sample    {_ms(e.time_per_sample_us)}{proof}",
                        f"device loads   {loads}"]
    for device in cluster.devices:
        peak = e.peak_memory_bytes.get(device.name, 0)
        over = device.memory_bytes is not None and peak > device.memory_bytes
        lines.append(f"  {device.name:<12} {_bytes(peak):>12} / {_bytes(device.memory_bytes)}"
                     + ("  OVER LIMIT" if over else ""))
    lines.append(f"transfers      {e.transfers} ({_bytes(e.transfer_bytes)})")
    if plan.stats.placement_seconds:
        lines.append(f"placement      {plan.stats.placement_seconds:.3f} s")
    return "\n".join(lines)


def _name(algorithm: str, pipeline: bool) -> str:
    """``m-etf/unreduced`` for a candidate placed without the pipeline."""
    if algorithm in ("single", "local-search") or pipeline:
        return algorithm
    return f"{algorithm}/unreduced"


def _candidate(entry: Candidate) -> str:
    """``local-search 115.705 ms: from m-fill's plan`` for one entry of an ``auto`` plan's
    candidates (``m-topo (no fit)``: no plan within memory).

    Examples
    --------
    >>> _candidate(Candidate(algorithm="m-etf", pipeline=False, step_time_us=139101.0))
    'm-etf/unreduced 139.101 ms'
    >>> _candidate(Candidate(algorithm="exact", pipeline=False, step_time_us=1e5,
    ...                      note="again, from the best plan"))
    'exact/unreduced 100.000 ms: again, from the best plan'
    >>> _candidate(Candidate(algorithm="m-topo", pipeline=True, step_time_us=None,
    ...                      note="no plan within memory"))
    'm-topo (no fit)'
    """
    name = _name(entry.algorithm, entry.pipeline)
    shown = f"{name} (no fit)" if entry.step_time_us is None else \
        f"{name} {_ms(entry.step_time_us)}"
    note = "; ".join(part for part in entry.note.split("; ") if part != NO_FIT)
    return f"{shown}: {note}" if note else shown


def _write_plan(plan: Plan, path: str) -> None:
    data = orjson.dumps(plan.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(data)
    partial.replace(target)  # never leave a half-written plan behind


def cmd_place(args: argparse.Namespace) -> int:
    cluster_json = cluster_from_args(args)
    graph = load_graph(args.graph)
    options = _options(args)
    bar = ProgressBar(enabled=not args.quiet)
    limit_s = options.get("time_limit_s", DEFAULT_TIME_LIMIT_S)
    started = time.monotonic()

    def progress(phase: str, _fraction: float) -> None:
        # anytime algorithms run until their deadline: the bar is the time spent of it
        spent = time.monotonic() - started
        bar.update("placing", phase, spent / limit_s, left_s=limit_s - spent)

    try:
        plan = place(graph, cluster_json, args.algorithm, options, progress=progress,
                     objective=args.objective)
    finally:
        bar.close()
    assert plan.estimate is not None
    print(summary(plan, plan.estimate, Cluster.parse(cluster_json)))
    if args.output:
        _write_plan(plan, args.output)
        print(f"plan written to {args.output}")
    if args.report:
        from baechi.report import write_report

        write_report(graph, plan, args.report)
        print(f"report written to {args.report}")
    return 0


def _load_plan(path: str) -> Plan:
    from baechi.errors import InvalidPlan

    try:
        data = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise InvalidPlan(f"{path}: cannot read plan: {exc}") from None
    return Plan.parse(data)


def cmd_simulate(args: argparse.Namespace) -> int:
    graph = load_graph(args.graph)
    plan = _load_plan(args.plan)
    cluster_json = _read_json(args.cluster, "cluster") if args.cluster else plan.request.cluster
    cluster = Cluster.parse(cluster_json)
    simulation = simulate_plan(graph, plan, cluster)
    print(summary(plan, simulation.estimate, cluster))
    if args.json:
        print(json.dumps(simulation.estimate.model_dump(), indent=2))
    return 0 if simulation.estimate.memory_ok else 3


def cmd_report(args: argparse.Namespace) -> int:
    from baechi.report import write_report

    graph = load_graph(args.graph)
    plan = _load_plan(args.plan)
    cluster = _read_json(args.cluster, "cluster") if args.cluster else None
    write_report(graph, plan, args.output, cluster)
    print(f"report written to {args.output}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="baechi", description="Place ML training graphs on memory-limited devices."
    )
    parser.add_argument("--version", action="version", version=f"baechi {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = verbs.add_parser("place", help="place a graph in-process and print the summary")
    p.add_argument("graph", help="baechi.graph/v1 JSON file")
    add_cluster_arguments(p)
    p.add_argument("--algorithm", "-a", default=DEFAULT_ALGORITHM,
                   choices=ALGORITHM_NAMES)
    p.add_argument("--objective", default="step_time", choices=OBJECTIVES,
                   help="minimise one step's time (default) or the time per sample of a "
                        "pipeline (throughput)")
    p.add_argument("-o", "--output", metavar="PLAN", help="write the plan JSON here")
    p.add_argument("--report", metavar="HTML", help="write the HTML report here")
    p.add_argument("--no-pipeline", action="store_true", help="place the raw graph")
    p.add_argument("--no-fusion", action="store_true")
    p.add_argument("--no-co-placement", action="store_true")
    p.add_argument("--no-forward-only", action="store_true")
    p.add_argument("--no-single", action="store_true",
                   help="never fall back to the single-device plan")
    p.add_argument("--portfolio", action="store_true",
                   help="also place the unreduced graph and with m-fill; keep the fastest plan")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="deadline of the whole request in seconds (default "
                        f"{DEFAULT_TIME_LIMIT_S:g}); auto returns its best plan by then")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bar (it shows only on a terminal anyway)")
    p.add_argument("--transfer-order", choices=("fifo", "model-aware"), default=None,
                   help="order of each channel's transfers (sequential mode): model-aware "
                        "keeps the order by the consumers' urgency when it is faster (default "
                        f"{DEFAULT_TRANSFER_ORDER}); fifo books first come, first served")
    p.set_defaults(func=cmd_place)

    s = verbs.add_parser("simulate", help="replay a plan (with its transfer_order, if any) and "
                                          "print its summary")
    s.add_argument("graph")
    s.add_argument("plan")
    s.add_argument("--cluster", metavar="FILE", help="replay on this cluster instead")
    s.add_argument("--json", action="store_true", help="also print the estimate as JSON")
    s.set_defaults(func=cmd_simulate)

    r = verbs.add_parser("report", help="write the HTML report of a plan")
    r.add_argument("graph")
    r.add_argument("plan")
    r.add_argument("-o", "--output", required=True, metavar="HTML")
    r.add_argument("--cluster", metavar="FILE")
    r.set_defaults(func=cmd_report)

    for plugin in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        try:
            register = plugin.load()
        except Exception as exc:  # a broken plugin must not take the other verbs with it
            print(f"baechi: warning: the verbs of plugin {plugin.name!r} ({plugin.value}) "
                  f"could not be loaded: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        register(verbs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except PlacementError as exc:
        print(f"baechi: error: {exc.message}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("baechi: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
