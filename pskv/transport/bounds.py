"""What one peer may cost a node: message size, frame count, and replies it leaves unread.

Every node reads messages from peers it cannot trust until CURVE authenticates them
(docs/security.md), and answers peers that may stop reading. :class:`Bounds` holds the
limits the reactor (:mod:`pskv.transport.reactor`) and the local connections
(:mod:`pskv.transport.unix`) enforce *before* allocating for a message or queueing a
reply, with their settings in :mod:`pskv.config` (``PSKV_MAX_MESSAGE_BYTES``,
``PSKV_MAX_FRAMES``, ``PSKV_SEND_QUEUE_BYTES``, ``PSKV_SLOW_PEER_TIMEOUT``):

* a message of more frames or bytes than allowed is read off the socket and discarded
  without building its frame list (ZeroMQ's ``MAXMSGSIZE`` refuses a single frame
  over the byte limit before allocating it, and disconnects its sender);
* replies a peer does not take wait in a queue of their own per peer; the peer is
  dropped (its queue discarded, logged) once that queue holds more than
  ``send_queue_bytes`` or the peer has taken none of it for ``slow_peer_timeout``
  seconds. The reactor never waits on a peer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pskv.config import ClusterConfig
from pskv.errors import InvalidArgumentError

__all__ = ["Bounds", "DEFAULT_BOUNDS", "SEND_HWM", "check_size"]

# Messages ZeroMQ queues per peer before a send reports EAGAIN (its default is 1000, each of any
# size: a peer reading nothing could pin 1000 big replies); past it a reply waits in the reactor's
# own per-peer queue, bounded in bytes (``send_queue_bytes``).
SEND_HWM = 100


@dataclass(frozen=True)
class Bounds:
    """Per-peer limits of one node.

    Attributes:
        max_message_bytes: bytes of one received message (all its frames).
        max_frames: frames of one received message (a routing identity included).
        send_queue_bytes: bytes of replies queued for one peer that does not read them.
        slow_peer_timeout: seconds a peer with queued replies may take none of them.
    """

    max_message_bytes: int
    max_frames: int
    send_queue_bytes: int
    slow_peer_timeout: float

    @classmethod
    def of(cls, cluster: ClusterConfig) -> Bounds:
        """The bounds a cluster's settings ask for."""
        return cls(cluster.max_message_bytes, cluster.max_frames, cluster.send_queue_bytes,
                   cluster.slow_peer_timeout)


DEFAULT_BOUNDS = Bounds.of(ClusterConfig())  # the defaults of the settings (checked there)


def check_size(frames: Sequence[Any], max_bytes: int, name: str) -> None:
    """Refuse to send a message the receiving node would discard (``PSKV_MAX_MESSAGE_BYTES``).

    Raises:
        InvalidArgumentError: naming the size and the setting.
    """
    size = sum(f.nbytes if isinstance(f, memoryview) else len(f) for f in frames)
    if size > max_bytes:
        raise InvalidArgumentError(f"{name}: a message of {size} bytes exceeds PSKV_MAX_MESSAGE_BYTES={max_bytes} "
                                   "(raise it on every node of the job to send bigger parts)")
