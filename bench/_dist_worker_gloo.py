"""Gloo reference of ``bench/bench_dist.py``: the same data all-reduced with ``torch.distributed``.

Usage (started by ``bench_dist.py``; no servers, no scheduler)::

    python bench/_dist_worker_gloo.py SPEC.json      # env: GLOO_INIT=tcp://127.0.0.1:PORT, RANK, WORLD_SIZE

``init_process_group("gloo", init_method=GLOO_INIT, rank=RANK, world_size=WORLD_SIZE)``;
rank ``r``'s values are filled with ``r + 1`` as on the parameter servers. One iteration
leaves the sum over workers in ``outs`` and the values untouched, like push + pull:

* one key: ``out.copy_(val)``, ``all_reduce(out)``;
* a key list (``bucketed``): DDP's scheme — the arrays, in reverse order, are packed into
  flat buckets of at most ``bucket_bytes`` (25 MiB, DDP's ``bucket_cap_mb``); per bucket,
  copy the values in and start an asynchronous ``all_reduce``; then wait for each bucket
  in turn and copy its result out into the arrays' ``outs``.

A workload with ``optimizer`` adds what data-parallel training without servers does
after the all-reduce: a local ``torch.optim.SGD`` step (same learning rate and momentum,
``foreach`` implementation) on every worker, with the reduced sums as gradients; the
pulled "value" is then the weights. There is no pushpull mode (a collective has one).
Each worker uses ``cpu_count // world_size`` intra-op threads (see :func:`main`).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _procs import emit, read_spec, sample_with_barrier  # noqa: E402

BUCKET_BYTES = 25 << 20


class GlooBench:
    """One workload's values, outs and buckets."""

    def __init__(self, torch: Any, work: dict[str, Any], rank: int) -> None:
        self.torch = torch
        self.dist = torch.distributed
        shapes = [tuple(int(d) for d in s) for s in work["shapes"]]
        self.vals = [torch.full(s, float(rank + 1), dtype=torch.float32) for s in shapes]
        self.outs = [torch.zeros(s, dtype=torch.float32) for s in shapes]
        self.single = not work["as_list"]
        self.buckets: list[tuple[Any, list[tuple[int, int, int]]]] = []  # (flat, [(array index, lo, hi)])
        if not self.single:
            current: list[tuple[int, int, int]] = []
            size = 0
            for i in reversed(range(len(shapes))):
                n = self.vals[i].numel()
                if current and (size + n) * 4 > BUCKET_BYTES:
                    self.buckets.append((torch.empty(size, dtype=torch.float32), current))
                    current, size = [], 0
                current.append((i, size, size + n))
                size += n
            self.buckets.append((torch.empty(size, dtype=torch.float32), current))
        self.optimizer = None
        self.weights: list[Any] = []
        if work.get("optimizer"):
            self.weights = [torch.full(s, float(work["init"]), dtype=torch.float32) for s in shapes]
            for w, g in zip(self.weights, self.outs):
                w.grad = g  # the reduced sums are the gradients
            opt = work["optimizer"]
            self.optimizer = torch.optim.SGD(self.weights, lr=opt["learning_rate"], momentum=opt.get("momentum", 0.0),
                                             foreach=True)

    def _reduce(self) -> None:
        if self.single:
            self.outs[0].copy_(self.vals[0])
            self.dist.all_reduce(self.outs[0])
            return
        works = []
        for flat, members in self.buckets:
            for i, lo, hi in members:
                flat[lo:hi].copy_(self.vals[i].reshape(-1))
            works.append(self.dist.all_reduce(flat, async_op=True))
        for work, (flat, members) in zip(works, self.buckets):
            work.wait()
            for i, lo, hi in members:
                self.outs[i].reshape(-1).copy_(flat[lo:hi])

    def push_pull(self, n: int) -> None:
        """``n`` iterations: all-reduce into the outs (and the optimizer step, if any)."""
        for _ in range(n):
            self._reduce()
            if self.optimizer is not None:
                self.optimizer.step()

    def results(self) -> list[Any]:
        """What a pull would have returned: the weights with an optimizer, else the sums."""
        return self.weights if self.optimizer is not None else self.outs

    def check(self, expect: float, mode: str) -> str:
        """Raise unless every result holds ``expect``."""
        worst = max(float((r - expect).abs().max()) for r in self.results())
        if not worst <= 1e-5:
            raise RuntimeError(f"Gloo {mode}: values differ from {expect} by up to {worst}")
        return f"{mode}: all {sum(r.numel() for r in self.results())} elements == {expect}"


def main() -> int:
    """Join the process group, run every workload of the spec, print the result."""
    spec = read_spec()
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # The workers share the machine: one intra-op thread pool per worker of cores / workers
    # threads. PyTorch's default (all cores in every process) makes the SGD step ~4x slower
    # on 2 cores, as the OpenMP threads of both workers spin against each other.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=os.environ["GLOO_INIT"], rank=rank, world_size=world)
    results = {}
    for work in spec["workloads"]:
        started = time.perf_counter()
        bench = GlooBench(torch, work, rank)
        dist.barrier()
        bench.push_pull(1)
        checks = [bench.check(float(work["expect"]), "push_pull")]
        window: list[float] = []
        samples = sample_with_barrier({"push_pull": bench.push_pull}, dist.barrier, int(work["warmup"]),
                                      int(work["iters"]), int(spec["repeats"]), window)
        results[work["name"]] = {"samples_s": samples, "iters": int(work["iters"]), "check": checks,
                                 "buckets": len(bench.buckets),
                                 "window_monotonic_s": window,
                                 "setup_and_run_s": time.perf_counter() - started}
        del bench
    dist.barrier()
    dist.destroy_process_group()
    emit({"system": "gloo", "rank": rank, "pid": os.getpid(), "results": results,
          "environment": {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
                          "torch_threads": torch.get_num_threads()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
