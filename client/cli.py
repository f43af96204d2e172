"""Client verbs of the ``baechi`` command: ``submit``, ``status``, ``fetch``, ``cancel``,
``profile``, ``measure``.

``baechi.cli`` calls :func:`register` with its sub-parsers. Nothing heavy is imported here: the
HTTP client loads when a service verb runs, TensorFlow when ``profile`` or ``measure`` runs.
Errors print one line on stderr; the exit status is 2 for bad input, 1 for a service or job
failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from baechi.defaults import DEFAULT_ALGORITHM

#: ``baechi measure`` is interactive: a plan in seconds rather than the service's 60 s.
MEASURE_TIME_LIMIT_S = 10.0

#: Environment variables for the defaults of ``--server`` and ``--api-key``.
URL_ENV = "BAECHI_URL"
KEY_ENV = "BAECHI_API_KEY"


def register(subparsers: Any) -> None:
    """Add the client verbs to ``baechi``'s sub-parsers."""
    from baechi.algorithms import DEFAULT_ALGORITHM as algorithm
    from baechi.cli import add_cluster_arguments

    p = subparsers.add_parser(
        "submit", help="submit a graph to a Baechi service",
        description="Submit a graph for placement. Prints the placement id; with --wait "
                    "(or -o), waits for the plan.",
    )
    p.add_argument("graph", help="baechi.graph/v1 JSON file, or a graph id from an upload")
    _add_server_arguments(p)
    add_cluster_arguments(p)
    p.add_argument("--algorithm", "-a", default=algorithm,
                   help=f"placement algorithm (default {algorithm})")
    p.add_argument("--options", metavar="JSON", default=None,
                   help='pipeline options as a JSON object, e.g. \'{"fusion": false}\'')
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="solver time limit in seconds")
    p.add_argument("--objective", choices=("step_time", "throughput"), default=None,
                   help="minimise one step's time (the service's default) or the time per "
                        "sample of a pipeline (throughput)")
    p.add_argument("--wait", action="store_true", help="wait for the plan")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="with --wait: give up waiting after S seconds")
    p.add_argument("-o", "--output", metavar="PLAN", help="write the plan here (implies --wait)")
    p.set_defaults(func=cmd_submit)

    s = subparsers.add_parser("status", help="show a placement's status")
    s.add_argument("id", help="placement id")
    _add_server_arguments(s)
    s.add_argument("--json", action="store_true", help="print the status as JSON")
    s.set_defaults(func=cmd_status)

    f = subparsers.add_parser("fetch", help="download a finished placement's plan")
    f.add_argument("id", help="placement id")
    _add_server_arguments(f)
    f.add_argument("-o", "--output", metavar="PLAN", help="write the plan here (default stdout)")
    f.set_defaults(func=cmd_fetch)

    c = subparsers.add_parser("cancel", help="cancel a queued or running placement")
    c.add_argument("id", help="placement id")
    _add_server_arguments(c)
    c.set_defaults(func=cmd_cancel)

    r = subparsers.add_parser(
        "profile", help="profile a bundled example Keras model (needs TensorFlow)",
        description="Profile one training step of a small bundled Keras model and write its "
                    "graph (baechi.graph/v1).",
    )
    r.add_argument("--model", default="cnn", choices=("cnn", "lstm", "resnet50"),
                   help="example model (default cnn)")
    r.add_argument("--batch", type=int, default=None, help="batch size")
    r.add_argument("--steps", type=int, default=5, help="profiled steps (default 5)")
    r.add_argument("-o", "--output", required=True, metavar="GRAPH", help="graph JSON to write")
    r.set_defaults(func=cmd_profile)

    m = subparsers.add_parser(
        "measure", help="place a bundled example Keras model and measure how closely "
                        "TensorFlow follows the plan (needs TensorFlow)",
        description="Profile a small bundled Keras model, place it in-process (or take "
                    "--plan), run placed training steps with and without order enforcement, "
                    "and print: ops on their planned device, consecutive pairs run in the "
                    "plan's order, measured and predicted step time, busy time per device. "
                    "Without a GPU the CPU is split into --devices logical devices.",
    )
    m.add_argument("--model", default="cnn", choices=("cnn", "lstm", "resnet50"),
                   help="example model (default cnn)")
    m.add_argument("--batch", type=int, default=None, help="batch size")
    m.add_argument("--steps", type=int, default=5, help="measured steps per run (default 5)")
    m.add_argument("--devices", type=int, default=4, help="devices to place on (default 4)")
    m.add_argument("--algorithm", "-a", default=DEFAULT_ALGORITHM,
                   help=f"placement algorithm (default {DEFAULT_ALGORITHM})")
    m.add_argument("--time-limit", type=float, default=MEASURE_TIME_LIMIT_S, metavar="S",
                   help=f"placement time limit in seconds (default {MEASURE_TIME_LIMIT_S:g})")
    m.add_argument("--plan", metavar="PLAN", default=None,
                   help="measure this plan (made for the same model and batch) instead")
    m.add_argument("--json", action="store_true", help="print the report as JSON")
    m.set_defaults(func=cmd_measure)


def _add_server_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("service")
    group.add_argument("--server", default=os.environ.get(URL_ENV), metavar="URL",
                       help=f"service URL (default ${URL_ENV})")
    group.add_argument("--api-key", default=None, metavar="KEY",
                       help=f"API key (default ${KEY_ENV})")
    group.add_argument("--retries", type=int, default=4, metavar="N",
                       help="retries on connection errors and 503, with backoff (default 4)")


# ---------------------------------------------------------------------------- verbs
def cmd_submit(args: argparse.Namespace) -> int:
    return _guard(_submit, args)


def cmd_status(args: argparse.Namespace) -> int:
    return _guard(_status, args)


def cmd_fetch(args: argparse.Namespace) -> int:
    return _guard(_fetch, args)


def cmd_cancel(args: argparse.Namespace) -> int:
    return _guard(_cancel, args)


def cmd_profile(args: argparse.Namespace) -> int:
    return _guard(_profile, args)


def _submit(args: argparse.Namespace) -> int:
    import orjson

    from baechi.cli import cluster_from_args

    cluster = cluster_from_args(args)
    options: dict[str, Any] = {}
    if args.options:
        try:
            options = orjson.loads(args.options)
        except orjson.JSONDecodeError as exc:
            return _fail(f"--options: not valid JSON: {exc}", 2)
        if not isinstance(options, dict):
            return _fail("--options: expected a JSON object", 2)
    if args.time_limit is not None:
        options["time_limit_s"] = args.time_limit
    with _client(args) as client:
        placement = client.submit(args.graph, cluster, args.algorithm, options or None,
                                  objective=args.objective)
        state = placement.last_status.status if placement.last_status else "queued"
        print(placement.id)
        if not (args.wait or args.output):
            print(f"{state}: {placement.url}", file=sys.stderr)
            return 0
        plan = placement.wait(timeout=args.timeout)
    print(_plan_summary(plan))
    if args.output:
        _write_json(plan.model_dump(mode="json"), args.output)
        print(f"plan written to {args.output}")
    return 0


def _status(args: argparse.Namespace) -> int:
    import orjson

    with _client(args) as client:
        status = client.placement(args.id).status()
    if args.json:
        print(orjson.dumps(status.raw, option=orjson.OPT_INDENT_2).decode())
        return 0
    line = f"{status.id}  {status.status}"
    if not status.done:
        line += f"  {status.phase or '-'} {status.fraction:.0%}"
    print(line)
    if status.error:
        print(f"error: {status.error.get('code')}: {status.error.get('message')}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    import orjson

    with _client(args) as client:
        plan = client.placement(args.id).plan()
    data = plan.model_dump(mode="json")
    if args.output and args.output != "-":
        _write_json(data, args.output)
        print(_plan_summary(plan))
        print(f"plan written to {args.output}")
    else:
        print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
    return 0


def _cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        status = client.placement(args.id).cancel()
    print(f"{status.id}  {status.status}")
    return 0


def _profile(args: argparse.Namespace) -> int:
    from baechi.cli import require_extra

    require_extra("tf", "profile")
    from baechi.client.tf.profiler import profile
    from baechi.examples.keras_models import EXAMPLES

    example = EXAMPLES[args.model]
    model, x, y, loss, optimizer = example.make(args.batch)
    started = time.perf_counter()
    graph = profile(model, x, y, loss, optimizer, steps=args.steps)
    seconds = time.perf_counter() - started
    _write_json(graph, args.output)
    meta = graph["meta"]
    print(f"profiled {example.description}: {len(graph['ops'])} ops, {len(graph['edges'])} "
          f"edges, {meta['measured_fraction']:.1%} of compute ops timed, {seconds:.1f} s")
    print(f"graph written to {args.output}")
    return 0


def cmd_measure(args: argparse.Namespace) -> int:
    return _guard(_measure, args)


def _measure(args: argparse.Namespace) -> int:
    import orjson

    from baechi.cli import require_extra

    require_extra("tf", "measure")
    import tensorflow as tf

    import baechi
    from baechi.client.errors import InvalidInput
    from baechi.client.tf.devices import split_cpu
    from baechi.client.tf.measurement import measure
    from baechi.client.tf.profiler import profile
    from baechi.examples.keras_models import EXAMPLES

    if args.devices < 1 or args.steps < 1:
        raise InvalidInput("--devices and --steps must be ≥ 1")
    if not tf.config.list_physical_devices("GPU"):
        split_cpu(args.devices)
    example = EXAMPLES[args.model]
    model, x, y, loss, optimizer = example.make(args.batch)
    if args.plan:
        plan: Any = args.plan
    else:
        graph = profile(model, x, y, loss, optimizer, steps=max(args.steps, 2))
        plan = baechi.place(graph, {"devices": {"count": args.devices}}, args.algorithm,
                            {"time_limit_s": args.time_limit})
        print(_plan_summary(plan))
    report = measure(model, x, y, plan, steps=args.steps, loss=loss, optimizer=optimizer)
    if args.json:
        print(orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2).decode())
    else:
        print(f"{example.description}, {args.steps} measured step(s) per run:")
        print(report.table())
    return 0


# --------------------------------------------------------------------------- helpers
def _client(args: argparse.Namespace) -> Any:
    from baechi.client.errors import InvalidInput
    from baechi.client.sdk import BaechiClient

    if not args.server:
        raise InvalidInput(f"no service URL: pass --server URL or set ${URL_ENV}")
    return BaechiClient(args.server, args.api_key or os.environ.get(KEY_ENV),
                        retries=args.retries)


def _guard(verb: Any, args: argparse.Namespace) -> int:
    """Run a verb; turn the errors it may raise into one line and an exit status."""
    from baechi.client.errors import BaechiError, InvalidInput, PlanMismatch, ProfileError
    from baechi.errors import PlacementError

    try:
        return int(verb(args) or 0)
    except (InvalidInput, PlanMismatch, ProfileError) as exc:
        return _fail(exc.message, 2)
    except BaechiError as exc:
        code = f" [{exc.code}]" if exc.code else ""
        return _fail(f"{exc.message}{code}", 1)
    except PlacementError as exc:
        return _fail(exc.message, 2 if exc.exit_status == 2 else 1)
    except OSError as exc:
        return _fail(f"{getattr(exc, 'filename', '') or ''}: {exc.strerror or exc}", 2)


def _fail(message: str, status: int) -> int:
    print(f"baechi: error: {message}", file=sys.stderr)
    return status


def _write_json(data: Any, path: str) -> None:
    import orjson

    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    partial.replace(target)


def _plan_summary(plan: Any) -> str:
    estimate = plan.estimate
    devices = sorted(set(plan.placement.values()))
    if estimate is None:
        return f"plan: {len(plan.placement)} ops on {len(devices)} device(s)"
    return (
        f"plan ({plan.request.algorithm}): {len(plan.placement)} ops on {len(devices)} "
        f"device(s), step time {estimate.step_time_us / 1000:.3f} ms (single device "
        f"{estimate.single_device_us / 1000:.3f} ms, lower bound "
        f"{estimate.lower_bound_us / 1000:.3f} ms)"
    )


__all__ = ["register"]
