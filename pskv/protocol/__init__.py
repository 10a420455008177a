"""The wire protocol: the message schema (``messages``) and its codec (``codec``)."""

from pskv.protocol.codec import DEFAULT_LIMITS, Limits, decode, encode, frame_array
from pskv.protocol.messages import (
    PROTOCOL_VERSION,
    SCHEDULER_ID,
    TX_PREFIX,
    ArraySpec,
    Command,
    Header,
    Role,
    describe,
    node_id,
    node_name,
    node_role_rank,
)

__all__ = [
    "ArraySpec",
    "Command",
    "DEFAULT_LIMITS",
    "Header",
    "Limits",
    "PROTOCOL_VERSION",
    "Role",
    "SCHEDULER_ID",
    "TX_PREFIX",
    "decode",
    "describe",
    "encode",
    "frame_array",
    "node_id",
    "node_name",
    "node_role_rank",
]
