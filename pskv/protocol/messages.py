"""The wire schema: roles, commands and the message header. No I/O here.

A message is one header frame followed by one raw data frame per array. The header
says, for every data frame, which key it belongs to, its dtype and shape, and (for
arrays split over servers) where the frame sits inside the whole value. Array bytes are
never pickled or otherwise interpreted beyond this description.

Node ids follow ps-lite: the scheduler is 1, server rank ``r`` is ``8 + 2r`` and worker
rank ``r`` is ``9 + 2r``; node groups are bit masks (1 scheduler, 2 servers, 4 workers).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = [
    "ArraySpec",
    "Command",
    "Header",
    "Role",
    "PROTOCOL_VERSION",
    "SCHEDULER_ID",
    "TX_PREFIX",
    "node_id",
    "node_name",
    "node_role_rank",
    "describe",
]

PROTOCOL_VERSION = 1
SCHEDULER_ID = 1
# Routing identities of workers' send-only sockets: this prefix and 16 hex digits (see HELLO).
TX_PREFIX = b"pskv-tx-"


class Role(enum.IntEnum):
    """A node's role; the values are MXNet's node-group bits."""

    SCHEDULER = 1
    SERVER = 2
    WORKER = 4


class Command(enum.IntEnum):
    """What a message asks for (requests) or what it answers (replies)."""

    # node <-> scheduler
    REGISTER = 1  # body: JSON {role, host, port}; reply body: JSON node table
    BARRIER = 2  # body: JSON {group}; reply when every member of the group arrived
    HEARTBEAT = 3  # reply body: JSON {dead: [...]} as seen by the scheduler
    SHUTDOWN = 4  # a worker is done; the scheduler stops the job when all are
    # worker -> server: data
    INIT = 10
    PUSH = 11
    # body: JSON {parts: [[key, offset, n], ...]}: the value including the round of the sender's
    # n-th push (or pushpull) of that part (n = 0: any); no data frames
    PULL = 12
    PUSHPULL = 13
    ROW_SPARSE_PULL = 14
    # worker -> server: control
    SET_OPTIMIZER = 20  # body: JSON optimizer config (never a pickle)
    CONTROLLER = 21  # body: JSON {head, body} for the registered controller
    SAVE_STATES = 22  # body: JSON {path}
    LOAD_STATES = 23
    STOP = 24
    SET_MODE = 25  # body: JSON {sync: bool}; sent by worker 0 when a dist store is created
    # body: JSON {tx: "<16 hex digits>"}. A worker sends HELLO to each server (over ZeroMQ)
    # on its polled DEALER when it connects, naming its send-only socket (routing identity
    # "pskv-tx-" + tx); the server then answers requests that arrive from that socket on
    # the DEALER the HELLO came from (workers send from the calling thread).
    HELLO = 26
    # Answered at once: its reply tells the worker that every message it sent to this
    # server before was handled (a quiet push — body {"quiet": true} — is answered only
    # when it fails).
    SYNC = 27
    # The sender has no more data (uneven data, ``kv.join()``): sync rounds complete
    # without it until every worker has joined. No body.
    JOIN = 28
    # body: JSON {dir}: write this server's shard to <dir>/server-<rank>.safetensors
    # (pskv.server.snapshot); reply body {file, bytes, open_rounds}
    SAVE_CHECKPOINT = 29
    # A replacement process of a dead worker (PSKV_RECOVERY_TIMEOUT) announces itself: the
    # server restarts its push numbering and stops waiting for the old process. No body.
    REJOIN = 30
    # replies
    REPLY = 40
    ERROR = 41  # body: JSON {type, message}


class ArraySpec(NamedTuple):
    """Describes one data frame (immutable; a named tuple because one is built per array
    of every message, and that is several times cheaper than a frozen dataclass).

    Attributes:
        key: the server key (a signed 64-bit int).
        dtype: dtype name (see :mod:`pskv.arrays.dtypes`).
        shape: shape of the data in this frame.
        offset: element offset of this frame inside the key's whole (flattened) value;
            0 for a key held by one server.
        round: sync round: in a reply with values, the round they include (0 in
            requests).
    """

    key: int
    dtype: str
    shape: tuple[int, ...]
    offset: int = 0
    round: int = 0

    @property
    def size(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n


class Header(NamedTuple):
    """The header frame of a message (immutable; a named tuple, built for every message).

    Attributes:
        command: what the message is.
        request: the sender's request id; a reply carries the id of its request.
        sender: node id of the sender.
        arrays: one spec per data frame, in frame order.
        priority: higher is sent / served first.
        body: command-specific text (JSON), or the error description of an ERROR reply.
    """

    command: Command
    request: int
    sender: int
    arrays: tuple[ArraySpec, ...] = ()
    priority: int = 0
    body: str = ""


def node_id(role: Role, rank: int) -> int:
    """The node id of ``role`` rank ``rank`` (scheduler 1, servers 8+2r, workers 9+2r)."""
    if role is Role.SCHEDULER:
        return SCHEDULER_ID
    return (8 if role is Role.SERVER else 9) + 2 * rank


def node_role_rank(nid: int) -> tuple[Role, int]:
    """Inverse of :func:`node_id`.

    Raises:
        ValueError: ``nid`` is not a valid node id.
    """
    if nid == SCHEDULER_ID:
        return Role.SCHEDULER, 0
    if nid < 8:
        raise ValueError(f"invalid node id {nid}")
    return (Role.SERVER if nid % 2 == 0 else Role.WORKER), (nid - 8) // 2


def node_name(nid: int) -> str:
    """A readable node name, e.g. ``'server 1'`` or ``'worker 0'``."""
    role, rank = node_role_rank(nid)
    return "scheduler" if role is Role.SCHEDULER else f"{role.name.lower()} {rank}"


def describe(header: Header) -> str:
    """One line describing a header, for logs and error messages."""
    keys = ",".join(str(a.key) for a in header.arrays[:6])
    more = "..." if len(header.arrays) > 6 else ""
    return (f"{header.command.name} req={header.request} from {node_name(header.sender)}"
            f" keys=[{keys}{more}] prio={header.priority}")
