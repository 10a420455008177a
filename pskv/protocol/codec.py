"""Message <-> frames: a header frame plus one raw frame per array.

The header is msgpack, except the data path's usual message (no body, one-dimensional specs), whose
header is the fixed-width compact form of :mod:`pskv.protocol.compact` (its first byte, ``0xC1``,
starts no msgpack value): both are read here, each validated as strictly.

Encoding never copies array data: the data frames are the arrays' own buffers (send
them with ``copy=False``). Decoding validates everything before anything else looks at
the message — protocol version, command, field types, dtype allow-list, shape against
the frame's byte length, and size limits — and raises :class:`ProtocolError` on any
violation. Nothing received is unpickled or executed: msgpack decodes only plain
numbers, strings and lists here (``strict_map_key``, no extension types).

A receiver that checks who sent a message decodes it in two halves, :func:`decode_head`
(the fixed fields) and :func:`decode_arrays` (the specs), and checks the sender between
them: a stranger's message then costs its header's first fields, however many arrays it names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from pskv.arrays.dtypes import SUPPORTED_DTYPES, itemsize
from pskv.errors import ProtocolError
from pskv.protocol import compact
from pskv.protocol.messages import KNOWN_FLAGS, MAX_EPOCH, PROTOCOL_VERSION, ArraySpec, Command, Flag, Header

__all__ = ["encode", "decode", "decode_head", "decode_arrays", "frame_array", "rows_frame", "split_rows", "Limits", "DEFAULT_LIMITS"]

_DTYPE_CODE = {name: i for i, name in enumerate(SUPPORTED_DTYPES)}
_NUM_DTYPES = len(SUPPORTED_DTYPES)
_ITEMSIZES = tuple(itemsize(name) for name in SUPPORTED_DTYPES)  # by dtype code
_COMMANDS = {int(c): c for c in Command}
_INT64 = (-(2**63), 2**63 - 1)
_DATA_COMMANDS = frozenset({Command.PUSH, Command.PULL, Command.PUSHPULL})  # INIT may name its str keys
_COMPRESSED_COMMANDS = frozenset({Command.PUSH, Command.PUSHPULL, Command.REPLY})  # frames may be payloads
_ROWS_COMMANDS = frozenset({Command.INIT, Command.PUSH, Command.PULL, Command.REPLY})  # Flag.ROWS: row-sparse parts
_ID_BYTES = 8  # one int64 row id of the rows encoding
# builds a named tuple from all its fields in order, as its generated __new__ does, without that Python call
_new = tuple.__new__
# flags whose command (and body) is ruled (_check_flags); QUIET, SHM, SUMMED, OVERWRITE alone fit any message
_RULED_FLAGS = Flag.COMPRESSED | Flag.COMPRESS_REPLY | Flag.ROWS | Flag.PRESENT
# bfloat16 travels as its raw 16-bit pattern; NumPy holds it as uint16.
_NUMPY_FRAME_DTYPE: dict[str, np.dtype[Any]] = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
}


class Limits:
    """Upper bounds a decoder enforces on a message.

    Args:
        max_header_bytes: size of the header frame.
        max_arrays: number of data frames.
        max_frame_bytes: size of one data frame.
        max_dims: dimensions of one array.
        max_body_chars: length of the body text.
    """

    __slots__ = ("max_header_bytes", "max_arrays", "max_frame_bytes", "max_dims", "max_body_chars")

    def __init__(self, max_header_bytes: int = 16 << 20, max_arrays: int = 200_000,
                 max_frame_bytes: int = 16 << 30, max_dims: int = 16, max_body_chars: int = 16 << 20) -> None:
        self.max_header_bytes = max_header_bytes
        self.max_arrays = max_arrays
        self.max_frame_bytes = max_frame_bytes
        self.max_dims = max_dims
        self.max_body_chars = max_body_chars


DEFAULT_LIMITS = Limits()
PEEK_BYTES = 64 << 10  # decode_head reads a longer header only up to its specs (its sender is checked first)


def encode(header: Header, arrays: Sequence[Any] = ()) -> list[Any]:
    """Frames for ``header`` and its arrays: ``[header_bytes, *array_buffers]``.

    ``arrays`` are C-contiguous NumPy arrays matching ``header.arrays`` one to one; they
    are referenced, not copied. The caller must keep them unchanged until sent. The data path's usual
    header travels in the compact form (:mod:`pskv.protocol.compact`), every other as msgpack.
    """
    packed = compact.pack(header)
    if packed is not None:
        return [packed, *map(_buffer, arrays)] if arrays else [packed]
    specs = [[a.key, _DTYPE_CODE[a.dtype], list(a.shape), a.offset, a.round] if a.buffer < 0 else
             [a.key, _DTYPE_CODE[a.dtype], list(a.shape), a.offset, a.round, a.buffer] for a in header.arrays]
    fields = [PROTOCOL_VERSION, int(header.command), header.request, header.sender, header.priority, header.body,
              specs, header.flags]
    if header.epoch:  # an elastic job's view; every other job's header stays eight fields
        fields.append(header.epoch)
    packed = msgpack.packb(fields, use_bin_type=True)
    return [packed, *(_buffer(a) for a in arrays)]


def _buffer(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        try:  # a C-contiguous array's bytes, without a reshaped view of it
            return a.data.cast("B")
        except (TypeError, ValueError):  # not C-contiguous, or an empty multi-dimensional array
            pass
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        return memoryview(a.reshape(-1).view(np.uint8))
    return a


def _bytes_of(frame: Any) -> memoryview:
    buf = getattr(frame, "buffer", frame)  # zmq.Frame exposes .buffer
    return memoryview(buf).cast("B")


def decode(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> tuple[Header, list[memoryview]]:
    """Parse and validate a message.

    Returns:
        The header and one byte buffer per data frame (zero-copy views).

    Raises:
        ProtocolError: the message is malformed or breaks a limit; the message says how.
    """
    head = _head(frames, limits)
    if head[0] == compact.MARK:  # the data path's usual message: fixed-width fields
        return compact.decode(head, frames, limits)
    _, cmd, request, sender, priority, body, specs, flags, epoch = _fixed_fields(head, frames, limits)
    if not specs:
        return _new(Header, (cmd, request, sender, (), priority, body, flags, epoch)), []
    parsed, buffers = _arrays(cmd, flags, specs, frames, limits)
    return _new(Header, (cmd, request, sender, parsed, priority, body, flags, epoch)), buffers


def decode_head(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> tuple[Header, list[Any]]:
    """The first, cheap half of :func:`decode`: the header's fixed fields, checked, and its specs, not yet.

    A receiver that checks who sent a message does so between the halves, so a stranger's
    message costs the unpacking of its header's first fields, not its arrays: a header
    longer than :data:`PEEK_BYTES` is read only up to its specs (they and its flags are
    read and checked by :func:`decode_arrays`).

    Returns:
        The header without its arrays and the raw specs (``None``: not read yet, and the
        header's flags are 0 till then), for :func:`decode_arrays`.

    Raises:
        ProtocolError: as :func:`decode`.
    """
    head = _head(frames, limits)
    if head[0] == compact.MARK:
        return compact.decode_head(head, frames, limits.max_arrays)
    _, cmd, request, sender, priority, body, specs, flags, epoch = _fixed_fields(head, frames, limits, PEEK_BYTES)
    return _new(Header, (cmd, request, sender, (), priority, body, flags, epoch)), specs


def decode_arrays(header: Header, specs: list[Any], frames: Sequence[Any],
                  limits: Limits = DEFAULT_LIMITS) -> tuple[Header, list[memoryview]]:
    """The second half of :func:`decode`: ``header`` (from :func:`decode_head`) with its ``specs`` validated.

    Raises:
        ProtocolError: as :func:`decode`.
    """
    if type(specs) is not list and specs is not None:  # a compact header's
        return compact.decode_arrays(header, specs, frames, limits.max_frame_bytes) if specs else (header, [])
    if not specs:
        return (header, []) if specs is not None else decode(frames, limits)  # None: a long header, read now
    cmd, request, sender, _, priority, body, flags, epoch = header
    parsed, buffers = _arrays(cmd, flags, specs, frames, limits)
    return _new(Header, (cmd, request, sender, parsed, priority, body, flags, epoch)), buffers


def _head(frames: Sequence[Any], limits: Limits) -> memoryview:
    """The header frame's bytes (not empty, within the limit)."""
    if not frames:
        raise ProtocolError("empty message")
    head = memoryview(getattr(frames[0], "buffer", frames[0])).cast("B")  # _bytes_of, inline: every message
    size = len(head)
    if size > limits.max_header_bytes or not size:
        raise ProtocolError(f"header of {size} bytes exceeds the limit of {limits.max_header_bytes}" if size else
                            "undecodable header: an empty frame")
    return head


def _fixed_fields(head: memoryview, frames: Sequence[Any], limits: Limits, peek_above: int = 1 << 62) -> list[Any]:
    """The msgpack header ``head``'s eight fields and its epoch (0 when absent), unpacked within the limits; all
    but the specs checked (the command is a :class:`Command` in place of its number), and the number of data
    frames against the specs.

    A header longer than ``peek_above`` bytes: only the six fields before its specs are read and
    checked (specs ``None``, flags 0, epoch 0).
    """
    size = len(head)
    try:
        # the length limits stop a hostile header before it is built (a 14 MB header
        # declaring millions of arrays would otherwise hold the decoding thread for seconds)
        fields = _peek(head, limits) if size > peek_above else msgpack.unpackb(
            head, raw=False, strict_map_key=True, use_list=True, max_bin_len=0, max_ext_len=0, max_map_len=0,
            max_array_len=max(limits.max_arrays, limits.max_dims, 8), max_str_len=limits.max_body_chars)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"undecodable header: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(fields, list) or len(fields) != 8:
        _check_epoch(fields)  # a ninth field, an elastic job's view epoch; any other shape is refused
    else:
        fields.append(0)
    version, command, request, sender, priority, body, specs, flags, _ = fields
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {_short(version)} not supported (this node speaks {PROTOCOL_VERSION})")
    cmd = fields[1] = _COMMANDS.get(command) if type(command) is int else None
    if cmd is None:
        raise ProtocolError(f"unknown command {_short(command)}")
    lo, hi = _INT64
    # one expression for the usual case (every message passes here); details on failure
    if not (type(request) is int and type(sender) is int and type(priority) is int
            and lo <= request <= hi and lo <= sender <= hi and lo <= priority <= hi):
        _bad_ints(request, sender, priority)
    if type(body) is not str or len(body) > limits.max_body_chars:
        raise ProtocolError("body must be a string within the size limit")
    if specs is None:  # peeked at: the rest once its sender passed
        return fields
    if type(flags) is not int or flags & ~KNOWN_FLAGS or flags < 0:
        raise ProtocolError(f"flags {_short(flags)} are not a combination of the known flag bits")
    if flags & _RULED_FLAGS or body:  # the usual message has neither: nothing to check
        _check_flags(cmd, flags, body)
    if type(specs) is not list or len(specs) > limits.max_arrays:
        raise ProtocolError("array list missing or too long")
    named = (cmd is Command.PULL and not flags & Flag.ROWS) or flags & Flag.SHM  # the specs name parts, no data
    if len(frames) - 1 != (0 if named else len(specs)):
        raise ProtocolError(f"header describes {len(specs)} arrays but {len(frames) - 1} data frames arrived"
                            + (f" ({cmd.name} names its parts without data)" if named else ""))
    return fields


def _peek(head: memoryview, limits: Limits) -> list[Any]:
    """The six fields before the specs of the header ``head`` (eight fields, or nine with an epoch), then ``None``
    and 0 for its specs and flags."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0, max_map_len=0,
                                max_array_len=max(limits.max_dims, 8), max_str_len=limits.max_body_chars,
                                max_buffer_size=len(head))
    unpacker.feed(head)
    if unpacker.read_array_header() not in (8, 9):
        raise ProtocolError(_NOT_A_HEADER)
    return [*(unpacker.unpack() for _ in range(6)), None, 0]  # the epoch (0 till read) is appended


_NOT_A_HEADER = "header is not an 8-field list (9 with a view epoch)"


def _check_epoch(fields: Any) -> None:
    """Check a header that is not an 8-field list: it must be 9 fields, the last a view epoch (1 and up)."""
    if not isinstance(fields, list) or len(fields) != 9:
        raise ProtocolError(_NOT_A_HEADER)
    epoch = fields[8]
    if type(epoch) is not int or not 0 < epoch <= MAX_EPOCH:
        raise ProtocolError(f"field epoch must be a view epoch (an int in 1..{MAX_EPOCH}; absent: 0), got {_short(epoch)}")


def _arrays(cmd: Command, flags: int, specs: list[Any], frames: Sequence[Any],
            limits: Limits) -> tuple[tuple[ArraySpec, ...], list[memoryview]]:
    """The validated ``specs`` (not empty) of a message whose fixed fields passed, and its data frames' bytes."""
    rows = flags & Flag.ROWS
    if (cmd is Command.PULL and not rows) or flags & Flag.SHM:  # the specs name parts; no data frames follow
        return tuple(_shm_rows_spec(i, s, limits) if rows else _spec(i, s, None, limits)
                     for i, s in enumerate(specs)), []
    buffers = [_bytes_of(f) for f in frames[1:]]
    if rows:
        return _rows_specs(cmd, flags, specs, buffers, limits), buffers
    compressed = bool(flags & Flag.COMPRESSED)
    return tuple(_spec(i, s, buf, limits, compressed) for i, (s, buf) in enumerate(zip(specs, buffers))), buffers


def _short(value: Any, most: int = 40) -> str:
    """``repr(value)`` cut to ``most`` characters (its end replaced by ``...``): a peer's value in an error text,
    which its receiver logs, however long the peer made it."""
    text = repr(value)
    return text if len(text) <= most else text[:most - 3] + "..."


def _bad_ints(request: Any, sender: Any, priority: Any) -> None:
    """Raise naming the first of the header's int fields that is no 64-bit int."""
    lo, hi = _INT64
    for name, value in (("request", request), ("sender", sender), ("priority", priority)):
        if type(value) is not int or not lo <= value <= hi:
            raise ProtocolError(f"field {name} must be a 64-bit int, got {_short(value)}")


def _check_flags(cmd: Command, flags: int, body: str) -> None:
    """Check that the ``flags`` (known bits) and whether there is a ``body`` fit the command ``cmd``."""
    if flags & Flag.COMPRESSED and (cmd not in _COMPRESSED_COMMANDS or flags & Flag.SHM or not body):
        raise ProtocolError(f"{cmd.name}: the COMPRESSED flag needs a PUSH, PUSHPULL or REPLY with data frames and "
                            "a body naming the compression")
    if flags & Flag.COMPRESS_REPLY and (cmd not in (Command.PULL, Command.PUSHPULL) or flags & Flag.SHM or not body):
        raise ProtocolError(f"{cmd.name}: the COMPRESS_REPLY flag needs a PULL or PUSHPULL through a socket and a "
                            "body naming the compression")
    rows = flags & Flag.ROWS
    if rows and (cmd not in _ROWS_COMMANDS or flags & (Flag.COMPRESSED | Flag.COMPRESS_REPLY)):
        raise ProtocolError(f"{cmd.name}: the ROWS flag needs an INIT, PUSH, PULL or REPLY, uncompressed")
    if rows and flags & Flag.SHM and (cmd is Command.INIT or flags & Flag.PRESENT):
        raise ProtocolError(f"{cmd.name}: rows in shared memory (ROWS with SHM) need a PUSH, a PULL of named rows "
                            "or a REPLY")
    if flags & Flag.PRESENT and not (rows and cmd is Command.PULL):
        raise ProtocolError(f"{cmd.name}: the PRESENT flag needs a PULL with the ROWS flag")
    if body and cmd in _DATA_COMMANDS and not flags & (Flag.COMPRESSED | Flag.COMPRESS_REPLY):
        raise ProtocolError(f"{cmd.name} carries no body (its options are header flags)")


def _rows_specs(cmd: Command, flags: int, specs: list[Any], buffers: list[memoryview],
                limits: Limits) -> tuple[ArraySpec, ...]:
    """The validated specs of a message of row-sparse parts (Flag.ROWS) with data frames."""
    ids_only = cmd is Command.PULL
    parsed = tuple(_rows_spec(i, s, buf, limits, ids_only) for i, (s, buf) in enumerate(zip(specs, buffers)))
    if flags & Flag.PRESENT and any(spec.shape[0] for spec in parsed):
        raise ProtocolError("PULL of present rows: its specs name no rows (shape (0, row width))")
    return parsed


def _spec(i: int, s: Any, buf: memoryview | None, limits: Limits, compressed: bool = False) -> ArraySpec:
    """One validated spec; ``buf`` is its data frame (None for a part named without data).

    A ``compressed`` frame may be shorter than its elements (never longer); the receiver
    checks its exact length against the compression (:meth:`Compressor.decompress`).
    """
    usual = _usual_spec(s, buf, limits, compressed)
    if usual is not None:
        return usual
    # else the checks below name what is wrong
    if type(s) is not list or not 5 <= len(s) <= 6:
        raise ProtocolError(f"array {i}: spec is not a 5- or 6-field list")
    key, code, shape, offset, rnd = s[:5]
    buffer = s[5] if len(s) == 6 else -1
    if buffer not in (-1, 0, 1) or type(buffer) is not int:
        raise ProtocolError(f"array {i}: shared buffer index {_short(buffer)} is not 0 or 1")
    if type(key) is not int or not _INT64[0] <= key <= _INT64[1]:
        raise ProtocolError(f"array {i}: key must be a 64-bit int")
    if type(code) is not int or not 0 <= code < len(SUPPORTED_DTYPES):
        raise ProtocolError(f"array {i} (key {key}): dtype code {_short(code)} not in the allow-list")
    dtype = SUPPORTED_DTYPES[code]
    expected = _nbytes(i, key, shape, code, limits)
    if not (type(offset) is int and type(rnd) is int and 0 <= offset <= _INT64[1] and 0 <= rnd <= _INT64[1]):
        for name, v in (("offset", offset), ("round", rnd)):
            if type(v) is not int or not 0 <= v <= _INT64[1]:
                raise ProtocolError(f"array {i} (key {key}): {name} must be a non-negative 64-bit int")
    if buf is not None and (len(buf) > expected if compressed else len(buf) != expected):
        raise ProtocolError(
            f"array {i} (key {key}): shape {tuple(shape)} {dtype} needs {expected} bytes, frame has {len(buf)}"
        )
    return _new(ArraySpec, (key, dtype, tuple(shape), offset, rnd, buffer))


def _nbytes(i: int, key: int, shape: Any, code: int, limits: Limits) -> int:
    """The bytes of spec ``i``'s ``shape`` of dtype ``code``, the shape checked: a list of at most ``max_dims``
    ints in 0..2**63-1 whose non-zero dimensions' product, in bytes, is within the frame limit (NumPy refuses a
    larger shape, with a ValueError, even when another dimension is 0)."""
    if type(shape) is not list or len(shape) > limits.max_dims:
        raise ProtocolError(f"array {i} (key {key}): bad shape {_short(shape)}")
    n = spread = _ITEMSIZES[code]
    for d in shape:
        if type(d) is not int or not 0 <= d <= _INT64[1]:
            raise ProtocolError(f"array {i} (key {key}): bad shape {_short(shape)}")
        n *= d
        spread *= d or 1
    if spread > limits.max_frame_bytes:
        raise ProtocolError(f"array {i} (key {key}): {n} bytes exceeds the frame limit" if n else
                            f"array {i} (key {key}): shape {tuple(shape)} {SUPPORTED_DTYPES[code]} exceeds the frame "
                            "limit (without its zero dimensions)")
    return n


def _usual_spec(s: Any, buf: memoryview | None, limits: Limits, compressed: bool) -> ArraySpec | None:
    """:func:`_spec` of the usual spec — five fields, one dimension (a part) — if it is valid, checked in one
    expression (every message of the data path has some); None for any other spec, valid or not."""
    if type(s) is not list or len(s) != 5:
        return None
    key, code, shape, offset, rnd = s
    if not (type(shape) is list and len(shape) == 1 <= limits.max_dims and type(key) is int and type(code) is int
            and type(offset) is int and type(rnd) is int and type(shape[0]) is int
            and _INT64[0] <= key <= _INT64[1] and 0 <= code < _NUM_DTYPES and 0 <= offset <= _INT64[1]
            and 0 <= rnd <= _INT64[1] and shape[0] >= 0):
        return None
    expected = shape[0] * _ITEMSIZES[code]
    if expected > limits.max_frame_bytes or (
            buf is not None and (len(buf) > expected if compressed else len(buf) != expected)):
        return None
    return _new(ArraySpec, (key, SUPPORTED_DTYPES[code], (shape[0],), offset, rnd, -1))


def _shm_rows_spec(i: int, s: Any, limits: Limits) -> ArraySpec:
    """A spec of rows in shared memory (``ROWS`` with ``SHM``): shape ``(n, w)`` and, as its 6th field, the byte
    offset of its region in the sender's rows buffer (a multiple of 8; the receiver checks it against the buffer)."""
    if type(s) is not list or len(s) != 6:
        raise ProtocolError(f"array {i}: a ROWS spec in shared memory is a 6-field list (its region's offset last)")
    at = s[5]
    if type(at) is not int or not 0 <= at <= _INT64[1] or at % _ID_BYTES:
        raise ProtocolError(f"array {i}: shared rows offset {_short(at)} is not a non-negative multiple of {_ID_BYTES}")
    spec = _spec(i, s[:5], None, limits)
    if len(spec.shape) != 2:
        raise ProtocolError(f"array {i} (key {spec.key}): a ROWS spec has shape (rows, row width), got {spec.shape}")
    n, width = spec.shape
    if n * (_ID_BYTES + width * itemsize(spec.dtype)) > limits.max_frame_bytes:
        raise ProtocolError(f"array {i} (key {spec.key}): {n} rows of {width} {spec.dtype} exceed the frame limit")
    return spec._replace(buffer=at)


def _rows_spec(i: int, s: Any, buf: memoryview, limits: Limits, ids_only: bool) -> ArraySpec:
    """A spec of the rows encoding (:data:`Flag.ROWS`): shape ``(n, w)``, its frame exactly ``n`` int64 ids
    (``ids_only``: a PULL) or ``n`` ids then ``n * w`` elements."""
    spec = _spec(i, s, None, limits)
    if len(spec.shape) != 2:
        raise ProtocolError(f"array {i} (key {spec.key}): a ROWS spec has shape (rows, row width), got {spec.shape}")
    n, width = spec.shape
    expected = n * _ID_BYTES if ids_only else n * (_ID_BYTES + width * itemsize(spec.dtype))
    if expected > limits.max_frame_bytes:
        raise ProtocolError(f"array {i} (key {spec.key}): {n} rows of {width} {spec.dtype} need {expected} bytes, "
                            "more than the frame limit")
    if len(buf) != expected:
        raise ProtocolError(f"array {i} (key {spec.key}): {n} rows of {width} {spec.dtype}"
                            f"{' (ids only)' if ids_only else ''} need {expected} bytes, frame has {len(buf)}")
    return spec


def rows_frame(ids: np.ndarray[Any, Any], rows: np.ndarray[Any, Any] | None = None) -> np.ndarray[Any, Any]:
    """One frame of the rows encoding: ``ids`` (int64) then ``rows`` (C order, bfloat16 as its bits), as bytes.

    Without ``rows``: the ids alone (a ROWS PULL). The one copy rows make on their way out.
    """
    head = np.ascontiguousarray(ids, dtype=np.int64).view(np.uint8).reshape(-1)
    if rows is None or rows.size == 0:
        return head
    out = np.empty(head.size + rows.nbytes, np.uint8)
    out[:head.size] = head
    out[head.size:] = np.ascontiguousarray(rows).reshape(-1).view(np.uint8)
    return out


def split_rows(spec: ArraySpec, buf: memoryview, ids_only: bool = False
               ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The ``(ids, rows)`` of a decoded ROWS frame: read-only views, bfloat16 rows as raw uint16 bits;
    ``ids_only`` (a PULL's frame): ``rows`` is empty. Only the length was checked: the receiver checks the ids."""
    n, width = spec.shape
    ids = np.frombuffer(buf, dtype=np.int64, count=n)
    dtype = _NUMPY_FRAME_DTYPE[spec.dtype]
    if ids_only or n == 0:
        return ids, np.zeros((0, width), dtype)
    return ids, np.frombuffer(buf, dtype=dtype, offset=n * _ID_BYTES).reshape(n, width)


def frame_array(spec: ArraySpec, buf: memoryview) -> np.ndarray[Any, Any]:
    """A read-only NumPy view of a decoded data frame (bfloat16 as raw uint16 bits)."""
    flat = np.frombuffer(buf, dtype=_NUMPY_FRAME_DTYPE[spec.dtype])
    return flat if len(spec.shape) == 1 else flat.reshape(spec.shape)  # a part's frame is 1-D already
