"""Every default of a placement request, in one place (as rq's ``defaults.py``).

The engine, the CLI, the service and the SDK all read these names; none repeats a value.
"""

#: Algorithm used when a request, the CLI or the SDK names none.
DEFAULT_ALGORITHM = "auto"

#: Deadline of a request when it gives no ``options.time_limit_s``, in seconds.
DEFAULT_TIME_LIMIT_S = 60.0
