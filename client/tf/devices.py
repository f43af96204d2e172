"""Local TensorFlow devices, and how a plan's device names map onto them.

A plan names the devices of the cluster it was made for (``/GPU:0`` ...). Here ``/GPU:i`` is
the i-th local logical device of the chosen kind: GPUs when there are any, else CPUs. Without a
GPU, :func:`split_cpu` splits the CPU into logical devices that stand in for GPUs (format.md §8).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Sequence
from typing import Any

from baechi.client.errors import PlanMismatch

_INDEX = re.compile(r"(\d+)\s*$")


def split_cpu(count: int) -> list[str]:
    """Split the CPU into ``count`` logical devices; return their names.

    Must run before TensorFlow initialises its devices (before the first op). Calling it again
    with the same count is a no-op.

    Raises
    ------
    RuntimeError
        TensorFlow already runs with a different number of logical CPUs.
    """
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    if tf.config.get_logical_device_configuration(cpu) is None:
        with contextlib.suppress(RuntimeError):  # already initialised: checked below
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
            )
    names = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(names) != count:
        raise RuntimeError(
            f"TensorFlow already runs with {len(names)} logical CPU device(s); "
            f"split_cpu({count}) must run before TensorFlow initialises its devices"
        )
    return names


def local_devices(device_type: str | None = None) -> tuple[str, list[str]]:
    """``(kind, names)`` of the local logical devices plans map onto.

    ``device_type`` None picks GPUs when there are any, else CPUs.
    """
    import tensorflow as tf

    kinds = [device_type.upper()] if device_type else ["GPU", "CPU"]
    for kind in kinds:
        names = [d.name for d in tf.config.list_logical_devices(kind)]
        if names:
            return kind, names
    raise PlanMismatch(f"no local {device_type or 'GPU or CPU'} device found")


def device_index(name: str, cluster_order: Sequence[str] = ()) -> int:
    """Position of plan device ``name``: its trailing number, else its place in the cluster.

    Examples
    --------
    >>> device_index("/GPU:3"), device_index("/device:GPU:1"), device_index("b", ["a", "b"])
    (3, 1, 1)
    """
    match = _INDEX.search(name)
    if match:
        return int(match.group(1))
    if name in cluster_order:
        return list(cluster_order).index(name)
    raise PlanMismatch(
        f"plan device {name!r} has no index (expected a name like '/GPU:0')",
        details={"device": name},
    )


def cluster_device_names(cluster: Any) -> list[str]:
    """Device names of a plan's ``request.cluster`` (list or count shorthand), in order."""
    if not isinstance(cluster, dict):
        return []
    devices = cluster.get("devices")
    if isinstance(devices, list):
        return [str(d.get("name")) for d in devices if isinstance(d, dict)]
    if isinstance(devices, dict) and isinstance(devices.get("count"), int):
        prefix = devices.get("name_prefix", "/GPU:")
        return [f"{prefix}{i}" for i in range(devices["count"])]
    return []


def map_devices(
    plan_devices: Iterable[str],
    local: Sequence[str],
    kind: str,
    cluster_order: Sequence[str] = (),
) -> dict[str, str]:
    """Plan device name → local device name.

    Raises
    ------
    PlanMismatch
        The plan uses more devices than there are here.
    """
    mapping: dict[str, str] = {}
    for name in sorted(set(plan_devices)):
        index = device_index(name, cluster_order)
        if index >= len(local):
            raise PlanMismatch(
                f"the plan puts ops on {name!r} (device #{index}) but there are only "
                f"{len(local)} local {kind} device(s): {', '.join(local)}",
                details={"device": name, "local_devices": len(local)},
            )
        mapping[name] = local[index]
    return mapping


__all__ = ["cluster_device_names", "device_index", "local_devices", "map_devices", "split_cpu"]
