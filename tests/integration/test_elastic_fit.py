"""fit(..., elastic=True) in one process (issue 24, step 7): workers leave and join a running fit.

Three workers run ``fit(elastic=True)`` over an :class:`InProcessCluster` of an elastic job (two servers,
every key split over both). The exact tests use a model whose gradient does not depend on the weights (a
linear map, loss ``-sum(y * (w . x))``, integer data): the final weights depend only on which samples were
counted in which step and over how many workers, so they must equal a replay of ``fit``'s rules
(:func:`pskv.parallel.elastic_data.partition` over each view, commits every ``commit_steps`` steps and at each
epoch's end, a departure voiding the steps since the last commit). A step counted twice or lost moves a
weight by ``lr x |x| / (batch x W)``, far beyond the tolerance, which is for the float rounding of
``rescale_grad = 1 / (batch x W)`` alone. A departure is checked with the optimizer on the servers and on
the workers (pskv SGD with and without momentum, a torch optimizer), a fixed and a linear learning rate,
server checkpoints at commits and 2-bit compression; a join with the optimizer on the servers and on the
workers (whose state the joiner takes from rank 0). A small classifier that loses a
worker reaches the accuracy of one that keeps three. The last test runs a fit through ``pskv launch -n
2:4``, SIGKILLs a worker and adds one (seconds: four processes import torch; marked slow).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pskv  # noqa: E402
from pskv.checkpoints import latest_server_checkpoint, read_manifest  # noqa: E402
from pskv.compression import create as create_compressor  # noqa: E402
from pskv.parallel import DataParallelExecutorGroup, NDArrayIter, Trainer  # noqa: E402
from pskv.parallel.elastic_data import partition  # noqa: E402
from pskv.testing import InProcessCluster  # noqa: E402
from pskv.testing.loopback import loopback_store  # noqa: E402

SETTINGS = {"min_workers": 1, "max_workers": 4, "heartbeat_interval": 0.05, "heartbeat_timeout": 1.0,
            "bigarray_bound": 4}
LR = 2.0 ** -5
N, D, BATCH, COMMIT, SEED, EPOCHS = 96, 6, 4, 2, 11, 2
MOMENTUM = 0.5
TWO_BIT = {"type": "2bit", "threshold": 2.0}


class Left(Exception):
    """The leaving worker's way out of fit()."""


def linear_data(dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    y = rng.choice([-1.0, 1.0], N)
    x = rng.integers(-3, 4, (N, D)).astype(np.float64)
    x[:, 0] += 4 * y  # the first feature separates the classes
    return x.astype(dtype), y.astype(dtype)


def linear_group(dtype: Any = None) -> DataParallelExecutorGroup:
    model = torch.nn.Linear(D, 1, bias=False).to(dtype or torch.float64)
    with torch.no_grad():
        model.weight.zero_()
    return DataParallelExecutorGroup(model, ["cpu"], loss=lambda out, y: -(out.squeeze(-1) * y).sum())


def replay(x: np.ndarray, y: np.ndarray, workers, linear: bool = False, momentum: float = 0.0,
           compression: dict | None = None) -> tuple[np.ndarray, float]:
    """The weights fit's rules give when period ``j`` of epoch ``e`` runs on ``workers(e, j)`` workers, and
    rank 0's mean loss in the last epoch (its forward reads the weights: they must be the last commit's).
    ``linear``: elastic_lr="linear" from three workers; ``momentum``: SGD's (a state rolled back too);
    ``compression``: every rank's float32 push compressed with the residual it kept (ranks are slots here)."""
    w, velocity = np.zeros(D), np.zeros(D)
    quantize = create_compressor(compression) if compression is not None else None
    residuals = {r: np.zeros(D, np.float32) for r in range(3)}
    for epoch in range(EPOCHS):
        processed, loss, samples, period = 0, 0.0, 0, 0
        while True:
            size = workers(epoch, period)
            shares = [partition(N, SEED, epoch, processed, r, size) for r in range(size)]
            whole = len(shares[0]) // BATCH * BATCH
            todo = min(whole, COMMIT * BATCH)
            for s in range(0, todo, BATCH):
                loss -= sum(y[i] * (x[i] @ w) for i in shares[0][s:s + BATCH])
                samples += BATCH
                pushes = [-sum(y[i] * x[i] for i in share[s:s + BATCH]) for share in shares]
                if quantize is not None:
                    pushes = [quantize.decompress(quantize.compress(np.asarray(g, np.float32), residuals[r]), D)
                              for r, g in enumerate(pushes)]
                grad = np.sum(pushes, axis=0, dtype=np.float64)
                velocity = momentum * velocity + grad / (BATCH * size)
                w = w - (LR * size / 3 if linear else LR) * velocity
            processed += todo * size
            period += 1
            if todo == whole:
                break
    return w, loss / samples


def elastic_fit(kv, update_on_kvstore: bool = True, leave: tuple[int, int, int] | None = None, on_step=None,
                elastic_lr: str = "fixed", server_checkpoint_steps: int = 0, optimizer: str = "sgd"):
    """fit(elastic=True) on this worker; ``leave=(slot, epoch, step)``: that worker closes its store after that
    step. Returns the final weights, the last epoch's record and the rank and size (None for the leaver)."""
    x, y = linear_data(np.float32 if optimizer == "2bit" else np.float64)
    slot = kv.view.members[kv.rank]
    group = linear_group(torch.float32 if optimizer == "2bit" else None)
    if optimizer == "2bit":  # float32 pushes, compressed (the store keeps the residuals as at each commit)
        trainer = Trainer(group, "sgd", {"learning_rate": LR}, kvstore=kv, compression_params=TWO_BIT)
    elif optimizer == "torch":  # stepped here: its state_dict is the snapshot
        trainer = Trainer(group, torch.optim.SGD(group.replicas[0].parameters(), lr=LR, momentum=MOMENTUM), kvstore=kv,
                          update_on_kvstore=False)
    else:
        params = {"learning_rate": LR, "momentum": MOMENTUM if optimizer == "momentum" else 0.0}
        trainer = Trainer(group, "sgd", params, kvstore=kv, update_on_kvstore=update_on_kvstore)

    def batch_end(stats) -> None:
        if on_step is not None:
            on_step(kv, stats)
        if leave is not None and (slot, stats["epoch"], stats["step"]) == leave:
            kv.close()
            raise Left

    data = NDArrayIter(x, y, batch_size=BATCH, shuffle=True, seed=SEED)
    try:
        history = trainer.fit(data, num_epoch=EPOCHS, elastic=True, commit_steps=COMMIT, eval_metric="mse",
                              progress=False, elastic_lr=elastic_lr, server_checkpoint_steps=server_checkpoint_steps,
                              batch_end_callback=batch_end)
    except Left:
        return None
    kv.barrier()  # every worker is done before any leaves (a departure makes a view)
    weights = group.get_params()[0]["weight"].numpy().reshape(-1).copy()
    return weights, history[-1], kv.rank, kv.num_workers


@pytest.mark.parametrize(("update_on_kvstore", "elastic_lr", "optimizer"), [
    (True, "fixed", "sgd"), (False, "fixed", "sgd"), (True, "linear", "sgd"),
    (True, "fixed", "momentum"), (False, "fixed", "momentum"), (False, "fixed", "torch"), (True, "fixed", "2bit")])
def test_a_worker_that_leaves_mid_epoch_voids_the_steps_since_the_commit_and_two_finish(update_on_kvstore, elastic_lr,
                                                                                         optimizer, tmp_path):
    leave_step = 5  # of the last epoch, committed after steps 2 and 4: step 5 is voided, redone by two workers
    snapshots = 4 if update_on_kvstore and optimizer == "sgd" else 0  # at the commits that pass 4, 8, ... steps
    with InProcessCluster(2, 3, deadline=30.0, checkpoint_dir=str(tmp_path), **SETTINGS) as cluster:
        results = cluster.run_stores(lambda kv: elastic_fit(kv, update_on_kvstore, (2, EPOCHS - 1, leave_step), None,
                                                            elastic_lr, snapshots, optimizer))
    assert results[2] is None
    (w0, last0, rank0, size0), (w1, last1, rank1, size1) = results[:2]
    assert (rank0, rank1, size0, size1) == (0, 1, 2, 2) and last0["workers"] == 2
    np.testing.assert_array_equal(w0, w1)
    x, y = linear_data()
    on_three = (EPOCHS - 1, (leave_step - 1) // COMMIT)  # the first period on two workers
    momentum = MOMENTUM if optimizer in ("momentum", "torch") else 0.0
    compression = TWO_BIT if optimizer == "2bit" else None
    expected, loss = replay(x, y, lambda e, j: 3 if (e, j) < on_three else 2, elastic_lr == "linear", momentum,
                            compression)
    exact = 1e-9 if compression is None else 1e-5  # float32 with 2-bit compression
    np.testing.assert_allclose(w0, expected, rtol=0, atol=exact)
    assert last0["loss"] == pytest.approx(loss, rel=exact)
    if snapshots:  # 8 steps in epoch 0, 4 more on three workers, 6 on two: the last one at 16, after the departure
        assert read_manifest(latest_server_checkpoint(tmp_path))["meta"] == {"epoch": 1, "step": 16}
    if compression is None:  # 2-bit's coarse steps: a sample either side of the line, not a point of accuracy
        fixed, _ = replay(x, y, lambda e, j: 3, momentum=momentum)  # three workers throughout
        assert abs(accuracy(w0, x, y) - accuracy(fixed, x, y)) <= 0.01 and accuracy(fixed, x, y) >= 0.9


def accuracy(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.sign(x @ w) == y))


@pytest.mark.parametrize(("update_on_kvstore", "optimizer"), [(True, "sgd"), (False, "momentum"), (False, "torch")])
def test_a_worker_started_into_a_running_fit_is_admitted_at_a_commit_and_takes_part(update_on_kvstore, optimizer):
    # with the optimizer here, the joiner takes rank 0's momentum too: else its updates would differ
    joined: list = []
    with InProcessCluster(2, 3, deadline=30.0, **SETTINGS) as cluster:
        def late() -> None:  # slot 3: its create() returns once a commit admitted it
            kv = pskv.create("dist_sync", cluster=cluster.worker_config(3))
            try:
                joined.append(elastic_fit(kv, update_on_kvstore, optimizer=optimizer))
            finally:
                kv.close()
        joiner = threading.Thread(target=late, daemon=True)

        def let_in(kv, stats) -> None:  # rank 0, after step 3 of epoch 0: slot 3 waits for the commit after step 4
            if kv.rank == 0 and (stats["epoch"], stats["step"]) == (0, 3) and joiner.ident is None:
                joiner.start()
                roster = cluster.scheduler._views.roster
                deadline = time.monotonic() + 10.0
                while 3 not in roster.pending:
                    assert time.monotonic() < deadline, "slot 3 did not register"
                    time.sleep(0.01)
        results = cluster.run_stores(lambda kv: elastic_fit(kv, update_on_kvstore, on_step=let_in, optimizer=optimizer))
        joiner.join(30.0)
    (w3, _, rank3, size3), = joined
    assert [r[2:] for r in results] + [(rank3, size3)] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    for w, *_ in results:
        np.testing.assert_array_equal(w, w3)
    x, y = linear_data()
    expected, loss = replay(x, y, lambda e, j: 3 if (e, j) < (0, 2) else 4,
                            momentum=MOMENTUM if optimizer != "sgd" else 0.0)
    np.testing.assert_allclose(w3, expected, rtol=0, atol=1e-9)
    assert results[0][1]["loss"] == pytest.approx(loss, rel=1e-9)


def test_elastic_fit_is_refused_outside_an_elastic_job_and_with_uneven_or_unaligned_checkpoints():
    kv = loopback_store("dist_sync")
    try:
        trainer = Trainer(linear_group(), "sgd", {"learning_rate": LR}, kvstore=kv)
        data = NDArrayIter(*linear_data(), batch_size=BATCH)
        with pytest.raises(pskv.NotSupportedError, match="pskv launch -n MIN:MAX"):
            trainer.fit(data, elastic=True, progress=False)
        with pytest.raises(pskv.InvalidArgumentError, match="uneven"):
            trainer.fit(data, elastic=True, uneven=True, progress=False)
        with pytest.raises(pskv.InvalidArgumentError, match="multiple of commit_steps"):
            trainer.fit(data, elastic=True, commit_steps=10, server_checkpoint_steps=15, progress=False)
        trainer.close()
    finally:
        kv.close()


def classify(kv, leave: tuple[int, int, int] | None = None):
    """A small classifier's fit(elastic=True) (momentum on the servers); its last epoch's record."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 1392)  # 192 to train on, 1200 to evaluate: a point of accuracy is 12 samples
    x = rng.normal(size=(1392, 5)) + np.eye(3, 5)[y] * 4.0
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(5, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3)).double()
    group = DataParallelExecutorGroup(model, ["cpu"], loss=torch.nn.CrossEntropyLoss())
    trainer = Trainer(group, "sgd", {"learning_rate": 0.1, "momentum": 0.9}, kvstore=kv)
    slot = kv.view.members[kv.rank]

    def batch_end(stats) -> None:
        if (slot, stats["epoch"], stats["step"]) == leave:
            kv.close()
            raise Left

    try:
        history = trainer.fit(NDArrayIter(x[:192], y[:192], batch_size=8, shuffle=True, seed=SEED),
                              NDArrayIter(x[192:], y[192:], batch_size=240), num_epoch=4, elastic=True,
                              commit_steps=COMMIT, progress=False, batch_end_callback=batch_end)
    except Left:
        return None
    kv.barrier()
    return history[-1]


def test_a_classifier_that_loses_a_worker_is_as_accurate_as_one_on_a_fixed_number_of_workers():
    with InProcessCluster(2, 3, deadline=30.0, **SETTINGS) as cluster:
        fixed = cluster.run_stores(classify)
    with InProcessCluster(2, 3, deadline=30.0, **SETTINGS) as cluster:
        shrunk = cluster.run_stores(lambda kv: classify(kv, leave=(1, 1, 3)))
    assert shrunk[1] is None and shrunk[0]["workers"] == 2 and fixed[0]["workers"] == 3
    assert shrunk[0]["eval"] == shrunk[2]["eval"]  # the same parameters on both
    assert abs(shrunk[0]["eval"]["accuracy"] - fixed[0]["eval"]["accuracy"]) <= 0.01
    assert fixed[0]["eval"]["accuracy"] >= 0.97


FIT_SCRIPT = '''
import os, signal, sys, time
import numpy as np, torch
import pskv
from pskv.parallel import DataParallelExecutorGroup, NDArrayIter, Trainer

D, LR, GO = int(sys.argv[2]), float(sys.argv[3]), sys.argv[6]
KILL, GROW = (tuple(int(v) for v in a.split(":")) for a in sys.argv[4:6])
batch, seed, epochs, commit = (int(v) for v in sys.argv[7:11])
saved = np.load(sys.argv[1])
kv = pskv.create("dist_sync")
slot = kv.view.members[kv.rank]
model = torch.nn.Linear(D, 1, bias=False).double()
torch.nn.init.zeros_(model.weight)
group = DataParallelExecutorGroup(model, ["cpu"], loss=lambda out, y: -(out.squeeze(-1) * y).sum())
trainer = Trainer(group, "sgd", {"learning_rate": LR}, kvstore=kv)


def batch_end(stats):
    if (slot, stats["epoch"], stats["step"]) == KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    if (kv.rank, stats["epoch"], stats["step"]) == (0, *GROW) and not os.path.exists(GO):
        print("waiting for a new worker", flush=True)  # the test lets one register: admitted at the next commit
        deadline = time.monotonic() + 60
        while not os.path.exists(GO) and time.monotonic() < deadline:
            time.sleep(0.02)


data = NDArrayIter(saved["x"], saved["y"], batch_size=batch, shuffle=True, seed=seed)
trainer.fit(data, num_epoch=epochs, elastic=True, commit_steps=commit, eval_metric="mse", progress=False,
            batch_end_callback=batch_end)
kv.barrier()
weights = group.get_params()[0]["weight"].numpy().reshape(-1)
print("final", slot, kv.rank, kv.num_workers, ",".join(repr(float(v)) for v in weights), flush=True)
trainer.close()
kv.close()
'''


@pytest.mark.multiprocess  # slow too (tests/conftest.py SLOW_TESTS)
def test_through_pskv_launch_a_worker_killed_mid_fit_leaves_and_an_added_one_joins_with_the_replayed_weights(tmp_path):
    from pskv.testing.jobs import ProcessGroup, child_env, start_launch

    script, data, hosts, go = tmp_path / "fit.py", tmp_path / "data.npz", tmp_path / "hosts", tmp_path / "go"
    kill, grow = (1, 0, 5), (1, 2)  # slot 1 killed after step 5 of epoch 0; slot 3 admitted after step 2 of epoch 1
    script.write_text(FIT_SCRIPT)
    hosts.write_text("127.0.0.1:3\n")
    x, y = linear_data()
    np.savez(data, x=x, y=y)
    args = [str(data), str(D), repr(LR), ":".join(map(str, kill)), ":".join(map(str, grow)), str(go),
            str(BATCH), str(SEED), str(EPOCHS), str(COMMIT)]
    with ProcessGroup("elastic-fit") as group:
        launcher = start_launch(group, ["-n", "2:4", "-s", "2", "--host-discovery-script", f"cat {hosts}",
                                        "--discovery-interval", "0.1", "--respawn-cooldown", "3600", "--timeout", "100",
                                        "--", sys.executable, str(script), *args], tmp_path,
                                child_env({"MXNET_KVSTORE_BIGARRAY_BOUND": "4"}))
        launcher.expect("waiting for a new worker", 100.0)
        hosts.write_text("127.0.0.1:4\n")  # room for one more: slot 3 (slot 1's place still cools)
        launcher.expect("worker slot 3 waits to join at the next commit", 100.0)
        go.write_text("")
        code = launcher.wait(110.0)
        text = launcher.output()
    assert code == 0, text
    assert "worker slot 1 on 127.0.0.1 was killed by SIGKILL: it left the job; 2 workers go on" in text, text
    finals = [line.split("final ", 1)[1].split() for line in text.splitlines() if "] final " in line]
    assert sorted((int(slot), int(rank), int(size)) for slot, rank, size, _ in finals) == [(0, 0, 3), (2, 1, 3),
                                                                                           (3, 2, 3)], text
    expected, _ = replay(x, y, lambda e, j: 3 if (e, j) < (0, (kill[2] - 1) // COMMIT) else 2 if (e, j) < (1, 1) else 3)
    weights = [np.array([float(v) for v in values.split(",")]) for *_, values in finals]
    for w in weights[1:]:
        np.testing.assert_array_equal(w, weights[0])
    np.testing.assert_allclose(weights[0], expected, rtol=0, atol=1e-9)


def test_rank_0s_local_optimizer_state_reaches_every_worker_through_one_key_per_length():
    # what a join of fit(elastic=True) runs (ElasticTrainer.share_states) three times, for states of 40, 40 and
    # 12 bytes: every worker ends with rank 0's bytes each time, and the servers hold one key per length, not
    # one per join (a long job's joins would pile up copies of the optimizer state)
    from pathlib import Path
    from types import SimpleNamespace

    from pskv.parallel.elastic import ElasticTrainer

    class StateFile:  # a local optimizer's save_states / load_states: its state as a file's bytes
        data = b""

        def save_states(self, path: str) -> None:
            Path(path).write_bytes(self.data)

        def load_states(self, path: str) -> None:
            self.data = Path(path).read_bytes()

    rounds = [b"momentum-of-rank-0:a" * 2, b"momentum-of-rank-0:b" * 2, b"short state!"]

    def join_three_times(kv) -> list[bytes]:
        updater = StateFile()
        elastic = ElasticTrainer(SimpleNamespace(update_on_kvstore=False, _updater=updater, kvstore=kv,
                                                 optimizer=None, learning_rate=LR))
        kv.init("states", np.zeros(1, np.int64))
        got = []
        for mine in rounds:
            updater.data = mine if kv.rank == 0 else b"nothing yet"
            elastic.share_states("states-", "states")
            got.append(updater.data)
        return got

    with InProcessCluster(1, 2, deadline=30.0, **SETTINGS) as cluster:
        assert cluster.run_stores(join_three_times) == [rounds, rounds]
        held = {key for key, _ in cluster.servers[0]._core.shard.parts}
    assert len(held) == 1 + 2  # the length key, then one key for 40 bytes (5 words) and one for 12 (2 words)
