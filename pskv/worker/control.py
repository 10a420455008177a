"""A worker's control calls: commands to every server, and its membership calls to the scheduler.

:class:`WorkerControl` (``KVWorker.control``) sends one command to every server and waits
for every answer — the mode, the optimizer, optimizer states, user controllers, server
checkpoints, the end of this worker's data (the servers' side: :mod:`pskv.server.control`)
— and passes the membership calls (barrier, dead nodes, shutdown) to the scheduler
(:class:`pskv.cluster.Membership`, through the worker's client). The data path —
layouts, pushes, pulls and their replies — is :class:`~pskv.worker.kv_worker.KVWorker`'s.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from pskv.errors import CollectiveFailedError
from pskv.partition import server_key
from pskv.protocol import Command, Header, Role
from pskv.protocol.bodies import (
    CheckpointRequest,
    CheckpointSaved,
    ControllerCall,
    Failure,
    OptimizerConfig,
    SetMode,
    StatesRequest,
)
from pskv.worker.client import WorkerClient

__all__ = ["WorkerControl"]


class WorkerControl:
    """The control calls of the worker whose connection is ``client``.

    Args:
        client: the worker's connection (its servers once connected, its membership).
        request_timeout: how long a command waits for the servers' answers by default.
    """

    def __init__(self, client: WorkerClient, request_timeout: float) -> None:
        self._client = client
        self._timeout = request_timeout

    # -- commands to every server ---------------------------------------------------------
    def _all_servers(self, command: Command, body: str, what: str, timeout: float | None = None) -> list[Header]:
        """Send ``command`` (``body``: an encoded :mod:`~pskv.protocol.bodies` value) to every server and
        wait for every answer (their headers)."""
        limit = self._timeout if timeout is None else timeout
        info = self._client.info
        pendings = [self._client.request(s, command, body=body, what=what, timeout=timeout)
                    for s in range(info.num_servers if info is not None else 0)]
        return [p.wait(limit) for p in pendings]

    def set_mode(self, sync: bool) -> None:
        """Tell every server whether rounds are synchronous (rank 0, when the job starts)."""
        self._all_servers(Command.SET_MODE, SetMode(sync).encode(), "set mode")

    def set_optimizer(self, config: dict[str, Any]) -> None:
        """Install the optimizer described by ``config`` on every server.

        The servers know keys only as server keys: str keys of ``lr_mult`` / ``wd_mult``
        are sent as theirs (:func:`~pskv.partition.server_key`), or their multipliers
        would never apply.
        """
        self._all_servers(Command.SET_OPTIMIZER, OptimizerConfig(_server_keyed(config)).encode(), "set_optimizer")

    def save_states(self, path: str, dump_optimizer: bool) -> None:
        """Every server writes its optimizer state to ``<path>.server<rank>`` (``path`` made absolute
        here: the servers accept only paths inside their directories, :mod:`pskv.server.paths`)."""
        self._all_servers(Command.SAVE_STATES, StatesRequest(os.path.abspath(path), dump_optimizer).encode(),
                          "save_optimizer_states")

    def load_states(self, path: str) -> None:
        """Every server loads ``<path>.server<rank>`` (``path`` made absolute here)."""
        self._all_servers(Command.LOAD_STATES, StatesRequest(os.path.abspath(path)).encode(), "load_optimizer_states")

    def controller(self, head: int, body: str) -> None:
        """Run the controller registered for ``head`` on every server."""
        self._all_servers(Command.CONTROLLER, ControllerCall(head, body).encode(), f"command {head}")

    def save_checkpoint(self, directory: str) -> list[dict[str, Any]]:
        """Every server writes its shard into ``directory``; their answers (:class:`CheckpointSaved` fields).

        Raises:
            ProtocolError: a server's answer is malformed.
        """
        replies = self._all_servers(Command.SAVE_CHECKPOINT, CheckpointRequest(directory).encode(), "save_checkpoint")
        return [CheckpointSaved.parse(h)._asdict() for h in replies]

    def join(self, timeout: float) -> None:
        """Tell every server this worker has no more data; waits for every answer."""
        self._all_servers(Command.JOIN, "", "join", timeout)

    # -- membership ---------------------------------------------------------------------
    def barrier(self, timeout: float, name: str = "barrier", failure: BaseException | None = None,
                result: str = "", agree: Sequence[tuple[str, str]] = (), mode: str = "") -> str:
        """Meet every worker in the collective ``name``; returns rank 0's ``result``.

        ``failure``: this worker's error in the collective, told to every worker (this
        one's caller raises it; every other worker raises :class:`CollectiveFailedError`
        naming it). ``agree``: ``(item, description)`` pairs every worker must have alike.
        ``mode`` ``"post"`` (rank 0) / ``"read"``: the outcome of a call rank 0 may make
        alone (:meth:`pskv.cluster.Membership.barrier`).

        Raises:
            CollectiveFailedError: the collective failed on another worker.
            CollectiveMismatchError, InitMismatchError: the workers' calls differ.
            NodeFailedError: a worker died (named). OperationTimeoutError: names who did not arrive.
        """
        met = self._client.membership.barrier(Role.WORKER, timeout, name, result=result, agree=agree, mode=mode,
                                              failure=None if failure is None else Failure.of(failure))
        if met.failed and failure is None:
            rank, first = met.failed[0]
            raise CollectiveFailedError(f"worker {rank}", name, first.type, first.message)
        return met.result

    def num_dead_node(self, group: int, timeout: float) -> int:
        """Nodes of ``group`` (1 scheduler, 2 servers, 4 workers, sums) silent for > ``timeout`` s."""
        return self._client.membership.num_dead_node(group, timeout)

    def shutdown(self, timeout: float, wait: bool = False) -> None:
        """Tell the scheduler this worker leaves the job; with ``wait``, block until every worker has left."""
        self._client.membership.shutdown(wait, timeout)


def _server_keyed(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (an optimizer's ``to_config``) with the str keys of its multipliers as server keys."""
    params = config.get("params")
    if not isinstance(params, dict):
        return config
    mults = {}
    for name in ("lr_mult", "wd_mult"):
        pairs = params.get(name)
        if isinstance(pairs, list):
            mults[name] = [[server_key(p[0]), *p[1:]] if isinstance(p, list) and p and isinstance(p[0], str) else p
                           for p in pairs]
    return {**config, "params": {**params, **mults}} if mults else config
