"""allgather_bytes (pskv/torch/gather.py) refuses a rank's length it cannot use, on every rank alike."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

import pskv  # noqa: E402
from pskv.torch import gather  # noqa: E402


@pytest.mark.parametrize("other", [-8, gather.MAX_BYTES + 1])
def test_a_length_out_of_range_is_refused_before_any_buffer_is_made(monkeypatch, other):
    job = SimpleNamespace(store=SimpleNamespace(num_workers=2, rank=0))
    monkeypatch.setattr(gather, "current", lambda: job)
    calls = []

    def allreduce_(tensor, name, op):  # the sum: rank 1's header row comes in
        calls.append(name)
        tensor[1, 0] = other

    monkeypatch.setattr(gather.ops, "allreduce_", allreduce_)
    with pytest.raises(pskv.InvalidArgumentError, match=rf"^allgather 'g': the ranks' lengths \[5, {other}\]"):
        gather.allgather_bytes(b"hello", "g")
    assert calls == ["g.sizes"]  # (was, for -8: on to the data sum, slicing with a negative length)
