"""Memory-bound CPU kernels on NumPy arrays: fused multi-source sum and fan-out copy.

Summation and copying of large arrays are limited by memory bandwidth, not by
arithmetic. Two things get close to that limit with plain NumPy:

* **Blocking.** Summing ``k`` sources pairwise over whole arrays streams the partial
  sum through memory ``k - 1`` times. Working on cache-sized blocks keeps the partial
  sum in cache, so every source is read once and the result written once.
* **Threads.** NumPy ufuncs release the GIL, so a few threads, each on its own
  contiguous part, add memory parallelism (one core rarely saturates the bus).

Small arrays take a direct path: thread hand-off costs more than it saves.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Sequence

import numpy as np

__all__ = ["CpuKernels"]

NDArray = np.ndarray[Any, Any]


class CpuKernels:
    """Sum and copy NumPy arrays with blocking and a small thread pool.

    Args:
        threads: worker threads used for large arrays (1 disables threading).
        parallel_bytes: arrays at least this large are split over the threads.
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

    # -- sum ---------------------------------------------------------------------------
    def sum_into(self, dst: NDArray, srcs: Sequence[NDArray]) -> None:
        """``dst[...] = srcs[0] + srcs[1] + ...`` (all arrays same shape and dtype).

        ``dst`` may be one of ``srcs`` only if it is ``srcs[0]``.
        """
        if len(srcs) == 1:
            np.copyto(dst, srcs[0])
            return
        flat = _flat_views(dst, srcs)
        if flat is None:  # some array is not contiguous: whole-array ufuncs
            np.add(srcs[0], srcs[1], out=dst)
            for s in srcs[2:]:
                np.add(dst, s, out=dst)
            return
        fdst, fsrcs = flat
        n = fdst.shape[0]
        if dst.nbytes < self.parallel_bytes or self.threads == 1:
            self._sum_range(fdst, fsrcs, 0, n)
            return
        self._run_parallel(n, lambda lo, hi: self._sum_range(fdst, fsrcs, lo, hi))

    def _sum_range(self, dst: NDArray, srcs: Sequence[NDArray], lo: int, hi: int) -> None:
        step = self.block_elements
        add = np.add
        for start in range(lo, hi, step):
            end = min(start + step, hi)
            d = dst[start:end]
            add(srcs[0][start:end], srcs[1][start:end], out=d)
            for s in srcs[2:]:
                add(d, s[start:end], out=d)

    # -- copy --------------------------------------------------------------------------
    def copy_many(self, dsts: Sequence[NDArray], src: NDArray) -> None:
        """Copy ``src`` into every array of ``dsts`` (same shape and dtype)."""
        if len(dsts) == 1 or src.nbytes < self.parallel_bytes or self.threads == 1:
            for d in dsts:
                np.copyto(d, src)
            return
        pool = self._executor()
        futures = [pool.submit(np.copyto, d, src) for d in dsts[1:]]
        np.copyto(dsts[0], src)
        _wait_all(futures)

    def copy(self, dst: NDArray, src: NDArray) -> None:
        """``dst[...] = src``, split over the threads for large arrays."""
        flat = _flat_views(dst, [src])
        if flat is None or dst.nbytes < self.parallel_bytes or self.threads == 1:
            np.copyto(dst, src)
            return
        fdst, (fsrc,) = flat
        self._run_parallel(fdst.shape[0], lambda lo, hi: np.copyto(fdst[lo:hi], fsrc[lo:hi]))

    # -- helpers -----------------------------------------------------------------------
    def _run_parallel(self, n: int, work: Any) -> None:
        parts = self.threads
        bounds = [n * i // parts for i in range(parts + 1)]
        pool = self._executor()
        futures = [pool.submit(work, bounds[i], bounds[i + 1]) for i in range(1, parts)]
        work(bounds[0], bounds[1])
        _wait_all(futures)


def _flat_views(dst: NDArray, srcs: Sequence[NDArray]) -> tuple[NDArray, list[NDArray]] | None:
    arrays = [dst, *srcs]
    if not all(a.flags.c_contiguous for a in arrays):
        return None
    return dst.reshape(-1), [s.reshape(-1) for s in srcs]


def _wait_all(futures: list[Future[Any]]) -> None:
    # Kernel tasks are pure NumPy calls on validated arrays; they finish in bounded time.
    for f in futures:
        f.result()
