"""``baechi worker``: the verb this package adds to the ``baechi`` CLI (entry point group
``baechi.cli``). Nothing heavy is imported at module level: RQ loads only when it runs."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``worker`` to an argparse subparsers object."""
    worker = subparsers.add_parser(
        "worker", help="run a placement worker (RQ)",
        description="Run an RQ worker on the placement queue. Start as many as you like, on "
                    "any machine that reaches the same Redis.")
    add_worker_arguments(worker)
    worker.set_defaults(func=cmd_worker)


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--burst", action="store_true",
                        help="exit once the queue is empty instead of waiting for jobs")
    parser.add_argument("--queue", default=None,
                        help="queue to consume (BAECHI_QUEUE_NAME, placements)")
    parser.add_argument("--name", default=None, help="worker name (unique; random by default)")
    parser.add_argument("--log-level", default="INFO",
                        choices=("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"))


def cmd_worker(args: argparse.Namespace) -> int:
    """Run a worker; 1 when Redis is unreachable, 2 on bad settings."""
    from baechi.cli import require_extra

    require_extra("server", "worker")
    from baechi.jobs.settings import settings_or_report

    settings = settings_or_report("worker")
    if settings is None:
        return 2
    from baechi.worker.runner import run_worker

    return run_worker(settings, burst=args.burst, queue_name=args.queue, name=args.name,
                      logging_level=args.log_level)
