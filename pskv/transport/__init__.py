"""The transport: ZeroMQ sockets owned by one reactor thread per node."""

from pskv.transport.reactor import IO_THREADS, DealerHandler, Reactor, RouterHandler

__all__ = ["IO_THREADS", "DealerHandler", "Reactor", "RouterHandler"]
