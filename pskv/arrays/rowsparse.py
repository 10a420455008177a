"""``RowSparse``: MXNet's ``row_sparse`` value for NumPy, and PyTorch sparse COO tensors.

A row-sparse value of shape ``(rows, d1, ...)`` holds only some rows: ``indices`` (int64,
1-D, sorted, unique) and ``data`` of shape ``(len(indices), d1, ...)``; every other row is
zero. The constructor *canonicalises* (MXNet's row-sparse arrays are always sorted and
unique): indices are sorted and the data of a row listed twice are summed, as
``torch.Tensor.coalesce()`` does and as a push merges duplicates. It refuses, before
allocating anything, indices that are negative or ``>= rows``, non-integer indices, data
whose shape is not ``(len(indices),) + shape[1:]``, and shapes that are not a tuple of
non-negative ints with at least one dimension.

PyTorch: :meth:`RowSparse.from_torch` takes a sparse COO tensor with one sparse
dimension — what ``nn.Embedding(sparse=True)`` leaves in ``weight.grad``: indices of
shape ``(1, nnz)``, values ``(nnz, dim)``, possibly uncoalesced — and
:func:`coo_parts` gives the same parts without leaving the tensor's device (the stores
use it). Like the rest of :mod:`pskv.arrays`, nothing here imports torch.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from pskv.arrays.backend import describe, is_torch, to_numpy
from pskv.arrays.dtypes import NUMPY_NAMES, SUPPORTED_DTYPES, numpy_dtype
from pskv.errors import InvalidArgumentError, InvalidTypeError, UnsupportedValueError

__all__ = ["RowSparse", "any_row_sparse", "is_row_sparse", "is_torch_sparse", "coo_parts", "canonical_rows"]

#: Above this many elements a shape cannot be a real array (int64 byte counts would overflow).
MAX_ELEMENTS = 1 << 60


def is_torch_sparse(x: object) -> bool:
    """True if ``x`` is a PyTorch tensor with the sparse COO layout."""
    return is_torch(x) and x.layout is sys.modules["torch"].sparse_coo  # type: ignore[attr-defined]


def is_row_sparse(x: object) -> bool:
    """True for a :class:`RowSparse` or a PyTorch sparse COO tensor.

    Every value of every call is asked this (dense values take the plain path), so a NumPy array,
    the common case, is answered by its type alone.
    """
    if type(x) is np.ndarray:
        return False
    return isinstance(x, RowSparse) or is_torch_sparse(x)


def any_row_sparse(values: Iterable[object]) -> bool:
    """True if one of ``values`` is row-sparse: the per-call question of every store's hot path, so
    NumPy arrays are passed over by their type, without a call."""
    for x in values:
        if type(x) is not np.ndarray and (isinstance(x, RowSparse) or is_torch_sparse(x)):
            return True
    return False


def _check_shape(shape: object) -> tuple[int, ...]:
    if not isinstance(shape, (tuple, list)) or not shape:
        raise InvalidArgumentError(f"a row-sparse shape is a tuple of at least one int, got {shape!r}")
    dims = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise InvalidArgumentError(f"a row-sparse shape holds non-negative ints, got {tuple(shape)!r}")
        dims.append(int(d))
    n = 1
    for d in dims:
        n *= d
    if n > MAX_ELEMENTS:
        raise InvalidArgumentError(f"row-sparse shape {tuple(dims)} has {n} elements, more than any array can hold")
    return tuple(dims)


_MAX_ID = int(np.iinfo(np.int64).max)


def _index_array(indices: object) -> np.ndarray[Any, Any]:
    """``indices`` as a 1-D int64 NumPy array (integers only; no float ids)."""
    if is_torch(indices):
        indices = to_numpy(indices)
    if isinstance(indices, np.ndarray):
        ids = indices
    elif isinstance(indices, (list, tuple, range)):
        ids = np.asarray(list(indices))
        if ids.size == 0:
            ids = ids.astype(np.int64)
    else:
        raise InvalidTypeError(f"row-sparse indices must be an int array or a sequence of ints, "
                               f"got {type(indices).__qualname__}")
    if ids.ndim != 1:
        raise InvalidArgumentError(f"row-sparse indices must be 1-D, got shape {ids.shape}")
    if ids.dtype.kind not in "iu":
        raise InvalidTypeError(f"row-sparse indices must be integers, got dtype {ids.dtype}")
    if ids.dtype.kind == "u" and ids.size and ids.max() > _MAX_ID:  # the cast would wrap them to negative ids
        raise InvalidArgumentError(f"row-sparse indices {ids[ids > _MAX_ID][:8].tolist()} out of range "
                                   f"(row ids are int64, at most {_MAX_ID})")
    return ids.astype(np.int64, copy=False)


def canonical_rows(indices: np.ndarray[Any, Any], num_rows: int, what: str = "row-sparse indices") -> None:
    """Refuse ids outside ``[0, num_rows)``, naming the first few.

    Raises:
        InvalidArgumentError: an id is negative or ``>= num_rows``.
    """
    if indices.size == 0:
        return
    lo, hi = int(indices.min()), int(indices.max())
    if lo < 0 or hi >= num_rows:
        bad = indices[(indices < 0) | (indices >= num_rows)]
        raise InvalidArgumentError(f"{what} {bad[:8].tolist()} out of range for {num_rows} rows "
                                   f"(valid: 0..{num_rows - 1})")


def _sum_duplicates(ids: np.ndarray[Any, Any], data: Any, xp_add: Any) -> tuple[np.ndarray[Any, Any], Any]:
    """Sorted unique ids and, per id, the sum of its rows (``xp_add(out, positions, rows)``)."""
    if ids.size < 2 or bool(np.all(ids[1:] > ids[:-1])):
        return ids, data
    unique, inverse = np.unique(ids, return_inverse=True)
    return unique, xp_add(len(unique), inverse, data)


def _numpy_add(n: int, inverse: np.ndarray[Any, Any], data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    out = np.zeros((n,) + data.shape[1:], dtype=data.dtype)
    np.add.at(out, inverse, data)
    return out


def coo_parts(t: Any) -> tuple[np.ndarray[Any, Any], Any]:
    """``(indices, values)`` of a sparse COO tensor with one sparse dimension, duplicates summed.

    ``indices`` is a sorted unique int64 NumPy array; ``values`` a dense tensor of shape
    ``(len(indices),) + t.shape[1:]`` on ``t``'s device and of its dtype.

    Raises:
        InvalidArgumentError: more than one sparse dimension, or ids out of range.
    """
    if t.sparse_dim() != 1:
        raise InvalidArgumentError(f"a row-sparse tensor has one sparse dimension (rows); got a sparse COO tensor "
                                   f"with {t.sparse_dim()} sparse dimensions of shape {tuple(t.shape)}")
    c = t.detach()
    c = c if c.is_coalesced() else c.coalesce()
    ids = c._indices()[0].cpu().numpy().astype(np.int64, copy=False)
    canonical_rows(ids, int(t.shape[0]), "sparse tensor row ids")
    return ids, c._values()


class RowSparse:
    """A NumPy row-sparse value: the rows ``indices`` of a ``shape`` array hold ``data``; others are zero.

    Args:
        indices: row ids (a 1-D int array or a sequence of ints); sorted and de-duplicated
            here, the data of a repeated id summed.
        data: a NumPy array of shape ``(len(indices),) + shape[1:]``, a supported dtype.
        shape: the dense shape (at least one dimension).

    Raises:
        InvalidArgumentError: ids out of range, a data shape that does not fit, a bad shape.
        InvalidTypeError: non-integer ids.
        UnsupportedValueError: data is not a NumPy array of a supported dtype.
    """

    __slots__ = ("_indices", "_data", "_shape")

    def __init__(self, indices: Any, data: Any, shape: Sequence[int]) -> None:
        dims = _check_shape(shape)
        ids = _index_array(indices)
        if not isinstance(data, np.ndarray):
            raise UnsupportedValueError(f"RowSparse data must be a numpy.ndarray (use RowSparse.from_torch for "
                                        f"tensors), got {type(data).__module__}.{type(data).__qualname__}")
        describe(data)  # a supported dtype
        want = (len(ids),) + dims[1:]
        if data.shape != want:
            raise InvalidArgumentError(f"RowSparse data of shape {data.shape} does not fit {len(ids)} indices of a "
                                       f"{dims} array: expected {want}")
        canonical_rows(ids, dims[0])
        ids, data = _sum_duplicates(ids, data, _numpy_add)
        self._shape = dims
        self._indices = np.ascontiguousarray(ids)
        self._data = np.ascontiguousarray(data)

    # -- constructors -----------------------------------------------------------------------
    @classmethod
    def zeros(cls, shape: Sequence[int], dtype: str = "float32") -> RowSparse:
        """An all-zero row-sparse value (no rows), e.g. an out for ``row_sparse_pull``."""
        dims = _check_shape(shape)
        if dtype not in SUPPORTED_DTYPES or dtype == "bfloat16":
            raise UnsupportedValueError(f"RowSparse dtype must be one of NumPy's supported dtypes, got {dtype!r}")
        return cls(np.zeros(0, dtype=np.int64), np.zeros((0,) + dims[1:], dtype=numpy_dtype(dtype)), dims)

    @classmethod
    def from_dense(cls, array: Any, rows: Any = None) -> RowSparse:
        """The rows of ``array`` (NumPy or a dense tensor) that hold a non-zero value, or exactly ``rows``."""
        a = to_numpy(array) if is_torch(array) else array
        if not isinstance(a, np.ndarray) or a.ndim < 1:
            raise UnsupportedValueError(f"from_dense needs an array of at least one dimension, got {type(array).__qualname__}")
        if rows is None:
            ids = np.flatnonzero(a.reshape(a.shape[0], -1).any(axis=1)) if a.shape[0] else np.zeros(0, np.int64)
        else:
            ids = np.unique(_index_array(rows))
            canonical_rows(ids, a.shape[0])
        return cls(ids, np.array(a[ids]), a.shape)

    @classmethod
    def from_torch(cls, t: Any) -> RowSparse:
        """A sparse COO tensor (one sparse dimension; coalesced or not) as a NumPy ``RowSparse``.

        Raises:
            InvalidTypeError: ``t`` is not a sparse COO tensor.
            UnsupportedValueError: a dtype NumPy cannot hold (bfloat16).
        """
        if not is_torch_sparse(t):
            raise InvalidTypeError(f"from_torch needs a torch sparse COO tensor, got {type(t).__qualname__}")
        ids, values = coo_parts(t)
        data = values.cpu().numpy() if values.dtype is not sys.modules["torch"].bfloat16 else None
        if data is None or data.dtype not in NUMPY_NAMES:
            raise UnsupportedValueError(f"RowSparse cannot hold torch dtype {values.dtype}")
        return cls(ids, data, tuple(t.shape))

    # -- properties -----------------------------------------------------------------------------
    @property
    def indices(self) -> np.ndarray[Any, Any]:
        """The stored rows' ids: int64, sorted, unique."""
        return self._indices

    @property
    def data(self) -> np.ndarray[Any, Any]:
        """The stored rows, ``(nnz,) + shape[1:]``."""
        return self._data

    @property
    def shape(self) -> tuple[int, ...]:
        """The dense shape."""
        return self._shape

    @property
    def dtype(self) -> str:
        """pskv's dtype name of the data (``'float32'``, ...)."""
        return NUMPY_NAMES[self._data.dtype]

    @property
    def nnz(self) -> int:
        """Number of stored rows."""
        return int(self._indices.shape[0])

    @property
    def ndim(self) -> int:
        """Number of dimensions of the dense shape."""
        return len(self._shape)

    # -- conversions ----------------------------------------------------------------------------
    def todense(self) -> np.ndarray[Any, Any]:
        """A new dense array: the stored rows, zeros elsewhere."""
        out = np.zeros(self._shape, dtype=self._data.dtype)
        out[self._indices] = self._data
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
        dense = self.todense()
        return dense if dtype is None else dense.astype(dtype)

    def to_torch(self, device: Any = None) -> Any:
        """A coalesced torch sparse COO tensor with these rows (torch must be imported)."""
        torch = sys.modules.get("torch")
        if torch is None:
            raise InvalidTypeError("to_torch needs PyTorch (import torch first)")
        ids = torch.from_numpy(self._indices.reshape(1, -1).copy())
        values = torch.from_numpy(self._data.copy())
        t = torch.sparse_coo_tensor(ids, values, self._shape, is_coalesced=True, check_invariants=False)
        return t if device is None else t.to(device)

    def retain(self, row_ids: Any) -> RowSparse:
        """Only the rows among ``row_ids`` (MXNet's ``sparse.retain``); ids must be in range."""
        ids = np.unique(_index_array(row_ids))
        canonical_rows(ids, self._shape[0], "retain row ids")
        keep = np.isin(self._indices, ids)
        return RowSparse(self._indices[keep], self._data[keep], self._shape)

    def copy(self) -> RowSparse:
        """An independent copy."""
        return RowSparse(self._indices.copy(), self._data.copy(), self._shape)

    def _assign(self, indices: np.ndarray[Any, Any], data: np.ndarray[Any, Any]) -> None:
        """Replace the rows in place (a store filling an out); ``indices`` already canonical."""
        self._indices = np.ascontiguousarray(indices, dtype=np.int64)
        self._data = np.ascontiguousarray(data)

    def __repr__(self) -> str:
        return f"RowSparse(shape={self._shape}, dtype={self.dtype}, nnz={self.nnz})"
