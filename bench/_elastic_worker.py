"""The worker program of ``bench/bench_elastic.py``: an elastic job's training loop that prints a timestamped record.

Run by ``pskv launch -n MIN:MAX`` (every worker, joiners too). Each step pushes a gradient for every key of a
model of ``BENCH_EL_FLOATS`` float32 values cut into ``BENCH_EL_KEYS`` keys (SGD on the servers), pulls the
model back, and commits every ``BENCH_EL_COMMIT_EVERY`` steps; ``BENCH_EL_COMPUTE_MS`` of sleep stands for the
forward and backward pass. The job ends at the step the driver writes into ``BENCH_EL_END_FILE`` (once, some
steps ahead of the workers, so every worker reads the same number in time), at the latest ``BENCH_EL_STEPS``.
Every line the driver reads carries ``t`` = ``time.time()`` (one host, one clock):

    ev start slot S pid P t T                 first thing, before pskv is imported
    ev joined slot S rank R of W cause C t T  the store is created (C: start, or the view that admitted it)
    ev pulled slot S t T dt D                 a joiner pulled the model (D seconds)
    ev step N slot S t T                      step N's pull returned
    committed step N members A,B slot S t T   the commit after step N (members: the view the step ran in)
    restore at step N slot S t T: WHY         a departure voided the steps since commit N
    ev kill slot S step N t T                 this worker SIGKILLs itself after its push of step N + 1
                                              (``BENCH_EL_KILL`` = SLOT:N: mid-step, the round incomplete)
    ev drained slot S t T                     this worker left at a commit (the launcher drained it)

Standard library, NumPy and pskv only.
"""

from __future__ import annotations

import os
import sys
import time

T_START = time.time()
SLOT_ENV = os.environ.get("DMLC_WORKER_ID", "?")
print(f"ev start slot {SLOT_ENV} pid {os.getpid()} t {T_START:.6f}", flush=True)

import signal  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import pskv  # noqa: E402
from pskv import WorkerDrained  # noqa: E402
from pskv.errors import MembershipChangedError  # noqa: E402
from pskv.optimizer import SGD  # noqa: E402


class EndStep:
    """The step the job ends at: ``BENCH_EL_STEPS`` until the driver's end file exists, then the number in it."""

    def __init__(self, cap: int, path: str) -> None:
        self.value, self._path, self._known = cap, path, not path

    def __call__(self) -> int:
        if not self._known and os.path.exists(self._path):
            text = open(self._path, encoding="utf-8").read().strip()
            if text:
                self.value, self._known = min(self.value, int(text)), True
        return self.value


def begin(kv: Any, keys: list[str], outs: list[np.ndarray], slot: int) -> int:
    """The step this worker starts at: 0 for the first workers (after the first commit); a joiner learns it
    from rank 0 and pulls the model from the servers."""
    print(f"ev joined slot {slot} rank {kv.rank} of {kv.num_workers} cause {kv.view.cause} t {time.time():.6f}",
          flush=True)
    if kv.view.cause == "start":
        kv.commit()
        return 0
    at = np.zeros(1, np.float32)
    kv.broadcast("step", at, out=at)
    t0 = time.time()
    kv.pull(keys, out=outs)
    t1 = time.time()
    print(f"ev pulled slot {slot} t {t1:.6f} dt {t1 - t0:.6f}", flush=True)
    return int(at[0])


def main() -> int:
    """Train until the end step is committed; print the record (see the module docstring)."""
    env = os.environ
    end = EndStep(int(env["BENCH_EL_STEPS"]), env.get("BENCH_EL_END_FILE", ""))
    every = int(env.get("BENCH_EL_COMMIT_EVERY", "1"))
    floats, nkeys = int(env["BENCH_EL_FLOATS"]), int(env.get("BENCH_EL_KEYS", "4"))
    compute = float(env.get("BENCH_EL_COMPUTE_MS", "0")) / 1000.0
    kill = tuple(int(x) for x in env["BENCH_EL_KILL"].split(":")) if env.get("BENCH_EL_KILL") else (-1, -1)
    keys, size = [f"w{i}" for i in range(nkeys)], max(1, floats // nkeys)
    kv = pskv.create(env.get("BENCH_EL_STORE", "dist_sync"))
    slot = kv.view.members[kv.rank]
    for key in keys:
        kv.init(key, np.zeros(size, np.float32))
    kv.init("step", np.zeros(1, np.float32))
    kv.set_optimizer(SGD(learning_rate=2.0 ** -10))
    outs = [np.zeros(size, np.float32) for _ in keys]
    grad = np.full(size, float(slot + 1), np.float32)
    done = committed = begin(kv, keys, outs, slot)
    try:
        while committed < end():
            try:
                members = kv.view.members
                if compute:
                    time.sleep(compute)
                kv.push(keys, [grad] * len(keys))
                if (slot, done) == kill:
                    print(f"ev kill slot {slot} step {done} t {time.time():.6f}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                kv.pull(keys, out=outs)
                done += 1
                print(f"ev step {done} slot {slot} t {time.time():.6f}", flush=True)
                if done % every == 0 or done >= end():
                    view = kv.commit()
                    committed = done
                    print(f"committed step {done} members {','.join(map(str, members))} slot {slot} "
                          f"t {time.time():.6f}", flush=True)
                    if view is not None:  # workers admitted: they learn the step from rank 0
                        kv.broadcast("step", np.full(1, done, np.float32), out=np.zeros(1, np.float32))
            except MembershipChangedError as exc:
                print(f"restore at step {committed} slot {slot} t {time.time():.6f}: {exc}", flush=True)
                kv.restore()
                done = committed
    except WorkerDrained:
        print(f"ev drained slot {slot} t {time.time():.6f}", flush=True)
        raise
    kv.barrier()
    kv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
