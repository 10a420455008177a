"""The store keys of a Trainer's buckets: one key per bucket, or, when the servers run the optimizer, its chunks.

Why chunks: a server with an updater applies it once to its whole slice of a key (the pieces of a
cut slice are updated together, so the updater sees one state and one update count:
:meth:`pskv.server.shard.ServerShard._complete`), and only then answers the slice's pulls. Between
hosts a slice is cut into pieces of at least :data:`~pskv.partition.MIN_PIECE_BYTES` meant to be a
pipeline (:mod:`pskv.partition`); behind the updater it is none: a 4 MB bucket's new weights leave
a server only once the bucket's last gradient piece arrived, so the pushes and the replies take
turns on the links (``bench/bench_train_hosts.py``: 1.2 s per step where full duplex takes 0.6 s).
Cut into chunks of one piece per server, each chunk's update and reply follow its own pushes while
later chunks are still going up, as the pure sums of ``update_on_kvstore=False`` do; one call per
chunk, all of the same priority (:meth:`StoreKeys.calls`, :meth:`StoreKeys.priority`).

The result is the same: pskv's optimizers are elementwise, each chunk key counts its updates as the
bucket key did (``num_update`` is the largest count), and keys named after parameters (per-key
``lr_mult`` / ``wd_mult``) are never cut. A chunk's bytes are the servers' count times
:data:`CHUNK_SLICE_BYTES` between hosts (``part_pieces`` > 1), or times the partition size on one
host (slices of up to 4 MiB stay whole there, so only very big buckets are cut).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pskv.config import ClusterConfig
from pskv.kvstore import KVStoreBase
from pskv.partition import MIN_PIECE_BYTES

__all__ = ["CHUNK_SLICE_BYTES", "StoreKeys", "chunk_bytes"]

#: a chunk's bytes per server between hosts: below the smallest piece a slice is cut into
#: (:data:`~pskv.partition.MIN_PIECE_BYTES`), so each server's slice of a chunk is one piece. A step
#: ends with the last chunk's update and reply behind its last pushed piece: half a piece made the
#: Trainer's steps ~10 % shorter than a whole one in ``bench_train_hosts.py`` (100 Mbit/s, 4 servers),
#: a quarter no shorter still, for twice the messages.
CHUNK_SLICE_BYTES = MIN_PIECE_BYTES // 2


def chunk_bytes(kv: KVStoreBase | None, update_on_kvstore: bool) -> int:
    """The most bytes of one store key of a bucket (0: buckets are not cut).

    Only synchronous distributed stores whose servers run the optimizer cut: elsewhere every
    piece is answered on its own (sums, async updates) or there are no servers.
    """
    if kv is None or not update_on_kvstore or not kv.store_type.distributed or not kv.store_type.sync:
        return 0
    # the dist store's settings and server count (private: no other store has them)
    cluster, servers = getattr(kv, "_cluster", None), getattr(kv, "_num_servers", 0)
    if not isinstance(cluster, ClusterConfig) or not isinstance(servers, int) or servers < 1 or not cluster.part_size:
        return 0
    return servers * (CHUNK_SLICE_BYTES if cluster.part_pieces > 1 else cluster.part_size)


def _span(flat: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Elements ``[lo, hi)`` of ``flat``: the buffer itself when that is all of it (what the store saw before)."""
    return flat if lo == 0 and hi == flat.numel() else flat[lo:hi]


class StoreKeys:
    """Each bucket's store keys and the element ranges of its flat buffer they hold.

    Args:
        keys: the buckets' keys (a bucket not cut keeps its key; chunk ``c`` of bucket key
            ``k`` is ``f"{k}#{c}"``).
        flats: a flat buffer of each bucket (its elements and item size).
        most_bytes: the most bytes of one key (:func:`chunk_bytes`; 0: none is cut).
    """

    def __init__(self, keys: Sequence[str], flats: Sequence[torch.Tensor], most_bytes: int) -> None:
        self.chunked = most_bytes > 0
        self.names: list[list[str]] = []
        self.ranges: list[list[tuple[int, int]]] = []
        for key, flat in zip(keys, flats, strict=True):
            n, most = int(flat.numel()), max(most_bytes // flat.element_size(), 1)
            count = max(-(-n // most), 1) if most_bytes > 0 else 1
            bounds = [n * c // count for c in range(count + 1)]  # near-equal chunks
            self.ranges.append(list(zip(bounds[:-1], bounds[1:])))
            self.names.append([key] if count == 1 else [f"{key}#{c}" for c in range(count)])

    @property
    def keys(self) -> list[str]:
        """Every store key, bucket by bucket."""
        return [k for names in self.names for k in names]

    def priority(self, bucket_priority: int) -> int:
        """The priority of a bucket's calls: its own, or 0 for every call when buckets are cut.

        Cut, every call of a step has the same priority, so the calls go out in the order the
        hooks make them, the same on every worker. With the buckets' priorities a later bucket
        overtook the chunks of an earlier one still queued, at a different point on each worker,
        and each chunk's round then waited for the worker that sent it last (the server's merge
        spans: one worker's piece 0.3-0.6 s behind the others'). The step waits for every chunk
        anyway (the next forward needs all the new weights), so no order gains from priorities.
        """
        return 0 if self.chunked else bucket_priority

    def views(self, b: int, flats: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
        """Per key of bucket ``b``: its range of each device's flat buffer ``flats`` (views, no copy)."""
        return [[_span(f, lo, hi) for f in flats] for lo, hi in self.ranges[b]]

    def calls(self, b: int, grads: Sequence[torch.Tensor],
              weights: Sequence[torch.Tensor] | None) -> list[tuple[str, list[torch.Tensor], list[torch.Tensor] | None]]:
        """The ``(key, values, outs)`` of bucket ``b``'s store calls, one per key: each device's flat buffer, or
        the chunk's range of each (views, no copy); ``outs`` None without ``weights``.

        One call per chunk, not one call of every chunk: a call's values for one server travel in
        messages of up to ``PSKV_PART_BYTES``, so a bucket in one call would again reach a server whole.
        """
        return [(key, [_span(g, lo, hi) for g in grads], None if weights is None else [_span(w, lo, hi) for w in weights])
                for key, (lo, hi) in zip(self.names[b], self.ranges[b])]

    def sizes(self, devices: int) -> dict[str, tuple[int, int]]:
        """Each store key: (elements, devices)."""
        return {k: (hi - lo, devices) for names, ranges in zip(self.names, self.ranges)
                for k, (lo, hi) in zip(names, ranges)}
