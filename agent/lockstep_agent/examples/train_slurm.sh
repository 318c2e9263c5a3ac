#!/bin/bash
# Batch script for train_slurm.py: one task per node, torch.distributed over gloo.
#   sbatch -N 2 --ntasks-per-node=1 --requeue train_slurm.sh --checkpoint-dir DIR [--checkpoint-every K]
#   sbatch -N 3 --ntasks-per-node=1 --no-kill --requeue train_slurm.sh ... --protect-holder SOCK --standbys 1
# LOCKSTEP_PYTHON names the Python that has torch and lockstep_agent (default python3); MASTER_ADDR defaults
# to the first node of the allocation. With LOCKSTEP_URL and LOCKSTEP_LAUNCHER_TOKEN exported, rank 0
# registers the job with Lockstep and reports its progress.
# With --standbys the step must outlive a node (srun --no-kill) and a task that dies alone
# (--kill-on-bad-exit=0): lockstep_agent/protect/membership.py says what was verified.
set -u
PYTHON=${LOCKSTEP_PYTHON:-python3}
export MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}
export MASTER_PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
echo "job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0} on $SLURM_JOB_NODELIST master $MASTER_ADDR:$MASTER_PORT"
STEP_FLAGS=(--kill-on-bad-exit=1)
for argument in "$@"; do
    if [ "$argument" = "--standbys" ]; then STEP_FLAGS=(--no-kill --kill-on-bad-exit=0); fi
done
exec srun "${STEP_FLAGS[@]}" "$PYTHON" -m lockstep_agent.examples.train_slurm "$@"
