"""What the suites run inside an image, per framework: the Python each check executes and
what it must print. One table, so a check reads the same for TensorFlow, PyTorch and JAX
and only the code differs. (Not collected: pytest.ini collects check_*.py only.)"""

from __future__ import annotations

from dataclasses import dataclass

QUIET_TF = "import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"


@dataclass(frozen=True)
class Code:
    name: str  # how messages call it
    cpu_matmul: str  # prints the sum of ones(8, 8) @ ones(8, 8) computed on the CPU: 512.0
    gpu_count: str  # prints how many GPUs the framework sees
    gpu_matmul: str  # prints the device a 64x64 matmul ran on, as "gpu:0" when on GPU 0
    cudnn_op: str  # prints "<shape> gpu:0" for an op that goes through cuDNN on GPU 0
    cudnn_shape: str
    all_reduce: str  # prints {"replicas", "sums", "devices"} of a SUM across every GPU


TENSORFLOW = Code(
    name="TensorFlow",
    cpu_matmul=QUIET_TF
    + (
        "import tensorflow as tf\n"
        "with tf.device('/CPU:0'):\n"
        "    x = tf.linalg.matmul(tf.ones([8, 8]), tf.ones([8, 8]))\n"
        "print(float(tf.reduce_sum(x)))"
    ),
    gpu_count=QUIET_TF
    + "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))",
    gpu_matmul=QUIET_TF
    + (
        "import tensorflow as tf\n"
        "with tf.device('/GPU:0'):\n"
        "    x = tf.linalg.matmul(tf.ones([64, 64]), tf.ones([64, 64]))\n"
        "print('gpu:0' if x.device.endswith('GPU:0') else x.device)"
    ),
    # Keras' LSTM takes cuDNN's kernel on a GPU.
    cudnn_op=QUIET_TF
    + (
        "import numpy as np, tensorflow as tf\n"
        "layer = tf.keras.layers.LSTM(16)\n"
        "with tf.device('/GPU:0'):\n"
        "    y = layer(np.ones((4, 10, 8), 'float32'))\n"
        "print(tuple(y.shape), 'gpu:0' if y.device.endswith('GPU:0') else y.device)"
    ),
    cudnn_shape="(4, 16)",
    all_reduce=QUIET_TF
    + (
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
    ),
)

TORCH = Code(
    name="PyTorch",
    cpu_matmul=(
        "import torch\n"
        "x = torch.ones(8, 8, device='cpu') @ torch.ones(8, 8, device='cpu')\n"
        "print(float(x.sum()))"
    ),
    gpu_count="import torch; print(torch.cuda.device_count())",
    gpu_matmul=(
        "import torch\n"
        "x = torch.ones(64, 64, device='cuda:0') @ torch.ones(64, 64, device='cuda:0')\n"
        "torch.cuda.synchronize()\n"
        "assert float(x.sum()) == 64.0 ** 3, float(x.sum())\n"
        "print('gpu:0' if str(x.device) == 'cuda:0' else x.device)"
    ),
    # A 2-D convolution with cuDNN enabled (and required to be there).
    cudnn_op=(
        "import torch\n"
        "assert torch.backends.cudnn.is_available(), 'cuDNN is not available to torch'\n"
        "torch.backends.cudnn.enabled = True\n"
        "conv = torch.nn.Conv2d(3, 8, 3).to('cuda:0')\n"
        "y = conv(torch.ones(2, 3, 16, 16, device='cuda:0'))\n"
        "torch.cuda.synchronize()\n"
        "print(tuple(y.shape), 'gpu:0' if str(y.device) == 'cuda:0' else y.device)"
    ),
    cudnn_shape="(2, 8, 14, 14)",
    # NCCL's all-reduce across every GPU from one process (torch.cuda.nccl).
    all_reduce=(
        "import json, torch, torch.cuda.nccl as nccl\n"
        "n = torch.cuda.device_count()\n"
        "xs = [torch.full((1024,), float(i + 1), device=f'cuda:{i}') for i in range(n)]\n"
        "nccl.all_reduce(xs)\n"
        "torch.cuda.synchronize()\n"
        "print(json.dumps({'replicas': n, 'sums': [float(x[0]) for x in xs],\n"
        "                  'devices': ['GPU:%d' % x.device.index for x in xs]}))"
    ),
)

JAX = Code(
    name="JAX",
    cpu_matmul=(
        "import jax, jax.numpy as jnp\n"
        "with jax.default_device(jax.devices('cpu')[0]):\n"
        "    x = jnp.ones((8, 8)) @ jnp.ones((8, 8))\n"
        "print(float(x.sum()))"
    ),
    gpu_count="import jax; print(len(jax.devices('gpu')))",
    gpu_matmul=(
        "import jax, jax.numpy as jnp\n"
        "d = jax.devices('gpu')[0]\n"
        "x = jax.device_put(jnp.ones((64, 64)), d)\n"
        "y = (x @ x).block_until_ready()\n"
        "(dev,) = y.devices()\n"
        "assert float(y.sum()) == 64.0 ** 3, float(y.sum())\n"
        "print(f'{dev.platform}:{dev.id}')"
    ),
    # XLA lowers convolutions on NVIDIA GPUs to cuDNN.
    cudnn_op=(
        "import jax, jax.numpy as jnp\n"
        "d = jax.devices('gpu')[0]\n"
        "x = jax.device_put(jnp.ones((2, 3, 16, 16)), d)\n"
        "w = jax.device_put(jnp.ones((8, 3, 3, 3)), d)\n"
        "y = jax.lax.conv(x, w, (1, 1), 'VALID').block_until_ready()\n"
        "(dev,) = y.devices()\n"
        "print(tuple(y.shape), f'{dev.platform}:{dev.id}')"
    ),
    cudnn_shape="(2, 8, 14, 14)",
    all_reduce=(
        "import json, jax, jax.numpy as jnp\n"
        "gpus = jax.devices('gpu')\n"
        "n = len(gpus)\n"
        "xs = jnp.stack([jnp.full((1024,), float(i + 1)) for i in range(n)])\n"
        "out = jax.pmap(lambda x: jax.lax.psum(x, 'i'), axis_name='i', devices=gpus)(xs)\n"
        "print(json.dumps({'replicas': n, 'sums': [float(row[0]) for row in out],\n"
        "                  'devices': ['GPU:%d' % s.device.id for s in out.addressable_shards]}))"
    ),
)

CODE = {"tensorflow": TENSORFLOW, "torch": TORCH, "jax": JAX}

# The CUDA libraries each framework opens by soname, keyed by the pinned wheel that ships
# them: (directory under site-packages/nvidia/, soname). CUDA 12 wheels have a directory
# each; CUDA 13's toolkit wheels share nvidia/cu13/.
_CU12 = {
    "nvidia-cuda-runtime-cu12": ("cuda_runtime", "libcudart.so.12"),
    "nvidia-cublas-cu12": ("cublas", "libcublas.so.12"),
    "nvidia-cufft-cu12": ("cufft", "libcufft.so.11"),
    "nvidia-curand-cu12": ("curand", "libcurand.so.10"),
    "nvidia-cusolver-cu12": ("cusolver", "libcusolver.so.11"),
    "nvidia-cusparse-cu12": ("cusparse", "libcusparse.so.12"),
    "nvidia-nccl-cu12": ("nccl", "libnccl.so.2"),
    "nvidia-nvjitlink-cu12": ("nvjitlink", "libnvJitLink.so.12"),
}
_CU13 = {
    "nvidia-cuda-runtime": ("cu13", "libcudart.so.13"),
    "nvidia-cublas": ("cu13", "libcublas.so.13"),
    "nvidia-cufft": ("cu13", "libcufft.so.12"),
    "nvidia-curand": ("cu13", "libcurand.so.10"),
    "nvidia-cusolver": ("cu13", "libcusolver.so.12"),
    "nvidia-cusparse": ("cu13", "libcusparse.so.12"),
    "nvidia-nccl-cu13": ("nccl", "libnccl.so.2"),
    "nvidia-nvjitlink": ("cu13", "libnvJitLink.so.13"),
}


def cuda_loads(expected: dict) -> dict[str, tuple[str, str]]:
    """wheel -> (directory, soname) of every library the cell's pinned wheels must let the
    framework open, cuDNN included."""
    major = str(expected["cuda"]).split(".")[0]
    table = _CU13 if major == "13" else _CU12
    wheels = expected["wheels"]
    loads = {w: where for w, where in table.items() if w in wheels}
    cudnn = f"nvidia-cudnn-cu{major}"
    loads[cudnn] = ("cudnn", f"libcudnn.so.{str(expected['cudnn']).split('.')[0]}")
    return loads


def cudart(expected: dict) -> str:
    return f"libcudart.so.{str(expected['cuda']).split('.')[0]}"


def nvcc_wheel(expected: dict) -> str | None:
    for name in ("nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc"):
        if name in expected["wheels"]:
            return name
    return None


def base_version(version: str) -> str:
    """2.9.1+cpu -> 2.9.1 (the label names the release; the local part is the build)."""
    return version.split("+", 1)[0]
