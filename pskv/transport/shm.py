"""Shared-memory buffers for nodes on the same host (the local fast path).

On one host, moving array bytes through sockets costs two kernel copies per transfer
(and ZeroMQ's own machinery); a shared-memory buffer costs one ``memcpy``. A server
creates, per key, two value buffers (each part of the key at its offset in them) and,
per part, one push slot per worker as files in a directory under ``/dev/shm``; workers
on the same host map them, write their pushes into their slot, and read results
straight from the value buffer — messages then carry only a few bytes of header. Row-sparse keys, whose parts may be gigabytes, get no
per-part buffers: each worker has one bounded rows buffer per server instead
(:func:`rows_buffer`, ``PSKV_SHM_ROWS_BYTES``), in which its messages' rows travel. The
server removes its directory when it stops.

Whether two nodes share a host is decided by :func:`host_id` (host name + boot id).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import socket
import tempfile
import threading
import weakref
from typing import Any

import numpy as np

__all__ = ["host_id", "ShmDirectory", "map_array", "maps_left", "map_budget", "part_file", "remove_job_files", "rows_buffer",
           "SHM_ROOT"]

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def host_id() -> str:
    """An id equal for processes of one running machine (host name + kernel boot id)."""
    boot = ""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        pass
    return f"{socket.gethostname()}/{boot}"


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _kernel_map_limit() -> int:
    """The kernel's limit of memory maps per process (``vm.max_map_count``)."""
    try:
        with open("/proc/sys/vm/max_map_count", encoding="ascii") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530  # Linux's default


# Shared maps one process makes at most before its keys take the socket path. Every part costs
# maps (a server: two values and a slot per worker; a worker: the values and its slot), and at
# the kernel's limit every mmap of the process fails: Python's own allocations, a new thread's
# stack, the heap. Half the limit leaves the rest to them.
MAP_BUDGET = _kernel_map_limit() // 2
_maps = [0]  # shared maps of this process now
_maps_lock = threading.Lock()
# Held from a budget check to the maps it allows (two threads of one process, e.g. an in-process
# cluster's server and workers, must not both take the last maps); unmapping does not take it.
map_budget = threading.RLock()


def maps_left() -> int:
    """How many more shared maps this process may make (:data:`MAP_BUDGET` less those alive).

    Check it and make the maps under :data:`map_budget`.
    """
    return MAP_BUDGET - _maps[0]


def _unmap(address: int, nbytes: int) -> None:
    _libc.munmap(address, nbytes)
    with _maps_lock:
        _maps[0] -= 1


class _Mapping:
    """One shared mapping, unmapped when the last array using it is gone.

    ``mmap.mmap`` keeps a duplicate of the file descriptor open for as long as the map
    lives, so a server with thousands of keys would run out of descriptors; mapping
    through libc directly lets the descriptor be closed right after ``mmap(2)``.
    """

    __slots__ = ("address", "nbytes", "__weakref__")

    def __init__(self, fd: int, nbytes: int) -> None:
        address = _libc.mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {nbytes} bytes failed: {os.strerror(err)}")
        with _maps_lock:
            _maps[0] += 1
        self.address = address
        self.nbytes = nbytes

    def array(self, dtype: np.dtype[Any], size: int) -> np.ndarray[Any, Any]:
        raw = (ctypes.c_char * self.nbytes).from_address(self.address)
        arr = np.frombuffer(raw, dtype=dtype, count=size)  # type: ignore[call-overload]
        weakref.finalize(raw, _unmap, self.address, self.nbytes)  # when the buffer is gone
        return arr


def map_array(path: str, dtype: np.dtype[Any], size: int, create: bool = False) -> np.ndarray[Any, Any]:
    """A 1-D array of ``size`` elements backed by the file ``path`` (created if asked).

    The file descriptor is closed before returning: a mapping holds none.

    Raises:
        OSError: the file cannot be created or opened, or has the wrong size.
    """
    nbytes = size * dtype.itemsize
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, nbytes)
        elif os.fstat(fd).st_size != nbytes:
            raise OSError(f"{path} has {os.fstat(fd).st_size} bytes, expected {nbytes}")
        if nbytes == 0:
            return np.zeros(0, dtype=dtype)
        mapping = _Mapping(fd, nbytes)
    finally:
        os.close(fd)
    return mapping.array(dtype, size)


class ShmDirectory:
    """A server's directory of shared buffers (removed by :meth:`remove`).

    Args:
        prefix: start of the directory name (e.g. ``'pskv-s0-'``).
    """

    def __init__(self, prefix: str) -> None:
        self.path = tempfile.mkdtemp(prefix=prefix, dir=SHM_ROOT)

    def file(self, key: int, offset: int, name: str) -> str:
        """The path of buffer ``name`` of part ``(key, offset)``."""
        return os.path.join(self.path, f"{key}_{offset}_{name}")

    def create(self, key: int, offset: int, name: str, dtype: np.dtype[Any], size: int) -> np.ndarray[Any, Any]:
        """Create and map a buffer; one made before is grown to ``size`` elements and mapped anew (its
        contents kept, its earlier maps still valid: a key's values grow as its parts arrive)."""
        path = self.file(key, offset, name)
        if not os.path.exists(path):
            return map_array(path, dtype, size, create=True)
        os.truncate(path, max(os.path.getsize(path), size * dtype.itemsize))
        return map_array(path, dtype, size)

    def remove(self) -> None:
        """Delete the directory and its files (mapped buffers stay valid until unmapped)."""
        shutil.rmtree(self.path, ignore_errors=True)


def job_prefix(job_id: str) -> str:
    """The name prefix of every shared-memory directory of job ``job_id``."""
    return f"pskv-{job_id or 'nojob'}-"


def remove_job_files(job_id: str) -> list[str]:
    """Remove this host's shared-memory directories of job ``job_id``; returns their paths."""
    if not job_id:
        return []
    removed = []
    prefix = job_prefix(job_id)
    for name in os.listdir(SHM_ROOT):
        if name.startswith(prefix):
            path = os.path.join(SHM_ROOT, name)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def part_file(directory: str, key: int, offset: int, name: str) -> str:
    """The path of buffer ``name`` of part ``(key, offset)`` in ``directory`` (worker side)."""
    return os.path.join(directory, f"{key}_{offset}_{name}")


def rows_buffer(worker: int) -> tuple[int, int, str]:
    """The ``(key, offset, name)`` a server's rows buffer for worker node ``worker`` is made under (its file
    ``-1_0_rows_w<node>``: no part's buffer has a name starting ``rows``)."""
    return -1, 0, f"rows_w{worker}"
