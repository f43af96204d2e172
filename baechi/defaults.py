"""Every default of a placement request, in one place (as rq's ``defaults.py``).

The engine, the CLI, the service and the SDK all read these names; none repeats a value.
"""

#: Algorithm used when a request, the CLI or the SDK names none.
DEFAULT_ALGORITHM = "auto"

#: Deadline of a request when it gives no ``options.time_limit_s``, in seconds.
DEFAULT_TIME_LIMIT_S = 60.0

#: How each channel's transfers are ordered when a request does not say: ``"model-aware"``
#: (by the urgency of their consumers, kept only when it replays strictly faster than
#: first come, first served; :mod:`baechi.ordering`) or ``"fifo"`` (docs/format.md §4's rule).
DEFAULT_TRANSFER_ORDER = "model-aware"
