"""fit(): epochs, evaluation, progress lines, checkpoints (atomic, no pickle) and exact resume."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pskv  # noqa: E402
from pskv.parallel import (  # noqa: E402
    DataParallelExecutorGroup,
    NDArrayIter,
    Trainer,
    latest_checkpoint,
    load_checkpoint,
    load_params,
)


def make_model() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(5, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3)).double()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.4)
    return model


def dataset(n: int = 90) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 5)) + np.eye(3, 5)[y] * 2.5
    return x, y


def setup(update_on_kvstore: bool, opt: str = "sgd") -> tuple[DataParallelExecutorGroup, Trainer]:
    group = DataParallelExecutorGroup(make_model(), ["cpu", "cpu"], loss=torch.nn.CrossEntropyLoss())
    params = {"learning_rate": 0.05, "momentum": 0.9} if opt == "sgd" else {"learning_rate": 0.01}
    return group, Trainer(group, opt, params, kvstore="local", update_on_kvstore=update_on_kvstore)


def iters() -> tuple[NDArrayIter, NDArrayIter]:
    x, y = dataset()
    return NDArrayIter(x, y, batch_size=16, shuffle=True, seed=11), NDArrayIter(x[:40], y[:40], batch_size=40)


def test_fit_trains_evaluates_and_reports(capsys):
    group, trainer = setup(True)
    train, test = iters()
    seen = []
    history = trainer.fit(train, test, num_epoch=3, eval_metric=["acc", "f1"], progress=False,
                          batch_end_callback=seen.append)
    assert [h["epoch"] for h in history] == [0, 1, 2]
    assert history[-1]["loss"] < history[0]["loss"]
    assert history[-1]["eval"]["accuracy"] >= 0.8
    assert set(history[-1]["train"]) == {"accuracy", "f1"}
    assert len(seen) == 3 * len(train) and seen[0]["step"] == 1
    out = capsys.readouterr().out
    assert "epoch 3/3  loss" in out and "eval-accuracy" in out and "samples/s" in out


def test_fit_binds_from_the_first_batch_and_checks_its_arguments():
    group, trainer = setup(False)
    train, _ = iters()
    with pytest.raises(pskv.InvalidArgumentError, match="checkpoint_dir"):
        trainer.fit(train, resume=True)
    with pytest.raises(pskv.InvalidArgumentError, match="num_epoch"):
        trainer.fit(train, num_epoch=0)
    trainer.fit(train, num_epoch=1, progress=False)
    assert group.batch_size == 16 or group.batch_size == len(dataset()[0]) % 16
    no_loss = DataParallelExecutorGroup(make_model(), ["cpu"])
    with pytest.raises(pskv.InvalidArgumentError, match="loss"):
        Trainer(no_loss, "sgd", kvstore=None).fit(train)


@pytest.mark.parametrize("update_on_kvstore", [True, False])
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_resume_from_a_checkpoint_gives_the_uninterrupted_result(tmp_path, update_on_kvstore, opt):
    group, trainer = setup(update_on_kvstore, opt)
    train, _ = iters()
    trainer.fit(train, num_epoch=4, progress=False)
    straight = group.get_params()[0]

    ckpt = tmp_path / "ckpt"
    first, first_trainer = setup(update_on_kvstore, opt)
    train, _ = iters()
    first_trainer.fit(train, num_epoch=2, checkpoint_dir=ckpt, progress=False)
    assert latest_checkpoint(ckpt) == ckpt / "epoch-0001"
    assert sorted(p.name for p in ckpt.iterdir()) == ["epoch-0000", "epoch-0001", "latest"]  # no temporaries

    resumed, resumed_trainer = setup(update_on_kvstore, opt)  # a fresh process would start like this
    train, _ = iters()
    history = resumed_trainer.fit(train, num_epoch=4, checkpoint_dir=ckpt, resume=True, progress=False)
    assert [h["epoch"] for h in history] == [2, 3]
    got = resumed.get_params()[0]
    for name in straight:
        torch.testing.assert_close(got[name], straight[name], rtol=1e-10, atol=1e-12, msg=name)


def test_checkpoint_files_are_safetensors_and_json(tmp_path):
    group, trainer = setup(True)
    train, _ = iters()
    trainer.fit(train, num_epoch=1, checkpoint_dir=tmp_path, progress=False)
    path = latest_checkpoint(tmp_path)
    meta = json.loads((path / "meta.json").read_text())
    assert meta["epoch"] == 0 and meta["format"] == "pskv-checkpoint-1" and meta["update_on_kvstore"] is True
    arg, aux = load_params(path / "params.safetensors")
    assert set(arg) == set(group.param_names)
    header = (path / "optimizer.safetensors").read_bytes()[:8]
    assert int.from_bytes(header, "little") > 0  # a safetensors header length, not a pickle opcode
    for name, value in arg.items():
        torch.testing.assert_close(value, group.get_params()[0][name])


def test_the_checkpoint_command_verifies_training_checkpoints_too(tmp_path, capsys):
    from pskv.cli import main

    _, trainer = setup(True)
    train, _ = iters()
    trainer.fit(train, num_epoch=2, checkpoint_dir=tmp_path, progress=False)
    assert main(["checkpoint", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "epoch-0000: ok, training checkpoint, epoch 1 done" in out
    assert "epoch-0001: ok, training checkpoint, epoch 2 done" in out and "(newest" in out.splitlines()[-1]
    (tmp_path / "epoch-0000" / "params.safetensors").write_bytes(b"garbage")
    assert main(["checkpoint", str(tmp_path / "epoch-0000")]) == 1
    assert "NOT usable" in capsys.readouterr().out
    shutil.rmtree(tmp_path / "epoch-0000")
    for other in (".epoch-0002.tmp", "tensorboard"):  # fit's temporary folder, a user's: not checkpoints
        (tmp_path / other).mkdir()
    assert main(["checkpoint", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("\n") == 1
    # every file is read whole, and every file the meta names is checked (a copy damaged in each way)
    meta = json.loads((tmp_path / "epoch-0001" / "meta.json").read_text())
    damages = {
        "params.safetensors": lambda d: (d / "params.safetensors").write_bytes((d / "params.safetensors").read_bytes()[:-8]),
        "optimizer.safetensors": lambda d: (d / "optimizer.safetensors").write_bytes(b"garbage"),
        "residuals.safetensors": lambda d: ((d / "residuals.safetensors").write_bytes(b"garbage"), (d / "meta.json").write_text(
            json.dumps({**meta, "residuals": "residuals.safetensors"}))),
        "tables.safetensors": lambda d: (d / "meta.json").write_text(json.dumps(
            {**meta, "tables": {"file": "tables.safetensors", "tables": [{"key": "e", "shape": [4, 2], "dtype": "float64"}]}})),
        "manifest.json": lambda d: ((d / "servers").mkdir(), (d / "servers" / "manifest.json").write_text("{")),
    }
    for n, (name, damage) in enumerate(damages.items(), start=2):
        shutil.copytree(tmp_path / "epoch-0001", tmp_path / f"epoch-{n:04d}")
        damage(tmp_path / f"epoch-{n:04d}")
        assert main(["checkpoint", str(tmp_path / f"epoch-{n:04d}")]) == 1, name
        out = capsys.readouterr().out
        assert out.startswith(f"{tmp_path / f'epoch-{n:04d}'}: NOT usable: ") and name in out, out


def test_an_interrupted_save_leaves_the_previous_checkpoint(tmp_path):
    group, trainer = setup(False)
    train, _ = iters()
    trainer.fit(train, num_epoch=1, checkpoint_dir=tmp_path, progress=False)
    (tmp_path / ".epoch-0001.tmp").mkdir()  # a crash in the middle of saving epoch 1
    (tmp_path / ".epoch-0001.tmp" / "params.safetensors").write_bytes(b"half")
    assert latest_checkpoint(tmp_path) == tmp_path / "epoch-0000"
    (tmp_path / "latest").unlink()  # even without the pointer, only complete ones count
    (tmp_path / "epoch-0007").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "epoch-0000"
    for n in (9999, 10000):  # past four digits: compared as numbers, not names
        (tmp_path / f"epoch-{n}").mkdir()
        (tmp_path / f"epoch-{n}" / "meta.json").write_text("{}")
    assert latest_checkpoint(tmp_path) == tmp_path / "epoch-10000"


def test_loading_a_checkpoint_of_the_other_mode_or_garbage_is_refused(tmp_path):
    group, trainer = setup(True)
    train, _ = iters()
    trainer.fit(train, num_epoch=1, checkpoint_dir=tmp_path, progress=False)
    other_group, other = setup(False)
    other_group.bind_exec([("data", (16, 5))], [("label", (16,))])
    with pytest.raises(pskv.InvalidArgumentError, match="update_on_kvstore"):
        load_checkpoint(other, tmp_path / "epoch-0000")
    with pytest.raises(pskv.InvalidArgumentError, match="not a pskv checkpoint"):
        load_checkpoint(other, tmp_path)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x80\x04garbage")
    with pytest.raises(pskv.InvalidArgumentError, match="cannot read parameters"):
        load_params(bad)


@pytest.mark.parametrize("update_on_kvstore", [True, False])
def test_dist_fit_with_uneven_batch_counts_per_worker_finishes_every_epoch(update_on_kvstore):
    # worker 0 gets 3 batches per epoch, worker 1 gets 5: with uneven=True worker 0 takes
    # part in worker 1's last 2 steps with zero gradients instead of leaving it waiting.
    from pskv.testing import InProcessCluster

    x, y = dataset(128)

    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            group = DataParallelExecutorGroup(make_model(), ["cpu"], loss=torch.nn.CrossEntropyLoss())
            trainer = Trainer(group, "sgd", {"learning_rate": 0.05, "momentum": 0.9}, kvstore=kv,
                              update_on_kvstore=update_on_kvstore)
            n = 48 if kv.rank == 0 else 80
            data = NDArrayIter(x[:n] if kv.rank == 0 else x[48:], y[:n] if kv.rank == 0 else y[48:], batch_size=16)
            steps = []
            history = trainer.fit(data, num_epoch=3, progress=False, uneven=True,
                                  batch_end_callback=lambda s: steps.append((s["epoch"], s["step"])))
            trainer.close()
            return [h["epoch"] for h in history], steps, group.get_params()[0]
        finally:
            kv.close()

    with InProcessCluster(1, 2, deadline=60) as cluster:
        (epochs0, steps0, params0), (epochs1, steps1, params1) = cluster.run_workers(worker)
    assert epochs0 == epochs1 == [0, 1, 2]
    assert len(steps0) == 3 * 3 and len(steps1) == 3 * 5
    for name in params0:  # every update was applied on both workers
        torch.testing.assert_close(params0[name], params1[name], rtol=0, atol=0)


def test_dist_fit_snapshots_the_servers_every_n_steps(tmp_path):
    from pskv.checkpoints import latest_server_checkpoint as latest_checkpoint
    from pskv.checkpoints import read_manifest
    from pskv.testing import InProcessCluster

    x, y = dataset(96)

    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            group = DataParallelExecutorGroup(make_model(), ["cpu"], loss=torch.nn.CrossEntropyLoss())
            trainer = Trainer(group, "sgd", {"learning_rate": 0.05, "momentum": 0.9}, kvstore=kv)
            data = NDArrayIter(x, y, batch_size=16, num_parts=2, part_index=kv.rank)  # 3 steps per epoch
            trainer.fit(data, num_epoch=2, progress=False, server_checkpoint_steps=2)
            with pytest.raises(pskv.InvalidArgumentError, match="uneven"):
                trainer.fit(data, num_epoch=1, progress=False, server_checkpoint_steps=2, uneven=True)
            trainer.close()
            return True
        finally:
            kv.close()

    with InProcessCluster(1, 2, deadline=60, checkpoint_dir=str(tmp_path)) as cluster:
        assert cluster.run_workers(worker) == [True, True]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-1", "ckpt-2", "ckpt-3"]  # steps 2, 4, 6
    assert read_manifest(latest_checkpoint(tmp_path))["meta"] == {"epoch": 1, "step": 3}
