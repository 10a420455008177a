"""Server controllers: functions that answer ``send_command_to_servers(head, body)``.

Controllers are plain Python functions registered *on the server* by modules the server
imports at start (``PSKV_SERVER_MODULES=mypkg.controllers``); the network only carries
the command's ``head`` (an int) and ``body`` (a string) — never code, never a pickle::

    # mypkg/controllers.py
    from pskv.server import controller

    @controller(7)
    def set_profiling(head: int, body: str) -> str:
        ...
        return "ok"

A controller registered for ``head=None`` answers every head without its own controller.
Registration follows pskv's one rule (:mod:`pskv._registry`): the same function again
(a reloaded module) replaces itself; another function for a head already taken is
refused. The table is the process's: the decorator runs when the module is imported,
once per process, and every server of the process (an in-process test cluster) answers
from it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from pskv._registry import Registry
from pskv.errors import InvalidArgumentError

__all__ = ["CONTROLLERS", "Controller", "controller", "find_controller", "import_modules"]

Controller = Callable[[int, str], "str | None"]

#: Controllers by head (``"*"``: the catch-all of ``head=None``).
CONTROLLERS: Registry[Controller] = Registry("controller head")
_ANY = "*"


def controller(head: int | None = None) -> Callable[[Controller], Controller]:
    """Decorator: register ``fn(head, body) -> str | None`` for ``head`` (None: any head).

    Raises:
        InvalidArgumentError: ``fn`` is not callable, or another function holds ``head``.
    """
    def register(fn: Controller) -> Controller:
        if not callable(fn):
            raise InvalidArgumentError(f"controller for head {head} must be callable")
        return CONTROLLERS.add(_ANY if head is None else str(head), fn)
    return register


def find_controller(head: int) -> Controller | None:
    """The controller for ``head``, else the catch-all one, else None."""
    return CONTROLLERS.get(str(head), CONTROLLERS.get(_ANY))


def import_modules(names: str) -> list[str]:
    """Import the comma-separated module names (where controllers register themselves).

    Raises:
        InvalidArgumentError: a module cannot be imported.
    """
    imported = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise InvalidArgumentError(f"PSKV_SERVER_MODULES: cannot import {name!r}: {exc}") from None
        imported.append(name)
    return imported
