"""The seed's IMDB LSTM (Keras' imdb_lstm.py shape), on synthetic data: 25000 reviews of 80
tokens over a 20000-word vocabulary, Embedding(128) -> LSTM(128) -> Dense(1), batch 32,
Adam, binary cross-entropy. One epoch (scaled by --scale).

--cudnn: the cuDNN-eligible configuration (no recurrent dropout, Keras' default activations,
use_cudnn=True so Keras refuses rather than silently falling back); GPU only. Without it:
the seed's dropout=0.2, recurrent_dropout=0.2, which rules cuDNN out (the seed's "GPU" row).
"""

from __future__ import annotations

import math

from _harness import emit, fail, parse_args, result, setup, step_timer

SAMPLES, MAXLEN, VOCAB, BATCH = 25000, 80, 20000, 32


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], cudnn=0)
    if args.cudnn and args.device != "gpu":
        fail("the cuDNN LSTM kernel needs a GPU")
    tf, what = setup(args.device, args.seed)
    import keras
    import numpy as np

    n = max(round(SAMPLES * args.scale), (args.warmup + 5) * BATCH)
    rng = np.random.default_rng(args.seed)
    x = rng.integers(1, VOCAB, size=(n, MAXLEN), dtype=np.int32)
    y = rng.integers(0, 2, size=(n, 1)).astype(np.float32)
    if args.cudnn:
        lstm = keras.layers.LSTM(128, dropout=0.2, use_cudnn=True)
    else:
        lstm = keras.layers.LSTM(128, dropout=0.2, recurrent_dropout=0.2)
    model = keras.Sequential(
        [
            keras.Input((MAXLEN,)),
            keras.layers.Embedding(VOCAB, 128),
            lstm,
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    timer = step_timer(keras)
    device = "/GPU:0" if args.device == "gpu" else "/CPU:0"
    with tf.device(device):
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[timer])
    emit(
        result(
            "lstm-cudnn" if args.cudnn else "lstm",
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
