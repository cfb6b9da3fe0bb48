"""GPU facts: what a host's devices and driver can run, and what a workload used.

- `gpus`: `--gpus` requests, driver verdicts, the NVIDIA toolkit's errors (pure);
- `capability`: compute-capability verdicts from the kernels each release ships;
- `monitor`: utilisation and memory while a workload runs (NVML, or nvidia-smi in a helper
  container on a remote engine), summarised with advice.
"""
