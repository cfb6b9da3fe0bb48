"""Matrix multiplication throughput: C = A @ B for SIZE x SIZE float32 matrices, each product
synchronised; ms per product and TFLOP/s (2 * SIZE^3 per product). On Ampere and newer GPUs
TensorFlow computes float32 matmuls in TF32 unless told otherwise (reported)."""

from __future__ import annotations

import time

from _harness import emit, parse_args, result, setup

FULL_ITERATIONS = 50


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], warmup=2, size=2048)
    tf, what = setup(args.device, args.seed)
    iterations = max(round(FULL_ITERATIONS * args.scale), 5) + args.warmup
    device = "/GPU:0" if args.device == "gpu" else "/CPU:0"
    sync = getattr(tf.test.experimental, "sync_devices", None) if args.device == "gpu" else None
    with tf.device(device):
        a = tf.random.stateless_uniform((args.size, args.size), seed=(args.seed, 1))
        b = tf.random.stateless_uniform((args.size, args.size), seed=(args.seed, 2))
        step_ms = []
        for _ in range(iterations):
            start = time.perf_counter()
            c = tf.linalg.matmul(a, b)
            if sync is not None:
                sync()
            else:
                c.numpy()  # the CPU's result is ready when it can be read
            step_ms.append((time.perf_counter() - start) * 1000)
    out = result("matmul", args.device, what, step_ms, args.warmup, 0, tf, size=args.size)
    out["tflops"] = round(2 * args.size**3 / (out["ms_per_step"] / 1000) / 1e12, 4)
    out["epoch_s"] = None
    if args.device == "gpu":
        out["tf32"] = bool(tf.config.experimental.tensor_float_32_execution_enabled())
    emit(out)


if __name__ == "__main__":
    main()
