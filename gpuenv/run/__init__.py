"""Running workloads in cells' images: here, or on a cluster.

- `options` (the command, -e, -v, -p, checked first), `target` (a cell or an image; built
  if missing), `preflight` (the GPU preflight) and `local` (the container's life on this
  engine): `gpuenv run`; `console`: what every front-end says on stderr;
- `sync`: whether the engine sees the working directory, and where it cannot (another
  host), the directory's copy there, sent before a run and brought back after;
- `workdir`: what of a working directory travels (ignore rules, secrets, limits), to a
  remote engine or into the Kubernetes code layer;
- `kube/` (`kube run`, a Kubernetes Job) and `slurm/` (`slurm run`, a batch job), which
  share `interrupts` (Ctrl-C and SIGTERM cancel the remote job).
"""
