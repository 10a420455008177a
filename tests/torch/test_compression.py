"""``pskv.torch.Compression``'s own compressors (pskv/torch/compression.py) in one process: their
parameters checked at once, the keys they make, float32 only, and the stores that refuse them by
name. Training with them on 2 ranks: tests/torch/test_optimizer.py, test_ddp.py, test_cross_barrier.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import pskv  # noqa: E402
import pskv.torch as hvd  # noqa: E402
from pskv.kvstore.types import StoreType  # noqa: E402
from pskv.torch.compression import StoreCompressor, on_store  # noqa: E402


def test_each_name_makes_pskvs_compressor_with_its_parameters_checked() -> None:
    made = [hvd.Compression.twobit(threshold=0.25), hvd.Compression.onebit(), hvd.Compression.topk(k=0.1),
            hvd.Compression.randomk(k=3, seed=1), hvd.Compression.dithering(s=4),
            hvd.Compression.named("1bit", threshold=0.5)]
    assert [c.params["type"] for c in made] == ["2bit", "onebit", "topk", "randomk", "dithering", "1bit"]
    assert made[0].params == {"type": "2bit", "threshold": 0.25} and made[0].suffix == "~2bit(threshold=0.25)"
    assert made[0] == hvd.Compression.twobit(threshold=0.25) != made[5]
    with pytest.raises(pskv.InvalidArgumentError, match="unknown gradient compression type '9bit'"):
        hvd.Compression.named("9bit")
    with pytest.raises(pskv.InvalidArgumentError, match="threshold must be a finite number > 0"):
        hvd.Compression.twobit(threshold=-1)


def test_the_tensor_travels_as_it_is_and_float32_only() -> None:
    twobit = hvd.Compression.twobit()
    t = torch.ones(3)
    sent, ctx = twobit.compress(t)
    assert sent is t and twobit.decompress(sent, ctx) is t
    with pytest.raises(pskv.InvalidArgumentError, match="takes float32 tensors only.*torch.float16"):
        twobit.compress(torch.ones(3, dtype=torch.float16))


def _job(name: str) -> SimpleNamespace:
    kind = StoreType.parse(name)
    return SimpleNamespace(kind=kind, servers=kind.distributed)


@pytest.mark.parametrize("store, why", [("horovod", "no servers"), ("byteps", "declared by their first use")])
def test_stores_that_cannot_compress_a_key_refuse_naming_the_compression_and_the_store(store: str, why: str) -> None:
    with pytest.raises(pskv.NotSupportedError, match=rf"allreduce\(compression=Compression.named\('2bit', "
                                                     rf"threshold=0.5\)\): the {store} store .*{why}"):
        on_store(hvd.Compression.twobit(), _job(store), ["k"], "allreduce")


def test_a_store_with_servers_gets_keys_of_their_own_with_the_compression() -> None:
    twobit = hvd.Compression.twobit()
    keys, own = on_store(twobit, _job("dist_sync"), ["a", "b"], "allreduce")
    assert keys == ["a~2bit(threshold=0.5)", "b~2bit(threshold=0.5)"] and own == dict.fromkeys(keys, twobit.params)
    assert on_store(hvd.Compression.fp16, _job("horovod"), ["a"], "allreduce") == (["a"], {})
    assert isinstance(twobit, StoreCompressor)
