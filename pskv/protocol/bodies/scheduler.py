"""The bodies a node and the scheduler exchange: registration, heartbeats' replies, collectives, shutdown.

A node registers (:class:`Register`, answered with its :class:`NodeTable` and proof of identity,
:func:`node_token`), hears who is dead or left (:class:`Liveness`, the HEARTBEAT reply; the
heartbeat's own body is in :mod:`pskv.protocol.bodies.metrics`), meets the others in collectives
(:class:`Barrier`, answered with :class:`Met`) and says it is done (:class:`Shutdown`).

In an elastic job the scheduler also hands out membership views (:class:`View`, in the
registration reply, heartbeat replies and a commit's release), and the launcher reports exits and
drains (:class:`Roster`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Any, NamedTuple

from pskv.errors import ProtocolError
from pskv.protocol.bodies.fields import MAX_NAME, bounded, dump, field, hex_digest, json_object, string_list
from pskv.protocol.messages import MAX_EPOCH, MAX_SLOTS, Header

__all__ = ["MAX_AGREE", "MAX_ITEM", "MAX_RESULT", "MAX_TEXT", "ROSTER_OPS", "VIEW_CAUSES", "VOIDING_CAUSES", "Barrier",
           "Failure", "Liveness", "Meeting", "Met", "NodeTable", "Register", "Roster", "ShmInfo", "Shutdown", "View",
           "node_token"]

#: Why a view was made: ``start`` (the first), ``failure`` (a member departed: died, exited, or left undrained),
#: ``refill`` (joiners admitted at once while below the minimum), or at a commit's release ``grow`` (joiners),
#: ``drain`` (removals) or ``mixed`` (both).
VIEW_CAUSES = ("start", "failure", "refill", "grow", "drain", "mixed")
#: Views made outside a commit's release: everything every node did since the view's commit is void.
VOIDING_CAUSES = frozenset({"failure", "refill"})


class View(NamedTuple):
    """An elastic job's membership view: ``{epoch: int >= 1, members: [slot, ...], commit: int >= 0, cause: str}``.

    ``members``: the worker slots (a slot is a worker's node id's rank, never reused), distinct, each
    below :data:`~pskv.protocol.messages.MAX_SLOTS`, in rank order: a slot's rank is its index, so ranks
    are dense, and rank 0 is the oldest member (members keep their order; joiners follow, by slot).
    ``commit``: the last commit every member passed (0: the store's creation), the cut a
    :attr:`voids` view rolls back to. ``cause``: one of :data:`VIEW_CAUSES`.
    """

    epoch: int
    members: tuple[int, ...]
    commit: int = 0
    cause: str = "start"

    @property
    def voids(self) -> bool:
        """True for a view made outside a commit's release: the work since :attr:`commit` is void."""
        return self.cause in VOIDING_CAUSES

    def rank_of(self, slot: int) -> int:
        """``slot``'s rank in this view; -1 if it is not a member."""
        return self.members.index(slot) if slot in self.members else -1

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "members": list(self.members), "commit": self.commit, "cause": self.cause}

    @classmethod
    def parse_value(cls, header: Header, value: Any) -> View | None:
        """From a JSON value (None stays None); every field checked, the member list bounded first."""
        if value is None:
            return None
        ok = isinstance(value, dict) and type(value.get("epoch")) is int and type(value.get("commit")) is int
        members = value.get("members") if ok else None
        if not ok or not 0 < value["epoch"] <= MAX_EPOCH or not 0 <= value["commit"] <= MAX_EPOCH \
                or value.get("cause") not in VIEW_CAUSES or type(members) is not list or len(members) > MAX_SLOTS \
                or any(type(m) is not int or not 0 <= m < MAX_SLOTS for m in members) \
                or len(set(members)) != len(members):
            raise ProtocolError(f"{header.command.name}: a view must be {{epoch: 1..{MAX_EPOCH}, members: distinct "
                                f"slots in 0..{MAX_SLOTS - 1}, commit: int >= 0, cause: one of "
                                f"{', '.join(VIEW_CAUSES)}}}")
        return cls(value["epoch"], tuple(members), value["commit"], value["cause"])


def _view_json(body: dict[str, Any], view: View | None) -> None:
    if view is not None:
        body["view"] = view.to_json()


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
    """REGISTER: ``{role: "server"|"worker", address: str, rank: int (-1: any), shm?: ShmInfo, failed?: Failure}``.

    With ``failed`` the node could not start and is exiting (why: a :class:`Failure`, bounded):
    the scheduler fails the job's pending registrations with it instead of waiting for the node."""

    role: str
    address: str
    rank: int = -1
    shm: ShmInfo | None = None
    failed: Failure | None = None

    def encode(self) -> str:
        body: dict[str, Any] = {"role": self.role, "address": self.address, "rank": self.rank}
        if self.shm is not None:
            body["shm"] = self.shm._asdict()
        if self.failed is not None:
            body["failed"] = self.failed._asdict()
        return dump(body)

    @classmethod
    def parse(cls, header: Header) -> Register:
        body = json_object(header)
        role = field(header, body, "role", str)
        if role not in ("server", "worker"):
            raise ProtocolError("REGISTER: role must be server or worker")
        rank = field(header, body, "rank", int, -1)
        if rank < -1:
            raise ProtocolError(f"REGISTER: rank {rank} is not a rank (or -1)")
        failed = body.get("failed")
        return cls(role, field(header, body, "address", str, ""), rank,
                   ShmInfo.parse_value(header, body.get("shm")),
                   None if failed is None else Failure.parse_value(header, failed))


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
    view: View | None = None  # an elastic job's view (a worker: the one it is admitted in)

    def encode(self) -> str:
        body = {"node_id": self.node_id, "rank": self.rank, "servers": list(self.servers),
                "server_shm": [None if s is None else s._asdict() for s in self.server_shm],
                "num_servers": self.num_servers, "num_workers": self.num_workers, "recovery": self.recovery}
        body.update((k, v) for k, v in (("secret", self.secret), ("token", self.token)) if v)
        _view_json(body, self.view)
        return dump(body)

    @classmethod
    def parse(cls, header: Header) -> NodeTable:
        body = json_object(header)
        servers = string_list(header, body, "servers")
        shm = field(header, body, "server_shm", list)
        if len(shm) != len(servers):
            raise ProtocolError("REGISTER reply: server_shm and servers differ in length")
        table = cls(field(header, body, "node_id", int), field(header, body, "rank", int), servers,
                    tuple(ShmInfo.parse_value(header, s) for s in shm), field(header, body, "num_servers", int),
                    field(header, body, "num_workers", int), field(header, body, "recovery", bool, False),
                    hex_digest(header, body, "secret"), hex_digest(header, body, "token"),
                    View.parse_value(header, body.get("view")))
        # the scheduler lists every server; a view's members are the workers (an elastic view may be empty)
        view, num_workers = table.view, table.num_workers
        workers_ok = num_workers == len(view.members) if view is not None else num_workers >= 1
        if table.num_servers < 1 or table.num_servers != len(servers) or not workers_ok:
            raise ProtocolError(f"REGISTER reply: num_servers {table.num_servers} must be >= 1 and the servers "
                                f"listed ({len(servers)}), num_workers {num_workers} >= 1 (in an elastic job: the "
                                "view's members)")
        return table


def node_token(secret: str, node: int) -> str:
    """The proof that a worker is node ``node`` of the job whose secret (hex) is ``secret``:
    HMAC-SHA256 of the node id, hex. The scheduler hands it to the worker; a server
    recomputes it (compare with :func:`hmac.compare_digest`)."""
    return hmac.new(bytes.fromhex(secret), b"pskv-node-%d" % node, hashlib.sha256).hexdigest()


_NODE_KEY = re.compile(r"-?[0-9]{1,20}")  # a node id as a JSON object key (ASCII digits, int() takes it)


class Liveness(NamedTuple):
    """HEARTBEAT reply (and a waiting SHUTDOWN's): dead node ids, seconds since each node was
    heard (by id), after a server was replaced (``servers_version`` > 0) where the servers are
    now, and ``left``: the workers that left the job (sent SHUTDOWN; not dead); in an elastic job
    ``view``: the current view, sent until the node's heartbeats carry its epoch."""

    dead: tuple[int, ...]
    ages: dict[int, float]
    servers_version: int = 0
    servers: tuple[str, ...] = ()
    server_shm: tuple[ShmInfo | None, ...] = ()
    left: tuple[int, ...] = ()
    view: View | None = None

    def encode(self) -> str:
        body: dict[str, Any] = {"dead": list(self.dead), "ages": {str(n): a for n, a in self.ages.items()}}
        if self.left:
            body["left"] = list(self.left)
        _view_json(body, self.view)
        if self.servers_version:
            body.update(servers_version=self.servers_version, servers=list(self.servers),
                        server_shm=[None if s is None else s._asdict() for s in self.server_shm])
        return dump(body)

    @classmethod
    def parse(cls, header: Header) -> Liveness:
        body = json_object(header)
        dead = field(header, body, "dead", list, [])
        ages = field(header, body, "ages", dict, {})
        left = field(header, body, "left", list, [])
        if any(type(n) is not int for n in dead + left) or any(
                not _NODE_KEY.fullmatch(k) or type(v) not in (int, float) for k, v in ages.items()):
            raise ProtocolError("HEARTBEAT reply: dead must be node ids (and left too), ages {node id: seconds}")
        version = field(header, body, "servers_version", int, 0)
        servers = string_list(header, body, "servers") if version else ()
        shm = tuple(ShmInfo.parse_value(header, s) for s in field(header, body, "server_shm", list, [])) \
            if version else ()
        return cls(tuple(dead), {int(k): float(v) for k, v in ages.items()}, version, servers, shm, tuple(left),
                   View.parse_value(header, body.get("view")))


# -- collectives (BARRIER) -----------------------------------------------------------------
MAX_TEXT = 2000  # an error message carried by a meeting
MAX_RESULT = 4096  # rank 0's result (a directory)
MAX_AGREE = 256  # items described in a meeting that every worker must agree on
MAX_ITEM = 200  # one item's description


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
        return cls(bounded(header, "type", value["type"], MAX_NAME),
                   bounded(header, "message", value["message"], MAX_TEXT))


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
    make too). Old nodes send only ``group``. ``epoch``: in an elastic job, the view the member
    is in (a meeting of an older view fails with MembershipChangedError); 0 elsewhere, not sent.
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
    epoch: int = 0

    def encode(self) -> str:
        body: dict[str, Any] = {"group": self.group}
        if self.epoch:
            body["epoch"] = self.epoch
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
        return dump(body)

    @classmethod
    def parse(cls, header: Header) -> Barrier:
        body = json_object(header)
        group = field(header, body, "group", int, 4)
        if not 1 <= group <= 7:
            raise ProtocolError(f"BARRIER: group {group} is not a node group (1..7)")
        name = bounded(header, "name", field(header, body, "name", str, ""), MAX_NAME)
        seq = field(header, body, "seq", int, 0)
        if seq < 0:
            raise ProtocolError(f"BARRIER: seq {seq} is negative")
        timeout = body.get("timeout", 0.0)
        if type(timeout) not in (int, float) or not 0 <= timeout <= 1e7:
            raise ProtocolError("BARRIER: timeout must be a number of seconds in [0, 1e7]")
        mode = field(header, body, "mode", str, "")
        nth = field(header, body, "nth", int, 0)
        if mode not in ("", "post", "read") or (mode and not (name and nth > 0)):
            raise ProtocolError("BARRIER: mode must be post or read, with a name and an nth > 0")
        failure = Failure.parse_value(header, body["failure"]) if body.get("failure") is not None else None
        result = bounded(header, "result", field(header, body, "result", str, ""), MAX_RESULT)
        agree = field(header, body, "agree", list, [])
        if len(agree) > MAX_AGREE or any(
                type(a) is not list or len(a) != 2 or any(type(x) is not str or len(x) > MAX_ITEM for x in a)
                for a in agree):
            raise ProtocolError(f"BARRIER: agree must be at most {MAX_AGREE} [str, str] pairs "
                                f"of at most {MAX_ITEM} characters")
        digest = bounded(header, "digest", field(header, body, "digest", str, ""), 64)
        epoch = field(header, body, "epoch", int, 0)
        if not 0 <= epoch <= MAX_EPOCH:
            raise ProtocolError(f"BARRIER: epoch {epoch} is not a view epoch (0..{MAX_EPOCH})")
        return cls(group, name, seq, float(timeout), failure, result, tuple((a[0], a[1]) for a in agree), digest, mode,
                   nth, epoch)


class Met(NamedTuple):
    """BARRIER reply: ``{result?: str, failed?: [{rank: int, type: str, message: str}], view?: View}``: rank 0's
    result, the members that reported a failure (every member then raises), and in an elastic job the
    next view a commit's release hands every member (joins and drains)."""

    result: str = ""
    failed: tuple[tuple[int, Failure], ...] = ()
    view: View | None = None

    def encode(self) -> str:
        body: dict[str, Any] = {}
        if self.result:
            body["result"] = self.result
        if self.failed:
            body["failed"] = [{"rank": r, **f._asdict()} for r, f in self.failed]
        _view_json(body, self.view)
        return dump(body)

    @classmethod
    def parse(cls, header: Header) -> Met:
        body = json_object(header)
        result = bounded(header, "result", field(header, body, "result", str, ""), MAX_RESULT)
        failed = []
        for item in field(header, body, "failed", list, [])[:MAX_AGREE]:
            if not isinstance(item, dict) or type(item.get("rank")) is not int:
                raise ProtocolError("BARRIER reply: failed must be [{rank: int, type: str, message: str}]")
            failed.append((item["rank"], Failure.parse_value(header, item)))
        return cls(result, tuple(failed), View.parse_value(header, body.get("view")))


class Meeting(NamedTuple):
    """SYNC to a server, sent right before a worker's counted meeting (:class:`Barrier` ``seq``):
    ``{meeting: int >= 1, settled: bool, name?: str}``. It follows every push the worker sent that
    server before (one worker's messages are handled in order); ``settled``: the worker has no
    operation left that may still push (every push it issued before the meeting is sent);
    ``name``: the collective's (``"barrier"``). The server compares the sync rounds it holds
    with it (:mod:`pskv.server.steps`)."""

    seq: int
    settled: bool = True
    name: str = ""

    def encode(self) -> str:
        return dump({"meeting": self.seq, "settled": self.settled, "name": self.name})

    @classmethod
    def parse(cls, header: Header) -> Meeting:
        body = json_object(header)
        seq = field(header, body, "meeting", int)
        if seq < 1:
            raise ProtocolError(f"SYNC: meeting {seq} is not a meeting count (>= 1)")
        return cls(seq, field(header, body, "settled", bool, True),
                   bounded(header, "name", field(header, body, "name", str, ""), MAX_NAME))


ROSTER_OPS = ("gone", "drain")


class Roster(NamedTuple):
    """ROSTER (the launcher's, unregistered): ``{op: "gone"|"drain", slot: int, token: str}``.

    ``gone``: worker ``slot`` exited (a departure: the scheduler makes a failure view now, not
    after the heartbeat timeout); ``drain``: remove ``slot`` at the next commit. ``token``: the
    job's launch token (``PSKV_LAUNCH_TOKEN``, 64 lowercase hex digits), without which the
    scheduler refuses it."""

    op: str
    slot: int
    token: str = ""

    def encode(self) -> str:
        return dump({"op": self.op, "slot": self.slot, "token": self.token})

    @classmethod
    def parse(cls, header: Header) -> Roster:
        body = json_object(header)
        op = field(header, body, "op", str)
        slot = field(header, body, "slot", int)
        if op not in ROSTER_OPS or not 0 <= slot < MAX_SLOTS:
            raise ProtocolError(f"ROSTER: op must be gone or drain and slot in 0..{MAX_SLOTS - 1}")
        return cls(op, slot, hex_digest(header, body, "token"))


class Shutdown(NamedTuple):
    """SHUTDOWN: ``{wait: bool}``: this node is done; with ``wait`` the reply comes when the job ends."""

    wait: bool = False

    def encode(self) -> str:
        return dump({"wait": self.wait})

    @classmethod
    def parse(cls, header: Header) -> Shutdown:
        return cls(field(header, json_object(header), "wait", bool, False))
