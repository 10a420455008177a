"""Valid and hostile wire messages, for tests and benchmarks that attack a server.

The one place outside :mod:`pskv.protocol` that knows the header's layout: well-formed
messages are built with :func:`pskv.protocol.encode`; deliberately malformed ones (a
field of the wrong type, an unknown dtype code, a truncated header) with
:func:`raw_header`, whose field order ``tests/fault/test_fuzz_server.py`` checks against
the codec. When the protocol changes, only this module changes.

Everything here is deterministic given a :class:`random.Random`, so a benchmark run or a
failing example can be reproduced from its seed. Hypothesis is a test extra: it is
imported only by :func:`message_strategy`.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from pskv.arrays.dtypes import SUPPORTED_DTYPES
from pskv.protocol import PROTOCOL_VERSION, ArraySpec, Command, Flag, Header, compact, encode

__all__ = [
    "BODIES",
    "FUZZ_COMMANDS",
    "UNIX_JUNK",
    "EPOCHS",
    "HEADER_FIELDS",
    "HOSTILE_KINDS",
    "SENDERS",
    "big_header",
    "chosen_paths",
    "dtype_code",
    "forged_messages",
    "fuzz_case",
    "header_fields",
    "hello",
    "hostile_messages",
    "message_strategy",
    "mutate",
    "pack",
    "probe_pull",
    "pull_of",
    "push_of",
    "raw_array",
    "raw_header",
    "reply_request",
    "valid_message",
    "valid_request",
]

# the header is a msgpack list of these fields, in this order (pskv.protocol.codec.encode), then in an
# elastic job a ninth, the sender's view epoch (absent: 0)
HEADER_FIELDS = ("version", "command", "request", "sender", "priority", "body", "arrays", "flags")
EPOCHS = (0, 0, 0, 1, 7, 2**40)  # the epochs valid messages carry (0: none, as in every job that is not elastic)
# bodies a data command might carry, well-formed or not (JSON of the wrong shape, not JSON, deep nesting)
BODIES = ("", "{}", '{"overwrite": true}', '{"parts": [[1, 0, 0]]}', '{"parts": "x"}', '{"shm": [[1, 0]]}',
          "not json", '{"rounds": [1e308]}', "[" * 1000)
# commands a hostile peer sends to a server: data requests, a HELLO, and a reply-only command
FUZZ_COMMANDS = (Command.PUSH, Command.PULL, Command.INIT, Command.PUSHPULL, Command.HELLO, Command.ERROR)
# claimed sender ids: workers 0-2, a server, the scheduler, and ids no node has
SENDERS = (9, 11, 13, 8, 1, -1, 2**40)
HOSTILE_KINDS = ("random bytes", "truncated frames", "bad dtype", "shape vs data mismatch", "huge declared size",
                 "bad fields", "unused keys / odd senders / bad bodies")


def dtype_code(name: str) -> int:
    """The wire code of dtype ``name`` (its index in the allow-list).

    Raises:
        ValueError: ``name`` is not a supported dtype.
    """
    return SUPPORTED_DTYPES.index(name)


def pack(fields: Sequence[Any] | Any) -> bytes:
    """``fields`` as a header frame, whatever they are (a wrong count or types, or not a list at all, make a
    hostile header)."""
    value = list(fields) if isinstance(fields, tuple) else fields
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def raw_array(key: Any, code: Any, shape: Any, offset: Any = 0, rnd: Any = 0) -> list[Any]:
    """One array description as it travels: ``[key, dtype code, shape, offset, round]``, values unchecked."""
    return [key, code, shape, offset, rnd]


def header_fields(command: Any, request: Any = 1, sender: Any = 9, priority: Any = 0, body: Any = "",
                  arrays: Sequence[Any] = (), version: Any = PROTOCOL_VERSION, flags: Any = 0,
                  epoch: Any = None) -> list[Any]:
    """The header's fields in wire order (see :data:`HEADER_FIELDS`), values unchecked.

    ``command`` may be a :class:`Command` or any value; ``arrays`` are :func:`raw_array` lists;
    ``epoch`` (any value but None) is appended as the ninth field.
    """
    cmd = int(command) if isinstance(command, Command) else command
    return [version, cmd, request, sender, priority, body, list(arrays), flags, *(() if epoch is None else (epoch,))]


def raw_header(command: Any, request: Any = 1, sender: Any = 9, priority: Any = 0, body: Any = "",
               arrays: Sequence[Any] = (), version: Any = PROTOCOL_VERSION, flags: Any = 0,
               epoch: Any = None) -> bytes:
    """A header frame with exactly these field values, valid or not (arguments as :func:`header_fields`)."""
    return pack(header_fields(command, request, sender, priority, body, arrays, version, flags, epoch))


def reply_request(head: bytes) -> int | None:
    """The request id in a received header frame, or None if it is not a readable header."""
    if head[:1] == bytes((compact.MARK,)):  # the data path's compact form (a reply without a body)
        return compact.request_of(head)
    try:
        fields = msgpack.unpackb(head, raw=False)
        return fields[HEADER_FIELDS.index("request")]  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - msgpack raises several unrelated types on garbage
        return None


# -- well-formed messages ---------------------------------------------------------------------
def valid_request(rng: random.Random, command: Any, key: int, count: int, sender: Any, body: str = "") -> list[bytes]:
    """A request with one float32 array of ``count`` zeros for ``key`` (a random request id)."""
    header = raw_header(command, rng.randrange(2**31), sender, 0, body,
                        [raw_array(key, dtype_code("float32"), [count])])
    return [header, b"\0" * (4 * count)]


def valid_message(rng: random.Random) -> list[bytes]:
    """A well-formed message of a command in :data:`FUZZ_COMMANDS`: 0-3 arrays of any dtype, keys 0-40,
    a sender from :data:`SENDERS`, a body from :data:`BODIES`, an epoch from :data:`EPOCHS`."""
    arrays, data = [], []
    for _ in range(rng.randint(0, 3)):
        dtype = rng.choice(SUPPORTED_DTYPES)
        size = rng.randint(0, 8)
        np_dtype = np.uint16 if dtype == "bfloat16" else np.dtype(dtype)
        arrays.append(ArraySpec(rng.randint(0, 40), dtype, (size,), rng.randint(0, 4), rng.randint(0, 3)))
        data.append(np.zeros(size, dtype=np_dtype))
    header = Header(rng.choice(FUZZ_COMMANDS), rng.randint(0, 2**31), rng.choice(SENDERS),
                    tuple(arrays), rng.randint(-5, 5), rng.choice(BODIES), epoch=rng.choice(EPOCHS))
    return [bytes(f) for f in encode(header, data)]


def probe_pull(request: int, key: int = 7, sender: int = 9) -> list[bytes]:
    """A PULL naming part 0 of ``key``: the server answers it at once (an error for an unknown key)."""
    return [raw_header(Command.PULL, request, sender, 0, "", [raw_array(key, dtype_code("float32"), [0])])]


# -- hostile messages -------------------------------------------------------------------------
def mutate(frames: list[bytes], rng: random.Random) -> list[bytes]:
    """``frames`` with one random damage: bytes flipped, a frame truncated, garbage appended, a frame
    dropped or duplicated, or a frame replaced by random bytes."""
    frames = list(frames)
    kind = rng.randrange(5)
    i = rng.randrange(len(frames))
    buf = bytearray(frames[i])
    if kind == 0 and buf:  # flip bytes
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
    elif kind == 1:  # truncate
        buf = buf[: rng.randint(0, len(buf))]
    elif kind == 2:  # append garbage
        buf += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    elif kind == 3:  # drop or duplicate a frame
        if len(frames) > 1 and rng.random() < 0.5:
            del frames[i]
            return frames
        frames.insert(i, frames[i])
        return frames
    else:  # a random frame instead
        buf = bytearray(rng.randbytes(rng.randint(0, 128)))
    frames[i] = bytes(buf)
    return frames


def fuzz_case(seed: int, mutated: bool, raw: list[bytes]) -> list[bytes]:
    """One fuzzing message: ``raw`` frames (30 % of the time when given) or a :func:`valid_message`,
    then :func:`mutate`\\ d if ``mutated``. Deterministic in its arguments."""
    rng = random.Random(seed)
    frames = raw if (raw and rng.random() < 0.3) else valid_message(rng)
    return mutate(frames, rng) if mutated else frames


def message_strategy() -> Any:
    """A Hypothesis strategy of :func:`fuzz_case` messages (lists of frames, possibly empty).

    Raises:
        ImportError: Hypothesis is not installed (it is a test extra).
    """
    from hypothesis import strategies as st

    return st.builds(fuzz_case, seed=st.integers(0, 2**32 - 1), mutated=st.booleans(),
                     raw=st.lists(st.binary(max_size=64), max_size=4))


def _bad_dtype(rng: random.Random) -> list[bytes]:
    code = rng.choice([-1, 6, 7, 99, 2**40, "float32", None, 2.5])
    return [raw_header(Command.PUSH, arrays=[raw_array(rng.randint(0, 40), code, [4])]), b"\0" * 16]


def _shape_mismatch(rng: random.Random) -> list[bytes]:
    count = rng.randint(1, 64)
    command = rng.choice([Command.PUSH, Command.INIT, Command.PUSHPULL])
    sender = rng.choice([9, 11])
    head = raw_header(command, 1, sender, arrays=[raw_array(rng.randint(0, 40), dtype_code("float32"),
                                                            [count, rng.randint(2, 5)])])
    return [head, b"\0" * (4 * count + rng.choice([-4, -1, 1, 3]) if count > 1 else 3)]


def _huge_declared_size(rng: random.Random) -> list[bytes]:
    f32, push = dtype_code("float32"), Command.PUSH
    choice = rng.randrange(5)
    if choice == 0:  # one array of 4 TB
        return [raw_header(push, arrays=[raw_array(5, f32, [2**40])]), b"\0" * 8]
    if choice == 1:  # a shape whose product overflows 64 bits
        return [raw_header(Command.INIT, arrays=[raw_array(5, f32, [2**31, 2**31, 2**31])]), b"\0" * 8]
    if choice == 2:  # more arrays than the limit
        return [raw_header(push, arrays=[raw_array(5, f32, [4])] * 200_001), b"\0" * 16]
    if choice == 3:  # more dimensions than the limit
        return [raw_header(push, arrays=[raw_array(5, f32, [2] * 17)]), b"\0" * (4 * 2**17)]
    return [raw_header(push, body="x" * (1 << 20), arrays=[raw_array(5, f32, [2], 2**62, 2**62)]), b"\0" * 8]


def _bad_fields(rng: random.Random) -> list[bytes]:
    fields = header_fields(Command.PUSH, epoch=1)  # the epoch field is the last one (the header's ninth)
    j = rng.randrange(len(fields))
    fields[j] = rng.choice([None, "x", -1, 0, 2**63, 1.5, [], [1, 2], PROTOCOL_VERSION + 1, 999])
    return [pack(fields if rng.random() < 0.9 else fields[:5])]


def _hostile(kind: str, rng: random.Random) -> list[bytes]:
    if kind == "random bytes":
        return [rng.randbytes(rng.randint(0, 200)) for _ in range(rng.randint(1, 4))]
    if kind == "truncated frames":
        frames = valid_request(rng, Command.PUSH, rng.randint(0, 40), rng.randint(1, 16), 9)
        j = rng.randrange(2)
        frames[j] = frames[j][: rng.randrange(max(1, len(frames[j])))]
        return frames
    if kind == "bad dtype":
        return _bad_dtype(rng)
    if kind == "shape vs data mismatch":
        return _shape_mismatch(rng)
    if kind == "huge declared size":
        return _huge_declared_size(rng)
    if kind == "bad fields":
        return _bad_fields(rng)
    return valid_request(rng, rng.choice(FUZZ_COMMANDS), rng.randint(0, 40), rng.randint(0, 8), rng.choice(SENDERS),
                         rng.choice(BODIES))


def hostile_messages(rng: random.Random, n: int) -> list[tuple[str, list[bytes]]]:
    """``n`` malformed or unwelcome messages as ``(kind, frames)``, cycling through :data:`HOSTILE_KINDS`.

    Keys are 0-40: a job under attack should use other keys, so that a well-formed
    message acting on them shows up as a handler error, not as a changed value.
    """
    return [(kind, _hostile(kind, rng)) for kind in (HOSTILE_KINDS[i % len(HOSTILE_KINDS)] for i in range(n))]


def forged_messages(key: int, count: int, sender: int = 9) -> dict[str, list[bytes]]:
    """Well-formed messages claiming to come from ``sender`` that act on a job's own float32 ``key``
    of ``count`` elements: ``dtype`` (a PUSH as float64), ``shape`` (3 elements too many),
    ``shm`` (a data-less PUSH naming the key with the SHM flag) and ``join`` (a JOIN)."""
    f32, f64 = dtype_code("float32"), dtype_code("float64")
    return {
        "dtype": [raw_header(Command.PUSH, 7, sender, arrays=[raw_array(key, f64, [count])]), b"\0" * (8 * count)],
        "shape": [raw_header(Command.PUSH, 8, sender, arrays=[raw_array(key, f32, [count + 3])]),
                  b"\0" * (4 * (count + 3))],
        "shm": [raw_header(Command.PUSH, 9, sender, arrays=[raw_array(key, f32, [count])], flags=Flag.SHM)],
        "join": [raw_header(Command.JOIN, 10, sender)],
    }


def big_header(arrays: int = 2_000_000) -> list[bytes]:
    """A PUSH declaring ``arrays`` arrays of 4 float32 but carrying one data frame: with the default
    2,000,000 a 14 MB header, under the 16 MB limit, that the decoder must refuse cheaply."""
    return [raw_header(Command.PUSH, arrays=[raw_array(5, dtype_code("float32"), [4])] * arrays), b"\0" * 16]


# -- hostile peers at the transport: slow readers, many frames, oversize, junk, state growth -------------
UNIX_JUNK = {  # name -> one packet for a server's Unix socket (flag byte, then the message bytes)
    "1 byte": b"\x00",
    "2 bytes": b"\x00\x01",
    "3 bytes": b"\x00\x01\x02",
    "bad flag byte": b"\x09" + b"\x00" * 16,
    "lying frame lengths": b"\x00" + struct.pack("<I", 3) + struct.pack("<Q", 1 << 60) * 3,
    "frame table past the packet": b"\x00" + struct.pack("<I", 2**31),
    "lengths short of the data": b"\x00" + struct.pack("<I", 1) + struct.pack("<Q", 2) + b"abcdef",
}


def hello(tx: int, sender: int = 9, request: int = 1, token: str = "") -> list[bytes]:
    """A HELLO claiming ``sender`` that names the send-only socket ``pskv-tx-<tx as 16 hex digits>``
    (with ``token``, the proof of identity a worker gets from the scheduler, if given)."""
    body = {"tx": f"{tx:016x}", **({"token": token} if token else {})}
    return [raw_header(Command.HELLO, request, sender, body=json.dumps(body))]


def pull_of(key: int, count: int, copies: int = 1, push: int = 0, sender: int = 9, request: int = 1) -> list[bytes]:
    """A PULL naming part 0 of float32 ``key`` (``count`` elements) ``copies`` times, after push number
    ``push`` of ``sender`` (0: any; a number far ahead parks the pull until that push arrives)."""
    spec = raw_array(key, dtype_code("float32"), [count], 0, push)
    return [raw_header(Command.PULL, request, sender, arrays=[spec] * copies)]


def push_of(key: int, values: np.ndarray[Any, Any], number: int, sender: int = 9, request: int = 1) -> list[bytes]:
    """A well-formed PUSH of float32 ``values`` to part 0 of ``key`` as ``sender``'s push number ``number``."""
    data = np.ascontiguousarray(values, np.float32)
    return [raw_header(Command.PUSH, request, sender, arrays=[raw_array(key, dtype_code("float32"), [data.size], 0,
                                                                         number)]), data.tobytes()]


def chosen_paths(outside: str) -> dict[str, list[bytes]]:
    """Requests claiming worker 0 that name files outside a server's directories: ``outside`` (an
    absolute directory the caller can check) and relative ``..`` escapes."""
    return {
        "save_states absolute": [raw_header(Command.SAVE_STATES, 31, 9, body=json.dumps({"path": f"{outside}/states"}))],
        "save_states ..": [raw_header(Command.SAVE_STATES, 32, 9, body='{"path": "../../pskv-chosen-states"}')],
        "save_checkpoint absolute": [raw_header(Command.SAVE_CHECKPOINT, 33, 9,
                                                body=json.dumps({"dir": f"{outside}/ckpt"}))],
        "load_states /etc/passwd": [raw_header(Command.LOAD_STATES, 34, 9, body='{"path": "/etc/passwd"}')],
    }
