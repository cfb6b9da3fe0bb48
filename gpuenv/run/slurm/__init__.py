"""`gpuenv slurm run`: the same workload as a Slurm batch job.

- `script.py`: the batch script, generated (pure) from the job's inputs, one launcher per
  container runtime (charliecloud, apptainer, pyxis, podman); --time's syntax.
- `image.py`: the image on shared storage, written once per image ID as a SquashFS with
  what each runtime needs beside and inside it.
- `jobs.py`: Slurm's own commands on PATH (sbatch, scontrol, scancel), honouring
  $SLURM_CONF; their outputs parsed.
- `run.py`: wires them for the verb and follows the job to its exit code.
- `ssh.py`: a login node over the user's ssh (`--login`): the argv, one quoted command.
- `login.py`: `slurm run --login` from a machine with Docker: the image written here and
  sent once per image ID, the job submitted and followed over ssh.
- `jobdir.py`: the working directory's copy in a job directory on the shared directory,
  sent by content digest; what the job wrote brought back through run/sync.py's unpacking.
- `cluster_files.py`: what gpuenv keeps in the user's directory there, listed and removed
  over ssh for `gpuenv prune --login` (run/leftovers.py judges it).

Slurm is reached through its commands on this machine (a login node), or on a login node
over ssh (`jobs.Slurm.over`: the same commands, each one ssh call).
"""

from __future__ import annotations

from gpuenv.matrix.errors import GpuenvError


class SlurmError(GpuenvError):
    """Slurm (or the request) refused; one line for the user, exit 125."""

    def __init__(self, message: str, *, exit_code: int = 125) -> None:
        super().__init__(message, exit_code=exit_code)
