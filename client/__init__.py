"""Baechi client: submit graphs to the placement service, profile and pin TensorFlow models.

The five-line story (docs/format.md §8)::

    from baechi import client
    graph = client.profile(model, x, y, loss, optimizer)              # TensorFlow
    plan = client.BaechiClient(url, api_key).submit(graph, cluster).wait()
    client.apply_plan(model, plan)                                     # TensorFlow
    model.fit(x, y)

``client.measure(model, x, y, plan)`` reports how closely TensorFlow follows the plan.

The HTTP part needs no TensorFlow; :func:`profile` and :func:`apply_plan` import it when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baechi.client.errors import (
    BaechiError,
    Conflict,
    Gone,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    PlacementCanceled,
    PlacementFailed,
    PlanMismatch,
    ProfileError,
    ServerError,
    ServiceUnavailable,
    Unauthorized,
    WaitTimeout,
)

if TYPE_CHECKING:
    from baechi.client.sdk import BaechiClient, Placement, PlacementStatus
    from baechi.client.tf.measurement import MeasureReport
    from baechi.client.tf.pinning import AppliedPlan

_SDK = ("BaechiClient", "Placement", "PlacementStatus")


def __getattr__(name: str) -> Any:
    # The SDK (httpx) loads on first use, so ``import client`` stays light for the CLI.
    if name in _SDK:
        from baechi.client import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'client' has no attribute {name!r}")


def profile(model: Any, x: Any, y: Any, loss: Any, optimizer: Any, steps: int = 5,
            **kwargs: Any) -> dict[str, Any]:
    """Profile one training step of a Keras model into a ``baechi.graph/v1`` document.

    See :func:`baechi.client.tf.profiler.profile` for the parameters.
    """
    from baechi.client.tf.profiler import profile as _profile

    return _profile(model, x, y, loss, optimizer, steps=steps, **kwargs)


def apply_plan(model: Any, plan: Any, device_map: Any = None, **kwargs: Any) -> AppliedPlan:
    """Move a Keras model's variables and ops to the devices a plan names.

    See :func:`baechi.client.tf.pinning.apply_plan` for the parameters.
    """
    from baechi.client.tf.pinning import apply_plan as _apply_plan

    return _apply_plan(model, plan, device_map, **kwargs)


def measure(model: Any, x: Any, y: Any, plan: Any, steps: int = 5,
            **kwargs: Any) -> MeasureReport:
    """Run placed training steps and report how closely TensorFlow followed the plan.

    See :func:`baechi.client.tf.measurement.measure` for the parameters.
    """
    from baechi.client.tf.measurement import measure as _measure

    return _measure(model, x, y, plan, steps=steps, **kwargs)


__all__ = [
    "BaechiClient",
    "BaechiError",
    "Conflict",
    "Gone",
    "InvalidInput",
    "NotFound",
    "PayloadTooLarge",
    "Placement",
    "PlacementCanceled",
    "PlacementFailed",
    "PlacementStatus",
    "PlanMismatch",
    "ProfileError",
    "ServerError",
    "ServiceUnavailable",
    "Unauthorized",
    "WaitTimeout",
    "apply_plan",
    "measure",
    "profile",
]
