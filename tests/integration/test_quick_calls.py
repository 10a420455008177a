"""A training loop's small calls take the short path (:mod:`pskv.kvstore.quick`): ``push(block=False)``,
``pull(key, out=)``, ``pushpull``; every other call takes the general one, and both give the same rounds,
handles and errors."""

from __future__ import annotations

import collections
import sys
import threading

import numpy as np
import pytest

import pskv
from pskv.kvstore.engine import Engine
from pskv.testing import InProcessCluster
from pskv.testing.jobs import child_env, run_launch
from pskv.worker.fold import HeldPushes

ROUNDS = 20


def _count_quick(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Count the operations :meth:`Engine.start_now` started, by name (both workers' threads)."""
    started: collections.Counter[str] = collections.Counter()
    real = Engine.start_now

    def counted(self, name, *args, **kwargs):
        op = real(self, name, *args, **kwargs)
        started[name] += op is not None
        return op
    monkeypatch.setattr(Engine, "start_now", counted)
    return started


@pytest.mark.parametrize("shm", [1, 0])
def test_small_non_blocking_pushes_take_the_short_path_with_the_same_rounds(monkeypatch, shm):
    started = _count_quick(monkeypatch)
    alone = [0]  # pushes the worker layer held in its own few steps (one part in shared memory)
    hold_alone = HeldPushes.hold_alone

    def counted(self, *args):
        held = hold_alone(self, *args)
        alone[0] += held is not None
        return held
    monkeypatch.setattr(HeldPushes, "hold_alone", counted)

    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            kv.init([3, 4], [np.zeros(256, np.float32), np.zeros((4, 8), np.float64)])
            out, other = np.zeros(256, np.float32), np.zeros((4, 8), np.float64)
            for step in range(ROUNDS):
                handle = kv.push(3, np.full(256, kv.rank + step, np.float32), block=False)
                kv.push(4, np.full((4, 8), 1.0), block=False)
                kv.pull(3, out=out)
                kv.pull(4, out=other)
                assert np.all(out == 1 + 2 * step) and np.all(other == 2.0), (step, out[:2], other[0, :2])
                assert handle.wait(10) is None and handle.done()
            kv.wait(timeout=10)
            return True
        finally:
            kv.close()

    with InProcessCluster(1, 2, deadline=60, shm=shm) as cluster:
        assert cluster.run_workers(worker) == [True, True]
    assert started == {"push": 2 * 2 * ROUNDS, "pull": 2 * 2 * ROUNDS}  # both keys, both workers, every step
    assert alone[0] == (2 * 2 * ROUNDS if shm else 0)  # over sockets the general message path


@pytest.mark.parametrize("shm", [1, 0])
def test_pushpulls_take_the_short_path_into_the_out_or_the_value(monkeypatch, shm):
    started = _count_quick(monkeypatch)

    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            kv.init("w", np.zeros((8, 4), np.float32))
            out = np.zeros((8, 4), np.float32)
            for step in range(ROUNDS):
                grad = np.full((8, 4), kv.rank + step, np.float32)
                kv.pushpull("w", grad, out=out)
                assert np.all(out == 1 + 2 * step) and np.all(grad == kv.rank + step), (step, out[0])
                kv.pushpull("w", grad)  # no out: the sum lands in the value
                assert np.all(grad == 1 + 2 * step), (step, grad[0])
            with pytest.raises(pskv.ShapeMismatchError, match="w"):
                kv.pushpull("w", grad, out=np.zeros(32, np.float32))
            with pytest.raises(pskv.DTypeMismatchError, match="w"):
                kv.pull("w", out=np.zeros((8, 4), np.float64))
            outs = [np.zeros((8, 4), np.float32), np.zeros((8, 4), np.float32)]
            kv.pull("w", out=outs)  # two outs (devices): the general path fills both
            assert all(np.all(o == 1 + 2 * (ROUNDS - 1)) for o in outs)
            return True
        finally:
            kv.close()

    with InProcessCluster(1, 2, deadline=60, shm=shm) as cluster:
        assert cluster.run_workers(worker) == [True, True]
    assert started == {"pushpull": 2 * 2 * ROUNDS}


def test_every_other_push_takes_the_general_path_and_keeps_its_answers(monkeypatch):
    started = _count_quick(monkeypatch)

    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            kv.init(5, np.zeros(16, np.float32))
            out = np.zeros(16, np.float32)
            with pytest.raises(pskv.ShapeMismatchError, match="5"):
                kv.push(5, np.zeros(15, np.float32), block=False)
            with pytest.raises(pskv.DTypeMismatchError, match="5"):
                kv.push(5, np.zeros(16, np.float64), block=False)
            with pytest.raises(pskv.UnknownKeyError):
                kv.push(6, np.zeros(16, np.float32), block=False)
            with pytest.raises(pskv.InvalidTypeError, match="priority"):
                kv.push(5, np.zeros(16, np.float32), priority="high", block=False)  # type: ignore[arg-type]
            kv.push(5, [np.ones(16, np.float32), np.ones(16, np.float32)], block=False)  # two devices' values: summed
            kv.pull(5, out=out)
            assert np.all(out == 4.0), out[:2]
            go = threading.Event()  # an earlier operation holds the key: the push waits its turn behind it
            held = kv._engine.submit("hold", [5], 0, lambda: go.wait(10), block=False, timeout=10)
            pushed = kv.push(5, np.full(16, 3.0, np.float32), block=False)
            assert not pushed.done()
            go.set()
            held.wait(10)
            kv.pull(5, out=out)
            assert np.all(out == 6.0) and pushed.done(), out[:2]
            kv.wait(timeout=10)
            kv.close()
            with pytest.raises(pskv.StoreClosedError):
                kv.push(5, np.zeros(16, np.float32), block=False)
            return True
        finally:
            kv.close()

    with InProcessCluster(1, 2, deadline=60, shm=1) as cluster:
        assert cluster.run_workers(worker) == [True, True]
    assert started["push"] == 0  # the key held: the general path queued the last push behind the holder


def test_a_refused_short_path_push_fails_its_handle_or_the_next_wait():
    def worker(cfg):
        kv = pskv.create("dist_async", cluster=cfg)  # no optimizer on the servers: every push is refused
        try:
            kv.init(0, np.full(8, 5.0, np.float32))
            handle = kv.push(0, np.ones(8, np.float32), block=False)
            with pytest.raises(pskv.RemoteError, match="set_optimizer"):
                handle.wait(10)
            kv.push(0, np.ones(8, np.float32), block=False)  # nobody waits on this one ...
            with pytest.raises(pskv.RemoteError, match="set_optimizer"):
                kv.wait(timeout=10)  # ... so the next wait reports it
            with pytest.raises(pskv.RemoteError, match="set_optimizer"):
                kv.pushpull(0, np.ones(8, np.float32))  # a blocking call: its caller gets the error
            return float(kv.pull(0)[0])
        finally:
            kv.close()

    with InProcessCluster(1, 2, deadline=60, shm=1) as cluster:
        assert cluster.run_workers(worker) == [5.0, 5.0]


LAUNCHED = """
import collections
import numpy as np
import pskv
from pskv.kvstore.engine import Engine
from pskv.worker.fold import HeldPushes

started, alone = collections.Counter(), [0]
start_now, hold_alone = Engine.start_now, HeldPushes.hold_alone

def counted_start(self, name, *args, **kwargs):
    op = start_now(self, name, *args, **kwargs)
    started[name] += op is not None
    return op

def counted_hold(self, *args):
    held = hold_alone(self, *args)
    alone[0] += held is not None
    return held

Engine.start_now, HeldPushes.hold_alone = counted_start, counted_hold
with pskv.create("dist_sync") as kv:
    kv.init(7, np.zeros(1024, np.float32))
    out = np.zeros(1024, np.float32)
    for step in range(30):
        kv.push(7, np.full(1024, kv.rank + step, np.float32), block=False)
        kv.pull(7, out=out)
        assert np.all(out == 1 + 2 * step), (step, out[:2])
        kv.pushpull(7, np.ones(1024, np.float32), out=out)
        assert np.all(out == 2.0), (step, out[:2])
    print(f"rank {kv.rank} quick {sorted(started.items())} held alone {alone[0]}", flush=True)
"""


def test_through_pskv_launch_the_loop_takes_the_short_paths(tmp_path):
    """Real processes (scheduler, server, 2 workers through ``pskv launch``, shared memory on one host): every
    push, pull and pushpull of the loop takes the short path, with the rounds' exact sums."""
    script = tmp_path / "loop.py"
    script.write_text(LAUNCHED)
    code, out = run_launch(["-n", "2", "-s", "1", "--", sys.executable, str(script)], tmp_path, 90, env=child_env())
    assert code == 0, out
    for rank in (0, 1):
        assert f"rank {rank} quick [('pull', 30), ('push', 30), ('pushpull', 30)] held alone 30" in out, out
