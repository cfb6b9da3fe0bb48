"""Train a small dense classifier on MNIST-shaped data for one epoch (written for gpuenv's
tests; synthetic digits, since a container run has no network to download MNIST)."""

import numpy as np
import tensorflow as tf

rng = np.random.default_rng(0)
x = rng.random((512, 28, 28), dtype=np.float32)
y = (x.reshape(512, -1).mean(axis=1) > 0.5).astype("int64")  # a learnable label

model = tf.keras.Sequential(
    [
        tf.keras.Input((28, 28)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10),
    ]
)
model.compile(
    optimizer="adam",
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
history = model.fit(x, y, epochs=1, batch_size=64, verbose=0)
print(
    f"trained 1 epoch on {tf.config.list_physical_devices()[0].device_type}: "
    f"accuracy {history.history['accuracy'][-1]:.3f}"
)
