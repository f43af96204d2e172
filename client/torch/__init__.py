"""PyTorch in the client: profile an ``nn.Module``'s training step, apply a plan to it.

The same five-line story as TensorFlow (the ``torch`` extra)::

    from baechi import client
    from baechi.client import torch as baechi_torch
    graph = baechi_torch.profile(module, inputs, targets, loss_fn, optimizer)
    plan = client.BaechiClient(url, api_key).submit(graph, cluster).wait()
    placed = baechi_torch.apply_plan(module, plan)          # parameters moved, transfers added
    loss_fn(placed(inputs), targets).backward(); optimizer.step()

Ops are the nodes of the module's ``torch.fx`` trace (leaf modules and the calls between
them); why, and what is measured how: docs/torch.md.
"""

from baechi.client.torch.placement import (
    DeviceCheck,
    PlacedInfo,
    apply_plan,
    check_devices,
    default_device_map,
    verify_transfers,
)
from baechi.client.torch.profiler import profile

__all__ = ["DeviceCheck", "PlacedInfo", "apply_plan", "check_devices", "default_device_map",
           "profile", "verify_transfers"]
