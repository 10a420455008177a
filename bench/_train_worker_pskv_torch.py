"""pskv.torch worker of ``bench/bench_train.py``: a PyTorch loop on pskv's servers, as a Horovod or DDP user writes it.

Usage (started by ``bench_train.py`` with the cluster environment ``DMLC_*`` set, and
``PSKV_BENCH_GATE``, the driver's token server)::

    python bench/_train_worker_pskv_torch.py SPEC.json   # env: PSKV_BENCH_API=optimizer|ddp|cross_barrier

Per model, ``torch.optim.SGD(params, lr, momentum)`` and ``CrossEntropyLoss()`` (mean), and
one of:

* ``optimizer``: ``hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())``
  after ``hvd.broadcast_parameters(model.state_dict(), root_rank=0)`` (Horovod's loop:
  each gradient goes to the servers during backward; ``opt.step()`` waits and applies);
* ``ddp``: ``hvd.DistributedDataParallel(model)`` (torch DDP's loop: gradients averaged
  during backward, a local ``opt.step()``);
* ``cross_barrier``: ``hvd.CrossBarrier(model, opt)`` (BytePS's: the servers run the SGD,
  ``opt.step()`` returns at once and each layer's next forward waits for its own update).

The same loop as ``_train_worker_ddp.py``; the gradients are averaged over the workers by
pskv's servers (``dist_sync``), the update runs on every worker. Samples start with a
barrier on the store.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR), os.environ.get("PSKV_BENCH_SRC") or str(BENCH_DIR.parent)]

from _procs import emit, read_spec  # noqa: E402
from _train_common import Cycle, Gate, ModelSpec, StepSplit, preload, run_models, worker_batches  # noqa: E402


class TorchApiJob:
    """One model trained with pskv.torch's DistributedOptimizer or DistributedDataParallel and torch.optim.SGD."""

    def __init__(self, hvd: Any, api: str, spec: ModelSpec) -> None:
        import torch

        self.model = spec.build()
        opt = torch.optim.SGD(self.model.parameters(), lr=spec.learning_rate, momentum=spec.momentum)
        self.api = api
        if api == "ddp":
            self.net = hvd.DistributedDataParallel(self.model)
            self.opt = opt
        elif api == "cross_barrier":  # the servers run the SGD; step() overlaps the next forward
            self.net = self.model
            self.opt = hvd.CrossBarrier(self.model, opt)  # its first step starts from rank 0's parameters
        else:
            hvd.broadcast_parameters(self.model.state_dict(), root_rank=0, prefix=f"{spec.id}.")  # one key set per model
            self.net = self.model
            self.opt = hvd.DistributedOptimizer(opt, named_parameters=[(f"{spec.id}.{n}", p) for n, p in
                                                                         self.model.named_parameters()])
        self.criterion = torch.nn.CrossEntropyLoss()
        self.data = Cycle(worker_batches(spec, hvd.rank(), hvd.size()))
        self.split = StepSplit()

    def train(self, n: int) -> None:
        net, opt, criterion, data, split = self.net, self.opt, self.criterion, self.data, self.split
        clock, cpu, proc = time.perf_counter, time.thread_time, time.process_time
        for _ in range(n):
            t0, c0, p0 = clock(), cpu(), proc()
            x, y = data.next()
            opt.zero_grad()
            loss = criterion(net(x), y)
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
            loss = self.criterion(self.net(x), y)
            losses.append(float(loss.detach()))
            loss.backward()
            self.opt.step()
        return losses

    def final_params(self) -> Any:
        if self.api == "cross_barrier":
            self.opt.synchronize()  # the last step's updates
        return list(self.model.parameters())

    def close(self) -> dict[str, Any]:
        return {"params": sum(p.numel() for p in self.model.parameters()), "steps_taken": self.data.i,
                "split": self.split.json()}


def main() -> int:
    """Initialise pskv.torch, train every model of the spec phase by phase, print the result."""
    spec = read_spec()
    import numpy as np
    import torch

    import pskv
    import pskv.torch as hvd

    api = os.environ.get("PSKV_BENCH_API", "optimizer")
    torch.set_num_threads(1)
    preload(spec)
    hvd.init()
    rank = hvd.rank()
    gate = Gate(os.environ.get("PSKV_BENCH_LABEL", f"pskv-{api}"), rank)
    results = run_models(spec, gate, hvd.barrier, lambda s: TorchApiJob(hvd, api, s))
    hvd.shutdown()
    gate.close()
    emit({"system": f"pskv-{api}", "rank": rank, "pid": os.getpid(), "results": results,
          "environment": {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
                          "torch_threads": torch.get_num_threads(), "pskv": pskv.__version__,
                          "pskv_file": pskv.__file__}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
