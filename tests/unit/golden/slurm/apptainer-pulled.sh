#!/bin/bash
#SBATCH --job-name=gpuenv-tf2.21-py3.11-cuda12.5-gpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --time=0-02:00:00
#SBATCH --partition=gpu
#SBATCH --output=/shared/gpuenv-1000/jobs/gpuenv-%j.out
#SBATCH --chdir=/home/ada/project
#SBATCH --export=PATH,HOME,USER,LOGNAME,LANG,LC_ALL,TZ,TMPDIR,XDG_RUNTIME_DIR
# gpuenv slurm run: tf2.21-py3.11-cuda12.5-gpu (sha256:ab12), runtime apptainer

export USER="${USER:-$(id -un)}"  # ch-run and enroot refuse to start without it
# torch.distributed's rendezvous: the allocation's first node (JAX's
# jax.distributed.initialize() and TF's SlurmClusterResolver read SLURM_* themselves).
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export MASTER_PORT="$((20000 + SLURM_JOB_ID % 10000))"
export WANDB_MODE=offline
export NOTE='it'"'"'s quoted'

rm -f "/shared/gpuenv-1000/jobs/gpuenv-$SLURM_JOB_ID.failed"
srun --kill-on-bad-exit=1 --export=ALL \
    sh -c 'f=$1; shift
"$@"
rc=$?
[ "$rc" -eq 0 ] || (set -C; echo "$rc" > "$f") 2>/dev/null
exit "$rc"
' gpuenv-task "/shared/gpuenv-1000/jobs/gpuenv-$SLURM_JOB_ID.failed" \
    apptainer exec --bind /home/ada/project --pwd /home/ada/project --nv docker://registry.example:5000/team/tf@sha256:abababababababababababababababababababababababababababababababab \
    python train.py --epochs 3
rc=$?
if [ -s "/shared/gpuenv-1000/jobs/gpuenv-$SLURM_JOB_ID.failed" ]; then read -r rc < "/shared/gpuenv-1000/jobs/gpuenv-$SLURM_JOB_ID.failed"; fi
exit "$rc"
