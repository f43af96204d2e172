"""``python -m baechi.worker``: the same as ``baechi worker``."""

from __future__ import annotations

import argparse
import sys

from baechi.worker.cli import add_worker_arguments, cmd_worker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m baechi.worker", description="Run a worker.")
    add_worker_arguments(parser)
    return cmd_worker(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
