"""MXNet 1.9.1 process of ``bench/bench_dist.py``: any role of a ``dist_sync`` job; a worker prints one JSON line.

Usage (started by ``bench_dist.py`` inside the MXNet venv, with ``DMLC_*`` set)::

    .venv-mxnet/bin/python bench/_dist_worker_mxnet.py SPEC.json

With ``DMLC_ROLE=scheduler`` or ``server``, ``import mxnet`` runs that role until the job
ends and exits the process (MXNet's own mechanism); the spec is not read. With
``DMLC_ROLE=worker`` the spec's workloads run as in ``_dist_worker_pskv.py``: fresh keys
per workload, rank ``r`` pushes arrays filled with ``r + 1``, modes

* ``push_pull``: ``kv.push(key(s), vals)``, ``kv.pull(key(s), out=outs)``, ``mx.nd.waitall()``;
* ``pushpull``: ``kv.pushpull(key(s), vals, out=outs)``, ``mx.nd.waitall()``.

MXNet operations are asynchronous: an iteration is complete only after the wait. A
workload with ``optimizer`` installs ``mx.optimizer.SGD`` on the servers first
(``kv.set_optimizer``; MXNet pickles it to them), then a barrier.

This file imports only the standard library, NumPy, MXNet and ``_procs.py``.
"""

from __future__ import annotations

import os
import sys

if os.environ.get("DMLC_ROLE", "worker") != "worker":
    import mxnet  # noqa: F401  - runs the scheduler / server role and exits

import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _procs import emit, read_spec, sample_with_barrier  # noqa: E402


class MxBench:
    """One workload's keys, values and outs on an open MXNet store."""

    def __init__(self, mx: Any, kv: Any, work: dict[str, Any], rank: int) -> None:
        self.mx = mx
        self.kv = kv
        shapes = [tuple(int(d) for d in s) for s in work["shapes"]]
        keys = [int(work["key_base"]) + i for i in range(len(shapes))]
        kv.init(keys, [mx.nd.full(s, float(work["init"]), dtype="float32") for s in shapes])
        self.vals = [mx.nd.full(s, rank + 1, dtype="float32") for s in shapes]
        self.outs = [mx.nd.zeros(s, dtype="float32") for s in shapes]
        mx.nd.waitall()
        if work["as_list"]:
            self.key: Any = keys
            self.val: Any = self.vals
            self.out: Any = self.outs
        else:
            self.key, self.val, self.out = keys[0], self.vals[0], self.outs[0]

    def push_pull(self, n: int) -> None:
        """``n`` iterations of push, pull, wait."""
        kv, key, val, out, waitall = self.kv, self.key, self.val, self.out, self.mx.nd.waitall
        for _ in range(n):
            kv.push(key, val)
            kv.pull(key, out=out)
            waitall()

    def pushpull(self, n: int) -> None:
        """``n`` iterations of pushpull, wait."""
        kv, key, val, out, waitall = self.kv, self.key, self.val, self.out, self.mx.nd.waitall
        for _ in range(n):
            kv.pushpull(key, val, out=out)
            waitall()

    def check(self, expect: float, mode: str) -> str:
        """Raise unless every out holds ``expect``."""
        worst = max(float(np.max(np.abs(o.asnumpy() - np.float32(expect)))) for o in self.outs)
        if not worst <= 1e-5:
            raise RuntimeError(f"MXNet {mode}: pulled values differ from {expect} by up to {worst}")
        return f"{mode}: all {sum(o.size for o in self.outs)} elements == {expect}"


def run_workload(mx: Any, kv: Any, work: dict[str, Any], rank: int, repeats: int) -> dict[str, Any]:
    """Init, check one iteration per mode, warm up, sample."""
    started = time.perf_counter()
    bench = MxBench(mx, kv, work, rank)
    if work.get("optimizer"):
        kv.set_optimizer(mx.optimizer.SGD(**work["optimizer"]))
        kv._barrier()  # noqa: SLF001 - MXNet's worker barrier
    steps = {mode: getattr(bench, mode) for mode in work["modes"]}
    checks = []
    for mode, step in steps.items():
        for o in bench.outs:
            o[:] = 0.0
        mx.nd.waitall()
        kv._barrier()  # noqa: SLF001
        step(1)
        checks.append(bench.check(float(work["expect"]), mode))
        if work.get("optimizer"):
            break  # the first iteration has a known result; later ones move the weights on
    window: list[float] = []
    samples = sample_with_barrier(steps, kv._barrier, int(work["warmup"]), int(work["iters"]), repeats,  # noqa: SLF001
                                  window)
    return {"samples_s": samples, "iters": int(work["iters"]), "check": checks, "window_monotonic_s": window,
            "setup_and_run_s": time.perf_counter() - started}


def main() -> int:
    """Run every workload of the spec and print the result."""
    spec = read_spec()
    import mxnet as mx

    kv = mx.kv.create("dist_sync")
    rank = kv.rank
    results = {w["name"]: run_workload(mx, kv, w, rank, int(spec["repeats"])) for w in spec["workloads"]}
    try:
        features = sorted(f.name for f in mx.runtime.Features().values() if f.enabled)
    except Exception:  # noqa: BLE001 - informational only
        features = []
    env = {k: v for k, v in os.environ.items() if k.startswith(("MXNET_", "OMP_", "KMP_", "DMLC_", "PS_"))}
    emit({"system": "mxnet", "rank": rank, "pid": os.getpid(), "results": results,
          "environment": {"python": platform.python_version(), "numpy": np.__version__, "mxnet": mx.__version__,
                          "mxnet_features": features, "env": env}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
