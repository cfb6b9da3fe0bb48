#!/bin/bash
#SBATCH --job-name=gpuenv-tf2.21-py3.11-cuda12.5-gpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --no-requeue
#SBATCH --gpus-per-node=4
#SBATCH --time=0-02:00:00
#SBATCH --partition=gpu
#SBATCH --output=/shared/gpuenv-1000/jobs/gpuenv-%j.out
#SBATCH --chdir=/home/ada/project
#SBATCH --export=PATH,HOME,USER,LOGNAME,LANG,LC_ALL,TZ,TMPDIR,XDG_RUNTIME_DIR
# gpuenv slurm run: tf2.21-py3.11-cuda12.5-gpu (sha256:ab12), runtime pyxis

export USER="${USER:-$(id -un)}"  # ch-run and enroot refuse to start without it
# The rendezvous (torch.distributed's; give it to jax.distributed.initialize() as
# coordinator_address): the allocation's first node at the address Slurm reaches it
# by (NodeAddr), which is its name unless slurm.conf says otherwise and the name
# alone need not resolve on the nodes.
gpuenv_first="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
gpuenv_addr="$(scontrol show node -o "$gpuenv_first" | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p')"
export MASTER_ADDR="${gpuenv_addr:-$gpuenv_first}"
export MASTER_PORT="$((20000 + SLURM_JOB_ID % 10000))"
export NVIDIA_VISIBLE_DEVICES=all
export WANDB_MODE=offline
export NOTE='it'"'"'s quoted'

rm -f "/shared/gpuenv-1000/jobs/gpuenv-$SLURM_JOB_ID.failed"
srun --kill-on-bad-exit=1 --export=ALL --container-image=/shared/gpuenv-1000/images/ab12.sqfs --container-mounts=/home/ada/project,/shared/gpuenv-1000/jobs --container-workdir=/home/ada/project \
    sh -c 'f=$1; shift
"$@"
rc=$?
[ "$rc" -eq 0 ] || (set -C; echo "$rc" > "$f") 2>/dev/null
exit "$rc"
' gpuenv-task "/shared/gpuenv-1000/jobs/gpuenv-$SLURM_JOB_ID.failed" \
    python train.py --epochs 3
rc=$?
if [ -s "/shared/gpuenv-1000/jobs/gpuenv-$SLURM_JOB_ID.failed" ]; then read -r rc < "/shared/gpuenv-1000/jobs/gpuenv-$SLURM_JOB_ID.failed"; fi
exit "$rc"
