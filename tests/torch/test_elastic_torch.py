"""Horovod's elastic API in a job of ``pskv launch -n MIN:MAX``: a worker SIGKILLed mid-run, and one that joins
(one job: the kill in a backward pass, then the join; a kill between a step and its commit is the raw
store's case in tests/fault/test_elastic_launch.py, "after").

tests/torch/job_elastic.py (``import pskv.torch as hvd``, ``@hvd.elastic.run``, ``TorchState``,
``ElasticSampler``, ``DistributedOptimizer``, a commit after every step) runs under
``pskv launch -n 1:4 -s 1`` on the 3 slots a discovery file names (``--respawn-cooldown``: a killed
slot is not started again). The launcher reports the killed worker's exit; the survivors restore to
the last commit and go on. When the file names a fourth slot the launcher starts it; it is admitted
at a commit and takes rank 0's state by ``state.sync()``.

The gradients are small integers (summed exactly in any order) and the learning rate a power of
two, so every finishing worker's weights must be bit-equal, and equal to a replay that re-deals
every recorded step's samples with :func:`pskv.parallel.elastic_data.partition` over the workers of
that step: a gradient counted twice or lost, a restore to the wrong commit or a sampler that dealt
a sample twice would move some weight.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pskv.parallel.elastic_data import partition  # noqa: E402
from pskv.testing.jobs import Process, ProcessGroup, child_env, start_launch, tagged_pids  # noqa: E402
from tests.torch.job_elastic import BATCH, SAMPLES, SEED, features, model_and_optimizer  # noqa: E402

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).resolve().parent
WAIT = 90.0


def replay(record: list[list[int]]) -> torch.Tensor:
    """The weights after the recorded steps, each step's samples dealt over its workers and averaged."""
    model, sgd = model_and_optimizer()
    seen: dict[int, set[int]] = {}
    for epoch, processed, size in record:
        total = torch.zeros(1, features([0]).shape[1])
        for rank in range(size):
            ids = partition(SAMPLES, SEED, epoch, processed, rank, size)[:BATCH].tolist()
            assert len(ids) == BATCH and not seen.setdefault(epoch, set()) & set(ids), "a sample dealt twice"
            seen[epoch].update(ids)
            total += features(ids).sum(0, keepdim=True)
        model.weight.grad = total.mul_(1.0 / size)  # what DistributedOptimizer's Average does after the sum
        sgd.step()
    return model.weight.detach().reshape(-1)


def launch(job: ProcessGroup, tmp: Path, steps: int, kill: tuple[int, int, str], *gate: Any) -> Process:
    """``pskv launch -n 1:4 -s 1`` of job_elastic.py on the 3 slots of ``tmp/hosts``; the launcher's process."""
    (tmp / "hosts").write_text("127.0.0.1:3\n")
    argv = [sys.executable, str(HERE / "job_elastic.py"), str(steps), *map(str, kill), *map(str, gate)]
    return start_launch(job, ["-n", "1:4", "-s", "1", "--host-discovery-script", f"cat {tmp / 'hosts'}",
                              "--discovery-interval", "0.1", "--respawn-cooldown", "3600", "--", *argv], tmp,
                        child_env({"PSKV_LOG_LEVEL": "INFO"}, paths=[HERE.parents[1]]), tag=f"elastic-{tmp.name}")


def finish(launcher: Process, tmp: Path, slots: list[int]) -> list[dict[str, Any]]:
    """The launcher's exit status 0 and each of ``slots``' result, in that order."""
    code = launcher.wait(WAIT)
    text = launcher.output()
    assert code == 0, text
    assert "worker slot 2 on 127.0.0.1 was killed by SIGKILL: it left the job" in text, text
    assert tagged_pids(f"elastic-{tmp.name}") == []
    found = {r["slot"]: r for r in (json.loads(line.split(" result ", 1)[1]) for line in launcher.text()
                                    if line.startswith("[worker ") and " result " in line)}
    assert sorted(found) == sorted(slots), text
    return [found[slot] for slot in slots]


def check_survivors(out: list[dict[str, Any]], sizes: list[int]) -> None:
    """Every finisher has the same record and weights, equal to the replay; the record's sizes are ``sizes``."""
    record = out[0]["record"]
    assert [size for _, _, size in record] == sizes
    for r in out:
        assert r["record"] == record
        assert r["weight"] == out[0]["weight"]
    assert torch.equal(torch.tensor(out[0]["weight"]), replay(record))
    assert any(out[0]["weight"])


def test_a_worker_that_joins_mid_run_gets_rank_0s_state_and_trains_on(tmp_path: Path) -> None:
    steps, kill_step, join_at = 16, 4, 8  # slot 2 dies in step 5's backward (its gradient may be out)
    gate = tmp_path / "gate"
    with ProcessGroup("elastic") as job:
        launcher = launch(job, tmp_path, steps, (2, kill_step, "backward"), join_at, gate)
        launcher.expect("[worker 0] waiting for gate", WAIT)  # rank 0 holds the commit of step 8
        (tmp_path / "hosts").write_text("127.0.0.1:4\n")  # a fourth slot: the launcher starts slot 3
        launcher.expect("worker slot 3 waits to join at the next commit", WAIT)
        gate.touch()  # slot 3 is admitted at that commit
        out = finish(launcher, tmp_path, [0, 1, 3])
    assert [(r["rank"], r["size"]) for r in out] == [(0, 3), (1, 3), (2, 3)]
    assert out[0]["resets"] == out[1]["resets"] == [2, 3] and out[2]["resets"] == []
    check_survivors(out, [3] * kill_step + [2] * (join_at - kill_step) + [3] * (steps - join_at))
