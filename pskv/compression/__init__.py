"""Gradient compression: MXNet's ``2bit`` and ``1bit`` quantizers, with per-key residuals.

``kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})`` on a store picks one
(:func:`create`); each type is a :class:`Compressor` in its own module, registered by
name (:data:`COMPRESSORS`).
"""

from pskv.compression.base import COMPRESSORS, Compressor, Residuals, create, register
from pskv.compression.quantize import OneBit, TwoBit

__all__ = ["COMPRESSORS", "Compressor", "OneBit", "Residuals", "TwoBit", "create", "register"]
