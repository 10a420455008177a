"""Optimizer-state files land where the user says under ``pskv launch`` (issue 27).

A job started in one directory saves its optimizer state to an absolute path in another, as
MXNet users write it, and by default (no ``PSKV_STATE_DIR``): rank 0 writes the files
(``pskv.kvstore.state_files``), no server writes a path a worker names. Loading them restores
the training exactly. Real processes, through ``pskv launch``.
"""

from __future__ import annotations

import pytest

from tests.fault.launched import launch_job

LAUNCHED = """
import sys
import numpy as np
import pskv
from pskv.optimizer import Adam

saved = sys.argv[1] + "/opt.states"  # absolute, outside the job's directory (no PSKV_STATE_DIR)
kv = pskv.create("dist_sync")
keys = ["w", "three", "big"]
kv.init(keys, [np.arange(6, dtype=np.float32), np.ones(5, np.float32), np.zeros(50_000, np.float32)])
kv.set_optimizer(Adam(learning_rate=0.05))

def step(s):
    kv.push(keys, [np.full(6, s + 1.0 + kv.rank, np.float32), np.linspace(-1, 1, 5, dtype=np.float32) * (s + 1),
                   np.sin(np.arange(50_000, dtype=np.float32) + s)])
    return [kv.pull(k) for k in keys]

for s in range(3):
    step(s)
at3 = [kv.pull(k) for k in keys]
if kv.rank == 0:
    kv.save_optimizer_states(saved, dump_optimizer=True)  # rank 0 alone, as MXNet users save
kv.barrier()
for s in range(3, 5):
    continued = step(s)
kv.broadcast(keys, at3)  # the weights of step 3 again ...
kv.load_optimizer_states(saved)  # ... with the optimizer state of step 3
for s in range(3, 5):
    again = step(s)
print("identical", kv.rank, all(np.array_equal(a, b) for a, b in zip(continued, again)), flush=True)
kv.broadcast(keys, at3)  # the same again without the load: the later optimizer state gives other floats
for s in range(3, 5):
    unloaded = step(s)
print("differs", kv.rank, not all(np.array_equal(a, b) for a, b in zip(continued, unloaded)), flush=True)
kv.save_optimizer_states("opt.relative")  # relative: this worker's directory, the job's
kv.close()
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_save_optimizer_states_to_an_absolute_path_under_launch(tmp_path):
    """Rank 0 of a job started in ``job/`` saves to ``elsewhere/`` (absolute; no PSKV_STATE_DIR), and the
    loaded state continues the training to the same floats as without the save."""
    job, elsewhere = tmp_path / "job", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # "big" is split over both servers and cut into pieces there: a slice's state is the pieces' together
    code, out = launch_job(job, LAUNCHED, [str(elsewhere)], ["--env", "MXNET_KVSTORE_BIGARRAY_BOUND=10000",
                                                             "--env", "PSKV_PART_BYTES=40000"], deadline=120)
    assert code == 0, out
    assert sorted(p.name for p in elsewhere.iterdir()) == ["opt.states.server0", "opt.states.server1"], out
    for rank in (0, 1):
        assert f"identical {rank} True" in out and f"differs {rank} True" in out, out
    assert sorted(p.name for p in job.glob("opt.*")) == ["opt.relative.server0", "opt.relative.server1"]
    assert "refused path" not in out, out
