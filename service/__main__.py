"""``python -m baechi.service``: the same as ``baechi serve``."""

from __future__ import annotations

import argparse
import sys

from baechi.service.cli import add_serve_arguments, cmd_serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m baechi.service", description="Run the API.")
    add_serve_arguments(parser)
    return cmd_serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
