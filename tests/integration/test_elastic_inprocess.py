"""An elastic job's workers in one process (issue 24, step 4): commits, a departure at an exact step, restore.

Three workers train one key split over two servers (SGD on the servers), committing after every step.
Slot 2 leaves at a given step, before or after its push, or goes silent (found dead by its heartbeats);
the other two restore to the last commit and go on. The final values must equal a replay of the
survivors' record (the members of the view each committed step ran in) bit for bit: the gradients are
small integers and the learning rate a power of two, so sums and updates are exact in any order, and a
push counted twice, lost, or counted half moves some element by a multiple of the learning rate.
Without the servers' rollback, slot 2's voided push would stay in; without the epoch on the workers'
messages, nothing would work at all.

A fourth slot that registers during a step is admitted at the next commit, learns the step from rank 0
(a broadcast every member makes after a commit that admitted workers) and pushes from the next step on.
"""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest

import pskv
from pskv.errors import InitMismatchError, MembershipChangedError, NotSupportedError
from pskv.optimizer import SGD
from pskv.testing import InProcessCluster
from pskv.testing.loopback import loopback_store

LR = 2.0 ** -6
N = 8
STEPS = 6
SETTINGS = {"min_workers": 1, "max_workers": 4, "heartbeat_interval": 0.05, "heartbeat_timeout": 1.0,
            "bigarray_bound": 4}  # "w" has a part on each server


def gradient(slot: int, step: int) -> np.ndarray:
    return np.array([((slot * 7 + step + i) % 13) - 6 for i in range(N)], np.float32)


def replay(record: list[tuple[int, tuple[int, ...]]]) -> np.ndarray:
    """The value after the recorded steps: each step's gradients summed over the members it ran with."""
    w = np.zeros(N, np.float32)
    for step, members in record:
        w -= np.float32(LR) * sum((gradient(s, step - 1) for s in members), np.zeros(N, np.float32))
    return w


def train(kv, steps: int, leave: tuple[int, int, str] | None = None, before_step=None, before_sync=None):
    """Push and pull ``w`` once per step and commit after each; on MembershipChangedError restore and redo.

    After a commit that made a new view and after every restore, every worker learns the step from rank 0
    (a broadcast), as docs/elastic.md's example does: a worker that joined the running job learns it there,
    also when a departure voids its first broadcast. ``leave``: (slot, step, "before" | "after" its push, or
    "killed"): that worker closes its store there (or goes silent); (slot, -1, "sync"): it closes its
    store instead of its first broadcast. ``before_step(kv, step)``: called before each step,
    ``before_sync(kv)`` before each broadcast of the step. Returns the
    final value, the record ``[(step, members of its view)]`` of the committed steps, the rank and the
    size; or None for the worker that left.
    """
    slot = kv.view.members[kv.rank]
    kv.init("w", np.zeros(N, np.float32))
    kv.init("step", np.zeros(1, np.float32))
    kv.set_optimizer(SGD(learning_rate=LR))  # a joiner keeps the servers' (and their state)
    out, at = np.zeros(N, np.float32), np.zeros(1, np.float32)
    sync = kv.view.cause != "start"  # a joiner first learns the step
    if not sync:
        kv.commit()  # the optimizer is part of the state a departure rolls back to
    done, record = 0, []
    while True:
        try:
            if sync:
                if before_sync is not None:
                    before_sync(kv)
                if leave is not None and (slot, "sync") == (leave[0], leave[2]):
                    kv.close()
                    return None
                kv.broadcast("step", np.full(1, done, np.float32), out=at)
                done, sync = int(at[0]), False
            if done == steps:
                break
            if before_step is not None:
                before_step(kv, done)
            if leave is not None and (slot, done) == leave[:2]:
                if leave[2] == "after":
                    kv.push("w", gradient(slot, done))
                if leave[2] == "killed":  # silent from now on: the scheduler finds it dead by its heartbeats
                    kv._worker.client.close()
                    with contextlib.suppress(Exception):
                        kv.close()  # releases this process's side only: nobody hears from it any more
                kv.close()
                return None
            members = kv.view.members
            kv.push("w", gradient(slot, done))
            kv.pull("w", out=out)
            sync = kv.commit() is not None  # workers admitted (or drained): the step again
            done += 1
            record.append((done, members))
        except MembershipChangedError:
            kv.restore()
            sync = True  # a joiner's first broadcast may be the one voided
    kv.pull("w", out=out)
    kv.barrier()  # everyone read the final value before anyone leaves (a departure makes a view)
    return out, record, kv.rank, kv.num_workers


def run(workers: int, fn, **settings):
    with InProcessCluster(2, workers, deadline=30.0, **{**SETTINGS, **settings}) as cluster:
        return cluster.run_stores(fn)


@pytest.mark.parametrize("when", ["before", "after", "killed"])
def test_a_worker_that_leaves_at_a_step_voids_the_work_since_the_commit_and_the_others_go_on(when):
    results = run(3, lambda kv: train(kv, STEPS, leave=(2, 3, when)))
    assert results[2] is None
    (w0, record0, rank0, size0), (w1, record1, rank1, size1) = results[:2]
    assert record0 == record1
    assert [members for _, members in record0] == [(0, 1, 2)] * 3 + [(0, 1)] * (STEPS - 3)
    assert (rank0, rank1, size0, size1) == (0, 1, 2, 2)
    np.testing.assert_array_equal(w0, w1)
    np.testing.assert_array_equal(w0, replay(record0))  # slot 2's push of step 4 ("after") counted nowhere


@pytest.mark.parametrize("leaver", [None, 2])
def test_a_worker_joins_at_a_commit_and_takes_part_from_the_next_step(leaver):
    # leaver 2: a member departs instead of its broadcast of the step after the commit that admitted slot 3;
    # the joiner's broadcast is voided too, and it learns the step again after its restore
    joined: list = []
    synced = threading.Event()  # the joiner is past its inits (a departure during them fails its KEYS request)

    def wait(kv) -> None:  # the leaver leaves once the joiner is at its broadcast of the step
        assert synced.wait(10.0) or kv.view.members[kv.rank] != leaver, "slot 3 did not reach its broadcast"

    with InProcessCluster(2, 3, deadline=30.0, **SETTINGS) as cluster:
        def late() -> None:  # slot 3: its create() returns once a commit admitted it
            kv = pskv.create("dist_sync", cluster=cluster.worker_config(3))
            try:
                with pytest.raises(InitMismatchError, match="joined a running job, whose servers hold a float32"):
                    kv.init("w", np.zeros(N + 1, np.float32))  # checked against the servers' KEYS table
                joined.append(train(kv, STEPS, before_sync=lambda kv: synced.set()))
            finally:
                kv.close()
        joiner = threading.Thread(target=late, daemon=True)

        def let_in(kv, step: int) -> None:  # rank 0, before step 3: slot 3 waits for the next commit
            if kv.rank == 0 and step == 2 and joiner.ident is None:
                joiner.start()
                roster = cluster.scheduler._views.roster
                deadline = time.monotonic() + 10.0
                while 3 not in roster.pending:
                    assert time.monotonic() < deadline, "slot 3 did not register"
                    time.sleep(0.01)
        leave = None if leaver is None else (leaver, -1, "sync")
        results = cluster.run_stores(lambda kv: train(kv, STEPS, leave=leave, before_step=let_in, before_sync=wait))
        joiner.join(30.0)
    (w3, record3, rank3, size3), = joined
    if leaver is not None:
        assert results.pop(leaver) is None
    record = results[0][1]
    after = (0, 1, 2, 3) if leaver is None else (0, 1, 3)
    assert [members for _, members in record] == [(0, 1, 2)] * 3 + [after] * (STEPS - 3)
    assert record3 == record[3:] and all(r[1] == record for r in results)
    size = len(after)
    assert [r[2:] for r in results] + [(rank3, size3)] == [(rank, size) for rank in range(size)]
    for w, *_ in results:
        np.testing.assert_array_equal(w, w3)
    np.testing.assert_array_equal(w3, replay(record))


def test_a_job_that_is_not_elastic_refuses_commit_and_restore_and_has_no_view():
    kv = loopback_store("dist_sync")
    try:
        assert kv.view is None
        with pytest.raises(NotSupportedError, match="not elastic"):
            kv.commit()
        with pytest.raises(NotSupportedError, match="not elastic"):
            kv.restore()
    finally:
        kv.close()


def test_a_departure_puts_the_workers_compression_residuals_back_to_the_last_commit():
    # 2-bit compression keeps what each push left out (its residual) and sends it with the next one: a
    # voided step's push must leave no trace there either, or the redone step would send it twice
    from pskv.compression import create as compressor

    twobit = {"type": "2bit", "threshold": 2.0}

    def fn(kv):
        kv.set_gradient_compression(twobit)
        return train(kv, STEPS, leave=(2, 3, "after"))

    results = run(3, fn)
    (w0, record, *_), (w1, *_) = results[:2]
    assert [members for _, members in record] == [(0, 1, 2)] * 3 + [(0, 1)] * (STEPS - 3)
    quantize, residuals = compressor(twobit), {s: np.zeros(N, np.float32) for s in (0, 1, 2)}
    w = np.zeros(N, np.float32)
    for step, members in record:  # what each member's compressed push of the step decodes to, summed
        total = np.zeros(N, np.float32)
        for s in members:
            total += quantize.decompress(quantize.compress(gradient(s, step - 1), residuals[s]), N)
        w -= np.float32(LR) * total
    np.testing.assert_array_equal(w0, w1)
    np.testing.assert_array_equal(w0, w)
