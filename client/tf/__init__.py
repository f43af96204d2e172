"""TensorFlow in the client: profile a Keras model's training step, apply a plan to it.

The same story as PyTorch's (:mod:`baechi.client.torch`), with the same ``apply_plan`` shape::

    from baechi.client import tf as baechi_tf
    graph = baechi_tf.profile(model, x, y, loss, optimizer)
    applied = baechi_tf.apply_plan(model, plan)     # variables moved, ops pinned, in place
    model.fit(x, y)

TensorFlow is imported when these are called, not on import.
"""

from baechi.client import apply_plan, measure, profile

__all__ = ["apply_plan", "measure", "profile"]
