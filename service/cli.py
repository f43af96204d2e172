"""``baechi serve``: the verb this package adds to the ``baechi`` CLI.

``baechi.cli`` calls :func:`register` (entry point group ``baechi.cli``) with its subparsers;
``baechi worker`` comes from :mod:`baechi.worker.cli` the same way. Nothing heavy is imported
here at module level: FastAPI and uvicorn load only when the verb runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``serve`` to an argparse subparsers object."""
    serve = subparsers.add_parser(
        "serve", help="run the placement API (uvicorn)",
        description="Run the HTTP API. Settings come from BAECHI_* variables "
                    "(docs/service.md); Redis must be reachable.")
    add_serve_arguments(serve)
    serve.set_defaults(func=cmd_serve)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="address to bind (BAECHI_HOST, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (BAECHI_PORT, 8000)")
    parser.add_argument("--workers", type=int, default=1,
                        help="uvicorn worker processes (each reads BAECHI_* itself)")
    parser.add_argument("--log-level", default="info",
                        choices=("critical", "error", "warning", "info", "debug"))


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the API until interrupted; 1 when Redis is unreachable, 2 on bad settings."""
    from baechi.cli import require_extra

    require_extra("server", "serve")
    from baechi.jobs.settings import settings_or_report

    settings = settings_or_report("serve", host=args.host, port=args.port)
    if settings is None:
        return 2
    refusal = settings.refusal()
    if refusal:
        print(f"baechi serve: refusing to start: {refusal}", file=sys.stderr)
        return 2
    from baechi.jobs.connection import RedisUnavailable, connect

    try:
        connect(settings.redis_url, check=True).close()
    except RedisUnavailable as exc:
        print(f"baechi serve: {exc}", file=sys.stderr)
        return 1
    import uvicorn

    if args.workers > 1:
        # Several processes need an import string; each builds its app from the environment.
        uvicorn.run("baechi.service.app:create_app", factory=True, host=settings.host,
                    port=settings.port, workers=args.workers, log_level=args.log_level)
    else:
        from baechi.service.app import create_app

        uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                    log_level=args.log_level)
    return 0
