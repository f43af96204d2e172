"""The job contract of the placement service, shared by the API and the workers.

Neither side owns it: ``baechi.service`` (the API) and ``baechi.worker`` both import it and
never import each other. It holds what the two must agree on:

* :mod:`baechi.jobs.settings` — the ``BAECHI_*`` settings both processes read;
* :mod:`baechi.jobs.connection` — opening Redis and saying clearly when it is not there;
* :mod:`baechi.jobs.store` — the ``baechi:`` Redis keys: graphs, placement records, plans,
  reports, idempotency keys and per-tenant counters;
* :mod:`baechi.jobs.queue` — the RQ queue, the job function's name, retries, enqueueing and
  cancelling;
* :mod:`baechi.jobs.lifecycle` — a placement's status, read from its record and its RQ job.
"""
