"""pskv's own log records in a job's process: time-stamped, with their level and the node's name.

A server, the scheduler and a worker's distributed store call :func:`show_records` when
they start; from then on every record of the ``pskv`` logger (``pskv.server``,
``pskv.worker``, ...) at ``PSKV_LOG_LEVEL`` or above goes to the process's stderr as::

    2026-11-24 09:12:03.123 WARNING [server 0] pskv.server: ...

Unless the program configured logging itself (a handler on the root logger): then
pskv's records go through the program's handlers only (a library does not take over
its host's logging; pytest's capture is such a handler too) — configured first, nothing
here changes; configured later, this handler stands aside, so no record shows twice. Standard library only; the level comes checked from
:class:`pskv.config.ClusterConfig` (``log_level``).
"""

from __future__ import annotations

import logging

__all__ = ["DATE_FORMAT", "record_format", "show_records"]

DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

_handler: logging.Handler | None = None  # the one this module added to the "pskv" logger


def record_format(node: str) -> str:
    """The format of a record of ``node`` (``'worker 1'``): time with milliseconds, level, node, logger."""
    return "%(asctime)s.%(msecs)03d %(levelname)s [" + node.replace("%", "%%") + "] %(name)s: %(message)s"


def _unless_configured(record: logging.LogRecord) -> bool:
    """False once the program has configured logging after all: its handlers get the record (no duplicate)."""
    return not logging.getLogger().handlers


def show_records(node: str, level: str = "", default: str = "INFO") -> bool:
    """Show this process's ``pskv`` log records on stderr as ``node``'s (again: a new name, same handler).

    Args:
        node: the process's name in its records: ``'scheduler'``, ``'server 0'``, ``'worker 1'``.
        level: ``PSKV_LOG_LEVEL`` (checked by :class:`~pskv.config.ClusterConfig`); empty: ``default``.
        default: the role's level when ``level`` is empty.

    Returns:
        False when the program's own logging configuration handles them instead (nothing changed).
    """
    global _handler
    if _handler is None and logging.getLogger().handlers:
        return False
    logger = logging.getLogger("pskv")
    if _handler is None:
        _handler = logging.StreamHandler()  # sys.stderr
        _handler.addFilter(_unless_configured)
        logger.addHandler(_handler)
    _handler.setFormatter(logging.Formatter(record_format(node), DATE_FORMAT))
    logger.setLevel(level or default)
    return True
