"""Running workloads in cells' images: here, or on a cluster.

- `local`: the target (a cell or an image; built if missing), the GPU preflight and the
  container's life on this engine (`gpuenv run`);
- `sync`: whether the engine sees the working directory, and where it cannot (another
  host), the directory's copy there, sent before a run and brought back after;
- `workdir`: what of a working directory travels (ignore rules, secrets, limits), to a
  remote engine or into the Kubernetes code layer;
- `kube/` (`run --kube`, a Kubernetes Job) and `slurm/` (`run --slurm`, a batch job), which
  share `interrupts` (Ctrl-C and SIGTERM cancel the remote job).
"""
