"""The server's control commands: aggregation mode, optimizer, user controllers, optimizer states, checkpoints.

``SET_MODE``, ``SET_OPTIMIZER``, ``CONTROLLER``, ``SAVE_STATES``, ``LOAD_STATES``,
``SAVE_CHECKPOINT``, and an elastic job's ``COMMIT`` and ``KEYS``: requests that configure the shard or save / load what it holds,
rather than move values. Each is answered at once. Optimizers arrive as JSON configs, never
as code; controllers are functions the server registered itself (:mod:`pskv.server.controllers`).

Optimizer states travel, they are not filed here: SAVE_STATES is answered with the shard's
state and LOAD_STATES carries one (:mod:`pskv.optimizer.transfer`); the worker that called
``save_optimizer_states`` / ``load_optimizer_states`` writes and reads the file, wherever its
user said. A loaded state is checked against the shard before it replaces anything: every key
held here, every array the shape of its key's slice. The one file a request names is
SAVE_CHECKPOINT's directory, which must lie in the directories fixed at start
(:mod:`pskv.server.paths`): a server never writes or reads a path a peer chose elsewhere.

``COMMIT`` snapshots the shard (:mod:`pskv.server.commits`; refused in a job that is not elastic);
``KEYS`` answers a joining worker with the parts this server holds, in pages of
:data:`~pskv.protocol.bodies.MAX_KEY_PARTS` (:class:`~pskv.protocol.bodies.KeyTable`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from pskv.errors import InvalidArgumentError, OptimizerStateError
from pskv.optimizer import Optimizer, Updater, transfer
from pskv.optimizer.states import StatesDocument
from pskv.optimizer.updater import install_optimizer, updater_from_states
from pskv.protocol import Command, Header
from pskv.protocol.bodies import (
    MAX_KEY_PARTS,
    CheckpointRequest,
    CheckpointSaved,
    Commit,
    ControllerAnswer,
    ControllerCall,
    KeyPart,
    KeysRequest,
    KeyTable,
    OptimizerConfig,
    SetMode,
    StatesRequest,
)
from pskv.protocol.replies import reply_frames
from pskv.server.checkpointing import ShardCheckpoints
from pskv.server.commits import CommitSnapshots, NoCommits
from pskv.server.controllers import find_controller
from pskv.server.handlers import Handler, Reply
from pskv.server.paths import AllowedPaths
from pskv.server.shard import ServerShard
from pskv.transport.bounds import DEFAULT_BOUNDS, check_size

__all__ = ["ControlHandlers"]

log = logging.getLogger("pskv.server")


class ControlHandlers:
    """The control commands' handlers, on one shard.

    Args:
        shard: the shard they configure.
        checkpoints: saves the shard on SAVE_CHECKPOINT.
        reply: sends a reply at once (``reply(identity, frames)``).
        node_id: this server's node id (the replies' sender).
        rank: this server's rank.
        paths: the directories its checkpoints may be in.
        max_message_bytes: the biggest message a worker takes (``PSKV_MAX_MESSAGE_BYTES``): a state
            reply past it is refused here, naming the setting, not discarded by the worker.
        commits: the shard's commit snapshots (COMMIT); :class:`NoCommits` in a job that is not elastic.
        key_names: str keys' names by server key (KEYS sends them).
    """

    def __init__(self, shard: ServerShard, checkpoints: ShardCheckpoints, reply: Reply, node_id: Callable[[], int],
                 rank: Callable[[], int], paths: AllowedPaths,
                 max_message_bytes: int = DEFAULT_BOUNDS.max_message_bytes,
                 commits: CommitSnapshots | NoCommits | None = None, key_names: Mapping[int, str] | None = None) -> None:
        self._commits = NoCommits() if commits is None else commits
        self._key_names: Mapping[int, str] = {} if key_names is None else key_names
        self._shard = shard
        self._paths = paths
        self._max_bytes = max_message_bytes
        self._checkpoints = checkpoints
        self._reply = reply
        self._node_id = node_id
        self._rank = rank

    def handlers(self) -> dict[Command, Handler]:
        """The handler of each control command."""
        return {
            Command.SET_MODE: self.set_mode,
            Command.SET_OPTIMIZER: self.set_optimizer,
            Command.CONTROLLER: self.controller,
            Command.SAVE_STATES: self.save_states,
            Command.LOAD_STATES: self.load_states,
            Command.SAVE_CHECKPOINT: self.save_checkpoint,
            Command.COMMIT: self.commit,
            Command.KEYS: self.keys,
        }

    @property
    def _name(self) -> str:
        return f"server {self._rank()}"

    def _ack(self, identity: bytes, header: Header, body: str = "") -> None:
        self._reply(identity, reply_frames(header, self._node_id(), body))

    def set_mode(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """:class:`SetMode`: sync or async aggregation; fixed once keys exist."""
        sync = SetMode.parse(header).sync
        if self._shard.parts and sync != self._shard.sync:
            raise InvalidArgumentError("the aggregation mode cannot change once keys exist")
        self._shard.sync = sync
        self._ack(identity, header)

    def set_optimizer(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """An optimizer config: new hyperparameters keep the optimizer state (install_optimizer)."""
        optimizer = Optimizer.from_config(OptimizerConfig.parse(header).config)  # a config, never code
        self._shard.updater = install_optimizer(self._shard.updater, optimizer)
        self._ack(identity, header)

    def controller(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """:class:`ControllerCall`: the registered controller's answer."""
        head, text = ControllerCall.parse(header)
        fn = find_controller(head)
        if fn is None:
            raise InvalidArgumentError(
                f"{self._name} has no controller for head {head} (register one with @pskv.server.controller "
                "in a module named by PSKV_SERVER_MODULES)"
            )
        answer = fn(head, text)
        self._ack(identity, header, ControllerAnswer("" if answer is None else str(answer)).encode())

    def _allowed(self, path: str, what: str) -> str:
        """``path`` resolved, inside the allowed directories; a refusal is logged here too (a peer chose it)."""
        try:
            return self._paths.check(path, f"{self._name}: {what}")
        except InvalidArgumentError as exc:
            log.warning("%s", exc)
            raise

    def save_states(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """:class:`StatesRequest`: answer with the shard's optimizer state (:class:`OptimizerStates`, its arrays
        copied: later updates change the live ones while the reply may wait to be sent)."""
        request = StatesRequest.parse(header)
        if not isinstance(self._shard.updater, Updater):
            raise OptimizerStateError(f"{self._name} has no optimizer (call set_optimizer first)")
        body, specs, arrays = transfer.message(self._shard.updater.document(request.dump_optimizer))
        check_size(reply_frames(header, self._node_id(), body, specs, arrays), self._max_bytes,
                   f"{self._name}: save_optimizer_states")
        self._reply(identity, reply_frames(header, self._node_id(), body, specs, [a.copy() for a in arrays]))

    def load_states(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """:class:`OptimizerStates`: take the optimizer state the request carries, once it fits the shard.

        Without an optimizer, the state's optimizer config (``dump_optimizer``) installs one.
        """
        doc = transfer.document(header, buffers)
        self._check_fits(doc)
        if isinstance(self._shard.updater, Updater):
            self._shard.updater.restore(doc)
        else:
            self._shard.updater = updater_from_states(doc, no_config=OptimizerStateError(
                f"{self._name}: the optimizer state holds no optimizer config and no optimizer is set"))
        self._ack(identity, header)

    def _check_fits(self, doc: StatesDocument) -> None:
        """Every key of ``doc`` held here, each of its arrays shaped as the key's slice (as the updater sees it).

        Raises:
            OptimizerStateError: naming the key (and the shapes).
        """
        shapes: dict[int, tuple[int, ...]] = {}
        for part in self._shard.parts.values():
            if part.row_width:
                shapes[part.key] = (part.num_rows, part.row_width)
            else:
                shapes[part.key] = (shapes.get(part.key, (0,))[0] + part.value.size,)
        for ks in doc.keys:
            shape = shapes.get(ks.key) if isinstance(ks.key, int) else None
            key = self._shard.named(ks.key) if isinstance(ks.key, int) else repr(ks.key)
            if shape is None:
                raise OptimizerStateError(
                    f"{self._name}: load_optimizer_states: the state has key {key}, which this server does not "
                    "hold (load after init, in a job with the same keys and number of servers)")
            for name, array in zip(ks.names, ks.arrays, strict=True):
                if array.shape != shape:
                    raise OptimizerStateError(
                        f"{self._name}: load_optimizer_states: state {name!r} of key {key} has shape "
                        f"{array.shape}, the key's slice on this server {shape}")

    def save_checkpoint(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """:class:`CheckpointRequest`: write this server's shard into that checkpoint directory."""
        directory = self._allowed(CheckpointRequest.parse(header).dir, "save_checkpoint")
        saved = self._checkpoints.save(directory, self._rank())
        self._ack(identity, header, CheckpointSaved(str(saved.file), saved.bytes, saved.open_rounds).encode())

    def commit(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """:class:`Commit`: snapshot the shard as commit ``n`` (pending until a view names it)."""
        self._commits.take(Commit.parse(header).n)
        self._ack(identity, header)

    def keys(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """:class:`KeysRequest`: a page of the parts held here, in the order they were made (:class:`KeyTable`)."""
        start = KeysRequest.parse(header).start
        parts = list(self._shard.parts.values())
        page = parts[start:start + MAX_KEY_PARTS]
        follow = start + len(page) if start + len(page) < len(parts) else 0
        table = KeyTable(tuple(KeyPart(p.key, p.offset, p.dtype, p.num_rows if p.row_width else p.value.size,
                                       p.row_width, self._key_names.get(p.key, "")) for p in page), follow)
        self._ack(identity, header, table.encode())
