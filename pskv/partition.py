"""Where keys live on the servers: key numbering and the placement of values' partitions. Pure functions.

* A store key becomes a *server key*, a signed 64-bit int: int keys are used as they
  are; str keys are hashed (BLAKE2b, 63 bits) — the same on every worker whatever order
  they were initialised in (MXNet numbered str keys by init order, so workers with
  different orders silently swapped values).
* **Even placement** (the default, ``bigarray_bound`` 0): a value of ``B`` bytes is cut into
  ``k = min(S, B // MIN_SLICE_BYTES)`` (at least 1) near-equal contiguous slices, one per
  server: slice ``j`` on server ``j`` when ``k = S``, else on ``(home + j) % S`` from the
  key's hashed home server. So every server holds the same share (to one element) of
  every value of at least ``S * MIN_SLICE_BYTES``, and only smaller values are placed by
  hash; their bytes are too few to unbalance a real model (ResNet-50, a BERT-like and an
  MLP list: every server within 1 % of the mean bytes per step for S = 2..8, where whole
  values below a bound gave 13-31 %; tests/unit/test_placement.py). A slice is cut again
  into near-equal *partitions* of at most ``part_bytes``: each is a part of its own on its
  server, with its own round, so a value travels as a pipeline (the server sums
  partition ``i`` while ``i + 1`` arrives and answers each as soon as its round completes).
  The placement is a pure function of (server key, size, item size, S, the two settings):
  the same on every worker whatever order keys are initialised in, the same for a
  replacement server (it takes over its rank's partitions) and recorded in checkpoints
  (:func:`placement_name`). It is BytePS's partitioning with its hash of each partition
  replaced by an equal deal, which needs no table and cannot be uneven.
* **MXNet's rule** (``bigarray_bound`` > 0, ``MXNET_KVSTORE_BIGARRAY_BOUND``): values of at
  least that many elements get one slice per server, smaller ones go whole to their home
  server; slices are cut into partitions as above.

The partition size (``PSKV_PART_BYTES``, by default
:attr:`pskv.config.ClusterConfig.part_size`) is also the most value bytes of one socket
message. It is chosen from the link and the model:

* on one host the link is memory: 4 MiB (BytePS's default), as few messages and parts
  as the servers' pipeline needs, since each costs CPU time (1 MiB partitions cost
  ResNet-50 ~50 % more CPU per step than 4 MiB ones there);
* between hosts 1 MiB. A message costs a fixed ~0.1-0.2 ms of Python at both ends, so
  it should take at least ~3 ms on the wire for that cost to stay under 5 % (112 KB at
  300 Mbit/s, 375 KB at 1 Gbit/s, 1.1 MB at 3 Gbit/s); and a step's pipeline fills and
  drains in about two partitions' time, under 5 % of the step when the step moves at
  least ~40 partitions (2.5 MB ones for ResNet-50's 102 MB, 350 KB for a 14 MB
  MobileNet). 1 MiB meets both for links up to ~3 Gbit/s and models from ~40 MB; links
  of 10 Gbit/s and more want 4 MiB, small models on slow links 256 KiB.

Between hosts a slice is also cut into at least 8 partitions, and at least 2 per server (``pieces``,
:attr:`pskv.config.ClusterConfig.part_pieces`: 16 with 8 servers), of at least :data:`MIN_PIECE_BYTES`:
a call of one value (a gradient bucket) is a pipeline only if each server has several of its
partitions, and a partition's round (a piece from each of W workers) stays small as W grows.
Every worker sends a call's messages to the servers in turn, starting at its own rank's server
(:func:`pskv.worker.layout.by_server`), so the servers receive from the workers in parallel
instead of all from server 0 first; partition ``j`` of every server then completes after
about ``j + 1`` turns and its reply comes down the worker's link while partitions ``j + 1 ..``
still go up (full duplex for all but the last of 8 turns). On one host (memory, where each
partition costs CPU and the pipeline is not the link's) slices are not cut further.

:data:`MIN_SLICE_BYTES` (16 KiB) is the smallest slice worth a message of its own:
smaller ones would make a single-key call of a small value wait on several servers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from pskv.errors import KeyTypeError

__all__ = ["Key", "MIN_PIECE_BYTES", "MIN_SLICE_BYTES", "bytes_per_server", "home_server", "placement_name",
           "row_ranges", "server_key", "split"]

Key = int | str  # a store key (one store uses one kind); pskv's one definition, below every user of it

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MASK64 = (1 << 64) - 1

#: the smallest slice of a value the even placement gives a server of its own
MIN_SLICE_BYTES = 16 << 10
#: the smallest partition a slice is cut into to make a pipeline of it (``pieces``), at least ~3 ms at 300 Mbit/s
MIN_PIECE_BYTES = 128 << 10


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


def split(skey: int, size: int, num_servers: int, bound: int, max_part: int = 0,
          itemsize: int = 4, pieces: int = 1) -> list[tuple[int, int, int]]:
    """``(server rank, element offset, element count)`` of each partition of a key's value, in order.

    ``bound`` 0: the even placement (``size * itemsize`` bytes over up to ``num_servers``
    slices of at least :data:`MIN_SLICE_BYTES`); ``bound`` > 0: MXNet's rule (``size >=
    bound``: one slice per server, else one on :func:`home_server`). Slice boundaries are
    ``size * j // k``. With ``max_part`` > 0, a slice of more elements is cut into
    ``ceil(n / max_part)`` near-equal partitions, in order, on the same server; with
    ``pieces`` > 1 into at least that many, each of at least :data:`MIN_PIECE_BYTES` (the
    pipeline of one value: see the module docstring). Every worker must use the same arguments.
    """
    if bound > 0:
        k = num_servers if size >= bound else 1
    else:
        k = min(num_servers, max(1, size * itemsize // MIN_SLICE_BYTES))
    home = 0 if k == num_servers else home_server(skey, num_servers)
    cuts = [size * j // k for j in range(k + 1)]
    slices = [((home + j) % num_servers, cuts[j], cuts[j + 1] - cuts[j]) for j in range(k)]
    if max_part <= 0:
        return slices
    floor = max(MIN_PIECE_BYTES // itemsize, 1)
    parts: list[tuple[int, int, int]] = []
    for server, offset, n in slices:
        longest = min(max_part, max(-(-n // pieces), floor)) if pieces > 1 else max_part
        cut = max(-(-n // longest), 1)
        parts.extend((server, offset + n * j // cut, n * (j + 1) // cut - n * j // cut) for j in range(cut))
    return parts


def bytes_per_server(values: Iterable[tuple[int, int, int]], num_servers: int, bound: int,
                     part_bytes: int, pieces: int = 1) -> list[int]:
    """Bytes each server holds (and sends each worker per step) of ``values``: ``(server key, size, itemsize)``.

    The placement of :func:`split` with the settings a worker uses (``part_bytes`` as
    ``PSKV_PART_BYTES``); for checks and benchmarks.
    """
    held = [0] * num_servers
    for skey, size, itemsize in values:
        max_part = max(part_bytes // itemsize, 1) if part_bytes > 0 else 0
        for server, _, n in split(skey, size, num_servers, bound, max_part, itemsize, pieces):
            held[server] += n * itemsize
    return held


def placement_name(bound: int, part_bytes: int, pieces: int = 1) -> str:
    """The placement of a job's settings, as its checkpoints record it: equal names, equal placements."""
    rule = "" if bound > 0 else f" (even placement, slices of >= {MIN_SLICE_BYTES} bytes)"
    cut = f" (slices cut into >= {pieces} partitions of >= {MIN_PIECE_BYTES} bytes)" if pieces > 1 else ""
    return f"MXNET_KVSTORE_BIGARRAY_BOUND={bound} PSKV_PART_BYTES={part_bytes}{rule}{cut}"


def row_ranges(num_rows: int, num_servers: int) -> list[tuple[int, int, int]]:
    """``(server rank, first row, row count)`` of each server holding rows of a row-sparse key.

    Server ``s`` holds rows ``[num_rows * s // S, num_rows * (s + 1) // S)``; servers whose
    range is empty (fewer rows than servers) hold no part. The ranges are in row order.
    """
    cuts = [num_rows * s // num_servers for s in range(num_servers + 1)]
    return [(s, cuts[s], cuts[s + 1] - cuts[s]) for s in range(num_servers) if cuts[s + 1] > cuts[s]]
