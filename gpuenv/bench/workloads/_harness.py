"""What every benchmark workload shares. Runs inside the image (or a host virtualenv with the
same TensorFlow): standard library + TensorFlow only, no gpuenv.

A workload prints exactly one JSON line on stdout, its result, or {"error": ...} and exits 3.
Step times are wall-clock times between the ends of consecutive training steps, each step
synchronised by reading its loss back (as Keras' progress bar does, which is where the seed's
"ms/step" comes from); the first --warmup steps (tracing, XLA/cuDNN autotuning, allocator
growth) are excluded and the median of the rest is reported.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(description: str, **defaults: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full dataset")
    parser.add_argument("--warmup", type=int, default=defaults.get("warmup", 5))
    parser.add_argument("--seed", type=int, default=0)
    for name, value in defaults.items():
        if name != "warmup":
            parser.add_argument(f"--{name}", type=type(value), default=value)
    args = parser.parse_args()
    if not 0 < args.scale <= 1:
        fail("--scale must be in (0, 1]")
    return args


def emit(result: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


def fail(message: str) -> None:
    emit({"error": message})
    sys.exit(3)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def setup(device: str, seed: int) -> tuple[Any, str]:
    """TensorFlow on the requested device, seeded; (tf, a description of the device).
    A GPU run without a GPU fails: a GPU row is never measured on the CPU."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if device == "gpu":
        if not gpus:
            fail("TensorFlow sees no GPU in this container (was --gpus given?)")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        details = tf.config.experimental.get_device_details(gpus[0])
        cc = ".".join(str(p) for p in details.get("compute_capability", ()) or ())
        what = f"GPU: {details.get('device_name', gpus[0].name)}" + (f" (cc {cc})" if cc else "")
        if len(gpus) > 1:
            what += f", 1 of {len(gpus)}"
    else:
        if gpus:
            tf.config.set_visible_devices([], "GPU")
        what = f"CPU: {cpu_name()}, {os.cpu_count()} threads"
    import keras

    keras.utils.set_random_seed(seed)
    return tf, what


def step_timer(keras: Any) -> Any:
    class StepTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.ends: list[float] = []
            self.start = 0.0

        def on_train_begin(self, logs: Any = None) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if logs and "loss" in logs:
                float(logs["loss"])  # wait for the step to finish
            self.ends.append(time.perf_counter())

        def step_ms(self) -> list[float]:
            marks = [self.start, *self.ends]
            return [(b - a) * 1000 for a, b in itertools.pairwise(marks)]

    return StepTimer()


def result(
    workload: str,
    device: str,
    what: str,
    step_ms: list[float],
    warmup: int,
    full_steps: int,
    tf: Any,
    **extra: Any,
) -> dict[str, Any]:
    measured = step_ms[warmup:]
    if len(measured) < 3:
        fail(f"only {len(measured)} steps after {warmup} warm-up steps: raise --scale")
    median = statistics.median(measured)
    return {
        "workload": workload,
        "device_kind": device,
        "device": what,
        "framework": f"tensorflow {tf.__version__}",
        "python": platform.python_version(),
        "ms_per_step": round(median, 3),
        "ms_per_step_p10": round(_quantile(measured, 0.1), 3),
        "ms_per_step_p90": round(_quantile(measured, 0.9), 3),
        "steps": len(step_ms),
        "warmup_steps": warmup,
        "measured_steps": len(measured),
        "measured_s": round(sum(step_ms) / 1000, 3),
        "full_epoch_steps": full_steps,
        # The full dataset's epoch at the median step time (the seed's "epoch time").
        "epoch_s": round(median * full_steps / 1000, 2),
        **extra,
    }


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
