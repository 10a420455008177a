"""What a running job is doing, per node: counters kept by every node, read through the scheduler.

Each server and worker keeps a :class:`NodeCounters` — plain integer adds on the paths
that already handle a message or a call, no lock — and sends its totals with a heartbeat
(:class:`~pskv.cluster.membership.Membership`, at most every half second). The scheduler
keeps the reports of the last seconds (:class:`~pskv.cluster.rates.MetricsWindow`) and
answers a ``METRICS`` request from anyone who can connect to it (under CURVE, only a
holder of the job's key) with every node's state, totals and rates. :func:`snapshot`
asks once; :class:`MetricsClient` keeps asking (``pskv top``, :mod:`pskv.top`).

Per node (:class:`NodeMetrics`):

* ``ops_per_s`` — requests handled (a server), push/pull/pushpull/row calls made (a worker);
* ``rounds_per_s`` — sync rounds completed over the server's parts (async: pushes applied);
  a worker's pushes (push, pushpull, row pushes);
* ``bytes_in_per_s`` / ``bytes_out_per_s`` — array bytes received / sent, through sockets or
  shared memory (compressed payloads as sent);
* ``queue`` — requests waiting now: a server's pulls parked until their round completes, a
  worker's requests without a reply yet;
* ``stalls`` — of those, the ones waiting longer than :data:`STALL_AFTER` seconds (a server's
  open rounds waiting for a slow worker count too); ``waits_for`` names the node most of
  them wait for (a server's: the worker whose push is missing; a worker's: the server);
* ``wait_per_s`` — seconds per second a worker's calls were blocked waiting for replies;
* ``state`` — ``alive``, ``dead`` (missed its heartbeats) or ``left`` (the worker closed its store).

Rates need two reports (a second or so after a node registered); until then they are None.
With ``PS_HEARTBEAT_INTERVAL=0`` nodes send no heartbeats, hence no metrics.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from pskv.arrays.dtypes import itemsize
from pskv.errors import InvalidArgumentError, NodeFailedError, OperationTimeoutError, ProtocolError, TransportError
from pskv.protocol import ArraySpec, Command, Header, Role, decode, node_name, node_role_rank
from pskv.protocol.bodies import Counters, ErrorReply, JobReport
from pskv.protocol.codec import DEFAULT_LIMITS
from pskv.protocol.replies import request_frames
from pskv.transport.bounds import DEFAULT_BOUNDS, Bounds
from pskv.transport.frames import recv_frames
from pskv.transport.security import CurveSecurity, read_key_file

__all__ = ["JobMetrics", "MetricsClient", "NodeCounters", "NodeMetrics", "STALL_AFTER", "scheduler_address",
           "snapshot", "value_bytes"]

STALL_AFTER = 1.0  # seconds a request or round may wait before it counts as a stall
# What a METRICS reply may be: one frame, its header, whose body lists every node (~175 bytes a node, ~300 with
# every number at its widest: 1.75-3 MB for 10,000 nodes). The codec refuses a header over 16 MiB
# (Limits.max_header_bytes), so that is the bound: nothing it would refuse is taken in, every reply it reads is.
_REPLY_BOUNDS = Bounds(DEFAULT_LIMITS.max_header_bytes, 1, DEFAULT_BOUNDS.send_queue_bytes,
                      DEFAULT_BOUNDS.slow_peer_timeout)


class NodeCounters:
    """One node's running totals (see the module doc); updated without locks.

    Threads of a worker may add at once; a lost increment under such a race is
    acceptable for a view refreshed every second, a lock on every call is not.
    """

    __slots__ = ("ops", "rounds", "bytes_in", "bytes_out", "wait")

    def __init__(self) -> None:
        self.ops = 0
        self.rounds = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.wait = 0.0

    def report(self, queue: int, stalls: int, waits_for: int = 0, rounds: int | None = None) -> Counters:
        """The totals as they travel, with the node's ``queue``, ``stalls`` and the node id most stalls
        wait for now (``rounds``: instead of the count)."""
        return Counters(self.ops, self.rounds if rounds is None else rounds, self.bytes_in, self.bytes_out,
                        round(self.wait, 4), queue, stalls, waits_for)


def value_bytes(specs: Iterable[ArraySpec]) -> int:
    """Bytes of the array values ``specs`` describe (their elements, not the wire's headers)."""
    if isinstance(specs, (tuple, list)) and len(specs) == 1:  # a message's usual one part: no generator
        spec = specs[0]
        return spec.size * itemsize(spec.dtype)
    return sum(spec.size * itemsize(spec.dtype) for spec in specs)


@dataclass(frozen=True)
class NodeMetrics:
    """One node of a running job, as :func:`snapshot` sees it (rates are None until it reported twice)."""

    node: str  # "server 0", "worker 1"
    role: str  # "server" or "worker"
    rank: int
    state: str  # alive, dead or left
    age: float  # seconds since the scheduler heard from it
    ops_per_s: float | None
    rounds_per_s: float | None
    bytes_in_per_s: float | None
    bytes_out_per_s: float | None
    wait_per_s: float | None
    queue: int
    stalls: int
    waits_for: str  # the node most stalls wait for ("worker 1"), "" when none
    ops: int  # totals since the node started
    rounds: int
    bytes_in: int
    bytes_out: int
    wait: float


@dataclass(frozen=True)
class JobMetrics:
    """The job's nodes as the scheduler at ``address`` knows them."""

    address: str
    num_workers: int
    num_servers: int
    registered: int  # nodes registered so far (all of them once the job runs)
    nodes: tuple[NodeMetrics, ...]  # servers, then workers, by rank
    view: int = 0  # an elastic job's view (its epoch); 0: a job of fixed size

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``pskv top --json``)."""
        return asdict(self)


def _node(nid: int, state: str, age: float, totals: Counters | None,
          rates: tuple[float, float, float, float, float] | None) -> NodeMetrics:
    role, rank = node_role_rank(nid)
    c = totals or Counters()
    r: tuple[float | None, float | None, float | None, float | None, float | None] = \
        rates if rates is not None else (None, None, None, None, None)
    kind = "server" if role is Role.SERVER else "worker"
    return NodeMetrics(f"{kind} {rank}", kind, rank, state, age, r[0], r[1], r[2], r[3], r[4], c.queue, c.stalls,
                       node_name(c.waits_for) if c.waits_for else "", c.ops, c.rounds, c.bytes_in, c.bytes_out,
                       c.wait)


def scheduler_address(text: str) -> str:
    """``tcp://HOST:PORT`` from ``HOST:PORT``, ``tcp://HOST:PORT`` or a bare ``PORT`` (127.0.0.1).

    Raises:
        InvalidArgumentError: not an address of that form (names it).
    """
    value = text.strip().removeprefix("tcp://")
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", value
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgumentError(f"scheduler address {text.strip()[:100]!r} is not HOST:PORT (or a port)")
    return f"tcp://{host}:{int(port)}"


class MetricsClient:
    """A connection to a job's scheduler that asks for its metrics (one thread uses it).

    Args:
        address: the scheduler (``tcp://HOST:PORT``, ``HOST:PORT`` or a port on 127.0.0.1).
        curve_key_file: the job's CURVE key file when it runs with one (``pskv launch --curve-key``).

    Raises:
        InvalidArgumentError: a malformed address, or an unusable key file (names it).
    """

    def __init__(self, address: str, curve_key_file: str = "") -> None:
        self.address = scheduler_address(address)
        keys = read_key_file(curve_key_file) if curve_key_file else None
        self._context: zmq.Context[Any] = zmq.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, _REPLY_BOUNDS.max_message_bytes)  # a bigger frame: not allocated
        if keys is not None:
            CurveSecurity(keys, "pskv top").client(self._socket)
        self._events = self._socket.get_monitor_socket(
            zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        try:
            self._socket.connect(self.address)
        except zmq.ZMQError as exc:
            self.close()
            raise InvalidArgumentError(f"cannot connect to the scheduler at {self.address}: {exc.strerror}") from None
        self._requests = itertools.count(1)
        self._answered = False  # the scheduler answered once: a lost connection now means the job ended
        self._secure = keys is not None

    def query(self, timeout: float) -> JobMetrics:
        """The job's metrics now.

        Raises:
            OperationTimeoutError: no answer within ``timeout`` seconds (names the address).
            NodeFailedError: the scheduler answered before and its connection is gone: the job ended.
            TransportError: the security handshake failed (no key, or another job's key).
            ProtocolError: the answer is malformed.
        """
        request = next(self._requests)
        self._socket.send_multipart(request_frames(Command.METRICS, request, 0))
        deadline = time.monotonic() + timeout
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._events, zmq.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OperationTimeoutError(f"the scheduler at {self.address} did not answer within {timeout:g} s "
                                            "(is the job running, and is this its address?)")
            ready = dict(poller.poll(max(1, int(left * 1000))))
            if self._events in ready:
                self._on_event()
            if self._socket in ready:
                header = self._receive()
                if header is not None and header.request == request:
                    self._answered = True
                    return self._metrics(header)

    def _on_event(self) -> None:
        event = parse_monitor_message(self._events.recv_multipart())["event"]
        if event == zmq.EVENT_DISCONNECTED and self._answered:
            raise NodeFailedError(f"the scheduler at {self.address}", "its connection closed: the job ended")
        if event & (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
            hint = "this job's key file (--curve-key)" if self._secure else "--curve-key FILE: the job runs with CURVE"
            raise TransportError(f"the scheduler at {self.address} refused the connection's security handshake; "
                                 f"give {hint}")

    def _receive(self) -> Header | None:
        try:
            header, _ = decode(recv_frames(self._socket, _REPLY_BOUNDS))
        except ProtocolError:  # a message of more frames too (read off and dropped by recv_frames)
            return None  # not an answer to read: the deadline decides
        return header

    def _metrics(self, header: Header) -> JobMetrics:
        if header.command is Command.ERROR:  # an older scheduler that does not know METRICS
            raise ProtocolError(f"the scheduler at {self.address} refused the metrics request: "
                                f"{ErrorReply.parse(header).message}")
        report = JobReport.parse(header)
        nodes = sorted((_node(n.node, n.state, n.age, n.totals, n.rates) for n in report.nodes),
                       key=lambda n: (n.role != "server", n.rank))  # servers, then workers, by rank
        return JobMetrics(self.address, report.workers, report.servers, report.registered, tuple(nodes), report.view)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if not self._context.closed:
            self._socket.disable_monitor()
            self._events.close(linger=0)
            self._socket.close(linger=0)
            self._context.term()

    def __enter__(self) -> MetricsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def snapshot(address: str, timeout: float = 5.0, curve_key_file: str = "") -> JobMetrics:
    """Ask the scheduler at ``address`` for its job's metrics, once.

    Args:
        address: ``HOST:PORT`` (``pskv launch --address-file`` writes it), ``tcp://HOST:PORT``, or a port.
        timeout: seconds to wait for the answer.
        curve_key_file: the job's key file if it runs with CURVE.

    Raises:
        OperationTimeoutError: no answer within ``timeout`` (names the address).
        InvalidArgumentError: a malformed address, or an unusable key file.
        TransportError: the security handshake failed (no key, or another job's key).
        ProtocolError: the answer is malformed.
    """
    with MetricsClient(address, curve_key_file) as client:
        return client.query(timeout)
