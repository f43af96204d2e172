"""Small example models (with a batch, a loss and an optimizer) to profile and place.

Used by ``baechi profile``, ``examples/keras_end_to_end.py`` and the tests. Everything is
seeded, so two calls build the same weights and the same batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Example:
    """A model factory with a matching batch, loss and optimizer."""

    name: str
    description: str
    build: Callable[[], Any]
    batch: Callable[[int, int], tuple[Any, Any]]
    loss: Callable[[], Any]
    default_batch: int

    def make(self, batch: int | None = None, seed: int = 0) -> tuple[Any, Any, Any, Any, Any]:
        """``(model, x, y, loss, optimizer)``, seeded."""
        import keras

        keras.utils.set_random_seed(seed)
        model = self.build()
        x, y = self.batch(batch or self.default_batch, seed)
        return model, x, y, self.loss(), keras.optimizers.Adam(1e-3)


def small_cnn(input_shape: tuple[int, int, int] = (16, 16, 3), classes: int = 10) -> Any:
    """Two convolution blocks (conv, batch norm, ReLU, pooling), then a dense classifier."""
    import keras
    from keras import layers

    return keras.Sequential(
        [
            keras.Input(input_shape),
            layers.Conv2D(16, 3, padding="same", name="conv1"),
            layers.BatchNormalization(name="bn1"),
            layers.ReLU(name="relu1"),
            layers.MaxPooling2D(name="pool1"),
            layers.Conv2D(32, 3, padding="same", name="conv2"),
            layers.BatchNormalization(name="bn2"),
            layers.ReLU(name="relu2"),
            layers.GlobalAveragePooling2D(name="gap"),
            layers.Dense(64, activation="relu", name="fc1"),
            layers.Dense(classes, name="logits"),
        ],
        name="small_cnn",
    )


def small_lstm(timesteps: int = 8, features: int = 8, units: int = 16, outputs: int = 4) -> Any:
    """Two stacked LSTMs and a dense regression head."""
    import keras
    from keras import layers

    return keras.Sequential(
        [
            keras.Input((timesteps, features)),
            layers.LSTM(units, return_sequences=True, name="lstm1"),
            layers.LSTM(units, name="lstm2"),
            layers.Dense(outputs, name="head"),
        ],
        name="small_lstm",
    )


def resnet50(input_shape: tuple[int, int, int] = (32, 32, 3), classes: int = 10) -> Any:
    """Keras's ResNet-50, randomly initialised, for small images."""
    import keras

    return keras.applications.ResNet50(weights=None, input_shape=input_shape, classes=classes)


def _images(shape: tuple[int, int, int], classes: int) -> Callable[[int, int], tuple[Any, Any]]:
    def batch(size: int, seed: int) -> tuple[Any, Any]:
        import numpy as np

        rng = np.random.default_rng(seed)
        x = rng.random((size, *shape), dtype=np.float32)
        y = rng.integers(0, classes, size=(size,)).astype(np.int32)
        return x, y

    return batch


def _sequences(size: int, seed: int) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((size, 8, 8), dtype=np.float32)
    y = rng.standard_normal((size, 4), dtype=np.float32)
    return x, y


def _classification() -> Any:
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _regression() -> Any:
    import keras

    return keras.losses.MeanSquaredError()


def _softmax_classification() -> Any:
    import keras

    return keras.losses.SparseCategoricalCrossentropy()


#: The bundled examples by name.
EXAMPLES: dict[str, Example] = {
    "cnn": Example("cnn", "small CNN on 16x16 RGB images, 10 classes", small_cnn,
                   _images((16, 16, 3), 10), _classification, 8),
    "lstm": Example("lstm", "two-layer LSTM on sequences of 8 steps", small_lstm,
                    _sequences, _regression, 8),
    "resnet50": Example("resnet50", "ResNet-50 (random weights) on 32x32 RGB images",
                        resnet50, _images((32, 32, 3), 10), _softmax_classification, 2),
}


__all__ = ["EXAMPLES", "Example", "resnet50", "small_cnn", "small_lstm"]
