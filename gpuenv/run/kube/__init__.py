"""`gpuenv kube run`: the same workload as a Kubernetes Job.

- `manifest.py`: the Job, generated (pure) from the cell, its pushed image and the options;
  node affinity from the same verdict rules as doctor (gpuenv/gpu/capability.py,
  gpuenv/catalog/compat.py).
- `layer.py`: the working directory as a thin code layer on the cell's image (pure).
- `images.py`: pushes the cell's image through gpuenv/publish/push.py and the code layer on top.
- `client.py`: kubeconfig and the official client, imported lazily; API errors as KubeError.
- `follow.py`: the Job's life: pending reasons, pull failures, logs, the exit code.
- `run.py`: wires them for the verb.

Nothing here is imported by `gpuenv --help`; only client.py imports `kubernetes`.
"""

from __future__ import annotations

from gpuenv.matrix.errors import GpuenvError


class KubeError(GpuenvError):
    """The cluster (or its configuration) refused; one line for the user, exit 125."""

    def __init__(self, message: str, *, exit_code: int = 125) -> None:
        super().__init__(message, exit_code=exit_code)
