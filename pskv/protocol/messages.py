"""The wire schema: roles, commands, flags and the message header. No I/O here.

A message is one header frame followed by one raw data frame per array. The header
says, for every array, which key it belongs to, its dtype and shape, and (for arrays
split over servers) where it sits inside the whole value. Array bytes are never pickled
or otherwise interpreted beyond this description. What each command's ``body`` holds is
:mod:`pskv.protocol.bodies`, and only there; the data path's options are :class:`Flag` bits
and its arrays' specs.

Data frames: one per spec, except in a ``PULL`` request (without :attr:`Flag.ROWS`) and in
any message with the :attr:`Flag.SHM` bit, whose specs *name* parts without data (a pull names the parts it
wants; a shared-memory push's data is in the sender's slot; a shared-memory reply's
values are in the part's shared buffers, :attr:`ArraySpec.buffer`).

Node ids follow ps-lite: the scheduler is 1, server rank ``r`` is ``8 + 2r`` and worker
rank ``r`` is ``9 + 2r``; node groups are bit masks (1 scheduler, 2 servers, 4 workers). In an
elastic job a worker's ``r`` is its *slot* (never reused, below :data:`MAX_SLOTS`), and every
message carries the sender's view epoch, a ninth header field (absent: 0, every other job).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = [
    "ArraySpec",
    "Command",
    "Header",
    "Role",
    "Flag",
    "MAX_EPOCH",
    "MAX_SLOTS",
    "PROTOCOL_VERSION",
    "SCHEDULER_ID",
    "TX_PREFIX",
    "node_id",
    "node_name",
    "node_role_rank",
]

# 2: flags in the header (quiet, shared memory, init options), pulls name parts in their
# specs (round = push number), shared-memory replies name buffers in their specs; no JSON
# on the data path. 3: the data path's usual header in the compact form (pskv.protocol.compact).
PROTOCOL_VERSION = 3
SCHEDULER_ID = 1
# Routing identities of workers' send-only sockets: this prefix and 16 hex digits (see HELLO).
TX_PREFIX = b"pskv-tx-"
# An elastic job's worker slots (never reused) stay below this; a peer naming a higher one is refused.
MAX_SLOTS = 65536
MAX_EPOCH = 2**63 - 1  # a view epoch (Header.epoch, View.epoch): 1 and up; 0 is "no view"


class Role(enum.IntEnum):
    """A node's role; the values are MXNet's node-group bits."""

    SCHEDULER = 1
    SERVER = 2
    WORKER = 4


class Command(enum.IntEnum):
    """What a message asks for (requests) or what it answers (replies).

    What a command's body and its reply's hold is the table in :mod:`pskv.protocol.bodies`, and
    nowhere else: these comments say what the command does.
    """

    # node <-> scheduler
    REGISTER = 1  # a node joins the job; the reply gives its id and where the servers are
    BARRIER = 2  # a collective: answered when every member of the group arrived
    HEARTBEAT = 3  # the node is alive (and its metrics); the reply: which nodes are dead or left
    SHUTDOWN = 4  # a worker is done; the scheduler stops the job when all are
    # anyone (pskv top, pskv.metrics.snapshot; no registration, but under CURVE only a key
    # holder connects) -> scheduler: the job's metrics
    METRICS = 5
    # worker -> server: data (options are Flag bits)
    INIT = 10  # one frame per part; SUMMED, OVERWRITE flags
    # one frame per part, or SHM: parts named, data in the sender's slot; QUIET flag; a spec's
    # round = the push's number n (the sender's n-th push of that part; each applied at most once)
    PUSH = 11
    # specs name parts, round = n: the value including the round of the sender's n-th push
    # (or pushpull) of that part (n = 0: any); no data frames; SHM: answer with buffer indices
    PULL = 12
    PUSHPULL = 13  # as PUSH, answered as PULL
    # worker -> server: control
    SET_OPTIMIZER = 20  # install the optimizer (its config, never a pickle)
    CONTROLLER = 21  # call a registered controller
    SAVE_STATES = 22  # answered with the optimizer's states (the worker writes the file; no path travels)
    LOAD_STATES = 23  # carries optimizer states for the server to take (the worker read the file)
    SET_MODE = 25  # sync or async; sent by worker 0 when a dist store is created
    # A worker opens every connection to a server with HELLO carrying its token from the
    # scheduler; the server binds the connection to the worker only if it is right
    # (server/senders.py). Over ZeroMQ it is sent on the polled DEALER and names the send-only
    # socket (routing identity "pskv-tx-" + tx); the server then answers requests that arrive
    # from that socket on the DEALER the HELLO came from (workers send from the calling thread).
    HELLO = 26
    # Answered at once: its reply tells the worker that every message it sent to this
    # server before was handled (a QUIET push is answered only when it fails).
    SYNC = 27
    # The sender has no more data (uneven data, ``kv.join()``): sync rounds complete
    # without it until every worker has joined.
    JOIN = 28
    # write this server's shard into a checkpoint directory (pskv.server.snapshot)
    SAVE_CHECKPOINT = 29
    # A replacement process of a dead worker (PSKV_RECOVERY_TIMEOUT) announces itself: the
    # server restarts its push numbering and stops waiting for the old process. Like HELLO,
    # it may open a connection.
    REJOIN = 30
    # Elastic jobs (pskv.cluster.elastic). Worker rank 0 -> server: take a snapshot of the shard
    # at commit n of view e (every member settled; an open round or a parked pull refuses it).
    COMMIT = 31
    # A joining worker -> server: every part the server holds (key, offset, dtype, size, row width,
    # name), so the joiner registers the keys it inits without a meeting; paged from a start.
    KEYS = 32
    # The launcher -> scheduler (PSKV_LAUNCH_TOKEN, no registration): a worker slot exited
    # (gone: a departure) or is to be drained (removed at the next commit).
    ROSTER = 33
    # replies
    REPLY = 40
    ERROR = 41  # a request failed


class Flag:
    """Bits of :attr:`Header.flags`: the data path's options (no JSON bodies there).

    Plain ``int`` constants, not an ``enum.IntFlag``: they are tested on every message,
    and an ``IntFlag`` operation costs a Python-level call (about a microsecond) each.
    """

    QUIET = 1  # PUSH: answer only if it fails (a later reply from the server confirms it)
    SHM = 2  # data in shared memory: push from the sender's slot, reply with buffer indices
    SUMMED = 4  # INIT: rounds of these keys store the plain sum, even with an optimizer
    OVERWRITE = 8  # INIT: replace the values of existing keys (broadcast)
    # PUSH / PUSHPULL: every data frame is a compressed payload (pskv.compression) of its
    # spec's float32 elements; the body names the compression (pskv.protocol.bodies)
    COMPRESSED = 16
    # PULL / PUSHPULL: compress the values of the reply (REPLY: COMPRESSED) if they are sums,
    # with the compression the body names (server -> worker compression)
    COMPRESS_REPLY = 32
    # INIT / PUSH / PULL / REPLY of row-sparse keys (issue 13): every data frame is in the
    # *rows* encoding (pskv.protocol.codec.rows_frame). A spec's shape is (n, w): n rows of w
    # elements; the frame holds the n global row ids (int64, sorted, unique) then, except in a
    # PULL (which asks for those rows), the n rows (an INIT's parts: see its body, pskv.protocol.bodies).
    ROWS = 64
    # With SHM (PUSH, PULL without PRESENT, REPLY): no data frames; each spec's region of the worker's rows
    # buffer (its `buffer` field: byte offset) holds the n ids, then (PUSH, REPLY) the n rows.
    # ROWS PULL: answer with each part's present rows (its specs are (0, w), their frames empty)
    PRESENT = 128


#: Every defined flag bit; a header with any other bit set is refused.
KNOWN_FLAGS = (Flag.QUIET | Flag.SHM | Flag.SUMMED | Flag.OVERWRITE | Flag.COMPRESSED | Flag.COMPRESS_REPLY
               | Flag.ROWS | Flag.PRESENT)


class ArraySpec(NamedTuple):
    """Describes one data frame (immutable; a named tuple because one is built per array
    of every message, and that is several times cheaper than a frozen dataclass).

    Attributes:
        key: the server key (a signed 64-bit int).
        dtype: dtype name (see :mod:`pskv.arrays.dtypes`).
        shape: shape of the data in this frame.
        offset: element offset of this frame inside the key's whole (flattened) value;
            0 for a key held by one server.
        round: sync round: in a reply with values, the round they include; in a PULL,
            the number of the sender's push whose round the value must include; in a
            PUSH / PUSHPULL, the push's own number (0: the sender's next); 0 in other
            requests.
        buffer: in a shared-memory (``SHM``) reply, which of the part's two shared
            buffers holds the value (0 or 1); in a message of rows in shared memory
            (``ROWS`` with ``SHM``), the byte offset of the spec's region in the worker's
            rows buffer (:mod:`pskv.worker.shared`); -1 everywhere else (not sent).
    """

    key: int
    dtype: str
    shape: tuple[int, ...]
    offset: int = 0
    round: int = 0
    buffer: int = -1

    @property
    def size(self) -> int:
        """Number of elements."""
        shape = self.shape
        if len(shape) == 1:  # a part: every spec of the data path
            return shape[0]
        n = 1
        for d in shape:
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
        body: command-specific text (:mod:`pskv.protocol.bodies`).
        flags: :class:`Flag` bits.
        epoch: the sender's membership view (an elastic job's, :mod:`pskv.cluster.elastic`; 1 and up);
            0 in every other job, and then not sent (the header stays its eight fields).
    """

    command: Command
    request: int
    sender: int
    arrays: tuple[ArraySpec, ...] = ()
    priority: int = 0
    body: str = ""
    flags: int = 0
    epoch: int = 0

    @property
    def named_parts(self) -> bool:
        """True if the specs name parts without data frames (a PULL, or an SHM message; a ROWS
        PULL carries its row ids)."""
        return (self.command is Command.PULL and not self.flags & Flag.ROWS) or bool(self.flags & Flag.SHM)


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
