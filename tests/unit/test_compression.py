"""Gradient compression (issue 12): MXNet's quantizers value for value, and the stores' ``set_gradient_compression``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pskv
from pskv.compression import COMPRESSORS, Residuals, create
from pskv.errors import InvalidArgumentError, InvalidTypeError

DATA = Path(__file__).resolve().parents[1] / "data"

@pytest.fixture(autouse=True, scope="module")
def compiled_loops():
    """Numba's loops compiled before the tests that turn them on (else the NumPy path runs while they compile)."""
    from pskv.compression import kernels
    if kernels.AVAILABLE:
        kernels.warm()

ROOT = Path(__file__).resolve().parents[2]



# -- the quantizers against scalar transcriptions of MXNet's kernels ------------------------------
def mxnet_2bit(grad, residual, threshold):
    """MXNet's quantize_2bit / dequantize_2bit, one element at a time in float32 (as its nightly test)."""
    t = np.float32(threshold)
    residual = residual.copy()
    decoded = np.zeros_like(grad)
    for i in range(grad.size):
        residual[i] = np.float32(residual[i] + grad[i])
        if residual[i] >= t:
            decoded[i] = t
            residual[i] = np.float32(residual[i] - t)
        elif residual[i] <= -t:
            decoded[i] = -t
            residual[i] = np.float32(residual[i] - (-t))
    return decoded, residual


def mxnet_1bit(grad, residual, threshold):
    """MXNet 2.0's quantize_1bit / dequantize_1bit, one element at a time in float32."""
    residual = residual.copy()
    decoded = np.zeros_like(grad)
    for i in range(grad.size):
        residual[i] = np.float32(residual[i] + grad[i])
        if residual[i] > np.float32(threshold):
            decoded[i] = 1.0
            residual[i] = np.float32(residual[i] - 1)
        else:
            decoded[i] = -1.0
            residual[i] = np.float32(residual[i] + 1)
    return decoded, residual


@pytest.fixture(params=["numpy", "numba"])
def path(request, monkeypatch):
    """Both implementations of the quantizers: NumPy passes, and Numba's fused loops (where installed)."""
    from pskv.compression import kernels
    if request.param == "numba" and not kernels.AVAILABLE:
        pytest.skip("numba is not installed (pip install 'pskv[fast]')")
    monkeypatch.setattr(kernels, "ENABLED", request.param == "numba")
    return request.param


@pytest.mark.parametrize("kind, reference, ratio", [("2bit", mxnet_2bit, 16), ("1bit", mxnet_1bit, 32)])
@pytest.mark.parametrize("threshold", [0.5, 0.125])
@pytest.mark.parametrize("size", [1, 7, 33, 1000])
def test_quantizers_give_mxnets_values_and_residuals_push_after_push(kind, reference, ratio, threshold, size, path):
    comp = create({"type": kind, "threshold": threshold})
    rng = np.random.default_rng(size)
    mine, theirs = np.zeros(size, np.float32), np.zeros(size, np.float32)
    for _ in range(5):
        grad = rng.uniform(-1.5 * threshold, 1.5 * threshold, size).astype(np.float32)
        payload = comp.compress(grad, mine)
        assert payload.dtype == np.uint8 and payload.size == comp.payload_bytes(size) == -(-4 * size // ratio)
        expected, theirs = reference(grad, theirs, threshold)
        assert np.array_equal(comp.decompress(payload, size), expected)
        assert np.array_equal(mine, theirs)


def test_two_bit_packs_four_values_a_byte_first_in_the_high_bits():
    comp = create({"type": "2bit", "threshold": 1.0})
    payload = comp.compress(np.array([2, -2, 0, 2, -3], np.float32), None)
    assert payload.tolist() == [0b11_10_00_11, 0b10_00_00_00]


def test_one_bit_packs_eight_values_a_byte_first_in_the_high_bit():
    comp = create({"type": "1bit", "threshold": 0.0})
    payload = comp.compress(np.array([1, -1, -1, -1, -1, -1, -1, 1, 1], np.float32), None)
    assert payload.tolist() == [0b1000_0001, 0b1000_0000]


@pytest.mark.parametrize("params", [{"type": kind, **({"threshold": 0.25} if "threshold" in COMPRESSORS[kind].defaults
                                                     else {"k": 0.25} if "k" in COMPRESSORS[kind].defaults else {})}
                                    for kind in sorted(COMPRESSORS)], ids=sorted(COMPRESSORS))
def test_error_feedback_keeps_what_was_left_out_so_sums_converge(params):
    """decoded + new residual == old residual + gradient; the sum of decoded values trails the
    sum of gradients by exactly the residual, which stays bounded."""
    comp = create(params)
    rng = np.random.default_rng(0)
    residual = np.zeros(500, np.float32)
    sent = np.zeros(500, np.float64)
    total = np.zeros(500, np.float64)
    for _ in range(200):
        grad = rng.normal(0.01, 0.1, 500).astype(np.float32)
        before = residual.copy()
        decoded = comp.decompress(comp.compress(grad, residual), grad.size)
        np.testing.assert_allclose(decoded + residual, before + grad, atol=1e-6)
        sent += decoded
        total += grad
    np.testing.assert_allclose(sent + residual, total, atol=1e-3)
    assert np.abs(residual).max() < 2.0  # bounded: the sum of what was sent follows the sum of gradients


def test_payloads_of_the_wrong_length_are_refused():
    comp = create({"type": "2bit"})
    with pytest.raises(InvalidArgumentError, match=r"payload of 3 bytes for 13 elements \(expected 4\)"):
        comp.decompress(b"\x00\x00\x00", 13)


@pytest.mark.parametrize("params, error, match", [
    ({"type": "3bit"}, InvalidArgumentError, "unknown gradient compression type '3bit'"),
    ({"threshold": 0.5}, InvalidArgumentError, "unknown gradient compression type None"),
    ({"type": "2bit", "threshold": 0}, InvalidArgumentError, "threshold must be a finite number > 0"),
    ({"type": "2bit", "threshold": -1}, InvalidArgumentError, "threshold"),
    ({"type": "2bit", "threshold": float("nan")}, InvalidArgumentError, "threshold"),
    ({"type": "2bit", "threshold": "x"}, InvalidArgumentError, "threshold must be a number"),
    ({"type": "2bit", "treshold": 0.5}, InvalidArgumentError, r"unknown parameter\(s\) \['treshold'\]"),
    ("2bit", InvalidTypeError, "must be a dict"),
])
def test_bad_parameters_are_refused_with_their_name(params, error, match):
    with pytest.raises(error, match=match):
        create(params)


def test_params_are_complete_and_make_an_equal_compressor():
    comp = create({"type": "2bit"})
    assert comp.params == {"type": "2bit", "threshold": 0.5}
    assert create(json.loads(json.dumps(comp.params))) == comp
    assert create({"type": "2bit", "threshold": "0.25"}).params["threshold"] == 0.25  # MXNet passes strings


def test_residuals_are_per_key_and_sender():
    res = Residuals()
    res.get("w", 0, 3)[:] = 1
    assert res.get("w", 1, 3).tolist() == [0, 0, 0] and res.get("w", 0, 3).tolist() == [1, 1, 1]
    assert len(res) == 2


# -- the stores ---------------------------------------------------------------------------------------
def test_the_device_store_gives_mxnet_1_9_1s_values_bit_for_bit(path):
    """Recorded from MXNet 1.9.1 by bench/mxnet_compression_reference.py: three devices push into one key."""
    ref = json.loads((DATA / "mxnet_2bit_device.json").read_text())
    assert ref["mxnet"] == "1.9.1"
    for run in ref["runs"]:
        kv = pskv.create("device")
        kv.set_gradient_compression({"type": "2bit", "threshold": run["threshold"]})
        size = len(run["pulls"][0])
        kv.init(3, np.zeros(size, np.float32))
        out = np.zeros(size, np.float32)
        for grads, pulled in zip(run["grads"], run["pulls"]):
            kv.push(3, [np.array(g, np.float32) for g in grads])
            kv.pull(3, out=out)
            assert np.array_equal(out, np.array(pulled, np.float32))


@pytest.mark.parametrize("store", ["device", "local"])
@pytest.mark.parametrize("devices", [1, 3])
def test_mxnets_compressed_store_test_passes(store, devices, path):
    """MXNet's tests/nightly/test_kvstore.py::test_compress_kvstore, with pskv's stores and
    MXNet's 'test' optimizer (weight += rescale_grad * grad) as an updater."""
    threshold, rate = 0.5, 2.0
    keys, shapes = [3, 5, 7], [(4, 4), (100, 100), (2000, 2000)]
    kv = pskv.create(store)
    kv.set_gradient_compression({"type": "2bit", "threshold": threshold})

    def test_optimizer(key, grad, weight):
        weight += rate * grad
    kv.set_updater(test_optimizer)
    kv.init(keys, [np.zeros(s, np.float32) for s in shapes])
    kv.init(9, np.ones(shapes[0], np.float32))  # init is never compressed
    out = np.zeros(shapes[0], np.float32)
    kv.pull(9, out=out)
    assert (out == 1).all()

    def push_pull(j, value):
        kv.push(keys[j], [np.full(shapes[j], value, np.float32) for _ in range(devices)])
        outs = [np.full(shapes[j], -7, np.float32) for _ in range(devices)]
        kv.pull(keys[j], out=outs)
        return outs

    for j in range(len(keys)):  # pushes of zeros change nothing
        assert all((o == 0).all() for o in push_pull(j, 0.0))
    for j in range(len(keys)):  # verify_residual
        assert all((o == 0).all() for o in push_pull(j, 0.4))  # residual 0.4 < threshold: nothing sent
        value = threshold * rate * devices
        assert all((o == value).all() for o in push_pull(j, threshold - 0.3))  # 0.6: threshold sent, 0.1 kept
        assert all((o == value).all() for o in push_pull(j, 0.2))  # 0.3
        value += threshold * rate * devices
        assert all(np.allclose(o, value) for o in push_pull(j, threshold - 0.3))  # 0.5: sent, residual ~0
    for _ in range(3):  # check_neg
        value += rate * devices * -threshold
        for j in range(len(keys)):
            assert all(np.allclose(o, value) for o in push_pull(j, -threshold))

    rng = np.random.default_rng(1)  # check_compr_random, on fresh keys
    for k, s in zip([13, 15, 17], shapes):
        kv.init(k, np.zeros(s, np.float32))
        grads = [rng.uniform(-0.6, 0.6, s).astype(np.float32) for _ in range(devices)]
        kv.push(k, grads)
        got = np.zeros(s, np.float32)
        kv.pull(k, out=got)
        t = np.float32(threshold)  # fresh keys: zero residuals, so each element is thresholded on its own
        expected = sum(np.where(g >= t, t, np.where(g <= -t, -t, np.float32(0))).reshape(-1) * rate for g in grads)
        np.testing.assert_allclose(got.reshape(-1), expected, rtol=0, atol=1e-6)


def test_pushpull_and_torch_tensors_are_compressed_too():
    torch = pytest.importorskip("torch")
    kv = pskv.create("local")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.init("w", torch.zeros(4))
    out = torch.zeros(4)
    kv.pushpull("w", [torch.tensor([0.3, 0.6, -0.7, 0.1]), torch.tensor([0.3, 0.6, -0.7, 0.1])], out=out)
    assert out.tolist() == [0.0, 1.0, -1.0, 0.0]
    kv.pushpull("w", [torch.tensor([0.3, 0.0, 0.0, 0.0])] * 2, out=out)
    assert out.tolist() == [1.0, 0.0, 0.0, 0.0]  # 0.3 + 0.3 left over from the first push: sent now


def test_summed_keys_are_not_compressed():
    kv = pskv.create("local")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.init("count", np.zeros(2, np.float32), summed=True)
    kv.push("count", np.array([0.25, 3.0], np.float32))
    assert kv.pull("count").tolist() == [0.25, 3.0]


def test_compression_after_init_and_of_other_dtypes_is_refused():
    kv = pskv.create("device")
    kv.set_gradient_compression({"type": "2bit"})
    kv.init("w64", np.zeros(3, np.float64))
    with pytest.raises(InvalidArgumentError, match="before the first init"):
        kv.set_gradient_compression({"type": "1bit"})
    with pytest.raises(InvalidArgumentError, match="push of key 'w64'.*float32 values only.*float64"):
        kv.push("w64", np.ones(3))
    assert kv.pull("w64").tolist() == [0, 0, 0]  # nothing changed


def test_is_capable_says_which_stores_compress():
    assert pskv.create("local").is_capable("gradient_compression")
    assert pskv.create("device").is_capable(pskv.KVStoreBase.GRADIENT_COMPRESSION)
    from pskv.kvstore.byteps import BytePSStore
    from pskv.kvstore.dist import DistStore
    assert DistStore.is_capable("gradient_compression")  # tests/integration/test_compression_dist.py
    assert not BytePSStore.is_capable("gradient_compression")  # the byteps store answers False to everything


def test_a_trainer_compresses_its_gradients_through_the_store():
    torch = pytest.importorskip("torch")
    from pskv.parallel import Trainer
    model = torch.nn.Linear(3, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    kv = pskv.create("local")
    trainer = Trainer(model, "sgd", {"learning_rate": 1.0}, kvstore=kv, update_on_kvstore=False,
                      compression_params={"type": "2bit", "threshold": 0.5})
    model(torch.tensor([[0.3, 0.6, -2.0]])).sum().backward()  # gradient = the input
    trainer.step(1)
    assert model.weight.detach().tolist() == [[0.0, -0.5, 0.5]]  # 0.3 stays in the residual; steps of 0.5
    again = Trainer(torch.nn.Linear(2, 1), "sgd", {"learning_rate": 1.0}, kvstore=kv, prefix="b.",
                    compression_params={"type": "2bit", "threshold": 0.5})  # the same parameters: fine
    with pytest.raises(InvalidArgumentError, match="before the first init"):
        Trainer(torch.nn.Linear(2, 1), "sgd", {"learning_rate": 1.0}, kvstore=kv, prefix="c.",
                compression_params={"type": "1bit"})
    for t in (again, trainer):
        t.close()


@pytest.mark.parametrize("kind, reference", [("2bit", mxnet_2bit), ("1bit", mxnet_1bit)])
def test_big_arrays_are_quantized_in_blocks_with_the_same_values(kind, reference, monkeypatch):
    from pskv.compression import kernels, quantize
    monkeypatch.setattr(kernels, "ENABLED", False)  # the blocks are the NumPy path's
    monkeypatch.setattr(quantize, "BLOCK", 16)  # 1003 elements: 62 whole blocks and a partial one
    comp = create({"type": kind, "threshold": 0.3})
    rng = np.random.default_rng(3)
    mine, theirs = np.zeros(1003, np.float32), np.zeros(1003, np.float32)
    for _ in range(3):
        grad = rng.uniform(-0.6, 0.6, 1003).astype(np.float32)
        payload = comp.compress(grad, mine)
        expected, theirs = reference(grad, theirs, 0.3)
        assert np.array_equal(comp.decompress(payload, 1003), expected) and np.array_equal(mine, theirs)


@pytest.mark.parametrize("kind", ["2bit", "1bit"])
def test_numbas_loops_and_numpys_passes_agree_on_big_arrays_with_extreme_values(kind, monkeypatch):
    from pskv.compression import kernels
    if not kernels.AVAILABLE:
        pytest.skip("numba is not installed (pip install 'pskv[fast]')")
    comp = create({"type": kind, "threshold": 0.3})
    rng = np.random.default_rng(5)
    fused, passes = np.zeros(300_001, np.float32), np.zeros(300_001, np.float32)
    for scale in (1e-3, 1.0, 1e9):  # a residual far above the threshold rounds as float32 in both
        grad = (rng.standard_normal(300_001) * scale).astype(np.float32)
        monkeypatch.setattr(kernels, "ENABLED", True)
        one = comp.compress(grad, fused)
        monkeypatch.setattr(kernels, "ENABLED", False)
        assert np.array_equal(one, comp.compress(grad, passes)) and np.array_equal(fused, passes)


def test_keys_below_min_size_travel_uncompressed_and_may_have_other_dtypes():
    kv = pskv.create("device")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5, "min_size": 10})
    kv.init(["small", "small64", "big"], [np.zeros(9, np.float32), np.zeros(3, np.float64), np.zeros(10, np.float32)])
    kv.push(["small", "small64", "big"], [np.full(9, 0.3, np.float32), np.full(3, 0.3), np.full(10, 0.3, np.float32)])
    assert kv.pull("small")[0] == np.float32(0.3) and kv.pull("small64")[0] == 0.3  # as pushed
    assert kv.pull("big")[0] == 0.0  # 0.3 < threshold: kept in the residual
    with pytest.raises(InvalidArgumentError, match="min_size must be an int >= 0"):
        pskv.create("local").set_gradient_compression({"type": "2bit", "min_size": -1})


@pytest.mark.parametrize("kind", ["2bit", "1bit"])
@pytest.mark.parametrize("size", [1, 7, 33, 1001])
def test_on_torch_tensors_the_quantizers_give_the_numpy_paths_bits(kind, size):
    """pskv.compression.ontorch (what a CUDA value uses) against the NumPy path, on CPU tensors."""
    torch = pytest.importorskip("torch")
    from pskv.compression import ontorch
    comp = create({"type": kind, "threshold": 0.3})
    rng = np.random.default_rng(size)
    mine, theirs = torch.zeros(size), np.zeros(size, np.float32)
    for _ in range(4):
        grad = rng.uniform(-0.7, 0.7, size).astype(np.float32)
        payload = ontorch.compress(comp, torch.from_numpy(grad), mine)
        expected = comp.compress(grad, theirs)
        assert np.array_equal(payload.numpy(), expected) and np.array_equal(mine.numpy(), theirs)
        assert np.array_equal(ontorch.decompress(comp, payload, size).numpy(), comp.decompress(expected, size))
    with pytest.raises(InvalidArgumentError, match="payload of 1 bytes"):
        ontorch.decompress(comp, torch.zeros(1, dtype=torch.uint8), 1000)


@pytest.mark.cuda
def test_a_device_store_compresses_cuda_values_on_their_device():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    kv = pskv.create("device")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.init("w", torch.zeros(5, device="cuda"))
    grads = [torch.tensor([0.3, 0.6, -0.7, 1.2, 0.0], device="cuda")] * 2
    out = torch.zeros(5, device="cuda")
    kv.pushpull("w", grads, out=out)
    assert out.cpu().tolist() == [0.0, 1.0, -1.0, 1.0, 0.0]
    kv.pushpull("w", grads, out=out)
    assert out.cpu().tolist() == [1.0, 1.0, -1.0, 1.0, 0.0]  # 0.3 + 0.3 left over; 1.2: 0.7 left, + 1.2


def test_a_process_compresses_with_numpy_while_the_loops_compile_on_a_thread_of_their_own():
    """The first compressed value never waits for Numba (a server's network thread would stop its heartbeats):
    here the compiling thread is held back until the value is done, and the loops are used once they are ready."""
    from pskv.compression import kernels
    if not kernels.AVAILABLE:
        pytest.skip("numba is not installed (pip install 'pskv[fast]')")
    code = ("import threading, numpy as np\n"
            "from pskv.compression import create, kernels\n"
            "gate, real = threading.Event(), kernels.warm\n"
            "kernels.warm = lambda: (gate.wait(60), real())\n"
            "comp = create({'type': '2bit', 'threshold': 0.5})\n"
            "payload = comp.compress(np.ones(1000, np.float32), np.zeros(1000, np.float32))\n"
            "print(payload.size, kernels.usable(), [t.name for t in kernels._warming])\n"
            "gate.set()\n"
            "kernels._warming[0].join(60)\n"
            "print(kernels.usable())\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.stdout.split("\n")[:2] == ["250 False ['pskv-compile']", "True"], res.stdout + res.stderr


def test_the_loops_are_compiled_ahead_for_the_types_pskv_calls_them_with():
    """A received payload is read-only (another type to Numba): decoding one compiles nothing more."""
    from pskv.compression import kernels
    if not kernels.AVAILABLE:
        pytest.skip("numba is not installed (pip install 'pskv[fast]')")
    kernels.warm()
    comp = create({"type": "dithering"})
    payload = comp.compress(np.ones(64, np.float32), np.zeros(64, np.float32))
    signatures = {name: len(loop.signatures) for name, loop in kernels._compiled.items()}
    comp.decompress(np.frombuffer(bytes(payload), np.uint8), 64)
    comp.compress(np.ones(64, np.float32), np.zeros(64, np.float32))
    assert {name: len(loop.signatures) for name, loop in kernels._compiled.items()} == signatures
