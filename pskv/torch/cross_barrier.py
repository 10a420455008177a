"""``CrossBarrier``: the next forward of layer *i* waits only for layer *i*'s update (BytePS's, ByteScheduler's).

``optimizer = pskv.torch.CrossBarrier(model, optimizer)`` (BytePS's signature) turns on
the overlap of ByteScheduler (Peng et al., SOSP'19) on the server-side optimizer
(:mod:`pskv.torch.server_update`): each parameter's update *is* its bucket's
``pushpull`` (gradients up, the servers' new weights down), so ``step()`` returns as soon
as the last bucket is sent, without waiting, and a forward pre-hook on every module that
owns parameters waits only for those parameters' updates. The updates of the last buckets
of backward -- the first layers, sent with the highest priority -- overlap the start of
the next forward instead of ending the step with a barrier.

Correctness: the servers apply the same updates to the same gradients as without it, and
a parameter is read only after its update landed, so on a sync store the parameters are
the same, bit for bit, as with ``update_on_kvstore=True`` alone. The next step's first
gradient also waits for every update still on the way (its pushes may not overtake
them). Read the parameters outside a forward (evaluation without the model's forward,
checkpoints) after ``optimizer.synchronize()``; with ``num_steps`` (BytePS's), the
``num_steps``-th ``step()`` waits as a plain one does.

What ``optimizer`` may be: a ``torch.optim`` SGD / Adam / AdamW (wrapped with
``named_parameters=model.named_parameters()``), the result of
``DistributedOptimizer(..., update_on_kvstore=True)``, or a ``DistributedOptimizer``
that all-reduces (BytePS's programs pass ``bps.DistributedOptimizer``): its hooks are
removed and its optimizer is run by the servers instead (see :mod:`pskv.torch.server_update`). Unlike BytePS, no poller
thread runs local per-parameter steps: the servers do the update.

BytePS's programs import this module as their whole API (``import byteps.torch.cross_barrier
as bps``), so it re-exports the names that BytePS's does: ``init``, ``shutdown``, ``size``,
``local_size``, ``rank``, ``local_rank``, ``Compression``, ``byteps_push_pull``, ``poll``,
``synchronize``, ``broadcast_parameters``, ``broadcast_optimizer_state``.
"""

from __future__ import annotations

from typing import Any

import torch

from pskv.errors import InvalidArgumentError
from pskv.optimizer import Optimizer as PskvOptimizer
from pskv.torch.byteps import byteps_push_pull
from pskv.torch.compression import Compression
from pskv.torch.functions import broadcast_optimizer_state, broadcast_parameters
from pskv.torch.ops import poll, synchronize
from pskv.torch.optimizer import _DistributedOptimizer
from pskv.torch.runtime import init, local_rank, local_size, rank, shutdown, size
from pskv.torch.server_update import BUCKET_BYTES, ServerSideOptimizer, ServerUpdates, server_side_optimizer

__all__ = ["CrossBarrier", "init", "shutdown", "size", "local_size", "rank", "local_rank", "Compression",
           "byteps_push_pull", "poll", "synchronize", "broadcast_parameters", "broadcast_optimizer_state"]

_LOCAL_WRAPPER_HOOK = "_pskv_distributed_optimizer_hook"  # pskv.torch.optimizer's hook, on each parameter


class _Barrier:
    """The forward pre-hooks of one model: each waits for its module's own parameters, then lets it run."""

    def __init__(self, model: torch.nn.Module, updates: ServerUpdates, num_steps: int | None) -> None:
        self.updates = updates
        self.num_steps = num_steps
        self.hooks = [m.register_forward_pre_hook(self._before_forward) for m in model.modules()
                      if next(m.parameters(recurse=False), None) is not None]

    def _before_forward(self, module: torch.nn.Module, args: Any) -> None:
        self.updates.wait_for(module.parameters(recurse=False), forward=True)

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []


class _CrossBarrierOptimizer(ServerSideOptimizer):
    """A server-side optimizer whose ``step()`` does not wait (the last ``num_steps``-th one does)."""

    _barrier: _Barrier

    def step(self, closure: Any = None) -> Any:
        """Send the gradients not sent yet and return; the next forward waits for each layer's update."""
        loss = super().step(closure)
        if self._barrier.num_steps is not None and self._steps >= self._barrier.num_steps:
            self._updates.finish()
        return loss


def _unwrapped(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The plain torch optimizer behind an all-reducing ``DistributedOptimizer``, its hooks removed."""
    if not isinstance(optimizer, _DistributedOptimizer):
        return optimizer
    for hook in getattr(optimizer, "_hooks", []):  # the wrapper's gradient hooks (one per parameter)
        hook.remove()
    for group in optimizer.param_groups:
        for p in group["params"]:
            hook = getattr(p, _LOCAL_WRAPPER_HOOK, None)
            if hook is not None:  # (removing twice is harmless)
                hook.remove()
                delattr(p, _LOCAL_WRAPPER_HOOK)
    base = next(c for c in type(optimizer).__mro__[1:] if not issubclass(c, _DistributedOptimizer))
    plain: torch.optim.Optimizer = object.__new__(base)  # type: ignore[assignment]  # a torch.optim class
    plain.__dict__.update(optimizer.__dict__)  # its groups and state (the wrapper's own fields stay unused)
    return plain


def CrossBarrier(model: torch.nn.Module, optimizer: torch.optim.Optimizer | PskvOptimizer,  # noqa: N802
                 num_steps: int | None = None, *, named_parameters: Any = None, compression: Any = Compression.none,
                 backward_passes_per_step: int = 1, bucket_bytes: int = BUCKET_BYTES) -> ServerSideOptimizer:
    """``optimizer`` run by the servers, with ``step()`` overlapping the next forward (module docstring).

    Args:
        model: the module trained; its submodules get the forward pre-hooks.
        optimizer: see the module docstring (a pskv optimizer over ``model.named_parameters()`` too).
        num_steps: BytePS's: the step after which ``step()`` waits again (None: never).
        named_parameters, compression, backward_passes_per_step: BytePS's keywords, as
            ``DistributedOptimizer``'s (default names: ``model.named_parameters()``); used
            when ``optimizer`` is not run by the servers yet.
        bucket_bytes: about how many bytes of gradients one ``pushpull`` carries (smaller: finer overlap).

    Raises:
        InvalidArgumentError: ``model`` is not a module, ``num_steps`` < 1, and what
            :func:`~pskv.torch.server_update.server_side_optimizer` finds invalid (a store
            without servers, an optimizer it cannot run, bad names).
        NotSupportedError: ``compression=Compression.fp16`` (refused by ``server_side_optimizer``).
    """
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError(f"CrossBarrier(model, optimizer): model must be a torch.nn.Module, "
                                   f"got {type(model).__qualname__}")
    if num_steps is not None and (isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1):
        raise InvalidArgumentError(f"CrossBarrier: num_steps must be an int >= 1 or None, got {num_steps!r}")
    if isinstance(optimizer, ServerSideOptimizer):
        wrapped = optimizer
    else:
        plain = optimizer if isinstance(optimizer, PskvOptimizer) else _unwrapped(optimizer)
        named = model.named_parameters() if named_parameters is None else named_parameters
        wrapped = server_side_optimizer(plain, named, compression, backward_passes_per_step, bucket_bytes=bucket_bytes)
    base = next(c for c in type(wrapped).__mro__ if not issubclass(c, ServerSideOptimizer))  # the torch class
    cls = type(type(wrapped).__name__, (_CrossBarrierOptimizer, base), {})
    result: _CrossBarrierOptimizer = object.__new__(cls)
    result.__dict__.update(wrapped.__dict__)
    result._updates.optimizer = result
    result._updates.overlap = True
    result._barrier = _Barrier(model, result._updates, num_steps)
    return result
