"""The worker role's side of the parameter server (ps-lite's ``KVWorker`` layer).

Layers, each importing only the ones below it:

* :mod:`~pskv.worker.kv_worker` — :class:`KVWorker`: key-value requests of key layouts
  (one message per server per call, bodies, replies). The MXNet-API store
  (:mod:`pskv.kvstore.dist`) calls only this and the owners it holds, one per feature:
  :mod:`~pskv.worker.compressing` — the compression of pushes and their residuals
  (:mod:`~pskv.worker.residuals`: which come back from a checkpoint);
  :mod:`~pskv.worker.observe` — counters and timeline spans of every call;
  :mod:`~pskv.worker.control` — commands to every server, membership passthrough.
* :mod:`~pskv.worker.layout` — :class:`KeyLayout` and the grouping of parts per server;
  :mod:`~pskv.worker.shared` — shared-memory parts; :mod:`~pskv.worker.replay` — the push
  log replayed to a replacement server.
* :mod:`~pskv.worker.client` — :class:`WorkerClient`: the connection and the priority
  send queue; :mod:`~pskv.worker.quiet` — confirmation of quiet pushes;
  :mod:`~pskv.worker.fold` — a small quiet push held for the pull behind it (one ``PUSHPULL``);
  :mod:`~pskv.worker.lanes` — the connections to each server, opened and opened again;
  :mod:`~pskv.worker.replacement` — a reset connection, a replaced server, this process replacing a
  dead worker (REJOIN).
"""

from pskv.worker.client import WorkerClient
from pskv.worker.kv_worker import Exchange, KVWorker
from pskv.worker.layout import KeyLayout

__all__ = ["Exchange", "KVWorker", "KeyLayout", "WorkerClient"]
