"""A small CNN on synthetic CIFAR-10-shaped data: 50000 images of 32x32x3, 10 classes,
Conv(32)-Conv(32)-Pool-Conv(64)-Pool-Dense(128)-Dense(10), batch 64, Adam. One epoch (scaled
by --scale)."""

from __future__ import annotations

import math

from _harness import emit, parse_args, result, setup, step_timer

SAMPLES, BATCH = 50000, 64


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    tf, what = setup(args.device, args.seed)
    import keras
    import numpy as np

    n = max(round(SAMPLES * args.scale), (args.warmup + 5) * BATCH)
    rng = np.random.default_rng(args.seed)
    x = rng.random((n, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, size=(n,), dtype=np.int32)
    layers = keras.layers
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            layers.Conv2D(32, 3, activation="relu", padding="same"),
            layers.Conv2D(32, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dense(10),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    timer = step_timer(keras)
    with tf.device("/GPU:0" if args.device == "gpu" else "/CPU:0"):
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[timer])
    emit(
        result(
            "cnn",
            args.device,
            what,
            timer.step_ms(),
            args.warmup,
            math.ceil(SAMPLES / BATCH),
            tf,
            samples=n,
            batch=BATCH,
        )
    )


if __name__ == "__main__":
    main()
