"""Data iterators with MXNet's ``mx.io`` interface (``NDArrayIter``, ``DataBatch``, ``DataDesc``).

:class:`NDArrayIter` batches in-memory NumPy arrays or PyTorch tensors and yields slices
of the same kind. For distributed training it shards the samples with ``num_parts`` /
``part_index`` such that every part gets the same number of samples, hence the same
number of batches: workers that call ``push`` / ``pull`` once per batch stay in
lock-step. The rules, per epoch ``e``:

1. the sample order is ``0 .. n-1``, or with ``shuffle`` a permutation drawn from
   ``numpy.random.default_rng(seed + e)``. Every part uses the same seed, so all parts
   see the same permutation and their shards are disjoint;
2. when ``n`` is not a multiple of ``num_parts`` the order is extended by wrapping
   around to its beginning until it is (as ``torch.utils.data.DistributedSampler``
   does), so up to ``num_parts - 1`` samples appear twice in an epoch across parts;
3. part ``p`` takes every ``num_parts``-th sample starting at ``p``:
   ``order[p::num_parts]``.

Epochs are explicit, as in MXNet: ``__iter__`` returns the iterator itself without
rewinding it, iteration ends with ``StopIteration`` (again and again) until
:meth:`NDArrayIter.reset` starts the next epoch, which reshuffles with ``seed + epoch``;
:meth:`NDArrayIter.set_epoch` jumps to the start of any epoch (for resumed training).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pskv.arrays import is_torch
from pskv.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["DataDesc", "DataBatch", "NDArrayIter", "as_list", "batch_arrays", "begin_epoch"]

NDArray = np.ndarray[Any, Any]


@dataclass(frozen=True)
class DataDesc:
    """Name, shape, dtype and layout of one input of a batch (MXNet ``mx.io.DataDesc``).

    Like MXNet's namedtuple, it unpacks as ``name, shape = desc``.

    Args:
        name: the input's name (e.g. ``'data'``, ``'softmax_label'``).
        shape: the batch's shape, batch axis included.
        dtype: element type name, e.g. ``'float32'``.
        layout: one letter per axis with ``'N'`` for the batch axis (e.g. ``'NCHW'``), or None.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    layout: str | None = "NCHW"

    def __iter__(self) -> Iterator[Any]:
        return iter((self.name, self.shape))

    def __getitem__(self, index: int) -> Any:
        return (self.name, self.shape)[index]

    @staticmethod
    def get_batch_axis(layout: str | None) -> int:
        """Position of the batch axis ``'N'`` in ``layout``; 0 when ``layout`` is None.

        Raises:
            InvalidArgumentError: ``layout`` has no ``'N'``.
        """
        if layout is None:
            return 0
        axis = layout.find("N")
        if axis < 0:
            raise InvalidArgumentError(f"layout {layout!r} has no batch axis 'N'")
        return axis

    @staticmethod
    def get_list(
        shapes: Sequence[tuple[str, tuple[int, ...]]], types: Sequence[tuple[str, Any]] | None = None
    ) -> list[DataDesc]:
        """DataDescs from ``(name, shape)`` pairs and optional ``(name, dtype)`` pairs in the same order."""
        if types is None:
            return [DataDesc(name, tuple(shape)) for name, shape in shapes]
        dtypes = dict(types)
        return [DataDesc(name, tuple(shape), np.dtype(dtypes[name]).name) for name, shape in shapes]


@dataclass
class DataBatch:
    """One batch (MXNet ``mx.io.DataBatch``).

    Attributes:
        data: the input arrays, in the order of ``provide_data``.
        label: the label arrays in the order of ``provide_label``, or None without labels.
        pad: how many samples at the end of the batch are filler (wrapped around), not new data.
        index: the positions of the batch's samples in the iterator's arrays.
        provide_data: descriptions of ``data``.
        provide_label: descriptions of ``label``.
    """

    data: list[Any]
    label: list[Any] | None = None
    pad: int = 0
    index: NDArray | None = None
    provide_data: list[DataDesc] | None = None
    provide_label: list[DataDesc] | None = None


LAST_BATCH_HANDLES = ("pad", "discard", "roll_over")


def _named_arrays(source: Any, default_name: str, what: str) -> list[tuple[str, Any]]:
    """``source`` (array, list of arrays or dict name -> array) as ``(name, array)`` pairs.

    Lists name their arrays ``default_name`` (one array) or ``_<i>_<default_name>``; dicts
    keep their insertion order. Values that are not tensors become NumPy arrays.

    Raises:
        InvalidTypeError: a value cannot be made into an array.
        InvalidArgumentError: an array has no sample axis.
    """
    if isinstance(source, Mapping):
        pairs = [(str(k), v) for k, v in source.items()]
    elif isinstance(source, (list, tuple)):
        if len(source) == 1:
            pairs = [(default_name, source[0])]
        else:
            pairs = [(f"_{i}_{default_name}", v) for i, v in enumerate(source)]
    else:
        pairs = [(default_name, source)]
    named = []
    for name, value in pairs:
        if not (isinstance(value, np.ndarray) or is_torch(value)):
            try:
                value = np.asarray(value)
            except (TypeError, ValueError) as exc:
                raise InvalidTypeError(f"{what} {name!r} is not an array: {type(value).__name__}") from exc
            if value.dtype == object:
                raise InvalidTypeError(f"{what} {name!r} is not a numeric array")
        if value.ndim == 0:
            raise InvalidArgumentError(f"{what} {name!r} is a scalar; it needs a leading sample axis")
        named.append((name, value))
    return named


def _dtype_name(x: Any) -> str:
    return x.dtype.name if isinstance(x, np.ndarray) else str(x.dtype).removeprefix("torch.")


def _take(x: Any, idx: NDArray) -> Any:
    """Rows ``idx`` of ``x``, of ``x``'s kind: a view for a contiguous run, else a copy."""
    start = int(idx[0])
    if idx[-1] - start == idx.size - 1 and np.array_equal(idx, np.arange(start, start + idx.size)):
        return x[start : start + idx.size]
    if isinstance(x, np.ndarray):
        return x[idx]
    import torch  # x is a tensor, so torch is already imported

    return x[torch.as_tensor(idx, device=x.device)]


class NDArrayIter:
    """Iterates over in-memory arrays in batches (MXNet ``mx.io.NDArrayIter``), optionally one shard of them.

    Batches hold slices of the inputs' kind (NumPy arrays or tensors). Contiguous batches
    are views of the inputs, so modifying a batch in place modifies the data.

    Args:
        data: an array / tensor, a list of them, or a dict name -> array. All arrays (data
            and label) must have the same number of samples along axis 0.
        label: the labels, in the same forms, or None.
        batch_size: samples per batch, >= 1.
        shuffle: reshuffle the samples every epoch (see the module docstring).
        last_batch_handle: what to do with the samples left over after the last full batch:
            ``'pad'`` fills the last batch by wrapping around to the start of the epoch
            (``DataBatch.pad`` says how many are filler), ``'discard'`` drops them,
            ``'roll_over'`` puts them at the start of the next epoch.
        data_name: the name of a single data array (``_<i>_<data_name>`` for a list).
        label_name: the name of a single label array.
        num_parts: number of shards (workers), >= 1.
        part_index: which shard this iterator yields, in ``[0, num_parts)``.
        seed: shuffle seed, the same on every part; epoch ``e`` uses ``seed + e``. May be
            None unless ``shuffle`` is set with ``num_parts > 1`` (a random seed is then drawn once).

    Raises:
        InvalidArgumentError: a bad argument (the message names it and its value), sample
            counts that differ between arrays, duplicate names, no samples, a shard smaller
            than a batch with ``'discard'`` / ``'roll_over'``, or ``shuffle`` over several
            parts without a seed.
        InvalidTypeError: data or labels that are not arrays.
    """

    def __init__(
        self,
        data: Any,
        label: Any = None,
        batch_size: int = 1,
        shuffle: bool = False,
        last_batch_handle: str = "pad",
        data_name: str = "data",
        label_name: str = "softmax_label",
        num_parts: int = 1,
        part_index: int = 0,
        seed: int | None = None,
    ) -> None:
        for arg, value in (("batch_size", batch_size), ("num_parts", num_parts)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise InvalidArgumentError(f"NDArrayIter: {arg} must be an int >= 1, got {value!r}")
        if isinstance(part_index, bool) or not isinstance(part_index, (int, np.integer)):
            raise InvalidArgumentError(f"NDArrayIter: part_index must be an int, got {part_index!r}")
        if not 0 <= part_index < num_parts:
            raise InvalidArgumentError(
                f"NDArrayIter: part_index {part_index} is out of range for num_parts {num_parts}"
            )
        if last_batch_handle not in LAST_BATCH_HANDLES:
            raise InvalidArgumentError(
                f"NDArrayIter: last_batch_handle must be one of {', '.join(LAST_BATCH_HANDLES)}, "
                f"got {last_batch_handle!r}"
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise InvalidArgumentError(f"NDArrayIter: seed must be an int or None, got {seed!r}")
        if shuffle and num_parts > 1 and seed is None:
            raise InvalidArgumentError(
                f"NDArrayIter: shuffle with num_parts {num_parts} needs a seed shared by all parts, got seed None"
            )
        self.data = _named_arrays(data, data_name, "data")
        self.label = _named_arrays(label, label_name, "label") if label is not None else []
        self._check_arrays()

        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.last_batch_handle = last_batch_handle
        self.num_parts = int(num_parts)
        self.part_index = int(part_index)
        self.seed = int(seed) if seed is not None else int(np.random.default_rng().integers(2**62))
        self.num_samples = int(self.data[0][1].shape[0])
        self.num_data = math.ceil(self.num_samples / self.num_parts)
        if last_batch_handle != "pad" and self.num_data < self.batch_size:
            raise InvalidArgumentError(
                f"NDArrayIter: batch_size {self.batch_size} exceeds the {self.num_data} samples of a part, "
                f"so last_batch_handle {last_batch_handle!r} would yield no batch"
            )
        self.epoch = 0
        self._order = self._shard()
        self._cursor = 0

    def _check_arrays(self) -> None:
        names = [name for name, _ in self.data + self.label]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InvalidArgumentError(f"NDArrayIter: duplicate input name(s) {duplicates}")
        counts = {name: int(x.shape[0]) for name, x in self.data + self.label}
        if len(set(counts.values())) > 1:
            raise InvalidArgumentError(f"NDArrayIter: data and label differ in their numbers of samples: {counts}")
        if not self.data or 0 in counts.values():
            raise InvalidArgumentError(f"NDArrayIter: no samples to iterate over: {counts}")

    def _shard(self) -> NDArray:
        """This part's sample positions for the current epoch (module docstring, rules 1-3)."""
        n = self.num_samples
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(n)
        else:
            order = np.arange(n, dtype=np.int64)
        order = np.resize(order, self.num_data * self.num_parts)  # wraps around to the beginning
        return order[self.part_index :: self.num_parts]

    @property
    def provide_data(self) -> list[DataDesc]:
        """Descriptions of the data arrays of every batch."""
        return [DataDesc(name, (self.batch_size, *x.shape[1:]), _dtype_name(x)) for name, x in self.data]

    @property
    def provide_label(self) -> list[DataDesc]:
        """Descriptions of the label arrays of every batch (empty without labels)."""
        return [DataDesc(name, (self.batch_size, *x.shape[1:]), _dtype_name(x)) for name, x in self.label]

    def __len__(self) -> int:
        """Batches in the current epoch (with ``'roll_over'`` it depends on the carried samples)."""
        if self.last_batch_handle == "pad":
            return math.ceil(self._order.size / self.batch_size)
        return self._order.size // self.batch_size

    def reset(self) -> None:
        """Start the next epoch (reshuffled with ``seed + epoch``).

        With ``'roll_over'``, the samples left over at the end of the epoch come first;
        an epoch abandoned with a full batch or more still to go carries nothing.
        """
        left = self._order[self._cursor :]
        carry = left if self.last_batch_handle == "roll_over" and left.size < self.batch_size else left[:0]
        self.epoch += 1
        self._order = np.concatenate([carry, self._shard()])
        self._cursor = 0

    def hard_reset(self) -> None:
        """Start the next epoch without carrying left-over samples (MXNet ``hard_reset``)."""
        self.epoch += 1
        self._order = self._shard()
        self._cursor = 0

    def set_epoch(self, epoch: int) -> None:
        """Position the iterator at the start of ``epoch`` (shuffled with ``seed + epoch``).

        Like ``DistributedSampler.set_epoch``: training resumed at epoch ``e`` sees the
        batches an uninterrupted run saw. With ``'roll_over'``, left-over samples are
        carried only into the epoch right after the current one (as :meth:`reset` does).

        Raises:
            InvalidArgumentError: ``epoch`` is not an int >= 0.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise InvalidArgumentError(f"NDArrayIter: epoch must be an int >= 0, got {epoch!r}")
        if epoch == self.epoch + 1:
            self.reset()
            return
        self.epoch = int(epoch)
        self._order = self._shard()
        self._cursor = 0

    def repartition(self, order: Any) -> None:
        """Iterate over the sample positions ``order``, from the first: an elastic job's share of what is left
        of the epoch (:func:`pskv.parallel.elastic_data.partition`). :meth:`reset` and :meth:`set_epoch` go
        back to the parts' rules."""
        self._order = np.asarray(order, dtype=np.int64)
        self._cursor = 0

    def __iter__(self) -> NDArrayIter:
        return self

    def __next__(self) -> DataBatch:
        left = self._order.size - self._cursor
        if left <= 0 or (left < self.batch_size and self.last_batch_handle != "pad"):
            raise StopIteration
        if left >= self.batch_size:
            idx = self._order[self._cursor : self._cursor + self.batch_size]
            pad = 0
        else:
            pad = self.batch_size - left
            idx = np.concatenate([self._order[self._cursor :], np.resize(self._order, pad)])
        self._cursor += idx.size - pad
        return DataBatch(
            data=[_take(x, idx) for _, x in self.data],
            label=[_take(x, idx) for _, x in self.label] if self.label else None,
            pad=pad,
            index=idx,
            provide_data=self.provide_data,
            provide_label=self.provide_label,
        )

    def next(self) -> DataBatch:
        """The next batch (MXNet's spelling of ``__next__``).

        Raises:
            StopIteration: the epoch is over; call :meth:`reset`.
        """
        return self.__next__()


def begin_epoch(data: Any, epoch: int) -> None:
    """Position ``data`` at the start of ``epoch``, as ``fit`` does before every epoch.

    An iterator with ``set_epoch`` (:class:`NDArrayIter`, ``PrefetchingIter``) gets
    ``set_epoch(epoch)``. Otherwise every sampler of a ``torch.utils.data.DataLoader``
    that has ``set_epoch`` gets it — ``loader.sampler``, ``loader.batch_sampler`` and the
    batch sampler's ``sampler`` (a ``DistributedSampler`` handed to a ``BatchSampler``) —
    so that a ``DistributedSampler`` shuffles each epoch anew, alike on every worker,
    instead of repeating epoch 0's order (torch leaves that call to the training loop);
    then ``reset()``, if ``data`` has one.
    """
    if hasattr(data, "set_epoch"):
        data.set_epoch(epoch)
        return
    batch_sampler = getattr(data, "batch_sampler", None)
    samplers: list[Any] = [getattr(data, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)]
    for sampler in {id(s): s for s in samplers if callable(getattr(s, "set_epoch", None))}.values():  # each once
        sampler.set_epoch(epoch)
    if hasattr(data, "reset"):
        data.reset()


def batch_arrays(batch: Any) -> tuple[list[Any], list[Any]]:
    """(data arrays, label arrays) of a DataBatch, a ``(data, label)`` pair, a dict or one array
    (a NumPy array or a tensor: both have a ``data`` attribute too, but are no DataBatch).

    Raises:
        InvalidArgumentError: a sequence that is not a ``(data, label)`` pair.
    """
    if isinstance(batch, np.ndarray) or is_torch(batch):
        return [batch], []
    if hasattr(batch, "data"):
        return as_list(batch.data), as_list(getattr(batch, "label", None))
    if isinstance(batch, Mapping):
        return as_list(batch.get("data")), as_list(batch.get("label"))
    if isinstance(batch, (list, tuple)):
        if len(batch) != 2:
            raise InvalidArgumentError(f"a batch given as a sequence must be (data, label), got {len(batch)} items")
        return as_list(batch[0]), as_list(batch[1])
    return [batch], []


def as_list(x: Any) -> list[Any]:
    """``x`` as a list: None -> [], a list or tuple -> its items, anything else -> [x]."""
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]
