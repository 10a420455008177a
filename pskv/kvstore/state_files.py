"""A distributed store's optimizer-state files: written and read by the worker that calls, where its user says.

``save_optimizer_states(fname)`` on a ``dist_*`` store writes one file per server,
``<fname>.server<rank>``, each in the local store's format (:mod:`pskv.optimizer.states`: a
safetensors file, no pickle) and holding that server's shard of the state. The servers send
their state over the protocol (:meth:`~pskv.worker.control.WorkerControl.save_states`); this
worker — rank 0, which makes the call for the job — writes the files, atomically, at the path
its user gave: relative to its own working directory, or absolute, anywhere this process may
write. ``load_optimizer_states(fname)`` reads them here and sends each server its own
(:meth:`~pskv.worker.control.WorkerControl.load_states`), which the server checks against its
shard before taking it.

So the files land where the user says, on the host of the worker that called (no shared file
system needed), and no server ever writes or reads a path a peer chose (docs/security.md).
One server's state travels as one message: past ``PSKV_MAX_MESSAGE_BYTES`` it is refused
(by the server on save, here on load), naming the setting.
"""

from __future__ import annotations

import os

from pskv.errors import OptimizerStateError
from pskv.optimizer import states
from pskv.worker import KVWorker

__all__ = ["load_states", "save_states", "state_file"]


def state_file(fname: str, server: int) -> str:
    """The file of server ``server``'s state: ``<fname>.server<rank>``, absolute (against this process's directory)."""
    return os.path.abspath(f"{os.fspath(fname)}.server{server}")


def save_states(worker: KVWorker, fname: str, dump_optimizer: bool) -> None:
    """Fetch every server's optimizer state and write ``<fname>.server<rank>`` for each.

    Raises:
        OptimizerStateError: a file could not be written (naming it; its folder must exist).
        RemoteError: a server has no optimizer, or its state exceeds ``PSKV_MAX_MESSAGE_BYTES``.
    """
    docs = worker.control.save_states(dump_optimizer)
    for file, doc in zip((state_file(fname, r) for r in range(len(docs))), docs, strict=True):
        try:
            states.save(file, doc)
        except OSError as exc:  # a pskv error naming the file, not a bare FileNotFoundError
            raise OptimizerStateError(f"save_optimizer_states: cannot write {file}: {exc.strerror or exc}") from None


def load_states(worker: KVWorker, fname: str, num_servers: int, max_message_bytes: int) -> None:
    """Read ``<fname>.server<rank>`` for every server and give each server its state.

    Every file is read and checked before any server gets its state.

    Raises:
        OptimizerStateError: a file is missing, unreadable, not a pskv state file, or bigger than
            one message may carry (each names the file).
        RemoteError: a server found the state does not fit its shard (keys, shapes).
    """
    docs = []
    for file in (state_file(fname, r) for r in range(num_servers)):
        try:
            size = os.path.getsize(file)
            if size > max_message_bytes:
                raise OptimizerStateError(
                    f"load_optimizer_states: {file} holds {size} bytes, more than one message carries "
                    f"(PSKV_MAX_MESSAGE_BYTES={max_message_bytes}; raise it on every node of the job)")
            docs.append(states.load(file))
        except OSError as exc:
            raise OptimizerStateError(f"load_optimizer_states: cannot read {file}: {exc.strerror or exc}") from None
        except OptimizerStateError as exc:
            if file in str(exc):
                raise
            raise OptimizerStateError(f"load_optimizer_states: {file}: {exc}") from None
    worker.control.load_states(docs)
