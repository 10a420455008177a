"""Issue 11's transport question in numbers: ZeroMQ as pskv uses it against a raw-TCP data channel.

Usage::

    python bench/bench_transport.py [--quick] [--networks loopback,hosts] [--rate RATE] [--delay DELAY]
                                    [--rounds R] [--repeats N] [--only 4kb,256kb,4mb,64mb,resnet50]
                                    [--no-pipe] [--json PATH]

(``hosts`` needs root: network namespaces, see :mod:`pskv.testing.hosts`; without it
that network is reported as unavailable and the loopback rows still run.)

Two processes, a **client** (sender) and a **server** (receiver / echo), per network:

* ``loopback``: both on 127.0.0.1;
* ``hosts``: two simulated hosts (:class:`~pskv.testing.hosts.SimulatedHosts`; ``--rate``
  shapes both links both ways with ``tc tbf``), each process started inside its host
  through the hosts' remote shell (``python -m pskv.testing.hosts enter ...``), the
  server on 10.215.0.2, the client on 10.215.0.1.

Per message size (4 KB, 256 KB, 4 MB, 64 MB, and the ResNet-50 list's 97.5 MiB sent as
25 pieces of <= 4 MiB, binary units) it measures, in the same run:

* ``memcpy``: ``np.copyto`` of the message's bytes in the server process, one thread:
  the memory bound of moving the bytes once (an echo's bound is two copies);
* ``raw1`` / ``raw4``: raw TCP, 1 or 4 connections (every piece split across them),
  ``TCP_NODELAY``, ``SO_SNDBUF`` / ``SO_RCVBUF`` as pskv's ZeroMQ sockets ask for
  (:data:`pskv.transport.reactor.SOCKET_BUFFER_BYTES`; the kernel caps it at
  ``net.core.[rw]mem_max``, the grant is recorded), a 16-byte header + payload per part
  in one ``sendmsg``, received with ``recv_into`` into a preallocated buffer; with 4
  connections each has its own thread on both sides;
* ``zmq_io1`` / ``zmq_io2`` / ``zmq_io2x2``: pyzmq DEALER -> ROUTER with pskv's socket
  options, sent and received with pskv's own :func:`~pskv.transport.reactor.send_frames`
  / :func:`~pskv.transport.reactor.recv_frames` (a 16-byte header frame + the payload
  frame, ``copy=False`` from 64 KB up); a context with 1 I/O thread, with 2 (pskv's
  :data:`~pskv.transport.reactor.IO_THREADS`), and with 2 I/O threads and 2 DEALER
  sockets (the payload split across them).

Modes: **oneway** — the client sends ``count`` messages back to back, the server
receives them all and answers on a control connection; throughput = ``count x bytes /
time`` (GB/s, 1 GB = 1e9 B). **echo** — the client sends a message, the server receives
all of it, then sends it back (ZeroMQ: the received frames, zero-copy; raw: from its
receive buffer); round-trip time per message.

**Pipelining** (``--no-pipe`` leaves it out): the 64 MB and ResNet-50 payloads cut into
pieces of 16, 4 or 1 MiB (or sent whole), sent back to back; the server adds every piece
into a preallocated float32 accumulator (``np.add(acc[s], piece, out=acc[s])``) as it
arrives (raw: after its ``recv_into``, while the kernel's socket buffer takes the next
bytes; ZeroMQ: while the I/O thread receives the next pieces). Three phases alternate
sample by sample, so they are paired in time: receive only, receive and sum, and the
same sums alone (no network, in the server). ``overlap = (receive only + sums alone -
receive and sum) / sums alone``: 1 = the summation is hidden behind the receive, 0 =
they run one after the other.

Every measurement starts with a checked sample (received bytes, echoed bytes and sums
compared with the expected payload; a mismatch fails the run), then ``--repeats``
timed samples. Rounds (``--rounds``) start a fresh pair of processes per network and
rotate the order of the variants, so a drift of the shared machine hits all of them.
Reported: the median over all samples and the range of the per-round medians; ratios are
speed ratios (ZeroMQ's speed / raw TCP's: < 1 means ZeroMQ is slower; raw TCP's /
memcpy's: the fraction of the memory bound), overall and per round. The JSON (default
``bench/results/transport_<UTC date>[_RATE][_quick].json``) holds every raw sample.

The machine this was written on has 2 cores shared by other jobs: client, server, their
threads and the kernel's TCP work all compete for them, so these are CPU-bound numbers
for this machine, not a NIC's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import queue
import re
import resource
import shlex
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import zmq

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path[:0] = [str(BENCH_DIR), str(REPO_DIR)]

from _procs import install_sigterm_handler  # noqa: E402
from bench_local import resnet50_shapes  # noqa: E402

from pskv.testing.hosts import SimulatedHosts, Unavailable, enter_argv  # noqa: E402
from pskv.testing.jobs import JobError as ProcError  # noqa: E402
from pskv.testing.jobs import ProcessGroup as ProcGroup  # noqa: E402
from pskv.transport.bounds import DEFAULT_BOUNDS, SEND_HWM  # noqa: E402
from pskv.transport.frames import SOCKET_BUFFER_BYTES, recv_frames, send_frames  # noqa: E402
from pskv.transport.reactor import IO_THREADS  # noqa: E402

MiB = 1 << 20
GB = 1e9
HDR = struct.Struct("<QQ")  # offset, bytes of one part
ALIGN = 64  # part boundaries (bytes) when a piece is split across connections
IO_TIMEOUT_S = 60.0  # any one socket operation
CONTROL_TIMEOUT_S = 180.0
LOOPBACK = "127.0.0.1"
RESNET50_BYTES = 4 * sum(math.prod(s) for s in resnet50_shapes())
PIECE_BYTES = 4 * MiB  # the ResNet-50 list travels in pieces of this size

TRANSPORTS = ("raw1", "raw4", "zmq_io1", "zmq_io2", "zmq_io2x2")
TRANSPORT_NAMES = {"memcpy": "memcpy", "raw1": "raw TCP, 1 conn", "raw1t": "raw TCP, 1 conn, receive thread",
                   "raw4": "raw TCP, 4 conns",
                   "zmq_io1": "ZeroMQ, 1 I/O thread", "zmq_io2": f"ZeroMQ, {IO_THREADS} I/O threads (pskv)",
                   "zmq_io2x2": "ZeroMQ, 2 I/O threads, 2 sockets"}
CONNECTIONS = {"raw1": 1, "raw1t": 1, "raw4": 4, "zmq_io1": 1, "zmq_io2": 1, "zmq_io2x2": 2}
PIPE_TRANSPORTS = ("raw1", "raw1t", "zmq_io2")
PIPE_PIECES_MIB = (0, 16, 4, 1)  # 0: the payload as one message
PIPE_PHASES = ("receive", "receive_sum", "sum_alone")  # one sample of each in turn, paired


@dataclass(frozen=True)
class Payload:
    """A message: ``total`` bytes sent as pieces of at most ``piece`` bytes."""

    id: str
    name: str
    total: int
    piece: int

    def pieces(self, piece: int | None = None) -> list[tuple[int, int]]:
        """``(offset, bytes)`` of each piece (``piece`` overrides the payload's own size; 0: one piece)."""
        size = self.piece if piece is None else (piece or self.total)
        return [(off, min(size, self.total - off)) for off in range(0, self.total, size)]


PAYLOADS = (Payload("4kb", "4 KB", 4096, 4096), Payload("256kb", "256 KB", 256 << 10, 256 << 10),
            Payload("4mb", "4 MB", 4 * MiB, 4 * MiB), Payload("64mb", "64 MB", 64 * MiB, 64 * MiB),
            Payload("resnet50", "ResNet-50 (97.5 MiB, 4 MiB pieces)", RESNET50_BYTES, PIECE_BYTES))
PIPE_PAYLOADS = ("64mb", "resnet50")


def split(pieces: Sequence[tuple[int, int]], k: int) -> list[list[tuple[int, int]]]:
    """Each piece cut into ``k`` contiguous parts (64-byte aligned); the parts of connection j, in order."""
    out: list[list[tuple[int, int]]] = [[] for _ in range(k)]
    for off, n in pieces:
        q = -(-n // k // ALIGN) * ALIGN or n
        for j in range(k):
            lo = j * q
            if lo < n:
                out[j].append((off + lo, min(q, n - lo)))
    return out


_PATTERNS: dict[int, np.ndarray] = {}


def pattern(total: int) -> np.ndarray:
    """The payload of ``total`` bytes: float32 values 0..996 (exact in float32 sums), as uint8."""
    if total not in _PATTERNS:
        _PATTERNS[total] = (np.arange(total // 4, dtype=np.float32) % 997).view(np.uint8)
    return _PATTERNS[total]


# -- raw TCP ------------------------------------------------------------------------------------
def tune(sock: socket.socket) -> None:
    """Socket buffers as pskv's ZeroMQ sockets ask for, timeouts, no Nagle."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    sock.settimeout(IO_TIMEOUT_S)


def granted(sock: socket.socket) -> dict[str, int]:
    """The kernel's socket buffer sizes (Linux reports twice the grant)."""
    return {"sndbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
            "rcvbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)}


def minor_faults() -> int:
    """Minor page faults of this process so far, all threads (ZeroMQ's I/O threads included)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock`` (``recv_into``, no allocation)."""
    got, n = 0, len(view)
    while got < n:
        r = sock.recv_into(view[got:], n - got)
        if r == 0:
            raise ConnectionError("peer closed the connection")
        got += r


def send_part(sock: socket.socket, off: int, data: memoryview) -> None:
    """Header + payload in one ``sendmsg`` (the rest with ``sendall`` if the kernel took only part)."""
    hdr = HDR.pack(off, len(data))
    sent = sock.sendmsg([hdr, data])
    if sent < len(hdr):
        sock.sendall(hdr[sent:])
        sock.sendall(data)
    elif sent < len(hdr) + len(data):
        sock.sendall(data[sent - len(hdr):])


def send_parts(sock: socket.socket, parts: Sequence[tuple[int, int]], mv: memoryview, count: int = 1) -> None:
    for _ in range(count):
        for off, n in parts:
            send_part(sock, off, mv[off:off + n])


def recv_parts(sock: socket.socket, nparts: int, rmv: memoryview, on_part: Callable[[int, int], None] | None = None
               ) -> None:
    """Receive ``nparts`` parts into ``rmv`` at their offsets; ``on_part(offset, bytes)`` after each."""
    hdr = bytearray(HDR.size)
    hv = memoryview(hdr)
    for _ in range(nparts):
        recv_exact(sock, hv)
        off, n = HDR.unpack(hdr)
        if off + n > len(rmv) or off % 4 or n % 4:  # bounded before it is used
            raise ValueError(f"bad part header: offset {off}, {n} bytes, buffer of {len(rmv)}")
        recv_exact(sock, rmv[off:off + n])
        if on_part is not None:
            on_part(off, n)


def adder(acc: np.ndarray, rf32: np.ndarray) -> Callable[[int, int], None]:
    """``on_part`` that adds the part just received (float32) into ``acc``."""
    def add(off: int, n: int) -> None:
        s = slice(off // 4, (off + n) // 4)
        np.add(acc[s], rf32[s], out=acc[s])
    return add


def on_all(pool: ThreadPoolExecutor | None, k: int, fn: Callable[[int], None]) -> None:
    """``fn(j)`` for every connection j: inline for one, on the pool's threads for more."""
    if pool is None:
        fn(0)
    else:
        for f in [pool.submit(fn, j) for j in range(k)]:
            f.result()


# -- ZeroMQ ---------------------------------------------------------------------------------------
def zmq_recv(sock: zmq.Socket[Any]) -> list[zmq.Frame]:
    """Wait (bounded) for a message and read it as pskv's reactor does."""
    if not sock.poll(int(IO_TIMEOUT_S * 1000), zmq.POLLIN):
        raise TimeoutError(f"no message within {IO_TIMEOUT_S:.0f} s")
    return recv_frames(sock, DEFAULT_BOUNDS)


def zmq_part(frames: list[zmq.Frame], total: int) -> tuple[int, int, zmq.Frame]:
    """(offset, bytes, payload frame) of a header + payload message, bounded."""
    if len(frames) != 2 or len(frames[0]) != HDR.size:
        raise ValueError(f"expected a header and a payload frame, got {len(frames)} frames")
    off, n = HDR.unpack(frames[0].bytes)
    if n != len(frames[1]) or off + n > total or off % 4 or n % 4:
        raise ValueError(f"bad part: offset {off}, {n} bytes, frame of {len(frames[1])}, message of {total}")
    return off, n, frames[1]


# -- the server (receiver / echo) -----------------------------------------------------------------
class Server:
    """Listens for the client's control connection, raw TCP connections and ZeroMQ DEALERs; runs its commands."""

    def __init__(self, bind: str) -> None:
        self.listener = socket.create_server((bind, 0))
        self.raw_listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.raw_listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tune(self.raw_listener)  # accepted sockets inherit the buffers (and so the TCP window)
        self.raw_listener.bind((bind, 0))
        self.raw_listener.listen(16)
        self.ctx = {"zmq_io1": zmq.Context(io_threads=1), "zmq_io2": zmq.Context(io_threads=IO_THREADS)}
        self.routers: dict[str, zmq.Socket[Any]] = {}
        self.ports = {"control": self.listener.getsockname()[1], "raw": self.raw_listener.getsockname()[1]}
        for name, ctx in self.ctx.items():
            r = ctx.socket(zmq.ROUTER)
            r.setsockopt(zmq.LINGER, 0)
            r.setsockopt(zmq.SNDBUF, SOCKET_BUFFER_BYTES)
            r.setsockopt(zmq.RCVBUF, SOCKET_BUFFER_BYTES)
            r.setsockopt(zmq.ROUTER_MANDATORY, 1)
            r.setsockopt(zmq.MAXMSGSIZE, DEFAULT_BOUNDS.max_message_bytes)
            r.setsockopt(zmq.SNDHWM, SEND_HWM)
            self.ports[name] = r.bind_to_random_port(f"tcp://{bind}")
            self.routers[name] = r
        self.raw: dict[int, list[socket.socket]] = {}
        self.pools = {4: ThreadPoolExecutor(4, thread_name_prefix="raw")}
        self.buffers: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def accept_raw(self, expected: dict[int, int]) -> None:
        """Accept the client's raw connections: group k has k of them (a 2-byte hello: k, index)."""
        self.raw_listener.settimeout(IO_TIMEOUT_S)
        self.raw = {k: [None] * k for k in expected}  # type: ignore[misc]
        for _ in range(sum(expected.values())):
            conn, _addr = self.raw_listener.accept()
            tune(conn)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = bytearray(2)
            recv_exact(conn, memoryview(hello))
            k, j = hello
            if k not in self.raw or not 0 <= j < k or self.raw[k][j] is not None:
                raise ValueError(f"unexpected raw connection hello {bytes(hello)!r}")
            self.raw[k][j] = conn

    def buffers_for(self, total: int) -> tuple[np.ndarray, np.ndarray]:
        """A receive buffer (uint8) and an accumulator (float32) of ``total`` bytes, allocated once per size."""
        if total not in self.buffers:
            self.buffers[total] = (np.zeros(total, np.uint8), np.zeros(total // 4, np.float32))
        return self.buffers[total]

    def serve(self) -> None:
        self.listener.settimeout(CONTROL_TIMEOUT_S)
        ctl, _addr = self.listener.accept()
        ctl.settimeout(CONTROL_TIMEOUT_S)
        f = ctl.makefile("rwb")

        def reply(obj: dict[str, Any]) -> None:
            f.write(json.dumps(obj).encode() + b"\n")
            f.flush()

        while True:
            line = f.readline(1 << 16)
            if not line:
                raise ConnectionError("the client closed the control connection")
            cmd = json.loads(line)
            op = cmd.get("op")
            if op == "quit":
                return
            if op == "raw_connect":
                reply({"ok": True})
                self.accept_raw({int(k): v for k, v in cmd["groups"].items()})
                reply({"ok": True, "granted": granted(self.raw[1][0])})
                continue
            self.run(cmd, reply)

    def run(self, cmd: dict[str, Any], reply: Callable[[dict[str, Any]], None]) -> None:
        """One measurement: ready, then ``samples`` times (the first one checked) the server's half."""
        total, pieces, count, samples = int(cmd["total"]), cmd["pieces"], int(cmd["count"]), int(cmd["samples"])
        if not 0 < total <= 1 << 30:
            raise ValueError(f"message of {total} bytes")
        rbuf, acc = self.buffers_for(total)
        acc.fill(0)
        rmv, rf32 = memoryview(rbuf), rbuf.view(np.float32)
        expected = pattern(total)
        kind, transport = cmd["kind"], str(cmd["transport"])
        reply({"ready": True})
        src = expected.view(np.float32)
        for s in range(samples):
            faults = minor_faults()
            # a pipe command cycles through 3 phases: receive only, receive and sum, the sums alone
            phase = PIPE_PHASES[s % 3] if kind == "pipe" else kind
            check = s < (3 if kind == "pipe" else 1)
            if phase in ("local", "sum_alone"):
                t0 = time.perf_counter()
                for _ in range(count):
                    if phase == "local":
                        np.copyto(rbuf, expected)
                    else:
                        for off, n in pieces:
                            sl = slice(off // 4, (off + n) // 4)
                            np.add(acc[sl], src[sl], out=acc[sl])
                reply({"done": s, "time_s": time.perf_counter() - t0, "faults": minor_faults() - faults})
                continue
            add = acc if phase == "receive_sum" else None
            if transport.startswith("raw"):
                self.run_raw(cmd, rmv, rf32, add)
            else:
                self.run_zmq(cmd, rbuf, rf32, add, check)
            error = None
            if check:
                if add is not None and not np.array_equal(acc, src * count):
                    error = "accumulated sums differ from the payload's"
                elif add is None and not np.array_equal(rbuf, expected):
                    error = "received bytes differ from the payload"
            reply({"done": s, "error": error, "faults": minor_faults() - faults})

    def run_raw(self, cmd: dict[str, Any], rmv: memoryview, rf32: np.ndarray, acc: np.ndarray | None) -> None:
        k = CONNECTIONS[cmd["transport"]]
        conns = self.raw[k]
        parts = split(cmd["pieces"], k)
        pool = self.pools.get(k)
        if cmd["mode"] == "echo":
            for _ in range(int(cmd["count"])):
                on_all(pool, k, lambda j: recv_parts(conns[j], len(parts[j]), rmv))
                on_all(pool, k, lambda j: send_parts(conns[j], parts[j], rmv))
        elif cmd["transport"] == "raw1t":
            self.run_raw_threaded(conns[0], len(cmd["pieces"]) * int(cmd["count"]), rmv, rf32, acc)
        else:
            count = int(cmd["count"])
            add = None if acc is None else adder(acc, rf32)
            on_all(pool, k, lambda j: recv_parts(conns[j], len(parts[j]) * count, rmv, add))

    def run_raw_threaded(self, conn: socket.socket, nparts: int, rmv: memoryview, rf32: np.ndarray,
                         acc: np.ndarray | None) -> None:
        """A receiving thread ``recv_into``s the parts and hands each over; this thread sums them."""
        arrived: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        receiving = self.pools[4].submit(recv_parts, conn, nparts, rmv, lambda off, n: arrived.put((off, n)))
        receiving.add_done_callback(lambda f: arrived.put(None) if f.exception() else None)
        add = None if acc is None else adder(acc, rf32)
        for _ in range(nparts):
            item = arrived.get(timeout=IO_TIMEOUT_S)
            if item is None:
                break  # the receiver failed: result() raises its error
            if add is not None:
                add(*item)
        receiving.result(timeout=IO_TIMEOUT_S)

    def run_zmq(self, cmd: dict[str, Any], rbuf: np.ndarray, rf32: np.ndarray, acc: np.ndarray | None,
                check: bool) -> None:
        router = self.routers["zmq_io1" if cmd["transport"] == "zmq_io1" else "zmq_io2"]
        total = len(rbuf)
        nparts = sum(len(p) for p in split(cmd["pieces"], CONNECTIONS[cmd["transport"]]))
        for _ in range(int(cmd["count"])):
            got = []
            for _ in range(nparts):
                frames = zmq_recv(router)
                off, n, data = zmq_part(frames[1:], total)
                if acc is not None:
                    s = slice(off // 4, (off + n) // 4)
                    np.add(acc[s], np.frombuffer(data.buffer, np.float32), out=acc[s])
                if check:
                    rbuf[off:off + n] = np.frombuffer(data.buffer, np.uint8)
                if cmd["mode"] == "echo":
                    got.append(frames)
            for frames in got:  # the whole request is in: send it back, zero-copy
                send_frames(router, frames)


def serve_main(bind: str, port_file: Path) -> int:
    server = Server(bind)
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(server.ports), encoding="ascii")
    tmp.rename(port_file)  # the client's readiness signal
    server.serve()
    return 0


# -- the client (sender) ----------------------------------------------------------------------------
class Client:
    """Connects to a :class:`Server`, drives every measurement and keeps the samples."""

    def __init__(self, address: str, ports: dict[str, int]) -> None:
        self.ctl = socket.create_connection((address, ports["control"]), timeout=CONTROL_TIMEOUT_S)
        self.f = self.ctl.makefile("rwb")
        self.ctx = {"zmq_io1": zmq.Context(io_threads=1), "zmq_io2": zmq.Context(io_threads=IO_THREADS)}
        self.dealers: dict[str, list[zmq.Socket[Any]]] = {}
        for name, ctx_name, n in (("zmq_io1", "zmq_io1", 1), ("zmq_io2", "zmq_io2", 2)):
            socks = []
            for j in range(n):
                d = self.ctx[ctx_name].socket(zmq.DEALER)
                d.setsockopt(zmq.LINGER, 0)
                d.setsockopt(zmq.SNDBUF, SOCKET_BUFFER_BYTES)
                d.setsockopt(zmq.RCVBUF, SOCKET_BUFFER_BYTES)
                d.setsockopt(zmq.SNDHWM, 0)
                d.setsockopt(zmq.IDENTITY, f"c-{name}-{j}".encode())
                d.connect(f"tcp://{address}:{ports[ctx_name]}")
                socks.append(d)
            self.dealers[name] = socks
        self.dealers["zmq_io2x2"] = self.dealers["zmq_io2"]
        self.raw: dict[int, list[socket.socket]] = {}
        self.command({"op": "raw_connect", "groups": {"1": 1, "4": 4}})
        self.answer()  # the server accepts now
        for k in (1, 4):
            conns = []
            for j in range(k):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                tune(s)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.connect((address, ports["raw"]))
                s.sendall(bytes([k, j]))
                conns.append(s)
            self.raw[k] = conns
        answer = self.answer()
        self.granted = {"client": granted(self.raw[1][0]), "server": answer["granted"]}
        self.pools = {4: ThreadPoolExecutor(4, thread_name_prefix="raw")}
        self.buffers: dict[int, np.ndarray] = {}

    def command(self, obj: dict[str, Any]) -> None:
        self.f.write(json.dumps(obj).encode() + b"\n")
        self.f.flush()

    def answer(self) -> dict[str, Any]:
        line = self.f.readline(1 << 16)
        if not line:
            raise ConnectionError("the server closed the control connection")
        out: dict[str, Any] = json.loads(line)
        if out.get("error"):
            raise ValueError(f"server: {out['error']}")
        return out

    def measure(self, cmd: dict[str, Any], samples: int) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
        """``samples`` timed samples (after one checked sample) of one command, by phase: seconds each, and
        the minor page faults of both processes during each.

        A pipe command has three phases, one sample of each in turn (:data:`PIPE_PHASES`);
        the others one (``""``).
        """
        phases = PIPE_PHASES if cmd["kind"] == "pipe" else ("",)
        cmd = dict(cmd, samples=len(phases) * (samples + 1))
        self.command(cmd)
        self.answer()  # ready
        times: dict[str, list[float]] = {ph: [] for ph in phases}
        faults: dict[str, list[int]] = {ph: [] for ph in phases}
        for s in range(cmd["samples"]):
            phase = phases[s % len(phases)]
            mine = minor_faults()
            if cmd["kind"] == "local" or phase == "sum_alone":
                answer = self.answer()
                t = float(answer["time_s"])
            else:
                t0 = time.perf_counter()
                (self.send_raw if cmd["transport"].startswith("raw") else self.send_zmq)(cmd, s == 0)
                if cmd["mode"] == "oneway":
                    answer = self.answer()  # the server has received (and summed) every byte
                    t = time.perf_counter() - t0
                else:
                    t = time.perf_counter() - t0
                    answer = self.answer()
            if s >= len(phases):  # the first of each phase was the checked one
                times[phase].append(t)
                faults[phase].append(minor_faults() - mine + int(answer["faults"]))
        return times, faults

    def reply_buffer(self, total: int) -> np.ndarray:
        if total not in self.buffers:
            self.buffers[total] = np.zeros(total, np.uint8)
        return self.buffers[total]

    def send_raw(self, cmd: dict[str, Any], check: bool) -> None:
        k = CONNECTIONS[cmd["transport"]]
        conns, parts, pool = self.raw[k], split(cmd["pieces"], k), self.pools.get(k)
        payload = pattern(int(cmd["total"]))
        mv, count = memoryview(payload), int(cmd["count"])
        if cmd["mode"] == "oneway":
            on_all(pool, k, lambda j: send_parts(conns[j], parts[j], mv, count))
            return
        back = self.reply_buffer(len(payload))
        bmv = memoryview(back)
        if check:
            back.fill(0)

        def exchange(j: int) -> None:
            send_parts(conns[j], parts[j], mv)
            recv_parts(conns[j], len(parts[j]), bmv)

        for _ in range(count):
            on_all(pool, k, exchange)
        if check and not np.array_equal(back, payload):
            raise ValueError(f"{cmd['transport']}: the echo differs from the payload")

    def send_zmq(self, cmd: dict[str, Any], check: bool) -> None:
        socks = self.dealers[cmd["transport"]][:CONNECTIONS[cmd["transport"]]]
        parts = split(cmd["pieces"], len(socks))
        payload = pattern(int(cmd["total"]))
        mv, count = memoryview(payload), int(cmd["count"])
        back = self.reply_buffer(len(payload)) if cmd["mode"] == "echo" else None
        if check and back is not None:
            back.fill(0)
        for _ in range(count):
            for sock, mine in zip(socks, parts):
                for off, n in mine:
                    send_frames(sock, [HDR.pack(off, n), mv[off:off + n]])
            if back is None:
                continue
            for sock, mine in zip(socks, parts):
                for _ in mine:
                    off, n, data = zmq_part(zmq_recv(sock), len(back))
                    if check:
                        back[off:off + n] = np.frombuffer(data.buffer, np.uint8)
        if check and back is not None and not np.array_equal(back, payload):
            raise ValueError(f"{cmd['transport']}: the echo differs from the payload")

    def close(self) -> None:
        self.command({"op": "quit"})
        for socks in self.dealers.values():
            for d in socks:
                d.close(0)
        for conns in self.raw.values():
            for c in conns:
                c.close()
        for pool in self.pools.values():
            pool.shutdown()
        self.ctl.close()


def counts(total: int, target: int, max_messages: int) -> tuple[int, int]:
    """Messages per one-way sample, round trips per echo sample, for about ``target`` bytes per sample."""
    return (max(1, min(max_messages, -(-target // total))), max(1, min(max_messages // 10, -(-target // (2 * total)))))


def rotated(items: Sequence[str], by: int) -> list[str]:
    return [items[(i + by) % len(items)] for i in range(len(items))]


def plan(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The round's measurements, in order (variants rotated by the round number)."""
    rnd, target, max_messages = int(spec["round"]), int(spec["target_bytes"]), int(spec["max_messages"])
    for pid in spec["payloads"]:
        p = next(x for x in PAYLOADS if x.id == pid)
        oneway, echo = counts(p.total, target, max_messages)
        base = {"payload": p.id, "total": p.total, "pieces": p.pieces()}
        yield dict(base, kind="local", transport="memcpy", mode="copy", count=max(1, oneway // 4))
        for mode, count in (("oneway", oneway), ("echo", echo)):
            for t in rotated(TRANSPORTS, rnd):
                yield dict(base, kind="xfer", transport=t, mode=mode, count=count)
    for pid in spec["pipe_payloads"]:
        p = next(x for x in PAYLOADS if x.id == pid)
        for mib in spec["pipe_pieces_mib"]:
            for t in rotated(PIPE_TRANSPORTS, rnd):
                yield {"payload": p.id, "total": p.total, "pieces": p.pieces(mib * MiB), "kind": "pipe",
                       "transport": t, "mode": "oneway", "count": 1, "piece_mib": mib}


def client_main(address: str, ports: dict[str, int], spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    client = Client(address, ports)
    results = []
    t_start = time.perf_counter()
    for cmd in plan(spec):
        t0 = time.perf_counter()
        by_phase, faults = client.measure(cmd, int(spec["repeats"]))
        wall = time.perf_counter() - t0
        for phase, times in by_phase.items():
            rec = {k: v for k, v in cmd.items() if k != "pieces"}
            rec.update(phase=phase or None, pieces=len(cmd["pieces"]), samples_s=times, minor_faults=faults[phase],
                       wall_s=wall)
            results.append(rec)
            print(f"{rec['kind']} {rec['payload']} {rec['transport']} {rec['mode']} {phase} "
                  f"piece={rec.get('piece_mib')}: {statistics.median(times) * 1e3:.2f} ms", file=sys.stderr,
                  flush=True)
    client.close()
    print(json.dumps({"results": results, "granted": client.granted, "wall_s": time.perf_counter() - t_start}))
    return 0


# -- the driver ------------------------------------------------------------------------------------
def rate_bytes_per_s(rate: str | None) -> float | None:
    """A tc rate like ``1gbit`` / ``500mbit`` in bytes/s (None if unshaped or not understood)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", (rate or "").lower())
    if not m:
        return None
    return float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m[2]] / 8


def run_pair(network: str, hosts: SimulatedHosts | None, spec: dict[str, Any], tmp: Path,
             timeout: float) -> dict[str, Any]:
    """One server + client pair on ``network`` for one round; the client's JSON."""
    rdir = tmp / f"r{spec['round']}-{network}"
    rdir.mkdir()
    spec_path = rdir / "spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    port_file = rdir / "ports.json"
    me = [sys.executable, str(Path(__file__).resolve())]
    if hosts is None:
        server_addr = LOOPBACK
        server_argv = [*me, "_serve", "--bind", LOOPBACK, "--port-file", str(port_file)]
    else:
        server_addr = hosts[1].address
        remote = shlex.join([*me, "_serve", "--bind", server_addr, "--port-file", str(port_file)])
        server_argv = [*enter_argv(hosts.hosts), hosts[1].address, f"exec {remote}"]
    env = dict(os.environ)
    with ProcGroup(f"transport {network}", rdir) as group:
        server = group.start("server", server_argv, env, cwd=REPO_DIR)
        ports = json.loads(group.wait_for_file(port_file, 60.0))
        client_cmd = [*me, "_client", "--connect", server_addr, "--ports", json.dumps(ports), "--spec", str(spec_path)]
        if hosts is not None:
            client_cmd = [*enter_argv(hosts.hosts), hosts[0].address, f"exec {shlex.join(client_cmd)}"]
        client = group.start("client", client_cmd, env, cwd=REPO_DIR)
        group.wait([client, server], timeout)
        return client.json_line()


def metric(rec: dict[str, Any], t: float) -> float:
    """What a sample shows: GB/s for one-way and copies, seconds per round trip for echo, seconds otherwise."""
    if rec["kind"] == "local":
        return rec["total"] * rec["count"] / t / GB
    if rec["kind"] == "xfer" and rec["mode"] == "oneway":
        return rec["total"] * rec["count"] / t / GB
    return t / rec["count"]


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per measurement key: median over every sample of the metric, per-round medians, sample range."""
    groups: dict[str, dict[int, list[float]]] = {}
    faults: dict[str, list[float]] = {}
    for rec in records:
        key = "|".join(str(rec.get(k)) for k in ("network", "kind", "payload", "transport", "mode", "phase",
                                                 "piece_mib"))
        groups.setdefault(key, {}).setdefault(int(rec["round"]), []).extend(metric(rec, t) for t in rec["samples_s"])
        faults.setdefault(key, []).extend(f / rec["count"] for f in rec.get("minor_faults", []))
    out = {}
    for key, by_round in groups.items():
        every = [v for vals in by_round.values() for v in vals]
        out[key] = {"median": statistics.median(every), "by_round": [statistics.median(by_round[r])
                                                                     for r in sorted(by_round)],
                    "min": min(every), "max": max(every), "samples": len(every),
                    "faults_per_message": statistics.median(faults[key]) if faults.get(key) else None}
    return out


def key(network: str, kind: str, payload: str, transport: str, mode: str, phase: str | None = None,
        mib: int | None = None) -> str:
    return "|".join(str(x) for x in (network, kind, payload, transport, mode, phase, mib))


def speed_ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, higher_is_faster: bool) -> dict[str, Any] | None:
    """a's speed / b's, overall and per round."""
    if not a or not b:
        return None

    def r(x: float, y: float) -> float:
        return x / y if higher_is_faster else y / x

    return {"ratio": r(a["median"], b["median"]),
            "by_round": [r(x, y) for x, y in zip(a["by_round"], b["by_round"])]}


def _best(stats: dict[str, dict[str, Any]], net: str, pid: str, mode: str,
          names: Sequence[str]) -> tuple[str | None, dict[str, Any] | None]:
    """The fastest of the transports ``names`` for one message (its name and statistics), or ``(None, None)``."""
    cands = [(n, stats.get(key(net, "xfer", pid, n, mode))) for n in names]
    cands = [(n, s) for n, s in cands if s]
    if not cands:
        return None, None
    pick = max(cands, key=lambda c: c[1]["median"]) if mode == "oneway" else min(cands, key=lambda c: c[1]["median"])
    return pick


def _cell(s: dict[str, Any] | None, scale: float = 1.0) -> str:
    """A median with the range of the round medians, or a dash."""
    if not s:
        return "—"
    lo, hi = min(s["by_round"]) * scale, max(s["by_round"]) * scale
    rng = f" ({lo:.3g}–{hi:.3g})" if len(s["by_round"]) > 1 else ""
    return f"{s['median'] * scale:.3g}{rng}"


def _rcell(r: dict[str, Any] | None) -> str:
    """A ratio with the ratios of the rounds, or a dash."""
    if not r:
        return "—"
    rounds = ", ".join(f"{x:.2f}" for x in r["by_round"]) if len(r["by_round"]) > 1 else ""
    return f"{r['ratio']:.2f}x" + (f" ({rounds})" if rounds else "")


def _xfer_table(stats: dict[str, dict[str, Any]], net: str, payloads: Sequence[str], lines: list[str],
                rows: list[dict[str, Any]]) -> None:
    """The one-way and echo tables of one network: lines to ``lines``, rows to ``rows``."""
    names = [TRANSPORT_NAMES[t] for t in TRANSPORTS]
    for mode, title, scale in (("oneway", "one-way throughput, GB/s (higher is faster)", 1.0),
                               ("echo", "echo round trip, ms (lower is faster)", 1e3)):
        lines += [f"\n**{net}: {title}**; median (range of the round medians)\n",
                  "| message | memcpy | " + " | ".join(names) + " | ZeroMQ (pskv) / raw 1 | best ZeroMQ / best raw"
                  " | best raw / memcpy |",
                  "|---" * (len(names) + 5) + "|"]
        for pid in payloads:
            p = next(x for x in PAYLOADS if x.id == pid)
            mem = stats.get(key(net, "local", pid, "memcpy", "copy"))
            if mem and mode == "echo":  # an echo moves the bytes twice
                mem = dict(mem, median=2 * p.total / (mem["median"] * GB),
                           by_round=[2 * p.total / (x * GB) for x in mem["by_round"]])
            cells = {t: stats.get(key(net, "xfer", pid, t, mode)) for t in TRANSPORTS}
            zb_name, zbest = _best(stats, net, pid, mode, [t for t in TRANSPORTS if t.startswith("zmq")])
            rb_name, rbest = _best(stats, net, pid, mode, ["raw1", "raw4"])
            fast = mode == "oneway"
            ratios = {"zmq_pskv_vs_raw1": speed_ratio(cells["zmq_io2"], cells["raw1"], fast),
                      "best_zmq_vs_best_raw": speed_ratio(zbest, rbest, fast),
                      "best_raw_vs_memcpy": speed_ratio(rbest, mem, fast)}
            rows.append({"network": net, "payload": pid, "mode": mode, "memcpy": mem, **cells,
                         "best_zmq": zb_name, "best_raw": rb_name, **ratios})
            lines.append(f"| {p.name} | {_cell(mem, scale)} | "
                         + " | ".join(_cell(cells[t], scale) for t in TRANSPORTS)
                         + f" | {_rcell(ratios['zmq_pskv_vs_raw1'])} | {_rcell(ratios['best_zmq_vs_best_raw'])}"
                           f" ({zb_name} / {rb_name}) | {_rcell(ratios['best_raw_vs_memcpy'])} |")
    lines += [f"\n**{net}: minor page faults per one-way message** (client + server, median)\n",
              "| message | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for pid in payloads:
        p = next(x for x in PAYLOADS if x.id == pid)
        fl = [(stats.get(key(net, "xfer", pid, t, "oneway")) or {}).get("faults_per_message") for t in TRANSPORTS]
        lines.append(f"| {p.name} | " + " | ".join("—" if f is None else f"{f:.0f}" for f in fl) + " |")


def _pipe_table(stats: dict[str, dict[str, Any]], net: str, pipe_payloads: Sequence[str], pieces: Sequence[int],
                lines: list[str], rows: list[dict[str, Any]]) -> None:
    """The pipelining table of one network: lines to ``lines``, rows to ``rows``."""
    lines += [f"\n**{net}: pipelining**, ms per message (median, range of the round medians); overlap = "
              "(receive only + sums alone - receive and sum) / sums alone\n",
              "| payload | transport | pieces | receive only | receive + sum | sums alone | overlap | "
              "receive + sum vs whole |",
              "|---|---|---|---|---|---|---|---|"]
    for pid in pipe_payloads:
        p = next(x for x in PAYLOADS if x.id == pid)
        for t in PIPE_TRANSPORTS:
            whole = stats.get(key(net, "pipe", pid, t, "oneway", "receive_sum", 0))
            for mib in pieces:
                recv, both, alone = (stats.get(key(net, "pipe", pid, t, "oneway", ph, mib)) for ph in PIPE_PHASES)
                overlap = None
                if recv and both and alone:
                    overlap = {"ratio": (recv["median"] + alone["median"] - both["median"]) / alone["median"],
                               "by_round": [(a + s - b) / s for a, b, s in
                                            zip(recv["by_round"], both["by_round"], alone["by_round"])]}
                vs_whole = speed_ratio(both, whole, False) if mib else None
                rows.append({"network": net, "payload": pid, "mode": "pipe", "transport": t, "piece_mib": mib,
                             "receive": recv, "receive_sum": both, "sum_alone": alone, "overlap": overlap,
                             "vs_whole": vs_whole})
                ov = "—" if not overlap else (f"{overlap['ratio']:.2f}" + (
                    " (" + ", ".join(f"{x:.2f}" for x in overlap["by_round"]) + ")"
                    if len(overlap["by_round"]) > 1 else ""))
                lines.append(f"| {p.name} | {TRANSPORT_NAMES[t]} | {f'{mib} MiB' if mib else 'whole'} | "
                             f"{_cell(recv, 1e3)} | {_cell(both, 1e3)} | {_cell(alone, 1e3)} | {ov} | "
                             f"{_rcell(vs_whole) if vs_whole else '—'} |")


def tables(stats: dict[str, dict[str, Any]], networks: Sequence[str], payloads: Sequence[str],
           pipe_payloads: Sequence[str], pieces: Sequence[int]) -> tuple[str, list[dict[str, Any]]]:
    """The Markdown report and the table rows."""
    lines: list[str] = []
    rows: list[dict[str, Any]] = []
    for net in networks:
        _xfer_table(stats, net, payloads, lines, rows)
        if pipe_payloads:
            _pipe_table(stats, net, pipe_payloads, pieces, lines, rows)
    return "\n".join(lines), rows


def git_commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_DIR, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "pskv", "bench/bench_transport.py"], cwd=REPO_DIR,
                           capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="ZeroMQ (as pskv uses it) vs raw TCP vs memcpy (issue 11)")
    p.add_argument("--quick", action="store_true", help="1 round, 2 samples, small samples, fewer pieces (< 1 min)")
    p.add_argument("--networks", default="loopback,hosts", help="loopback,hosts (default both)")
    p.add_argument("--rate", default=None, help="tc tbf rate of both simulated hosts' links (e.g. 10gbit)")
    p.add_argument("--delay", default=None, help="tc netem delay on the simulated hosts' outgoing traffic")
    p.add_argument("--rounds", type=int, default=None, help="rounds, fresh processes each (default 3, quick 1)")
    p.add_argument("--repeats", type=int, default=None, help="timed samples per measurement per round "
                                                             "(default 2, quick 2)")
    p.add_argument("--only", default=",".join(x.id for x in PAYLOADS), help="message sizes (ids), comma-separated")
    p.add_argument("--no-pipe", action="store_true", help="leave out the pipelining measurements")
    p.add_argument("--target-mb", type=float, default=None,
                   help="MiB moved per one-way sample (default 64, quick 24; with --rate at most 0.1 s of the rate)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one round on one network may take")
    p.add_argument("--json", type=Path, default=None,
                   help="result file (default bench/results/transport_<UTC date>[_RATE][_quick].json)")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.repeats = args.repeats or 2
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["_serve"]:
        sp = argparse.ArgumentParser()
        sp.add_argument("--bind", required=True)
        sp.add_argument("--port-file", type=Path, required=True)
        a = sp.parse_args(args_list[1:])
        return serve_main(a.bind, a.port_file)
    if args_list[:1] == ["_client"]:
        cp = argparse.ArgumentParser()
        cp.add_argument("--connect", required=True)
        cp.add_argument("--ports", required=True)
        cp.add_argument("--spec", type=Path, required=True)
        a = cp.parse_args(args_list[1:])
        return client_main(a.connect, {k: int(v) for k, v in json.loads(a.ports).items()}, a.spec)

    args = parse_args(args_list)
    install_sigterm_handler()
    networks = [n.strip() for n in args.networks.split(",") if n.strip()]
    payloads = [x.id for x in PAYLOADS if x.id in {w.strip() for w in args.only.split(",")}]
    if not payloads or not set(networks) <= {"loopback", "hosts"}:
        print("--only: 4kb,256kb,4mb,64mb,resnet50; --networks: loopback,hosts", file=sys.stderr)
        return 2
    pipe_payloads = [] if args.no_pipe else [x for x in PIPE_PAYLOADS if x in payloads]
    pieces = [0, 4] if args.quick else list(PIPE_PIECES_MIB)
    target = int((args.target_mb or (24 if args.quick else 64)) * MiB)
    wire = rate_bytes_per_s(args.rate)
    stamp = datetime.now(timezone.utc)
    suffix = (f"_{args.rate}" if args.rate else "") + ("_quick" if args.quick else "")
    json_path = args.json or BENCH_DIR / "results" / f"transport_{stamp:%Y%m%d}{suffix}.json"
    started = time.perf_counter()
    hosts: SimulatedHosts | None = None
    unavailable = None
    if "hosts" in networks:
        try:
            hosts = SimulatedHosts(2, rate=args.rate, delay=args.delay)
        except Unavailable as exc:
            unavailable = str(exc)
            print(f"simulated hosts unavailable ({exc}): only the loopback rows run", file=sys.stderr)
            networks.remove("hosts")
    records: list[dict[str, Any]] = []
    granted_by_net: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="pskv-bench-transport-") as tmp_name:
            for rnd in range(args.rounds):
                for net in networks:
                    shaped = net == "hosts" and wire is not None
                    spec = {"round": rnd, "repeats": args.repeats, "payloads": payloads,
                            "pipe_payloads": pipe_payloads, "pipe_pieces_mib": pieces,
                            "target_bytes": min(target, int(0.1 * wire)) if shaped and wire else target,
                            "max_messages": 1000 if args.quick else 2000}
                    t0 = time.perf_counter()
                    out = run_pair(net, hosts if net == "hosts" else None, spec, Path(tmp_name), args.timeout)
                    granted_by_net[net] = out["granted"]
                    records += [dict(r, network=net, round=rnd) for r in out["results"]]
                    print(f"round {rnd} {net}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    except ProcError as exc:
        print(f"a measurement failed:\n{exc}", file=sys.stderr)
        return 1
    finally:
        if hosts is not None:
            hosts.destroy()
    stats = summarize(records)
    report, rows = tables(stats, networks, payloads, pipe_payloads, pieces)
    net_words = {"loopback": "loopback 127.0.0.1",
                 "hosts": f"two simulated hosts (rate {args.rate or 'unshaped'}, delay {args.delay or 'none'})"}
    print(f"\nTransport: {', '.join(net_words[n] for n in networks)}; {args.rounds} round(s) x {args.repeats} "
          f"samples; speed ratios (< 1: the first is slower)")
    print(report)
    payload = {"benchmark": "bench_transport", "date_utc": stamp.isoformat(timespec="seconds"),
               "commit": git_commit(), "argv": args_list, "quick": args.quick, "rate": args.rate,
               "delay": args.delay, "rounds": args.rounds, "repeats": args.repeats, "networks": networks,
               "hosts_unavailable": unavailable, "socket_buffer_bytes_asked": SOCKET_BUFFER_BYTES,
               "socket_buffers_granted": granted_by_net,
               "versions": {"zmq": zmq.zmq_version(), "pyzmq": zmq.__version__, "numpy": np.__version__,
                            "python": platform.python_version()},
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                           "load_average": list(os.getloadavg())},
               "wall_s": time.perf_counter() - started, "rows": rows, "stats": stats, "records": records}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    print(f"\nwrote {json_path} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
