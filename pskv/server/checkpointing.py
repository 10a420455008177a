"""A server's shard in and out of a checkpoint (the files themselves: :mod:`pskv.server.snapshot`).

Three moments:

* :meth:`ShardCheckpoints.restore`, before serving (``resume_from``): the shard's
  values, rounds and optimizer come from the checkpoint; its parts stay ``restored``
  so the workers' INIT keeps the loaded values. A checkpoint written with another
  placement (:func:`pskv.partition.placement_name`) is refused: its partitions would not
  meet the workers' (some values silently re-initialised), and moving them between
  servers is not done;
* :meth:`ShardCheckpoints.apply_saved_counts`, only for a replacement server in a
  running job: the workers go on numbering their pushes, so each part's push counts
  are those saved (a whole-job restart, whose workers start again, does not get them);
* :meth:`ShardCheckpoints.save`, on ``SAVE_CHECKPOINT``: the shard as it is between
  rounds (pushes of an open round are not saved, and the log says so).

The reply compression of ``both_ways`` (:mod:`pskv.server.squeeze`: each part's residual
and latest round payload) is saved and restored with the shard, a replacement server's
included.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from pskv.compression import create
from pskv.config import ClusterConfig
from pskv.errors import CheckpointError
from pskv.optimizer import Updater
from pskv.optimizer.updater import updater_from_states
from pskv.partition import placement_name
from pskv.server.shard import PushLog, ServerShard
from pskv.server.snapshot import PartState, ReplyState, ShardState, read_manifest, read_shard, write_shard
from pskv.server.squeeze import ReplyCompression, Squeezed

__all__ = ["ShardCheckpoints", "Saved"]

log = logging.getLogger("pskv.server")


@dataclass(frozen=True)
class Saved:
    """What :meth:`ShardCheckpoints.save` wrote."""

    file: str
    bytes: int
    open_rounds: int  # parts whose pending pushes were not saved


class ShardCheckpoints:
    """Restores and saves one server's shard.

    Args:
        shard: the shard.
        cluster: the cluster contract (server rank, numbers of servers and workers).
        name: the server's name, for the log.
    """

    def __init__(self, shard: ServerShard, cluster: ClusterConfig, name: Callable[[], str]) -> None:
        self._shard = shard
        self._cluster = cluster
        self._name = name
        self._saved_counts: dict[tuple[int, int], dict[int, int]] = {}  # of a loaded checkpoint
        #: the reply compression (both_ways) saved and restored with the shard; the server's
        #: data handlers use this one (:class:`pskv.server.core.ServerCore` wires them)
        self.squeezed = ReplyCompression()

    def restore(self, directory: str) -> None:
        """Load this server's shard of the checkpoint ``directory`` (before serving).

        Raises:
            CheckpointError: no complete checkpoint there, or it does not fit this job.
        """
        rank = self._cluster.server_rank
        if rank < 0:
            raise CheckpointError("resuming from a checkpoint needs the server's rank (PSKV_SERVER_RANK; "
                                  "pskv launch sets it)")
        manifest = read_manifest(directory)
        if manifest.get("num_servers") != self._cluster.num_servers:
            raise CheckpointError(f"{directory} was written by {manifest.get('num_servers')} servers; this job has "
                                  f"{self._cluster.num_servers}")
        state = read_shard(directory, rank)
        self._check_placement(directory, state.placement)
        self._shard.sync = state.sync
        for p in state.parts:
            self._shard.restore(p.key, p.offset, p.dtype, p.value, p.round, p.summed, p.row_width, p.present)
        self._saved_counts = {(p.key, p.offset): dict(p.counts or {}) for p in state.parts}
        if state.optimizer is not None:
            self._shard.updater = updater_from_states(state.optimizer, no_config=CheckpointError(
                f"{directory}: server {rank}'s optimizer state has no optimizer config"))
        self.squeezed.restore(None if state.replies is None else [
            Squeezed(r.key, r.offset, r.round, create(r.compression), r.payload, r.residual) for r in state.replies],
            directory)
        log.info("server %d: restored %d part(s)%s%s from %s", rank, len(state.parts),
                 " and the optimizer state" if state.optimizer is not None else "",
                 f", {len(state.replies)} reply residual(s)" if state.replies else "", directory)

    def _check_placement(self, directory: str, written: str | None) -> None:
        """Refuse a checkpoint whose values were cut otherwise than this job cuts them.

        Raises:
            CheckpointError: the placements differ, naming the settings to resume with.
        """
        ours = placement_name(self._cluster.bigarray_bound, self._cluster.part_size, self._cluster.part_pieces)
        if written is None and self._cluster.bigarray_bound > 0:
            return  # written before placements were recorded, read with MXNet's rule: parts are checked at init
        if written is None:
            written = "a placement it did not record (pskv's old defaults: MXNET_KVSTORE_BIGARRAY_BOUND=1000000 " \
                      "PSKV_PART_BYTES=4194304)"
        if written != ours:
            raise CheckpointError(f"{directory} was written with {written}; this job places values with {ours}: "
                                  + _placement_advice(written, ours))

    def apply_saved_counts(self) -> None:
        """Reactor thread: the push counts of the checkpoint this replacement server loaded.

        The workers replay every push they made since that checkpoint, numbered on from
        these counts (a whole-job restart, whose workers start again, does not get them).
        """
        for (key, offset), counts in self._saved_counts.items():
            part = self._shard.parts.get((key, offset))
            if part is not None:
                part.restored = False  # the workers will not init it again
                part.pushes = {w: PushLog(count=c) for w, c in counts.items()}
        log.warning("%s: replacement server; push counts of %d part(s) restored", self._name(),
                    len(self._saved_counts))

    def save(self, directory: str, rank: int) -> Saved:
        """Write the shard as server ``rank``'s file of the checkpoint ``directory``.

        Raises:
            CheckpointError: the updater is not a pskv optimizer's, or the file could not be written.
        """
        updater = self._shard.updater
        optimizer = updater.get_states(dump_optimizer=True) if isinstance(updater, Updater) else None
        if updater is not None and optimizer is None:
            raise CheckpointError(f"{self._name()}: its updater is not a pskv optimizer; it cannot be saved")
        saved = self._shard.snapshot()
        open_rounds = sum(1 for part, _ in saved if part.pushed)
        if open_rounds:
            log.warning("%s: checkpoint %s: %d part(s) have an open sync round; their pending pushes are not "
                        "saved", self._name(), directory, open_rounds)
        kept = {(p.key, p.offset) for p, _ in saved}
        replies = tuple(ReplyState(s.key, s.offset, s.round, s.compressor.params, s.payload, s.residual)
                        for s in self.squeezed.export() if (s.key, s.offset) in kept)
        state = ShardState(rank, self._cluster.num_servers, self._cluster.num_workers, self._shard.sync,
                           tuple(PartState(p.key, p.offset, p.dtype, value, p.round, p.summed,
                                           {w: log_.count for w, log_ in p.pushes.items()}, p.row_width,
                                           None if p.present is None else p.present.copy()) for p, value in saved),
                           optimizer, replies, placement_name(self._cluster.bigarray_bound, self._cluster.part_size, self._cluster.part_pieces))
        path = write_shard(directory, state)
        return Saved(str(path), path.stat().st_size, open_rounds)


_CUT = re.compile(r" \(slices cut into >= (\d+) partitions of >= \d+ bytes\)$")


def _placement_advice(written: str, ours: str) -> str:
    """What resumes a checkpoint of another placement: the settings it was written with, for what a setting
    controls; the same kind of deployment for the partition count, which none does (1 on one host, at least
    8 and 2 per server across hosts: :attr:`~pskv.config.ClusterConfig.part_pieces`)."""
    pieces_written, pieces_ours = (m[1] if m else "" for m in (_CUT.search(written), _CUT.search(ours)))
    advice = [] if _CUT.sub("", written) == _CUT.sub("", ours) else ["resume it with the settings it was written with"]
    kind = {True: "a job across hosts", False: "a one-host job"}
    if not written.startswith("MXNET_KVSTORE_BIGARRAY_BOUND="):  # one it did not record: its deployment is unknown
        return "resume it with the settings it was written with"
    if pieces_written and pieces_ours and pieces_written != pieces_ours:
        advice.append("across hosts the partition count follows the servers (at least 8, 2 per server) and no "
                      "setting changes it: resume it with as many servers")
    elif pieces_written != pieces_ours:
        advice.append(f"it was written by {kind[bool(pieces_written)]}, this is {kind[bool(pieces_ours)]}, and no "
                      f"setting changes the partition count: resume it with {kind[bool(pieces_written)]}")
    return "; ".join(advice)
