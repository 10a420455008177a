"""Labels and predictions as checked NumPy arrays: the input handling every metric shares.

Tensors may live on any device: they are copied to the host with
``.detach().cpu().numpy()``. torch is never imported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pskv.arrays import is_torch, to_numpy
from pskv.errors import InvalidArgumentError, ShapeMismatchError

NDArray = np.ndarray[Any, Any]


def _as_numpy(x: Any) -> NDArray:
    """A host NumPy array with the values of ``x`` (tensors on any device, arrays, array-likes)."""
    if isinstance(x, np.ndarray):
        return x
    if is_torch(x):
        return to_numpy(x)
    return np.asarray(x)


def _as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _shape_error(metric: str, detail: str, label_shape: Sequence[int], pred_shape: Sequence[int]) -> ShapeMismatchError:
    """A ShapeMismatchError whose message speaks of labels and predictions, not of stored keys."""
    err = ShapeMismatchError(metric, "update", tuple(label_shape), tuple(pred_shape))
    err.args = (
        f"metric {metric!r}: {detail}: labels have shape {tuple(label_shape)}, "
        f"predictions have shape {tuple(pred_shape)}",
    )
    return err


def _pairs(metric: str, labels: Any, preds: Any) -> list[tuple[NDArray, NDArray]]:
    """Labels and predictions as NumPy pairs; their numbers must agree.

    Raises:
        ShapeMismatchError: different numbers of label and prediction arrays.
    """
    label_list, pred_list = _as_list(labels), _as_list(preds)
    if len(label_list) != len(pred_list):
        err = ShapeMismatchError(metric, "update", (len(label_list),), (len(pred_list),))
        err.args = (
            f"metric {metric!r}: got {len(label_list)} label array(s) but {len(pred_list)} prediction array(s)",
        )
        raise err
    return [(_as_numpy(label), _as_numpy(pred)) for label, pred in zip(label_list, pred_list)]


def _class_ids(metric: str, what: str, x: NDArray) -> NDArray:
    """``x`` flattened to int64 class ids.

    Raises:
        InvalidArgumentError: ``x`` holds fractional, non-finite or negative values.
    """
    flat = x.reshape(-1)
    if flat.dtype.kind == "b":
        return flat.astype(np.int64)
    if flat.dtype.kind == "f" and not (np.isfinite(flat).all() and (flat == np.floor(flat)).all()):
        raise InvalidArgumentError(f"metric {metric!r}: {what} must be whole-number class ids")
    if flat.dtype.kind not in "iuf":
        raise InvalidArgumentError(f"metric {metric!r}: {what} must be numeric class ids, got dtype {flat.dtype}")
    ids = flat.astype(np.int64)
    if ids.size and int(ids.min()) < 0:
        raise InvalidArgumentError(f"metric {metric!r}: {what} must be non-negative class ids, got {int(ids.min())}")
    return ids


def _predicted_ids(metric: str, label: NDArray, pred: NDArray, axis: int) -> tuple[NDArray, NDArray]:
    """Label ids and predicted ids (argmax of scores over ``axis`` unless ``pred`` already holds ids).

    Raises:
        ShapeMismatchError: the two disagree in the number of samples.
        InvalidArgumentError: fractional or negative class ids.
    """
    ids = pred
    if pred.shape != label.shape:
        if pred.ndim == 0 or not -pred.ndim <= axis < pred.ndim:
            raise _shape_error(metric, f"predictions have no class axis {axis}", label.shape, pred.shape)
        ids = np.argmax(pred, axis=axis)
    if ids.size != label.size:
        raise _shape_error(metric, "different numbers of samples", label.shape, pred.shape)
    return _class_ids(metric, "labels", label), _class_ids(metric, "predicted class ids", ids)


def _scores_2d(metric: str, label: NDArray, pred: NDArray) -> tuple[NDArray, NDArray]:
    """Label ids ``(N,)`` and a score matrix ``(N, C)``; every label must be ``< C``.

    Raises:
        ShapeMismatchError: ``pred`` is not ``(N, C)`` for the ``N`` labels.
        InvalidArgumentError: a label is not a class id in ``[0, C)``.
    """
    if pred.ndim != 2 or pred.shape[0] != label.size:
        raise _shape_error(metric, "predictions must be (samples, classes)", label.shape, pred.shape)
    ids = _class_ids(metric, "labels", label)
    if ids.size and int(ids.max()) >= pred.shape[1]:
        raise InvalidArgumentError(
            f"metric {metric!r}: label {int(ids.max())} is out of range for {pred.shape[1]} classes"
        )
    return ids, pred
