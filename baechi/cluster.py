"""Devices and the network between them (docs/format.md §3).

A cluster is written either with a device list or with the count shorthand::

    {"devices": [{"name": "/GPU:0", "memory_bytes": 8589934592, "speed": 1.0}], ...}
    {"devices": {"count": 4, "memory_bytes": "8GiB", "name_prefix": "/GPU:"}, ...}

Sizes may be integers (bytes) or strings with a unit (``8GiB``, ``512MiB``, ``2.5GB``).
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from baechi.errors import InvalidCluster

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

#: Most devices in one cluster, written as a list or with the count shorthand.
MAX_DEVICES = 4096

#: Largest device memory: 2**62 bytes, so sums of memory stay within an int64.
MAX_MEMORY_BYTES = 2**62

#: Bounds of a device's relative speed: op times divided by it stay finite.
MIN_SPEED, MAX_SPEED = 1e-6, 1e6

#: Largest link latency (µs) and smallest bandwidth (GB/s): transfer times stay finite.
MAX_LATENCY_US, MIN_BANDWIDTH_GBPS = 1e12, 1e-6

#: Name prefix of devices written with the count shorthand.
DEFAULT_NAME_PREFIX = "/GPU:"

#: A device's kind when the cluster does not say (docs/format.md §10).
DEFAULT_KIND = "gpu"

#: Most per-pair link overrides in one network (a full mesh of 64 devices).
MAX_LINKS = 64 * 63 // 2


def parse_size(value: int | str) -> int:
    """Parse a memory size into bytes.

    Examples
    --------
    >>> parse_size("8GiB"), parse_size("512MiB"), parse_size("2.5GB"), parse_size(1024)
    (8589934592, 536870912, 2500000000, 1024)
    """
    if isinstance(value, bool):
        raise ValueError("a size must be a number of bytes or a string like '8GiB', not a boolean")
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0 or value != int(value):
            raise ValueError(f"size {value} is not a whole, finite, non-negative number of bytes")
        value = int(value)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size {value} is negative")
        if value > MAX_MEMORY_BYTES:
            raise ValueError(f"size {value} is larger than {MAX_MEMORY_BYTES} bytes (2**62)")
        return value
    match = _SIZE.match(str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read size {value!r}; write e.g. 8GiB, 512MiB, 2.5GB or bytes")
    size = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not size <= MAX_MEMORY_BYTES:  # also catches inf
        raise ValueError(f"size {value!r} is larger than {MAX_MEMORY_BYTES} bytes (2**62)")
    return round(size)


class Device(BaseModel):
    """One device: its name, memory (``None`` = unlimited), relative speed, kind (which of an
    op's ``compute_us_by_kind`` applies) and whether it is a host (docs/format.md §10)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    memory_bytes: int | None = None
    speed: float = Field(default=1.0, ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False)
    kind: str = Field(default=DEFAULT_KIND, min_length=1, max_length=64)
    host: StrictBool = False

    # the JSON schema shows what a request may send: bytes or a size with a unit ("8GiB")
    @field_validator("memory_bytes", mode="before", json_schema_input_type=int | str | None)
    @classmethod
    def _size(cls, value: Any) -> Any:
        return None if value is None else parse_size(value)

    @field_validator("speed", mode="before")
    @classmethod
    def _no_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("speed must be a number, not a boolean")
        return value


def _number(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    if isinstance(value, float) and math.isnan(value):
        raise ValueError("must not be NaN")
    return value


class Link(BaseModel):
    """A per-pair override of the default link (format.md §10), symmetric: ``devices`` names the
    two devices; an absent field keeps the network's value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: tuple[str, str]
    latency_us: float | None = Field(default=None, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False)
    bandwidth_gbps: float | None = Field(default=None, ge=MIN_BANDWIDTH_GBPS)

    _no_bool = field_validator("latency_us", "bandwidth_gbps", mode="before")(
        classmethod(lambda cls, value: _number(value)))

    @field_validator("devices")
    @classmethod
    def _two(cls, devices: tuple[str, str]) -> tuple[str, str]:
        if devices[0] == devices[1]:
            raise ValueError(f"a link joins two different devices, not {devices[0]!r} to itself")
        return devices


class Network(BaseModel):
    """Links between devices: a transfer of b bytes costs ``latency_us + b / (GB/s * 1000)``
    on the default link, or on the pair's entry of ``links``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    latency_us: float = Field(default=0.0, ge=0, le=MAX_LATENCY_US, allow_inf_nan=False)
    # JSON has no infinity: the schema leaves the default out and says what absent means
    bandwidth_gbps: float = Field(default=math.inf, ge=MIN_BANDWIDTH_GBPS,
                                  description="GB/s; absent = infinite",
                                  json_schema_extra=lambda schema: schema.pop("default", None))
    mode: Literal["sequential", "parallel"] = "sequential"
    links: list[Link] = Field(default_factory=list, max_length=MAX_LINKS)

    def link(self, pair: Link) -> Network:
        """The network of one pair: this one with the pair's overrides."""
        return Network(
            latency_us=self.latency_us if pair.latency_us is None else pair.latency_us,
            bandwidth_gbps=(self.bandwidth_gbps if pair.bandwidth_gbps is None
                            else pair.bandwidth_gbps),
            mode=self.mode,
        )

    @field_validator("latency_us", "bandwidth_gbps", mode="before")
    @classmethod
    def _no_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a number, not a boolean")
        if isinstance(value, float) and math.isnan(value):
            raise ValueError("must not be NaN")
        return value

    @property
    def us_per_byte(self) -> float:
        """Microseconds per byte: ``1 / (bandwidth_gbps * 1000)`` (0 for infinite bandwidth)."""
        return 1.0 / (self.bandwidth_gbps * 1000.0)

    def transfer_us(self, nbytes: int) -> float:
        """Time to move ``nbytes`` between two devices (``latency_us`` alone for 0 bytes):
        ``latency_us + nbytes * us_per_byte``, the one formula the cost model uses."""
        return self.latency_us + nbytes * self.us_per_byte


class DeviceCount(BaseModel):
    """The shorthand ``{"count": 4, "memory_bytes": ..., "name_prefix": "/GPU:"}``."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(ge=1, le=MAX_DEVICES, strict=True)
    memory_bytes: int | None = None
    speed: float = Field(default=1.0, ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False)
    name_prefix: str = DEFAULT_NAME_PREFIX
    kind: str = Field(default=DEFAULT_KIND, min_length=1, max_length=64)
    host: StrictBool = False

    # the JSON schema shows what a request may send: bytes or a size with a unit ("8GiB")
    @field_validator("memory_bytes", mode="before", json_schema_input_type=int | str | None)
    @classmethod
    def _size(cls, value: Any) -> Any:
        return None if value is None else parse_size(value)

    def expand(self) -> list[Device]:
        return [
            Device(name=f"{self.name_prefix}{i}", memory_bytes=self.memory_bytes, speed=self.speed,
                   kind=self.kind, host=self.host)
            for i in range(self.count)
        ]


class Cluster(BaseModel):
    """Devices in a fixed order (the order breaks ties, docs/format.md §4) and their network.

    Examples
    --------
    >>> c = Cluster.parse({"devices": {"count": 2, "memory_bytes": "1GiB"}})
    >>> [d.name for d in c.devices], c.network.mode
    (['/GPU:0', '/GPU:1'], 'sequential')
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: list[Device] = Field(min_length=1, max_length=MAX_DEVICES)
    network: Network = Field(default_factory=Network)

    # the JSON schema shows both forms a request may send: a list, or the count shorthand
    @field_validator("devices", mode="before", json_schema_input_type=list[Device] | DeviceCount)
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return DeviceCount.model_validate(value).expand()
        return value

    @field_validator("devices")
    @classmethod
    def _unique(cls, devices: list[Device]) -> list[Device]:
        seen: set[str] = set()
        for device in devices:
            if device.name in seen:
                raise ValueError(f"device name {device.name!r} appears twice")
            seen.add(device.name)
        return devices

    @model_validator(mode="after")
    def _links_name_devices(self) -> Cluster:
        names = {device.name for device in self.devices}
        seen: set[frozenset[str]] = set()
        for i, link in enumerate(self.network.links):
            for name in link.devices:
                if name not in names:
                    raise ValueError(f"network.links[{i}].devices: {name!r} is not a device "
                                     "of the cluster")
            pair = frozenset(link.devices)
            if pair in seen:
                raise ValueError(f"network.links[{i}]: a second link between "
                                 f"{link.devices[0]!r} and {link.devices[1]!r}")
            seen.add(pair)
        return self

    @classmethod
    def parse(cls, value: Cluster | dict[str, Any]) -> Cluster:
        """Build a cluster from its JSON form, raising :class:`InvalidCluster` on bad input."""
        if isinstance(value, Cluster):
            return value
        if not isinstance(value, dict):
            raise InvalidCluster("cluster: expected an object with 'devices' and 'network'")
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            raise InvalidCluster(
                "cluster: " + describe_validation_error(exc),
                {"errors": _error_list(exc)},
            ) from None

    @classmethod
    def uniform(
        cls,
        count: int,
        memory_bytes: int | str | None = None,
        latency_us: float = 0.0,
        bandwidth_gbps: float = math.inf,
        mode: str = "sequential",
    ) -> Cluster:
        """``count`` identical devices named ``/GPU:0`` …"""
        return cls.parse(
            {
                "devices": {"count": count, "memory_bytes": memory_bytes},
                "network": {"latency_us": latency_us, "bandwidth_gbps": bandwidth_gbps,
                            "mode": mode},
            }
        )

    def index(self) -> dict[str, int]:
        """Device name → position in the cluster list."""
        return {device.name: i for i, device in enumerate(self.devices)}

    def fastest(self) -> int:
        """Index of the fastest device (the first of equals)."""
        best = 0
        for i, device in enumerate(self.devices):
            if device.speed > self.devices[best].speed:
                best = i
        return best

    def to_json(self) -> dict[str, Any]:
        """The cluster as a JSON-ready dict (infinite bandwidth written as ``null``)."""
        data = self.model_dump()
        if math.isinf(self.network.bandwidth_gbps):
            data["network"].pop("bandwidth_gbps")
        # the fields of docs/format.md §10 only when used, so old clusters read as they were written
        for device in data["devices"]:
            if device["kind"] == DEFAULT_KIND:
                device.pop("kind")
            if not device["host"]:
                device.pop("host")
        links = data["network"].pop("links")
        if links:
            data["network"]["links"] = [
                {key: list(value) if key == "devices" else value for key, value in link.items()
                 if value is not None and not (key == "bandwidth_gbps" and math.isinf(value))}
                for link in links]
        return data


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _error_list(exc: ValidationError) -> list[dict[str, Any]]:
    return [{"field": _loc(e["loc"]), "message": e["msg"]} for e in exc.errors()]


def describe_validation_error(exc: ValidationError, limit: int = 3) -> str:
    """One line per pydantic error, ``field: message``, at most ``limit`` of them."""
    errors = _error_list(exc)
    text = "; ".join(f"{e['field'] or '(root)'}: {e['message']}" for e in errors[:limit])
    if len(errors) > limit:
        text += f"; and {len(errors) - limit} more"
    return text
