"""``python -m baechi.worker.health``: exit 0 when a worker of this host sent a recent heartbeat.

The compose file uses it as the worker container's healthcheck: workers are named
``{hostname}.{pid}`` (see :func:`baechi.worker.runner.default_name`), so each container
checks its own.
"""

from __future__ import annotations

import socket
import sys
import time


def main() -> int:
    from redis.exceptions import RedisError
    from rq import Queue, Worker

    from baechi.jobs import queue as jobqueue
    from baechi.jobs.connection import RedisUnavailable, connect
    from baechi.jobs.settings import get_settings

    settings = get_settings()
    prefix = socket.gethostname() + "."
    try:
        redis = connect(settings.redis_url, check=True, socket_timeout=5)
        queue = Queue(settings.queue_name, connection=redis, serializer=jobqueue.SERIALIZER)
        workers = Worker.all(queue=queue)
    except (RedisUnavailable, RedisError) as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    now = time.time()
    for worker in workers:
        beat = worker.last_heartbeat
        if worker.name.startswith(prefix) and beat is not None \
                and now - beat.timestamp() <= settings.worker_ttl_s:
            print(f"healthy: {worker.name} (heartbeat {now - beat.timestamp():.0f} s ago)")
            return 0
    print(f"unhealthy: no worker named {prefix}* sent a heartbeat in the last "
          f"{settings.worker_ttl_s} s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
