"""``import pskv.torch as hvd``: Horovod's and BytePS's PyTorch API on pskv's stores.

A Horovod or BytePS training script runs on pskv by changing its import line::

    import pskv.torch as hvd        # was: import horovod.torch as hvd / import byteps.torch as bps
    hvd.init()                      # dist_sync under `pskv launch -s N`, the all-reduce store with -s 0
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

Implementation modules (re-exported here):

* :mod:`~pskv.torch.runtime` — ``init``, ``shutdown``, ``size``, ``rank``, ... and which store;
* :mod:`~pskv.torch.ops` — ``allreduce`` / ``grouped_allreduce`` / ``broadcast`` and their
  in-place and async forms, ``poll``, ``synchronize``, ``join``;
* :mod:`~pskv.torch.gather` — ``allgather`` (and the bytes under the object helpers);
* :mod:`~pskv.torch.functions` — ``broadcast_parameters``, ``broadcast_optimizer_state``,
  ``broadcast_object``, ``allgather_object``;
* :mod:`~pskv.torch.compression` — ``Compression.none`` / ``fp16``, and pskv's own (``Compression.twobit()``, ...);
* :mod:`~pskv.torch.byteps` — BytePS's names: ``push_pull``, ``push_pull_async``,
  ``push_pull_inplace``, ``push_pull_async_inplace`` (alias ``byteps_push_pull``), ``declare``.
* :mod:`~pskv.torch.server_update` — ``DistributedOptimizer(..., update_on_kvstore=True)``: the servers run it;
* :mod:`~pskv.torch.cross_barrier` — ``CrossBarrier(model, optimizer)``: ``step()`` overlaps the next forward.
* :mod:`~pskv.torch.elastic` — ``hvd.elastic``: ``run``, ``TorchState``, ``ElasticSampler`` in an elastic job.

Not offered (each raises :class:`~pskv.errors.NotSupportedError` naming itself):
``alltoall``, ``reducescatter``, ``grouped_reducescatter``, ``grouped_allgather``, process
sets, the ops ``Adasum``, ``Min``, ``Max``, ``Product``, and BytePS's ``send_async``, ``recv_async``
(point to point), ``suspend`` and ``resume`` (elastic).
"""

from __future__ import annotations

from typing import Any, NoReturn

from pskv.errors import NotSupportedError
from pskv.torch import elastic  # hvd.elastic: run, TorchState, ElasticSampler (issue 24)
from pskv.torch.byteps import (
    byteps_push_pull,
    declare,
    push_pull,
    push_pull_async,
    push_pull_async_inplace,
    push_pull_inplace,
)
from pskv.torch.compression import Compression, Compressor
from pskv.torch.cross_barrier import CrossBarrier
from pskv.torch.ddp import DistributedDataParallel as DistributedDataParallel
from pskv.torch.functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from pskv.torch.gather import allgather
from pskv.torch.ops import (
    Adasum,
    Average,
    ReduceOp,
    Sum,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    join,
    poll,
    synchronize,
)
from pskv.torch.optimizer import DistributedOptimizer as DistributedOptimizer
from pskv.torch.runtime import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    store,
)

# -- H2: DistributedOptimizer and DistributedDataParallel (pskv/torch/optimizer.py, ddp.py) --
# (their re-export lines are in the sorted import block above)
# -- end H2 --

Min, Max, Product = ReduceOp.Min, ReduceOp.Max, ReduceOp.Product


def _not_offered(function: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotSupportedError(f"pskv.torch.{function} is not offered: pskv's stores sum and broadcast "
                                "(allreduce, grouped_allreduce, broadcast, allgather)")
    refuse.__name__ = refuse.__qualname__ = function
    refuse.__doc__ = f"Not offered by pskv: raises NotSupportedError naming ``{function}``."
    return refuse


alltoall = _not_offered("alltoall")
alltoall_async = _not_offered("alltoall_async")
reducescatter = _not_offered("reducescatter")
reducescatter_async = _not_offered("reducescatter_async")
grouped_reducescatter = _not_offered("grouped_reducescatter")
grouped_allgather = _not_offered("grouped_allgather")
allgather_async = _not_offered("allgather_async")
sparse_allreduce_async = _not_offered("sparse_allreduce_async")
add_process_set = _not_offered("add_process_set")
remove_process_set = _not_offered("remove_process_set")
send_async = _not_offered("send_async")  # BytePS's point to point
recv_async = _not_offered("recv_async")
suspend = _not_offered("suspend")  # BytePS's elastic pause
resume = _not_offered("resume")

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size", "cross_rank",
    "store", "Average", "Sum", "Adasum", "Min", "Max", "Product", "ReduceOp", "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "allgather",
    "poll", "synchronize", "join", "barrier", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "allgather_object", "Compression", "Compressor", "push_pull", "push_pull_async",
    "push_pull_inplace", "push_pull_async_inplace", "declare", "alltoall", "alltoall_async", "reducescatter",
    "reducescatter_async", "grouped_reducescatter", "grouped_allgather", "allgather_async", "sparse_allreduce_async",
    "add_process_set", "remove_process_set", "DistributedOptimizer", "DistributedDataParallel", "nccl_built",
    "cuda_built", "gloo_built", "gloo_enabled", "mpi_built", "mpi_enabled", "mpi_threads_supported", "rocm_built",
    "ddl_built", "ccl_built", "is_homogeneous", "CrossBarrier",
    "byteps_push_pull", "send_async", "recv_async", "suspend", "resume", "elastic",
]
