"""The array layer: NumPy arrays and PyTorch tensors behind one small set of functions.

Layering: ``arrays`` depends only on ``errors``; everything above it (optimizers,
stores) handles values through this package and never branches on the array kind.
"""

from pskv.arrays.backend import (
    Array,
    ArrayMeta,
    clone,
    copy_into,
    describe,
    empty,
    fan_out_many,
    from_wire,
    is_array,
    is_torch,
    signature,
    sum_into,
    sum_into_many,
    take_rows,
    to_numpy,
    wire_view,
)
from pskv.arrays.dtypes import FLOAT_DTYPES, SUPPORTED_DTYPES, is_float, itemsize, numpy_dtype, torch_dtype
from pskv.arrays.kernels import CpuKernels

__all__ = [
    "Array",
    "ArrayMeta",
    "CpuKernels",
    "FLOAT_DTYPES",
    "SUPPORTED_DTYPES",
    "clone",
    "copy_into",
    "describe",
    "empty",
    "fan_out_many",
    "is_array",
    "is_float",
    "is_torch",
    "itemsize",
    "numpy_dtype",
    "signature",
    "sum_into",
    "sum_into_many",
    "take_rows",
    "to_numpy",
    "from_wire",
    "wire_view",
    "torch_dtype",
]
