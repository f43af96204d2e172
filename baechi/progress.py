"""A one-line progress bar for long work: ``baechi place`` and :meth:`Placement.wait
<baechi.client.Placement.wait>` (``baechi submit --wait``).

It draws only on a terminal: when the stream is not a TTY (CI logs, pipes) it writes nothing.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30


class ProgressBar:
    """``[#########.....]  45%  running: place   3.2s``, redrawn in place.

    Parameters
    ----------
    stream : file, optional
        Where to draw; default ``sys.stderr``.
    enabled : bool
        False draws nothing; True draws only when ``stream`` is a TTY.
    """

    def __init__(self, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.active = bool(enabled and isatty is not None and isatty())
        self.started = time.monotonic()
        self._last = ""

    def update(self, status: str, phase: str, fraction: float,
               left_s: float | None = None) -> None:
        """Redraw with the job's status, phase, fraction done (0..1) and, when known, the
        seconds left until its deadline."""
        if not self.active:
            return
        fraction = min(max(fraction, 0.0), 1.0)
        filled = round(fraction * WIDTH)
        label = f"{status}: {phase}" if phase and phase != status else status
        left = "" if left_s is None else f"  {max(left_s, 0.0):5.1f}s left"
        line = (f"[{'#' * filled}{'.' * (WIDTH - filled)}] {fraction * 100:5.1f}%  "
                f"{label:<24.24} {time.monotonic() - self.started:6.1f}s{left}")
        if line != self._last:
            self.stream.write("\r" + line)
            self.stream.flush()
            self._last = line

    def close(self) -> None:
        """End the line (a no-op when nothing was drawn)."""
        if self.active and self._last:
            self.stream.write("\n")
            self.stream.flush()
            self._last = ""


__all__ = ["ProgressBar"]
