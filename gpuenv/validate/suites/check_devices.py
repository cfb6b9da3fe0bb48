"""Checks that need a GPU: run with `gpuenv validate --gpus all` on a GPU host. Elsewhere
they are skipped with the reason (never faked)."""

from __future__ import annotations

from conftest import Box
from framework_code import CODE

GPU_ONLY = True


def _requested(gpu_box: Box) -> int:
    request = gpu_box.target["gpus"]
    if request["DeviceIDs"]:
        return len(request["DeviceIDs"])
    if request["Count"] == -1:
        # Every GPU: as many as the container lists. None listed is a failure, never "0 GPUs
        # asked for" (a check that then skips would pass a container without GPUs).
        listed = gpu_box.sh("nvidia-smi -L")
        gpus = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]
        assert listed.rc == 0 and gpus, (
            f"--gpus all, but nvidia-smi -L lists no GPU (exit {listed.rc}): "
            f"{(listed.stderr or listed.stdout).strip()[:200]}"
        )
        return len(gpus)
    return int(request["Count"])


def test_nvidia_smi_works(gpu_box: Box) -> None:
    result = gpu_box.sh("nvidia-smi -L")
    assert result.rc == 0 and "GPU 0" in result.stdout, result.stderr


def test_framework_sees_the_requested_gpus(gpu_box: Box) -> None:
    code = CODE[gpu_box.expected["framework"]]
    found = int(gpu_box.python(code.gpu_count).strip().splitlines()[-1])
    assert found == _requested(gpu_box), f"{code.name} sees {found} GPU(s)"


def test_matmul_runs_on_gpu0(gpu_box: Box) -> None:
    code = CODE[gpu_box.expected["framework"]]
    last = gpu_box.python(code.gpu_matmul).strip().splitlines()[-1]
    assert last == "gpu:0", f"{code.name}'s matmul ran on {last}"


def test_cudnn_op_runs(gpu_box: Box) -> None:
    """An op that goes through cuDNN on GPU 0: Keras' LSTM for TensorFlow, a 2-D convolution
    for PyTorch (cuDNN required) and for JAX (XLA lowers it to cuDNN)."""
    code = CODE[gpu_box.expected["framework"]]
    last = gpu_box.python(code.cudnn_op).strip().splitlines()[-1]
    assert last == f"{code.cudnn_shape} gpu:0", f"{code.name}: {last}"


def test_gpu_compute_capability_runs_the_framework(gpu_box: Box) -> None:
    """A GPU the framework's wheel has no kernels for fails at run time with "no kernel image
    is available"; one it reaches only by PTX JIT is slower to start (gpuenv/gpu/capability.py)."""
    from gpuenv.gpu.capability import gpu_verdict
    from gpuenv.gpu.gpus import parse_nvidia_smi_query

    query = "nvidia-smi --query-gpu=driver_version,name,compute_cap --format=csv,noheader"
    result = gpu_box.sh(query)
    assert result.rc == 0, result.stderr
    gpus = parse_nvidia_smi_query(result.stdout)
    assert gpus, f"nvidia-smi listed no GPU: {result.stdout!r}"
    expected = gpu_box.expected
    verdict = gpu_verdict(gpus, expected["framework"], expected["framework_version"])
    assert verdict.level != "error", verdict.message


def test_all_reduce_across_the_requested_gpus(gpu_box: Box) -> None:
    """`validate --gpus N` (N > 1, or all): an all-reduce across every requested GPU (NCCL
    through tf.distribute.MirroredStrategy, torch.cuda.nccl, or JAX's psum); each replica
    must hold the sum 1 + 2 + ... + N. This is what multi-GPU training does every step."""
    import pytest

    n = _requested(gpu_box)
    if n < 2:
        pytest.skip(f"{n} GPU requested: no collective across GPUs to check (--gpus 2 or all)")
    doc = gpu_box.python_json(CODE[gpu_box.expected["framework"]].all_reduce)
    assert doc["replicas"] == n, doc
    assert doc["sums"] == [n * (n + 1) / 2] * n, doc
    assert all("GPU" in d for d in doc["devices"]), doc
