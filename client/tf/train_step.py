"""The training step Baechi profiles and pins: forward, loss, gradients, optimizer update.

:func:`make_train_step` builds it as a plain Python function; tracing it with ``tf.function``
gives the graph :func:`client.profile` measures, and tracing it again under a plan's device
function gives the placed step. Op names match between the two traces (and, for the model, the
gradients and the optimizer, with Keras's own ``model.fit`` step), which is how a plan's op
names find their ops again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from baechi.client.errors import ProfileError

#: Name scope of the loss, as Keras's ``compile_loss`` uses, so ``model.fit`` names match.
LOSS_SCOPE = "compile_loss"


def resolve_loss(loss: Any) -> Callable[..., Any]:
    """A Keras loss (averaged over the batch) from a loss object, a function or a name."""
    import keras

    try:
        resolved = keras.losses.get(loss)
    except (ValueError, TypeError) as exc:
        raise ProfileError(f"loss: cannot use {loss!r} as a Keras loss: {exc}") from None
    if not callable(resolved):
        raise ProfileError(f"loss: {loss!r} is not callable")
    if not isinstance(resolved, keras.losses.Loss):
        # A bare function returns one value per sample: average it as Keras's compile does.
        resolved = _mean_loss(resolved)
    return resolved


def _mean_loss(fn: Callable[..., Any]) -> Any:
    """``fn(y_true, y_pred)`` as a Keras loss averaged over the batch."""
    import keras

    class FunctionLoss(keras.losses.Loss):
        def call(self, y_true: Any, y_pred: Any) -> Any:
            return fn(y_true, y_pred)

    return FunctionLoss(name=getattr(fn, "__name__", None), reduction="sum_over_batch_size")


def resolve_optimizer(optimizer: Any) -> Any:
    """A Keras optimizer from an optimizer object or a name like ``"adam"``."""
    import keras

    try:
        return keras.optimizers.get(optimizer)
    except (ValueError, TypeError) as exc:
        raise ProfileError(f"optimizer: cannot use {optimizer!r}: {exc}") from None


def prepare(model: Any, optimizer: Any, x: Any) -> None:
    """Build the model (one forward pass when needed) and the optimizer's slot variables.

    Variables must exist before the step is traced: a traced step captures them.
    """
    if not getattr(model, "built", False) or not model.trainable_variables:
        try:
            model(x, training=False)
        except Exception as exc:
            raise ProfileError(f"model: calling it on x failed: {exc}") from exc
    if not model.trainable_variables:
        raise ProfileError("model: it has no trainable variables, so there is no training step")
    if not getattr(optimizer, "built", False):
        optimizer.build(model.trainable_variables)


def make_train_step(model: Any, loss: Any, optimizer: Any) -> Callable[[Any, Any], Any]:
    """The training step ``step(x, y) -> loss value`` (not yet a ``tf.function``).

    It is the step a custom training loop writes: forward pass with ``training=True``, the loss
    plus the model's regularisation losses, gradients by ``tf.GradientTape``, and
    ``optimizer.apply_gradients``.
    """
    import tensorflow as tf

    loss_fn = resolve_loss(loss)

    def train_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            with tf.name_scope(LOSS_SCOPE):
                value = loss_fn(y, y_pred)
                if model.losses:
                    value = value + tf.add_n(model.losses)
        variables = model.trainable_variables
        gradients = tape.gradient(value, variables)
        optimizer.apply_gradients(zip(gradients, variables, strict=True))
        return value

    return train_step


#: Prefix of the input placeholders' names in a profiled graph.
INPUT_PREFIX = "baechi_input_"


def input_signature(x: Any, y: Any) -> tuple[Any, Any]:
    """``tf.TensorSpec`` structures for ``x`` and ``y`` (fixed shapes: the profiled batch).

    The placeholders are named ``baechi_input_<i>``: names no op of a real step has.
    """
    import tensorflow as tf

    count = iter(range(1 << 30))

    def spec(value: Any) -> Any:
        tensor = tf.convert_to_tensor(value)
        return tf.TensorSpec(tensor.shape, tensor.dtype, name=f"{INPUT_PREFIX}{next(count)}")

    return tf.nest.map_structure(spec, x), tf.nest.map_structure(spec, y)


__all__ = ["INPUT_PREFIX", "LOSS_SCOPE", "input_signature", "make_train_step", "prepare",
           "resolve_loss", "resolve_optimizer"]
