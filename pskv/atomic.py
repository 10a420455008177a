"""Atomic file writes: a file appears whole or not at all, even if the process dies.

Write under a temporary name in the same directory, flush it to disk, rename it into
place, then flush the directory entry. Used by every file of tensors (:mod:`pskv.safefile`)
and the checkpoints' JSON files (:mod:`pskv.checkpoints`, :mod:`pskv.parallel.checkpoint`).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["fsync_dir", "write_atomic", "write_text_atomic"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (a rename in it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], write: Callable[[Path], object], *, make_dirs: bool = True) -> None:
    """Call ``write(tmp_path)``, flush the file to disk and rename it to ``path``.

    The directory is created if needed (unless ``make_dirs`` is false: then a missing one
    is an error); a failed ``write`` leaves no temporary file.

    Raises:
        OSError: the file could not be written or renamed.
    """
    target = Path(path)
    if make_dirs:
        target.parent.mkdir(parents=True, exist_ok=True)
    elif not target.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(target.parent))
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(target.parent)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """:func:`write_atomic` of a UTF-8 text."""
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
