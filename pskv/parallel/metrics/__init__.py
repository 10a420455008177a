"""Evaluation metrics with MXNet's ``mx.metric`` interface, over NumPy arrays and PyTorch tensors.

Every metric keeps float64 sums and integer counts (``sum_metric`` / ``num_inst``), so the
result does not depend on how the samples were split into batches: updating with the two
halves of a batch gives exactly what updating with the whole batch gives. A data-parallel
group relies on that, since it calls ``update`` once per device slice.

Differences from MXNet, all deliberate:

* ``MSE``, ``MAE`` and ``RMSE`` average over every element seen (``num_inst`` counts
  elements), where MXNet averages the per-batch means (``num_inst`` counts batches) and so
  weighs a short last batch like a full one. ``RMSE`` is the square root of the overall
  MSE, not a mean of per-batch RMSEs.
* ``F1`` is multi-class and its ``average`` means what it means in scikit-learn
  (``'macro'``, ``'micro'``, ``'binary'``); MXNet's ``F1`` is binary only and uses
  ``average`` to choose between averaging per-batch scores and pooling the counts.
  MXNet's F1 is ``F1(average='binary')`` here.
* ``TopKAccuracy`` accepts ``top_k=1`` and always appends ``_<k>`` to its name.
* Class ids must be whole numbers; fractional labels or predicted ids raise instead of
  being truncated.

Tensors may live on any device: they are copied to the host with
``.detach().cpu().numpy()``. torch is never imported by this package.

The package (every name below is importable from ``pskv.parallel.metrics``):

* :mod:`.base` — :class:`EvalMetric` and the registry (``METRICS``, :func:`register`,
  :func:`alias`, :func:`registered_names`);
* :mod:`.classification` — Accuracy, TopKAccuracy, CrossEntropy, Perplexity, F1;
* :mod:`.regression` — MSE, MAE, RMSE, Loss;
* :mod:`.composite` — :func:`create`, CompositeEvalMetric, CustomMetric, :func:`np_metric`;
* :mod:`._inputs` — labels and predictions as checked NumPy arrays (private).

Importing the package registers every built-in metric under its class name and aliases.
"""

from __future__ import annotations

# isort: off
# The built-in metrics register as their modules are imported: this order (classification,
# regression, composite) is the registration order, so it is kept by hand, not sorted.
# METRICS stays importable from here but out of __all__, as it was before the split.
from pskv.parallel.metrics.base import METRICS as METRICS, EvalMetric, alias, register, registered_names
from pskv.parallel.metrics.classification import F1, Accuracy, CrossEntropy, Perplexity, TopKAccuracy
from pskv.parallel.metrics.regression import MAE, MSE, RMSE, Loss
from pskv.parallel.metrics.composite import CompositeEvalMetric, CustomMetric, create, np_metric
# isort: on

__all__ = [
    "EvalMetric",
    "Accuracy",
    "TopKAccuracy",
    "CrossEntropy",
    "Perplexity",
    "MSE",
    "MAE",
    "RMSE",
    "F1",
    "Loss",
    "CompositeEvalMetric",
    "CustomMetric",
    "np_metric",
    "create",
    "register",
    "alias",
    "registered_names",
]
