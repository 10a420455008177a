"""``Registry[T]``: classes by lower-cased name, with one re-registration rule for all of pskv.

Stores (``KVStoreBase.register``), optimizers, learning-rate schedulers, metrics and
server controllers are each one instance. The rule, everywhere:

* the same class again (same module and qualified name: a reloaded module, a notebook
  cell run twice) replaces the old entry silently;
* a different class under a name already taken raises
  :class:`~pskv.errors.InvalidArgumentError` naming the holder — never a silent swap.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TypeVar

from pskv.errors import InvalidArgumentError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Mapping[str, T]):
    """A name -> entry table (read it like a dict; names are lower-cased).

    Args:
        what: what the entries are, for messages (``"optimizer"``, ``"store type"``).
    """

    def __init__(self, what: str) -> None:
        self._what = what
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` under ``name`` (lower-cased) and return it.

        Raises:
            InvalidArgumentError: a different entry already holds the name.
        """
        key = name.lower()
        old = self._entries.get(key)
        if old is not None and _identity(old) != _identity(entry):
            raise InvalidArgumentError(f"{self._what} name {key!r} is already registered by {_identity(old)}")
        self._entries[key] = entry
        return entry

    def pop(self, name: str, default: T | None = None) -> T | None:
        """Remove ``name`` (tests, plug-in unloading); returns its entry or ``default``."""
        return self._entries.pop(name.lower(), default)

    def lookup(self, name: object) -> T:
        """The entry of ``name`` (case-insensitive).

        Raises:
            InvalidArgumentError: no such name (the message lists the known ones).
        """
        found = self._entries.get(name.lower()) if isinstance(name, str) else None
        if found is None:
            raise InvalidArgumentError(f"unknown {self._what} {name!r}; known: {', '.join(self.names())}")
        return found

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    def __getitem__(self, name: str) -> T:
        return self._entries[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def _identity(entry: object) -> str:
    """``module.qualname`` of a class or function (what makes two registrations the same)."""
    return f"{getattr(entry, '__module__', '?')}.{getattr(entry, '__qualname__', repr(entry))}"
