"""PyTorch DDP worker of ``bench/bench_train.py``: the same models, data and optimizer on Gloo.

Usage (started by ``bench_train.py``; no servers, no scheduler)::

    python bench/_train_worker_ddp.py SPEC.json   # env: GLOO_INIT=tcp://127.0.0.1:PORT, RANK, WORLD_SIZE, PSKV_BENCH_GATE

``init_process_group("gloo", init_method=GLOO_INIT, rank=RANK, world_size=WORLD_SIZE)``,
``torch.set_num_threads(1)``; per model ``DistributedDataParallel(model)`` (its default
buckets: 25 MiB, the first 1 MiB; rank 0's parameters broadcast at construction),
``torch.optim.SGD(params, lr, momentum)`` and ``CrossEntropyLoss()`` (mean), the
standard loop::

    opt.zero_grad(); loss = criterion(ddp(x), y); loss.backward(); opt.step()

DDP averages the gradients over the workers during backward, so the update is the one
pskv's servers make from the summed gradients with ``rescale_grad = 1 / global batch``.
Phases as in ``_train_worker_pskv.py`` (see ``_train_common.run_models``); samples start
with ``dist.barrier()``.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _procs import emit, read_spec  # noqa: E402
from _train_common import Cycle, Gate, ModelSpec, StepSplit, preload, run_models, worker_batches  # noqa: E402


class DdpJob:
    """One model trained with DistributedDataParallel and a local torch.optim.SGD."""

    def __init__(self, spec: ModelSpec, rank: int, world: int) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel

        self.model = spec.build()
        self.ddp = DistributedDataParallel(self.model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=spec.learning_rate, momentum=spec.momentum)
        self.criterion = torch.nn.CrossEntropyLoss()
        self.data = Cycle(worker_batches(spec, rank, world))
        self.split = StepSplit()

    def train(self, n: int) -> None:
        ddp, opt, criterion, data, split = self.ddp, self.opt, self.criterion, self.data, self.split
        clock, cpu, proc = time.perf_counter, time.thread_time, time.process_time
        for _ in range(n):
            t0, c0, p0 = clock(), cpu(), proc()
            x, y = data.next()
            opt.zero_grad()
            loss = criterion(ddp(x), y)
            t1, c1 = clock(), cpu()
            loss.backward()
            t2, c2 = clock(), cpu()
            opt.step()
            t3, c3, p3 = clock(), cpu(), proc()
            split.add(t1 - t0, t2 - t1, t3 - t2, c1 - c0, c2 - c1, c3 - c2, p3 - p0)

    def probe(self, n: int) -> list[float]:
        losses = []
        for _ in range(n):
            x, y = self.data.next()
            self.opt.zero_grad()
            loss = self.criterion(self.ddp(x), y)
            losses.append(float(loss.detach()))
            loss.backward()
            self.opt.step()
        return losses

    def final_params(self) -> Any:
        return list(self.model.parameters())

    def close(self) -> dict[str, Any]:
        return {"params": sum(p.numel() for p in self.model.parameters()), "steps_taken": self.data.i,
                "split": self.split.json()}


def main() -> int:
    """Join the process group, train every model of the spec phase by phase, print the result."""
    spec = read_spec()
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel  # noqa: F401 - imported before the gated phases

    torch.set_num_threads(1)
    preload(spec)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=os.environ["GLOO_INIT"], rank=rank, world_size=world)
    gate = Gate(os.environ.get("PSKV_BENCH_LABEL", "ddp"), rank)
    results = run_models(spec, gate, dist.barrier, lambda s: DdpJob(s, rank, world))
    dist.barrier()
    dist.destroy_process_group()
    gate.close()
    emit({"system": "ddp", "rank": rank, "pid": os.getpid(), "results": results,
          "environment": {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
                          "torch_threads": torch.get_num_threads(), "backend": "gloo"}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
