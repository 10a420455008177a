"""BytePS's PyTorch names (``byteps/torch/ops.py``) on :mod:`pskv.torch.ops`: ``import pskv.torch as bps``.

BytePS's calls take ``average=True`` (a bool, not Horovod's deprecated form), ``version``
(ignored: pskv has one version of a key) and ``priority``: the in-place calls
(:func:`push_pull_inplace`, :func:`push_pull_async_inplace`) pass it to the store (a higher
one is sent first where the store can reorder, as BytePS's ``-layer index``);
:func:`push_pull` and :func:`push_pull_async` accept it and ignore it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pskv.torch import ops
from pskv.torch.compression import NoneCompressor

__all__ = ["push_pull", "push_pull_async", "push_pull_async_inplace", "push_pull_inplace", "byteps_push_pull", "declare"]


def _op(average: bool) -> ops.ReduceOp:
    return ops.Average if average else ops.Sum


def push_pull(tensor: torch.Tensor, average: bool = True, name: str | None = None, version: int = 0,
              priority: int = 0, compression: Any = NoneCompressor) -> torch.Tensor:
    """The average (sum if not ``average``) over the ranks, a new tensor (:func:`pskv.torch.ops.allreduce`)."""
    return ops.allreduce(tensor, name=name, compression=compression, op=_op(average))


def push_pull_async(tensor: torch.Tensor, average: bool = True, name: str | None = None, version: int = 0,
                    priority: int = 0) -> int:
    """Start :func:`push_pull` into a new tensor; a handle for ``synchronize``."""
    return ops.allreduce_async(tensor, name=name, op=_op(average))


def push_pull_async_inplace(tensor: torch.Tensor, average: bool = True, name: str | None = None, version: int = 0,
                            priority: int = 0) -> int:
    """Start :func:`push_pull` in place; a handle for ``synchronize``."""
    return ops.allreduce_async_(tensor, name=name, op=_op(average), priority=priority)


byteps_push_pull = push_pull_async_inplace  # the name byteps.torch exports it under (its optimizer's, its tests')


def push_pull_inplace(tensor: torch.Tensor, average: bool = True, name: str | None = None, version: int = 0,
                      priority: int = 0) -> torch.Tensor:
    """:func:`push_pull` in place; returns ``tensor``."""
    result: torch.Tensor = ops.synchronize(push_pull_async_inplace(tensor, average, name, version, priority))
    return result


def declare(name: str | Sequence[str], tensor: torch.Tensor | Sequence[torch.Tensor] | None = None) -> int:
    """BytePS's ``declare``: a no-op without ``tensor`` (keys are declared by their first use); with it (or a
    list of names and tensors), a store with servers declares the keys now, in one meeting
    (:func:`pskv.torch.ops.declare`). Returns 0, as BytePS."""
    ops.declare(name, tensor)
    return 0
