"""The compact header: the data path's usual message as fixed-width fields, decoded by one ``struct`` call.

Every push, pull, pushpull and reply of dense parts has the same shape: no body, flags among
``QUIET``, ``SHM``, ``SUMMED`` and ``OVERWRITE``, and one-dimensional specs. Such a header travels
as fixed-width little-endian fields instead of msgpack (:mod:`pskv.protocol.codec` sends every
other message as msgpack and reads both):

* the head, 36 bytes: ``0xC1`` (a byte msgpack never uses, so the two forms cannot be confused),
  version, command, flags (one byte each), then request, sender, priority and epoch (int64 each);
* one spec per array, 34 bytes: key (int64), dtype code (uint8), elements, offset, round
  (int64 each) and buffer (int8).

Why: unpacking a msgpack list yields Python values of any type, and each needs its type and
range checked, one bytecode at a time (a third of a small pushpull's Python work on the
server). Here the field widths are the checks — every int64 field is an int64 — so what is
left is one comparison per rule: the version, a known command, no flag that needs a body or
rows, non-negative sizes, offsets, rounds and epoch (one ``|`` of them), a known dtype, a
buffer in ``-1..1``, the frames' lengths. A header's length must be the head plus whole specs,
and their number is bounded (:class:`~pskv.protocol.codec.Limits`) before any is read.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, NoReturn

from pskv.arrays.dtypes import SUPPORTED_DTYPES, itemsize
from pskv.errors import ProtocolError
from pskv.protocol.messages import PROTOCOL_VERSION, ArraySpec, Command, Flag, Header

__all__ = ["MARK", "HEAD", "SPEC", "FULL_ONLY_FLAGS", "pack", "decode", "decode_head", "decode_arrays", "request_of"]

MARK = 0xC1  # "never used" in msgpack: a msgpack header cannot start with it
HEAD = struct.Struct("<BBBBqqqq")  # mark, version, command, flags, request, sender, priority, epoch
SPEC = struct.Struct("<qBqqqb")  # key, dtype code, elements, offset, round, buffer
_ONE = struct.Struct("<BBBBqqqqqBqqqb")  # HEAD and one SPEC: the usual message, one call to encode
_ONE_SIZE = _ONE.size
#: flags whose messages travel as msgpack (they carry a body naming a compression, or rows)
FULL_ONLY_FLAGS = Flag.COMPRESSED | Flag.COMPRESS_REPLY | Flag.ROWS | Flag.PRESENT
_DTYPE_CODE = {name: i for i, name in enumerate(SUPPORTED_DTYPES)}
_NUM_DTYPES = len(SUPPORTED_DTYPES)
_ITEMSIZES = tuple(itemsize(name) for name in SUPPORTED_DTYPES)  # by dtype code
_COMMANDS = {int(c): c for c in Command}
_new = tuple.__new__  # a named tuple from all its fields, without its generated __new__'s Python call


def pack(header: Header) -> bytes | None:
    """``header`` in the compact form, or None if it does not fit it (a body, a flag of :data:`FULL_ONLY_FLAGS`,
    a spec that is not one-dimensional, a value outside its field's width: msgpack carries those)."""
    command, request, sender, arrays, priority, body, flags, epoch = header
    try:
        if body or flags & FULL_ONLY_FLAGS:
            return None
        if not arrays:
            return HEAD.pack(MARK, PROTOCOL_VERSION, command, flags, request, sender, priority, epoch)
        if len(arrays) == 1:
            key, dtype, shape, offset, rnd, buffer = arrays[0]
            if len(shape) != 1:
                return None
            return _ONE.pack(MARK, PROTOCOL_VERSION, command, flags, request, sender, priority, epoch,
                             key, _DTYPE_CODE[dtype], shape[0], offset, rnd, buffer)
        if any(len(a.shape) != 1 for a in arrays):
            return None
        return b"".join([HEAD.pack(MARK, PROTOCOL_VERSION, command, flags, request, sender, priority, epoch),
                         *(SPEC.pack(a.key, _DTYPE_CODE[a.dtype], a.shape[0], a.offset, a.round, a.buffer)
                           for a in arrays)])
    except (struct.error, TypeError):  # a value outside its field, or not an int: msgpack carries it as it is
        return None


def decode(head: memoryview, frames: Sequence[Any], limits: Any) -> tuple[Header, list[memoryview]]:
    """A whole compact message, as :func:`decode_head` then :func:`decode_arrays` (``limits``: the codec's
    :class:`~pskv.protocol.codec.Limits`): the usual message of one spec read and checked in one pass."""
    if len(head) != _ONE_SIZE:
        header, raw = decode_head(head, frames, limits.max_arrays)
        return decode_arrays(header, raw, frames, limits.max_frame_bytes) if raw else (header, [])
    _, version, command, flags, request, sender, priority, epoch, *spec = _ONE.unpack(head)
    cmd = _COMMANDS.get(command)
    if version != PROTOCOL_VERSION or cmd is None or flags & FULL_ONLY_FLAGS or epoch < 0:
        _refuse(version, command, flags, epoch)
    if cmd is Command.PULL or flags & Flag.SHM:  # the spec names a part without data
        if len(frames) != 1:
            raise ProtocolError(f"header describes 1 arrays but {len(frames) - 1} data frames arrived "
                                f"({cmd.name} names its parts without data)")
        buffers: list[memoryview] = []
        parsed = _spec(0, spec, None, limits.max_frame_bytes)
    else:
        if len(frames) != 2:
            raise ProtocolError(f"header describes 1 arrays but {len(frames) - 1} data frames arrived")
        buffers = [memoryview(getattr(frames[1], "buffer", frames[1])).cast("B")]
        parsed = _spec(0, spec, buffers[0], limits.max_frame_bytes)
    return _new(Header, (cmd, request, sender, (parsed,), priority, "", flags, epoch)), buffers


def decode_head(head: memoryview, frames: Sequence[Any], max_arrays: int) -> tuple[Header, Any]:
    """The compact header ``head``'s fixed fields, checked (with the count of data ``frames``), as a header
    without arrays; and its specs raw, for :func:`decode_arrays`: a tuple of one spec's fields (the usual
    message), or the specs' bytes.

    Raises:
        ProtocolError: a bad length, version, command, flags, epoch or count of data frames.
    """
    size = len(head)
    if size == _ONE_SIZE:
        specs: Any = (SPEC.unpack_from(head, HEAD.size),)
        count = 1
    else:
        count, extra = divmod(size - HEAD.size, SPEC.size)
        if extra or count < 0:
            raise ProtocolError(f"compact header of {size} bytes is not a head and whole specs")
        if count > max_arrays:
            raise ProtocolError("array list missing or too long")
        specs = head[HEAD.size:]
    _, version, command, flags, request, sender, priority, epoch = HEAD.unpack_from(head)
    cmd = _COMMANDS.get(command)
    if version != PROTOCOL_VERSION or cmd is None or flags & FULL_ONLY_FLAGS or epoch < 0:  # one test, usually
        _refuse(version, command, flags, epoch)
    named = cmd is Command.PULL or flags & Flag.SHM  # the specs name parts, no data
    if len(frames) - 1 != (0 if named else count):
        raise ProtocolError(f"header describes {count} arrays but {len(frames) - 1} data frames arrived"
                            + (f" ({cmd.name} names its parts without data)" if named else ""))
    return _new(Header, (cmd, request, sender, (), priority, "", flags, epoch)), specs


def decode_arrays(header: Header, raw: Any, frames: Sequence[Any],
                  max_frame_bytes: int) -> tuple[Header, list[memoryview]]:
    """``header`` (from :func:`decode_head`) with its specs ``raw`` validated, and its data frames' bytes.

    Raises:
        ProtocolError: a negative size, offset or round, an unknown dtype, a bad buffer index, a frame
            over the limit or of another length than its spec's.
    """
    cmd, request, sender, _, priority, body, flags, epoch = header
    if cmd is Command.PULL or flags & Flag.SHM:  # the specs name parts without data
        buffers: list[memoryview] = []
        if type(raw) is tuple:
            specs: tuple[ArraySpec, ...] = (_spec(0, raw[0], None, max_frame_bytes),)
        else:
            specs = tuple(_spec(i, s, None, max_frame_bytes) for i, s in enumerate(SPEC.iter_unpack(raw)))
    else:
        buffers = [memoryview(getattr(f, "buffer", f)).cast("B") for f in frames[1:]]
        if type(raw) is tuple:
            specs = (_spec(0, raw[0], buffers[0], max_frame_bytes),)
        else:
            specs = tuple(_spec(i, s, buffers[i], max_frame_bytes) for i, s in enumerate(SPEC.iter_unpack(raw)))
    return _new(Header, (cmd, request, sender, specs, priority, body, flags, epoch)), buffers


def _refuse(version: int, command: int, flags: int, epoch: int) -> NoReturn:
    """Raise naming what is wrong with a compact head's version, command, flags or epoch."""
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version!r} not supported (this node speaks {PROTOCOL_VERSION})")
    if command not in _COMMANDS:
        raise ProtocolError(f"unknown command {command!r}")
    if flags & FULL_ONLY_FLAGS:
        raise ProtocolError(f"{_COMMANDS[command].name}: flags {flags} need a body or rows (the msgpack header), "
                            "not a compact one")
    raise ProtocolError(f"field epoch must be a view epoch (an int in 1..{2**63 - 1}; absent: 0), got {epoch!r}")


def _spec(i: int, raw: Sequence[int], buf: memoryview | None, max_frame_bytes: int) -> ArraySpec:
    """Spec ``i`` of a compact header from its ``raw`` fields, checked (``buf``: its data frame, if any)."""
    key, code, n, offset, rnd, buffer = raw
    if n | offset | rnd < 0 or code >= _NUM_DTYPES or not -1 <= buffer <= 1:
        raise ProtocolError(f"array {i} (key {key}): a negative size, offset or round, dtype code {code}, or "
                            f"shared buffer index {buffer}")
    expected = n * _ITEMSIZES[code]
    if expected > max_frame_bytes:
        raise ProtocolError(f"array {i} (key {key}): {expected} bytes exceeds the frame limit")
    if buf is not None and len(buf) != expected:
        raise ProtocolError(f"array {i} (key {key}): shape ({n},) {SUPPORTED_DTYPES[code]} needs {expected} "
                            f"bytes, frame has {len(buf)}")
    return _new(ArraySpec, (key, SUPPORTED_DTYPES[code], (n,), offset, rnd, buffer))


def request_of(head: bytes) -> int | None:
    """The request id of a compact header frame ``head``; None if it is none."""
    if len(head) < HEAD.size or head[0] != MARK:
        return None
    return int(HEAD.unpack_from(head)[4])
