"""BytePS-style compressors (issue 12, beyond MXNet): onebit, topk, randomk, dithering, fp16, bf16."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pskv
from pskv.compression import create
from pskv.errors import InvalidArgumentError

KINDS = [{"type": "onebit"}, {"type": "topk", "k": 3}, {"type": "topk", "k": 0.3}, {"type": "randomk", "k": 0.5},
         {"type": "dithering"}, {"type": "dithering", "s": 5, "norm": "l2", "ef": False}, {"type": "fp16"}, {"type": "bf16"}]

@pytest.fixture(autouse=True, scope="module")
def compiled_loops():
    """Numba's loops compiled before the tests that turn them on (else the NumPy path runs while they compile)."""
    from pskv.compression import kernels
    if kernels.AVAILABLE:
        kernels.warm()



def ident(params):
    return "-".join(str(v) for v in params.values())


def values(n, seed=0):
    return np.random.default_rng(seed).normal(0, 1, n).astype(np.float32)


def roundtrip(params, x):
    comp = create(params)
    return comp.decompress(comp.compress(x, None), x.size)


@pytest.mark.parametrize("params", KINDS, ids=ident)
@pytest.mark.parametrize("n", [1, 2, 7, 9, 33, 1000])
def test_payloads_have_the_announced_length_and_the_wrong_lengths_are_refused(params, n):
    comp = create(params)
    payload = comp.compress(values(n), np.zeros(n, np.float32))
    assert payload.dtype == np.uint8 and payload.size == comp.payload_bytes(n)
    assert comp.decompress(payload.tobytes(), n).dtype == np.float32  # bytes decode as arrays do
    for wrong in (payload[:-1], np.concatenate([payload, payload[:1]])):
        with pytest.raises(InvalidArgumentError, match=f"payload of {wrong.size} bytes for {n} elements"):
            comp.decompress(wrong, n)


# -- the compiled loops (pskv.compression.kernels) against the NumPy path ---------------------------
def edge_values(seed=3):
    """Every fp16 and its neighbours, the halfway points between fp16s and theirs, subnormals,
    overflows and NaN, then random values of every scale."""
    rng = np.random.default_rng(seed)
    half = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    half = np.sort(half[np.isfinite(half)])
    mids = ((half[1:].astype(np.float64) + half[:-1]) / 2).astype(np.float32)
    up, down = np.float32(np.inf), np.float32(-np.inf)
    parts = [half, np.nextafter(half, up), np.nextafter(half, down), mids, np.nextafter(mids, up),
             np.nextafter(mids, down), rng.normal(0, 1, 200_000).astype(np.float32) * 10.0 ** rng.integers(-9, 6, 200_000),
             np.array([1e30, -1e30, 3.4e38, -3.4e38, 1e-42, np.nan], np.float32)]
    return rng.permutation(np.concatenate(parts).astype(np.float32))


@pytest.mark.parametrize("params", [{"type": t, "ef": ef} for t in ("onebit", "topk", "fp16", "bf16", "dithering")
                                    for ef in (True, False)]
                         + [{"type": "2bit"}, {"type": "1bit"}, {"type": "dithering", "s": 5}], ids=ident)
def test_the_compiled_loops_give_the_numpy_paths_bits(monkeypatch, params):
    from pskv.compression import kernels
    if not kernels.AVAILABLE:
        pytest.skip("Numba is not installed (pskv[fast])")
    x = edge_values()
    if params["type"] in ("onebit", "2bit", "1bit", "topk", "dithering"):  # NaN and overflow spread to every value
        x = x[np.isfinite(x) & (np.abs(x) < 1e30)]
    out = {}
    for compiled in (False, True):
        monkeypatch.setattr(kernels, "ENABLED", compiled)
        comp = create(params)  # dithering: its generator from the seed again
        residual = np.zeros(x.size, np.float32)
        with np.errstate(over="ignore", invalid="ignore"):  # 3.4e38 * 3 overflows, in both paths alike
            payloads = [comp.compress(x * np.float32(scale), residual) for scale in (1, 0.5, 3)]
        out[compiled] = payloads, residual, comp.decompress(payloads[-1], x.size)
    (numpy_payloads, numpy_residual, numpy_values), (payloads, residual, values_) = out[False], out[True]
    for a, b in zip(numpy_payloads, payloads):
        np.testing.assert_array_equal(a, b)
    assert np.array_equal(numpy_residual, residual, equal_nan=True)
    assert np.array_equal(numpy_values, values_, equal_nan=True)


@pytest.mark.parametrize("compiled", [False, True])
def test_topk_of_a_big_array_selects_among_a_sampled_floor_and_stays_exact(monkeypatch, compiled):
    from pskv.compression import kernels, sparsify
    if compiled and not kernels.AVAILABLE:
        pytest.skip("Numba is not installed (pskv[fast])")
    monkeypatch.setattr(kernels, "ENABLED", compiled)
    n = 4 * sparsify._SELECT_FROM
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, n).astype(np.float32)
    x[: n // 2] *= 1e-3  # a skewed array: the sample's floor must still let the top k through
    ties = np.zeros(n, np.float32)
    ties[::3] = 1.0  # a third of the values tie: more than 8k pass the floor, the whole array is partitioned
    for data in (x, ties, np.sort(x)):
        comp = create({"type": "topk", "k": 0.01})
        k = comp.count(n)
        payload = comp.compress(data, None)
        index = payload[:4 * k].view(np.uint32)
        assert np.unique(index).size == k
        assert np.abs(data[index]).min() >= np.sort(np.abs(data))[n - k]  # the k largest magnitudes


def test_payload_sizes():
    n = 1000
    assert create({"type": "onebit"}).payload_bytes(n) == 4 + 125  # 32x fewer bytes, and the scale
    assert create({"type": "topk", "k": 10}).payload_bytes(n) == 80  # index and value per element kept
    assert create({"type": "topk", "k": 0.01}).payload_bytes(n) == 80
    assert create({"type": "dithering", "s": 2}).payload_bytes(n) == 4 + 375  # sign + 2-bit level
    assert create({"type": "dithering", "s": 4}).payload_bytes(n) == 4 + 500  # sign + 3-bit level
    assert create({"type": "fp16"}).payload_bytes(n) == create({"type": "bf16"}).payload_bytes(n) == 2000


def test_onebit_sends_the_signs_scaled_by_the_mean_magnitude():
    x = np.array([0.5, -1.5, 0.0, 2.0, -1.0, 3.0, -0.25, 0.25, -4.0], np.float32)
    comp = create({"type": "onebit"})
    payload = comp.compress(x, None)
    scale = np.float32(np.abs(x).mean())
    assert payload[:4].view("<f4")[0] == scale
    assert payload[4:].tolist() == [0b0100_1010, 0b1000_0000]  # 1: negative; the first value in the high bit
    assert comp.decompress(payload, x.size).tolist() == np.where(x < 0, -scale, scale).tolist()


@pytest.mark.parametrize("k, n, count", [(3, 10, 3), (5, 2, 2), (0.25, 10, 3), (0.24, 10, 2), (0.01, 10, 1),
                                         (0.29, 100, 29), (0.5, 1, 1)])
def test_k_is_a_count_or_a_fraction_of_n(k, n, count):
    assert create({"type": "topk", "k": k}).payload_bytes(n) == create({"type": "randomk", "k": k}).payload_bytes(n) \
        == 8 * count


def test_topk_keeps_exactly_the_k_largest_magnitudes():
    x = values(1000)
    for k in (1, 17, 1000):
        got = roundtrip({"type": "topk", "k": k}, x)
        keep = np.argsort(-np.abs(x))[:k]
        expected = np.zeros_like(x)
        expected[keep] = x[keep]
        assert np.array_equal(got, expected)
    payload = create({"type": "topk", "k": 17}).compress(x, None)
    assert (np.diff(payload[:68].view("<u4").astype(np.int64)) > 0).all()  # indices increasing


def test_randomk_sends_k_exact_values_chosen_reproducibly_by_the_seed():
    x = values(1000)
    a, b, other = (create({"type": "randomk", "k": 50, "seed": s}) for s in (7, 7, 8))
    runs = [[c.compress(x, None) for _ in range(3)] for c in (a, b, other)]
    assert all(np.array_equal(p, q) for p, q in zip(runs[0], runs[1]))  # same seed: same choices, call after call
    assert not np.array_equal(runs[0][0], runs[0][1]) and not np.array_equal(runs[0][0], runs[2][0])
    got = create({"type": "randomk", "k": 50, "seed": 99}).decompress(runs[0][0], 1000)  # the indices travel
    kept = np.flatnonzero(got)
    assert kept.size == 50 and np.array_equal(got[kept], x[kept])


@pytest.mark.parametrize("norm", ["max", "l2"])
@pytest.mark.parametrize("s", [1, 2, 7])
def test_dithering_is_within_a_level_and_unbiased(norm, s):
    x = values(64)
    scale = np.abs(x).max() if norm == "max" else np.float32(np.linalg.norm(x))
    comp = create({"type": "dithering", "s": s, "norm": norm, "ef": False, "seed": 3})
    draws = np.stack([comp.decompress(comp.compress(x, None), x.size) for _ in range(4000)])
    step = scale / s
    assert (np.abs(draws - x) <= step * (1 + 1e-6)).all()
    levels = np.abs(draws) / step
    np.testing.assert_allclose(levels, np.round(levels), atol=1e-3)  # sign * level * norm / s
    assert (np.sign(draws) * np.sign(x) >= 0).all()
    # unbiased: the mean of 4000 draws is within 5 standard errors (each draw's variance <= step^2 / 4)
    assert (np.abs(draws.mean(axis=0) - x) <= 5 * step / 2 / np.sqrt(4000)).all()


def test_dithering_is_deterministic_given_its_seed():
    x = values(100)
    a, b = create({"type": "dithering", "seed": 5}), create({"type": "dithering", "seed": 5})
    assert all(np.array_equal(a.compress(x, None), b.compress(x, None)) for _ in range(3))
    assert not np.array_equal(create({"type": "dithering", "seed": 6}).compress(x, None), a.compress(x, None))


def test_fp16_rounds_to_nearest_within_half_an_ulp_and_saturates():
    x = np.concatenate([values(1000), np.float32([1e-8, 65504, 65519, 1e6, -1e6])])
    got = roundtrip({"type": "fp16"}, x)
    assert np.array_equal(got[:-3], x[:-3].astype(np.float16).astype(np.float32))
    half_ulp = np.spacing(np.abs(got[:-4]).astype(np.float16)).astype(np.float32) / 2
    assert (np.abs(got[:-4] - x[:-4]) <= half_ulp).all()
    assert got[-3:].tolist() == [65504, 65504, -65504]  # not inf: error feedback keeps the rest
    residual = np.zeros(x.size, np.float32)
    create({"type": "fp16"}).compress(x, residual)
    assert residual[-2] == 1e6 - 65504 and np.array_equal(residual + got, x)


def bf16_bits(u32):
    comp = create({"type": "bf16"})
    return comp.compress(np.array(u32, np.uint32).view(np.float32), None).view("<u2").tolist()


def test_bf16_rounds_to_nearest_even():
    assert bf16_bits([0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0xBF818000]) == \
        [0x3F80, 0x3F82, 0x3F81, 0x3F80, 0xBF82]  # ties to even, above, below, negative
    assert bf16_bits([0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000]) == [0x7F7F, 0xFF7F, 0x7F7F]  # saturated, not inf
    assert np.isnan(roundtrip({"type": "bf16"}, np.float32([np.nan, 1.0]))[0])
    assert np.isnan(roundtrip({"type": "bf16"}, np.array([0x7F800001], np.uint32).view(np.float32))[0])
    x = values(1000)
    got = roundtrip({"type": "bf16"}, x)
    assert (np.abs(got - x) <= np.abs(x) * 2.0 ** -8).all()  # half an ulp: 7 stored significand bits
    torch = pytest.importorskip("torch")
    assert np.array_equal(got, torch.from_numpy(x).to(torch.bfloat16).float().numpy())


@pytest.mark.parametrize("params", KINDS, ids=ident)
def test_without_error_feedback_the_residual_is_left_alone(params):
    x = values(100)
    residual = np.full(100, 0.5, np.float32)
    comp = create({**params, "ef": False})
    payload = comp.compress(x, residual)
    assert (residual == 0.5).all()
    if params["type"] not in ("randomk", "dithering"):  # deterministic ones: as if there were no residual
        assert np.array_equal(payload, create({**params, "ef": False}).compress(x, None))


@pytest.mark.parametrize("params", [p for p in KINDS if p.get("ef", True)], ids=ident)
def test_error_feedback_makes_the_sums_converge(params):
    comp = create(params)
    rng = np.random.default_rng(1)
    residual = np.zeros(300, np.float32)
    sent, total = np.zeros(300), np.zeros(300)
    for _ in range(100):
        grad = rng.normal(0.01, 0.1, 300).astype(np.float32)
        before = residual + grad
        decoded = comp.decompress(comp.compress(grad, residual), 300)
        np.testing.assert_allclose(decoded + residual, before, atol=1e-6)
        sent += decoded
        total += grad
    np.testing.assert_allclose(sent + residual, total, atol=1e-3)
    assert np.abs(residual).max() < 2.0


def test_hostile_payloads_are_refused():
    topk = create({"type": "topk", "k": 2})
    with pytest.raises(InvalidArgumentError, match="indices of a payload of 5 elements must increase and stay below 5"):
        topk.decompress(np.array([1, 5], "<u4").tobytes() + np.zeros(2, "<f4").tobytes(), 5)
    with pytest.raises(InvalidArgumentError, match="must increase"):
        topk.decompress(np.array([3, 3], "<u4").tobytes() + np.zeros(2, "<f4").tobytes(), 5)
    with pytest.raises(InvalidArgumentError, match="must increase"):
        create({"type": "randomk", "k": 2}).decompress(np.array([4, 1], "<u4").tobytes() + bytes(8), 5)
    dithering = create({"type": "dithering", "s": 2})  # 3 bits a value: sign, 2 bits of level
    with pytest.raises(InvalidArgumentError, match="level above s=2"):
        dithering.decompress(np.float32(1).tobytes() + bytes([0b011_00000]), 2)
    assert dithering.decompress(np.float32(1).tobytes() + bytes([0b110_00100]), 2).tolist() == [-1.0, 0.5]


@pytest.mark.parametrize("params, match", [
    ({"type": "topk", "k": 0}, "k must be a finite number > 0"),
    ({"type": "topk", "k": -2}, "k must be"),
    ({"type": "topk", "k": 1.5}, r"k must be an integer >= 1 \(a count\) or a fraction in \(0, 1\)"),
    ({"type": "randomk", "k": "x"}, "k must be a number"),
    ({"type": "randomk", "seed": -1}, "seed must be"),
    ({"type": "randomk", "seed": 0.5}, "seed must be an integer"),
    ({"type": "dithering", "s": 0}, "s must be"),
    ({"type": "dithering", "s": 256}, "s must be"),
    ({"type": "dithering", "s": 2.5}, "s must be an integer in"),
    ({"type": "dithering", "norm": "l1"}, "norm must be 'max' or 'l2'"),
    ({"type": "dithering", "norm": "l2"}, "norm 'l2' needs ef=false"),
    ({"type": "fp16", "ef": "maybe"}, "ef must be true or false"),
    ({"type": "bf16", "ef": 1}, "ef must be true or false"),
    ({"type": "onebit", "threshold": 0.5}, r"unknown parameter\(s\) \['threshold'\]"),
])
def test_bad_parameters_are_refused_naming_them(params, match):
    with pytest.raises(InvalidArgumentError, match=match):
        create(params)


def test_params_are_complete_and_travel_as_json():
    comp = create({"type": "randomk", "k": "10", "seed": "3", "ef": "false"})  # MXNet passes strings
    assert comp.params == {"type": "randomk", "k": 10, "seed": 3, "ef": False}
    assert create({"type": "dithering"}).params == {"type": "dithering", "s": 2, "norm": "max", "seed": 0, "ef": True}
    assert create({"type": "topk"}).params == {"type": "topk", "k": 0.01, "ef": True}
    for params in KINDS:
        comp = create(params)
        assert create(json.loads(json.dumps(comp.params))) == comp


def test_a_device_store_sums_each_devices_topk_with_its_residual():
    kv = pskv.create("device")
    kv.set_gradient_compression({"type": "topk", "k": 2})
    kv.init("w", np.zeros((2, 3), np.float32))
    residuals = [np.zeros(6, np.float32), np.zeros(6, np.float32)]
    expected = np.zeros(6, np.float32)
    rng = np.random.default_rng(4)
    out = np.zeros((2, 3), np.float32)
    for _ in range(3):
        grads = [rng.normal(0, 1, (2, 3)).astype(np.float32) for _ in residuals]
        kv.push("w", grads)
        total = np.zeros(6, np.float32)
        for grad, res in zip(grads, residuals):  # the reference: each device's two largest, the rest kept
            res += grad.reshape(-1)
            top = np.argsort(-np.abs(res))[:2]
            total[top] += res[top]
            res[top] = 0
        expected = total  # no updater: the store holds the last push's sum
        kv.pull("w", out=out)
        np.testing.assert_allclose(out.reshape(-1), expected, rtol=1e-6)
        assert np.count_nonzero(out) <= 4


@pytest.mark.parametrize("params", [{"type": "topk", "k": 5}, {"type": "randomk", "k": 0.2, "seed": 4},
                                    {"type": "dithering", "s": 3, "seed": 2}, {"type": "onebit"}, {"type": "bf16"},
                                    {"type": "fp16", "ef": False}], ids=ident)
def test_dist_sync_servers_decode_each_workers_payload(params):
    """2 workers, 1 server (threads of this process), through sockets: each pull is the sum of
    what each worker's compressed push decodes to, its residual and generator its own."""
    from pskv.testing import InProcessCluster

    n, steps = 37, 3

    def grad(rank, step):
        return np.random.default_rng(100 * rank + step).normal(0, 1, n).astype(np.float32)

    comps, residuals = [create(params) for _ in range(2)], [np.zeros(n, np.float32) for _ in range(2)]
    want = [sum(comps[r].decompress(comps[r].compress(grad(r, s), residuals[r]), n) for r in range(2))
            for s in range(steps)]

    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            kv.set_gradient_compression(params)
            kv.init("w", np.zeros(n, np.float32))
            pulled = []
            for s in range(steps):
                kv.push("w", grad(kv.rank, s))
                pulled.append(kv.pull("w"))
            return pulled
        finally:
            kv.close()

    with InProcessCluster(1, 2, deadline=30.0, shm=0) as cluster:
        results = cluster.run_workers(worker)
    assert len(results) == 2
    for pulled in results:
        for got, expected in zip(pulled, want, strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
