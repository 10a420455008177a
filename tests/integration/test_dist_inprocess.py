"""Distributed semantics with a whole cluster in this process (scheduler, servers, workers)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import pskv
from pskv.optimizer import SGD
from pskv.testing import InProcessCluster

DEADLINE = 30.0


def run(servers, workers, fn, store="dist_sync", **settings):
    with InProcessCluster(servers, workers, deadline=DEADLINE, **settings) as cluster:
        def body(cfg):
            kv = pskv.create(store, cluster=cfg)
            try:
                return fn(kv)
            finally:
                kv.close()
        return cluster.run_workers(body)


@pytest.mark.parametrize("servers", [1, 2])
def test_init_uses_rank0_value_and_push_sums_over_workers(servers):
    def fn(kv):
        kv.init(3, np.full((2, 3), 10.0 + kv.rank, np.float32))  # only rank 0's value counts
        first = kv.pull(3)
        kv.push(3, [np.ones((2, 3), np.float32) * (kv.rank + 1)] * 2)  # 2 devices per worker
        return first, kv.pull(3)

    for first, after in run(servers, 2, fn):
        assert (first == 10).all()
        assert (after == 2 * (1 + 2)).all()


def test_big_arrays_are_split_over_servers_and_reassembled():
    n = 3_000_001

    def fn(kv):
        kv.init(0, np.zeros(n, np.float32))
        kv.push(0, np.arange(n, dtype=np.float32))
        return kv.pull(0), sorted(server for server, _, _ in kv._keys[0].parts)

    for value, servers in run(3, 2, fn, bigarray_bound=1_000_000, part_bytes=4 << 20):  # 4 MB slices, uncut
        assert servers == [0, 1, 2]  # one slice on every server
        np.testing.assert_array_equal(value, 2 * np.arange(n, dtype=np.float32))


def test_consecutive_pushes_give_every_worker_the_same_values():
    def fn(kv):
        kv.init(1, np.zeros(4))
        for i in range(10):
            kv.push(1, np.full(4, float(i * (kv.rank + 1))))  # no pulls in between
        return kv.pull(1)

    results = run(1, 3, fn)
    for r in results:
        np.testing.assert_array_equal(r, results[0])
    np.testing.assert_array_equal(results[0], np.full(4, 9.0 * (1 + 2 + 3)))


def test_string_keys_map_to_the_same_server_key_whatever_the_init_order():
    def fn(kv):
        names = ["w", "b", "gamma"] if kv.rank == 0 else ["gamma", "w", "b"]
        for name in names:
            kv.init(name, np.full(2, float(len(name)), np.float32) if kv.rank == 0 else np.zeros(2, np.float32))
        return {name: kv.pull(name)[0] for name in names}

    for got in run(2, 2, fn):
        assert got == {"w": 1.0, "b": 1.0, "gamma": 5.0}


def test_key_lists_per_device_lists_and_pushpull():
    def fn(kv):
        keys = [5, 7, 9]
        kv.init(keys, [np.zeros(3, np.float32)] * 3)
        kv.push(keys, [[np.ones(3, np.float32)] * 2, np.ones(3, np.float32), np.full(3, 3, np.float32)])
        outs = [[np.zeros(3, np.float32) for _ in range(2)] for _ in keys]
        kv.pull(keys, out=outs)
        vals = [np.ones(3, np.float32), np.ones(3, np.float32)]
        kv.pushpull(5, vals)  # in place
        return [o[1][0] for o in outs], vals[1][0]

    for pulled, pp in run(2, 2, fn):
        assert pulled == [4.0, 2.0, 6.0] and pp == 4.0


def test_pushing_keys_in_different_orders_does_not_deadlock():
    def fn(kv):
        keys = list(range(6))
        kv.init(keys, [np.zeros(2)] * 6)
        order = keys if kv.rank == 0 else keys[::-1]
        for k in order:
            kv.push(k, np.full(2, float(k)))
        return kv.pull(keys)

    for values in run(2, 2, fn):
        assert [v[0] for v in values] == [2.0 * k for k in range(6)]


def test_server_optimizer_and_new_hyperparameters_keep_state():
    def fn(kv):
        kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.5))
        kv.init(0, np.zeros(3))
        kv.push(0, np.ones(3))  # summed grad 2 -> buf 2, w = -0.2
        first = kv.pull(0)
        kv.set_optimizer(SGD(learning_rate=0.01, momentum=0.5))
        kv.push(0, np.ones(3))  # buf = 0.5*2 + 2 = 3 -> w = -0.2 - 0.03
        return first, kv.pull(0)

    for first, second in run(2, 2, fn):
        np.testing.assert_allclose(first, -0.2)
        np.testing.assert_allclose(second, -0.23)


def test_async_needs_an_optimizer_and_applies_each_push():
    def fn(kv):
        kv.init(0, np.zeros(2))
        with pytest.raises(pskv.RemoteError, match="dist_async.*set_optimizer"):
            kv.push(0, np.ones(2))
        kv.barrier()
        kv.set_optimizer(SGD(learning_rate=1.0))
        kv.push(0, np.ones(2))
        kv.barrier()
        return kv.pull(0)

    for value in run(1, 2, fn, store="dist_async"):
        np.testing.assert_allclose(value, -2.0)


def test_broadcast_new_and_existing_keys_and_barrier():
    def fn(kv):
        out = np.zeros(3, np.float32)
        kv.broadcast("p", np.full(3, 1.0 + kv.rank, np.float32), out=out)
        first = out.copy()
        kv.broadcast("p", np.full(3, 7.0 + kv.rank, np.float32), out=out)
        kv.barrier()
        return first, out

    for first, second in run(2, 2, fn):
        assert (first == 1).all() and (second == 7).all()


def test_errors_are_typed_and_the_servers_survive():
    def fn(kv):
        kv.init(1, np.zeros(3, np.float32))
        with pytest.raises(pskv.UnknownKeyError):
            kv.push(2, np.zeros(3, np.float32))
        with pytest.raises(pskv.ShapeMismatchError):
            kv.push(1, np.zeros(4, np.float32))
        with pytest.raises(pskv.NotSupportedError, match="set_optimizer"):
            kv.set_updater(lambda *a: None)
        kv.push(1, np.ones(3, np.float32))
        return kv.pull(1)

    for value in run(1, 2, fn):
        assert (value == 2).all()


def test_torch_tensors_and_bfloat16():
    torch = pytest.importorskip("torch")

    def fn(kv):
        kv.init(0, torch.zeros(4, dtype=torch.bfloat16))
        kv.push(0, torch.full((4,), 1.5, dtype=torch.bfloat16))
        got = kv.pull(0)
        out = torch.zeros(4, dtype=torch.bfloat16)
        kv.pushpull(0, torch.ones(4, dtype=torch.bfloat16), out=out)
        return got, out

    for got, out in run(1, 2, fn):
        assert got.dtype == torch.bfloat16 and float(got[0]) == 3.0 and float(out[0]) == 2.0


def test_non_blocking_calls_and_priorities():
    def fn(kv):
        keys = list(range(4))
        kv.init(keys, [np.zeros(2)] * 4)
        handles = [kv.push(k, np.ones(2), priority=-k, block=False) for k in keys]
        pulled = kv.pull(keys, block=False)
        values = pulled.wait(DEADLINE)
        assert all(h.done() for h in handles)
        return [v[0] for v in values]

    for values in run(2, 2, fn):
        assert values == [2.0] * 4


def test_num_dead_node_and_properties():
    def fn(kv):
        return kv.rank, kv.num_workers, kv.type, kv.num_dead_node(6, timeout=60), kv.is_capable("row_sparse_pull")

    got = run(1, 2, fn)
    assert sorted(g[0] for g in got) == [0, 1]
    assert all(g[1:] == (2, "dist_sync", 0, True) for g in got)


def test_a_dead_worker_fails_the_others_barrier_with_its_name():
    with InProcessCluster(1, 2, deadline=DEADLINE, heartbeat_interval=0.05, heartbeat_timeout=0.6) as cluster:
        def fn(cfg):
            kv = pskv.create("dist_sync", cluster=cfg)
            if kv.rank == 1:
                kv._worker.client.close()  # this worker "dies": no more heartbeats
                return None
            start = time.monotonic()
            with pytest.raises(pskv.NodeFailedError, match="worker 1"):
                kv.barrier()
            elapsed = time.monotonic() - start
            kv.close()  # leaves cleanly despite the dead peer
            return elapsed

        results = cluster.run_workers(fn)
    assert results[0] < 10


def test_a_dead_server_fails_blocked_pulls_with_its_name():
    with InProcessCluster(2, 1, deadline=DEADLINE, heartbeat_interval=0.05, heartbeat_timeout=0.6) as cluster:
        def fn(cfg):
            kv = pskv.create("dist_sync", cluster=cfg)
            kv.init(list(range(8)), [np.zeros(2)] * 8)
            victim = cluster.servers[1]
            victim.stop()  # a server dies: no more answers, no more heartbeats
            errors = [victim.name]
            for _ in range(2):
                try:
                    kv.pull(list(range(8)))
                except pskv.NodeFailedError as exc:
                    errors.append(str(exc))
            kv.close()
            return errors

        victim_name, *errors = cluster.run_workers(fn)[0]
    assert victim_name in ("server 0", "server 1")
    assert len(errors) == 2 and all(f"{victim_name} failed" in e for e in errors)


def test_optimizer_states_are_saved_and_loaded_by_every_server(tmp_path):
    base = str(tmp_path / "opt")

    def fn(kv):
        kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9))
        kv.init(list(range(4)), [np.zeros(3)] * 4)
        kv.push(list(range(4)), [np.ones(3)] * 4)
        kv.save_optimizer_states(base, dump_optimizer=True)
        before = kv.pull(0)
        kv.push(list(range(4)), [np.ones(3)] * 4)  # momentum matters here
        after_continuous = kv.pull(0)
        kv.load_optimizer_states(base)  # momentum back to the saved state
        return before, after_continuous

    results = run(2, 2, fn, state_dir=str(tmp_path))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["opt.server0", "opt.server1"]
    np.testing.assert_allclose(results[0][0], -0.2)
    np.testing.assert_allclose(results[0][1], -0.2 - 0.1 * (0.9 * 2 + 2))


def test_send_command_reaches_controllers_registered_on_the_servers():
    from pskv.server import controller
    from pskv.server.controllers import CONTROLLERS

    seen = []

    @controller(7)
    def record(head, body):
        seen.append((head, body))
        return "ok"

    try:
        def fn(kv):
            if kv.rank == 0:
                kv.send_command_to_servers(7, "hello")
                with pytest.raises(pskv.RemoteError, match="no controller for head 8"):
                    kv.send_command_to_servers(8, "x")
            kv.barrier()

        run(2, 2, fn)
    finally:
        CONTROLLERS.pop("7")
    assert seen == [(7, "hello"), (7, "hello")]  # once per server


def test_byteps_store_sums_and_broadcasts():
    def fn(kv):
        # no launcher, a scheduler on loopback: every worker is on this host, local_rank = rank
        assert kv.type == "byteps" and not kv.is_capable("optimizer") and kv.local_rank == kv.rank
        vals = [np.full(3, float(kv.rank + 1))]
        kv.pushpull("g", vals)  # declared on first use, then summed over workers
        out = np.zeros(3)
        kv.pushpull("g", np.ones(3), out=out)
        b = np.zeros(2)
        kv.broadcast("w", np.full(2, 5.0 + kv.rank), out=b)
        with pytest.raises(pskv.NotSupportedError):
            kv.set_optimizer(SGD())
        with pytest.raises(pskv.NotSupportedError):
            kv.push("g", np.ones(3))
        return vals[0][0], out[0], b[0]

    for summed, again, bcast in run(2, 2, fn, store="byteps"):
        assert (summed, again, bcast) == (3.0, 2.0, 5.0)


def test_a_stalled_round_is_reported_with_the_missing_workers(caplog):
    def fn(kv):
        kv.init(4, np.zeros(2))
        if kv.rank == 1:
            time.sleep(1.5)  # worker 1 is late
        kv.push(4, np.ones(2))
        return kv.pull(4)

    with caplog.at_level("WARNING", logger="pskv.server"):
        values = run(1, 2, fn, stall_report=0.3)
    assert all((v == 2).all() for v in values)
    reports = [r.getMessage() for r in caplog.records if "has waited" in r.getMessage()]
    assert reports and "round 1 of key 4" in reports[0] and "for worker 1 (pushed: worker 0)" in reports[0]


def test_a_dead_worker_fails_pulls_waiting_for_its_push():
    with InProcessCluster(1, 2, deadline=DEADLINE, heartbeat_interval=0.05, heartbeat_timeout=0.6) as cluster:
        def fn(cfg):
            kv = pskv.create("dist_sync", cluster=cfg)
            kv.init(0, np.zeros(2))
            if kv.rank == 1:
                kv._worker.client.close()  # dies before pushing
                return None
            kv.push(0, np.ones(2))  # accepted: the data is on the server
            start = time.monotonic()
            with pytest.raises(pskv.NodeFailedError, match="worker 1 failed: worker 1 died, so the sync round"):
                kv.pull(0)  # waits for a round worker 1 will never complete
            with pytest.raises(pskv.NodeFailedError, match="worker 1"):
                kv.pull(0)  # and so does the next one, at once
            elapsed = time.monotonic() - start
            kv.close()
            return elapsed

        elapsed = cluster.run_workers(fn)[0]
    assert elapsed < 10


@pytest.mark.parametrize("shm", [0, 1])
def test_socket_and_shared_memory_paths_give_the_same_results(shm):
    n = 1_500_000  # split over both servers

    def fn(kv):
        kv.init([0, 1], [np.zeros(n, np.float32), np.zeros((3, 2))])
        used = [part is not None for part in kv._keys[0].shm]
        kv.push([0, 1], [[np.ones(n, np.float32)] * 2, np.full((3, 2), float(kv.rank))])
        big, small = kv.pull([0, 1])
        out = np.zeros((3, 2))
        kv.pushpull(1, np.ones((3, 2)), out=out)
        kv.set_optimizer(SGD(learning_rate=0.5))
        kv.push(0, np.ones(n, np.float32))
        after = kv.pull(0)
        return used, big[[0, -1]], small[0, 0], out[0, 0], after[[0, -1]]

    for used, big, small, pp, after in run(2, 2, fn, shm=shm, part_bytes=4 << 20):  # one 3 MB slice per server
        assert used == [bool(shm)] * 2
        assert big.tolist() == [4.0, 4.0] and small == 1.0 and pp == 2.0
        assert after.tolist() == [4.0 - 0.5 * 2, 4.0 - 0.5 * 2]


@pytest.mark.parametrize("shm", [0, 1])
def test_row_sparse_pull_across_processes(shm):
    def fn(kv):
        table = np.arange(20, dtype=np.float32).reshape(5, 4)
        kv.init("emb", table if kv.rank == 0 else np.zeros((5, 4), np.float32))
        full = kv.row_sparse_pull("emb", row_ids=[3, 1, 3])
        compact = np.zeros((2, 4), np.float32)
        kv.row_sparse_pull("emb", out=compact, row_ids=np.array([4, 0]))
        with pytest.raises(pskv.InvalidArgumentError, match="out of range"):
            kv.row_sparse_pull("emb", row_ids=[5])
        return full, compact, kv.is_capable("row_sparse_pull")

    table = np.arange(20, dtype=np.float32).reshape(5, 4)
    for full, compact, capable in run(1, 2, fn, shm=shm):
        want = np.zeros((5, 4), np.float32)
        want[[1, 3]] = table[[1, 3]]
        np.testing.assert_array_equal(full, want)
        np.testing.assert_array_equal(compact, table[[0, 4]])
        assert capable


# -- pipelining: pulls sent right behind non-blocking pushes ---------------------------------
@pytest.mark.parametrize("shm", [0, 1])
def test_a_pull_right_after_a_non_blocking_push_sees_that_push(shm):
    def fn(kv):
        kv.init([0, 1], [np.zeros(3), np.zeros(3)])
        seen = []
        for step in range(1, 6):
            h = kv.push([0, 1], [np.full(3, float(step)), np.full(3, 10.0 * step)], block=False)
            seen.append((kv.pull(0)[0], kv.pull(1)[0]))
            assert h.done() and h.exception() is None  # acknowledged before any pull that includes it returns
        return seen

    for seen in run(2, 2, fn, shm=shm):
        assert seen == [(2.0 * s, 20.0 * s) for s in range(1, 6)]


@pytest.mark.parametrize("shm", [0, 1])
def test_a_pull_that_overtakes_its_push_waits_for_it(shm):
    def fn(kv):
        kv.init(0, np.zeros(3))
        client = kv._worker.client
        kv._worker._fold_bytes = -1  # else the push is held and leaves with the pull (tests/integration/test_push_fold.py)
        got = []
        for step in range(1, 4):
            with client._send_lock:  # another thread is sending: both requests queue up ...
                h = kv.push(0, np.full(3, float(step)), priority=-5, block=False)
                pulled = kv.pull(0, priority=5, block=False)  # ... and the pull leaves first
                assert [entry[-1].what for entry in sorted(client._queue)] == ["pull", "push"]
            client._flush()
            got.append(pulled.wait(DEADLINE)[0])
            h.wait(DEADLINE)
        return got

    for got in run(1, 2, fn, shm=shm):
        assert got == [2.0, 4.0, 6.0]


@pytest.mark.parametrize("shm", [0, 1])
def test_many_pipelined_pushes_then_one_pull(shm):
    def fn(kv):
        kv.init([0, 1], [np.zeros(4, np.float32), np.zeros((2, 2))])
        handles = []
        for step in range(1, 21):
            handles.append(kv.push(0, np.full(4, step * (kv.rank + 1.0), np.float32), block=False))
            handles.append(kv.push([1], [[np.full((2, 2), float(step))] * 2], block=False))  # reduced locally
        first, second = kv.pull([0, 1])
        assert all(h.done() and h.exception() is None for h in handles)
        return first[0], second[0, 0]

    for first, second in run(2, 2, fn, shm=shm):
        assert (first, second) == (20.0 * 3, 20.0 * 2 * 2)  # the 20th round: every worker's 20th push


def test_per_key_order_and_priorities_with_non_blocking_calls():
    def fn(kv):
        kv.init(0, np.zeros(2))
        out = np.zeros(2)
        ops = [
            kv.push(0, np.full(2, 1.0), priority=-1, block=False),
            kv.pull(0, priority=10, block=False),
            kv.push(0, np.full(2, 2.0), priority=5, block=False),
            kv.pull(0, out=out, priority=-10, block=False),
            kv.pushpull(0, np.full(2, 3.0), priority=0, block=False),
            kv.pull(0, block=False),
        ]
        results = [h.wait(DEADLINE) for h in ops]
        return results[1][0], out[0], results[5][0]

    for first, second, third in run(1, 2, fn):
        assert (first, second, third) == (2.0, 4.0, 6.0)  # each pull sees the rounds issued before it


@pytest.mark.parametrize("shm", [0, 1])
def test_a_lone_non_blocking_push_is_confirmed_when_waited_on(shm):
    def fn(kv):
        kv.init([0, 1], [np.zeros(2), np.zeros(2)])
        h = kv.push(0, np.ones(2), block=False)  # answered only if it fails: nothing else follows
        h.wait(DEADLINE)
        kv.push(1, np.ones(2), block=False)
        kv.wait(timeout=DEADLINE)  # waits for (and confirms) it too
        kv.push(1, np.ones(2), block=False)
        kv.push(1, np.full(2, 2.0), block=False)  # reuses the key's buffers: waits for the previous one
        kv.push(0, np.ones(2), block=False)  # left outstanding: close() confirms it
        return kv.pull(1)[0]

    for value in run(1, 2, fn, shm=shm):
        assert value == 4.0


def test_a_failed_non_blocking_push_then_pull():
    def fn(kv):
        kv.init(0, np.full(2, 5.0))
        h = kv.push(0, np.ones(2), block=False)  # dist_async without an optimizer: refused
        value = kv.pull(0)[0]  # not stuck waiting for it: it counts as this worker's push
        with pytest.raises(pskv.RemoteError, match="set_optimizer"):
            h.wait(DEADLINE)
        kv.wait(timeout=DEADLINE)  # observed through the handle: not raised again
        kv.push(0, np.ones(2), block=False)  # nobody looks at this one ...
        with pytest.raises(pskv.RemoteError, match="set_optimizer"):
            kv.wait(timeout=DEADLINE)  # ... so the next wait reports it
        kv.push(0, np.ones(2), block=False)
        pulled = kv.pull(0)[0]
        kv.barrier()
        with pytest.raises(pskv.RemoteError):
            kv.wait(timeout=DEADLINE)
        return value, pulled

    for value, pulled in run(1, 2, fn, store="dist_async"):
        assert value == pulled == 5.0


# -- no deadlock with more in-flight operations than engine threads ----------------------------
@pytest.mark.parametrize("shm", [0, 1])
def test_more_non_blocking_pushpulls_than_engine_threads_in_opposite_orders(shm):
    # A pushpull waits for its round, i.e. for the other worker's push of that key. If a
    # waiting operation held an engine thread, worker 0 could fill both of its threads
    # with keys 0, 1 while worker 1 fills its own with keys 7, 6, and neither would ever
    # send the pushes the other waits for (the hang CI once saw in the trainer test).
    n = 8

    def fn(kv):
        kv.init(list(range(n)), [np.zeros(16, np.float32)] * n)
        order = list(range(n)) if kv.rank == 0 else list(reversed(range(n)))
        results = []
        for step in range(5):
            outs = {k: np.empty(16, np.float32) for k in order}
            handles = [kv.pushpull(k, np.full(16, float(k + kv.rank + step), np.float32), out=outs[k],
                                   priority=(k if kv.rank == 0 else -k), block=False) for k in order]
            for h in handles:
                h.wait(timeout=20)
            results.append({k: float(outs[k][0]) for k in range(n)})
        return results

    config = pskv.config.Config(engine_threads=2)
    with InProcessCluster(2, 2, deadline=DEADLINE, shm=shm) as cluster:
        def body(cfg):
            kv = pskv.create("dist_sync", cluster=cfg, config=config)
            try:
                return fn(kv)
            finally:
                kv.close()
        per_worker = cluster.run_workers(body)
    for step in range(5):
        expect = {k: float(2 * (k + step) + 1) for k in range(n)}
        assert per_worker[0][step] == expect and per_worker[1][step] == expect


# -- uneven data: join ----------------------------------------------------------------------
@pytest.mark.parametrize("shm", [0, 1])
def test_join_lets_workers_with_uneven_batch_counts_finish_each_epoch(shm):
    # worker 0 has 3 batches per epoch, worker 1 has 5: without join, worker 1's 4th
    # pushpull would wait for a push that never comes.
    def fn(kv):
        kv.init("w", np.zeros(2, np.float32))
        seen = []
        for _epoch in range(2):
            for _step in range(3 if kv.rank == 0 else 5):
                out = np.empty(2, np.float32)
                kv.pushpull("w", np.full(2, float(kv.rank + 1), np.float32), out=out)
                seen.append(float(out[0]))
            kv.join(timeout=20)
        return seen, kv.pull("w")

    (seen0, final0), (seen1, final1) = run(1, 2, fn, shm=shm)
    assert seen0 == [3.0] * 6  # rounds with both workers: 1 + 2
    assert seen1 == [3.0, 3.0, 3.0, 2.0, 2.0] * 2  # after worker 0 joined: worker 1 alone
    assert final0.tolist() == final1.tolist() == [2.0, 2.0]  # no updater: the last round's sum


def test_a_summed_key_keeps_plain_sums_while_an_optimizer_updates_the_others():
    def fn(kv):
        kv.set_optimizer(SGD(learning_rate=0.5))
        kv.init("w", np.ones(3, np.float32))
        kv.init("count", np.zeros(2, np.float32), summed=True)
        kv.push(["w", "count"], [np.ones(3, np.float32), np.array([1, 10], np.float32)])
        return kv.pull("w"), kv.pull("count")

    for w, count in run(2, 2, fn):
        np.testing.assert_allclose(w, 1 - 0.5 * 2)  # SGD on the sum of two pushes of 1
        assert count.tolist() == [2, 20]  # the plain sum, not an SGD step


# -- big values travel as a pipeline of pieces (PSKV_PART_BYTES) ------------------------------
@pytest.mark.parametrize("shm", [0, 1])
def test_big_values_are_cut_into_pieces_sent_as_separate_messages(shm):
    n, piece = 100_000, 10_000  # float32: 40,000-byte pieces; split over 2 servers, then 5 pieces each

    def fn(kv):
        sent = []
        request = kv._worker.client.request

        def counting(server, command, *args, **kwargs):
            sent.append((server, command.name))
            return request(server, command, *args, **kwargs)

        kv._worker.client.request = counting
        kv.init([0, 1], [np.zeros(n, np.float32), np.zeros(3, np.float32)])
        parts = kv._keys[0].parts
        kv.push([0, 1], [np.arange(n, dtype=np.float32) * (kv.rank + 1), np.ones(3, np.float32)])
        pulled = kv.pull(0)
        del sent[:]
        out = np.zeros(n, np.float32)
        kv.pushpull(0, np.ones(n, np.float32), out=out)
        pushpulls = [s for s, c in sent if c == "PUSHPULL"]
        kv.set_optimizer(SGD(learning_rate=0.5))
        kv.push(0, np.ones(n, np.float32))
        stepped = kv.pull(0)
        kv.push(0, np.ones(n, np.float32))  # a second step, on the pieces joined by the first
        stepped = [stepped, kv.pull(0)]
        kv.broadcast(0, np.full(n, 9.0, np.float32), out=np.zeros(n, np.float32))
        used = [shared is not None for shared in kv._keys[0].shm]  # the pieces' values in the key's shared buffers
        return parts, pulled, out, (kv.rank, pushpulls), stepped, kv.pull(0), used

    for parts, pulled, out, (rank, pushpulls), stepped, broadcast, used in run(2, 2, fn, shm=shm,
                                                                               bigarray_bound=50_000,
                                                                               part_bytes=4 * piece):
        assert used == [bool(shm)] * 10
        assert len(parts) == 10 and all(length <= piece for _, _, length in parts)
        assert sorted({server for server, _, _ in parts}) == [0, 1]
        np.testing.assert_array_equal(pulled, 3 * np.arange(n, dtype=np.float32))
        assert (out == 2).all()
        # through sockets one message per piece, the servers in turn from the worker's rank's; shared memory: one
        # per server
        turn = [rank, 1 - rank]
        assert pushpulls == (turn * 5 if not shm else turn)
        assert (stepped[0] == 2 - 0.5 * 2).all() and (stepped[1] == 1 - 0.5 * 2).all()
        assert (broadcast == 9).all()


@pytest.mark.parametrize("shm", [0, 1])
def test_the_parts_of_a_value_land_directly_in_a_fitting_out(shm):
    import torch

    n = 40_000  # 4 pieces on each of 2 servers

    def fn(kv):
        kv.init([0, 1], [np.zeros(n, np.float32), torch.zeros(n)])
        rec0, rec1 = kv._keys[0], kv._keys[1]
        kv.push([0, 1], [np.full(n, kv.rank + 1.0, np.float32), torch.full((n,), kv.rank + 1.0)])
        out0, out1 = np.zeros(n, np.float32), torch.zeros(n)
        kv.pull([0, 1], out=[out0, out1])
        landed = rec0.recv is None and rec1.recv is None  # no assembly buffer: the parts went into the outs
        strided = np.zeros((n, 2), np.float32)[:, 0]  # does not fit: assembled, then copied
        kv.pull(0, out=strided)
        value = np.ones(n, np.float32)
        kv.pushpull(0, value)  # out=None: the result lands in the pushed value itself
        return landed, out0[[0, -1]], out1[[0, -1]].tolist(), strided[[0, -1]], value[[0, -1]], rec0.recv is not None

    for landed, a, b, strided, value, assembled in run(2, 2, fn, shm=shm, bigarray_bound=10_000, part_bytes=20_000):
        assert landed and assembled
        assert a.tolist() == b == strided.tolist() == [3.0, 3.0]
        assert value.tolist() == [2.0, 2.0]


@pytest.mark.parametrize("channel", ["tcp", "zmq"])
def test_a_pull_behind_a_big_non_blocking_push_overtakes_it_on_the_reply_connection(channel, monkeypatch):
    """With data connections the pull takes the server's second one (lane 1), else the ZeroMQ reply connection."""
    from pskv.protocol import Command
    from pskv.protocol.codec import decode_head
    from pskv.transport.stream import StreamConnection
    n = 2_000_000  # 8 MB: one 4 MB piece on each of 2 servers
    lane_sends = []
    stream_send = StreamConnection.send

    def pull(frames) -> bool:  # heartbeats and others may leave on the same connections under load
        return decode_head(list(frames))[0].command is Command.PULL

    def spy_lanes(conn, frames):
        if pull(frames):
            lane_sends.append(conn)
        return stream_send(conn, frames)
    monkeypatch.setattr(StreamConnection, "send", spy_lanes)

    def fn(kv):
        kv.init([0, 1], [np.zeros(n, np.float32), np.zeros(10, np.float32)])
        client = kv._worker.client
        overtaking, send_dealer = [], client._reactor.send_dealer
        lanes = set(client.lanes.overtaking.values())
        assert len(lanes) == (2 if channel == "tcp" else 0)

        def spy(sid, frames):
            if pull(frames):
                overtaking.append(sid)
            return send_dealer(sid, frames)

        client._reactor.send_dealer = spy
        start = len(lane_sends)
        seen = []
        for step in range(1, 4):
            big = kv.push(0, np.full(n, float(step), np.float32), block=False)  # acknowledged: big
            out = np.zeros(n, np.float32)
            kv.pull(0, out=out)  # leaves on the reply connections, ahead of the pushed megabytes
            small = kv.push(1, np.full(10, float(step), np.float32), block=False)  # quiet
            seen.append((out[0], out[-1], kv.pull(1)[0]))  # small: the request connection, confirms the push
            big.wait(DEADLINE)
            small.wait(DEADLINE)
        return seen, len(overtaking) + sum(c in lanes for c in lane_sends[start:])

    for seen, overtaken in run(2, 2, fn, shm=0, data_channel=channel, part_bytes=4 << 20):  # 4 MB slices, uncut
        assert seen == [(2.0 * s, 2.0 * s, 2.0 * s) for s in range(1, 4)]
        assert overtaken == 3 * 2  # every big pull, to both servers; no small one


def test_lr_and_wd_multipliers_of_str_keys_reach_the_servers_optimizer():
    def fn(kv):
        opt = SGD(learning_rate=1.0, wd=0.5)
        opt.set_lr_mult({"frozen": 0.0})
        opt.set_wd_mult({"no_decay": 0.0})
        kv.set_optimizer(opt)
        kv.init(["frozen", "no_decay", "plain"], [np.ones(3, np.float32)] * 3)
        kv.push(["frozen", "no_decay", "plain"], [np.ones(3, np.float32)] * 3)
        return [kv.pull(k)[0] for k in ("frozen", "no_decay", "plain")]

    for frozen, no_decay, plain in run(2, 2, fn):
        assert frozen == 1.0  # lr_mult 0: unchanged (the servers saw its name's hash and missed it before)
        assert no_decay == 1.0 - 1.0 * 2  # gradient sum 2, no decay
        assert plain == 1.0 - 1.0 * (2 + 0.5 * 1.0)
