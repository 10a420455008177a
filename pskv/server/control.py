"""The server's control commands: aggregation mode, optimizer, user controllers, saved states.

``SET_MODE``, ``SET_OPTIMIZER``, ``CONTROLLER``, ``SAVE_STATES``, ``LOAD_STATES`` and
``SAVE_CHECKPOINT``: requests that configure the shard or save / load what it holds,
rather than move values. Each is answered at once with a short reply. Optimizers arrive
as JSON configs, never as code; controllers are functions the server registered itself
(:mod:`pskv.server.controllers`); the files a request names must lie in the directories
fixed at start (:mod:`pskv.server.paths`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pskv.errors import InvalidArgumentError, OptimizerStateError
from pskv.optimizer import Optimizer, Updater
from pskv.optimizer.updater import install_optimizer, updater_from_states
from pskv.protocol import Command, Header
from pskv.protocol.bodies import (
    CheckpointRequest,
    CheckpointSaved,
    ControllerAnswer,
    ControllerCall,
    OptimizerConfig,
    SetMode,
    StatesFile,
    StatesRequest,
)
from pskv.protocol.replies import reply_frames
from pskv.server.checkpointing import ShardCheckpoints
from pskv.server.controllers import find_controller
from pskv.server.handlers import Handler, Reply
from pskv.server.paths import AllowedPaths
from pskv.server.shard import ServerShard

__all__ = ["ControlHandlers"]

log = logging.getLogger("pskv.server")


class ControlHandlers:
    """The control commands' handlers, on one shard.

    Args:
        shard: the shard they configure.
        checkpoints: saves the shard on SAVE_CHECKPOINT.
        reply: sends a reply at once (``reply(identity, frames)``).
        node_id: this server's node id (the replies' sender).
        rank: this server's rank (names its state files).
        paths: the directories its state files and checkpoints may be in.
    """

    def __init__(self, shard: ServerShard, checkpoints: ShardCheckpoints, reply: Reply, node_id: Callable[[], int],
                 rank: Callable[[], int], paths: AllowedPaths) -> None:
        self._shard = shard
        self._paths = paths
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

    def _states_path(self, request: StatesRequest, what: str) -> str:
        """``<path>.server<rank>``, resolved, inside the allowed directories (else InvalidArgumentError)."""
        return self._allowed(f"{request.path}.server{self._rank()}", what)

    def save_states(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """:class:`StatesRequest`: write the optimizer state to ``<path>.server<rank>``."""
        request = StatesRequest.parse(header)
        if not isinstance(self._shard.updater, Updater):
            raise OptimizerStateError(f"{self._name} has no optimizer (call set_optimizer first)")
        path = self._states_path(request, "save_optimizer_states")
        try:
            self._shard.updater.save_states(path, dump_optimizer=request.dump_optimizer)
        except OSError as exc:  # a pskv error naming the file, not a bare FileNotFoundError
            raise OptimizerStateError(f"{self._name} cannot write {path}: {exc.strerror or exc}") from None
        self._ack(identity, header, StatesFile(path).encode())

    def load_states(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """:class:`StatesRequest`: load the optimizer state from ``<path>.server<rank>``.

        Without an optimizer, the file's optimizer config (``dump_optimizer``) installs one.
        """
        path = self._states_path(StatesRequest.parse(header), "load_optimizer_states")
        try:
            if isinstance(self._shard.updater, Updater):
                self._shard.updater.load_states(path)
            else:
                self._shard.updater = updater_from_states(path, no_config=OptimizerStateError(
                    f"{self._name}: {path} holds no optimizer config and no optimizer is set"))
        except OSError as exc:
            raise OptimizerStateError(f"{self._name} cannot read {path}: {exc.strerror or exc}") from None
        self._ack(identity, header, StatesFile(path).encode())

    def save_checkpoint(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """:class:`CheckpointRequest`: write this server's shard into that checkpoint directory."""
        directory = self._allowed(CheckpointRequest.parse(header).dir, "save_checkpoint")
        saved = self._checkpoints.save(directory, self._rank())
        self._ack(identity, header, CheckpointSaved(str(saved.file), saved.bytes, saved.open_rounds).encode())
