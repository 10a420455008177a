"""A worker's control calls: commands to every server, and its membership calls to the scheduler.

:class:`WorkerControl` (``KVWorker.control``) sends one command to every server and waits
for every answer — the mode, the optimizer, optimizer states (as messages: the store writes their
files), user controllers, server checkpoints, the end of this worker's data (the servers' side:
:mod:`pskv.server.control`)
— and passes the membership calls (barrier, dead nodes, shutdown) to the scheduler
(:class:`pskv.cluster.Membership`, through the worker's client). The data path —
layouts, pushes, pulls and their replies — is :class:`~pskv.worker.kv_worker.KVWorker`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from pskv.errors import CollectiveFailedError
from pskv.optimizer import transfer
from pskv.optimizer.states import StatesDocument
from pskv.partition import server_key
from pskv.protocol import Command, Header, Role, node_id
from pskv.protocol.bodies import (
    CheckpointRequest,
    CheckpointSaved,
    ControllerCall,
    Failure,
    Meeting,
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

    def save_states(self, dump_optimizer: bool) -> list[StatesDocument]:
        """Every server's optimizer state, by server rank (:mod:`pskv.optimizer.transfer`): the caller
        writes the files — a server writes no file a worker names.

        Raises:
            ProtocolError: a server's answer is malformed.
        """
        what = "save_optimizer_states"
        body = StatesRequest(dump_optimizer).encode()
        pendings = [self._client.request(s, Command.SAVE_STATES, body=body, what=what) for s in self._servers()]
        return [transfer.document(p.wait(self._timeout), p.buffers) for p in pendings]

    def load_states(self, docs: Sequence[StatesDocument]) -> None:
        """Give server ``r`` the optimizer state ``docs[r]`` (the caller read its file); waits for every answer."""
        pendings = []
        for server, doc in zip(self._servers(), docs, strict=True):
            body, specs, arrays = transfer.message(doc)
            pendings.append(self._client.request(server, Command.LOAD_STATES, specs, arrays, body=body,
                                                 what="load_optimizer_states"))
        for p in pendings:
            p.wait(self._timeout)

    def _servers(self) -> range:
        info = self._client.info
        return range(info.num_servers if info is not None else 0)

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
                result: str = "", agree: Sequence[tuple[str, str]] = (), mode: str = "",
                settled: bool = True) -> str:
        """Meet every worker in the collective ``name``; returns rank 0's ``result``.

        Before a counted meeting, every server gets this worker's mark of it, behind its
        pushes (:mod:`pskv.server.steps`: a sync round that this worker never pushed while
        another worker did, before the meeting, fails the round and the meeting on every
        worker at once). ``settled``: no operation of this worker is still queued (False:
        the mark accuses nobody).

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
                                              failure=None if failure is None else Failure.of(failure),
                                              before=partial(self._mark, name, settled))
        if met.failed and failure is None:
            rank, first = met.failed[0]
            raise CollectiveFailedError(f"worker {rank}", name, first.type, first.message)
        return met.result

    def _mark(self, name: str, settled: bool, seq: int) -> None:
        """Tell every server this worker arrives at its meeting ``seq`` (a SYNC behind its pushes; not waited for)."""
        info = self._client.info
        body = Meeting(seq, settled, name).encode()
        for server in range(info.num_servers if info is not None else 0):
            self._client._sync(node_id(Role.SERVER, server), None, _ignore, body)

    def num_dead_node(self, group: int, timeout: float) -> int:
        """Nodes of ``group`` (1 scheduler, 2 servers, 4 workers, sums) silent for > ``timeout`` s."""
        return self._client.membership.num_dead_node(group, timeout)

    def shutdown(self, timeout: float, wait: bool = False) -> None:
        """Tell the scheduler this worker leaves the job; with ``wait``, block until every worker has left."""
        self._client.membership.shutdown(wait, timeout)


def _ignore(_: object) -> None:
    """A meeting mark's answer: nothing to do (a refusal of it would say the same as the meeting)."""


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
