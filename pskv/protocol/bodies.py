"""Every command's body: one typed value per body, with ``encode()`` and ``parse(header)``.

The data path has no bodies but INIT's optional key names (its options are
:class:`~pskv.protocol.messages.Flag` bits and its arrays' specs). Everything else carries one JSON object in
:attr:`Header.body`, described field by field here and nowhere else. ``parse`` checks
every field's type and range before anything uses it and raises
:class:`~pskv.errors.ProtocolError` naming the command and the field; nothing in a
body is executed, unpickled, or used as a file path without the receiver's own checks
(paths name files the *receiver* writes, as MXNet's ``save_optimizer_states`` did).

================  =====================  ================================================
command           request body           reply body
================  =====================  ================================================
REGISTER          :class:`Register`      :class:`NodeTable`
HEARTBEAT         :class:`Heartbeat`     :class:`Liveness`
METRICS           (none)                 :class:`JobReport`
BARRIER           :class:`Barrier`       :class:`Met`
SHUTDOWN          :class:`Shutdown`      (none)
INIT              :class:`InitBody`      (none)  (ROWS: each part's rows and initializer)
PUSH/PULL/        (none: flags, specs;   (none: specs; SHM flag and ``buffer`` for
PUSHPULL          COMPRESSED pushes:     shared-memory replies)
                  :class:`CompressionParams`)
HELLO             :class:`Hello`         :class:`HelloReply`
SET_MODE          :class:`SetMode`       (none)
SET_OPTIMIZER     :class:`OptimizerConfig`  (none)
CONTROLLER        :class:`ControllerCall`   :class:`ControllerAnswer`
SAVE_STATES       :class:`StatesRequest`    :class:`StatesFile`
LOAD_STATES       :class:`StatesRequest`    :class:`StatesFile`
SAVE_CHECKPOINT   :class:`CheckpointRequest`  :class:`CheckpointSaved`
SYNC, JOIN        (none)                 (none)
REJOIN            :class:`Rejoin`        :class:`Rejoined`
ERROR (reply)     —                      :class:`ErrorReply`
================  =====================  ================================================
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from typing import Any, NamedTuple, TypeVar

from pskv.arrays.tables import check_init
from pskv.errors import InvalidArgumentError, ProtocolError
from pskv.partition import server_key
from pskv.protocol.messages import Flag, Header

__all__ = [
    "Barrier", "CheckpointRequest", "Counters", "Heartbeat", "JobReport", "NodeReport", "CheckpointSaved", "ControllerAnswer", "ControllerCall", "CompressionParams", "ErrorReply", "Failure", "Hello", "HelloReply", "InitBody", "Met", "Rejoin",
    "Rejoined", "node_token", "DIGEST_CHARS",
    "Liveness", "NodeTable", "OptimizerConfig", "Register", "SetMode", "ShmInfo", "Shutdown", "StatesFile",
    "StatesRequest", "json_object",
]

T = TypeVar("T")


def json_object(header: Header) -> dict[str, Any]:
    """The header's body parsed as a JSON object (``{}`` for an empty body).

    Raises:
        ProtocolError: the body is not a JSON object.
    """
    if not header.body:
        return {}
    try:
        value = json.loads(header.body)
    except (ValueError, RecursionError) as exc:  # RecursionError: hostile nesting ("[[[[...")
        raise ProtocolError(f"{header.command.name} body is not JSON: {type(exc).__name__}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"{header.command.name} body must be a JSON object")
    return value


def _field(header: Header, body: dict[str, Any], name: str, kind: type[T], default: Any = ...) -> T:
    """``body[name]``, which must be exactly of ``kind`` (bool is not an int here)."""
    if name not in body:
        if default is ...:
            raise ProtocolError(f"{header.command.name} body needs field {name!r}")
        return default  # type: ignore[no-any-return]
    value = body[name]
    if type(value) is not kind:
        raise ProtocolError(f"{header.command.name} body field {name!r} must be {kind.__name__}, got {value!r}")
    return value  # type: ignore[no-any-return]


def _nonempty(header: Header, name: str, value: str) -> str:
    if not value:
        raise ProtocolError(f"{header.command.name} body field {name!r} must not be empty")
    return value


def _dump(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


# -- node <-> scheduler -------------------------------------------------------------------
class ShmInfo(NamedTuple):
    """Where a server's shared memory is: its directory, on which host."""

    dir: str
    host: str

    @classmethod
    def parse_value(cls, header: Header, value: Any) -> ShmInfo | None:
        """From a JSON value (None stays None)."""
        if value is None:
            return None
        if not isinstance(value, dict) or type(value.get("dir")) is not str or type(value.get("host")) is not str:
            raise ProtocolError(f"{header.command.name}: shm must be {{dir: str, host: str}} or null")
        return cls(value["dir"], value["host"])


class Register(NamedTuple):
    """REGISTER: ``{role: "server"|"worker", address: str, rank: int (-1: any), shm?: ShmInfo}``."""

    role: str
    address: str
    rank: int = -1
    shm: ShmInfo | None = None

    def encode(self) -> str:
        body: dict[str, Any] = {"role": self.role, "address": self.address, "rank": self.rank}
        if self.shm is not None:
            body["shm"] = self.shm._asdict()
        return _dump(body)

    @classmethod
    def parse(cls, header: Header) -> Register:
        body = json_object(header)
        role = _field(header, body, "role", str)
        if role not in ("server", "worker"):
            raise ProtocolError("REGISTER: role must be server or worker")
        rank = _field(header, body, "rank", int, -1)
        if rank < -1:
            raise ProtocolError(f"REGISTER: rank {rank} is not a rank (or -1)")
        return cls(role, _field(header, body, "address", str, ""), rank,
                   ShmInfo.parse_value(header, body.get("shm")))


class NodeTable(NamedTuple):
    """REGISTER reply: the node's id and rank, every server's address and shared memory, sizes;
    and the proof of identity: a server gets the job's ``secret``, a worker its ``token``
    (:func:`node_token` of its id; it opens every connection to a server with it). Both are
    optional (64 lowercase hex digits, or absent)."""

    node_id: int
    rank: int
    servers: tuple[str, ...]
    server_shm: tuple[ShmInfo | None, ...]
    num_servers: int
    num_workers: int
    recovery: bool = False
    secret: str = ""  # a server's: the job's secret, hex
    token: str = ""  # a worker's: node_token(secret, node_id)

    def encode(self) -> str:
        body = {"node_id": self.node_id, "rank": self.rank, "servers": list(self.servers),
                "server_shm": [None if s is None else s._asdict() for s in self.server_shm],
                "num_servers": self.num_servers, "num_workers": self.num_workers, "recovery": self.recovery}
        body.update((k, v) for k, v in (("secret", self.secret), ("token", self.token)) if v)
        return _dump(body)

    @classmethod
    def parse(cls, header: Header) -> NodeTable:
        body = json_object(header)
        servers = _strings(header, body, "servers")
        shm = _field(header, body, "server_shm", list)
        if len(shm) != len(servers):
            raise ProtocolError("REGISTER reply: server_shm and servers differ in length")
        return cls(_field(header, body, "node_id", int), _field(header, body, "rank", int), servers,
                   tuple(ShmInfo.parse_value(header, s) for s in shm), _field(header, body, "num_servers", int),
                   _field(header, body, "num_workers", int), _field(header, body, "recovery", bool, False),
                   _digest(header, body, "secret"), _digest(header, body, "token"))


DIGEST_CHARS = 64  # a job secret's and a token's length: 32 bytes as lowercase hex


def node_token(secret: str, node: int) -> str:
    """The proof that a worker is node ``node`` of the job whose secret (hex) is ``secret``:
    HMAC-SHA256 of the node id, hex. The scheduler hands it to the worker; a server
    recomputes it (compare with :func:`hmac.compare_digest`)."""
    return hmac.new(bytes.fromhex(secret), b"pskv-node-%d" % node, hashlib.sha256).hexdigest()


def _digest(header: Header, body: dict[str, Any], name: str) -> str:
    """An optional field of :data:`DIGEST_CHARS` lowercase hex digits (``""`` when absent)."""
    value = _field(header, body, name, str, "")
    if value and (len(value) != DIGEST_CHARS or any(c not in "0123456789abcdef" for c in value)):
        raise ProtocolError(f"{header.command.name} body field {name!r} must be {DIGEST_CHARS} lowercase hex digits")
    return value


class Liveness(NamedTuple):
    """HEARTBEAT reply (and a waiting SHUTDOWN's): dead node ids, seconds since each node was
    heard (by id), after a server was replaced (``servers_version`` > 0) where the servers are
    now, and ``left``: the workers that left the job (sent SHUTDOWN; not dead)."""

    dead: tuple[int, ...]
    ages: dict[int, float]
    servers_version: int = 0
    servers: tuple[str, ...] = ()
    server_shm: tuple[ShmInfo | None, ...] = ()
    left: tuple[int, ...] = ()

    def encode(self) -> str:
        body: dict[str, Any] = {"dead": list(self.dead), "ages": {str(n): a for n, a in self.ages.items()}}
        if self.left:
            body["left"] = list(self.left)
        if self.servers_version:
            body.update(servers_version=self.servers_version, servers=list(self.servers),
                        server_shm=[None if s is None else s._asdict() for s in self.server_shm])
        return _dump(body)

    @classmethod
    def parse(cls, header: Header) -> Liveness:
        body = json_object(header)
        dead = _field(header, body, "dead", list, [])
        ages = _field(header, body, "ages", dict, {})
        left = _field(header, body, "left", list, [])
        if any(type(n) is not int for n in dead + left) or any(
                not k.lstrip("-").isdigit() or type(v) not in (int, float) for k, v in ages.items()):
            raise ProtocolError("HEARTBEAT reply: dead must be node ids (and left too), ages {node id: seconds}")
        version = _field(header, body, "servers_version", int, 0)
        servers = _strings(header, body, "servers") if version else ()
        shm = tuple(ShmInfo.parse_value(header, s) for s in _field(header, body, "server_shm", list, [])) \
            if version else ()
        return cls(tuple(dead), {int(k): float(v) for k, v in ages.items()}, version, servers, shm, tuple(left))


MAX_NAME = 64  # a collective's name
MAX_TEXT = 2000  # an error message carried by a meeting
MAX_RESULT = 4096  # rank 0's result (a directory)
MAX_AGREE = 256  # items described in a meeting that every worker must agree on
MAX_ITEM = 200  # one item's description


def _bounded(header: Header, name: str, value: str, limit: int) -> str:
    if len(value) > limit:
        raise ProtocolError(f"{header.command.name} body field {name!r} is longer than {limit} characters")
    return value


class Failure(NamedTuple):
    """A worker's failure in a collective: the error's class name and its message (both bounded)."""

    type: str
    message: str

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        """``exc`` as it travels (a server's refusal keeps the server's error class: ``remote_type``)."""
        kind = getattr(exc, "remote_type", None) or type(exc).__name__
        return cls(str(kind)[:MAX_NAME], str(exc)[:MAX_TEXT])

    @classmethod
    def parse_value(cls, header: Header, value: Any) -> Failure:
        if not isinstance(value, dict) or type(value.get("type")) is not str or type(value.get("message")) is not str:
            raise ProtocolError(f"{header.command.name}: a failure must be {{type: str, message: str}}")
        return cls(_bounded(header, "type", value["type"], MAX_NAME),
                   _bounded(header, "message", value["message"], MAX_TEXT))


class Barrier(NamedTuple):
    """BARRIER: ``{group: int, name?: str, seq?: int, timeout?: number, failure?: Failure, result?: str,
    agree?: [[str, str]], digest?: str, mode?: "post"|"read", nth?: int}``.

    ``group``: the node-group bits (1 scheduler, 2 servers, 4 workers) that meet. A worker's
    collective names itself (``name``: ``"barrier"``, ``"init"``, ``"save_checkpoint"``, ...)
    and counts its meetings (``seq``, 1-based; 0: not counted, as in a replacement process):
    the scheduler refuses a meeting whose members differ in either. ``timeout``: how long
    the member waits (the scheduler answers first, naming who did not arrive).
    ``failure``: this worker's failure in the collective so far (every member then
    raises); ``result``: rank 0's result, handed to every member (:class:`Met`); ``agree`` /
    ``digest``: what every member must have alike (``init``: ``[key, "shape dtype"]``
    items, the first ``MAX_AGREE`` of them, and a digest of all).

    ``mode`` ``"post"``: no meeting — rank 0 records the outcome of its ``nth`` call of
    ``name`` since its meeting ``seq`` (answered at once); ``"read"``: answered with that
    outcome once rank 0 posted it (a call rank 0 may make alone, which the others may
    make too). Old nodes send only ``group``.
    """

    group: int
    name: str = ""
    seq: int = 0
    timeout: float = 0.0
    failure: Failure | None = None
    result: str = ""
    agree: tuple[tuple[str, str], ...] = ()
    digest: str = ""
    mode: str = ""
    nth: int = 0

    def encode(self) -> str:
        body: dict[str, Any] = {"group": self.group}
        if self.name:
            body.update(name=self.name, seq=self.seq)
        if self.timeout:
            body["timeout"] = self.timeout
        if self.mode:
            body.update(mode=self.mode, nth=self.nth)
        if self.failure is not None:
            body["failure"] = self.failure._asdict()
        if self.result:
            body["result"] = self.result
        if self.digest:
            body.update(agree=[list(a) for a in self.agree], digest=self.digest)
        return _dump(body)

    @classmethod
    def parse(cls, header: Header) -> Barrier:
        body = json_object(header)
        group = _field(header, body, "group", int, 4)
        if not 1 <= group <= 7:
            raise ProtocolError(f"BARRIER: group {group} is not a node group (1..7)")
        name = _bounded(header, "name", _field(header, body, "name", str, ""), MAX_NAME)
        seq = _field(header, body, "seq", int, 0)
        if seq < 0:
            raise ProtocolError(f"BARRIER: seq {seq} is negative")
        timeout = body.get("timeout", 0.0)
        if type(timeout) not in (int, float) or not 0 <= timeout <= 1e7:
            raise ProtocolError("BARRIER: timeout must be a number of seconds in [0, 1e7]")
        mode = _field(header, body, "mode", str, "")
        nth = _field(header, body, "nth", int, 0)
        if mode not in ("", "post", "read") or (mode and not (name and nth > 0)):
            raise ProtocolError("BARRIER: mode must be post or read, with a name and an nth > 0")
        failure = Failure.parse_value(header, body["failure"]) if body.get("failure") is not None else None
        result = _bounded(header, "result", _field(header, body, "result", str, ""), MAX_RESULT)
        agree = _field(header, body, "agree", list, [])
        if len(agree) > MAX_AGREE or any(
                type(a) is not list or len(a) != 2 or any(type(x) is not str or len(x) > MAX_ITEM for x in a)
                for a in agree):
            raise ProtocolError(f"BARRIER: agree must be at most {MAX_AGREE} [str, str] pairs "
                                f"of at most {MAX_ITEM} characters")
        digest = _bounded(header, "digest", _field(header, body, "digest", str, ""), 64)
        return cls(group, name, seq, float(timeout), failure, result, tuple((a[0], a[1]) for a in agree), digest, mode, nth)


class Met(NamedTuple):
    """BARRIER reply: ``{result?: str, failed?: [{rank: int, type: str, message: str}]}``: rank 0's
    result, and the members that reported a failure (every member then raises)."""

    result: str = ""
    failed: tuple[tuple[int, Failure], ...] = ()

    def encode(self) -> str:
        body: dict[str, Any] = {}
        if self.result:
            body["result"] = self.result
        if self.failed:
            body["failed"] = [{"rank": r, **f._asdict()} for r, f in self.failed]
        return _dump(body)

    @classmethod
    def parse(cls, header: Header) -> Met:
        body = json_object(header)
        result = _bounded(header, "result", _field(header, body, "result", str, ""), MAX_RESULT)
        failed = []
        for item in _field(header, body, "failed", list, [])[:MAX_AGREE]:
            if not isinstance(item, dict) or type(item.get("rank")) is not int:
                raise ProtocolError("BARRIER reply: failed must be [{rank: int, type: str, message: str}]")
            failed.append((item["rank"], Failure.parse_value(header, item)))
        return cls(result, tuple(failed))


class Shutdown(NamedTuple):
    """SHUTDOWN: ``{wait: bool}``: this node is done; with ``wait`` the reply comes when the job ends."""

    wait: bool = False

    def encode(self) -> str:
        return _dump({"wait": self.wait})

    @classmethod
    def parse(cls, header: Header) -> Shutdown:
        return cls(_field(header, json_object(header), "wait", bool, False))


# -- metrics (pskv top) ------------------------------------------------------------------------
MAX_COUNT = 1 << 62  # a counter's largest value (a peer's number past it is refused)
MAX_SECONDS = 1e12  # seconds a total or an age may reach
MAX_RATE = 1e18  # per second
MAX_NODES = 1 << 16  # nodes one metrics reply may describe
NODE_STATES = ("alive", "dead", "left")


def _count(header: Header, name: str, value: Any) -> int:
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise ProtocolError(f"{header.command.name}: {name} must be an int in [0, 2**62], got {str(value)[:40]}")
    return value


def _seconds(header: Header, name: str, value: Any, limit: float = MAX_SECONDS) -> float:
    # NaN fails both comparisons; json.loads reads "NaN" / "Infinity"
    if type(value) not in (int, float) or not 0 <= value <= limit:
        raise ProtocolError(f"{header.command.name}: {name} must be a number in [0, {limit:g}], got {str(value)[:40]}")
    return float(value)


class Counters(NamedTuple):
    """A node's metrics (:mod:`pskv.metrics`), as it reports them with its heartbeats.

    Totals since the node started: ``ops`` (requests handled by a server, data calls made
    by a worker), ``rounds`` (sync rounds completed by a server's parts, pushes sent by a
    worker), ``bytes_in`` / ``bytes_out`` (array bytes received / sent, through sockets or
    shared memory), ``wait`` (seconds a worker was blocked waiting for replies). Now:
    ``queue`` (requests waiting: a server's pulls parked for a round, a worker's requests
    without a reply) and ``stalls`` (of those, rounds or requests waiting longer than a second),
    ``waits_for``: the node most of the stalls wait for (a server's: the worker whose push is
    missing; a worker's: the server that has not answered, or the scheduler: a barrier), by
    node id (0: none).
    On the wire: a list of the eight numbers, in this order.
    """

    ops: int = 0
    rounds: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    wait: float = 0.0
    queue: int = 0
    stalls: int = 0
    waits_for: int = 0

    @classmethod
    def parse_value(cls, header: Header, value: Any) -> Counters:
        """From its wire form (a list of eight numbers), every one checked."""
        if type(value) is not list or len(value) != len(cls._fields):
            raise ProtocolError(f"{header.command.name}: metrics must be a list of {len(cls._fields)} numbers")
        ops, rounds, bytes_in, bytes_out, wait, queue, stalls, waits_for = value
        if type(waits_for) is not int or not (waits_for in (0, 1) or 8 <= waits_for < 8 + 2 * MAX_NODES):
            raise ProtocolError(f"{header.command.name}: waits_for must be a node id or 0, got {str(waits_for)[:40]}")
        return cls(_count(header, "ops", ops), _count(header, "rounds", rounds), _count(header, "bytes_in", bytes_in),
                   _count(header, "bytes_out", bytes_out), _seconds(header, "wait", wait),
                   _count(header, "queue", queue), _count(header, "stalls", stalls), waits_for)


class Heartbeat(NamedTuple):
    """HEARTBEAT: ``{m?: Counters}`` (empty: no metrics with this one)."""

    metrics: Counters | None = None

    def encode(self) -> str:
        return "" if self.metrics is None else _dump({"m": list(self.metrics)})

    @classmethod
    def parse(cls, header: Header) -> Heartbeat:
        body = json_object(header)
        return cls(None if body.get("m") is None else Counters.parse_value(header, body["m"]))


class NodeReport(NamedTuple):
    """One node in a :class:`JobReport`: its id, ``state`` (alive, dead or left the job), seconds
    since the scheduler heard from it, its last reported :class:`Counters` (None: none yet), and
    the rates of its first five over the last seconds (per second; None: fewer than two reports)."""

    node: int
    state: str
    age: float
    totals: Counters | None
    rates: tuple[float, float, float, float, float] | None

    @classmethod
    def parse_value(cls, header: Header, value: Any) -> NodeReport:
        if type(value) is not list or len(value) != 5:
            raise ProtocolError("METRICS reply: a node must be [id, state, age, totals|null, rates|null]")
        nid, state, age, totals, rates = value
        if type(nid) is not int or not 8 <= nid < 8 + 2 * MAX_NODES or state not in NODE_STATES:
            raise ProtocolError(f"METRICS reply: node {str(nid)[:20]} / state {str(state)[:20]} is not a node / state")
        if rates is not None and (type(rates) is not list or len(rates) != 5):
            raise ProtocolError("METRICS reply: rates must be a list of 5 numbers")
        return cls(nid, state, _seconds(header, "age", age),
                   None if totals is None else Counters.parse_value(header, totals),
                   None if rates is None else tuple(_seconds(header, "rate", r, MAX_RATE) for r in rates))  # type: ignore[arg-type]


class JobReport(NamedTuple):
    """METRICS reply: ``{workers, servers, registered, nodes: [NodeReport...]}``: the job's
    sizes, how many nodes have registered so far, and every node once the job has assembled."""

    workers: int
    servers: int
    registered: int
    nodes: tuple[NodeReport, ...]

    def encode(self) -> str:
        return _dump({"workers": self.workers, "servers": self.servers, "registered": self.registered,
                      "nodes": [[n.node, n.state, n.age, None if n.totals is None else list(n.totals),
                                 None if n.rates is None else list(n.rates)] for n in self.nodes]})

    @classmethod
    def parse(cls, header: Header) -> JobReport:
        body = json_object(header)
        sizes = [_field(header, body, name, int) for name in ("workers", "servers", "registered")]
        if any(not 0 <= n <= MAX_NODES for n in sizes):
            raise ProtocolError(f"METRICS reply: workers, servers and registered must be in [0, {MAX_NODES}]")
        nodes = _field(header, body, "nodes", list)
        if len(nodes) > MAX_NODES:
            raise ProtocolError(f"METRICS reply: more than {MAX_NODES} nodes")
        return cls(sizes[0], sizes[1], sizes[2], tuple(NodeReport.parse_value(header, n) for n in nodes))


# -- worker -> server: control --------------------------------------------------------------
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
        return _dump({"tx": self.tx, "token": self.token} if self.tx else {"token": self.token})

    @classmethod
    def parse(cls, header: Header) -> Hello:
        body = json_object(header)
        tx = body.get("tx", "")
        if not isinstance(tx, str) or tx and (len(tx) != 16 or any(c not in "0123456789abcdef" for c in tx)):
            raise ProtocolError("HELLO needs {tx: 16 lowercase hex digits} (or no tx)")
        return cls(tx, _digest(header, body, "token"))


class HelloReply(NamedTuple):
    """HELLO reply: ``{stream?: port}``. ``stream``: the TCP port of the server's data
    connections (:mod:`pskv.transport.stream`), on the host of its ZeroMQ address; only in
    the answer to a ZeroMQ session's HELLO, and only where the server takes them (0: not)."""

    stream: int = 0

    def encode(self) -> str:
        return _dump({"stream": self.stream}) if self.stream else ""

    @classmethod
    def parse(cls, header: Header) -> HelloReply:
        stream = _field(header, json_object(header), "stream", int, 0)
        if not 0 <= stream < 65536:
            raise ProtocolError(f"HELLO reply: stream {stream} is not a TCP port")
        return cls(stream)


class Rejoin(NamedTuple):
    """REJOIN: ``{token}``, the replacement worker's proof of identity (as :class:`Hello`'s): a
    replacement may open a connection with it."""

    token: str = ""

    def encode(self) -> str:
        return _dump({"token": self.token})

    @classmethod
    def parse(cls, header: Header) -> Rejoin:
        return cls(_digest(header, json_object(header), "token"))


class Rejoined(NamedTuple):
    """REJOIN reply: ``{counts: [[key, offset, count], ...]}``: per part, how many pushes of the
    rejoining worker's rank arrived (pushes 1..count), so its replacement numbers on from there."""

    counts: tuple[tuple[int, int, int], ...]

    def encode(self) -> str:
        return _dump({"counts": [list(c) for c in self.counts]})

    @classmethod
    def parse(cls, header: Header) -> Rejoined:
        counts = _field(header, json_object(header), "counts", list)
        if any(type(c) is not list or len(c) != 3 or any(type(x) is not int for x in c) or c[1] < 0 or c[2] < 0
               for c in counts):
            raise ProtocolError("REJOIN reply field 'counts' must be [key, offset >= 0, count >= 0] triples")
        return cls(tuple((c[0], c[1], c[2]) for c in counts))


MAX_KEY_NAME = 256  # characters of a str key's name that INIT may carry
MAX_NAMES_CHARS = 1 << 20  # characters of names one INIT carries (keys past it are reported by number)


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
        return _dump(body) if body else ""

    @classmethod
    def parse(cls, header: Header) -> InitBody:
        body = json_object(header)
        names = _field(header, body, "names", list, [])
        keys = {spec.key for spec in header.arrays}
        if len(names) > len(keys) or any(
                type(n) is not str or len(n) > MAX_KEY_NAME or server_key(n) not in keys for n in names):
            raise ProtocolError(f"INIT body field 'names' must be at most one name (of at most {MAX_KEY_NAME} "
                                "characters) per key of the message, each the name of one of its keys")
        tables = _field(header, body, "tables", list, [])
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
        return _dump({"sync": self.sync})

    @classmethod
    def parse(cls, header: Header) -> SetMode:
        return cls(_field(header, json_object(header), "sync", bool))


MAX_COMPRESSION_FIELDS = 8  # parameters of one compression (type included)


class CompressionParams(NamedTuple):
    """A COMPRESSED push's body: the compression of its frames, ``{type: str, <parameter>: number|str|bool, ...}``
    (:attr:`pskv.compression.Compressor.params`; the receiver builds it with
    :func:`pskv.compression.create`, which checks every value)."""

    params: dict[str, Any]

    def encode(self) -> str:
        return _dump(self.params)

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
        return _dump(self.config)

    @classmethod
    def parse(cls, header: Header) -> OptimizerConfig:
        return cls(json_object(header))  # Optimizer.from_config validates the content


class ControllerCall(NamedTuple):
    """CONTROLLER: ``{head: int, body: str}`` for the controller registered under ``head``."""

    head: int
    body: str = ""

    def encode(self) -> str:
        return _dump({"head": self.head, "body": self.body})

    @classmethod
    def parse(cls, header: Header) -> ControllerCall:
        body = json_object(header)
        return cls(_field(header, body, "head", int), _field(header, body, "body", str, ""))


class ControllerAnswer(NamedTuple):
    """CONTROLLER reply: ``{answer: str}``, what the controller returned (as text)."""

    answer: str = ""

    def encode(self) -> str:
        return _dump({"answer": self.answer})

    @classmethod
    def parse(cls, header: Header) -> ControllerAnswer:
        return cls(_field(header, json_object(header), "answer", str, ""))


class StatesRequest(NamedTuple):
    """SAVE_STATES / LOAD_STATES: ``{path: str, dump_optimizer?: bool}``; the server uses
    ``<path>.server<rank>``."""

    path: str
    dump_optimizer: bool = False

    def encode(self) -> str:
        return _dump({"path": self.path, "dump_optimizer": self.dump_optimizer})

    @classmethod
    def parse(cls, header: Header) -> StatesRequest:
        body = json_object(header)
        path = _nonempty(header, "path", _field(header, body, "path", str))
        return cls(path, _field(header, body, "dump_optimizer", bool, False))


class StatesFile(NamedTuple):
    """SAVE_STATES / LOAD_STATES reply: ``{file: str}``, the file written or read."""

    file: str

    def encode(self) -> str:
        return _dump({"file": self.file})

    @classmethod
    def parse(cls, header: Header) -> StatesFile:
        return cls(_field(header, json_object(header), "file", str))


class CheckpointRequest(NamedTuple):
    """SAVE_CHECKPOINT: ``{dir: str}``: write this server's shard into that checkpoint directory."""

    dir: str

    def encode(self) -> str:
        return _dump({"dir": self.dir})

    @classmethod
    def parse(cls, header: Header) -> CheckpointRequest:
        return cls(_nonempty(header, "dir", _field(header, json_object(header), "dir", str)))


class CheckpointSaved(NamedTuple):
    """SAVE_CHECKPOINT reply: ``{file: str, bytes: int, open_rounds: int}``."""

    file: str
    bytes: int
    open_rounds: int

    def encode(self) -> str:
        return _dump({"file": self.file, "bytes": self.bytes, "open_rounds": self.open_rounds})

    @classmethod
    def parse(cls, header: Header) -> CheckpointSaved:
        body = json_object(header)
        return cls(_field(header, body, "file", str), _field(header, body, "bytes", int),
                   _field(header, body, "open_rounds", int))


# -- errors -------------------------------------------------------------------------------
class ErrorReply(NamedTuple):
    """ERROR: ``{type: str, message: str, node?: str}``: the error class name, its message,
    and the failed node it names (NodeFailedError)."""

    type: str
    message: str
    node: str = ""

    def encode(self) -> str:
        body = {"type": self.type, "message": self.message}
        if self.node:
            body["node"] = self.node
        return _dump(body)

    @classmethod
    def parse(cls, header: Header) -> ErrorReply:
        """Tolerant: a malformed error body still becomes an error (its text, cut short)."""
        try:
            body = json_object(header)
            return cls(str(body.get("type", "Error")), str(body.get("message", "")), str(body.get("node", "")))
        except ProtocolError:
            return cls("Error", header.body[:200])


def _strings(header: Header, body: dict[str, Any], name: str) -> tuple[str, ...]:
    values = _field(header, body, name, list)
    if any(type(v) is not str for v in values):
        raise ProtocolError(f"{header.command.name} body field {name!r} must be a list of strings")
    return tuple(values)
