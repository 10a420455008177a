"""Row-sparse keys stored on the servers by row ranges (issue 13): 2 workers, 2 servers in this process.

The same pushes give the same values as the local store (with and without an optimizer);
pushes and row pulls move only rows; the servers refuse forged rows and live on; tables
drawn from an initializer on the servers are the same on any layout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time

import numpy as np
import pytest
import zmq

import pskv
from pskv.optimizer import SGD, Adam
from pskv.protocol import ArraySpec, Command, Flag, Header, decode, encode, rows_frame
from pskv.protocol.bodies import Hello, InitBody, node_token
from pskv.testing import InProcessCluster
from pskv.worker import WorkerClient

DEADLINE = 30.0
ROWS, WIDTH = 40, 3
SHAPE = (ROWS, WIDTH)
STEPS = 4


def _run(cluster, fn, store="dist_sync"):
    def body(cfg):
        with pskv.create(store, cluster=cfg) as kv:  # closed on the way out
            return fn(kv)
    return cluster.run_workers(body)


def _grad(rank: int, step: int, device: int) -> pskv.RowSparse:
    """A worker's device's gradient at a step: a few rows (some shared between workers), some repeated."""
    rng = np.random.default_rng(100 * step + 10 * rank + device)
    ids = rng.integers(0, ROWS, size=6)  # repeats summed by RowSparse; both servers' ranges hit
    return pskv.RowSparse(ids, rng.standard_normal((6, WIDTH)).astype(np.float32), SHAPE)


def _init() -> pskv.RowSparse:
    return pskv.RowSparse([0, 5, 21, 39], np.arange(12, dtype=np.float32).reshape(4, WIDTH), SHAPE)


ASK = [[0, 1, 5, 19, 20, 21, 39], [3, 22]]  # row sets of two outs: ranges of both servers


def _job(kv, optimizer):
    if optimizer is not None:
        kv.set_optimizer(optimizer())
    kv.init("emb", _init())
    seen = []
    for step in range(STEPS):
        kv.push("emb", [_grad(kv.rank, step, d) for d in range(2)])
        outs = [pskv.RowSparse.zeros(SHAPE), np.zeros(SHAPE, np.float32)]
        kv.row_sparse_pull("emb", out=outs, row_ids=ASK)
        seen.append((outs[0].indices.copy(), outs[0].data.copy(), outs[1].copy()))
    return seen, _dense_pull(kv)


def _dense_pull(kv):
    out = np.zeros(SHAPE, np.float32)
    kv.pull("emb", out=out)
    return out


def _local(optimizer, workers=2):
    kv = pskv.create("local")
    if optimizer is not None:
        kv.set_optimizer(optimizer())
    kv.init("emb", _init())
    seen = []
    for step in range(STEPS):
        kv.push("emb", [_grad(r, step, d) for r in range(workers) for d in range(2)])
        outs = [pskv.RowSparse.zeros(SHAPE), np.zeros(SHAPE, np.float32)]
        kv.row_sparse_pull("emb", out=outs, row_ids=ASK)
        seen.append((outs[0].indices.copy(), outs[0].data.copy(), outs[1].copy()))
    out = np.zeros(SHAPE, np.float32)
    kv.pull("emb", out=out)
    kv.close()
    return seen, out


OPTIMIZERS = {
    "none": None,
    "sgd-momentum": lambda: SGD(learning_rate=0.1, momentum=0.9, wd=0.01),
    "adam": lambda: Adam(learning_rate=0.05),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_push_and_row_sparse_pull_give_the_local_stores_values(name):
    """Each worker sums its 2 devices' rows, sends each server the rows of its range; the servers
    sum the workers' rows by id and replace the value (no optimizer) or run the optimizer's
    update_rows (lazy) on them: step by step what the local store gives for all 4 values."""
    with InProcessCluster(2, 2, deadline=DEADLINE) as cluster:
        results = _run(cluster, lambda kv: _job(kv, OPTIMIZERS[name]))
    want_steps, want_table = _local(OPTIMIZERS[name])
    for seen, table in results:
        for (ids, data, dense), (_, w_data, w_dense) in zip(seen, want_steps):
            np.testing.assert_array_equal(ids, ASK[0])  # exactly the rows asked for, sorted
            np.testing.assert_allclose(data, w_data, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(dense, w_dense, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(table, want_table, rtol=1e-6, atol=1e-6)


def test_dist_async_applies_each_push_through_the_optimizer():
    """dist_async: each worker's rows are applied as they come (plain SGD: the order does not matter)."""
    opt = lambda: SGD(learning_rate=0.1)  # noqa: E731

    def job(kv):
        kv.set_optimizer(opt())
        kv.init("emb", _init())
        for step in range(STEPS):
            kv.push("emb", [_grad(kv.rank, step, d) for d in range(2)])
        kv.barrier()
        return _dense_pull(kv)

    with InProcessCluster(2, 2, deadline=DEADLINE) as cluster:
        results = _run(cluster, job, "dist_async")
    _, want = _local(opt)
    for table in results:
        np.testing.assert_allclose(table, want, rtol=1e-5, atol=1e-6)


def test_dense_and_sparse_keys_mix_in_one_call_and_pull_ignores_sparse_outs():
    def job(kv):
        kv.init(["d", "s"], [np.ones(SHAPE, np.float32), _init()])
        # a dense value pushed to the row-sparse key covers every row; a row-sparse one to the dense key is summed
        kv.push(["d", "s"], [_grad(kv.rank, 0, 0), np.full(SHAPE, 2.0, np.float32)])
        outs = [np.zeros(SHAPE, np.float32), pskv.RowSparse.zeros(SHAPE)]
        kv.row_sparse_pull(["d", "s"], out=outs, row_ids=[[1, 2], [3, 30]])
        skipped = pskv.RowSparse.zeros(SHAPE)
        with pytest.warns(UserWarning, match="skipped the row-sparse outs"):
            kv.pull("s", out=skipped)  # ignore_sparse=True: left as it was
        filled = pskv.RowSparse.zeros(SHAPE)
        kv.pull("s", out=filled, ignore_sparse=False)
        new = kv.row_sparse_pull("s", row_ids=[7])
        kv.init("z", pskv.RowSparse.zeros(SHAPE))
        kv.push("z", pskv.RowSparse([3, 5], np.array([[0, 0, 0], [1, 1, 1]], np.float32), SHAPE))
        zero_row = kv.pull("z")  # its present rows travel, the zero row pushed among them (as the local store)
        assert zero_row.indices.tolist() == [3, 5] and zero_row.data[:, 0].tolist() == [0.0, 2.0]
        return outs, skipped.nnz, filled, new, kv.pull("s")

    with InProcessCluster(2, 2, deadline=DEADLINE) as cluster:
        results = _run(cluster, job)
    dense_sum = _grad(0, 0, 0).todense() + _grad(1, 0, 0).todense()
    for (d, s), skipped, filled, new, whole in results:
        np.testing.assert_allclose(d[[1, 2]], dense_sum[[1, 2]], rtol=1e-6)
        assert not d[[0, 3]].any()
        assert s.indices.tolist() == [3, 30] and (s.data == 4.0).all()
        assert skipped == 0
        assert filled.nnz == ROWS and (filled.data == 4.0).all()
        assert isinstance(new, pskv.RowSparse) and new.indices.tolist() == [7] and (new.data == 4.0).all()
        assert isinstance(whole, pskv.RowSparse) and whole.nnz == ROWS


def test_non_blocking_row_pushes_pipeline_with_the_row_pull_behind_them():
    """Quiet pushes (block=False) of rows, then a row pull naming the last of them: the sum of the
    last round replaced the value (rows 4 and 9 of both workers), row 0 pushed earlier is zero."""
    def job(kv):
        kv.init("e", pskv.RowSparse.zeros((10, 3)))
        for i in range(5):
            kv.push("e", pskv.RowSparse([i, 9], np.ones((2, 3), np.float32), (10, 3)), block=False)
        out = kv.row_sparse_pull("e", row_ids=[4, 9, 0], block=False).wait()
        kv.wait()
        return out.indices.tolist(), out.data[:, 0].tolist()

    with InProcessCluster(2, 2, deadline=DEADLINE) as cluster:
        assert _run(cluster, job) == [([0, 4, 9], [0.0, 2.0, 2.0])] * 2


def test_a_worker_without_rows_in_a_servers_range_still_completes_its_round():
    """Worker 0 pushes rows of server 0's range only, worker 1 of server 1's: each server's round still
    gets both workers' pushes (one of them without rows), so it completes and the pulls return."""
    def job(kv):
        kv.init("e", _init())
        for step in range(3):
            row = step if kv.rank == 0 else ROWS - 1 - step
            kv.push("e", pskv.RowSparse([row], np.full((1, WIDTH), step + 1.0, np.float32), SHAPE))
        return kv.row_sparse_pull("e", row_ids=list(range(ROWS)), timeout=10).data[:, 0]

    with InProcessCluster(2, 2, deadline=DEADLINE) as cluster:
        for got in _run(cluster, job):
            assert np.flatnonzero(got).tolist() == [2, ROWS - 3] and got[2] == got[ROWS - 3] == 3.0


def test_rows_past_the_message_bound_are_refused_before_anything_is_sent():
    """A server would drop a message past PSKV_MAX_MESSAGE_BYTES unread: the worker refuses such a push
    or row pull itself (nothing sent, no push counted), and goes on."""
    def job(kv):
        kv.init("e", pskv.RowSparse.zeros((10_000, 64)))
        ids = np.arange(5000)
        with pytest.raises(pskv.InvalidArgumentError, match="PSKV_MAX_MESSAGE_BYTES"):
            kv.push("e", pskv.RowSparse(ids, np.ones((5000, 64), np.float32), (10_000, 64)))
        with pytest.raises(pskv.InvalidArgumentError, match="row_sparse_pull of row-sparse key"):
            kv.row_sparse_pull("e", row_ids=ids)
        kv.push("e", pskv.RowSparse([1], np.ones((1, 64), np.float32), (10_000, 64)))
        return kv.row_sparse_pull("e", row_ids=[1, 2]).data[:, 0].tolist()

    with InProcessCluster(1, 1, deadline=DEADLINE, max_message_bytes=1 << 20) as cluster:
        assert _run(cluster, job) == [[1.0, 0.0]]


def test_pushpull_and_broadcast_of_row_sparse_keys_are_refused():
    def job(kv):
        kv.init("s", _init())
        errors = []
        for call in (lambda: kv.pushpull("s", _init()), lambda: kv.broadcast("s", _init())):
            with pytest.raises(pskv.NotSupportedError) as info:
                call()
            errors.append(str(info.value))
        return errors

    with InProcessCluster(1, 1, deadline=DEADLINE) as cluster:
        [errors] = _run(cluster, job)
    assert "pushpull of key 's'" in errors[0] and "broadcast of key 's'" in errors[1]


# -- bytes on the wire ---------------------------------------------------------------------
def test_a_push_and_a_row_pull_move_the_rows_not_the_table(monkeypatch):
    """A 100,000 x 64 float32 table (25.6 MB): a push of 10 rows sends 10 x (8 + 256) bytes over
    both servers, a row pull of 10 rows sends their 80 bytes of ids and gets 10 x (8 + 256) back
    (through sockets: PSKV_SHM=0; with it, tests/integration/test_sparse_shm.py)."""
    sent, answered = {"PUSH": 0, "PULL": 0}, []
    request = WorkerClient.request

    def spy(self, server, command, arrays=(), data=None, *args, **kwargs):
        if command.name in sent and kwargs.get("flags", 0) & Flag.ROWS:
            sent[command.name] += sum(memoryview(d).nbytes for d in data or ())
        return request(self, server, command, arrays, data, *args, **kwargs)
    monkeypatch.setattr(WorkerClient, "request", spy)
    from pskv.worker import rows as worker_rows
    assemble = worker_rows.assemble

    def counting(asked, header, buffers, *args):
        answered.append(sum(len(b) for b in buffers))
        return assemble(asked, header, buffers, *args)
    monkeypatch.setattr(worker_rows, "assemble", counting)
    rows, width = 100_000, 64
    ids = np.array([3, 17, 999, 40_000, 49_999, 50_000, 50_001, 77_777, 99_998, 99_999])

    def job(kv):
        kv.init("big", pskv.RowSparse.zeros((rows, width)))
        kv.push("big", pskv.RowSparse(ids, np.ones((10, width), np.float32), (rows, width)))
        out = kv.row_sparse_pull("big", row_ids=ids)
        return out.indices.tolist(), float(out.data.sum())

    with InProcessCluster(2, 1, deadline=DEADLINE, shm=0) as cluster:
        [(got, total)] = _run(cluster, job)
    assert got == ids.tolist() and total == 10 * width
    assert sent == {"PUSH": 10 * (8 + 4 * width), "PULL": 10 * 8}
    assert sum(answered) == 10 * (8 + 4 * width) and len(answered) == 2  # one reply per server


# -- tables drawn on the servers ------------------------------------------------------------
TABLE = pskv.TableInit((3000, 8), "float32", {"type": "normal", "std": 0.1, "seed": 7})


@pytest.mark.parametrize("servers, threaded", [(1, False), (3, False), (2, True)])
def test_a_table_drawn_on_the_servers_is_the_same_on_any_layout(servers, threaded, monkeypatch):
    """The servers draw their ranges from (seed, block of rows): whatever the number of servers, the
    table is TableInit.todense(); the INIT carries no rows. ``threaded``: drawn on a thread of its own
    (a big table: the server goes on serving meanwhile), then the parts are made on the server's thread."""
    from pskv.server import row_init
    if threaded:
        monkeypatch.setattr(row_init, "DRAW_IN_THREAD", 1)
        threads = []
        start = row_init.threading.Thread.start

        def spy(self):
            threads.append(self.name)
            return start(self)
        monkeypatch.setattr(row_init.threading.Thread, "start", spy)
    init_bytes = []
    request = WorkerClient.request

    def spy(self, server, command, arrays=(), data=None, *args, **kwargs):
        if command.name == "INIT":
            init_bytes.append(sum(memoryview(d).nbytes for d in data or ()))
        return request(self, server, command, arrays, data, *args, **kwargs)
    monkeypatch.setattr(WorkerClient, "request", spy)
    ask = [0, 1, 1023, 1024, 1500, 2047, 2999]

    def job(kv):
        kv.init("t", TABLE)
        return kv.row_sparse_pull("t", row_ids=ask), _whole(kv)

    with InProcessCluster(servers, 1, deadline=DEADLINE) as cluster:
        [(rows, whole)] = _run(cluster, job)
    want = TABLE.todense()
    np.testing.assert_array_equal(rows.data, want[ask])
    np.testing.assert_array_equal(whole, want)
    assert sum(init_bytes) == 0 and len(init_bytes) == servers
    if threaded:
        assert threads.count("pskv-draw-table") == servers
    assert abs(float(want.std()) - 0.1) < 0.01


def _whole(kv):
    out = np.zeros(TABLE.shape, np.float32)
    kv.pull("t", out=out)
    return out


def test_table_initializers_are_checked_and_bounded_by_the_servers():
    with pytest.raises(pskv.InvalidArgumentError, match="type must be one of"):
        pskv.TableInit((4, 2), "float32", {"type": "xavier"})
    with pytest.raises(pskv.InvalidArgumentError, match="low must be < high"):
        pskv.TableInit((4, 2), "float32", {"type": "uniform", "low": 1, "high": 0})
    with pytest.raises(pskv.InvalidArgumentError, match="has no field"):
        pskv.TableInit((4, 2), "float32", {"type": "normal", "sigma": 1})

    def job(kv):
        with pytest.raises(pskv.RemoteError, match="PSKV_MAX_TABLE_BYTES") as info:
            kv.init("huge", pskv.TableInit((1 << 30, 64), "float32", {"type": "uniform", "seed": 1}))
        kv.init("a", pskv.TableInit((2048, 64)))  # 256 KiB per server
        with pytest.raises(pskv.RemoteError, match="holds 262144 bytes of row-sparse keys") as total:
            kv.init("b", pskv.TableInit((8192, 64)))  # 1 MiB per server: fits alone, not with "a"
        kv.init("c", pskv.TableInit((4096, 64)))  # 512 KiB per server: fits beside "a"
        return str(info.value), str(total.value)

    with InProcessCluster(2, 1, deadline=DEADLINE, max_table_bytes=1 << 20) as cluster:
        [(message, total)] = _run(cluster, job)
    assert "init of row-sparse key" in message and "more than PSKV_MAX_TABLE_BYTES (1048576)" in total


# -- hostile rows ---------------------------------------------------------------------------
def _error(sock) -> str:
    assert sock.poll(5000), "no answer"
    header, _ = decode(sock.recv_multipart())
    assert header.command is Command.ERROR, header
    return json.loads(header.body)["message"]


def test_forged_rows_are_refused_and_the_server_lives_on(caplog):
    """A peer holding worker 1's token forges row messages to server 0 (rows [0, 500) of a
    1000-row key): out of range, unsorted, duplicated, too many rows — each refused with an
    error naming key, rows and sender; a huge count or a short frame is dropped by the decoder.
    The workers' job then runs exactly."""
    with InProcessCluster(2, 2, deadline=DEADLINE) as c:
        def job(kv):
            kv.init("h", pskv.RowSparse.zeros((1000, 2)))
            kv.init("ok", _init())
            if kv.rank == 0:
                _forge(c, caplog)
            kv.barrier()
            kv.push("ok", _grad(kv.rank, 1, 0))
            return kv.row_sparse_pull("ok", row_ids=list(range(ROWS))).todense()
        results = _run(c, job)
    want = _grad(0, 1, 0).todense() + _grad(1, 1, 0).todense()
    for got in results:
        np.testing.assert_allclose(got, want, rtol=1e-6)


@contextlib.contextmanager
def forged_worker(c):
    """A socket to server 0 bound, by a HELLO with its token, to worker 1 (node 11)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(c.servers[0].address)
    try:
        token = node_token(c.scheduler._secret, 11)
        sock.send_multipart(encode(Header(Command.HELLO, 1, 11, body=Hello("00000000000000ee", token).encode())))
        assert sock.poll(5000)
        sock.recv_multipart()
        yield sock
    finally:
        sock.close(0)
        ctx.term()


def _forge(c, caplog):
    key = pskv.partition.server_key("h")
    with forged_worker(c) as sock:
        def push(request, ids, n=None, number=900):
            ids = np.asarray(ids, np.int64)
            n = ids.size if n is None else n
            spec = ArraySpec(key, "float32", (n, 2), 0, number)
            return encode(Header(Command.PUSH, request, 11, (spec,), flags=Flag.ROWS),
                          [rows_frame(ids, np.ones((ids.size, 2), np.float32))])
        sock.send_multipart(push(2, [3, 700]))
        assert "row ids [700] outside this server's range [0, 500)" in _error(sock)
        sock.send_multipart(push(3, [9, 4]))
        assert "must be sorted and unique; 9 is followed by 4" in _error(sock)
        sock.send_multipart(push(4, [4, 4]))
        message = _error(sock)
        assert "sorted and unique" in message and f"key {key}" in message and "worker 1" in message
        sock.send_multipart(push(5, np.arange(600)))
        assert "600 rows, more than the 500 rows" in _error(sock)
        pull = ArraySpec(key, "float32", (1, 2), 0, 0)
        sock.send_multipart(encode(Header(Command.PULL, 6, 11, (pull,), flags=Flag.ROWS), [rows_frame([-1])]))
        assert "row ids [-1] outside" in _error(sock)
        body = InitBody((), ((1 << 40, None),)).encode()
        init = ArraySpec(pskv.partition.server_key("x"), "float32", (0, 2), 0, 0)
        sock.send_multipart(encode(Header(Command.INIT, 7, 11, (init,), body=body, flags=Flag.ROWS),
                                   [rows_frame(np.zeros(0, np.int64))]))
        assert "PSKV_MAX_TABLE_BYTES" in _error(sock)
        with caplog.at_level(logging.ERROR, logger="pskv.server"):
            huge = encode(Header(Command.PUSH, 8, 11, (ArraySpec(key, "float32", (1 << 40, 2), 0, 901),),
                                 flags=Flag.ROWS), [b"\0" * 24])
            sock.send_multipart(huge)
            short = push(9, [1, 2])
            short[1] = bytes(memoryview(short[1]))[:-1]
            sock.send_multipart(short)
            deadline = time.monotonic() + 5
            while caplog.text.count("rejected a malformed message") < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
        assert "exceeds the frame limit" in caplog.text and "need 32 bytes, frame has 31" in caplog.text
        assert not sock.poll(200)  # dropped: nothing answered


# -- checkpoints ----------------------------------------------------------------------------
def _train(kv, optimizer, steps, save=None):
    if optimizer is not None:
        kv.set_optimizer(optimizer())
    kv.init("emb", _init())  # kept on resume: the servers restored it
    for step in steps:
        if save is not None and step == save[0]:
            kv.save_checkpoint(save[1], {"step": step})
        kv.push("emb", [_grad(kv.rank, step, d) for d in range(2)])
    return _dense_pull(kv)


@pytest.mark.parametrize("name", ["none", "sgd-momentum"])
def test_a_checkpoint_keeps_row_sparse_keys_and_a_resumed_job_goes_on_exactly(tmp_path, name):
    """Each server saves its range (values, present rows, optimizer state); a job resumed from it
    ends bit for bit as the uninterrupted one. Without an optimizer the restored present rows
    matter: the next push zeroes them (a checkpoint that lost them would keep stale rows)."""
    optimizer = OPTIMIZERS[name]
    with InProcessCluster(2, 2, deadline=DEADLINE) as cluster:
        reference = _run(cluster, lambda kv: _train(kv, optimizer, range(3)))[0]
    path = str(tmp_path / "ckpt")
    with InProcessCluster(2, 2, deadline=DEADLINE, state_dir=str(tmp_path)) as cluster:
        _run(cluster, lambda kv: _train(kv, optimizer, range(2), save=(1, path)))
    with InProcessCluster(2, 2, deadline=DEADLINE, resume_from=path) as cluster:
        resumed = _run(cluster, lambda kv: _train(kv, optimizer, range(kv.resumed["meta"]["step"], 3)))
    for got in resumed:
        np.testing.assert_array_equal(got, reference)


def test_an_embeddings_sparse_gradient_trains_the_table_on_the_servers():
    """torch: a key made from a sparse COO tensor; nn.Embedding(sparse=True)'s uncoalesced gradient
    (row 5 twice) is pushed as it is; row_sparse_pull returns a coalesced sparse tensor of the rows."""
    torch = pytest.importorskip("torch")
    w0 = torch.arange(60, dtype=torch.float32).reshape(20, 3) / 10

    def job(kv):
        kv.set_optimizer(SGD(learning_rate=0.1))
        kv.init("e", w0.to_sparse(1))
        emb = torch.nn.Embedding(20, 3, sparse=True)
        emb.weight.data.copy_(w0)
        emb(torch.tensor([1, 5, 5, 17])).sum().backward()
        kv.push("e", emb.weight.grad)
        out = kv.row_sparse_pull("e", row_ids=torch.tensor([17, 5, 1]))
        return out.is_sparse, out.coalesce().indices()[0].tolist(), out.coalesce().values()

    with InProcessCluster(2, 2, deadline=DEADLINE) as cluster:
        results = _run(cluster, job)
    want = w0[[1, 5, 17]] - 0.1 * torch.tensor([2.0, 4.0, 2.0]).reshape(3, 1)  # 2 workers' rows summed
    for is_sparse, ids, values in results:
        assert is_sparse and ids == [1, 5, 17]
        torch.testing.assert_close(values, want)


def test_a_big_table_is_drawn_while_the_server_keeps_sending_heartbeats():
    """5M x 16 rows drawn on the server (about 2 s here) with a heartbeat timeout of 1 s: drawn on a thread
    of its own, the server keeps answering the scheduler (drawn inline, the scheduler gave it up for dead)."""
    big = pskv.TableInit((5_000_000, 16), "float32", {"type": "normal", "seed": 1})

    def job(kv):
        kv.init("t", big)
        return kv.row_sparse_pull("t", row_ids=[0, 4_999_999]).data

    with InProcessCluster(1, 1, deadline=DEADLINE, heartbeat_interval=0.2, heartbeat_timeout=1.0) as cluster:
        [rows] = _run(cluster, job)
    from pskv.arrays.tables import draw_rows
    np.testing.assert_array_equal(rows, np.concatenate([draw_rows(big.init, "float32", r, 1, 16) for r in (0, 4_999_999)]))


def test_a_row_push_a_server_refuses_fails_the_others_row_pull_of_that_round_at_once():
    """Rank 1 believes the row-sparse key is 4 wide (the inits pair different keys, which is
    allowed); the servers hold it 3 wide and refuse rank 1's rows. The round cannot complete:
    rank 0's row_sparse_pull fails at once naming rank 1's error, not after the request timeout."""
    def fn(kv):
        if kv.rank == 0:
            kv.init(["h", "g"], [pskv.RowSparse.zeros((ROWS, 3))] * 2)
            kv.init("f", pskv.RowSparse.zeros((ROWS, 3)))
        else:
            kv.init(["g", "f"], [pskv.RowSparse.zeros((ROWS, 3))] * 2)
            kv.init("h", pskv.RowSparse.zeros((ROWS, 4)))
        width = 3 if kv.rank == 0 else 4
        start = time.monotonic()
        try:
            kv.push("h", pskv.RowSparse([1, 30], np.ones((2, width), np.float32), (ROWS, width)))
            kv.row_sparse_pull("h", out=pskv.RowSparse.zeros((ROWS, width)), row_ids=[1, 30])
        except pskv.KVStoreError as exc:
            return exc, time.monotonic() - start
        return None, 0.0

    with InProcessCluster(2, 2, deadline=DEADLINE) as c:  # requests time out after DEADLINE (30 s)
        (r0, s0), (r1, s1) = _run(c, fn)
    for r in (r0, r1):
        assert isinstance(r, pskv.KVStoreError), r
    assert "worker 1's" in str(r0) and "cannot complete" in str(r0), r0  # the other rank learns who and what
    assert s0 < 5 and s1 < 5
