"""Data-parallel training of PyTorch models through a pskv store (needs the ``torch`` extra).

* :class:`DataParallelExecutorGroup` — a module replicated over devices; each batch is
  split over them by workload (MXNet's executor group, with ``torch.nn.Module`` replicas);
* :class:`Trainer` — parameters as store keys, gradients sent during backward,
  optimizer in the store (``update_on_kvstore``) or here; :meth:`Trainer.fit` runs epochs
  with progress, evaluation and checkpoints;
* :class:`Embedding` / :class:`EmbeddingBag` — embedding tables that live in the store
  (row-sparse keys): each forward pulls the batch's rows, backward pushes their
  gradient; :class:`PrefetchingIter` pulls the next batch's rows during a step;
* :mod:`~pskv.parallel.metrics` (MXNet's ``EvalMetric``), :mod:`~pskv.parallel.data`
  (``NDArrayIter`` with ``num_parts`` / ``part_index`` sharding), :class:`Monitor`,
  :mod:`~pskv.parallel.checkpoint`.

Layering: this package sits above :mod:`pskv.kvstore` and :mod:`pskv.optimizer`; nothing
below imports it.
"""

try:
    import torch  # noqa: F401  (every module here needs it)
except ModuleNotFoundError as exc:  # say how to get it, not just that it is missing
    if exc.name != "torch":
        raise
    raise ModuleNotFoundError("pskv.parallel trains PyTorch models and needs PyTorch: "
                              "pip install 'pskv[torch]'", name="torch") from exc

from pskv.parallel import metrics  # noqa: E402
from pskv.parallel.checkpoint import latest_checkpoint, load_checkpoint, load_params, save_checkpoint, save_params
from pskv.parallel.data import DataBatch, DataDesc, NDArrayIter
from pskv.parallel.embedding import Embedding, EmbeddingBag, PrefetchingIter
from pskv.parallel.executor_group import DataParallelExecutorGroup
from pskv.parallel.fit import evaluate, fit
from pskv.parallel.monitor import Monitor
from pskv.parallel.split import split_batch
from pskv.parallel.trainer import Trainer

__all__ = [
    "DataBatch",
    "DataDesc",
    "DataParallelExecutorGroup",
    "Embedding",
    "EmbeddingBag",
    "Monitor",
    "NDArrayIter",
    "PrefetchingIter",
    "Trainer",
    "evaluate",
    "fit",
    "latest_checkpoint",
    "load_checkpoint",
    "load_params",
    "metrics",
    "save_checkpoint",
    "save_params",
    "split_batch",
]
