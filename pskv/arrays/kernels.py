"""Memory-bound CPU kernels on NumPy arrays: fused multi-source sums and copies, in batches.

Summation and copying of large arrays are limited by memory bandwidth, not by
arithmetic. Three things get close to that limit with plain NumPy:

* **Blocking.** Summing ``k`` sources pairwise over whole arrays streams the partial
  sum through memory ``k - 1`` times. Working on cache-sized blocks keeps the partial
  sum in cache, so every source is read once and the result written once.
* **Threads.** NumPy ufuncs release the GIL, so a few threads, each on its own range,
  add memory parallelism (one core rarely saturates the bus).
* **Batches.** A call over many keys (a model's parameter list) is one batch: its
  total work is cut into equal shares per thread, across array boundaries, so many
  medium-sized arrays parallelise as well as one large one.

Small batches take a direct path: a thread hand-off costs more than it saves.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = ["CpuKernels"]

NDArray = np.ndarray[Any, Any]
# One unit of work: destination, its sources (one source = a copy), element range.
_Task = tuple[NDArray, Sequence[NDArray], int, int]


class CpuKernels:
    """Sum and copy NumPy arrays with blocking, batching and a small thread pool.

    Args:
        threads: threads used for large batches (1 disables threading).
        parallel_bytes: a batch is split over the threads when each gets at least this
            many bytes to write.
        block_elements: elements per cache block in the blocked sum.
    """

    def __init__(self, threads: int = 2, parallel_bytes: int = 1 << 20, block_elements: int = 1 << 15) -> None:
        self.threads = max(1, int(threads))
        self.parallel_bytes = parallel_bytes
        self.block_elements = block_elements
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Stop the worker threads (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.threads - 1, thread_name_prefix="pskv-kernel")
        return self._pool

    # -- public operations ---------------------------------------------------------------
    def sum_into(self, dst: NDArray, srcs: Sequence[NDArray]) -> None:
        """``dst[...] = srcs[0] + srcs[1] + ...`` (same shape and dtype).

        ``dst`` may be one of ``srcs`` only if it is ``srcs[0]``.
        """
        self.run([(dst, srcs)])

    def copy(self, dst: NDArray, src: NDArray) -> None:
        """``dst[...] = src``."""
        self.run([(dst, [src])])

    def run(self, jobs: Sequence[tuple[NDArray, Sequence[NDArray]]]) -> None:
        """Run a batch of jobs ``dst[...] = sum(srcs)`` (one source: a copy).

        Destinations must be distinct from each other and from every source, except
        that a destination may be its own first source.
        """
        flat: list[tuple[NDArray, Sequence[NDArray]]] = []
        nbytes = 0
        for dst, srcs in jobs:
            views = _flat_views(dst, srcs)
            if views is None:  # some array is not contiguous: whole-array ufuncs
                _sum_whole(dst, srcs)
                continue
            flat.append(views)
            nbytes += dst.nbytes
        if not flat:
            return
        # Split only when every thread gets at least parallel_bytes: a hand-off to a pool
        # thread costs tenths of a millisecond, more than copying a small share.
        if nbytes < self.parallel_bytes * self.threads or self.threads == 1:
            for d, s in flat:
                self._work(d, s, 0, d.shape[0])
            return
        shares = _split(flat, self.threads)
        pool = self._executor()
        futures = [pool.submit(self._run_share, share) for share in shares[1:]]
        self._run_share(shares[0])
        _wait_all(futures)

    # -- internals -----------------------------------------------------------------------
    def _run_share(self, share: list[_Task]) -> None:
        for d, s, lo, hi in share:
            self._work(d, s, lo, hi)

    def _work(self, dst: NDArray, srcs: Sequence[NDArray], lo: int, hi: int) -> None:
        if len(srcs) == 1:
            np.copyto(dst[lo:hi], srcs[0][lo:hi])
            return
        step = self.block_elements
        add = np.add
        first, second, rest = srcs[0], srcs[1], srcs[2:]
        for start in range(lo, hi, step):
            end = min(start + step, hi)
            d = dst[start:end]
            add(first[start:end], second[start:end], out=d)
            for s in rest:
                add(d, s[start:end], out=d)


def _split(jobs: list[tuple[NDArray, Sequence[NDArray]]], parts: int) -> list[list[_Task]]:
    """Cut the jobs' element ranges into ``parts`` shares of (nearly) equal cost."""
    total = sum(d.shape[0] * (len(s) + 1) for d, s in jobs)  # elements read + written
    per_share = -(-total // parts)
    shares: list[list[_Task]] = [[] for _ in range(parts)]
    index, room = 0, per_share
    for d, s in jobs:
        n = d.shape[0]
        unit = len(s) + 1
        lo = 0
        while lo < n:
            take = n - lo if index == parts - 1 else min(n - lo, max(1, room // unit))
            shares[index].append((d, s, lo, lo + take))
            lo += take
            room -= take * unit
            if room <= 0 and index < parts - 1:
                index += 1
                room = per_share
    return shares


def _sum_whole(dst: NDArray, srcs: Sequence[NDArray]) -> None:
    if len(srcs) == 1:
        np.copyto(dst, srcs[0])
        return
    np.add(srcs[0], srcs[1], out=dst)
    for s in srcs[2:]:
        np.add(dst, s, out=dst)


def _flat_views(dst: NDArray, srcs: Sequence[NDArray]) -> tuple[NDArray, list[NDArray]] | None:
    if not dst.flags.c_contiguous or not all(s.flags.c_contiguous for s in srcs):
        return None
    return dst.reshape(-1), [s.reshape(-1) for s in srcs]


def _wait_all(futures: list[Future[Any]]) -> None:
    # Kernel tasks are pure NumPy calls on validated arrays; they finish in bounded time.
    for f in futures:
        f.result()
