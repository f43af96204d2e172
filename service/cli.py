"""``baechi serve`` and ``baechi worker``: the verbs this package adds to the ``baechi`` CLI.

``baechi.cli`` calls :func:`register` with its subparsers. Nothing heavy is imported here
at module level: FastAPI, uvicorn and RQ load only when a verb runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``serve`` and ``worker`` to an argparse subparsers object."""
    serve = subparsers.add_parser(
        "serve", help="run the placement API (uvicorn)",
        description="Run the HTTP API. Settings come from BAECHI_* variables "
                    "(docs/service.md); Redis must be reachable.")
    add_serve_arguments(serve)
    serve.set_defaults(func=cmd_serve)
    worker = subparsers.add_parser(
        "worker", help="run a placement worker (RQ)",
        description="Run an RQ worker on the placement queue. Start as many as you like, on "
                    "any machine that reaches the same Redis.")
    add_worker_arguments(worker)
    worker.set_defaults(func=cmd_worker)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="address to bind (BAECHI_HOST, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (BAECHI_PORT, 8000)")
    parser.add_argument("--workers", type=int, default=1,
                        help="uvicorn worker processes (each reads BAECHI_* itself)")
    parser.add_argument("--log-level", default="info",
                        choices=("critical", "error", "warning", "info", "debug"))


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--burst", action="store_true",
                        help="exit once the queue is empty instead of waiting for jobs")
    parser.add_argument("--queue", default=None,
                        help="queue to consume (BAECHI_QUEUE_NAME, placements)")
    parser.add_argument("--name", default=None, help="worker name (unique; random by default)")
    parser.add_argument("--log-level", default="INFO",
                        choices=("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"))


def _settings(verb: str, **overrides: Any) -> Any:
    """Settings from the environment, or ``None`` after printing why they are invalid."""
    from baechi.service.settings import get_settings
    from pydantic import ValidationError

    try:
        return get_settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        print(f"baechi {verb}: invalid setting BAECHI_{field.upper()}: {first['msg']}",
              file=sys.stderr)
        return None


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the API until interrupted; 1 when Redis is unreachable, 2 on bad settings."""
    from baechi.cli import require_extra

    require_extra("server", "serve")
    settings = _settings("serve", host=args.host, port=args.port)
    if settings is None:
        return 2
    refusal = settings.refusal()
    if refusal:
        print(f"baechi serve: refusing to start: {refusal}", file=sys.stderr)
        return 2
    from baechi.service.connection import RedisUnavailable, connect

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


def cmd_worker(args: argparse.Namespace) -> int:
    """Run a worker; 1 when Redis is unreachable, 2 on bad settings."""
    from baechi.cli import require_extra

    require_extra("server", "worker")
    settings = _settings("worker")
    if settings is None:
        return 2
    from baechi.worker.runner import run_worker

    return run_worker(settings, burst=args.burst, queue_name=args.queue, name=args.name,
                      logging_level=args.log_level)
