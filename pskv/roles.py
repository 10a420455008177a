"""Running the server and scheduler roles of a process (``pskv server``, ``pskv scheduler``)."""

from __future__ import annotations

import logging
import socket

from pskv.config import ClusterConfig

__all__ = ["run_role", "resolve_host"]

log = logging.getLogger("pskv.roles")


def resolve_host(host: str) -> str:
    """An IP address for ``host`` (ZeroMQ binds addresses, not names)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def run_role(cluster: ClusterConfig) -> int:
    """Serve ``cluster.role`` (server or scheduler) until the job ends; returns an exit code.

    Raises:
        InvalidArgumentError: the cluster environment is incomplete.
        NodeFailedError: a peer the role depends on died.
    """
    cluster.require_cluster()
    if cluster.role == "scheduler":
        from pskv.cluster import Scheduler

        address = f"tcp://{resolve_host(cluster.root_uri)}:{cluster.root_port}"
        Scheduler(cluster, address=address).run()
        return 0
    if cluster.role == "server":
        from pskv.server.node import ServerNode

        ServerNode(cluster).run()
        return 0
    raise ValueError(f"run_role serves servers and schedulers, not {cluster.role!r}")
