"""Rows of row-sparse keys through shared memory on one host (issue 13): 2 workers, 2 servers in this process.

With ``PSKV_SHM`` (the default) a row push and a row pull to a server on the worker's host
carry no row data on the socket: ids and rows go through the worker's rows buffer
(``PSKV_SHM_ROWS_BYTES``); with it off they go through the socket. The values are the same
either way, a message too big for the buffer goes through the socket, and regions a peer
names outside its buffer are refused by the server, which lives on.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest

import pskv
from pskv.errors import OperationTimeoutError, ProtocolError
from pskv.optimizer import SGD
from pskv.protocol import ArraySpec, Command, Flag, Header, decode, encode, rows_frame
from pskv.testing import InProcessCluster
from pskv.worker import WorkerClient
from pskv.worker.shared import RowsBuffer
from tests.integration.test_sparse_dist import forged_worker

DEADLINE = 30.0
ROWS, WIDTH = 1000, 16
SHAPE = (ROWS, WIDTH)


def _run(cluster, fn):
    def body(cfg):
        with pskv.create("dist_sync", cluster=cfg) as kv:
            return fn(kv)
    return cluster.run_workers(body)


@pytest.fixture
def wire(monkeypatch):
    """Counts, per command of row messages, the row bytes sent on sockets and the messages in shared memory."""
    seen = {"socket": {"PUSH": 0, "PULL": 0}, "shm": {"PUSH": 0, "PULL": 0}}
    request = WorkerClient.request

    def spy(self, server, command, arrays=(), data=None, *args, **kwargs):
        flags = kwargs.get("flags", 0)
        if command.name in ("PUSH", "PULL") and flags & Flag.ROWS:
            seen["socket"][command.name] += sum(memoryview(d).nbytes for d in data or ())
            seen["shm"][command.name] += bool(flags & Flag.SHM)
        return request(self, server, command, arrays, data, *args, **kwargs)
    monkeypatch.setattr(WorkerClient, "request", spy)
    return seen


def _grad(rank: int, step: int, n: int) -> pskv.RowSparse:
    rng = np.random.default_rng(10 * step + rank)
    ids = rng.integers(0, ROWS, size=n)  # both servers' ranges, some rows shared by the workers
    return pskv.RowSparse(ids, rng.standard_normal((n, WIDTH)).astype(np.float32), SHAPE)


def _job(sizes):
    def job(kv):
        kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9))
        kv.init("emb", pskv.RowSparse([0, 7, 600], np.ones((3, WIDTH), np.float32), SHAPE))
        seen = []
        for step, n in enumerate(sizes):
            kv.push("emb", _grad(kv.rank, step, n))
            ask = np.unique(_grad(1 - kv.rank, step, n).indices)
            out = kv.row_sparse_pull("emb", row_ids=ask)
            seen.append((out.indices.copy(), out.data.copy()))
        return seen
    return job


def _same(a, b):
    assert len(a) == len(b)
    for run_a, run_b in zip(a, b):
        for (ids_a, rows_a), (ids_b, rows_b) in zip(run_a, run_b):
            np.testing.assert_array_equal(ids_a, ids_b)
            np.testing.assert_array_equal(rows_a, rows_b)  # bit for bit: the same sums in the same order


def test_rows_go_through_shared_memory_with_the_socket_paths_values(wire):
    """SHM on: no row bytes on the sockets, every row message in shared memory; SHM off: all on the sockets;
    the rows pulled are identical."""
    sizes = [50, 200, 5]
    with InProcessCluster(2, 2, deadline=DEADLINE) as cluster:
        shared = _run(cluster, _job(sizes))
    assert wire["socket"] == {"PUSH": 0, "PULL": 0}
    assert wire["shm"]["PUSH"] == 2 * 2 * len(sizes) and wire["shm"]["PULL"] >= 2 * len(sizes)
    with InProcessCluster(2, 2, deadline=DEADLINE, shm=0) as cluster:
        sockets = _run(cluster, _job(sizes))
    assert wire["socket"]["PUSH"] > 0 and wire["socket"]["PULL"] > 0
    assert wire["shm"]["PUSH"] == 2 * 2 * len(sizes)  # no more than before
    _same(shared, sockets)


def test_a_message_too_big_for_the_rows_buffer_goes_through_the_socket(wire):
    """A 4 KiB rows buffer: 5 rows (5 x 72 bytes) go through it, 200 rows (14 KB a server) through the socket;
    the values equal those of a job with rows through sockets only."""
    sizes = [5, 200, 5]
    with InProcessCluster(2, 2, deadline=DEADLINE, shm_rows_bytes=4096) as cluster:
        mixed = _run(cluster, _job(sizes))
    assert wire["socket"]["PUSH"] > 0 and wire["socket"]["PULL"] > 0
    assert wire["shm"]["PUSH"] > 0 and wire["shm"]["PULL"] > 0
    with InProcessCluster(2, 2, deadline=DEADLINE, shm_rows_bytes=0) as cluster:
        sockets = _run(cluster, _job(sizes))
    _same(mixed, sockets)


def test_forged_shared_rows_regions_are_refused_and_the_server_lives_on(caplog):
    """A peer with worker 1's token names regions outside its rows buffer (past its end, a huge count) in a
    push and a pull: each refused with InvalidArgumentError naming key and sender; an unaligned offset is
    dropped by the decoder. The workers' job then runs exactly."""
    with InProcessCluster(2, 2, deadline=DEADLINE, shm_rows_bytes=1 << 16) as c:
        def job(kv):
            kv.init("h", pskv.RowSparse.zeros(SHAPE))
            if kv.rank == 0:
                _forge(c, caplog)
            kv.barrier()
            kv.push("h", _grad(kv.rank, 0, 20))
            return kv.row_sparse_pull("h", row_ids=np.arange(ROWS)).todense()
        results = _run(c, job)
    want = _grad(0, 0, 20).todense() + _grad(1, 0, 20).todense()
    for got in results:
        np.testing.assert_allclose(got, want, rtol=1e-6)


def _error(sock) -> str:
    """The ERROR answered: ``'<type>: <message>'``."""
    assert sock.poll(5000), "no answer"
    header, _ = decode(sock.recv_multipart())
    assert header.command is Command.ERROR, header
    body = json.loads(header.body)
    return f"{body['type']}: {body['message']}"


def _forge(c, caplog):
    key = pskv.partition.server_key("h")
    with forged_worker(c) as sock:
        def shm(command, request, n, at):
            # a push number no worker sends (past MAX_PUSHES_AHEAD): the workers' rounds of "h" are not its
            spec = ArraySpec(key, "float32", (n, WIDTH), 0, 1 << 30 if command is Command.PUSH else 0, at)
            return encode(Header(command, request, 11, (spec,), flags=Flag.ROWS | Flag.SHM))
        sock.send_multipart(shm(Command.PUSH, 2, 10, (1 << 16) - 8))
        message = _error(sock)
        assert message.startswith("InvalidArgumentError: ") and "do not lie inside its 65536 bytes" in message
        assert f"key {key}" in message and "worker 1" in message
        sock.send_multipart(shm(Command.PULL, 3, 1000, 0))  # 1000 x 72 bytes: past the end of the buffer
        assert "do not lie inside" in _error(sock)
        with caplog.at_level(logging.ERROR, logger="pskv.server"):
            sock.send_multipart(shm(Command.PUSH, 4, 1 << 40, 0))
            sock.send_multipart(shm(Command.PUSH, 5, 1, 12))
            deadline = time.monotonic() + 5
            while caplog.text.count("rejected a malformed message") < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
        assert "exceeds the frame limit" in caplog.text and "offset 12 is not a non-negative multiple" in caplog.text
        assert not sock.poll(200)  # dropped: nothing answered


# -- the codec and the worker's regions ------------------------------------------------------
def test_the_codec_takes_shared_rows_only_where_they_mean_something():
    at = ArraySpec(5, "float32", (2, 4), 0, 1, 64)
    for flags, command in ((Flag.ROWS | Flag.SHM, Command.PUSH), (Flag.ROWS | Flag.SHM, Command.PULL),
                           (Flag.ROWS | Flag.SHM, Command.REPLY)):
        header, buffers = decode(encode(Header(command, 1, 9, (at,), flags=flags)))
        assert header.arrays == (at,) and buffers == []
    for flags, command in ((Flag.ROWS | Flag.SHM, Command.INIT), (Flag.ROWS | Flag.SHM | Flag.PRESENT, Command.PULL)):
        with pytest.raises(ProtocolError, match="ROWS with SHM"):
            decode(encode(Header(command, 1, 9, (at,), flags=flags)))
    with pytest.raises(ProtocolError, match="6-field"):
        decode(encode(Header(Command.PUSH, 1, 9, (at._replace(buffer=-1),), flags=Flag.ROWS | Flag.SHM)))
    with pytest.raises(ProtocolError, match="data frames"):
        decode(encode(Header(Command.PUSH, 1, 9, (at,), flags=Flag.ROWS | Flag.SHM), [rows_frame(np.zeros(2))]))


class _Reply:
    def __init__(self, error=None):
        self.error = error
        self.finished = False

    def done(self):
        return self.finished


def test_regions_are_reused_only_once_the_server_is_done_with_them():
    buf = RowsBuffer(np.zeros(1024, np.uint8))
    push = buf.reserve(512, held=False)
    pull = buf.reserve(256, held=True)
    assert (push.start, pull.start) == (0, 512)
    push.pending, pull.pending = _Reply(), _Reply()
    assert buf.reserve(512, held=False) is None  # 256 free: the message would go through the socket
    push.pending.finished = True  # answered: the server copied the rows out
    again = buf.reserve(512, held=False)
    assert again.start == 0
    pull.pending.finished = True
    assert buf.reserve(257, held=False) is None  # the pull's rows are not read yet
    RowsBuffer.release(pull)
    assert buf.reserve(512, held=False).start == 512
    late = RowsBuffer(np.zeros(64, np.uint8))
    lost = late.reserve(64, held=False)
    lost.pending = _Reply(OperationTimeoutError("no answer"))
    lost.pending.finished = True
    assert late.reserve(8, held=False) is None  # timed out: the server may still read it
