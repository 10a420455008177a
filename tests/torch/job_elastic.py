"""A Horovod elastic training script on pskv (tests/torch/test_elastic_torch.py runs it under ``pskv launch -n 1:4``).

``python job_elastic.py STEPS KILL_SLOT KILL_STEP KILL_WHERE [GATE_STEP GATE_FILE]``: a linear
model without bias trains with ``hvd.DistributedOptimizer`` (SGD with momentum, ``op=Average``)
inside ``@hvd.elastic.run``, on the samples an ``ElasticSampler`` gives this rank, committing after
every step. The loss is ``sum(model(x))``, so the gradient is the sum of the batch's feature rows:
small integers, summed exactly in any order. Worker ``KILL_SLOT`` SIGKILLs itself when it reaches
step ``KILL_STEP`` (``KILL_WHERE``: ``start`` of the step, ``backward``: after its gradient went
out, or ``commit``: after the step, before its commit). Rank 0 holds the commit of step
``GATE_STEP`` until ``GATE_FILE`` exists (the test lets a joiner register first, so that it is
admitted at that commit).

Each committed step is recorded in the state (so a restore drops the voided ones) as
``[epoch, samples processed before it, workers]``; at the end each worker prints one line
``result {json}`` with its slot, rank, size, weights and record.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

import pskv.torch as hvd

FEATURES, BATCH, SAMPLES, SEED, LR, MOMENTUM = 8, 2, 40, 1, 2.0 ** -6, 0.5


def features(ids: list[int]) -> torch.Tensor:
    """Sample ``id``'s features: small integers."""
    rows = torch.tensor(ids, dtype=torch.int64)[:, None] * 7 + torch.arange(FEATURES)[None, :]
    return ((rows % 13) - 6).to(torch.float32)


def model_and_optimizer() -> tuple[torch.nn.Linear, torch.optim.SGD]:
    model = torch.nn.Linear(FEATURES, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def wait_for(gate: Path) -> None:
    print(f"waiting for {gate.name}", flush=True)
    deadline = time.monotonic() + 60
    while not gate.exists():
        assert time.monotonic() < deadline, f"{gate} did not appear"
        time.sleep(0.02)


def main(steps: int, kill_slot: int, kill_step: int, kill_where: str, gate_step: int = -1, gate: str = "") -> None:
    slot = int(os.environ["DMLC_WORKER_ID"])
    hvd.init()
    model, sgd = model_and_optimizer()
    optimizer = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(range(SAMPLES), shuffle=True, seed=SEED)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, step=0, record=[])
    resets: list[int] = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    def kill_here(where: str) -> None:
        if (slot, state.step, where) == (kill_slot, kill_step, kill_where):
            os.kill(os.getpid(), signal.SIGKILL)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.step < steps:
            for b in range(len(state.sampler) // BATCH):  # the share left of the epoch (full batches)
                if state.step >= steps:
                    return
                kill_here("start")
                before = [state.sampler.epoch, state.sampler.processed_num, hvd.size()]
                optimizer.zero_grad()
                model(features(state.sampler.get_indices(b, BATCH))).sum().backward()
                kill_here("backward")
                optimizer.step()
                state.sampler.record_batch(b, BATCH)
                state.step += 1
                state.record.append(before)
                print(f"step {state.step} rank {hvd.rank()} size {hvd.size()}", flush=True)
                kill_here("commit")
                if state.step == gate_step and hvd.rank() == 0:
                    wait_for(Path(gate))
                state.commit()
            state.sampler.set_epoch(state.sampler.epoch + 1)

    train(state)
    print("result " + json.dumps({"slot": slot, "rank": hvd.rank(), "size": hvd.size(), "resets": resets,
                                  "weight": model.weight.detach().reshape(-1).tolist(), "record": state.record}),
          flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
         *([int(sys.argv[5]), sys.argv[6]] if len(sys.argv) > 5 else []))
