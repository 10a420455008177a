"""The timing protocol the distributed benchmark's workers share, and two driver-side helpers.

Standard library only (and NumPy on the worker side), so that every worker script can
import this file — ``_dist_worker_mxnet.py`` runs in the MXNet venv, the others in pskv's
environment. The drivers start, watch and reap their processes with
:mod:`pskv.testing.jobs` (``ProcessGroup``: hard deadlines, fail fast when a process dies,
every child reaped on exit, on an error, on Ctrl-C and at interpreter exit).

* **driver side** — :func:`install_sigterm_handler` (SIGTERM becomes ``KeyboardInterrupt``,
  so ``with`` blocks reap the children) and :class:`ThreadCpuSampler`.
* **worker side** — :func:`sample_with_barrier` (warm-up, then samples of a loop of
  ``iters`` iterations, each sample started by a barrier across the workers, modes
  interleaved), :func:`read_spec` and :func:`emit`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


# -- driver side (the processes themselves: pskv.testing.jobs) ------------------------------
def install_sigterm_handler() -> None:
    """Make SIGTERM raise ``KeyboardInterrupt`` in the main thread, so ``with`` blocks reap children."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, handler)


class ThreadCpuSampler:
    """Samples the CPU time of every thread of some processes from ``/proc`` (Linux), every ``interval`` s.

    A background thread of the driver reads ``/proc/PID/task/TID/stat`` (user and system
    ticks) and ``comm`` (the thread name: ZeroMQ names its threads ``ZMQbg/IO/N``; Python
    threads keep the process name) and stores timestamped snapshots on the
    ``time.perf_counter()`` clock (CLOCK_MONOTONIC, shared with the workers' timing
    windows). :meth:`usage` then gives each thread's CPU seconds between two instants.
    The workers pause ``PSKV_BENCH_LINGER_S`` seconds after each timed window (see
    :func:`sample_with_barrier`), so the first snapshot after a window is taken while
    every process is still alive and before the next workload's set-up.
    """

    def __init__(self, pids: Mapping[str, int], interval: float = 0.05) -> None:
        self.pids = dict(pids)
        self.interval = interval
        self.snapshots: list[tuple[float, dict[tuple[str, int], tuple[str, float, float]]]] = []
        self._tick = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
        self._stop = False
        import threading

        self._thread = threading.Thread(target=self._run, name="thread-cpu-sampler", daemon=True)

    @staticmethod
    def available() -> bool:
        """True where ``/proc/self/task`` exists."""
        return os.path.isdir("/proc/self/task")

    def start(self) -> ThreadCpuSampler:
        """Start sampling."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Take a last snapshot and stop."""
        self._stop = True
        self._thread.join(5.0)

    def _snapshot(self) -> dict[tuple[str, int], tuple[str, float, float]]:
        out: dict[tuple[str, int], tuple[str, float, float]] = {}
        for name, pid in self.pids.items():
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                base = f"/proc/{pid}/task/{tid}"
                try:
                    with open(f"{base}/comm", encoding="utf-8", errors="replace") as f:
                        comm = f.read().strip()
                    with open(f"{base}/stat", encoding="ascii", errors="replace") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                label = "main" if int(tid) == pid else comm
                out[(name, int(tid))] = (label, int(fields[11]) / self._tick, int(fields[12]) / self._tick)
        return out

    def _run(self) -> None:
        while True:
            self.snapshots.append((time.perf_counter(), self._snapshot()))
            if self._stop:
                return
            time.sleep(self.interval)

    def usage(self, start: float, end: float) -> tuple[float, dict[tuple[str, int], tuple[str, float, float]]]:
        """``(seconds covered, {(process, tid): (thread label, user s, system s)})`` between the
        last snapshot at or before ``start`` and the first at or after ``end``; threads present in both."""
        before = [s for s in self.snapshots if s[0] <= start]
        after = [s for s in self.snapshots if s[0] >= end]
        if not before or not after:
            return 0.0, {}
        (t0, a), (t1, b) = before[-1], after[0]
        used = {}
        for key, (label, u1, s1) in b.items():
            if key in a:
                _, u0, s0 = a[key]
                used[key] = (label, u1 - u0, s1 - s0)
        return t1 - t0, used


# -- worker side ----------------------------------------------------------------------------
Step = Callable[[int], None]


def read_spec(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The JSON spec whose path is the first argument."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        raise SystemExit("usage: <worker script> SPEC.json")
    with open(args[0], encoding="utf-8") as f:
        return json.load(f)  # type: ignore[no-any-return]


def sample_with_barrier(steps: dict[str, Step], barrier: Callable[[], None], warmup: int, iters: int,
                        repeats: int, window: list[float] | None = None) -> dict[str, list[float]]:
    """Warm every mode up, then ``repeats`` samples per mode (modes interleaved).

    Every sample starts right after a barrier across the workers, so the workers time the
    same iterations; a sample is the time of ``iters`` iterations divided by ``iters``.

    Args:
        window: if given, receives ``[start of the first sample, end of the last]`` in
            ``time.perf_counter()`` seconds — CLOCK_MONOTONIC on Linux, the same clock in
            every process, so the driver can line it up with its per-thread CPU samples.

    Returns:
        mode -> samples in seconds per iteration, in measurement order.
    """
    for step in steps.values():
        barrier()
        step(max(1, warmup))
    samples: dict[str, list[float]] = {name: [] for name in steps}
    first = last = 0.0
    for _ in range(repeats):
        for name, step in steps.items():
            barrier()
            start = time.perf_counter()
            step(iters)
            last = time.perf_counter()
            first = first or start
            samples[name].append((last - start) / iters)
    if window is not None:
        window[:] = [first, last]
    linger = float(os.environ.get("PSKV_BENCH_LINGER_S", "0") or 0)
    if linger > 0:  # bench_dist.py --thread-cpu: a quiet moment for the sampler's snapshot after the window
        barrier()
        time.sleep(linger)
    return samples


def emit(payload: dict[str, Any]) -> None:
    """Print the worker's result as one JSON line on stdout."""
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()
