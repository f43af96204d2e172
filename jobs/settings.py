"""Settings of the API and the workers, read from ``BAECHI_*`` environment variables.

Both processes read the same :class:`Settings`, so one environment (a ``.env`` file, the
compose file) configures the whole deployment. See ``docs/service.md`` for the table.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

#: Tenant of every request when anonymous access is allowed and no key is sent.
ANONYMOUS_TENANT = "anonymous"


class Settings(BaseSettings):
    """Configuration of the placement service (env prefix ``BAECHI_``)."""

    model_config = SettingsConfigDict(env_prefix="BAECHI_", extra="ignore", frozen=True)

    redis_url: str = "redis://localhost:6379/0"
    #: API keys; each key is one tenant. Comma-separated or a JSON list.
    api_keys: Annotated[tuple[str, ...], NoDecode] = ()
    #: Without keys the server refuses to start unless this is set (every caller is one tenant).
    allow_anonymous: bool = False
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)

    #: Largest request body accepted, in bytes (413 above it, before the body is read).
    max_body_bytes: int = Field(default=32 * 2**20, ge=1024)
    #: Largest graph accepted, in ops (422 above it).
    max_ops: int = Field(default=200_000, ge=1)
    #: How long plans, finished placements and their idempotency keys are kept, in seconds.
    result_ttl_s: int = Field(default=7 * 86400, ge=60)
    #: How long an uploaded graph is kept after its last use, in seconds.
    graph_ttl_s: int = Field(default=7 * 86400, ge=60)
    #: Upper bound of a job's wall-clock time, whatever ``time_limit_s`` asks for.
    job_timeout_cap_s: int = Field(default=3600, ge=10)
    #: Time a job gets beyond the solver's limit: loading, reduction, simulation, storing.
    job_overhead_s: int = Field(default=60, ge=5)

    queue_name: str = Field(default="placements", pattern=r"^[A-Za-z0-9_.:-]+$")
    #: Seconds between a worker's heartbeats while it runs a job.
    worker_heartbeat_s: int = Field(default=10, ge=1)
    #: A running job whose worker missed heartbeats for this long is treated as abandoned.
    worker_grace_s: int = Field(default=20, ge=1)
    #: How often a worker reaps abandoned jobs (RQ maintenance), in seconds.
    worker_maintenance_s: int = Field(default=30, ge=1)
    #: A worker that has not sent a heartbeat for this long no longer counts as alive.
    worker_ttl_s: int = Field(default=60, ge=20)
    #: Minimum seconds between two progress writes of one job.
    progress_interval_s: float = Field(default=0.25, gt=0)
    #: Testing aid: a worker holds each job in ``running`` this long before placing it.
    worker_hold_s: float = Field(default=0.0, ge=0)

    #: Queued and running placements one tenant may have at once (429 beyond; issue 12).
    tenant_max_active: int = Field(default=100, ge=1)
    #: Requests per second one tenant may make to one API process, on average (429 beyond).
    tenant_rate_per_s: float = Field(default=50.0, gt=0)
    #: Requests one tenant may make at once before the rate applies (the bucket's size).
    tenant_burst: int = Field(default=200, ge=1)
    #: Wall-clock limit of rendering one report in a worker (a 200k-op plan took 44 s).
    report_timeout_s: int = Field(default=900, ge=10)
    #: How long ``GET /report`` waits for a report still being rendered before a 503.
    report_wait_s: float = Field(default=10.0, ge=0)

    page_size: int = Field(default=20, ge=1)
    max_page_size: int = Field(default=100, ge=1)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        """Accept ``a,b``, ``["a", "b"]`` (JSON) or a sequence; drop blanks."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    value = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"BAECHI_API_KEYS is not a valid JSON list: {exc}") from None
            else:
                value = text.split(",")
        if isinstance(value, (list, tuple)):
            keys = tuple(str(k).strip() for k in value)
            return tuple(k for k in keys if k)
        return value

    @model_validator(mode="after")
    def _pages(self) -> Settings:
        if self.page_size > self.max_page_size:
            raise ValueError("page_size must not exceed max_page_size")
        return self

    @cached_property
    def tenants(self) -> dict[str, str]:
        """SHA-256 of each key → tenant id (keys themselves never reach Redis)."""
        return {_digest(key): tenant_of_key(key) for key in self.api_keys}

    @property
    def auth_required(self) -> bool:
        return bool(self.api_keys)

    def refusal(self) -> str | None:
        """Why the server must not start with these settings, or ``None``."""
        if not self.api_keys and not self.allow_anonymous:
            return ("no API keys configured: set BAECHI_API_KEYS (comma-separated or a JSON "
                    "list) or BAECHI_ALLOW_ANONYMOUS=1")
        return None

    @property
    def redis_url_redacted(self) -> str:
        return redact_url(self.redis_url)

    def job_timeout_s(self, time_limit_s: float) -> int:
        """Wall-clock limit of a job whose solver may use ``time_limit_s``."""
        return int(min(self.job_timeout_cap_s, time_limit_s + self.job_overhead_s)) + 1

    def solver_limit_s(self, time_limit_s: float) -> float:
        """``time_limit_s`` lowered so the solver stops before the job's own timeout."""
        return min(time_limit_s, max(1.0, self.job_timeout_cap_s - self.job_overhead_s))


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def tenant_of_key(key: str) -> str:
    """Stable tenant id of an API key: a prefix of its SHA-256 (not reversible to the key)."""
    return "t" + _digest(key)[:16]


def key_digest(key: str) -> str:
    """What :attr:`Settings.tenants` is indexed by."""
    return _digest(key)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages and logs)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def get_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with keyword overrides (used by tests and the CLI)."""
    return Settings(**overrides)


def settings_or_report(verb: str, **overrides: Any) -> Settings | None:
    """Settings for ``baechi {verb}``, or ``None`` after printing which one is invalid."""
    import sys

    from pydantic import ValidationError

    try:
        return get_settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        print(f"baechi {verb}: invalid setting BAECHI_{field.upper()}: {first['msg']}",
              file=sys.stderr)
        return None
