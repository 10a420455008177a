"""Where keys live on the servers: key numbering and splitting of big arrays. Pure functions.

* A store key becomes a *server key*, a signed 64-bit int: int keys are used as they
  are; str keys are hashed (BLAKE2b, 63 bits) — the same on every worker whatever order
  they were initialised in (MXNet numbered str keys by init order, so workers with
  different orders silently swapped values).
* Arrays with at least ``bigarray_bound`` elements are split into one contiguous slice
  per server; smaller ones go whole to one server chosen by a stable hash of the key.
* Every slice longer than ``max_part`` elements is cut again into near-equal pieces of at
  most that many: each piece is a part of its own on the server, with its own round, so
  a big value travels as a pipeline of pieces (the server sums piece ``i`` while ``i + 1``
  arrives and answers each as soon as its round completes).
"""

from __future__ import annotations

import hashlib

from pskv.errors import KeyTypeError

__all__ = ["Key", "server_key", "home_server", "split", "row_ranges"]

Key = int | str  # a store key (one store uses one kind); pskv's one definition, below every user of it

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MASK64 = (1 << 64) - 1


def server_key(key: int | str) -> int:
    """The server key of a store key.

    Raises:
        KeyTypeError: an int key outside the signed 64-bit range.
    """
    if isinstance(key, str):
        digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
        return int.from_bytes(digest, "little") & _INT64_MAX
    if not _INT64_MIN <= key <= _INT64_MAX:
        raise KeyTypeError(f"int key {key} does not fit in 64 bits")
    return key


def _mix(x: int) -> int:
    """SplitMix64 finaliser: spreads consecutive keys evenly."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def home_server(skey: int, num_servers: int) -> int:
    """The server holding a small key."""
    return _mix(skey & _MASK64) % num_servers


def split(skey: int, size: int, num_servers: int, bound: int, max_part: int = 0) -> list[tuple[int, int, int]]:
    """``(server rank, element offset, element count)`` for each part of a key's value.

    Big values (``size >= bound``) get one contiguous slice per server (boundaries
    ``size * i // S``); smaller ones one part on :func:`home_server`. With ``max_part``
    > 0, a slice of more elements is cut into ``ceil(n / max_part)`` near-equal pieces,
    in order, on the same server. Every worker must use the same arguments.
    """
    if size >= bound and num_servers > 1:
        cuts = [size * i // num_servers for i in range(num_servers + 1)]
        slices = [(s, cuts[s], cuts[s + 1] - cuts[s]) for s in range(num_servers)]
    else:
        slices = [(home_server(skey, num_servers), 0, size)]
    if max_part <= 0 or all(n <= max_part for _, _, n in slices):
        return slices
    parts: list[tuple[int, int, int]] = []
    for server, offset, n in slices:
        k = -(-n // max_part)
        parts.extend((server, offset + n * j // k, n * (j + 1) // k - n * j // k) for j in range(k))
    return parts


def row_ranges(num_rows: int, num_servers: int) -> list[tuple[int, int, int]]:
    """``(server rank, first row, row count)`` of each server holding rows of a row-sparse key.

    Server ``s`` holds rows ``[num_rows * s // S, num_rows * (s + 1) // S)``; servers whose
    range is empty (fewer rows than servers) hold no part. The ranges are in row order.
    """
    cuts = [num_rows * s // num_servers for s in range(num_servers + 1)]
    return [(s, cuts[s], cuts[s + 1] - cuts[s]) for s in range(num_servers) if cuts[s + 1] > cuts[s]]
