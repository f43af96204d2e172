"""The ``baechi import`` verb: convert another tool's profile to ``baechi.graph/v1``.

``baechi.cli`` calls :func:`register` with its sub-parsers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from baechi.errors import PlacementError
from baechi.importers import IMPORTERS, import_graph


def register(subparsers: Any) -> None:
    """Add ``import {pipedream,dnn-partitioning} FILE -o OUT``."""
    p = subparsers.add_parser(
        "import", help="convert a PipeDream or dnn-partitioning profile to baechi.graph/v1",
        description="Convert another tool's profile into a baechi.graph/v1 graph.",
    )
    p.add_argument("format", choices=sorted(IMPORTERS),
                   help="pipedream: profiler graph.txt; dnn-partitioning: its JSON inputs")
    p.add_argument("file", help="the profile to convert")
    p.add_argument("-o", "--output", required=True, metavar="GRAPH", help="graph JSON to write")
    p.add_argument("--name", default=None, help="graph name (default from the file name)")
    p.set_defaults(func=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    try:
        document = import_graph(args.format, args.file, name=args.name)
    except PlacementError as exc:
        print(f"baechi: error: {exc.message}", file=sys.stderr)
        return 2
    target = Path(args.output)
    try:
        partial = target.with_name(target.name + ".partial")
        partial.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
        partial.replace(target)
    except OSError as exc:
        print(f"baechi: error: {target}: cannot write: {exc.strerror}", file=sys.stderr)
        return 2
    compute_ms = sum(op["compute_us"] for op in document["ops"]) / 1000
    print(f"{document['name']}: {len(document['ops'])} ops, {len(document['edges'])} edges, "
          f"Σcompute {compute_ms:.3f} ms; written to {target}")
    return 0


__all__ = ["cmd_import", "register"]
