"""A small dist_sync worker for the cluster recipes (sbatch, MXJob, PyTorchJob): every
worker pushes its rank + 1, each pull returns the sum over the workers.

Run by ``pskv launch`` (sbatch.sh), by an MXJob's worker pods (mxjob.yaml), or by a
PyTorchJob's pods through pytorchjob-pod.sh, which take the rank and the number of
workers from RANK / WORLD_SIZE (pskv.config.rank_env).
"""

import numpy as np

import pskv

kv = pskv.create("dist_sync")
n = kv.num_workers
kv.init("w", np.zeros(4, np.float32))
for _step in range(3):
    kv.push("w", np.full(4, kv.rank + 1, np.float32))
    total = kv.pull("w")
    assert (total == n * (n + 1) // 2).all(), total
print(f"worker {kv.rank} of {n} (local rank {kv.local_rank}): sum {total[0]:g}", flush=True)
kv.close()
