"""Collectives succeed or fail together: named and counted meetings, rank 0's outcome on every rank.

A whole cluster in this process (scheduler, servers, workers as threads); the launched
test at the end runs the same promises through ``pskv launch``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import pskv
from pskv.optimizer import SGD
from pskv.testing import InProcessCluster
from tests.fault.launched import launch_job

DEADLINE = 30.0


def run(fn, workers=2, servers=1, request_timeout=None, **settings):
    """``fn(kv)`` on every worker; each result, or the exception it raised, with the time it returned."""
    with InProcessCluster(servers, workers, deadline=DEADLINE, **settings) as cluster:
        def body(cfg):
            if request_timeout is not None:
                cfg = dataclasses.replace(cfg, request_timeout=request_timeout)
            kv = pskv.create("dist_sync", cluster=cfg)
            try:
                try:
                    return fn(kv), time.monotonic()
                except pskv.KVStoreError as exc:
                    return exc, time.monotonic()
            finally:
                kv.set_barrier_before_exit(False)  # a failed collective leaves the others elsewhere
                kv.close()
        return cluster.run_workers(body)


class _Unknown(SGD):
    """An optimizer pskv does not know: rank 0 cannot build its config (rank 0 raises on its own)."""

    def to_config(self):
        return {**super().to_config(), "name": "no_such_optimizer"}


def _fail_on_rank0(op, tmp_path):
    def fn(kv):
        kv.init(0, np.zeros(4, np.float32))
        if op == "set_optimizer":
            kv.set_optimizer(_Unknown(learning_rate=0.1))
        else:
            kv.set_optimizer(SGD(learning_rate=0.1))
        if op == "load_optimizer_states":
            kv.load_optimizer_states(str(tmp_path / "never_written"))
        elif op == "save_optimizer_states":
            kv.save_optimizer_states(str(tmp_path / "no" / "such" / "dir" / "states"))
        elif op == "save_checkpoint":
            (tmp_path / "a_file").write_text("not a directory")
            kv.save_checkpoint(str(tmp_path / "a_file" / "ckpt"))  # rank 0 cannot even create it
        return "returned"
    return fn


@pytest.mark.parametrize("op", ["set_optimizer", "load_optimizer_states", "save_optimizer_states",
                                "save_checkpoint"])
def test_a_failure_on_rank0_raises_on_every_rank_within_5_s(tmp_path, op):
    (r0, t0), (r1, t1) = run(_fail_on_rank0(op, tmp_path), servers=2, state_dir=str(tmp_path))
    assert isinstance(r0, pskv.KVStoreError), r0  # rank 0: its own error
    assert not isinstance(r0, pskv.CollectiveFailedError), r0
    assert isinstance(r1, pskv.CollectiveFailedError), r1  # the others: naming it
    assert f"{op} failed on worker 0" in str(r1), r1
    assert r1.node == "worker 0" and r1.collective == op
    assert str(r0)[:40] in str(r1)  # what failed there
    assert abs(t1 - t0) < 5


def test_ranks_in_different_collectives_both_raise_naming_both_calls(tmp_path):
    def fn(kv):
        kv.init(0, np.zeros(2, np.float32))
        if kv.rank == 0:
            kv.save_checkpoint(str(tmp_path / "ckpt"))  # rank 1 never calls it
        else:
            kv.barrier()
        return "returned"

    start = time.monotonic()
    (r0, _), (r1, _) = run(fn, state_dir=str(tmp_path))
    assert time.monotonic() - start < 10  # at once, not after the request timeout
    for r in (r0, r1):
        assert isinstance(r, pskv.CollectiveMismatchError), r
        assert "worker 0 in save_checkpoint#" in str(r) and "worker 1 in barrier#" in str(r), r
    assert "same order" in str(r0)  # what to do


def test_a_rank0_only_collective_fails_at_once_with_what_to_do():
    def fn(kv):
        kv.init(0, np.zeros(2, np.float32))
        if kv.rank == 0:
            kv.set_optimizer(SGD(learning_rate=0.1))  # a collective called by rank 0 alone
        kv.barrier()
        return "returned"

    (r0, _), (r1, _) = run(fn)
    for r in (r0, r1):
        assert isinstance(r, pskv.CollectiveMismatchError), r
        assert "worker 0 in set_optimizer#" in str(r) and "worker 1 in barrier#" in str(r), r
        assert "rank 0 may call only save_optimizer_states alone" in str(r)


def test_a_rank0_only_collective_while_the_others_push_fails_both_at_once_naming_the_worker_ahead():
    def fn(kv):
        kv.init(0, np.zeros(2, np.float32))
        if kv.rank == 0:
            kv.set_optimizer(SGD(learning_rate=0.1))  # rank 1 is busy pushing and pulling
        else:
            kv.push(0, np.ones(2, np.float32))
            kv.pull(0)  # the round needs rank 0's push, which comes after its collective: mismatched steps
        return "returned"

    start = time.monotonic()
    (r0, t0), (r1, t1) = run(fn)  # the default timeouts (300 s): both fail within seconds
    for r, t in ((r0, t0), (r1, t1)):
        assert isinstance(r, pskv.CollectiveMismatchError), r
        assert "worker 1 is ahead: it pushed key 0 for sync round 1, which worker 0 will not push before " \
               "set_optimizer#" in str(r), r
        assert t - start < 10, r


def test_a_rank0_only_collective_while_the_others_compute_names_who_did_not_come():
    def fn(kv):
        kv.init(0, np.zeros(2, np.float32))
        if kv.rank == 0:
            kv.set_optimizer(SGD(learning_rate=0.1))  # rank 1 is busy elsewhere (no round waits for rank 0)
        else:
            time.sleep(4)
        return "returned"

    (r0, t0), (r1, _) = run(fn, request_timeout=2.0)
    assert isinstance(r0, pskv.OperationTimeoutError), r0
    assert "worker 1 did not arrive within 2 s" in str(r0) and "set_optimizer#" in str(r0), r0
    assert "still in other calls (push, pull" in str(r0)


def test_save_optimizer_states_by_rank0_alone_works_and_the_others_go_on(tmp_path):
    path = tmp_path / "states"

    def fn(kv):
        kv.init(0, np.zeros(2, np.float32))
        kv.set_optimizer(SGD(learning_rate=1.0))
        for step in range(3):
            kv.push(0, np.ones(2, np.float32))
            kv.pull(0)
            if kv.rank == 0 and step == 1:
                kv.save_optimizer_states(str(path))  # how MXNet / PyTorch users save
                assert sorted(p.name for p in tmp_path.iterdir()) == ["states.server0", "states.server1"]
        kv.barrier()  # later collectives still pair rightly
        kv.save_optimizer_states(str(tmp_path / "every"))  # every rank calls it: fine too
        assert (tmp_path / "every.server1").exists()  # on every rank, once it returned
        kv.load_optimizer_states(str(path))
        return kv.pull(0)[0]

    (r0, _), (r1, _) = run(fn, servers=2, state_dir=str(tmp_path))
    assert r0 == r1 == -6.0


def test_init_with_another_shape_or_dtype_raises_on_every_rank_naming_key_ranks_and_both():
    def fn(kv):
        kv.init(1, np.zeros(3, np.float32))  # alike: fine
        try:
            kv.init(7, np.zeros(3 if kv.rank == 0 else 4, np.float32))
        except pskv.InitMismatchError as exc:
            shape = exc
        try:
            kv.init(8, np.zeros(3, np.float32 if kv.rank == 0 else np.float64))
        except pskv.InitMismatchError as exc:
            return shape, exc
        return "returned"

    for (shape, dtype), _ in run(fn):
        assert isinstance(shape, ValueError)
        assert "key 7" in str(shape) and "worker 0: shape (3,) dtype float32" in str(shape), shape
        assert "worker 1: shape (4,) dtype float32" in str(shape), shape
        assert "worker 0: shape (3,) dtype float32" in str(dtype) and "worker 1: shape (3,) dtype float64" in str(dtype)


WORKER = """
import sys, time
import numpy as np
import pskv
from pskv.optimizer import SGD
kv = pskv.create("dist_sync")
kv.init(0, np.zeros(4, np.float32))
kv.set_optimizer(SGD(learning_rate=0.1))
kv.push(0, np.ones(4, np.float32))
kv.pull(0)
if kv.rank == 0:
    kv.save_optimizer_states(sys.argv[1] + "/alone")
kv.barrier()
print("alone", kv.rank, sorted(p for p in __import__("os").listdir(sys.argv[1]) if p.startswith("alone")), flush=True)
start = time.monotonic()
try:
    kv.load_optimizer_states(sys.argv[1] + "/never_written")
except pskv.KVStoreError as exc:
    print(f"raised {kv.rank} {type(exc).__name__} after {time.monotonic() - start:.1f}s: {exc}", flush=True)
try:
    kv.init(9, np.zeros(3 if kv.rank == 0 else 4, np.float32))
except pskv.InitMismatchError as exc:
    print(f"init {kv.rank} {exc}", flush=True)
try:
    kv.set_optimizer(SGD(learning_rate=0.2)) if kv.rank == 0 else kv.barrier()
except pskv.CollectiveMismatchError as exc:
    print(f"mismatch {kv.rank} {exc}", flush=True)
kv.close()
"""


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_launched_rank0_alone_save_a_failed_load_an_init_and_a_collective_mismatch(tmp_path):
    code, out = launch_job(tmp_path, WORKER, [str(tmp_path)], ["--env", "PSKV_REQUEST_TIMEOUT=60"])
    assert code == 0, out
    for rank in (0, 1):
        assert f"alone {rank} ['alone.server0', 'alone.server1']" in out, out
    raised = [line for line in out.splitlines() if "raised" in line]
    assert len(raised) == 2, out
    kinds = {line.split("raised ")[1].split()[1] for line in raised}
    assert kinds == {"OptimizerStateError", "CollectiveFailedError"}, raised  # rank 0 reads the files
    assert all(float(line.split("after ")[1].split("s:")[0]) < 5 for line in raised), raised
    assert "load_optimizer_states failed on worker 0" in out
    for rank in (0, 1):
        assert f"init {rank} init of key 9 differs between workers: worker 0: shape (3,) dtype float32; " \
               "worker 1: shape (4,) dtype float32" in out, out
        line = next(line for line in out.splitlines() if f"mismatch {rank} " in line)
        assert "worker 0 in set_optimizer#" in line and "worker 1 in barrier#" in line, line
    assert Path(tmp_path / "alone.server0").exists()


def test_byteps_first_pushpull_of_another_shape_fails_on_both_ranks_at_once():
    def fn(kv):
        kv.pushpull("g", np.ones(2, np.float32))  # declared alike: fine
        return kv.pushpull("h", np.ones(3 if kv.rank == 0 else 4, np.float32))

    with InProcessCluster(1, 2, deadline=DEADLINE) as cluster:
        def body(cfg):
            kv = pskv.create("byteps", cluster=cfg)
            try:
                fn(kv)
            except pskv.KVStoreError as exc:
                return exc, time.monotonic()
            finally:
                kv.set_barrier_before_exit(False)
                kv.close()
            return None, time.monotonic()
        (r0, t0), (r1, t1) = cluster.run_workers(body)
    for r in (r0, r1):
        assert isinstance(r, pskv.InitMismatchError), r
        assert "key 'h'" in str(r) and "worker 0: shape (3,)" in str(r) and "worker 1: shape (4,)" in str(r), r
    assert abs(t1 - t0) < 5


def test_a_sync_push_the_server_refuses_for_its_size_fails_the_others_pull_of_that_round_at_once():
    def fn(kv):
        # the inits pair different keys (allowed): rank 1's idea of key 5 never meets rank 0's
        if kv.rank == 0:
            kv.init([5, 6], [np.zeros(3, np.float32)] * 2)
            kv.init(7, np.zeros(3, np.float32))
        else:
            kv.init([6, 7], [np.zeros(3, np.float32)] * 2)
            kv.init(5, np.zeros(4, np.float32))
        start = time.monotonic()
        try:
            kv.pushpull(5, np.ones(3 if kv.rank == 0 else 4, np.float32))
        except pskv.RemoteError as exc:
            return exc, time.monotonic() - start
        return None, 0.0

    (r0, s0), (r1, s1) = [r for r, _ in run(fn, request_timeout=20.0)]
    for r in (r0, r1):
        assert isinstance(r, pskv.RemoteError) and r.remote_type == "ShapeMismatchError", r
        assert "a part of 4 elements does not match the stored part of 3 elements" in str(r), r
    assert "worker 1's pushpull of key 5" in str(r0), r0  # the other rank learns who and what
    assert s0 < 5 and s1 < 5


def test_a_worker_whose_own_init_or_broadcast_fails_tells_the_others_at_once():
    def fn(kv):
        kv.init(3, np.zeros(2, np.float32))
        errors = []
        try:
            kv.init(3 if kv.rank == 1 else 4, np.zeros(2, np.float32))  # rank 1: a duplicate, refused locally
        except pskv.KVStoreError as exc:
            errors.append(exc)
        try:
            kv.broadcast(3, np.zeros(5 if kv.rank == 1 else 2, np.float32))  # rank 1: another shape
        except pskv.KVStoreError as exc:
            errors.append(exc)
        return errors

    start = time.monotonic()
    (r0, _), (r1, _) = run(fn)
    assert time.monotonic() - start < 10
    assert [type(e) for e in r1] == [pskv.DuplicateKeyError, pskv.ShapeMismatchError], r1
    assert [type(e) for e in r0] == [pskv.CollectiveFailedError] * 2, r0
    assert "init failed on worker 1: DuplicateKeyError" in str(r0[0])
    assert "broadcast failed on worker 1: ShapeMismatchError" in str(r0[1]) and "(5,)" in str(r0[1])


def test_a_worker_late_for_a_mismatched_meeting_gets_the_same_error():
    def fn(kv):
        kv.init(0, np.zeros(2, np.float32))
        if kv.rank == 0:
            kv.set_optimizer(SGD(learning_rate=0.1))
        else:
            if kv.rank == 2:
                time.sleep(0.5)  # arrives after the others found the mismatch
            kv.barrier()
        return "returned"

    results = [r for r, _ in run(fn, workers=3)]
    for r in results:
        assert isinstance(r, pskv.CollectiveMismatchError), results
        assert "worker 0 in set_optimizer#" in str(r) and "worker 1 in barrier#" in str(r), r
    assert "worker 2 not there yet" in str(results[2])


def test_save_optimizer_states_on_another_rank_but_not_rank0_fails_at_once_naming_both(tmp_path):
    def fn(kv):
        kv.init(0, np.zeros(2, np.float32))
        kv.set_optimizer(SGD(learning_rate=0.1))
        if kv.rank == 1:
            kv.save_optimizer_states(str(tmp_path / "states"))  # waits for rank 0's outcome, which never comes
        kv.barrier()
        return "returned"

    start = time.monotonic()
    (r0, _), (r1, _) = run(fn, state_dir=str(tmp_path))
    assert time.monotonic() - start < 10
    for r in (r0, r1):
        assert isinstance(r, pskv.CollectiveMismatchError), r
        assert "worker 0 in barrier#" in str(r) and "worker 1 in save_optimizer_states" in str(r), r


def test_byteps_pushpull_of_another_size_on_one_rank_fails_on_both_ranks_at_once():
    done = threading.Event()

    def fn(kv):
        kv.pushpull("g", np.ones(3, np.float32))  # declared alike
        start = time.monotonic()
        try:
            kv.pushpull("g", np.ones(4 if kv.rank == 1 else 3, np.float32))
        except pskv.KVStoreError as exc:
            return exc, time.monotonic() - start
        finally:
            if kv.rank == 0:
                done.set()
            else:
                done.wait(15)  # rank 1 stays in the job: rank 0 must not learn it from its leaving
        return None, time.monotonic() - start

    with InProcessCluster(1, 2, deadline=DEADLINE) as cluster:
        def body(cfg):
            kv = pskv.create("byteps", cluster=dataclasses.replace(cfg, request_timeout=20.0))
            try:
                return fn(kv)
            finally:
                kv.set_barrier_before_exit(False)
                kv.close()
        (r0, s0), (r1, s1) = cluster.run_workers(body)
    assert isinstance(r1, pskv.ShapeMismatchError), r1  # its own store refused it
    assert isinstance(r0, pskv.RemoteError) and r0.remote_type == "ShapeMismatchError", r0
    assert "worker 1's push of key 'g' (server key" in str(r0), r0  # named as the user wrote it
    assert "a part of 4 elements does not match the stored part of 3 elements" in str(r0), r0
    assert s0 < 5 and s1 < 5
