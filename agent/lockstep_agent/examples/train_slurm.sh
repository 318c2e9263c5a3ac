#!/bin/bash
# Batch script for train_slurm.py: one task per node, torch.distributed over gloo.
#   sbatch -N 2 --ntasks-per-node=1 --requeue train_slurm.sh --checkpoint-dir DIR [--checkpoint-every K]
# LOCKSTEP_PYTHON names the Python that has torch and lockstep_agent (default python3); MASTER_ADDR defaults
# to the first node of the allocation. With LOCKSTEP_URL and LOCKSTEP_LAUNCHER_TOKEN exported, rank 0
# registers the job with Lockstep and reports its progress.
set -u
PYTHON=${LOCKSTEP_PYTHON:-python3}
export MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}
export MASTER_PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
echo "job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0} on $SLURM_JOB_NODELIST master $MASTER_ADDR:$MASTER_PORT"
exec srun --kill-on-bad-exit=1 "$PYTHON" -m lockstep_agent.examples.train_slurm "$@"
