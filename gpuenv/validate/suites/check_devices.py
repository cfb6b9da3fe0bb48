"""Checks that need a GPU: run with `gpuenv validate --gpus all` on a GPU host. Elsewhere
they are skipped with the reason (never faked)."""

from __future__ import annotations

from conftest import Box

GPU_ONLY = True
QUIET = "import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"


def _requested(gpu_box: Box) -> int:
    request = gpu_box.target["gpus"]
    if request["DeviceIDs"]:
        return len(request["DeviceIDs"])
    if request["Count"] == -1:
        return len(gpu_box.sh("nvidia-smi -L").stdout.strip().splitlines())
    return int(request["Count"])


def test_nvidia_smi_works(gpu_box: Box) -> None:
    result = gpu_box.sh("nvidia-smi -L")
    assert result.rc == 0 and "GPU 0" in result.stdout, result.stderr


def test_tensorflow_sees_the_requested_gpus(gpu_box: Box) -> None:
    code = QUIET + "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    assert int(gpu_box.python(code).strip().splitlines()[-1]) == _requested(gpu_box)


def test_matmul_runs_on_gpu0(gpu_box: Box) -> None:
    code = QUIET + (
        "import tensorflow as tf\n"
        "with tf.device('/GPU:0'):\n"
        "    x = tf.linalg.matmul(tf.ones([64, 64]), tf.ones([64, 64]))\n"
        "print(x.device)"
    )
    assert "GPU:0" in gpu_box.python(code).strip().splitlines()[-1]


def test_cudnn_lstm_runs(gpu_box: Box) -> None:
    code = QUIET + (
        "import numpy as np, tensorflow as tf\n"
        "layer = tf.keras.layers.LSTM(16)\n"
        "with tf.device('/GPU:0'):\n"
        "    y = layer(np.ones((4, 10, 8), 'float32'))\n"
        "print(y.shape, y.device)"
    )
    last = gpu_box.python(code).strip().splitlines()[-1]
    assert "(4, 16)" in last and "GPU:0" in last


def test_gpu_compute_capability_runs_the_framework(gpu_box: Box) -> None:
    """A GPU the framework's wheel has no kernels for fails at run time with "no kernel image
    is available"; one it reaches only by PTX JIT is slower to start (gpuenv/capability.py)."""
    from gpuenv.capability import gpu_verdict
    from gpuenv.gpus import parse_nvidia_smi_query

    query = "nvidia-smi --query-gpu=driver_version,name,compute_cap --format=csv,noheader"
    result = gpu_box.sh(query)
    assert result.rc == 0, result.stderr
    gpus = parse_nvidia_smi_query(result.stdout)
    assert gpus, f"nvidia-smi listed no GPU: {result.stdout!r}"
    expected = gpu_box.expected
    verdict = gpu_verdict(gpus, expected["framework"], expected["framework_version"])
    assert verdict.level != "error", verdict.message


ALL_REDUCE = QUIET + (
    "import json, tensorflow as tf\n"
    "gpus = [d.name for d in tf.config.list_logical_devices('GPU')]\n"
    "strategy = tf.distribute.MirroredStrategy(\n"
    "    gpus, cross_device_ops=tf.distribute.NcclAllReduce())\n"
    "values = strategy.experimental_distribute_values_from_function(\n"
    "    lambda ctx: tf.fill([1024], float(ctx.replica_id_in_sync_group + 1)))\n"
    "summed = strategy.run(\n"
    "    lambda v: tf.distribute.get_replica_context().all_reduce('SUM', v), args=(values,))\n"
    "local = strategy.experimental_local_results(summed)\n"
    "print(json.dumps({'replicas': strategy.num_replicas_in_sync,\n"
    "                  'sums': [float(t[0]) for t in local],\n"
    "                  'devices': [t.device for t in local]}))"
)


def test_all_reduce_across_the_requested_gpus(gpu_box: Box) -> None:
    """`validate --gpus N` (N > 1, or all): an NCCL all-reduce through
    tf.distribute.MirroredStrategy across every requested GPU; each replica must hold the
    sum 1 + 2 + ... + N. This is what multi-GPU training does every step."""
    import pytest

    n = _requested(gpu_box)
    if n < 2:
        pytest.skip(f"{n} GPU requested: no collective across GPUs to check (--gpus 2 or all)")
    doc = gpu_box.python_json(ALL_REDUCE)
    assert doc["replicas"] == n, doc
    assert doc["sums"] == [n * (n + 1) / 2] * n, doc
    assert all("GPU" in d for d in doc["devices"]), doc
