"""A small Keras model on synthetic data: the sample workload `gpuenv run` is shown with.

It prints the devices TensorFlow sees, so a GPU image that silently trains on the CPU is
obvious, and trains an LSTM (the layer with a cuDNN fast path) for a few epochs.
"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf


def main() -> None:
    gpus = tf.config.list_physical_devices("GPU")
    print(f"TensorFlow {tf.__version__}; GPUs visible: {len(gpus)} {[g.name for g in gpus]}")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 20, 8)).astype("float32")
    y = (x.sum(axis=(1, 2)) > 0).astype("float32")
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(20, 8)),
            tf.keras.layers.LSTM(32),
            tf.keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    start = time.perf_counter()
    history = model.fit(x, y, epochs=int(os.environ.get("EPOCHS", "3")), batch_size=64, verbose=2)
    elapsed = time.perf_counter() - start
    accuracy = history.history["accuracy"][-1]
    print(f"trained in {elapsed:.1f} s on {'GPU' if gpus else 'CPU'}; accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
