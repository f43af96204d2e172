"""Progress of a running placement, written to the RQ job's meta a few times a second."""

from __future__ import annotations

import time
from collections.abc import Callable

from rq.job import Job


class Canceled(Exception):
    """Raised inside the engine's progress callback when the placement was canceled."""


class ProgressReporter:
    """The engine's ``progress(phase, fraction)`` callback, throttled.

    The engine calls it a few times per phase, possibly thousands of times in all; Redis is
    written at most once per ``interval_s``. Each write also checks ``is_canceled`` so a
    canceled job stops at its next report even if the stop command never reached its worker.
    """

    def __init__(self, job: Job, interval_s: float,
                 is_canceled: Callable[[], bool] | None = None) -> None:
        self.job = job
        self.interval_s = interval_s
        self.is_canceled = is_canceled
        self.writes = 0
        self._last = float("-inf")

    def __call__(self, phase: str, fraction: float) -> None:
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return
        self._last = now
        self.write(phase, fraction)
        if self.is_canceled is not None and self.is_canceled():
            raise Canceled(self.job.id)

    def write(self, phase: str, fraction: float) -> None:
        """Store ``{phase, fraction}`` now, unthrottled."""
        fraction = min(1.0, max(0.0, float(fraction)))
        self.job.meta["progress"] = {"phase": str(phase), "fraction": round(fraction, 4)}
        self.job.save_meta()
        self.writes += 1
