"""Which address a node binds and advertises.

In this order (:func:`bind_host`):

1. ``DMLC_NODE_HOST``, as given (``pskv launch`` sets it to the process's host);
2. ``DMLC_INTERFACE``: that interface's IPv4 address;
3. a job whose scheduler is on loopback (``DMLC_PS_ROOT_URI`` ``127.0.0.1``,
   ``localhost``): ``127.0.0.1`` — nothing is exposed for a job on one host;
4. otherwise (a cluster manager set only ``DMLC_*``, as an MXJob does): the address
   this host sends from towards the scheduler (the kernel's route; a UDP socket is
   connected, nothing is sent), so peers that reach the scheduler reach this node too;
5. failing that, the first IPv4 address of an interface that is neither loopback nor
   link-local (what ps-lite picked when told nothing).

With none of these, :class:`~pskv.errors.InvalidArgumentError` names the variables to set.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Callable

from pskv.config import ClusterConfig
from pskv.errors import InvalidArgumentError

__all__ = ["bind_host", "interface_address", "interface_table", "route_source"]

_SIOCGIFADDR = 0x8915  # Linux ioctl: get an interface's IPv4 address

Interfaces = Callable[[], list[tuple[str, str]]]  # -> [(interface name, IPv4 address)]
Route = Callable[[str, int], "str | None"]  # (scheduler host, port) -> the local address towards it


def _ioctl_address(name: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
    return socket.inet_ntoa(packed[20:24])


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (Linux).

    Raises:
        InvalidArgumentError: no such interface, or it has no IPv4 address.
    """
    try:
        return _ioctl_address(name)
    except OSError as exc:
        known = ", ".join(n for _, n in socket.if_nameindex())
        raise InvalidArgumentError(
            f"DMLC_INTERFACE={name!r}: no IPv4 address ({exc.strerror}); interfaces here: {known}"
        ) from None


def interface_table() -> list[tuple[str, str]]:
    """``[(name, IPv4 address)]`` of this host's interfaces that have one, in index order."""
    table = []
    for _, name in socket.if_nameindex():
        try:
            table.append((name, _ioctl_address(name)))
        except OSError:  # down, or no IPv4 address
            continue
    return table


def route_source(host: str, port: int) -> str | None:
    """The local IPv4 address the kernel would send from towards ``host`` (None: no route or unknown host).

    Connecting a UDP socket only picks the route; no packet is sent.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port or 9))
            return str(s.getsockname()[0])
    except OSError:  # socket.gaierror included: the name does not resolve
        return None


def _routable(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified)


def bind_host(cluster: ClusterConfig, interfaces: Interfaces = interface_table, route: Route = route_source) -> str:
    """The address this node binds and advertises (see the module's order).

    Args:
        cluster: the cluster contract (``node_host``, ``interface``, ``root_uri``).
        interfaces: this host's interface table (tests inject one).
        route: the local address towards the scheduler (tests inject one).

    Raises:
        InvalidArgumentError: ``DMLC_INTERFACE`` names no usable interface, or the job is
            not local and this host has no routable IPv4 address.
    """
    if cluster.node_host:
        return cluster.node_host
    if cluster.interface:
        return interface_address(cluster.interface)
    if cluster.local_job or not cluster.root_uri:
        return "127.0.0.1"
    source = route(cluster.root_uri, cluster.root_port)
    if source is not None and _routable(source):
        return source
    table = interfaces()
    for _, address in table:
        if _routable(address):
            return address
    raise InvalidArgumentError(
        f"no routable IPv4 address to bind: no route to the scheduler {cluster.root_uri!r} and no interface with "
        f"one (interfaces: {', '.join(f'{n} {a}' for n, a in table) or 'none'}); set DMLC_NODE_HOST to this node's "
        "address or DMLC_INTERFACE to its interface"
    )
