"""The checks every body's ``parse`` makes of its JSON fields (:mod:`pskv.protocol.bodies`).

Each raises :class:`~pskv.errors.ProtocolError` naming the command and the field.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pskv.errors import ProtocolError
from pskv.protocol.messages import Header

__all__ = ["DIGEST_CHARS", "MAX_NAME", "bounded", "dump", "field", "hex_digest", "json_object", "nonempty",
           "string_list"]

T = TypeVar("T")
DIGEST_CHARS = 64  # a job secret's and a token's length: 32 bytes as lowercase hex
MAX_NAME = 64  # a name: a collective's, a compression parameter's (and a str value of it)


def json_object(header: Header) -> dict[str, Any]:
    """The header's body parsed as a JSON object (``{}`` for an empty body).

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


def field(header: Header, body: dict[str, Any], name: str, kind: type[T], default: Any = ...) -> T:
    """``body[name]``, which must be exactly of ``kind`` (bool is not an int here)."""
    if name not in body:
        if default is ...:
            raise ProtocolError(f"{header.command.name} body needs field {name!r}")
        return default  # type: ignore[no-any-return]
    value = body[name]
    if type(value) is not kind:
        raise ProtocolError(f"{header.command.name} body field {name!r} must be {kind.__name__}, got {value!r}")
    return value  # type: ignore[no-any-return]


def nonempty(header: Header, name: str, value: str) -> str:
    """``value`` of field ``name``, which must not be empty."""
    if not value:
        raise ProtocolError(f"{header.command.name} body field {name!r} must not be empty")
    return value


def dump(value: dict[str, Any]) -> str:
    """A body as it travels: compact JSON."""
    return json.dumps(value, separators=(",", ":"))


def string_list(header: Header, body: dict[str, Any], name: str) -> tuple[str, ...]:
    """``body[name]``, which must be a list of strings."""
    values = field(header, body, name, list)
    if any(type(v) is not str for v in values):
        raise ProtocolError(f"{header.command.name} body field {name!r} must be a list of strings")
    return tuple(values)


def bounded(header: Header, name: str, value: str, limit: int) -> str:
    """``value`` of field ``name``, at most ``limit`` characters long."""
    if len(value) > limit:
        raise ProtocolError(f"{header.command.name} body field {name!r} is longer than {limit} characters")
    return value


def hex_digest(header: Header, body: dict[str, Any], name: str) -> str:
    """An optional field of :data:`DIGEST_CHARS` lowercase hex digits (``""`` when absent)."""
    value = field(header, body, name, str, "")
    if value and (len(value) != DIGEST_CHARS or any(c not in "0123456789abcdef" for c in value)):
        raise ProtocolError(f"{header.command.name} body field {name!r} must be {DIGEST_CHARS} lowercase hex digits")
    return value
