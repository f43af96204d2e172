"""RQ workers that run placements: ``baechi worker`` (or ``python -m baechi.worker``).

A worker takes a placement id from the queue, reads the request and graph from Redis, runs
:func:`baechi.place` in a forked work horse, and stores the plan under its own key; then
renders the plan's report once, and runs the service's maintenance. It shares the job
contract (:mod:`baechi.jobs`) with the API and never imports :mod:`baechi.service`.
"""
