"""pskv worker of ``bench/bench_dist.py``: runs the spec's workloads on ``dist_sync``, prints one JSON line.

Usage (started by ``bench_dist.py`` with the cluster environment ``DMLC_*`` set)::

    python bench/_dist_worker_pskv.py SPEC.json

Per workload: ``kv.init`` of fresh keys (rank 0's zeros, or ``init`` for the optimizer
workload), then worker rank ``r`` pushes arrays filled with ``r + 1``. Modes:

* ``push_pull``: ``kv.push(key(s), vals, block=False)`` then ``kv.pull(key(s), out=outs)``
  — the equivalent of MXNet's ``kv.push`` (asynchronous: it returns at once) followed by
  ``kv.pull`` and ``waitall``. pskv sends the pull right behind the push without waiting
  for the push's acknowledgement (the server makes the pull see that push's round), so
  an iteration is about one round trip, as in MXNet. The push is complete when the pull
  returns: a server acknowledges a push before it answers any pull that includes it, so
  its handle is done by then (and a push error would surface at the next ``kv.wait()``
  or ``kv.close()``);
* ``push_pull_blocking``: ``kv.push(key(s), vals)`` (blocking: returns once the servers
  hold the data, i.e. after a round trip) then ``kv.pull(key(s), out=outs)`` — two round
  trips per iteration;
* ``pushpull``: ``kv.pushpull(key(s), vals, out=outs)``.

Each returns when complete (the pull, or pushpull, blocks), so an iteration ends with
the pulled values in ``outs``. One iteration of each mode is checked before the warm-up: every out must hold
the spec's ``expect`` value. A workload with ``optimizer`` first installs
``pskv.optimizer.SGD`` on the servers (collective); that applies to all keys from then on,
so the driver puts it last.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
# _procs, and the pskv to measure: PSKV_BENCH_SRC (a snapshot of a commit, set by bench_dist.py
# --pskv-commit) or else this checkout
sys.path[:0] = [str(BENCH_DIR), os.environ.get("PSKV_BENCH_SRC") or str(BENCH_DIR.parent)]

from _procs import emit, read_spec, sample_with_barrier  # noqa: E402


class PskvBench:
    """One workload's keys, values and outs on an open store."""

    def __init__(self, kv: Any, work: dict[str, Any], rank: int) -> None:
        self.kv = kv
        shapes = [tuple(int(d) for d in s) for s in work["shapes"]]
        keys = [int(work["key_base"]) + i for i in range(len(shapes))]
        kv.init(keys, [np.full(s, float(work["init"]), dtype=np.float32) for s in shapes])
        self.vals = [np.full(s, rank + 1, dtype=np.float32) for s in shapes]
        self.outs = [np.zeros(s, dtype=np.float32) for s in shapes]
        if work["as_list"]:
            self.key: Any = keys
            self.val: Any = self.vals
            self.out: Any = self.outs
        else:
            self.key, self.val, self.out = keys[0], self.vals[0], self.outs[0]

    def push_pull(self, n: int) -> None:
        """``n`` iterations of a non-blocking push then a (blocking) pull, as MXNet's push + pull."""
        kv, key, val, out = self.kv, self.key, self.val, self.out
        for _ in range(n):
            kv.push(key, val, block=False)
            kv.pull(key, out=out)

    def push_pull_blocking(self, n: int) -> None:
        """``n`` iterations of a blocking push then a pull."""
        kv, key, val, out = self.kv, self.key, self.val, self.out
        for _ in range(n):
            kv.push(key, val)
            kv.pull(key, out=out)

    def pushpull(self, n: int) -> None:
        """``n`` iterations of pushpull."""
        kv, key, val, out = self.kv, self.key, self.val, self.out
        for _ in range(n):
            kv.pushpull(key, val, out=out)

    def check_compressed(self, expect: float, mode: str) -> str:
        """With gradient compression the pulled values are what the pushes decode to (their
        exact values are tested in tests/, and sparsifying or stochastic types do not send
        every element): every out must be finite and within a few times the plain sum."""
        for o in self.outs:
            if not (np.isfinite(o).all() and np.abs(o).max() <= 4 * expect):
                raise RuntimeError(f"pskv {mode} (compressed): an out holds {o.min()}..{o.max()}")
        return f"{mode}: compressed, every out finite and within 4x {expect}"

    def check(self, expect: float, mode: str) -> str:
        """Raise unless every out holds ``expect``; a one-line description of what was checked."""
        worst = max(float(np.max(np.abs(o - np.float32(expect)))) for o in self.outs)
        if not worst <= 1e-5:
            raise RuntimeError(f"pskv {mode}: pulled values differ from {expect} by up to {worst}")
        return f"{mode}: all {sum(o.size for o in self.outs)} elements == {expect}"


def run_workload(kv: Any, work: dict[str, Any], rank: int, repeats: int, compressed: bool = False) -> dict[str, Any]:
    """Init, check one iteration per mode, warm up, sample."""
    import pskv

    started = time.perf_counter()
    bench = PskvBench(kv, work, rank)
    if work.get("optimizer"):
        kv.set_optimizer(pskv.optimizer.SGD(**work["optimizer"]))
    steps = {mode: getattr(bench, mode) for mode in work["modes"]}
    checks = []
    for mode, step in steps.items():
        for o in bench.outs:
            o.fill(0.0)  # so the check sees what this mode wrote
        kv.barrier()
        step(1)
        checks.append(bench.check_compressed(float(work["expect"]), mode) if compressed
                      else bench.check(float(work["expect"]), mode))
        if work.get("optimizer"):
            break  # the first iteration has a known result; later ones move the weights on
    window: list[float] = []
    samples = sample_with_barrier(steps, kv.barrier, int(work["warmup"]), int(work["iters"]), repeats, window)
    return {"samples_s": samples, "iters": int(work["iters"]), "check": checks, "window_monotonic_s": window,
            "setup_and_run_s": time.perf_counter() - started}


def main() -> int:
    """Run every workload of the spec and print the result."""
    spec = read_spec()
    import pskv
    from pskv.config import ClusterConfig, Config

    kv = pskv.create("dist_sync")
    rank = kv.rank
    compression = spec.get("compression")
    if compression:  # before any init (MXNet's rule)
        kv.set_gradient_compression(compression)
    results = {w["name"]: run_workload(kv, w, rank, int(spec["repeats"]), bool(compression))
               for w in spec["workloads"]}
    kv.close()
    emit({"system": "pskv", "rank": rank, "pid": os.getpid(), "results": results,
          "environment": {"python": platform.python_version(), "numpy": np.__version__, "pskv": pskv.__version__,
                          "pskv_file": pskv.__file__,
                          "pskv_config": dataclasses.asdict(Config.from_env()),
                          "cluster_bigarray_bound": ClusterConfig.from_env().bigarray_bound}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
