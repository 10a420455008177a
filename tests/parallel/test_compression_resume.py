"""fit() checkpoints with gradient compression on a local store: the store's residuals are saved
(``residuals.safetensors``) and restored, so a resumed run ends bitwise as an uninterrupted one;
without them it would not, and the resumed run says why they start at zero."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pskv.parallel import DataParallelExecutorGroup, NDArrayIter, Trainer  # noqa: E402

COMPRESSION = {"type": "2bit", "threshold": 0.02}


def make_model() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(5, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))  # float32
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.4)
    return model


def setup(update_on_kvstore: bool, compression=COMPRESSION):
    group = DataParallelExecutorGroup(make_model(), ["cpu", "cpu"], loss=torch.nn.CrossEntropyLoss())
    trainer = Trainer(group, "sgd", {"learning_rate": 0.05, "momentum": 0.9}, kvstore="local",
                      update_on_kvstore=update_on_kvstore, compression_params=compression)
    return group, trainer


def data() -> NDArrayIter:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 90)
    x = (rng.normal(size=(90, 5)) + np.eye(3, 5)[y] * 2.5).astype(np.float32)
    return NDArrayIter(x, y, batch_size=16, shuffle=True, seed=11)


def straight(update_on_kvstore: bool) -> dict[str, torch.Tensor]:
    group, trainer = setup(update_on_kvstore)
    trainer.fit(data(), num_epoch=4, progress=False)
    return group.get_params()[0]


def first_half(update_on_kvstore: bool, ckpt) -> None:
    _, trainer = setup(update_on_kvstore)
    trainer.fit(data(), num_epoch=2, checkpoint_dir=ckpt, progress=False)


def resumed(update_on_kvstore: bool, ckpt, compression=COMPRESSION) -> dict[str, torch.Tensor]:
    group, trainer = setup(update_on_kvstore, compression)
    history = trainer.fit(data(), num_epoch=4, checkpoint_dir=ckpt, resume=True, progress=False)
    assert [h["epoch"] for h in history] == [2, 3]
    return group.get_params()[0]


@pytest.mark.parametrize("update_on_kvstore", [True, False])
def test_a_resumed_compressed_fit_ends_bitwise_as_an_uninterrupted_one(tmp_path, update_on_kvstore, caplog):
    expected = straight(update_on_kvstore)
    first_half(update_on_kvstore, tmp_path)
    meta = json.loads((tmp_path / "epoch-0001" / "meta.json").read_text())
    assert meta["residuals"] == "residuals.safetensors"
    caplog.set_level(logging.WARNING)
    got = resumed(update_on_kvstore, tmp_path)
    for name, value in expected.items():
        assert torch.equal(got[name], value), name
    assert "start at zero" not in caplog.text


def test_a_checkpoint_without_residuals_resumes_elsewhere_and_says_so(tmp_path, caplog):
    expected = straight(False)
    first_half(False, tmp_path)
    ckpt = tmp_path / "epoch-0001"
    (ckpt / "residuals.safetensors").unlink()  # as a checkpoint written before residuals were saved
    meta = json.loads((ckpt / "meta.json").read_text())
    del meta["residuals"]
    (ckpt / "meta.json").write_text(json.dumps(meta))
    caplog.set_level(logging.WARNING)
    got = resumed(False, tmp_path)
    assert any(not torch.equal(got[n], v) for n, v in expected.items())  # the residuals mattered
    assert (f"training checkpoint {ckpt}: compression residuals start at zero, not restored: it holds none"
            in caplog.text)


def test_other_compression_params_drop_the_residuals_with_a_warning(tmp_path, caplog):
    first_half(False, tmp_path)
    caplog.set_level(logging.WARNING)
    resumed(False, tmp_path, {"type": "2bit", "threshold": 0.05})
    assert "compression residuals start at zero, not restored: they were made by compression" in caplog.text


def test_residuals_of_accelerator_values_go_back_to_their_device_at_first_use():
    """The ``device`` store keeps a CUDA value's residual on its device: saved as a CPU copy marked
    ``on_device``, it is loaded there when that key and device are next compressed (here: a CPU tensor
    stands in for the device tensor ``exchange`` would pass)."""
    from pskv.kvstore.compressing import GradientCompression

    saved = np.linspace(-0.3, 0.3, 6, dtype=np.float32)
    gc = GradientCompression(COMPRESSION)
    gc.load_residuals([("w", 1, saved, True), ("b", 0, np.ones(2, np.float32), False)])
    state = {(k, d): (v, on) for k, d, v, on in gc.residual_state()}
    assert np.array_equal(state[("w", 1)][0], saved) and state[("w", 1)][1] is True
    assert state[("b", 0)][1] is False and gc.residuals.get("b", 0, 2).tolist() == [1.0, 1.0]
    flat = torch.zeros(6)
    assert torch.equal(gc._device_residual("w", 1, flat), torch.from_numpy(saved))
    assert torch.equal(gc._device_residual("w", 1, flat), torch.zeros(6))  # taken once; then zeros as before
