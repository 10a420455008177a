"""The optimizer-state file: a safetensors file with a JSON document in its metadata.

No pickle: the file is plain tensors plus JSON, so loading it cannot run code. The
layout is described in ``docs/optimizers.md`` ("Optimizer state file format"):

* safetensors metadata ``{"format": "pskv.optimizer-states", "version": "1",
  "states": <JSON document>}``;
* the JSON document lists every key (value, ``"int"``/``"str"`` type, update count,
  and per state array its name, real dtype and tensor name) plus ``num_update`` and
  an optional optimizer config;
* tensor ``"<i>/<name>"`` holds state array ``name`` of the ``i``-th key; bfloat16
  arrays are stored as their raw ``uint16`` bit patterns (NumPy has no bfloat16).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from pskv.arrays import FLOAT_DTYPES, describe, numpy_dtype, to_numpy
from pskv.arrays.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from pskv.errors import CheckpointError, OptimizerStateError
from pskv.safefile import Source, Tensors, dump_tensors, load_tensors, parse_json, read_header, write_tensors

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "KeyStates",
    "StatesDocument",
    "encode_array",
    "decode_array",
    "dumps",
    "loads",
    "save",
    "load",
    "file_errors",
]

FORMAT_NAME = "pskv.optimizer-states"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class KeyStates:
    """The saved state of one key.

    Attributes:
        key: the store key.
        count: the key's update count.
        names: state array names, in the optimizer's order.
        dtypes: the real dtype name of each array (``"bfloat16"`` included).
        arrays: the arrays as stored (bfloat16 as ``uint16`` bits), on the CPU.
    """

    key: int | str
    count: int
    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    arrays: tuple[np.ndarray[Any, Any], ...]

    def values(self) -> list[np.ndarray[Any, Any]]:
        """The arrays as numbers (bfloat16 decoded to float32, exactly)."""
        return [decode_array(a, d) for a, d in zip(self.arrays, self.dtypes, strict=True)]


@dataclass(frozen=True)
class StatesDocument:
    """Everything a state file holds.

    Attributes:
        num_update: the optimizer's global update count.
        keys: per-key states, in file order.
        optimizer: an optimizer config (``Optimizer.to_config()``) or ``None``.
    """

    num_update: int
    keys: tuple[KeyStates, ...]
    optimizer: dict[str, Any] | None = None


def encode_array(x: Any) -> tuple[np.ndarray[Any, Any], str]:
    """A CPU NumPy array to store for ``x`` (any backend / device) and its real dtype name."""
    dtype = describe(x).dtype
    values = np.ascontiguousarray(to_numpy(x))
    if dtype == "bfloat16":  # float32 of a bfloat16 value: the low 16 bits are zero, converted exactly
        values = f32_to_bf16_bits(values)
    return values, dtype


def decode_array(stored: np.ndarray[Any, Any], dtype: str) -> np.ndarray[Any, Any]:
    """The numeric array for a stored one (``uint16`` bits -> float32 for bfloat16)."""
    if dtype == "bfloat16":
        return bf16_bits_to_f32(stored)
    return stored


def _storage_dtype(dtype: str) -> np.dtype[Any]:
    return np.dtype(np.uint16) if dtype == "bfloat16" else numpy_dtype(dtype)


def _encode(doc: StatesDocument) -> tuple[dict[str, np.ndarray[Any, Any]], dict[str, str]]:
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    entries = []
    for i, ks in enumerate(doc.keys):
        states = []
        for name, dtype, arr in zip(ks.names, ks.dtypes, ks.arrays, strict=True):
            tname = f"{i}/{name}"
            tensors[tname] = np.ascontiguousarray(arr)
            states.append({"name": name, "dtype": dtype, "tensor": tname})
        key_type = "int" if isinstance(ks.key, int) else "str"
        entries.append({"key": ks.key, "key_type": key_type, "count": ks.count, "states": states})
    body = {"num_update": doc.num_update, "keys": entries, "optimizer": doc.optimizer}
    meta = {"format": FORMAT_NAME, "version": str(FORMAT_VERSION), "states": json.dumps(body, allow_nan=False)}
    return tensors, meta


def dumps(doc: StatesDocument) -> bytes:
    """Serialise ``doc`` to the bytes of a state file."""
    return dump_tensors(*_encode(doc))


def save(fname: str | os.PathLike[str], doc: StatesDocument) -> None:
    """Write ``doc`` to ``fname`` atomically (temporary file in the same folder, then rename).

    Raises:
        OSError: the file could not be written (its folder must exist).
    """
    write_tensors(fname, *_encode(doc), make_dirs=False)


@contextmanager
def file_errors(op: str, fname: str | os.PathLike[str]) -> Iterator[None]:
    """A store's ``op`` (``save_optimizer_states`` / ``load_optimizer_states``) on ``fname``: an OSError
    becomes an OptimizerStateError naming the call and the file (a pskv error, as every store raises)."""
    try:
        yield
    except OSError as exc:
        name = exc.filename if isinstance(exc.filename, str) else os.fspath(fname)
        raise OptimizerStateError(f"{op}: cannot {'write' if op.startswith('save') else 'read'} {name}: "
                                  f"{exc.strerror or exc}") from None


def _bad(what: str) -> OptimizerStateError:
    return OptimizerStateError(f"malformed optimizer state file: {what}")


def _metadata(source: Source) -> dict[str, str]:
    """The metadata of a state file (its header only), its format and version checked."""
    foreign = OptimizerStateError(
        f"not a pskv optimizer state file (expected a safetensors file of format {FORMAT_NAME!r})"
    )
    try:
        meta, _ = read_header(source)
    except CheckpointError:
        raise foreign from None
    if meta.get("format") != FORMAT_NAME:
        raise foreign
    if meta.get("version") != str(FORMAT_VERSION):
        raise OptimizerStateError(
            f"unsupported optimizer state file version {meta.get('version')!r} (this pskv reads version {FORMAT_VERSION})"
        )
    return meta


def _field(obj: Any, name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or name not in obj:
        raise _bad(f"{where}: missing {name!r}")
    value = obj[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _bad(f"{where}: {name!r} has the wrong type ({value!r})")
    return value


def _decode(meta: dict[str, str], tensors: Tensors) -> StatesDocument:
    body = parse_json(meta.get("states", ""), "the 'states' metadata", _bad)
    num_update = _field(body, "num_update", int, "document")
    entries = _field(body, "keys", list, "document")
    optimizer = body.get("optimizer") if isinstance(body, dict) else None
    if optimizer is not None and not isinstance(optimizer, dict):
        raise _bad("'optimizer' must be a config object or null")
    if num_update < 0:
        raise _bad("num_update is negative")
    keys: list[KeyStates] = []
    seen: set[Any] = set()
    used: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"key entry {i}"
        key = _field(entry, "key", (int, str), where)
        key_type = _field(entry, "key_type", str, where)
        if key_type != ("int" if isinstance(key, int) else "str"):
            raise _bad(f"{where}: key {key!r} does not have key_type {key_type!r}")
        if key in seen:
            raise _bad(f"duplicate key {key!r}")
        seen.add(key)
        count = _field(entry, "count", int, where)
        if count < 0:
            raise _bad(f"{where}: negative count")
        names, dtypes, arrays = [], [], []
        for j, st in enumerate(_field(entry, "states", list, where)):
            swhere = f"{where}, state {j}"
            name = _field(st, "name", str, swhere)
            dtype = _field(st, "dtype", str, swhere)
            tname = _field(st, "tensor", str, swhere)
            if dtype not in FLOAT_DTYPES or name in names:
                raise _bad(f"{swhere}: bad dtype {dtype!r} or repeated name {name!r}")
            arr = tensors.get(tname)
            if arr is None:
                raise OptimizerStateError(f"optimizer state file is missing tensor {tname!r} (key {key!r})")
            if arr.dtype != _storage_dtype(dtype):
                raise _bad(f"tensor {tname!r} is stored as {arr.dtype}, expected storage for {dtype}")
            used.add(tname)
            names.append(name)
            dtypes.append(dtype)
            arrays.append(arr)
        keys.append(KeyStates(key, count, tuple(names), tuple(dtypes), tuple(arrays)))
    extra = sorted(set(tensors) - used)
    if extra:
        raise _bad(f"tensors not described by the metadata: {', '.join(extra[:5])}")
    return StatesDocument(num_update, tuple(keys), optimizer)


def loads(data: bytes) -> StatesDocument:
    """Parse the bytes of a state file.

    Raises:
        OptimizerStateError: not a pskv state file, unknown version, malformed
            metadata or missing / unexpected tensors.
    """
    return _decode(*_read(bytes(data), "corrupted optimizer state file"))


def load(fname: str | os.PathLike[str]) -> StatesDocument:
    """Read a state file written by :func:`save`.

    Raises:
        OptimizerStateError: as :func:`loads`.
        OSError: the file cannot be read.
    """
    return _decode(*_read(fname, f"corrupted optimizer state file {os.fspath(fname)!r}"))


def _read(source: Source, corrupted: str) -> tuple[dict[str, str], Tensors]:
    """A state file's checked metadata and its tensors; ``corrupted`` starts the error of a damaged one."""
    meta = _metadata(source)
    try:
        return meta, load_tensors(source)
    except CheckpointError as exc:
        raise OptimizerStateError(f"{corrupted}: {exc.__cause__ or exc}") from exc
