"""Batch axes: which axis of each input and output of a :class:`~pskv.parallel.DataParallelExecutorGroup` holds the batch.

An input's layout (a ``DataDesc``'s ``'NCHW'``, ``'TNC'``...) names its batch axis by
``'N'`` (no layout: axis 0; a layout without ``'N'``: not split, every device gets all
of it). Outputs carry no description, so their batch axis is found here too: from the
layouts given (``output_layouts``, what MXNet read from the symbol's ``__layout__``), or
else the first axis among the data's and 0 on which every device's copy holds its
samples. Pure functions of shapes and layouts: the group does the slicing and merging.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pskv.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["InputDesc", "batch_axis", "check_output_layouts", "input_descs", "integer_dtype", "output_axis"]


@dataclass(frozen=True)
class InputDesc:
    """Name, shape and batch axis of one bound input."""

    name: str
    shape: tuple[int, ...]
    axis: int  # batch axis; -1: not split (the whole array goes to every device)
    dtype: str | None = None  # a DataDesc's dtype name (output_shapes feeds integer zeros to an integer input)


def batch_axis(layout: str | None) -> int:
    """The batch axis of ``layout``: the place of its ``'N'`` (0 without a layout; -1 without an ``'N'``)."""
    return 0 if not layout else layout.find("N")


def input_descs(shapes: Iterable[Any] | None, what: str) -> list[InputDesc]:
    """DataDesc objects or ``(name, shape)`` pairs -> validated descriptions.

    Raises:
        InvalidTypeError: an item is neither.
        InvalidArgumentError: a shape has no batch axis of size >= 1 where its layout says.
    """
    if shapes is None:
        return []
    out = []
    for item in shapes:
        dtype = None
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            name, shape, layout = item[0], item[1], None
        elif hasattr(item, "name") and hasattr(item, "shape"):
            name, shape, layout = item.name, item.shape, getattr(item, "layout", None)
            dtype = getattr(item, "dtype", None)
        else:
            raise InvalidTypeError(f"{what} must be DataDesc objects or (name, shape) pairs, got {item!r}")
        shape = tuple(int(d) for d in shape)
        axis = batch_axis(layout)
        if axis >= 0 and (axis >= len(shape) or shape[axis] < 1):
            raise InvalidArgumentError(f"{what} {name!r}: shape {shape} has no batch axis {axis} of size >= 1")
        out.append(InputDesc(name, shape, axis, dtype if isinstance(dtype, str) else None))
    return out


def integer_dtype(name: str | None) -> torch.dtype | None:
    """The torch dtype of an integer dtype name (an input of ids, e.g. for an embedding); else None."""
    try:
        dt = np.dtype(name) if name is not None else None
    except TypeError:
        return None
    return torch.from_numpy(np.zeros(0, dt)).dtype if dt is not None and dt.kind in "iu" else None


def check_output_layouts(output_layouts: Sequence[str | None] | None) -> list[str | None] | None:
    """``output_layouts`` as a list (None stays None).

    Raises:
        InvalidTypeError: not a list of layout strings (or None).
    """
    if output_layouts is not None and (isinstance(output_layouts, str) or not all(
            layout is None or isinstance(layout, str) for layout in output_layouts)):
        raise InvalidTypeError(f"output_layouts must be a list of layout strings (or None), got {output_layouts!r}")
    return None if output_layouts is None else list(output_layouts)


def output_axis(k: int, shapes: list[tuple[int, ...]], sizes: list[int], output_layouts: Sequence[str | None] | None,
                default_axis: int) -> int:
    """The batch axis of output ``k``, whose copies have ``shapes`` for ``sizes`` samples; -1: not batched.

    Args:
        output_layouts: the layouts given per output (None, or shorter: guess the rest).
        default_axis: the first data input's batch axis, tried before 0 when guessing.

    Raises:
        InvalidArgumentError: its layout in ``output_layouts`` does not fit the shapes,
            or (no layout given) no candidate axis holds the samples in every copy.
    """
    if output_layouts is not None and k < len(output_layouts):
        layout = output_layouts[k]
        axis = batch_axis(layout)
        for shape, n in zip(shapes, sizes):
            if layout is not None and len(layout) != len(shape):
                raise InvalidArgumentError(f"output {k} has {len(shape)} dimension(s), its layout {layout!r} "
                                           f"(output_layouts) has {len(layout)}")
            if axis >= 0 and shape[axis] != n:
                raise InvalidArgumentError(f"output {k} of shape {shape}: its batch axis {axis} (layout "
                                           f"{layout!r}) holds {shape[axis]}, not the {n} samples of its batch")
        return axis
    if not shapes[0]:
        return -1
    candidates = dict.fromkeys((default_axis, 0))
    for axis in candidates:
        if all(axis < len(shape) and shape[axis] == n for shape, n in zip(shapes, sizes)):
            return axis
    raise InvalidArgumentError(f"output {k} of shape {shapes[0]} holds the {sizes[0]} samples of its batch slice "
                               f"on none of the axes {list(candidates)}; give its layout in output_layouts")
