"""Gradient compression: MXNet's ``2bit`` and ``1bit`` quantizers, BytePS's ``onebit``,
``topk``, ``randomk`` and ``dithering``, and ``fp16`` / ``bf16`` casting, with per-key residuals.

``kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})`` on a store picks one
(:func:`create`); each type is a :class:`Compressor` in its own module, registered by
name (:data:`COMPRESSORS`); the residuals and their checkpoint files are :mod:`pskv.compression.residuals`.
"""

from pskv.compression.base import COMPRESSORS, Compressor, create, register
from pskv.compression.cast import BFloat16, Float16
from pskv.compression.quantize import OneBit, TwoBit
from pskv.compression.residuals import Residuals
from pskv.compression.sparsify import Dithering, FeedbackCompressor, RandomK, ScaledSign, TopK

__all__ = ["BFloat16", "COMPRESSORS", "Compressor", "Dithering", "FeedbackCompressor", "Float16", "OneBit",
           "RandomK", "Residuals", "ScaledSign", "TopK", "TwoBit", "create", "register"]
