"""Helpers shared by the importers: reading files, unit conversion."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson

from baechi.errors import InvalidGraph


def read_text(path: Path) -> str:
    """The file's text; :class:`InvalidGraph` naming the file when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidGraph(f"{path}: cannot read file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InvalidGraph(f"{path}: not a UTF-8 text file") from None


def read_json(path: Path) -> Any:
    """The file's JSON; :class:`InvalidGraph` naming the file on bad input."""
    try:
        return orjson.loads(path.read_bytes())
    except OSError as exc:
        raise InvalidGraph(f"{path}: cannot read file: {exc.strerror}") from None
    except orjson.JSONDecodeError as exc:
        raise InvalidGraph(f"{path}: not valid JSON: {exc}") from None


def to_us(milliseconds: float) -> float:
    """Milliseconds to microseconds, rounded to the nanosecond (``0.696`` ms → ``696.0``)."""
    return round(float(milliseconds) * 1000.0, 3)


def number(value: Any, where: str, field: str) -> float:
    """A finite, non-negative number (booleans refused), else :class:`InvalidGraph`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidGraph(f"{where}.{field}: expected a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InvalidGraph(f"{where}.{field}: must be finite and non-negative, got {value!r}")
    return float(value)
