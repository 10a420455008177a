"""Running the server and scheduler roles of a process (``pskv server``, ``pskv scheduler``)."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType

from pskv.cluster import Scheduler
from pskv.config import ClusterConfig
from pskv.logs import show_records
from pskv.server.node import ServerNode

__all__ = ["run_role", "resolve_host"]

log = logging.getLogger("pskv.roles")


def resolve_host(host: str) -> str:
    """An IP address for ``host`` (ZeroMQ binds addresses, not names)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so a stopped role still removes its shared memory."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


_NO_WORKERS = "the launcher reports that no worker will come or stay (every worker exited, or the launcher is gone)"


def _end_on_sigusr1(end: Callable[[], None]) -> None:
    """SIGUSR1 (from :mod:`pskv.launch.guard`): no worker will come or stay; ``end()`` ends the role, once."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # the guard repeats it: once is enough
        end()

    signal.signal(signal.SIGUSR1, handler)


def _ignore_sigusr1() -> None:
    """The role is ending anyway: ignore the guard's SIGUSR1 from now on, through interpreter exit
    (which would otherwise restore the default action, death by SIGUSR1)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def _exit_now() -> None:
    log.info("server: %s; ending", _NO_WORKERS)
    sys.exit(0)


def run_role(cluster: ClusterConfig, port_file: str | None = None) -> int:
    """Serve ``cluster.role`` (server or scheduler) until the job ends; returns an exit code.

    Args:
        cluster: the cluster contract.
        port_file: scheduler only: write the port bound — a free one when ``root_port``
            is 0 — (decimal, then a newline) to this file atomically once bound: a
            launcher's readiness signal.

    Raises:
        InvalidArgumentError: the cluster environment is incomplete.
        NodeFailedError: a peer the role depends on died.
    """
    _exit_on_sigterm()
    rank = cluster.server_rank if cluster.role == "server" else -1
    show_records(cluster.role if rank < 0 else f"{cluster.role} {rank}", cluster.log_level, "INFO")
    if cluster.role == "scheduler":
        wanted = cluster.root_port
        if port_file is not None and wanted == 0:
            cluster = dataclasses.replace(cluster, root_port=1)  # placeholder to pass the check
        cluster.require_cluster()
        scheduler = Scheduler(cluster, address=f"tcp://{resolve_host(cluster.root_uri)}:{wanted}")
        if port_file is not None:
            port = scheduler.address.rsplit(":", 1)[1]
            tmp = f"{port_file}.tmp"
            with open(tmp, "w", encoding="ascii") as f:
                f.write(f"{port}\n")
            os.replace(tmp, port_file)
        _end_on_sigusr1(lambda: scheduler.end(_NO_WORKERS))
        try:
            scheduler.run()
        finally:
            _ignore_sigusr1()
        return 0
    cluster.require_cluster()
    if cluster.role == "server":
        node = ServerNode(cluster)
        try:
            _end_on_sigusr1(_exit_now)  # waiting to register or serving: nobody is left to serve
            node.run()
        finally:
            _ignore_sigusr1()
            node.stop()  # idempotent: finishes a cleanup that a signal interrupted
        return 0
    raise ValueError(f"run_role serves servers and schedulers, not {cluster.role!r}")
