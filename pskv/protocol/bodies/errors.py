"""The ERROR reply's body, which any peer may send in answer to any request."""

from __future__ import annotations

from typing import NamedTuple

from pskv.errors import ProtocolError
from pskv.protocol.bodies.fields import dump, json_object
from pskv.protocol.messages import Header

__all__ = ["ErrorReply"]


class ErrorReply(NamedTuple):
    """ERROR: ``{type: str, message: str, node?: str}``: the error class name, its message,
    and the failed node it names (NodeFailedError)."""

    type: str
    message: str
    node: str = ""

    def encode(self) -> str:
        body = {"type": self.type, "message": self.message}
        if self.node:
            body["node"] = self.node
        return dump(body)

    @classmethod
    def parse(cls, header: Header) -> ErrorReply:
        """Tolerant: a malformed error body still becomes an error (its text, cut short)."""
        try:
            body = json_object(header)
            return cls(str(body.get("type", "Error")), str(body.get("message", "")), str(body.get("node", "")))
        except ProtocolError:
            return cls("Error", header.body[:200])
