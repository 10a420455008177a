"""Every command's body: one typed value per body, with ``encode()`` and ``parse(header)``.

The data path has no bodies but INIT's optional key names (its options are
:class:`~pskv.protocol.messages.Flag` bits and its arrays' specs). Everything else carries one JSON object in
:attr:`Header.body`, described field by field here and nowhere else. ``parse`` checks
every field's type and range before anything uses it and raises
:class:`~pskv.errors.ProtocolError` naming the command and the field; nothing in a
body is executed, unpickled, or used as a file path without the receiver's own checks
(a path a body carries, SAVE_CHECKPOINT's, must lie in the directories the receiving server was
started with; optimizer states travel as arrays, and the worker writes their file).

The bodies live by peer, and are all re-exported here (``from pskv.protocol.bodies import X``):

* :mod:`~pskv.protocol.bodies.scheduler` — a node and the scheduler: registration, liveness,
  collectives, shutdown;
* :mod:`~pskv.protocol.bodies.metrics` — ``pskv top``: a node's counters, the job's report;
* :mod:`~pskv.protocol.bodies.server` — a worker and a server: connections, INIT, control commands;
* :mod:`~pskv.protocol.bodies.errors` — the ERROR reply;
* :mod:`~pskv.protocol.bodies.fields` — the checks every ``parse`` makes of a JSON field.

================  =====================  ================================================
command           request body           reply body
================  =====================  ================================================
REGISTER          :class:`Register`      :class:`NodeTable`
HEARTBEAT         :class:`Heartbeat`     :class:`Liveness`
METRICS           (none)                 :class:`JobReport`
BARRIER           :class:`Barrier`       :class:`Met`
SHUTDOWN          :class:`Shutdown`      (none)
INIT              :class:`InitBody`      (none)  (ROWS: each part's rows and initializer)
PUSH/PULL/        (none: flags, specs;   (none: specs; SHM flag and ``buffer`` for
PUSHPULL          COMPRESSED pushes:     shared-memory replies)
                  :class:`CompressionParams`)
HELLO             :class:`Hello`         :class:`HelloReply`
SET_MODE          :class:`SetMode`       (none)
SET_OPTIMIZER     :class:`OptimizerConfig`  (none)
CONTROLLER        :class:`ControllerCall`   :class:`ControllerAnswer`
SAVE_STATES       :class:`StatesRequest`    :class:`OptimizerStates` (and its arrays)
LOAD_STATES       :class:`OptimizerStates`  (none)
                  (and its arrays)
SAVE_CHECKPOINT   :class:`CheckpointRequest`  :class:`CheckpointSaved`
SYNC              (none), or :class:`Meeting`  (none)
JOIN              (none)                 (none)
REJOIN            :class:`Rejoin`        :class:`Rejoined`
COMMIT            :class:`Commit`        (none)
KEYS              :class:`KeysRequest`   :class:`KeyTable`
ROSTER            :class:`Roster`        (none)
ERROR (reply)     —                      :class:`ErrorReply`
================  =====================  ================================================

An elastic job's :class:`View` travels inside :class:`NodeTable`, :class:`Liveness` and :class:`Met`;
its epoch in :class:`Barrier` and in every message's header (:attr:`Header.epoch`).
"""

from __future__ import annotations

from pskv.protocol.bodies.errors import ErrorReply
from pskv.protocol.bodies.fields import (
    DIGEST_CHARS,
    MAX_NAME,
    json_object,
)
from pskv.protocol.bodies.metrics import (
    MAX_COUNT,
    MAX_NODES,
    MAX_RATE,
    MAX_SECONDS,
    NODE_STATES,
    Counters,
    Heartbeat,
    JobReport,
    NodeReport,
)
from pskv.protocol.bodies.scheduler import (
    MAX_AGREE,
    MAX_ITEM,
    MAX_RESULT,
    MAX_TEXT,
    ROSTER_OPS,
    VIEW_CAUSES,
    VOIDING_CAUSES,
    Barrier,
    Failure,
    Liveness,
    Meeting,
    Met,
    NodeTable,
    Register,
    Roster,
    ShmInfo,
    Shutdown,
    View,
    node_token,
)
from pskv.protocol.bodies.server import (
    MAX_COMPRESSION_FIELDS,
    MAX_KEY_NAME,
    MAX_KEY_PARTS,
    MAX_NAMES_CHARS,
    MAX_STATE_NAMES,
    MAX_TABLE_ROWS,
    CheckpointRequest,
    CheckpointSaved,
    Commit,
    CompressionParams,
    ControllerAnswer,
    ControllerCall,
    Hello,
    HelloReply,
    InitBody,
    KeyPart,
    KeysRequest,
    KeyTable,
    OptimizerConfig,
    OptimizerStates,
    Rejoin,
    Rejoined,
    SetMode,
    StatesRequest,
)

__all__ = [
    "DIGEST_CHARS", "MAX_AGREE", "MAX_COMPRESSION_FIELDS", "MAX_COUNT", "MAX_ITEM", "MAX_KEY_NAME", "MAX_KEY_PARTS",
    "MAX_NAME",
    "MAX_NAMES_CHARS", "MAX_NODES", "MAX_RATE", "MAX_RESULT", "MAX_SECONDS", "MAX_STATE_NAMES", "MAX_TABLE_ROWS",
    "MAX_TEXT",
    "NODE_STATES", "Barrier", "CheckpointRequest", "CheckpointSaved", "CompressionParams", "ControllerAnswer",
    "ControllerCall", "Counters", "ErrorReply", "Failure", "Heartbeat", "Hello", "HelloReply", "InitBody",
    "JobReport", "json_object", "Liveness", "Meeting", "Met", "node_token", "NodeReport", "NodeTable", "OptimizerConfig",
    "OptimizerStates", "Register", "Rejoin", "Rejoined", "SetMode", "ShmInfo", "Shutdown", "StatesRequest",
    "Commit", "KeyPart", "KeysRequest", "KeyTable", "ROSTER_OPS", "Roster", "VIEW_CAUSES", "VOIDING_CAUSES", "View",
]
