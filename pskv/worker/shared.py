"""Shared-memory parts: the only place a worker maps ``/dev/shm`` files.

A sync server on this host (``PSKV_SHM``) keeps each part of a key in shared memory:
one push slot per worker and the part's two values (the round's result alternates
between them), which are places in the key's two value buffers on that server (each
part at its offset in the key: the pieces of a cut slice are one buffer, updated in
place). After ``init`` the worker maps them (:meth:`SharedParts.attach`); a push then
copies the part into its slot (:func:`write_slots`) and the message only names it, and
a pull's reply names which of the two values holds the result (:meth:`SharedParts.read`). A part that cannot be mapped (another mount namespace, a
``bfloat16`` value) goes over the socket instead.

Row-sparse keys have no per-part buffers (a part may be gigabytes): this worker has one
bounded rows buffer per server on its host (:class:`RowsBuffer`, ``PSKV_SHM_ROWS_BYTES``,
made by the servers with the job's first row-sparse key). A row push or row pull takes a
region of it per message (:func:`write_rows`): the push's ids and rows, or the pull's ids
followed by room for the rows the server writes there. A push's region is free again
once the push is answered (the server copies the rows out before it answers); a pull's
once its rows were copied out (:meth:`RowsBuffer.release`). A message whose rows do not
fit in a free region goes through the socket.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pskv.arrays import numpy_dtype
from pskv.cluster.requests import Pending
from pskv.errors import OperationTimeoutError, ProtocolError
from pskv.protocol import ArraySpec, Header, Role, node_id, node_name
from pskv.transport import shm as shm_files  # (SHM_ROOT read when used: tests move it)
from pskv.transport.shm import host_id, job_prefix, map_array, map_budget, maps_left, part_file, rows_buffer
from pskv.worker.layout import KeyLayout, Part, part_view

__all__ = ["RowsBuffer", "SharedPart", "SharedParts", "read_rows", "shm_dir", "write_slots", "write_rows"]

_ID_BYTES = 8  # one int64 row id

log = logging.getLogger("pskv.worker")


@dataclass
class SharedPart:
    """A part's shared buffers on this host: this worker's push slot and the two values."""

    slot: np.ndarray[Any, Any]
    values: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]


def shm_dir(server: int, directory: str, job_id: str | None = None) -> str:
    """Server rank ``server``'s announced shared-memory ``directory``, checked before anything here opens a
    file in it (read-write maps, the local socket): one a server of the job makes
    (:class:`~pskv.transport.shm.ShmDirectory`), right under :data:`~pskv.transport.shm.SHM_ROOT`, named
    ``pskv-<job>-server-...`` (``job_id`` None: any job's).

    Raises:
        ProtocolError: another path.
    """
    real = os.path.realpath(directory)
    name = os.path.basename(real)
    prefix = f"{job_prefix(job_id)}server-" if job_id is not None else "pskv-"
    if os.path.dirname(real) != os.path.realpath(shm_files.SHM_ROOT) or not name.startswith(prefix) \
            or "-server-" not in name:
        expected = prefix if job_id is not None else "pskv-<job>-server-"
        raise ProtocolError(f"{node_name(node_id(Role.SERVER, server))} announced shared memory at "
                            f"{directory[:200]!r}: not a directory {expected}... right under {shm_files.SHM_ROOT}, "
                            "as its server makes")
    return directory


class SharedParts:
    """The shared-memory directories of the servers on this host, and the maps made from them.

    Args:
        server_shm: per server rank, what it announced (``{"host", "dir"}``) or None.
        enabled: shared memory is on (``PSKV_SHM``) and the store is synchronous.
        rows_bytes: bytes of each rows buffer (``PSKV_SHM_ROWS_BYTES``; 0: rows through sockets).
        job_id: the job's id (``PSKV_JOB_ID``), which names the servers' directories (None: any job's).

    Raises:
        ProtocolError: a server on this host announced a directory it does not make (:func:`shm_dir`).
    """

    def __init__(self, server_shm: Sequence[dict[str, Any] | None], enabled: bool, rows_bytes: int = 0,
                 job_id: str | None = None) -> None:
        here = host_id()
        self._dirs: dict[int, str] = {}
        self._rows_bytes = rows_bytes
        self._over_budget = False  # said that the process's shared maps ran out
        self.rows: dict[int, RowsBuffer | None] = {}  # server rank -> this worker's rows buffer there (None: sockets)
        if enabled:
            self._dirs = {s: shm_dir(s, shm["dir"], job_id) for s, shm in enumerate(server_shm)
                          if shm is not None and shm.get("host") == here}

    def attach(self, layouts: Sequence[KeyLayout], node_id: int, rank: int) -> None:
        """Map the shared buffers of parts held by servers on this host (after init).

        ``node_id`` names this worker's push slot; ``rank`` is for the log only.
        """
        for rec in layouts:
            rec.shm = [None] * len(rec.parts)
            if rec.sparse:
                self._attach_rows(rec, node_id, rank)
                continue
            if rec.meta.dtype == "bfloat16":
                continue
            dtype = numpy_dtype(rec.meta.dtype)
            values: dict[int, tuple[np.ndarray[Any, Any], ...]] = {}  # server -> the key's two value buffers there
            ends: dict[int, int] = {}  # server -> the end of the key's last part there: its value buffers' size
            for server, offset, length in rec.parts:
                ends[server] = max(ends.get(server, 0), offset + length)
            with map_budget:  # the check and the maps it allows, not split by another thread's
                if not self._affordable(rec, ends, rank):
                    continue
                for i, (server, offset, length) in enumerate(rec.parts):
                    directory = self._dirs.get(server)
                    if directory is None:
                        continue
                    try:
                        if server not in values:  # one pair per key and server, every part at its offset in the key
                            values[server] = tuple(map_array(part_file(directory, rec.skey, 0, name), dtype, ends[server])
                                                   for name in ("v0", "v1"))
                        v0, v1 = values[server]
                        rec.shm[i] = SharedPart(
                            map_array(part_file(directory, rec.skey, offset, f"w{node_id}"), dtype, length),
                            (v0[offset: offset + length], v1[offset: offset + length]),
                        )
                    except OSError as exc:  # e.g. another mount namespace: use the socket path
                        log.info("worker %d: key %r uses sockets, not shared memory: %s", rank, rec.key, exc)

    def _affordable(self, rec: KeyLayout, ends: dict[int, int], rank: int) -> bool:
        """Whether the process has maps left for ``rec``'s buffers here (two values per server, a slot per part);
        once it has not, the key and those after it use sockets (said once)."""
        needed = sum(2 + sum(1 for s, _, _ in rec.parts if s == server) for server in ends if server in self._dirs)
        if needed <= maps_left():
            return True
        if not self._over_budget:
            self._over_budget = True
            log.warning("worker %d: no shared-memory maps left in this process (pskv keeps to half the kernel's "
                        "vm.max_map_count); key %r and keys after it use sockets", rank, rec.key)
        return False

    def _attach_rows(self, rec: KeyLayout, node_id: int, rank: int) -> None:
        """Map this worker's rows buffer with each server on this host holding a part of ``rec`` (once each)."""
        for server, _, _ in rec.parts:
            directory = self._dirs.get(server)
            if directory is None or not self._rows_bytes or server in self.rows:
                continue
            try:
                self.rows[server] = RowsBuffer(map_array(part_file(directory, *rows_buffer(node_id)),
                                                         np.dtype(np.uint8), self._rows_bytes))
            except OSError as exc:  # e.g. PSKV_SHM_ROWS_BYTES differs from the server's: use the socket
                self.rows[server] = None
                log.info("worker %d: rows of row-sparse keys on server %d use sockets: %s", rank, server, exc)

    @staticmethod
    def read(items: Sequence[Part], reply: Header, node: int) -> list[np.ndarray[Any, Any]]:
        """The value of each part named by a shared-memory (``SHM``) reply: its spec's ``buffer``.

        Raises:
            ProtocolError: the reply does not name one of the two values of every part it answers.
        """
        if len(reply.arrays) != len(items):
            raise ProtocolError(f"{node_name(node)} named {len(reply.arrays)} shared parts for {len(items)} requested")
        out = []
        for (rec, i), spec in zip(items, reply.arrays):
            part = rec.shm[i]
            if spec.buffer not in (0, 1) or part is None or spec.offset != rec.parts[i][1]:
                raise ProtocolError(f"{node_name(node)} named shared buffer {spec.buffer!r} of offset {spec.offset} "
                                    f"for key {rec.key!r}")
            out.append(part.values[spec.buffer])
        return out


def write_slots(items: Sequence[Part]) -> None:
    """Copy each part of its key's outgoing value into this worker's shared slot."""
    for rec, i in items:
        np.copyto(rec.shm[i].slot, part_view(rec, rec.outgoing, i))  # type: ignore[union-attr]


class _Region:
    """A region of a rows buffer in use: ``[start, end)``, until its message is answered (and ``held``:
    until its rows were read)."""

    __slots__ = ("start", "end", "pending", "held")

    def __init__(self, start: int, end: int, held: bool) -> None:
        self.start = start
        self.end = end
        self.pending: Pending | None = None
        self.held = held

    def free(self) -> bool:
        """The server is done with it, and so is this worker. A request that timed out keeps its region:
        the server may still read or write it."""
        pending = self.pending
        return (not self.held and pending is not None and pending.done()
                and not isinstance(pending.error, OperationTimeoutError))


class RowsBuffer:
    """This worker's rows buffer with one server (bytes), and the regions its messages use.

    Args:
        array: the mapped buffer (uint8).
    """

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array
        self._used: list[_Region] = []  # by start
        self._lock = threading.Lock()  # calls may come from several threads (non-blocking pushes, pulls)

    def reserve(self, nbytes: int, held: bool) -> _Region | None:
        """A free region of ``nbytes`` (the first that fits), or None: the message goes through the socket."""
        with self._lock:
            self._used = [r for r in self._used if not r.free()]
            at, place = 0, len(self._used)
            for n, used in enumerate(self._used):
                if used.start - at >= nbytes:
                    place = n
                    break
                at = used.end
            if at + nbytes > self.array.size:
                return None
            region = _Region(at, at + nbytes, held)
            self._used.insert(place, region)
            return region

    @staticmethod
    def release(region: _Region) -> None:
        """A pull's rows were read: the region is free once its request is answered."""
        region.held = False

    def rows(self, spec: ArraySpec, dtype: np.dtype[Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Views of the ids and ``(n, w)`` rows of the region ``spec`` names (its offset checked by the caller)."""
        n, width = spec.shape
        start = spec.buffer
        ids = self.array[start:start + n * _ID_BYTES].view(np.int64)
        return ids, self.array[start + n * _ID_BYTES:start + n * (_ID_BYTES + width * dtype.itemsize)].view(
            dtype).reshape(n, width)


def write_rows(buffer: RowsBuffer, group: Sequence[tuple[KeyLayout, int, np.ndarray[Any, Any],
                                                         np.ndarray[Any, Any] | None]],
               number: bool, pull: bool) -> tuple[_Region, tuple[ArraySpec, ...]] | None:
    """Put one message's pieces in a region of ``buffer``: their ids and (a push) rows, or (a pull) their ids
    and room for the rows; the specs naming them (``number``: each round is the part's next push number).
    None if no free region is big enough (nothing written)."""
    sizes = []
    for rec, _, ids, _ in group:
        size = ids.size * (_ID_BYTES + rec.row_width * rec.itemsize)
        sizes.append(-(-size // _ID_BYTES) * _ID_BYTES)  # the next piece's ids stay aligned
    region = buffer.reserve(sum(sizes), held=pull)
    if region is None:
        return None
    specs = []
    at = region.start
    for (rec, i, ids, rows), size in zip(group, sizes):
        spec = ArraySpec(rec.skey, rec.meta.dtype, (int(ids.size), rec.row_width), rec.parts[i][1],
                         rec.pushes[i] + 1 if number else rec.pushes[i], at)
        out_ids, out_rows = buffer.rows(spec, numpy_dtype(rec.meta.dtype))
        out_ids[:] = ids
        if rows is not None:
            out_rows[:] = rows
        specs.append(spec)
        at += size
    return region, tuple(specs)


def read_rows(buffer: RowsBuffer, asked: Sequence[ArraySpec], reply: Header, node: int) -> list[memoryview]:
    """The region of each part a reply to a row pull in shared memory names, as :func:`pskv.protocol.split_rows`
    reads a frame (ids, then rows).

    Raises:
        ProtocolError: the reply names other regions than those asked for.
    """
    if len(reply.arrays) != len(asked) or any(
            got.buffer != spec.buffer or got.shape != spec.shape or got.dtype != spec.dtype
            for got, spec in zip(reply.arrays, asked)):
        raise ProtocolError(f"{node_name(node)} answered a row pull with other shared rows than those asked for")
    out = []
    for spec in asked:
        ids, rows = buffer.rows(spec, numpy_dtype(spec.dtype))
        out.append(memoryview(buffer.array[spec.buffer:spec.buffer + ids.nbytes + rows.nbytes]))  # type: ignore[arg-type]
    return out
