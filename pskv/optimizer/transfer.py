"""An optimizer-state document as a message: :class:`~pskv.protocol.bodies.OptimizerStates` and its arrays.

A distributed store's ``save_optimizer_states`` asks every server for its shard's state
(SAVE_STATES, answered with this message) and writes the files in the worker that called it;
``load_optimizer_states`` reads them there and sends each server its state (LOAD_STATES,
carrying this message). So a server never writes or reads a file a peer names
(docs/security.md), and the files are the local store's format (:mod:`pskv.optimizer.states`).

The state arrays travel as raw frames, each described by its spec (the key, the real dtype,
the shape; bfloat16 as its 16-bit patterns, as the file stores it), which the codec checks
against the frame before anything reads it; the counts, names and optimizer config travel as
the JSON body. Nothing is pickled.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pskv.errors import OptimizerStateError
from pskv.optimizer.states import KeyStates, StatesDocument
from pskv.protocol import ArraySpec, Header, frame_array
from pskv.protocol.bodies import OptimizerStates

__all__ = ["document", "message"]

_INT64 = (-(1 << 63), (1 << 63) - 1)


def message(doc: StatesDocument) -> tuple[str, tuple[ArraySpec, ...], list[np.ndarray[Any, Any]]]:
    """The body, the specs and the arrays of the message that carries ``doc`` (a server's document:
    its keys are server keys, ints). The arrays are ``doc``'s own where they are contiguous: a
    server copies its live state before the reply waits to be sent.

    Raises:
        OptimizerStateError: a key is not a server key (a str key, or an int past 64 bits:
            a file of a local store, whose keys are the user's).
    """
    keys, specs, arrays = [], [], []
    for ks in doc.keys:
        if type(ks.key) is not int or not _INT64[0] <= ks.key <= _INT64[1]:
            raise OptimizerStateError(f"optimizer state of key {ks.key!r}: not a server key (a distributed store's "
                                      "state files hold server keys; this one was written by a local store?)")
        keys.append((ks.key, ks.count, ks.names))
        for dtype, stored in zip(ks.dtypes, ks.arrays, strict=True):
            array = np.ascontiguousarray(stored)
            specs.append(ArraySpec(ks.key, dtype, tuple(array.shape)))
            arrays.append(array)
    return OptimizerStates(doc.num_update, tuple(keys), doc.optimizer).encode(), tuple(specs), arrays


def document(header: Header, buffers: list[memoryview]) -> StatesDocument:
    """The state document a message carries, its arrays copied out of the frames.

    Raises:
        ProtocolError: the body or its specs are malformed (:meth:`OptimizerStates.parse`).
    """
    body = OptimizerStates.parse(header)
    frames = iter(zip(header.arrays, buffers, strict=True))
    keys = []
    for key, count, names in body.keys:
        pairs = [next(frames) for _ in names]
        keys.append(KeyStates(key, count, names, tuple(spec.dtype for spec, _ in pairs),
                              tuple(frame_array(spec, buf).copy() for spec, buf in pairs)))
    return StatesDocument(body.num_update, tuple(keys), body.optimizer)
