"""CUDA tensors in the 'local' (reduce on CPU) and 'device' (reduce on GPU) stores.

Skipped cleanly on machines without a CUDA device (CI has none).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SHAPE = (64, 32)


def devices() -> list[str]:
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [f"cuda:{i % max(n, 1)}" for i in range(4)]


@pytest.mark.parametrize("name", ["local", "device"])
def test_push_pull_cuda_values(make_store, name):
    kv = make_store(name)
    kv.init("w", torch.zeros(SHAPE, device="cuda:0"))
    vals = [torch.full(SHAPE, float(i + 1), device=d) for i, d in enumerate(devices())]
    kv.push("w", vals)
    outs = [torch.zeros(SHAPE, device=d) for d in devices()] + [torch.zeros(SHAPE)]
    kv.pull("w", out=outs)
    for o in outs:
        assert float(o[0, 0]) == 10.0
    got = kv.pull("w")
    assert got.device.type == "cuda" and float(got.sum()) == 10.0 * got.numel()


def test_device_store_reduces_on_the_values_device(make_store):
    kv = make_store("device")
    kv.init(0, torch.zeros(SHAPE))  # initialised from the CPU
    kv.push(0, [torch.ones(SHAPE, device="cuda:0")] * 2)
    assert kv._entries[0].value.device.type == "cuda"  # moved to where the reduction happens
    out = torch.zeros(SHAPE)
    kv.pull(0, out=out)
    assert float(out[0, 0]) == 2.0


def test_local_store_keeps_values_on_cpu(make_store):
    kv = make_store("local")
    kv.init(0, torch.zeros(SHAPE, device="cuda:0"))
    assert kv._entries[0].value.device.type == "cpu"


def test_cuda_bfloat16_and_optimizer(make_store):
    from pskv.optimizer import SGD

    kv = make_store("device")
    kv.set_optimizer(SGD(learning_rate=0.5))
    kv.init(0, torch.ones(SHAPE, dtype=torch.bfloat16, device="cuda:0"))
    kv.push(0, torch.ones(SHAPE, dtype=torch.bfloat16, device="cuda:0"))
    assert float(kv.pull(0)[0, 0]) == 0.5


def test_row_sparse_pull_cuda(make_store):
    kv = make_store("device")
    value = torch.arange(12.0, device="cuda:0").reshape(4, 3)
    kv.init(0, value)
    out = torch.zeros(4, 3, device="cuda:0")
    kv.row_sparse_pull(0, out=out, row_ids=torch.tensor([2, 0, 2], device="cuda:0"))
    assert out[1].abs().sum() == 0 and torch.equal(out[2], value[2])
