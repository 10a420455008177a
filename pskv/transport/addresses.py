"""Which address a node binds: ``DMLC_NODE_HOST``, else ``DMLC_INTERFACE``'s, else loopback.

ps-lite picked the first non-loopback interface when told nothing; pskv binds loopback
unless told otherwise, so nothing is exposed by accident.
"""

from __future__ import annotations

import fcntl
import socket
import struct

from pskv.config import ClusterConfig
from pskv.errors import InvalidArgumentError

__all__ = ["bind_host", "interface_address"]

_SIOCGIFADDR = 0x8915  # Linux ioctl: get an interface's IPv4 address


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (Linux).

    Raises:
        InvalidArgumentError: no such interface, or it has no IPv4 address.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError as exc:
            known = ", ".join(n for _, n in socket.if_nameindex())
            raise InvalidArgumentError(
                f"DMLC_INTERFACE={name!r}: no IPv4 address ({exc.strerror}); interfaces here: {known}"
            ) from None
    return socket.inet_ntoa(packed[20:24])


def bind_host(cluster: ClusterConfig) -> str:
    """The address this node binds and advertises."""
    if cluster.node_host:
        return cluster.node_host
    if cluster.interface:
        return interface_address(cluster.interface)
    return "127.0.0.1"
