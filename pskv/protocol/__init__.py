"""The wire protocol: the message schema (``messages``), its codec (``codec``) and the bodies (``bodies``)."""

from pskv.protocol.codec import DEFAULT_LIMITS, Limits, decode, encode, frame_array, rows_frame, split_rows
from pskv.protocol.messages import (
    MAX_EPOCH,
    MAX_SLOTS,
    PROTOCOL_VERSION,
    SCHEDULER_ID,
    TX_PREFIX,
    ArraySpec,
    Command,
    Flag,
    Header,
    Role,
    node_id,
    node_name,
    node_role_rank,
)

__all__ = [
    "ArraySpec",
    "Command",
    "DEFAULT_LIMITS",
    "Flag",
    "Header",
    "Limits",
    "MAX_EPOCH",
    "MAX_SLOTS",
    "PROTOCOL_VERSION",
    "Role",
    "SCHEDULER_ID",
    "TX_PREFIX",
    "decode",
    "encode",
    "frame_array",
    "rows_frame",
    "split_rows",
    "node_id",
    "node_name",
    "node_role_rank",
]
