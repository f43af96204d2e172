"""The job functions' former module: jobs queued before a deploy that renamed it to
:mod:`baechi.worker.tasks` name their functions here, and RQ imports them by that name."""

from baechi.worker.tasks import on_failure, render_report, run_placement

__all__ = ["on_failure", "render_report", "run_placement"]
