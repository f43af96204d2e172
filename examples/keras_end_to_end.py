"""Profile a small Keras model, place it, pin it onto 4 devices, and train it.

    python examples/keras_end_to_end.py                          # embedded engine
    python examples/keras_end_to_end.py --server http://localhost:8000 --api-key key-a

Without a GPU the CPU is split into 4 logical devices that stand in for 4 GPUs. The script
prints the plan's predicted step time next to the measured one, and how many planned ops ran
on their planned device. It needs TensorFlow (the ``tf`` extra) and runs in well under a
minute on a laptop CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # same numbers placed and unplaced
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default=os.environ.get("BAECHI_URL"),
                        help="Baechi service URL (default: place in-process)")
    parser.add_argument("--api-key", default=os.environ.get("BAECHI_API_KEY"))
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--algorithm", default=None, help="default m-etf (or single)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20, help="timed training steps")
    args = parser.parse_args(argv)

    import tensorflow as tf

    from baechi import client
    from baechi.client.tf.devices import local_devices, split_cpu

    if not tf.config.list_physical_devices("GPU"):
        split_cpu(args.devices)
    kind, local = local_devices()
    print(f"devices: {len(local)} local {kind} device(s) stand for /GPU:0..{len(local) - 1}")

    from baechi.algorithms import ALGORITHMS
    from baechi.examples.keras_models import EXAMPLES

    model, x, y, loss, optimizer = EXAMPLES["cnn"].make(args.batch)
    model.compile(optimizer=optimizer, loss=loss)

    # 1. Profile one training step.
    started = time.perf_counter()
    graph = client.profile(model, x, y, loss, optimizer, steps=5)
    print(f"profile: {len(graph['ops'])} ops, {len(graph['edges'])} edges, "
          f"{graph['meta']['measured_fraction']:.1%} timed, {time.perf_counter() - started:.1f} s")

    # 2. Place it: through the service, or with the embedded engine.
    algorithm = args.algorithm or ("m-etf" if "m-etf" in ALGORITHMS else "single")
    cluster = {"devices": {"count": len(local)},
               "network": {"latency_us": 20, "bandwidth_gbps": 10}}
    started = time.perf_counter()
    if args.server:
        with client.BaechiClient(args.server, args.api_key) as service:
            plan = service.submit(graph, cluster, algorithm).wait()
        where = f"service {args.server}"
    else:
        import baechi

        plan = baechi.place(graph, cluster, algorithm)
        where = "embedded engine"
    used = sorted(set(plan.placement.values()))
    print(f"place ({algorithm}, {where}): {len(used)} device(s) used, "
          f"{time.perf_counter() - started:.1f} s")

    # 3. Pin the model onto the local devices, 4. train.
    applied = client.apply_plan(model, plan)
    step = applied.train_step(loss)
    with applied.check() as report:
        first = float(step(x, y))
    times = []
    for _ in range(args.steps):
        tick = time.perf_counter()
        value = float(step(x, y))
        times.append((time.perf_counter() - tick) * 1e6)
    history = model.fit(x, y, batch_size=args.batch // 4, epochs=1, verbose=0)

    estimate = plan.estimate
    measured = statistics.median(times)
    print(f"placement: {report.on_planned_device}/{report.planned} planned ops on their planned "
          f"device ({report.fraction:.1%}), {report.variables_on_planned_device}/"
          f"{report.variables} variables")
    print(f"training: loss {first:.4f} -> {value:.4f} (custom loop), "
          f"{history.history['loss'][-1]:.4f} (model.fit)")
    print(f"step time: predicted {estimate.step_time_us / 1000:.3f} ms "
          f"(single device {estimate.single_device_us / 1000:.3f} ms), "
          f"measured {measured / 1000:.3f} ms (median of {args.steps} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
