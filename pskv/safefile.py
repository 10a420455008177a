"""pskv's one file mechanism: a safetensors file of NumPy tensors, its metadata a JSON document.

Every pskv file that holds arrays is a safetensors file (no pickle: loading one cannot run
code). Two layouts of its string metadata exist:

* the *document* layout (server checkpoints, worker residuals, a training checkpoint's
  residuals and tables): one metadata entry ``"pskv"``, a JSON object whose ``"format"``
  and ``"version"`` name the file's kind; :func:`write_document` / :func:`read_document`;
* the optimizer-state file (:mod:`pskv.optimizer.states`), older and documented in
  ``docs/optimizers.md``, keeps its own entries; it uses the tensor-level functions
  (:func:`write_tensors`, :func:`dump_tensors`, :func:`read_header`, :func:`load_tensors`),
  which also read a file's content from ``bytes``.

Files are written atomically (:mod:`pskv.atomic`): a crash leaves the old file or the new
one. A header is parsed within safetensors' own size limit before any tensor is read.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load, load_file, save, save_file

from pskv.atomic import write_atomic
from pskv.errors import CheckpointError

__all__ = [
    "DOCUMENT",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "Source",
    "Tensors",
    "dump_tensors",
    "load_tensors",
    "parse_json",
    "read_document",
    "read_header",
    "read_json",
    "write_document",
    "write_tensors",
]

DOCUMENT = "pskv"  # the metadata entry that holds the JSON document
MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on a header
Tensors: TypeAlias = dict[str, np.ndarray[Any, Any]]
Source: TypeAlias = str | os.PathLike[str] | bytes  # a file, or a file's content
MAX_JSON_BYTES = 64 * 1024 * 1024  # a JSON file pskv reads (manifest, meta, ...): its largest size
MAX_JSON_DEPTH = 64  # its deepest nesting of arrays and objects (pskv writes at most 4)


def _depth(doc: Any) -> int:
    """How deep a parsed JSON document nests arrays and objects (a walk without recursion)."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        obj, depth = todo.pop()
        if isinstance(obj, (dict, list)):
            deepest = max(deepest, depth)
            todo.extend((v, depth + 1) for v in (obj.values() if isinstance(obj, dict) else obj)
                        if isinstance(v, (dict, list)))
    return deepest


def parse_json(text: str | bytes, where: str, error: Callable[[str], Exception] = CheckpointError, *,
               max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``text`` parsed as JSON within pskv's bounds; every JSON a pskv process reads goes through here.

    ``where`` names the file (or the entry of one) in the error; ``error`` makes the caller's typed
    error (``CheckpointError``, ``OptimizerStateError``) of its message.

    Raises:
        error: ``text`` is larger than ``max_bytes``, nests deeper than ``max_depth``, or is not JSON.
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if len(data) > max_bytes:
        raise error(f"{where} is too large ({len(data):,} bytes of JSON; at most {max_bytes:,})")
    try:
        doc = json.loads(data)  # the parser's recursion stops at the interpreter's limit
        deep = _depth(doc) > max_depth
    except RecursionError:
        deep = True
    except (UnicodeDecodeError, ValueError) as exc:
        raise error(f"{where} is not JSON: {exc}") from None
    if deep:
        raise error(f"{where} nests deeper than {max_depth} levels of JSON arrays and objects")
    return doc


def read_json(path: str | os.PathLike[str], error: Callable[[str], Exception] = CheckpointError, *,
              max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON file ``path`` parsed within pskv's bounds (:func:`parse_json`); its size is checked
    before it is read.

    Raises:
        FileNotFoundError: there is no such file.
        error: it cannot be read, is too large, too deep, or not JSON (naming it).
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise error(f"{os.fspath(path)} is too large ({size:,} bytes of JSON; at most {max_bytes:,})")
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise error(f"{os.fspath(path)} is unreadable: {exc}") from exc
    return parse_json(data, os.fspath(path), error, max_bytes=max_bytes)


def _name(source: Source) -> str:
    return "the data" if isinstance(source, bytes) else os.fspath(source)


def write_tensors(path: str | os.PathLike[str], tensors: Mapping[str, np.ndarray[Any, Any]],
                  metadata: Mapping[str, str], *, make_dirs: bool = True) -> None:
    """Write ``tensors`` (contiguous NumPy arrays) with string ``metadata`` to ``path``, atomically;
    its folder is created unless ``make_dirs`` is false.

    Raises:
        OSError: the file could not be written.
    """
    def write(tmp: Path) -> None:
        try:
            save_file(dict(tensors), str(tmp), metadata=dict(metadata))
        except SafetensorError as exc:  # its I/O errors (a full disk) are OSErrors to every caller
            raise OSError(f"cannot write {path}: {exc}") from exc

    write_atomic(path, write, make_dirs=make_dirs)


def dump_tensors(tensors: Mapping[str, np.ndarray[Any, Any]], metadata: Mapping[str, str]) -> bytes:
    """The bytes of the file :func:`write_tensors` writes."""
    return bytes(save(dict(tensors), metadata=dict(metadata)))


def read_header(source: Source) -> tuple[dict[str, str], tuple[str, ...]]:
    """A file's metadata and tensor names, from its header only (no tensor is read).

    Raises:
        CheckpointError: not a safetensors file (naming the file).
        OSError: the file cannot be read.
    """
    if isinstance(source, bytes):
        prefix, total = source[: 8 + MAX_HEADER], len(source)
    else:
        with open(source, "rb") as f:
            prefix, total = f.read(8), os.fstat(f.fileno()).st_size
            if len(prefix) == 8 and struct.unpack("<Q", prefix)[0] <= min(MAX_HEADER, total - 8):
                prefix += f.read(struct.unpack("<Q", prefix)[0])
    bad = CheckpointError(f"{_name(source)} is not a safetensors file")
    if len(prefix) < 8:
        raise bad
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER or 8 + n > total or len(prefix) < 8 + n:
        raise bad
    try:
        header = parse_json(prefix[8 : 8 + n], f"the header of {_name(source)}", max_bytes=MAX_HEADER)
    except CheckpointError:
        raise bad from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(header, dict) or not isinstance(meta or {}, dict):
        raise bad
    return dict(meta or {}), tuple(k for k in header if k != "__metadata__")


def load_tensors(source: Source) -> Tensors:
    """Every tensor of a file, as NumPy arrays.

    Raises:
        CheckpointError: the file is truncated or damaged (naming it and why).
        OSError: the file cannot be read.
    """
    try:
        return load(source) if isinstance(source, bytes) else load_file(os.fspath(source))
    except (SafetensorError, ValueError) as exc:  # ValueError: a dtype NumPy cannot hold
        raise CheckpointError(f"{_name(source)} is damaged: {exc}") from exc


def write_document(path: str | os.PathLike[str], fmt: str, version: int, doc: Mapping[str, Any],
                   tensors: Mapping[str, np.ndarray[Any, Any]], *, writer: str | None = None) -> None:
    """Write ``tensors`` and the JSON document ``{"format": fmt, "version": version, **doc}``
    to ``path``, atomically (its folder is created).

    ``writer`` (``"server 0"``), when given, turns a failed write into a ``CheckpointError``
    that names it and the path.

    Raises:
        OSError: the file could not be written (no ``writer``).
        CheckpointError: the same, with a ``writer``.
    """
    document = json.dumps({"format": fmt, "version": version, **doc})
    try:
        write_tensors(path, tensors, {DOCUMENT: document})
    except OSError as exc:
        if writer is None:
            raise
        raise CheckpointError(f"{writer} could not write {path}: {exc}") from exc


def read_document(path: str | os.PathLike[str], fmt: str, version: int, *,
                  what: str = "pskv file") -> tuple[dict[str, Any], Tensors]:
    """The JSON document and the tensors of a file :func:`write_document` wrote as ``fmt``
    ``version``; the document keeps its ``format`` and ``version`` entries.

    ``what`` names the kind of file in the errors (``"pskv server checkpoint"``).

    Raises:
        CheckpointError: missing, unreadable, truncated, not a ``fmt`` file, or of another
            version; the message names the path.
    """
    try:
        meta, _ = read_header(path)
        doc = parse_json(meta[DOCUMENT], f"the {DOCUMENT!r} metadata")
        tensors = load_tensors(path)
    except (CheckpointError, OSError, KeyError, ValueError) as exc:
        reason = f"no {DOCUMENT!r} metadata" if isinstance(exc, KeyError) else str(exc)
        raise CheckpointError(f"{path} is not a {what}: {reason}") from exc
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        got = doc.get("format") if isinstance(doc, dict) else None
        raise CheckpointError(f"{path} is not a {what} (format {got!r})")
    if doc.get("version") != version:
        raise CheckpointError(f"{path}: unsupported {what} version {doc.get('version')!r} "
                              f"(this pskv reads version {version})")
    return doc, tensors
