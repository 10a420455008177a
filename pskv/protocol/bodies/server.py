"""The bodies a worker and a server exchange: connections (HELLO, REJOIN), INIT's key names and tables,
the control commands (mode, optimizer, controllers, states, checkpoints) and an elastic job's (COMMIT,
KEYS). The data path's messages carry no body, except a compressed push's :class:`CompressionParams`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from pskv.arrays.dtypes import FLOAT_DTYPES, SUPPORTED_DTYPES
from pskv.arrays.tables import check_init
from pskv.errors import InvalidArgumentError, ProtocolError
from pskv.partition import server_key
from pskv.protocol.bodies.fields import MAX_NAME, dump, field, hex_digest, json_object, nonempty
from pskv.protocol.messages import MAX_EPOCH, Flag, Header

__all__ = ["MAX_COMPRESSION_FIELDS", "MAX_KEY_NAME", "MAX_KEY_PARTS", "MAX_NAMES_CHARS", "MAX_STATE_NAMES",
           "MAX_TABLE_ROWS", "CheckpointRequest", "CheckpointSaved", "Commit", "CompressionParams", "ControllerAnswer",
           "ControllerCall", "Hello", "HelloReply", "InitBody", "KeyPart", "KeyTable", "KeysRequest", "OptimizerConfig",
           "OptimizerStates", "Rejoin", "Rejoined", "SetMode", "StatesRequest"]


class Hello(NamedTuple):
    """HELLO, how a worker opens each connection to a server: ``{token, tx?}``.

    ``token``: the worker's proof of identity from the scheduler (:class:`NodeTable`);
    the server binds the connection to the worker only if it is right
    (:mod:`pskv.server.senders`). ``tx`` (16 lowercase hex digits; ZeroMQ sessions only)
    names the worker's send-only socket (routing identity ``pskv-tx-<tx>``), whose
    requests are answered on this message's socket; a local connection, which carries
    requests and replies both ways, names none.
    """

    tx: str = ""
    token: str = ""

    def encode(self) -> str:
        return dump({"tx": self.tx, "token": self.token} if self.tx else {"token": self.token})

    @classmethod
    def parse(cls, header: Header) -> Hello:
        body = json_object(header)
        tx = body.get("tx", "")
        if not isinstance(tx, str) or tx and (len(tx) != 16 or any(c not in "0123456789abcdef" for c in tx)):
            raise ProtocolError("HELLO needs {tx: 16 lowercase hex digits} (or no tx)")
        return cls(tx, hex_digest(header, body, "token"))


class HelloReply(NamedTuple):
    """HELLO reply: ``{stream?: port}``. ``stream``: the TCP port of the server's data
    connections (:mod:`pskv.transport.stream`), on the host of its ZeroMQ address; only in
    the answer to a ZeroMQ session's HELLO, and only where the server takes them (0: not)."""

    stream: int = 0

    def encode(self) -> str:
        return dump({"stream": self.stream}) if self.stream else ""

    @classmethod
    def parse(cls, header: Header) -> HelloReply:
        stream = field(header, json_object(header), "stream", int, 0)
        if not 0 <= stream < 65536:
            raise ProtocolError(f"HELLO reply: stream {stream} is not a TCP port")
        return cls(stream)


class Rejoin(NamedTuple):
    """REJOIN: ``{token}``, the replacement worker's proof of identity (as :class:`Hello`'s): a
    replacement may open a connection with it."""

    token: str = ""

    def encode(self) -> str:
        return dump({"token": self.token})

    @classmethod
    def parse(cls, header: Header) -> Rejoin:
        return cls(hex_digest(header, json_object(header), "token"))


class Rejoined(NamedTuple):
    """REJOIN reply: ``{counts: [[key, offset, count], ...]}``: per part, how many pushes of the
    rejoining worker's rank arrived (pushes 1..count), so its replacement numbers on from there."""

    counts: tuple[tuple[int, int, int], ...]

    def encode(self) -> str:
        return dump({"counts": [list(c) for c in self.counts]})

    @classmethod
    def parse(cls, header: Header) -> Rejoined:
        counts = field(header, json_object(header), "counts", list)
        if any(type(c) is not list or len(c) != 3 or any(type(x) is not int for x in c) or c[1] < 0 or c[2] < 0
               for c in counts):
            raise ProtocolError("REJOIN reply field 'counts' must be [key, offset >= 0, count >= 0] triples")
        return cls(tuple((c[0], c[1], c[2]) for c in counts))


MAX_KEY_NAME = 256  # characters of a str key's name that INIT may carry
MAX_NAMES_CHARS = 1 << 20  # characters of names one INIT carries (keys past it are reported by number)


MAX_STATE_NAMES = 16  # state arrays of one key (an optimizer's momentum, mean, var, weight32, ...)
MAX_TABLE_ROWS = 1 << 48  # rows one part of a row-sparse key may declare (the server bounds its bytes itself)


class InitBody(NamedTuple):
    """INIT (optional): ``{names: [str, ...], tables: [[rows, init], ...]}``.

    ``names``: the names of the message's str keys, so the server's reports name them
    (:class:`~pskv.server.liveness.StallReport`). Each name must hash to a server key the
    message's specs name (:func:`pskv.partition.server_key`), so a name is bounded by the
    message and cannot be attached to another key; names longer than :data:`MAX_KEY_NAME`,
    or past :data:`MAX_NAMES_CHARS` in one message, are not sent (:meth:`of`).

    ``tables`` (an INIT with :data:`~pskv.protocol.messages.Flag.ROWS`, of row-sparse keys:
    exactly one entry per spec): the number of rows of that part (its row range on this
    server, at most :data:`MAX_TABLE_ROWS`) and the initializer the server draws them from
    (:func:`pskv.arrays.tables.check_init`; ``null``: zeros, then the rows the frame carries).
    """

    names: tuple[str, ...] = ()
    tables: tuple[tuple[int, dict[str, Any] | None], ...] = ()

    @classmethod
    def of(cls, names: Iterable[str], tables: Iterable[tuple[int, dict[str, Any] | None]] = ()) -> InitBody:
        """The names one INIT sends: distinct, short enough, within the message's budget."""
        sent: list[str] = []
        total = 0
        for name in dict.fromkeys(names):
            if len(name) <= MAX_KEY_NAME and total + len(name) <= MAX_NAMES_CHARS:
                sent.append(name)
                total += len(name)
        return cls(tuple(sent), tuple(tables))

    def encode(self) -> str:
        body: dict[str, Any] = {}
        if self.names:
            body["names"] = list(self.names)
        if self.tables:
            body["tables"] = [[rows, init] for rows, init in self.tables]
        return dump(body) if body else ""

    @classmethod
    def parse(cls, header: Header) -> InitBody:
        body = json_object(header)
        names = field(header, body, "names", list, [])
        keys = {spec.key for spec in header.arrays}
        if len(names) > len(keys) or any(
                type(n) is not str or len(n) > MAX_KEY_NAME or server_key(n) not in keys for n in names):
            raise ProtocolError(f"INIT body field 'names' must be at most one name (of at most {MAX_KEY_NAME} "
                                "characters) per key of the message, each the name of one of its keys")
        tables = field(header, body, "tables", list, [])
        if not header.flags & Flag.ROWS:
            if tables:
                raise ProtocolError("INIT body field 'tables' belongs to an INIT of row-sparse keys (ROWS flag)")
            return cls(tuple(names))
        if len(tables) != len(header.arrays):
            raise ProtocolError(f"INIT of row-sparse keys: its body field 'tables' needs one [rows, init] per part "
                                f"({len(header.arrays)}), got {len(tables)}")
        parsed = []
        for i, entry in enumerate(tables):
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not int \
                    or not 0 < entry[0] <= MAX_TABLE_ROWS or not (entry[1] is None or type(entry[1]) is dict):
                raise ProtocolError(f"INIT body 'tables' entry {i} must be [rows (1..{MAX_TABLE_ROWS}), "
                                    f"initializer object or null], got {str(entry)[:200]}")
            try:
                init = None if entry[1] is None else check_init(entry[1])
            except InvalidArgumentError as exc:
                raise ProtocolError(f"INIT body 'tables' entry {i}: {exc}") from None
            parsed.append((entry[0], init))
        return cls(tuple(names), tuple(parsed))


class SetMode(NamedTuple):
    """SET_MODE: ``{sync: bool}``: synchronous rounds or asynchronous updates (worker 0, at start)."""

    sync: bool

    def encode(self) -> str:
        return dump({"sync": self.sync})

    @classmethod
    def parse(cls, header: Header) -> SetMode:
        return cls(field(header, json_object(header), "sync", bool))


MAX_COMPRESSION_FIELDS = 8  # parameters of one compression (type included)


class CompressionParams(NamedTuple):
    """A COMPRESSED push's body: the compression of its frames, ``{type: str, <parameter>: number|str|bool, ...}``
    (:attr:`pskv.compression.Compressor.params`; the receiver builds it with
    :func:`pskv.compression.create`, which checks every value)."""

    params: dict[str, Any]

    def encode(self) -> str:
        return dump(self.params)

    @classmethod
    def parse(cls, header: Header) -> CompressionParams:
        body = json_object(header)
        if len(body) > MAX_COMPRESSION_FIELDS or type(body.get("type")) is not str or any(
                len(k) > MAX_NAME or not isinstance(v, (int, float, str, bool)) or isinstance(v, str) and len(v) > MAX_NAME
                for k, v in body.items()):
            raise ProtocolError(f"{header.command.name}: the compression must be {{type: str, <parameter>: number}} "
                                f"with at most {MAX_COMPRESSION_FIELDS} short fields")
        return cls(body)


class OptimizerConfig(NamedTuple):
    """SET_OPTIMIZER: the optimizer's JSON config (``Optimizer.to_config()``; never code)."""

    config: dict[str, Any]

    def encode(self) -> str:
        return dump(self.config)

    @classmethod
    def parse(cls, header: Header) -> OptimizerConfig:
        return cls(json_object(header))  # Optimizer.from_config validates the content


class ControllerCall(NamedTuple):
    """CONTROLLER: ``{head: int, body: str}`` for the controller registered under ``head``."""

    head: int
    body: str = ""

    def encode(self) -> str:
        return dump({"head": self.head, "body": self.body})

    @classmethod
    def parse(cls, header: Header) -> ControllerCall:
        body = json_object(header)
        return cls(field(header, body, "head", int), field(header, body, "body", str, ""))


class ControllerAnswer(NamedTuple):
    """CONTROLLER reply: ``{answer: str}``, what the controller returned (as text)."""

    answer: str = ""

    def encode(self) -> str:
        return dump({"answer": self.answer})

    @classmethod
    def parse(cls, header: Header) -> ControllerAnswer:
        return cls(field(header, json_object(header), "answer", str, ""))


class StatesRequest(NamedTuple):
    """SAVE_STATES: ``{dump_optimizer?: bool}``; answered with the shard's :class:`OptimizerStates`.

    It names no file, and a body that does (``path``, as SAVE_STATES once did) is refused: a
    server writes and reads no file a peer names; the worker that asked writes it.
    """

    dump_optimizer: bool = False

    def encode(self) -> str:
        return dump({"dump_optimizer": self.dump_optimizer})

    @classmethod
    def parse(cls, header: Header) -> StatesRequest:
        body = json_object(header)
        _no_path(header, body)
        return cls(field(header, body, "dump_optimizer", bool, False))


def _no_path(header: Header, body: dict[str, Any]) -> None:
    if "path" in body:
        raise ProtocolError(f"{header.command.name} names no file: a server writes and reads no state file a peer "
                            "names (the worker writes and reads it, docs/security.md)")


class OptimizerStates(NamedTuple):
    """SAVE_STATES reply and LOAD_STATES request: a shard's optimizer state, ``{num_update: int,
    optimizer: object | null, keys: [[key, count, [name, ...]], ...]}`` and one data frame per state
    array, in the order the keys list their names.

    Each frame's spec carries its key (the entry's), its dtype (a floating-point one; bfloat16 as
    its bits) and shape (checked against the frame's length by the codec); ``optimizer`` is an
    optimizer config (``Optimizer.to_config()``, checked by ``Optimizer.from_config``), or null.
    Keys are server keys, each listed once, with at most :data:`MAX_STATE_NAMES` distinct names
    of at most :data:`~pskv.protocol.bodies.fields.MAX_NAME` characters; counts are >= 0.
    What the receiving server checks against its shard (which keys it holds, their shapes) is
    :mod:`pskv.server.control`'s.
    """

    num_update: int
    keys: tuple[tuple[int, int, tuple[str, ...]], ...]
    optimizer: dict[str, Any] | None = None

    def encode(self) -> str:
        return dump({"num_update": self.num_update, "optimizer": self.optimizer,
                     "keys": [[k, c, list(names)] for k, c, names in self.keys]})

    @classmethod
    def parse(cls, header: Header) -> OptimizerStates:
        body = json_object(header)
        _no_path(header, body)
        num_update = field(header, body, "num_update", int)
        optimizer = body.get("optimizer")
        if not 0 <= num_update <= _INT64_MAX or not (optimizer is None or type(optimizer) is dict):
            raise ProtocolError(f"{header.command.name}: num_update must be in 0..{_INT64_MAX} and optimizer an "
                                "object or null")
        keys: list[tuple[int, int, tuple[str, ...]]] = []
        seen: set[int] = set()
        at = 0
        for i, entry in enumerate(field(header, body, "keys", list)):
            key, count, names = _state_entry(header, i, entry, seen)
            specs = header.arrays[at: at + len(names)]
            if len(specs) != len(names) or any(s.key != key or s.dtype not in FLOAT_DTYPES for s in specs):
                raise ProtocolError(f"{header.command.name}: keys entry {i} (key {key}) needs one floating-point "
                                    "array of its key per name")
            seen.add(key)
            at += len(names)
            keys.append((key, count, names))
        if at != len(header.arrays) or header.flags:
            raise ProtocolError(f"{header.command.name}: {len(header.arrays)} arrays for {at} state names, "
                                "or flags set")
        return cls(num_update, tuple(keys), optimizer)


_INT64_MAX = (1 << 63) - 1  # bounds a key and an update count (a key's, the optimizer's)


def _state_entry(header: Header, i: int, entry: Any, seen: set[int]) -> tuple[int, int, tuple[str, ...]]:
    """Entry ``i`` of :class:`OptimizerStates`' keys, checked: a new key, a count, distinct short names."""
    ok = type(entry) is list and len(entry) == 3 and type(entry[0]) is int and type(entry[1]) is int
    names = entry[2] if ok else None
    if not ok or not -_INT64_MAX - 1 <= entry[0] <= _INT64_MAX or entry[0] in seen or not 0 <= entry[1] <= _INT64_MAX \
            or type(names) is not list or len(names) > MAX_STATE_NAMES \
            or any(type(n) is not str or not 0 < len(n) <= MAX_NAME for n in names) or len(set(names)) != len(names):
        raise ProtocolError(f"{header.command.name}: keys entry {i} must be [key, count >= 0, [distinct names "
                            f"(at most {MAX_STATE_NAMES})]], each key once, got {str(entry)[:200]}")
    return entry[0], entry[1], tuple(names)


class CheckpointRequest(NamedTuple):
    """SAVE_CHECKPOINT: ``{dir: str}``: write this server's shard into that checkpoint directory."""

    dir: str

    def encode(self) -> str:
        return dump({"dir": self.dir})

    @classmethod
    def parse(cls, header: Header) -> CheckpointRequest:
        return cls(nonempty(header, "dir", field(header, json_object(header), "dir", str)))


class CheckpointSaved(NamedTuple):
    """SAVE_CHECKPOINT reply: ``{file: str, bytes: int, open_rounds: int}``."""

    file: str
    bytes: int
    open_rounds: int

    def encode(self) -> str:
        return dump({"file": self.file, "bytes": self.bytes, "open_rounds": self.open_rounds})

    @classmethod
    def parse(cls, header: Header) -> CheckpointSaved:
        body = json_object(header)
        return cls(field(header, body, "file", str), field(header, body, "bytes", int),
                   field(header, body, "open_rounds", int))


# -- elastic jobs (pskv.cluster.elastic) ------------------------------------------------------
class Commit(NamedTuple):
    """COMMIT (worker rank 0 -> every server): ``{epoch: int >= 1, n: int >= 1}``: snapshot the shard as
    commit ``n`` of view ``epoch``. Answered with an empty reply, or an ERROR (CollectiveMismatchError)
    when the shard holds an open round, a queued push or a parked pull."""

    epoch: int
    n: int

    def encode(self) -> str:
        return dump({"epoch": self.epoch, "n": self.n})

    @classmethod
    def parse(cls, header: Header) -> Commit:
        body = json_object(header)
        epoch, n = field(header, body, "epoch", int), field(header, body, "n", int)
        if not (0 < epoch <= MAX_EPOCH and 0 < n <= _INT64_MAX):
            raise ProtocolError(f"COMMIT: epoch and n must be ints in 1..{MAX_EPOCH}")
        return cls(epoch, n)


MAX_KEY_PARTS = 65536  # parts one KEYS reply lists (a longer table comes in pages: KeysRequest.start)


class KeysRequest(NamedTuple):
    """KEYS (a joining worker -> server): ``{start: int >= 0}``: the server's parts from the
    ``start``-th on (in the server's order), answered with a :class:`KeyTable`."""

    start: int = 0

    def encode(self) -> str:
        return dump({"start": self.start}) if self.start else ""

    @classmethod
    def parse(cls, header: Header) -> KeysRequest:
        start = field(header, json_object(header), "start", int, 0)
        if not 0 <= start <= _INT64_MAX:
            raise ProtocolError(f"KEYS: start {start} is not a part index")
        return cls(start)


class KeyPart(NamedTuple):
    """One part a server holds: its key, element offset in the whole value, dtype, elements (rows of a
    row-sparse part), row width (0: a dense part) and the key's name (``""``: an int key, or none sent)."""

    key: int
    offset: int
    dtype: str
    size: int
    row_width: int = 0
    name: str = ""


class KeyTable(NamedTuple):
    """KEYS reply: ``{parts: [[key, offset, dtype, size, row_width, name], ...], next: int}``: at most
    :data:`MAX_KEY_PARTS` parts, and ``next``: the start of the next page (0: this was the last)."""

    parts: tuple[KeyPart, ...]
    next: int = 0

    def encode(self) -> str:
        return dump({"parts": [list(p) for p in self.parts], "next": self.next})

    @classmethod
    def parse(cls, header: Header) -> KeyTable:
        body = json_object(header)
        parts = field(header, body, "parts", list)
        follow = field(header, body, "next", int, 0)
        if len(parts) > MAX_KEY_PARTS or not 0 <= follow <= _INT64_MAX:
            raise ProtocolError(f"KEYS reply: at most {MAX_KEY_PARTS} parts a page, and next a part index")
        return cls(tuple(_key_part(header, i, p) for i, p in enumerate(parts)), follow)


def _key_part(header: Header, i: int, entry: Any) -> KeyPart:
    """Entry ``i`` of a :class:`KeyTable`, checked: ints in range, an allowed dtype, a bounded name."""
    ok = type(entry) is list and len(entry) == 6 and all(type(x) is int for x in entry[:2] + entry[3:5]) \
        and entry[2] in SUPPORTED_DTYPES and type(entry[5]) is str
    if not ok or not (-_INT64_MAX - 1 <= entry[0] <= _INT64_MAX and 0 <= entry[1] <= _INT64_MAX
                      and 0 <= entry[3] <= _INT64_MAX and 0 <= entry[4] <= _INT64_MAX
                      and len(entry[5]) <= MAX_KEY_NAME):
        raise ProtocolError(f"KEYS reply: part {i} must be [key, offset >= 0, dtype, size >= 0, row width >= 0, "
                            f"name (at most {MAX_KEY_NAME} characters)], got {str(entry)[:200]}")
    return KeyPart(entry[0], entry[1], entry[2], entry[3], entry[4], entry[5])
