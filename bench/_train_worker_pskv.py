"""pskv worker of ``bench/bench_train.py``: trains the spec's models through ``dist_sync``, prints one JSON line.

Usage (started by ``bench_train.py`` with the cluster environment ``DMLC_*`` set, and
``PSKV_BENCH_GATE``, the driver's token server)::

    python bench/_train_worker_pskv.py SPEC.json

Per model (see ``_train_common.py`` for models, data, optimizer and the phases)::

    group = DataParallelExecutorGroup(model, ["cpu"], loss=CrossEntropyLoss())
    trainer = Trainer(group, "sgd", {"learning_rate": lr, "momentum": m}, kvstore=kv, prefix=f"{id}.")
    group.bind_exec([("data", x.shape)], [("label", y.shape)])
    one step: group.forward((x, y)); group.backward(); trainer.step()

Gradients go out in buckets during backward (non-blocking ``pushpull``); the servers sum
both workers' gradients and run SGD; ``trainer.step()`` returns once the new weights are
in, so a step is complete when it returns. The first forward also broadcasts rank 0's
parameters and installs the optimizer on the servers (in the untimed ``prep`` phase).
Samples start with ``kv.barrier()``.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
# _procs / _train_common, and the pskv to measure: PSKV_BENCH_SRC (a snapshot of a commit,
# set by bench_train.py --pskv-commit) or else this checkout
sys.path[:0] = [str(BENCH_DIR), os.environ.get("PSKV_BENCH_SRC") or str(BENCH_DIR.parent)]

from _procs import emit, read_spec  # noqa: E402
from _train_common import Cycle, Gate, ModelSpec, StepSplit, preload, run_models, worker_batches  # noqa: E402


class PskvJob:
    """One model trained through pskv: a one-device executor group and a Trainer on the shared store."""

    def __init__(self, kv: Any, spec: ModelSpec) -> None:
        import torch

        from pskv.parallel import DataParallelExecutorGroup, Trainer

        self.model = spec.build()
        self.group = DataParallelExecutorGroup(self.model, ["cpu"], loss=torch.nn.CrossEntropyLoss())
        self.trainer = Trainer(self.group, "sgd", {"learning_rate": spec.learning_rate, "momentum": spec.momentum},
                               kvstore=kv, prefix=f"{spec.id}.")
        self.data = Cycle(worker_batches(spec, kv.rank, kv.num_workers))
        x0, y0 = self.data.batches[0]
        self.group.bind_exec([("data", tuple(x0.shape))], [("label", tuple(y0.shape))])
        self.split = StepSplit()

    def train(self, n: int) -> None:
        group, trainer, data, split = self.group, self.trainer, self.data, self.split
        clock, cpu, proc = time.perf_counter, time.thread_time, time.process_time
        for _ in range(n):
            t0, c0, p0 = clock(), cpu(), proc()
            group.forward(data.next())
            t1, c1 = clock(), cpu()
            group.backward()
            t2, c2 = clock(), cpu()
            trainer.step()
            t3, c3, p3 = clock(), cpu(), proc()
            split.add(t1 - t0, t2 - t1, t3 - t2, c1 - c0, c2 - c1, c3 - c2, p3 - p0)

    def probe(self, n: int) -> list[float]:
        losses = []
        for _ in range(n):
            self.group.forward(self.data.next())
            losses.append(self.group.get_loss() / self.group.batch_size)  # the group's loss is the batch's sum
            self.group.backward()
            self.trainer.step()
        return losses

    def final_params(self) -> Any:
        return list(self.group.replicas[0].parameters())

    def close(self) -> dict[str, Any]:
        facts = {"params": sum(p.numel() for p in self.model.parameters()), "steps_taken": self.data.i,
                 "buckets": len(getattr(self.trainer, "_buckets", [])),
                 "update_on_kvstore": bool(self.trainer.update_on_kvstore), "split": self.split.json()}
        self.trainer.close()
        self.group.close()
        return facts


def main() -> int:
    """Train every model of the spec, phase by phase, and print the result."""
    spec = read_spec()
    import numpy as np
    import torch

    import pskv
    from pskv.parallel import DataParallelExecutorGroup  # noqa: F401 - imported before the gated phases

    torch.set_num_threads(1)
    preload(spec)
    kv = pskv.create("dist_sync")
    rank = kv.rank
    gate = Gate(os.environ.get("PSKV_BENCH_LABEL", "pskv"), rank)
    results = run_models(spec, gate, kv.barrier, lambda s: PskvJob(kv, s))
    kv.close()
    gate.close()
    emit({"system": "pskv", "rank": rank, "pid": os.getpid(), "results": results,
          "environment": {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
                          "torch_threads": torch.get_num_threads(), "pskv": pskv.__version__,
                          "pskv_file": pskv.__file__}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
