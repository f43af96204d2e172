"""The placement service's HTTP API (FastAPI) (docs/format.md §7).

It validates requests, authenticates tenants and enqueues jobs through the job contract it
shares with the workers (:mod:`baechi.jobs`); it never imports :mod:`baechi.worker`, and its
reads never write. Importing this package is cheap: FastAPI, uvicorn and RQ load only when the
app or a command needs them. Start it with ``baechi serve`` (or ``python -m baechi.service``).
"""
