"""Profile a 2-layer transformer in PyTorch, place it on 4 devices, apply the plan, train it.

    python examples/torch_end_to_end.py                          # embedded engine
    python examples/torch_end_to_end.py --server http://localhost:8000 --api-key key-a

Without GPUs every planned device maps to the CPU: the placed module then runs the plan's
transfers as no-ops and must train to exactly the same losses as the unplaced module (checked
with ``torch.equal``; the script exits 1 otherwise). Before that, each planned device is mapped
to ``meta`` in turn (the others to ``cpu``) and a training step runs with every op's devices
checked, so a missing transfer would fail. Needs the ``torch`` extra; runs in seconds on a CPU.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default=os.environ.get("BAECHI_URL"),
                        help="Baechi service URL (default: place in-process)")
    parser.add_argument("--api-key", default=os.environ.get("BAECHI_API_KEY"))
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--algorithm", default="auto")
    parser.add_argument("--time-limit", type=float, default=2.0, help="seconds for the placer")
    parser.add_argument("--steps", type=int, default=5, help="training steps to compare")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads (1: stable timings on a shared CPU)")
    args = parser.parse_args(argv)

    import torch

    from baechi import client
    from baechi.client import torch as baechi_torch
    from baechi.examples.torch_models import make_transformer

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)  # same kernels placed and unplaced
    module, tokens, targets, loss_fn, optimizer = make_transformer(
        batch=8, length=32, vocab=256, dim=64, heads=4)
    reference = copy.deepcopy(module)  # trained unplaced, for the comparison

    # 1. Profile one training step (forward, backward, Adam step).
    started = time.perf_counter()
    graph = baechi_torch.profile(module, tokens, targets, loss_fn, optimizer, steps=5)
    print(f"profile: {len(graph['ops'])} ops ({graph['meta']['fx_nodes']} fx nodes), "
          f"{len(graph['edges'])} edges, {time.perf_counter() - started:.2f} s")

    # 2. Place it: through the service, or with the embedded engine.
    cluster = {"devices": {"count": args.devices},
               "network": {"latency_us": 5, "bandwidth_gbps": 50}}
    options = {"time_limit_s": args.time_limit}
    started = time.perf_counter()
    if args.server:
        with client.BaechiClient(args.server, args.api_key) as service:
            plan = service.submit(graph, cluster, args.algorithm, options).wait(progress=False)
        where = f"service {args.server}"
    else:
        import baechi

        plan = baechi.place(graph, cluster, args.algorithm, options)
        where = "embedded engine"
    estimate = plan.estimate
    print(f"place ({args.algorithm}, {where}): {len(set(plan.placement.values()))} device(s) "
          f"used, {time.perf_counter() - started:.1f} s; predicted step "
          f"{estimate.step_time_us / 1000:.2f} ms vs {estimate.single_device_us / 1000:.2f} ms "
          "on one device")

    # 3. Structural check: one planned device as meta, the others as cpu, every op checked.
    checks = baechi_torch.verify_transfers(module, plan, tokens, targets, loss_fn)
    ops = sum(c.on_planned_device for c in checks.values())
    total = sum(c.ops for c in checks.values())
    print(f"device check: {ops}/{total} op runs on their planned device over {len(checks)} "
          f"meta mapping(s), forward and backward")

    # 4. Apply the plan with every device on the CPU, and train placed and unplaced.
    placed = baechi_torch.apply_plan(module, plan, dict.fromkeys(plan.placement.values(), "cpu"))
    print(f"apply_plan: {len(placed.baechi.transfers)} transfers between devices inserted")
    losses = {}
    for label, model in (("placed", placed), ("unplaced", reference)):
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        losses[label] = []
        for _ in range(args.steps):
            opt.zero_grad()
            loss = loss_fn(model(tokens), targets)
            loss.backward()
            opt.step()
            losses[label].append(loss.detach())
        print(f"losses ({label}): " + " ".join(f"{x.item():.6f}" for x in losses[label]))
    same = all(torch.equal(a, b) for a, b in zip(losses["placed"], losses["unplaced"],
                                                   strict=True))
    print(f"identical losses (torch.equal): {same}")
    return 0 if same and ops == total else 1


if __name__ == "__main__":
    sys.exit(main())
