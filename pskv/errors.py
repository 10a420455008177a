"""The whole pskv exception hierarchy.

Every error pskv raises derives from :class:`KVStoreError`, and each one also derives
from the builtin exception a Python user would naturally catch, so both
``except pskv.KVStoreError`` and ``except KeyError`` work. One exception pskv raises is
not an error and not here: ``pskv.WorkerDrained`` (:mod:`pskv.kvstore.elastic`), a
``SystemExit`` with code 0 that ``kv.commit()`` raises on a worker the launcher drained.

=============================  ==================  ==========================================
class                          builtin             meaning
=============================  ==================  ==========================================
``UnknownKeyError``            ``KeyError``        key was never initialised
``DuplicateKeyError``          ``KeyError``        ``init`` of a key that already exists
``ShapeMismatchError``         ``ValueError``      shape differs from the stored value
``DTypeMismatchError``         ``ValueError``      dtype differs from the stored value
``InvalidArgumentError``       ``ValueError``      any other bad argument
``InvalidTypeError``           ``TypeError``       an argument has the wrong type
``KeyTypeError``               ``TypeError``       int and str keys mixed, or a key of another type
``UnsupportedValueError``      ``TypeError``       value is not a supported array / dtype
``OperationTimeoutError``      ``TimeoutError``    a blocking call ran out of time
``StoreClosedError``           ``RuntimeError``    the store was closed by its owner
``NotSupportedError``          ``NotImplementedError``  this store type cannot do that
``ProtocolError``              ``ValueError``      a received message is malformed or hostile
``TransportError``             ``ConnectionError`` sockets failed (bind, send) or the transport stopped
``NodeFailedError``            ``ConnectionError`` a peer node died or stopped answering
``RemoteError``                ``RuntimeError``    a server answered a request with an error
``OptimizerStateError``        ``ValueError``      an optimizer-state file is unusable
``CheckpointError``            ``ValueError``      a server checkpoint is missing, incomplete or unusable
``LaunchError``                ``RuntimeError``    ``pskv launch`` could not start or run the job
``CollectiveMismatchError``    ``RuntimeError``    workers called different collectives (or in another order)
``CollectiveFailedError``      ``RuntimeError``    a collective failed on another worker (a ``RemoteError``)
``InitMismatchError``          ``ValueError``      workers ``init`` a key with different shapes or dtypes
``MembershipChangedError``     ``ConnectionError`` an elastic job's workers changed under a call: restore, redo
=============================  ==================  ==========================================
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "KVStoreError",
    "UnknownKeyError",
    "DuplicateKeyError",
    "ShapeMismatchError",
    "DTypeMismatchError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "KeyTypeError",
    "UnsupportedValueError",
    "OperationTimeoutError",
    "StoreClosedError",
    "NotSupportedError",
    "OptimizerStateError",
    "CheckpointError",
    "ProtocolError",
    "TransportError",
    "NodeFailedError",
    "RemoteError",
    "LaunchError",
    "CollectiveMismatchError",
    "CollectiveFailedError",
    "InitMismatchError",
    "MembershipChangedError",
]


class KVStoreError(Exception):
    """Root of every error raised by pskv."""


class _KeyErrorBase(KVStoreError, KeyError):
    # KeyError.__str__ wraps the message in quotes (repr of the key); keep plain text.
    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownKeyError(_KeyErrorBase):
    """A key was used before ``init`` (or ``broadcast``) created it.

    A server's names the key by ``label`` (``'w' (server key N)``: what init takes is not known there).
    """

    def __init__(self, key: Any, operation: str, *, label: str | None = None) -> None:
        named, advice = (repr(key), f"init({key!r}, value)") if label is None else (label, "init")
        super().__init__(f"key {named} has not been initialised; call {advice} or broadcast before {operation}")
        self.key = key


class DuplicateKeyError(_KeyErrorBase):
    """``init`` was called for a key that already holds a value."""

    def __init__(self, key: Any) -> None:
        super().__init__(
            f"duplicate init of key {key!r}: it already holds a value "
            "(use push, pushpull or broadcast to change it)"
        )
        self.key = key


class ShapeMismatchError(KVStoreError, ValueError):
    """An array's shape differs from the shape stored under its key.

    A server's names the key by ``label`` and compares the size of its part of the key: ``expected``
    and ``got`` are ``(elements,)``, and the message speaks of parts, not of the key's shape.
    """

    def __init__(self, key: Any, operation: str, expected: tuple[int, ...], got: tuple[int, ...], *,
                 label: str | None = None) -> None:
        if label is None:
            super().__init__(f"{operation} of key {key!r}: shape {got} does not match the stored shape {expected}")
        else:
            super().__init__(f"{operation} of key {label}: a part of {got[0]} elements does not match the "
                             f"stored part of {expected[0]} elements")
        self.key = key
        self.expected = expected
        self.got = got


class DTypeMismatchError(KVStoreError, ValueError):
    """An array's dtype differs from the dtype stored under its key."""

    def __init__(self, key: Any, operation: str, expected: str, got: str, *, label: str | None = None) -> None:
        named = repr(key) if label is None else label
        super().__init__(f"{operation} of key {named}: dtype {got} does not match the stored dtype {expected}")
        self.key = key
        self.expected = expected
        self.got = got


class InvalidArgumentError(KVStoreError, ValueError):
    """An argument is malformed (wrong lengths, out-of-range row ids, bad names, ...)."""


class InvalidTypeError(KVStoreError, TypeError):
    """An argument has the wrong type."""


class KeyTypeError(InvalidTypeError):
    """A key is neither ``int`` nor ``str``, or int and str keys were mixed in one store."""


class UnsupportedValueError(InvalidTypeError):
    """A value is not a NumPy array / PyTorch tensor of a supported dtype."""


class OperationTimeoutError(KVStoreError, TimeoutError):
    """A blocking call did not finish within its timeout."""


class StoreClosedError(KVStoreError, RuntimeError):
    """The store was closed; no further calls are accepted."""


class NotSupportedError(KVStoreError, NotImplementedError):
    """The store type does not offer this operation."""


class OptimizerStateError(KVStoreError, ValueError):
    """An optimizer-state file is malformed or does not match the store."""


class CheckpointError(KVStoreError, ValueError):
    """A server checkpoint is missing, incomplete (no manifest), damaged or does not fit the job."""


class ProtocolError(KVStoreError, ValueError):
    """A received message is malformed, breaks a limit, or speaks another protocol version."""


class TransportError(KVStoreError, ConnectionError):
    """The transport failed: an address could not be bound, or the node's sockets stopped."""


class NodeFailedError(KVStoreError, ConnectionError):
    """A peer node died or stopped answering; ``node`` names it (e.g. ``'server 1'``)."""

    def __init__(self, node: str, detail: str) -> None:
        super().__init__(f"{node} failed: {detail}")
        self.node = node


class RemoteError(KVStoreError, RuntimeError):
    """A server rejected a request; ``remote_type`` is the server-side error class name."""

    def __init__(self, node: str, remote_type: str, message: str) -> None:
        super().__init__(f"{node} rejected the request: {remote_type}: {message}")
        self.node = node
        self.remote_type = remote_type


class LaunchError(KVStoreError, RuntimeError):
    """``pskv launch`` could not start a process of the job, or the scheduler never became ready."""


class CollectiveMismatchError(KVStoreError, RuntimeError):
    """The workers that met were in different collectives (``worker 0 in save_checkpoint#3,
    worker 1 in barrier#5``): raised on every worker that met, never a silent pairing."""


class CollectiveFailedError(RemoteError):
    """A collective failed on another worker; ``node`` names it (``'worker 0'``), ``collective``
    the call, ``remote_type`` the error's class there (a server's, for a refused request)."""

    def __init__(self, node: str, collective: str, remote_type: str, message: str) -> None:
        KVStoreError.__init__(self, f"{collective} failed on {node}: {remote_type}: {message}")
        self.node = node
        self.collective = collective
        self.remote_type = remote_type


class InitMismatchError(KVStoreError, ValueError):
    """Workers ``init`` a key with different shapes or dtypes; the message names the key, the
    workers and what each of them gave (raised on every worker, at ``init``)."""


class MembershipChangedError(KVStoreError, ConnectionError):
    """The workers of an elastic job changed under a call (a member departed, or the call belonged to an
    older view): the work since the last commit was voided on every server; restore to it and redo.

    ``epoch`` names the view the change made (0: not known where it is raised), ``slot`` the worker
    slot whose departure or arrival caused it (-1: none named). Raised on every member alike.
    A ``detail`` that already is such a message (a peer's, relayed) is kept as it is.
    """

    PREFIX = "the workers changed under this call"

    def __init__(self, detail: str, epoch: int = 0, slot: int = -1) -> None:
        super().__init__(detail if detail.startswith(self.PREFIX) else
                         f"{self.PREFIX}: {detail}; the work since the last commit was voided: restore and redo")
        self.epoch = epoch
        self.slot = slot
