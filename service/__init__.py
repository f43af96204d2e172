"""The placement service's HTTP API (FastAPI), its Redis storage and RQ glue (DESIGN §7).

Importing this package is cheap: FastAPI, uvicorn and RQ load only when the app or a
command needs them. Start it with ``baechi serve`` (or ``python -m baechi.service``).
"""
