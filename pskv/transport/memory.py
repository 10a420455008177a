"""How a node's process reuses freed memory: glibc ``malloc`` tuned for message buffers.

ZeroMQ receives every message into a newly allocated buffer, and pyzmq frees it when the
last view of it goes. With glibc's defaults a buffer of more than 128 KiB is a fresh
``mmap`` (the threshold then adapts up to the size freed, at most 32 MiB), and free
memory at the top of a heap beyond twice that threshold is handed back to the kernel —
so the next message's buffer page-faults on every 4 KiB it touches, and the kernel
zeroes each page first. ``bench/bench_transport.py`` counted 16,385 minor faults per
64 MiB message and thousands per ResNet-50 list sent in 4 MiB pieces; with freed
memory kept, the ResNet-50 list through sockets ran 1.8x faster
(``docs/benchmarks.md``).

:func:`keep_freed_memory` sets, once per process, ``M_MMAP_THRESHOLD`` to 32 MiB (the
largest glibc takes; larger blocks stay fresh maps) and ``M_TRIM_THRESHOLD`` /
``M_TOP_PAD`` so that up to ``trim_bytes`` of freed memory stays in the process for the
next message. It is process-wide — a worker's training code shares it — and does nothing
where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import platform
import threading

__all__ = ["MMAP_THRESHOLD", "keep_freed_memory"]

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc refuses more (HEAP_MAX_SIZE / 2 on 64-bit)

_lock = threading.Lock()
_done: dict[str, int] = {}


def keep_freed_memory(trim_bytes: int) -> bool:
    """Keep up to ``trim_bytes`` of freed memory for reuse (0: leave malloc as it is).

    The first call with ``trim_bytes`` > 0 in a process applies; later calls return what
    it returned. Returns True if glibc took the settings.
    """
    if trim_bytes <= 0:
        return False
    with _lock:
        if "applied" in _done:
            return bool(_done["applied"])
        applied = _apply(trim_bytes)
        _done["applied"] = int(applied)
        return applied


def _apply(trim_bytes: int) -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    value = min(trim_bytes, 2**31 - 1)
    results = [mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD), mallopt(M_TRIM_THRESHOLD, value),
               mallopt(M_TOP_PAD, min(value, 64 << 20))]
    return all(r == 1 for r in results)
