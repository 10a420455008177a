"""The bodies of ``pskv top``'s metrics: a node's :class:`Counters` on its heartbeat, the scheduler's
:class:`JobReport` (the METRICS reply). Every number a peer sends is bounded.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pskv.errors import ProtocolError
from pskv.protocol.bodies.fields import dump, field, json_object
from pskv.protocol.messages import Header

MAX_MISMATCH = 2000  # a server's report of a meeting that cannot complete (Heartbeat.mismatch)

__all__ = ["MAX_COUNT", "MAX_NODES", "MAX_RATE", "MAX_SECONDS", "NODE_STATES", "Counters", "Heartbeat", "JobReport",
           "NodeReport"]

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
    """HEARTBEAT: ``{m?: Counters, x?: [seq: int, message: str]}`` (empty: neither with this one).

    ``x`` (a server's): the workers' meeting ``seq`` cannot complete — a sync round holds
    pushes some workers made before it, and a worker at it never pushed that round
    (mismatched step counts, :mod:`pskv.server.steps`); ``message`` says so, for every member."""

    metrics: Counters | None = None
    mismatch: tuple[int, str] | None = None

    def encode(self) -> str:
        body: dict[str, Any] = {}
        if self.metrics is not None:
            body["m"] = list(self.metrics)
        if self.mismatch is not None:
            body["x"] = list(self.mismatch)
        return dump(body) if body else ""

    @classmethod
    def parse(cls, header: Header) -> Heartbeat:
        body = json_object(header)
        x = body.get("x")
        if x is not None and (type(x) is not list or len(x) != 2 or type(x[0]) is not int or type(x[1]) is not str
                              or len(x[1]) > MAX_MISMATCH):
            raise ProtocolError(f"HEARTBEAT: x must be [meeting: int, message: str of at most {MAX_MISMATCH}]")
        return cls(None if body.get("m") is None else Counters.parse_value(header, body["m"]),
                   None if x is None else (x[0], x[1]))


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
    """METRICS reply: ``{workers, servers, registered, nodes: [NodeReport...], view}``: the job's
    sizes, how many nodes have registered so far, every node once the job has assembled, and an
    elastic job's view (its epoch; 0 in a job of fixed size, or from a scheduler that sends none)."""

    workers: int
    servers: int
    registered: int
    nodes: tuple[NodeReport, ...]
    view: int = 0

    def encode(self) -> str:
        return dump({"workers": self.workers, "servers": self.servers, "registered": self.registered,
                      "nodes": [[n.node, n.state, n.age, None if n.totals is None else list(n.totals),
                                 None if n.rates is None else list(n.rates)] for n in self.nodes],
                     "view": self.view})

    @classmethod
    def parse(cls, header: Header) -> JobReport:
        body = json_object(header)
        sizes = [field(header, body, name, int) for name in ("workers", "servers", "registered")]
        if any(not 0 <= n <= MAX_NODES for n in sizes):
            raise ProtocolError(f"METRICS reply: workers, servers and registered must be in [0, {MAX_NODES}]")
        nodes = field(header, body, "nodes", list)
        if len(nodes) > MAX_NODES:
            raise ProtocolError(f"METRICS reply: more than {MAX_NODES} nodes")
        view = _count(header, "view", field(header, body, "view", int, 0))
        return cls(sizes[0], sizes[1], sizes[2], tuple(NodeReport.parse_value(header, n) for n in nodes), view)
