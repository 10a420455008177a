"""Frames of requests, replies and ERROR replies, shared by every node.

A reply carries its request's id; an ``ERROR`` reply carries an
:class:`~pskv.protocol.bodies.ErrorReply` (the error class name, its message, the node
it names), so the requester can raise a typed error. Bodies are built by
:mod:`pskv.protocol.bodies`; nothing is unpickled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pskv.protocol.bodies import ErrorReply
from pskv.protocol.codec import encode
from pskv.protocol.messages import ArraySpec, Command, Header

__all__ = ["error_frames", "reply_frames", "request_frames"]

_new = tuple.__new__


def request_frames(command: Command, request: int, sender: int, body: str = "", epoch: int = 0) -> list[Any]:
    """Frames of a control request (``body``: an encoded :mod:`~pskv.protocol.bodies` value, or none; ``epoch``:
    the sender's view in an elastic job, else 0)."""
    return encode(Header(command, request, sender, body=body, epoch=epoch))


def reply_frames(request: Header, sender: int, body: str = "", arrays: tuple[ArraySpec, ...] = (),
                 data: Sequence[Any] = (), flags: int = 0) -> list[Any]:
    """Frames of a successful reply to ``request`` (with a body, or arrays and their data)."""
    # every value reply comes here: its header built as a plain tuple (all fields given), not by a Python call
    return encode(_new(Header, (Command.REPLY, request.request, sender, arrays, 0, body, flags, 0)), data)


def error_frames(request: Header, sender: int, error_type: str, message: str, node: str = "") -> list[Any]:
    """Frames of an ERROR reply to ``request``; ``node`` names a failed node, if that is the error."""
    return encode(Header(Command.ERROR, request.request, sender, body=ErrorReply(error_type, message, node).encode()))
