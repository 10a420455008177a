"""``DistributedDataParallel``: torch's DDP surface on pskv's all-reduces.

Swap ``torch.nn.parallel.DistributedDataParallel(model, ...)`` for
``pskv.torch.DistributedDataParallel(model, ...)`` and the loop stays as it is:

* construction starts ``pskv.torch`` where the script did not (:func:`pskv.torch.init`: the
  job's store, chosen by the launcher; the script's own ``init_process_group`` may stay),
  then broadcasts rank 0's parameters and buffers to every rank;
* each forward first broadcasts rank 0's buffers (``broadcast_buffers=True``; torch's rule:
  not after a forward under ``no_grad`` or ``no_sync``), then runs ``module``;
* during backward each parameter's gradient joins its bucket (:mod:`pskv.torch.buckets`,
  ``bucket_cap_mb`` as torch's) and complete buckets are averaged over the ranks while
  backward goes on; a callback queued on autograd's engine sends what is left and waits,
  so when ``loss.backward()`` returns every ``.grad`` holds the average; the sparse gradients
  of ``nn.Embedding`` / ``nn.EmbeddingBag`` with ``sparse=True`` travel as rows from the first
  step (:mod:`pskv.torch.sparse`; torch's DDP reduces them sparse too);
* ``no_sync()``: gradients accumulate locally; the first backward outside it averages the sum;
* a parameter that got no gradient in a backward is reduced as zeros, so every rank makes
  the same collectives. With ``find_unused_parameters=True`` one more small all-reduce
  counts who used each parameter, and one unused on every rank keeps ``.grad`` None, as
  with torch's DDP. (Without it torch raises at the next forward; pskv leaves the zeros.)

Not offered: ``process_group`` / ``device_mesh`` other than None
(:class:`~pskv.errors.NotSupportedError`), comm hooks, ``join``. ``output_device``,
``dim``, ``check_reduction``, ``gradient_as_bucket_view`` and ``static_graph`` are accepted
and change nothing. On a job of one process nothing is broadcast and no hook is set.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from pskv.errors import InvalidArgumentError, NotSupportedError
from pskv.torch import ops, runtime, sparse
from pskv.torch.buckets import DEFAULT_BUCKET_BYTES, Reduction
from pskv.torch.compression import Compression

__all__ = ["DistributedDataParallel"]

_instances = itertools.count()  # one collective-name prefix per wrapped module, the same on every rank


class DistributedDataParallel(torch.nn.Module):
    """``module`` replicated on every rank, its gradients averaged during backward (torch's DDP arguments).

    Args:
        module: the model (on this rank's device).
        device_ids: None (CPU) or the one device the module is on.
        broadcast_buffers: broadcast rank 0's buffers at each forward.
        process_group: None (the job's ranks).
        bucket_cap_mb: the buckets' size in MiB (default 25).
        find_unused_parameters: leave ``.grad`` None for a parameter no rank used.
        compression: ``Compression.none``, ``fp16`` (what gradients travel as; BytePS's argument) or one of
            pskv's own (``Compression.twobit()``, ...: :mod:`pskv.torch.compression`).

    Attributes:
        module: the wrapped module.

    Raises:
        InvalidArgumentError: more than one device in ``device_ids``.
        NotSupportedError: a ``process_group`` or ``device_mesh``.
    """

    def __init__(self, module: torch.nn.Module, device_ids: list[Any] | None = None, output_device: Any = None,
                 dim: int = 0, broadcast_buffers: bool = True, process_group: Any = None,
                 bucket_cap_mb: float | None = None, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False, static_graph: bool = False,
                 device_mesh: Any = None, compression: Any = Compression.none) -> None:
        super().__init__()
        if process_group is not None or device_mesh is not None:
            raise NotSupportedError("DistributedDataParallel(process_group=..., device_mesh=...): pskv reduces "
                                    "over the job's ranks only; pass None")
        if device_ids is not None and len(device_ids) > 1:
            raise InvalidArgumentError(f"DistributedDataParallel: one device per process, got device_ids={device_ids}")
        if not runtime.is_initialized():  # a torch DDP script calls no hvd.init(): the swap stays one line
            runtime.init()
        self.module = module
        self.device_ids = device_ids
        self.output_device = output_device
        self.dim = dim
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._prefix = f"DistributedDataParallel.{next(_instances)}"
        self._params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        cap = DEFAULT_BUCKET_BYTES if bucket_cap_mb is None else int(bucket_cap_mb * 1024 * 1024)
        self._buckets = sparse.gradient_buckets(self._params[::-1], self._prefix, Reduction(ops.Average, compression),
                                                False, sparse.sparse_parameters(module), cap_bytes=cap)  # rows: sparse.py
        self._callback_queued = False
        self._distributed = runtime.size() > 1
        self._hooks = []
        if self._distributed:
            self._broadcast(module.state_dict().items(), "state")
            used = [(f"{self._prefix}.used", [torch.zeros(len(self._params))])] if find_unused_parameters else []
            self._buckets.declare(used)
            self._hooks = [p.register_post_accumulate_grad_hook(self._on_gradient) for _, p in self._params]

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """``module(*inputs, **kwargs)``, after broadcasting rank 0's buffers where torch's DDP would."""
        if self._distributed and self.broadcast_buffers and self.require_forward_param_sync:
            self._broadcast(self.module.named_buffers(), "buffer")
        out = self.module(*inputs, **kwargs)
        self.require_forward_param_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        return out

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Within it backward passes accumulate gradients locally; the first backward after it averages them."""
        before = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before

    def _broadcast(self, named: Any, what: str) -> None:
        """Rank 0's tensors into every rank's: one flat broadcast per dtype and device, as torch's DDP
        coalesces them (on a store with servers each broadcast is a meeting of every rank). Not a sum
        with zeros from the other ranks: a store's gradient compression would make that lossy."""
        groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for _, t in named:
            if isinstance(t, torch.Tensor) and t.numel():
                groups.setdefault((t.dtype, t.device), []).append(t)
        with torch.no_grad():
            sent = []
            for index, ((dtype, _), tensors) in enumerate(groups.items()):
                flat = torch.cat([t.reshape(-1) for t in tensors])
                name = f"{self._prefix}.{what}.{index}.{str(dtype).removeprefix('torch.')}"
                sent.append((ops.broadcast_async_(flat, 0, name=name), flat, tensors))
            for handle, flat, tensors in sent:
                ops.synchronize(handle)
                offset = 0
                for t in tensors:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()

    def _on_gradient(self, param: torch.Tensor) -> None:
        """The hook: ``param``'s gradient of this backward is final (outside ``no_sync``: to its bucket)."""
        if not self.require_backward_grad_sync:
            return
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        self._buckets.ready(param)

    def _end_of_backward(self) -> None:
        """The last thing backward does: send the buckets left, wait, write the averages into ``.grad``."""
        self._callback_queued = False
        filled = {id(p) for p in self._buckets.launch_all()}
        handle = None
        if self.find_unused_parameters:  # how many ranks used each parameter
            used = torch.tensor([0.0 if id(p) in filled else 1.0 for _, p in self._params])
            handle = ops.allreduce_async_(used, name=f"{self._prefix}.used", op=ops.Sum)
        self._buckets.wait()
        if handle is not None:
            used = ops.synchronize(handle)
            for (_, p), count in zip(self._params, used.tolist()):
                if count == 0:
                    p.grad = None
