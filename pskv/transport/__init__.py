"""The transport: ZeroMQ sockets owned by one reactor thread per node."""

from pskv.transport.reactor import DealerHandler, Reactor, RouterHandler

__all__ = ["DealerHandler", "Reactor", "RouterHandler"]
