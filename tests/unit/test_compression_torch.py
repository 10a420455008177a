"""Every compressor on torch tensors (pskv.compression.ontorch, issue 12): the NumPy classes' wire format and
residuals, on CPU tensors here and on a CUDA device where one is present."""

from __future__ import annotations

import numpy as np
import pytest

import pskv
from pskv.compression import COMPRESSORS, TopK, create, kernels, ontorch
from pskv.errors import InvalidArgumentError

torch = pytest.importorskip("torch")

CUDA = pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                          reason="needs a CUDA device")])
DEVICES = ["cpu", CUDA]
KINDS = [{"type": "2bit", "threshold": 0.5}, {"type": "1bit", "threshold": 0.1}, {"type": "onebit"},
         {"type": "topk", "k": 3}, {"type": "topk", "k": 0.3}, {"type": "randomk", "k": 0.5},
         {"type": "randomk", "k": 2, "seed": 7}, {"type": "dithering"}, {"type": "dithering", "s": 1},
         {"type": "dithering", "s": 5}, {"type": "dithering", "s": 255, "seed": 3},
         {"type": "dithering", "s": 3, "norm": "l2"},
         {"type": "fp16"}, {"type": "bf16"}]
RANDOM = ("randomk", "dithering")
# every type with error feedback on and off (2bit / 1bit: off is no residual; l2 dithering takes ef=False only)
CASES = [(params, ef) for params in KINDS for ef in (True, False) if ef is False or params.get("norm") != "l2"]
DETERMINISTIC = [case for case in CASES if case[0]["type"] not in RANDOM]
SIZES = [1, 7, 33, 1001]


def ident(case):
    params, ef = case
    return "-".join(str(v) for v in params.values()) + ("-ef" if ef else "-noef")


def make(params, ef):
    """The compressor, and whether it is given a residual (quantizers: only with feedback)."""
    feedback_type = params["type"] not in ("2bit", "1bit")
    return create({**params, "ef": ef} if feedback_type else params), ef or feedback_type


def values(n, seed):
    """Normal values spread over magnitudes from 1e-3 to 1e2, both signs (distinct with high probability)."""
    rng = np.random.default_rng(seed)
    return (rng.normal(0, 1, n) * 10.0 ** rng.integers(-3, 3, n)).astype(np.float32)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "numpy"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("case", DETERMINISTIC, ids=ident)
def test_deterministic_types_give_the_numpy_paths_payloads_and_residuals(case, n, device, fused, monkeypatch):
    monkeypatch.setattr(kernels, "ENABLED", fused)  # the NumPy path with its compiled loops (Numba) and without
    comp, with_residual = make(*case)
    mine = torch.zeros(n, device=device) if with_residual else None
    theirs = np.zeros(n, np.float32) if with_residual else None
    for push in range(4):  # the residual carries over
        grad = values(n, push)
        tensor = torch.from_numpy(grad).to(device)
        payload = ontorch.compress(comp, tensor, mine)
        expected = comp.compress(grad, theirs)
        assert payload.dtype == torch.uint8 and payload.device.type == device
        assert np.array_equal(payload.cpu().numpy(), expected)
        assert np.array_equal(tensor.cpu().numpy(), grad)  # the gradient is read only
        if with_residual:
            assert np.array_equal(mine.cpu().numpy(), theirs)
        assert np.array_equal(ontorch.decompress(comp, payload, n).cpu().numpy(), comp.decompress(expected, n))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=ident)
def test_payloads_decode_across_the_two_paths_and_residuals_keep_what_was_not_sent(case, device):
    comp, with_residual = make(*case)
    other = create(comp.params)  # its own generator for the NumPy payloads
    n = 257
    residual = torch.zeros(n, device=device) if with_residual else None
    for push in range(3):
        grad = values(n, 10 + push)
        before = residual.cpu().numpy().copy() if with_residual else None
        payload = ontorch.compress(comp, torch.from_numpy(grad).to(device), residual)
        assert payload.numel() == comp.payload_bytes(n)
        on_numpy = comp.decompress(payload.cpu().numpy(), n)  # a torch payload, the NumPy decoder
        assert np.array_equal(ontorch.decompress(comp, payload, n).cpu().numpy(), on_numpy)
        if with_residual and comp.params.get("ef", True):  # the residual: what r = residual + grad lost
            assert np.array_equal(residual.cpu().numpy(), (before + grad) - on_numpy)
        elif with_residual:
            assert not residual.any()  # ef=False: neither read nor written
        numpy_payload = other.compress(grad, None)  # a NumPy payload, the torch decoder
        decoded = ontorch.decompress(comp, torch.from_numpy(numpy_payload).to(device), n)
        assert decoded.dtype == torch.float32 and decoded.device.type == device
        assert np.array_equal(decoded.cpu().numpy(), other.decompress(numpy_payload, n))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("params", [p for p in KINDS if p["type"] in RANDOM], ids=lambda p: "-".join(map(str, p.values())))
def test_random_types_repeat_their_draws_call_after_call_for_the_same_seed(params, device):
    params = {**params, "ef": False}
    first, second, reseeded = create(params), create(params), create({**params, "seed": params.get("seed", 0) + 1})
    grad = torch.from_numpy(values(1000, 1)).to(device)
    a = [ontorch.compress(first, grad, None).cpu() for _ in range(3)]
    b = [ontorch.compress(second, grad, None).cpu() for _ in range(3)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))  # the same parameters: the same payloads
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[1], a[2])  # the generator advances
    assert not torch.equal(a[0], ontorch.compress(reseeded, grad, None).cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("s", [1, 2, 5])
def test_dithering_on_tensors_is_unbiased_and_within_a_step(s, device):
    comp = create({"type": "dithering", "s": s, "ef": False, "seed": 5})
    x = values(64, 2)
    grad = torch.from_numpy(x).to(device)
    step = np.abs(x).max() / s
    total = np.zeros(64, np.float64)
    draws = 2000
    for _ in range(draws):
        decoded = ontorch.decompress(comp, ontorch.compress(comp, grad, None), 64).cpu().numpy()
        assert (np.abs(decoded - x) <= step * (1 + 1e-6)).all()
        total += decoded
    # per value the variance is at most step^2 / 4: six standard deviations of the mean
    assert np.abs(total / draws - x).max() <= 6 * step / 2 / np.sqrt(draws)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [8, 40])  # distinct values of draws with replacement; a permutation's first k
def test_randomk_on_tensors_keeps_k_exact_values_chosen_evenly(k, device):
    comp = create({"type": "randomk", "k": k, "ef": False, "seed": 1})
    x = values(64, 3)
    grad = torch.from_numpy(x).to(device)
    chosen = np.zeros(64)
    for _ in range(800):
        decoded = ontorch.decompress(comp, ontorch.compress(comp, grad, None), 64).cpu().numpy()
        kept = decoded != 0
        assert kept.sum() == k and np.array_equal(decoded[kept], x[kept])
        chosen += kept
    assert np.abs(chosen / 800 - k / 64).max() < 0.07  # each index about k / n of the time (std <= 0.018)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["fp16", "bf16"])
def test_casts_round_to_nearest_even_and_saturate_like_numpy(kind, device):
    special = [0.0, -0.0, 1e-8, -3e-8, 6e-8, 2.98e-8, 65519.0, 65520.0, -65520.0, 1e6, 3.4e38, -3.4e38, np.inf, -np.inf,
               1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1e-40, -1e-45]
    rng = np.random.default_rng(4)
    x = np.concatenate([special, rng.normal(0, 1, 20000) * 10.0 ** rng.integers(-12, 8, 20000)]).astype(np.float32)
    comp = create({"type": kind, "ef": True})
    mine, theirs = torch.zeros(x.size, device=device), np.zeros(x.size, np.float32)
    payload = ontorch.compress(comp, torch.from_numpy(x).to(device), mine)
    assert np.array_equal(payload.cpu().numpy(), comp.compress(x, theirs))
    assert np.array_equal(mine.cpu().numpy(), theirs, equal_nan=True)  # inf - the largest finite: inf in both
    nan = np.array([np.nan, -np.nan, 1.0], np.float32)
    decoded = ontorch.decompress(comp, ontorch.compress(comp, torch.from_numpy(nan).to(device), None), 3).cpu()
    assert decoded[:2].isnan().all() and decoded[2] == 1.0  # a NaN stays a NaN
    if kind == "bf16":  # cast.py sends 0x7fc0 for every NaN
        assert ontorch.compress(comp, torch.from_numpy(nan).to(device), None).cpu()[:4].tolist() == [0xC0, 0x7F] * 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES[::2], ids=ident)
def test_payloads_of_the_wrong_length_are_refused(case, device):
    comp, _ = make(*case)
    payload = ontorch.compress(comp, torch.from_numpy(values(33, 0)).to(device), None)
    for wrong in (payload[:-1], torch.cat([payload, payload[:1]])):
        with pytest.raises(InvalidArgumentError, match=f"{comp.type}.*payload of {wrong.numel()} bytes for 33 elements"):
            ontorch.decompress(comp, wrong, 33)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["topk", "randomk"])
def test_sparse_payloads_with_bad_indices_are_refused(kind, device):
    comp = create({"type": kind, "k": 3})
    good = comp.compress(np.arange(1, 11, dtype=np.float32), None)
    index = good[:12].view("<u4")
    for bad in ([index[1], index[0], index[2]], [index[0], index[0], index[2]], [index[0], index[1], 10],
                [index[0], index[1], 2**32 - 1]):
        payload = np.concatenate([np.array(bad, "<u4").view(np.uint8), good[12:]])
        with pytest.raises(InvalidArgumentError, match=f"{kind}.*must increase and stay below 10"):
            ontorch.decompress(comp, torch.from_numpy(payload).to(device), 10)
    if kind == "topk":
        assert ontorch.decompress(comp, torch.from_numpy(good).to(device), 10).cpu().tolist() == [0.0] * 7 + [8.0, 9.0, 10.0]


@pytest.mark.parametrize("device", DEVICES)
def test_dithering_payloads_with_a_level_above_s_are_refused(device):
    comp = create({"type": "dithering", "s": 5})  # 3-bit levels: 6 and 7 cannot be sent
    payload = comp.compress(np.ones(4, np.float32), None)  # every level 5: sign 0, 101
    assert ontorch.decompress(comp, torch.from_numpy(payload).to(device), 4).cpu().tolist() == [1.0] * 4
    payload[4] |= 0b0010_0000  # the first value's level: 111
    with pytest.raises(InvalidArgumentError, match="dithering.*payload of 4 elements with a level above s=5"):
        ontorch.decompress(comp, torch.from_numpy(payload).to(device), 4)


def test_every_registered_type_runs_on_tensors_and_a_foreign_subclass_is_refused():
    assert all(ontorch.supports(cls()) for cls in COMPRESSORS.values())

    class Mine(TopK):
        pass

    assert not ontorch.supports(Mine())
    with pytest.raises(InvalidArgumentError, match="Mine has no torch implementation"):
        ontorch.compress(Mine(), torch.zeros(4), None)


@pytest.mark.parametrize("params", [{"type": "onebit"}, {"type": "topk", "k": 3}, {"type": "dithering", "s": 5},
                                    {"type": "fp16"}, {"type": "bf16"}], ids=lambda p: p["type"])
def test_a_payload_at_an_odd_offset_in_a_buffer_decodes(params):
    comp = create(params)
    x = values(40, 6)
    payload = comp.compress(x, None)
    buffer = torch.zeros(payload.size + 1, dtype=torch.uint8)
    buffer[1:] = torch.from_numpy(payload)
    assert np.array_equal(ontorch.decompress(comp, buffer[1:], 40).numpy(), comp.decompress(payload, 40))


def test_no_residual_is_made_on_a_tensor_without_error_feedback():
    comp = create({"type": "topk", "k": 2, "ef": False})
    grad, residual = torch.tensor([1.0, -5.0, 3.0, 0.5]), torch.full((4,), 7.0)
    payload = ontorch.compress(comp, grad, residual)
    assert ontorch.decompress(comp, payload, 4).tolist() == [0.0, -5.0, 3.0, 0.0]
    assert residual.tolist() == [7.0] * 4 and grad.tolist() == [1.0, -5.0, 3.0, 0.5]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("params", KINDS, ids=lambda p: "-".join(map(str, p.values())))
def test_a_device_store_compresses_every_type_on_the_cuda_device(params, monkeypatch):
    ef_params = {**params, "ef": False} if params.get("norm") == "l2" else params
    n = 1000
    grads = [values(n, 21), values(n, 22)]
    kv = pskv.create("device")
    kv.set_gradient_compression(ef_params)
    kv.init("w", torch.zeros(n, device="cuda"))
    reference = create(ef_params)
    residuals = [torch.zeros(n), torch.zeros(n)]
    monkeypatch.setattr(type(reference), "compress", lambda *args: pytest.fail("compressed on the host"))
    out = torch.zeros(n, device="cuda")
    for _push in range(2 if params["type"] not in RANDOM else 1):
        kv.pushpull("w", [torch.from_numpy(g).cuda() for g in grads], out=out)
        assert out.device.type == "cuda"
        if params["type"] in RANDOM:  # the draws are the device's: check what they can give
            got, g0, g1 = out.cpu().numpy(), grads[0], grads[1]
            if params["type"] == "randomk":
                assert all(v in (0, a, b, a + b) for v, a, b in zip(got, g0, g1))
            else:
                norm = np.linalg.norm if params.get("norm") == "l2" else (lambda g: np.abs(g).max())
                assert (np.abs(got - (g0 + g1)) <= (norm(g0) + norm(g1)) / params.get("s", 2) * 1.01).all()
            continue
        expected = sum(ontorch.decompress(reference, ontorch.compress(reference, torch.from_numpy(g), r), n)
                       for g, r in zip(grads, residuals))  # each device with its own residual, on the CPU
        assert np.array_equal(out.cpu().numpy(), expected.numpy())


def test_a_compressors_generators_and_tables_go_with_it():
    import gc

    from pskv.compression import ontorch_ops
    comps = [create({"type": "randomk", "k": 2}), create({"type": "2bit"})]
    ids = [id(c) for c in comps]
    for comp in comps:
        ontorch.compress(comp, torch.ones(8), torch.zeros(8))
    assert all(i in ontorch_ops._STATES for i in ids)
    del comp, comps
    gc.collect()
    assert not any(i in ontorch_ops._STATES for i in ids)  # a later compressor with a reused id starts afresh
