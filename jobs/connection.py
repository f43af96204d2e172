"""Opening the Redis connection, and saying clearly when Redis is not there."""

from __future__ import annotations

from redis import Redis
from redis.exceptions import RedisError

from baechi.jobs.settings import redact_url


class RedisUnavailable(Exception):
    """Redis could not be reached; the message names the URL tried (password hidden)."""


def connect(url: str, *, check: bool = False, socket_timeout: float | None = 30.0) -> Redis:
    """A client for ``url``; with ``check``, ping it first and raise :class:`RedisUnavailable`."""
    try:
        redis = Redis.from_url(
            url,
            socket_connect_timeout=5,
            socket_timeout=socket_timeout,
            health_check_interval=30,
        )
    except ValueError as exc:
        raise RedisUnavailable(f"invalid Redis URL {redact_url(url)}: {exc}") from None
    if check:
        try:
            redis.ping()
        except RedisError as exc:
            raise RedisUnavailable(f"cannot reach Redis at {redact_url(url)}: {exc}") from None
    return redis
