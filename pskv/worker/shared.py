"""Shared-memory parts: the only place a worker maps ``/dev/shm`` files.

A sync server on this host (``PSKV_SHM``) keeps each part of a key in shared memory:
one push slot per worker and the part's two values (the round's result alternates
between them). After ``init`` the worker maps them (:meth:`SharedParts.attach`); a push
then copies the part into its slot (:func:`write_slots`) and the message only names it,
and a pull's reply names which of the two values holds the result
(:meth:`SharedParts.read`). A part that cannot be mapped (another mount namespace, a
``bfloat16`` value) goes over the socket instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pskv.arrays import numpy_dtype
from pskv.errors import ProtocolError
from pskv.protocol import Header, node_name
from pskv.transport.shm import host_id, map_array, part_file
from pskv.worker.layout import KeyLayout, Part, part_view

__all__ = ["SharedPart", "SharedParts", "write_slots"]

log = logging.getLogger("pskv.worker")


@dataclass
class SharedPart:
    """A part's shared buffers on this host: this worker's push slot and the two values."""

    slot: np.ndarray[Any, Any]
    values: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]


class SharedParts:
    """The shared-memory directories of the servers on this host, and the maps made from them.

    Args:
        server_shm: per server rank, what it announced (``{"host", "dir"}``) or None.
        enabled: shared memory is on (``PSKV_SHM``) and the store is synchronous.
    """

    def __init__(self, server_shm: Sequence[dict[str, Any] | None], enabled: bool) -> None:
        here = host_id()
        self._dirs: dict[int, str] = {}
        if enabled:
            self._dirs = {s: shm["dir"] for s, shm in enumerate(server_shm)
                          if shm is not None and shm.get("host") == here}

    def attach(self, layouts: Sequence[KeyLayout], node_id: int, rank: int) -> None:
        """Map the shared buffers of parts held by servers on this host (after init).

        ``node_id`` names this worker's push slot; ``rank`` is for the log only.
        """
        for rec in layouts:
            rec.shm = [None] * len(rec.parts)
            if rec.meta.dtype == "bfloat16" or rec.sparse:  # row-sparse parts travel through sockets only
                continue
            dtype = numpy_dtype(rec.meta.dtype)
            for i, (server, offset, length) in enumerate(rec.parts):
                directory = self._dirs.get(server)
                if directory is None:
                    continue
                try:
                    rec.shm[i] = SharedPart(
                        map_array(part_file(directory, rec.skey, offset, f"w{node_id}"), dtype, length),
                        (map_array(part_file(directory, rec.skey, offset, "v0"), dtype, length),
                         map_array(part_file(directory, rec.skey, offset, "v1"), dtype, length)),
                    )
                except OSError as exc:  # e.g. another mount namespace: use the socket path
                    log.info("worker %d: key %r uses sockets, not shared memory: %s", rank, rec.key, exc)

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
