"""The server role: key shards with sync/async aggregation, and the server node loop."""

from pskv.server.controllers import controller
from pskv.server.shard import Part, ServerShard

__all__ = ["Part", "ServerShard", "controller"]
