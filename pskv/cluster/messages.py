"""Helpers shared by every node for control messages: JSON bodies, replies and errors.

Control messages carry their content as JSON text in the header's ``body``; errors
travel as ``ERROR`` replies whose body names the error class and message, so the
receiver can raise a typed error. Nothing is unpickled.
"""

from __future__ import annotations

import json
from typing import Any

from pskv.errors import ProtocolError
from pskv.protocol import Command, Header, encode

__all__ = ["json_body", "reply_frames", "error_frames", "request_frames", "parse_error"]


def json_body(header: Header) -> dict[str, Any]:
    """The header's body parsed as a JSON object.

    Raises:
        ProtocolError: the body is not a JSON object.
    """
    if not header.body:
        return {}
    try:
        value = json.loads(header.body)
    except (ValueError, RecursionError) as exc:  # RecursionError: hostile nesting ("[[[[...")
        raise ProtocolError(f"{header.command.name} body is not JSON: {type(exc).__name__}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"{header.command.name} body must be a JSON object")
    return value


def request_frames(command: Command, request: int, sender: int, body: dict[str, Any] | None = None) -> list[Any]:
    """Frames of a control request with a JSON body."""
    return encode(Header(command, request, sender, body=json.dumps(body) if body else ""))


def reply_frames(request: Header, sender: int, body: dict[str, Any] | None = None,
                 arrays: tuple[Any, ...] = (), data: list[Any] | None = None) -> list[Any]:
    """Frames of a successful reply to ``request``."""
    header = Header(Command.REPLY, request.request, sender, arrays, body=json.dumps(body) if body else "")
    return encode(header, data or [])


def error_frames(request: Header, sender: int, error_type: str, message: str, node: str = "") -> list[Any]:
    """Frames of an ERROR reply to ``request``; ``node`` names a failed node, if that is the error."""
    body = {"type": error_type, "message": message}
    if node:
        body["node"] = node
    return encode(Header(Command.ERROR, request.request, sender, body=json.dumps(body)))


def parse_error(header: Header) -> tuple[str, str, str]:
    """``(error type, message, failed node or "")`` of an ERROR reply (tolerates malformed bodies)."""
    try:
        body = json_body(header)
        return str(body.get("type", "Error")), str(body.get("message", "")), str(body.get("node", ""))
    except ProtocolError:
        return "Error", header.body[:200], ""
