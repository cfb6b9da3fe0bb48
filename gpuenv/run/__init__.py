"""Running workloads in cells' images: here, or on a cluster.

- `local`: the target (a cell or an image; built if missing), the GPU preflight and the
  container's life on this engine (`gpuenv run`);
- `kube/` (`run --kube`, a Kubernetes Job) and `slurm/` (`run --slurm`, a batch job), which
  share `interrupts` (Ctrl-C and SIGTERM cancel the remote job);
- `doctor`: whether this host can run the matrix's cells, and how to fix it.
"""
