"""The launcher's word to an elastic job's scheduler: a worker exited, or is to be drained (``ROSTER``).

A worker that exits is found dead by the scheduler only after its heartbeat timeout; the launcher,
which saw the exit, says so at once (``gone``), so the survivors' stall is milliseconds plus a
rollback. ``drain`` asks for a member's removal at the next commit. Each report carries the job's
launch token (``PSKV_LAUNCH_TOKEN``, given to the scheduler alone): no other process can report
exits. A report the scheduler does not answer in time is not retried: the heartbeats find the
departure anyway.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import zmq

from pskv.errors import ProtocolError
from pskv.protocol import Command, decode
from pskv.protocol.bodies import Roster
from pskv.protocol.replies import request_frames
from pskv.transport.bounds import DEFAULT_BOUNDS, Bounds
from pskv.transport.frames import recv_frames
from pskv.transport.security import CurveSecurity, read_key_file

__all__ = ["RosterClient"]

log = logging.getLogger("pskv.launch")
# What the scheduler's answer to a report may be: one frame, a header with no body (accepted) or a refusal's
# sentence (ERROR, well under 1 KB): 64 KiB and one frame, as any message of a peer not trusted yet
# (pskv.transport.frames.STRANGER_BOUNDS) — whatever else answers at the address costs no more.
_ANSWER_BOUNDS = Bounds(64 << 10, 1, DEFAULT_BOUNDS.send_queue_bytes, DEFAULT_BOUNDS.slow_peer_timeout)


class RosterClient:
    """A connection to the scheduler at ``address`` (``tcp://HOST:PORT``) for ``ROSTER`` reports.

    Args:
        token: the job's launch token (hex).
        curve_key_file: the job's CURVE key file, if it runs with one.
        timeout: seconds a report waits for the scheduler's answer.
    """

    def __init__(self, address: str, token: str, curve_key_file: str = "", timeout: float = 2.0) -> None:
        self.address = address
        self._token = token
        self._timeout_ms = max(1, int(timeout * 1000))
        self._context: zmq.Context[Any] = zmq.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, _ANSWER_BOUNDS.max_message_bytes)  # a bigger frame: not allocated
        if curve_key_file:
            CurveSecurity(read_key_file(curve_key_file), "pskv launch").client(self._socket)
        self._socket.connect(address)
        self._requests = itertools.count(1)

    def report(self, op: str, slot: int) -> bool:
        """Tell the scheduler that worker ``slot`` is ``gone`` or to ``drain``; True once it accepted it."""
        request = next(self._requests)
        self._socket.send_multipart(request_frames(Command.ROSTER, request, 0, Roster(op, slot, self._token).encode()))
        while self._socket.poll(self._timeout_ms):
            try:
                header = decode(recv_frames(self._socket, _ANSWER_BOUNDS))[0]
            except ProtocolError:  # a message of more frames too (read off and dropped by recv_frames)
                continue
            if header.request != request:
                continue  # the answer to an earlier report that timed out
            if header.command is Command.ERROR:
                log.warning("pskv launch: the scheduler refused the report that worker slot %d is %s: %s",
                            slot, op, header.body[:200])
                return False
            return True
        log.warning("pskv launch: the scheduler at %s did not answer the report that worker slot %d is %s "
                    "(its heartbeats will find it)", self.address, slot, op)
        return False

    def close(self) -> None:
        self._socket.close(0)
        self._context.term()
