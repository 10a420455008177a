#!/bin/bash
# pskv on SLURM: sbatch examples/cluster/sbatch.sh (from the repository's directory, on a
# shared file system, with pskv installed for the python on PATH).
#
# 4 workers, 2 per node (the allocation's tasks per node are pskv's worker slots), 2 servers
# (one per node) and the scheduler on the first node. pskv launch runs each process as a
# job step of this allocation: srun --nodes=1 --ntasks=1 --nodelist=NODE --overlap ...
#SBATCH --job-name=pskv-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --time=00:10:00
#SBATCH --output=pskv-%j.out
set -euo pipefail
pskv launch --launcher slurm -n 4 -s 2 --timeout 600 --log-dir "logs-$SLURM_JOB_ID" -- python examples/cluster/train.py
