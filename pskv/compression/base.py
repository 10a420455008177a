"""The compressor interface and the registry of types (residuals: :mod:`pskv.compression.residuals`).

A compressor turns a float32 gradient (1-D, contiguous) into a payload of bytes and
back. ``compress`` adds the key's *residual* first (what earlier compressions left out)
and keeps what this one leaves out in it, as MXNet's 2-bit compression and BytePS's
error feedback do; ``decompress`` gives the float32 values the receiver sums. Every
compressor is vectorised NumPy: no Python loop over elements. The payload's size
depends only on the element count (:meth:`Compressor.payload_bytes`), so a receiver
checks it before it decodes anything.

``create(params)`` builds one from the dict users pass to
``kv.set_gradient_compression`` (``{'type': '2bit', 'threshold': 0.5}``); its
:attr:`Compressor.params` are that dict, complete and JSON-able (for servers and
checkpoints).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from pskv._registry import Registry
from pskv.errors import InvalidArgumentError

__all__ = ["Compressor", "COMPRESSORS", "create", "register"]

#: The compression types by name (:class:`~pskv._registry.Registry`: another class under a taken name raises).
COMPRESSORS: Registry[type[Compressor]] = Registry("gradient compression type")


def register(cls: type[Compressor]) -> type[Compressor]:
    """Class decorator: make ``cls`` available to :func:`create` under ``cls.type``.

    Raises:
        InvalidArgumentError: another class is registered under ``cls.type``.
    """
    return COMPRESSORS.add(cls.type, cls)


class Compressor(abc.ABC):
    """One compression type with its parameters.

    Subclasses declare ``type`` and ``defaults`` (every parameter with its default) and
    check their values in ``__init__`` (``InvalidArgumentError`` naming the parameter).
    """

    type: ClassVar[str]
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, **params: Any) -> None:
        unknown = sorted(set(params) - set(self.defaults) - {"type"})
        if unknown:
            raise InvalidArgumentError(f"gradient compression {self.type!r}: unknown parameter(s) {unknown}; "
                                       f"it takes {sorted(self.defaults)}")
        self._params = {**self.defaults, **{k: v for k, v in params.items() if k != "type"}}

    @property
    def params(self) -> dict[str, Any]:
        """The parameters, complete: ``create(c.params)`` makes an equal compressor."""
        return {"type": self.type, **self._params}

    def _float(self, name: str, *, positive: bool = False, low: float | None = None,
               high: float | None = None) -> float:
        """Parameter ``name`` as a float, checked."""
        value = self._params[name]
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise InvalidArgumentError(f"gradient compression {self.type!r}: {name} must be a number, got {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise InvalidArgumentError(f"gradient compression {self.type!r}: {name} must be a number, "
                                       f"got {value!r}") from None
        if not math.isfinite(number) or (positive and number <= 0) or (low is not None and number < low) \
                or (high is not None and number > high):
            bound = " > 0" if positive else f" in [{low}, {high}]" if low is not None else ""
            raise InvalidArgumentError(f"gradient compression {self.type!r}: {name} must be a finite number{bound}, "
                                       f"got {value!r}")
        self._params[name] = number
        return number

    @abc.abstractmethod
    def payload_bytes(self, n: int) -> int:
        """Bytes of the payload of ``n`` elements."""

    @abc.abstractmethod
    def compress(self, grad: np.ndarray[Any, Any], residual: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
        """The payload (uint8, :meth:`payload_bytes` long) of ``grad`` (float32, 1-D).

        With ``residual`` (float32, like ``grad``) the residual is added first and left
        holding what the payload does not carry (updated in place).
        """

    @abc.abstractmethod
    def decompress(self, payload: Any, n: int) -> np.ndarray[Any, Any]:
        """The float32 values (``n`` of them) a payload made by :meth:`compress` stands for.

        Raises:
            InvalidArgumentError: the payload's length is not :meth:`payload_bytes` of ``n``.
        """

    def _bytes(self, payload: Any, n: int) -> np.ndarray[Any, Any]:
        """``payload`` as uint8, its length checked."""
        data = np.frombuffer(payload, np.uint8) if not isinstance(payload, np.ndarray) else payload.view(np.uint8)
        if data.size != self.payload_bytes(n):
            raise InvalidArgumentError(f"gradient compression {self.type!r}: a payload of {data.size} bytes for "
                                       f"{n} elements (expected {self.payload_bytes(n)})")
        return data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Compressor) and self.params == other.params

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.params.items())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._params.items())})"


def create(params: Mapping[str, Any]) -> Compressor:
    """The compressor ``params`` describes: ``{'type': name, **parameters}``.

    Raises:
        InvalidArgumentError: no ``type``, an unknown type, an unknown parameter or a bad value.
        InvalidTypeError: ``params`` is not a mapping.
    """
    if not isinstance(params, Mapping):
        from pskv.errors import InvalidTypeError
        raise InvalidTypeError(f"gradient compression parameters must be a dict like {{'type': '2bit', "
                               f"'threshold': 0.5}}, got {type(params).__name__}")
    kind = params.get("type")
    if not isinstance(kind, str) or kind not in COMPRESSORS.names():  # exact names: "2BIT" is none
        raise InvalidArgumentError(f"unknown gradient compression type {kind!r}; known: {COMPRESSORS.names()}")
    return COMPRESSORS[kind](**params)

